"""RNN, GRU and LSTM: unrolled at import into products and pointwise ops.

Each form of the ops' attributes and optional inputs runs on fresh random float32 inputs against
ONNX Runtime, on the ref target unfused and fused (tolerance 1e-5 relative, 1e-6 absolute: both
sum float32 products, in other orders) and on the gpu target under Triton's interpreter (2e-5).
Sequence lengths are tried as an initializer and as a run-time input, with short sequences in a
reverse and a bidirectional run. Models exported by torch from nn.LSTM and nn.GRU are checked
the same way.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from onnx import helper

import onnx

from fusegraph import api, parse_onnx
from fusegraph.errors import ParseError
from fusegraph.passes.pipeline import fuse
from fusegraph.targets.ref.runner import run_program
from tests.helpers import ort_run
from tests.ops.oracle import _compare, model_of, needs_gpu_target

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
T, B, I, H = 4, 3, 5, 6

# (op, attributes, optional inputs given, outputs requested)
CASES = [
    ("RNN", {}, (), ("Y", "Y_h")),
    ("RNN", {"direction": "reverse"}, ("B", "initial_h"), ("Y", "Y_h")),
    ("RNN", {"direction": "bidirectional", "layout": 1}, ("B", "initial_h"), ("Y", "Y_h")),
    ("RNN", {"activations": ["Relu"], "clip": 0.7}, ("B",), ("Y",)),
    ("RNN", {"direction": "bidirectional", "activations": ["LeakyRelu", "Affine"],
             "activation_alpha": [0.3, 0.8], "activation_beta": [0.2]}, ("B",), ("", "Y_h")),
    ("RNN", {"activations": ["ScaledTanh"], "activation_alpha": [1.3], "activation_beta": [0.6]}, (), ("Y",)),
    ("GRU", {}, ("B",), ("Y", "Y_h")),
    ("GRU", {"linear_before_reset": 1}, ("B", "initial_h"), ("Y", "Y_h")),
    ("GRU", {"direction": "bidirectional", "layout": 1, "linear_before_reset": 1}, ("B", "initial_h"), ("Y", "Y_h")),
    ("GRU", {"direction": "reverse", "clip": 0.5}, ("B",), ("", "Y_h")),
    ("GRU", {"activations": ["HardSigmoid", "Elu"], "activation_alpha": [0.3, 0.7], "activation_beta": [0.4]},
     ("B",), ("Y",)),
    ("GRU", {"activations": ["Softsign", "Softplus"]}, (), ("Y",)),
    ("LSTM", {}, ("B",), ("Y", "Y_h", "Y_c")),
    ("LSTM", {"direction": "bidirectional"}, ("B", "initial_h", "initial_c", "P"), ("Y", "Y_h", "Y_c")),
    ("LSTM", {"direction": "reverse", "layout": 1}, ("B", "initial_h", "initial_c"), ("Y", "", "Y_c")),
    ("LSTM", {"input_forget": 1}, ("B", "P"), ("Y", "Y_h", "Y_c")),
    ("LSTM", {"clip": 0.4}, ("B", "initial_c"), ("", "", "Y_c")),
    ("LSTM", {"activations": ["Sigmoid", "ThresholdedRelu", "Tanh"], "activation_alpha": [0.2]}, ("B",), ("Y",)),
]


def _model(op: str, attrs: dict, given: tuple[str, ...], outputs: tuple[str, ...], lens: np.ndarray | None = None,
           lens_as_input: bool = False):
    rng = np.random.default_rng()
    g, d = GATES[op], 2 if attrs.get("direction") == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    inputs = {"X": rng.standard_normal((B, T, I) if layout else (T, B, I)).astype(np.float32)}
    inits = {"W": (rng.standard_normal((d, g * H, I)) * 0.5).astype(np.float32),
             "R": (rng.standard_normal((d, g * H, H)) * 0.5).astype(np.float32)}
    state = (B, d, H) if layout else (d, B, H)
    optional = {"B": lambda: rng.standard_normal((d, 2 * g * H)).astype(np.float32),
                "initial_h": lambda: rng.standard_normal(state).astype(np.float32),
                "initial_c": lambda: rng.standard_normal(state).astype(np.float32),
                "P": lambda: rng.standard_normal((d, 3 * H)).astype(np.float32)}
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"][:8 if op == "LSTM" else 6]
    for name in given:
        inputs[name] = optional[name]()
    if lens is not None:
        (inputs if lens_as_input else inits)["sequence_lens"] = lens
    used = [n if n in inputs or n in inits else "" for n in names]
    while not used[-1]:
        used.pop()
    node = helper.make_node(op, used, list(outputs), hidden_size=H, **attrs)
    return model_of([node], inputs, [o for o in outputs if o], inits), inputs


def _time_major(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same computation with the op in layout 0 between transposes: ONNX Runtime runs only
    that layout, so it is the oracle of layout 1."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    node = copy.graph.node[0]
    if not any(a.name == "layout" and a.i for a in node.attribute):
        return copy
    next(a for a in node.attribute if a.name == "layout").i = 0
    extra = []
    for k in (0, 5, 6):
        if k < len(node.input) and node.input[k]:
            extra.append(helper.make_node("Transpose", [node.input[k]], [node.input[k] + "_t"], perm=[1, 0, 2]))
            node.input[k] += "_t"
    after = []
    for k, name in enumerate(node.output):
        if name:
            after.append(helper.make_node("Transpose", [name + "_t"], [name], perm=[2, 0, 1, 3] if k == 0 else [1, 0, 2]))
            node.output[k] = name + "_t"
    nodes = extra + [node] + after
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


def check_ref(model: onnx.ModelProto, inputs: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """ONNX Runtime's outputs (of the layout-0 form), matched by the ref target unfused and fused."""
    want, names = ort_run(_time_major(model), inputs), [o.name for o in model.graph.output]
    program = parse_onnx(model, input_dims={k: v.shape for k, v in inputs.items()})
    _compare(run_program(program, inputs), want, names, rtol, atol)
    fuse(program)
    _compare(run_program(program, inputs), want, names, rtol, atol)


def check_gpu(model: onnx.ModelProto, inputs: dict, rtol: float = 2e-5, atol: float = 2e-6) -> None:
    """ONNX Runtime's outputs matched by the gpu target (every kernel's buffers NaN-poisoned).
    `atol` is per unit of each output's largest magnitude: a state is a sum of products whose
    float32 rounding scales with the terms, so an element that cancels to near zero (0.033
    among states of 2.3, under LeakyRelu and Affine activations) keeps the absolute error of
    its larger neighbours."""
    want, names = ort_run(_time_major(model), inputs), [o.name for o in model.graph.output]
    compiled = api.compile(parse_onnx(model, input_dims={k: v.shape for k, v in inputs.items()}), "gpu", tune=False)
    compiled.poison()
    got = compiled.run(inputs)
    for name, w in zip(names, want):
        scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
        _compare(got, [w], [name], rtol, atol * scale)


@pytest.mark.parametrize("op,attrs,given,outputs", CASES, ids=lambda c: str(c))
def test_recurrent_ref(op, attrs, given, outputs):
    check_ref(*_model(op, attrs, given, outputs))


@needs_gpu_target
@pytest.mark.parametrize("op,attrs,given,outputs", CASES[::2], ids=lambda c: str(c))
def test_recurrent_gpu(op, attrs, given, outputs):
    check_gpu(*_model(op, attrs, given, outputs))


LENS = np.array([4, 0, 2], np.int32)  # full, empty (final states zeros), partial
LENS_CASES = [(op, direction) for op in GATES for direction in ("forward", "reverse", "bidirectional")]


@pytest.mark.parametrize("as_input", [False, True], ids=["constant", "run-time"])
@pytest.mark.parametrize("op,direction", LENS_CASES)
def test_sequence_lens_ref(op, direction, as_input):
    outs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    check_ref(*_model(op, {"direction": direction}, ("B", "initial_h"), outs, LENS, as_input))


@needs_gpu_target
@pytest.mark.parametrize("op", list(GATES))
def test_sequence_lens_gpu(op):
    outs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    check_gpu(*_model(op, {"direction": "bidirectional"}, ("B",), outs, LENS, True))


@pytest.mark.parametrize("attrs,message", [
    ({"direction": "sideways"}, "direction"),
    ({"layout": 2}, "layout"),
    ({"activations": ["Gelu"]}, "activations"),
    ({"activations": ["Tanh", "Tanh"]}, "activations"),
])
def test_bad_attributes_name_node_and_attribute(attrs, message):
    model, inputs = _model("RNN", attrs, (), ("Y",))
    model.graph.node[0].name = "the_rnn"
    with pytest.raises(ParseError, match=f"the_rnn.*{message}"):
        parse_onnx(model)


def test_weights_not_matching_hidden_size_are_refused():
    model, _ = _model("GRU", {}, (), ("Y",))
    model.graph.node[0].attribute[0].i = H + 1  # hidden_size
    with pytest.raises(ParseError, match="input W .*expected"):
        parse_onnx(model)


def test_bias_of_the_wrong_shape_is_refused():
    model, inputs = _model("LSTM", {}, ("B",), ("Y",))
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 4 * H
    with pytest.raises(ParseError, match="input B has shape"):
        parse_onnx(model, input_dims={"B": [1, 4 * H]})


def test_constant_sequence_lens_out_of_range_are_refused():
    model, _ = _model("RNN", {}, (), ("Y",), np.array([4, 5, 1], np.int32))
    with pytest.raises(ParseError, match=r"sequence_lens \[4, 5, 1\] outside \[0, 4\]"):
        parse_onnx(model)


def _torch_export(module, x):
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(module, (x,), buf, opset_version=17, dynamo=False, input_names=["x"],
                          output_names=["y", "h"] if isinstance(module, torch.nn.GRU) else ["y", "h", "c"])
    return onnx.load_from_string(buf.getvalue())


def _torch_model(kind: str):
    torch = pytest.importorskip("torch")
    module = getattr(torch.nn, kind)(I, H, num_layers=2, bidirectional=True, batch_first=True).eval()
    x = np.random.default_rng().standard_normal((B, T, I)).astype(np.float32)
    model = _torch_export(module, torch.from_numpy(x))
    assert kind in {n.op_type for n in model.graph.node}
    return model, {"x": x}


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_exported(kind):
    check_ref(*_torch_model(kind), rtol=1e-4, atol=1e-5)


@needs_gpu_target
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_exported_gpu(kind):
    check_gpu(*_torch_model(kind), rtol=1e-4, atol=1e-5)
