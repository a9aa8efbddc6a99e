"""A seeded corpus of hostile inputs, each with the outcome fusegraph must give.

Files are written into a directory at test time (nothing binary is committed). A case is one of
three kinds: `model` (parse_onnx on a path, bytes or ModelProto, then, if accepted, a run on the
ref target), `runtime` (Program.run on bad or unusual inputs) and `cli` (main(argv) in process).
`expect` is "accept", the name of a FusegraphError subclass, or "exit2" for the command line
(exit code 2 and one `fusegraph: error: ` line). `needle` is text the message must contain, the
culprit it names. Accepted cases carry a `check` of their outputs against NumPy.
"""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20240611
HUGE = 1 << 40

Check = Callable[[dict, dict], None]


@dataclass
class Case:
    name: str
    kind: str
    expect: str
    needle: str = ""
    source: Callable[[], Any] | None = None
    input_dims: dict[str, list[int]] | None = None
    inputs: Callable[[], dict] | None = None
    check: Check | None = None
    argv: list[str] = field(default_factory=list)
    after: Callable[[], None] | None = None


# small models --------------------------------------------------------------------------------

def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def model_of(nodes: list, inputs: dict[str, list], outputs: list[str], inits: dict[str, np.ndarray] | None = None,
             opset: int = 17, dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "hostile",
                              [helper.make_tensor_value_info(k, dtype, v) for k, v in inputs.items()],
                              [helper.make_tensor_value_info(o, dtype, None) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def relu_model() -> onnx.ModelProto:
    return model_of([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": [2, 3]}, ["y"])


def conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(SEED)
    return model_of([helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                     helper.make_node("Relu", ["c"], ["y"], name="relu")],
                    {"x": [1, 2, 5, 5]}, ["y"], {"w": _rand(rng, 3, 2, 3, 3), "b": _rand(rng, 3)})


def chain_model() -> onnx.ModelProto:
    rng = np.random.default_rng(SEED + 1)
    return model_of([helper.make_node("Add", ["x", "b"], ["s"], name="add"),
                     helper.make_node("Mul", ["s", "c"], ["m"], name="mul"),
                     helper.make_node("Reshape", ["m", "shape"], ["r"], name="reshape"),
                     helper.make_node("Transpose", ["r"], ["y"], name="transpose", perm=[1, 0])],
                    {"x": [2, 3]}, ["y"],
                    {"b": _rand(rng, 3), "c": _rand(rng, 2, 3), "shape": np.array([3, 2], np.int64)})


def one_node(op: str, inputs: dict[str, list], inits: dict[str, np.ndarray] | None = None, n_out: int = 1,
             opset: int = 17, **attrs: Any) -> onnx.ModelProto:
    """A model of one node named `op.lower()` reading the inputs then the initializers."""
    outs = ["y"] if n_out == 1 else [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, list(inputs) + list(inits or {}), outs, name=op.lower(), **attrs)
    return model_of([node], inputs, outs, inits, opset)


def _with(make: Callable[[], onnx.ModelProto], edit: Callable[[onnx.ModelProto], None]) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        m = make()
        edit(m)
        return m
    return build


# checks of accepted results ------------------------------------------------------------------

def same_as(reference: Callable[[dict], dict]) -> Check:
    """Outputs equal `reference(inputs)` to 1e-5 relative, NaN and Inf in the same places."""
    def check(inputs: dict, outputs: dict) -> None:
        for name, want in reference(inputs).items():
            got = outputs[name]
            assert got.shape == want.shape, (name, got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    return check


def has_nonfinite(check: Check) -> Check:
    def both(inputs: dict, outputs: dict) -> None:
        assert any(not np.isfinite(v).all() for v in outputs.values()), "NaN/Inf did not propagate"
        check(inputs, outputs)
    return both


# writing files -------------------------------------------------------------------------------

class Writer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = 0

    def bytes(self, data: bytes, suffix: str = ".onnx") -> str:
        self.count += 1
        path = self.root / f"c{self.count:03d}{suffix}"
        path.write_bytes(data)
        return str(path)

    def model(self, m: onnx.ModelProto) -> str:
        return self.bytes(m.SerializeToString())

    def npy(self, a: np.ndarray) -> str:
        self.count += 1
        path = self.root / f"c{self.count:03d}.npy"
        np.save(path, a, allow_pickle=a.dtype == object)
        return str(path)


def _const(value: Any) -> Callable[[], Any]:
    return lambda: value


def graph_region(data: bytes, model: onnx.ModelProto) -> tuple[int, int]:
    """Byte range [start, end) of the graph field: a cut inside it can never decode."""
    head = onnx.ModelProto()
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        if model.HasField(f):
            setattr(head, f, getattr(model, f))
    start = len(head.SerializeToString())
    size = model.graph.ByteSize()
    end = start + 1 + _varint_len(size) + size
    assert data[start] == 0x3A, "graph is not serialized where expected"
    return start, end


def _varint_len(n: int) -> int:
    k = 1
    while n >= 0x80:
        n >>= 7
        k += 1
    return k


# files that are not models -------------------------------------------------------------------

TEXTS = ["this is not a model\n" * 20, '{"graph": {"node": []}}\n', "ir_version: 8\ngraph { name: 'g' }\n",
         "import torch\nmodel = torch.nn.Conv2d(3, 8, 3)\n", "\u00e9\u00e8 unicode \u2603 text\n" * 3, "x" * 4096]


def file_cases(w: Writer) -> list[Case]:
    rng = np.random.default_rng(SEED + 2)
    cases = [Case("empty file", "model", "ModelLoadError", "empty file", _const(w.bytes(b""))),
             Case("directory", "model", "ModelLoadError", "is a directory", _const(str(w.root))),
             Case("missing file", "model", "ModelLoadError", "no such file", _const(str(w.root / "none.onnx"))),
             Case("missing file in missing dir", "model", "ModelLoadError", "no such file",
                  _const(str(w.root / "no" / "dir" / "m.onnx")))]
    for k, n in enumerate([1, 2, 7, 64, 511, 4096, 65537]):
        cases.append(Case(f"random bytes {n}", "model", "ModelLoadError", "", _const(w.bytes(rng.bytes(n)))))
    for k, tag in enumerate([0x3A, 0x08, 0x42, 0x12, 0x0A]):  # fields a model has, then random payloads
        data = bytes([tag]) + rng.bytes(200)
        cases.append(Case(f"random bytes after tag {tag:#x}", "model", "ModelLoadError", "", _const(w.bytes(data))))
    for k, text in enumerate(TEXTS):
        cases.append(Case(f"text {k}", "model", "ModelLoadError", "", _const(w.bytes(text.encode()))))
    cases.append(Case("empty bytes", "model", "ModelLoadError", "empty", _const(b"")))
    return cases


def not_model_cases(w: Writer) -> list[Case]:
    """Valid protobufs of other ONNX messages: none holds a graph a model would."""
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    tensor = numpy_helper.from_array(np.arange(12, dtype=np.int64).reshape(3, 4), "t")
    messages = {"GraphProto": relu_model().graph, "NodeProto": node, "TensorProto": tensor,
                "ValueInfoProto": helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                "OperatorSetIdProto": helper.make_opsetid("", 17),
                "ModelProto without graph": helper.make_model(helper.make_graph([], "g", [], [])),
                "ModelProto with only ir_version": onnx.ModelProto(ir_version=8)}
    messages["ModelProto without graph"].ClearField("graph")
    return [Case(f"protobuf {name}", "model", "ModelLoadError", "", _const(w.bytes(m.SerializeToString())))
            for name, m in messages.items()]


def truncated_cases(w: Writer, name: str, model: onnx.ModelProto, cuts: int, to_file: bool) -> list[Case]:
    """Cuts at seeded offsets inside the header or the graph (a cut after the graph may leave a valid
    model without metadata); one exactly where the graph ends (no opset_import left)."""
    data = model.SerializeToString()
    start, end = graph_region(data, model)
    rng = np.random.default_rng(SEED + len(data) % 997)
    offsets = sorted({1, start, start + 1, start + 2, end - 1, end, *rng.integers(start + 3, end - 1, cuts).tolist()})
    cases = []
    for off in offsets:
        src = _const(w.bytes(data[:off])) if to_file else (lambda off=off: data[:off])
        cases.append(Case(f"{name} cut at {off}/{len(data)}", "model", "ModelLoadError", "", src))
    return cases


# graph corruption of small models ------------------------------------------------------------

def _set_input(i: int, name: str) -> Callable[[onnx.ModelProto], None]:
    def edit(m: onnx.ModelProto) -> None:
        m.graph.node[0].input[i] = name
    return edit


def _cycle(m: onnx.ModelProto) -> None:
    m.graph.node[0].input[0] = "y"  # conv reads relu's output, relu reads conv's


def _self_loop(m: onnx.ModelProto) -> None:
    m.graph.node[1].input[0] = "y"


def _swap_nodes(m: onnx.ModelProto) -> None:
    a, b = onnx.NodeProto(), onnx.NodeProto()
    a.CopyFrom(m.graph.node[0])
    b.CopyFrom(m.graph.node[1])
    m.graph.node[0].CopyFrom(b)
    m.graph.node[1].CopyFrom(a)


def _dup(field_name: str) -> Callable[[onnx.ModelProto], None]:
    def edit(m: onnx.ModelProto) -> None:
        items = getattr(m.graph, field_name)
        items.add().CopyFrom(items[0])
    return edit


def _second_producer(m: onnx.ModelProto) -> None:
    m.graph.node.append(helper.make_node("Neg", ["x"], ["c"], name="again"))


def _init(edit: Callable[[onnx.TensorProto], None], k: int = 0) -> Callable[[onnx.ModelProto], None]:
    def apply(m: onnx.ModelProto) -> None:
        edit(m.graph.initializer[k])
    return apply


def _short_raw(t: onnx.TensorProto) -> None:
    t.raw_data = t.raw_data[: len(t.raw_data) // 2]


def _long_raw(t: onnx.TensorProto) -> None:
    t.raw_data = t.raw_data + b"\0" * 8


def _no_data(t: onnx.TensorProto) -> None:
    t.ClearField("raw_data")


def _short_floats(t: onnx.TensorProto) -> None:
    values = np.frombuffer(t.raw_data, np.float32)[:-1]
    t.ClearField("raw_data")
    t.float_data.extend(values.tolist())


def _dims(*dims: int) -> Callable[[onnx.TensorProto], None]:
    def edit(t: onnx.TensorProto) -> None:
        del t.dims[:]
        t.dims.extend(dims)
    return edit


def _dtype(code: int) -> Callable[[onnx.TensorProto], None]:
    def edit(t: onnx.TensorProto) -> None:
        t.data_type = code
    return edit


def _input_dims(*dims: int) -> Callable[[onnx.ModelProto], None]:
    def edit(m: onnx.ModelProto) -> None:
        shape = m.graph.input[0].type.tensor_type.shape
        shape.ClearField("dim")
        for d in dims:
            shape.dim.add().dim_value = d
    return edit


def _input_elem(code: int) -> Callable[[onnx.ModelProto], None]:
    def edit(m: onnx.ModelProto) -> None:
        m.graph.input[0].type.tensor_type.elem_type = code
    return edit


def _opset(version: int) -> Callable[[onnx.ModelProto], None]:
    def edit(m: onnx.ModelProto) -> None:
        m.opset_import[0].version = version
    return edit


def _domain(domain: str) -> Callable[[onnx.ModelProto], None]:
    def edit(m: onnx.ModelProto) -> None:
        m.graph.node[0].domain = domain
    return edit


def _extra_input(m: onnx.ModelProto) -> None:
    m.graph.node[-1].input.append("x")


def _no_outputs(m: onnx.ModelProto) -> None:
    m.graph.ClearField("output")


def _clear_opsets(m: onnx.ModelProto) -> None:
    m.ClearField("opset_import")


F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _sub_graph() -> onnx.GraphProto:
    return helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "branch", [],
                             [helper.make_tensor_value_info("z", F, [2, 3])])


def _if_model() -> onnx.ModelProto:
    """An If on a run-time condition (a constant one is read as the branch it takes)."""
    node = helper.make_node("If", ["cond"], ["y"], name="if", then_branch=_sub_graph(), else_branch=_sub_graph())
    m = model_of([node], {"x": [2, 3], "cond": []}, ["y"])
    m.graph.input[1].type.tensor_type.elem_type = TensorProto.BOOL
    return m


def _loop_model() -> onnx.ModelProto:
    """A Loop whose trip count is a run-time input (a constant one is unrolled)."""
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Identity", ["v"], ["v2"])],
                             "body", [helper.make_tensor_value_info("i", I64, []),
                                      helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                      helper.make_tensor_value_info("v", F, [2, 3])],
                             [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v2", F, [2, 3])])
    m = model_of([helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=body)], {"x": [2, 3], "n": []}, ["y"])
    m.graph.input[1].type.tensor_type.elem_type = I64
    return m


def structure_cases() -> list[tuple[str, Callable[[], onnx.ModelProto], str, str]]:
    """(name, model, expected error, culprit) for broken graph structure and tensors."""
    return [
        ("dangling node input", _with(relu_model, _set_input(0, "ghost")), "ParseError", "ghost"),
        ("dangling weight", _with(conv_model, _set_input(1, "no_w")), "ParseError", "no_w"),
        ("cycle of two nodes", _with(conv_model, _cycle), "ParseError", "cycle"),
        ("node reading its own output", _with(conv_model, _self_loop), "ParseError", "cycle"),
        ("nodes out of order", _with(conv_model, _swap_nodes), "ParseError", "'c'"),
        ("duplicate graph input", _with(relu_model, _dup("input")), "ParseError", "'x'"),
        ("duplicate graph output", _with(relu_model, _dup("output")), "ParseError", "'y'"),
        ("duplicate initializer", _with(conv_model, _dup("initializer")), "ParseError", "'w'"),
        ("value produced twice", _with(conv_model, _second_producer), "ParseError", "'c'"),
        ("no graph outputs", _with(conv_model, _no_outputs), "ParseError", "output"),
        ("no opset_import", _with(relu_model, _clear_opsets), "ModelLoadError", "opset"),
        ("initializer raw_data short", _with(conv_model, _init(_short_raw)), "ParseError", "'w'"),
        ("initializer raw_data long", _with(conv_model, _init(_long_raw)), "ParseError", "'w'"),
        ("initializer without data", _with(conv_model, _init(_no_data)), "ParseError", "'w'"),
        ("initializer float_data short", _with(conv_model, _init(_short_floats)), "ParseError", "'w'"),
        ("initializer dtype 999", _with(conv_model, _init(_dtype(999))), "ParseError", "'w'"),
        ("initializer dtype UNDEFINED", _with(conv_model, _init(_dtype(0))), "ParseError", "'w'"),
        ("initializer dtype STRING", _with(conv_model, _init(_dtype(TensorProto.STRING))), "ParseError", "'w'"),
        ("initializer negative dim", _with(conv_model, _init(_dims(3, -2, 3, 3))), "ParseError", "'w'"),
        ("initializer huge dim", _with(conv_model, _init(_dims(3, 2, HUGE, 3))), "ParseError", "'w'"),
        ("initializer huge total", _with(conv_model, _init(_dims(1 << 20, 1 << 20, 1 << 20, 1))), "ParseError", "'w'"),
        ("initializer zero dim", _with(conv_model, _init(_dims(3, 0, 3, 3))), "ParseError", "'w'"),
        ("input negative dim", _with(relu_model, _input_dims(2, -3)), "ParseError", "'x'"),
        ("input huge dim", _with(relu_model, _input_dims(2, HUGE)), "ParseError", "'x'"),
        ("input huge total", _with(relu_model, _input_dims(1 << 16, 1 << 16, 1 << 16)), "ParseError", "'x'"),
        ("input elem_type 999", _with(relu_model, _input_elem(999)), "ParseError", "'x'"),
        ("input elem_type UNDEFINED", _with(relu_model, _input_elem(0)), "ParseError", "'x'"),
        ("input elem_type STRING", _with(relu_model, _input_elem(TensorProto.STRING)), "ParseError", "'x'"),
        ("opset 0", _with(relu_model, _opset(0)), "ParseError", "opset 0"),
        ("opset 99", _with(relu_model, _opset(99)), "ParseError", "opset 99"),
        ("unknown domain", _with(relu_model, _domain("org.nowhere")), "UnsupportedOpError", "org.nowhere.Relu"),
        ("custom-domain op", lambda: one_node("Frobnicate", {"x": [2]}), "UnsupportedOpError", "Frobnicate"),
        ("If on a run-time condition", _if_model, "DynamicValueError", "'if' (If)"),
        ("Loop of a run-time trip count", _loop_model, "DynamicValueError", "'loop' (Loop)"),
        ("extra input to Relu", _with(relu_model, _extra_input), "ParseError", "'relu'"),
        ("extra input to Transpose", _with(chain_model, _extra_input), "ParseError", "'transpose'"),
        ("missing required input", lambda: one_node("Add", {"x": [2]}), "ParseError", "'add'"),
        ("empty required input", _with(conv_model, _set_input(1, "")), "ParseError", "'conv'"),
    ]


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def op_cases() -> list[tuple[str, Callable[[], onnx.ModelProto], str, str]]:
    """(name, model, expected error, culprit) for nodes whose attributes or constant inputs are wrong."""
    rng = np.random.default_rng(SEED + 3)
    w = _rand(rng, 3, 2, 3, 3)
    x4 = {"x": [1, 2, 5, 5]}
    conv = lambda **a: (lambda: one_node("Conv", x4, {"w": w}, **a))  # noqa: E731
    reshape = lambda *t: (lambda: one_node("Reshape", {"x": [2, 3]}, {"t": _i64(*t)}))  # noqa: E731
    transpose = lambda p: (lambda: one_node("Transpose", {"x": [2, 3, 4]}, perm=p))  # noqa: E731
    split = lambda **a: (lambda: one_node("Split", {"x": [6, 2]}, n_out=3, **a))  # noqa: E731
    return [
        ("Reshape two -1", reshape(-1, -1), "ParseError", "'reshape'"),
        ("Reshape wrong size", reshape(4, 2), "ShapeError", "'reshape'"),
        ("Reshape -2", reshape(-2, -3), "ShapeError", "'reshape'"),
        ("Reshape 0 beyond rank", reshape(2, 3, 0), "ParseError", "'reshape'"),
        ("Reshape huge", reshape(HUGE, HUGE), "ShapeError", "'reshape'"),
        ("Reshape float target", lambda: one_node("Reshape", {"x": [2, 3]}, {"t": np.array([3.5, 2], np.float32)}),
         "ParseError", "'reshape'"),
        ("Reshape target dynamic", lambda: one_node("Reshape", {"x": [2, 3], "t": [2]}), "DynamicValueError", "'reshape'"),
        ("Transpose perm short", transpose([1, 0]), "ShapeError", "'transpose'"),
        ("Transpose perm repeated", transpose([0, 0, 1]), "ShapeError", "'transpose'"),
        ("Transpose perm out of range", transpose([0, 1, 3]), "ShapeError", "'transpose'"),
        ("Transpose perm negative", transpose([-1, 0, 1]), "ShapeError", "'transpose'"),
        ("Conv weight rank 3", lambda: one_node("Conv", x4, {"w": w[0]}), "ShapeError", "'conv'"),
        ("Conv weight rank 5", lambda: one_node("Conv", x4, {"w": w[..., None]}), "ShapeError", "'conv'"),
        ("Conv group 3", conv(group=3), "ShapeError", "'conv'"),
        ("Conv group 0", conv(group=0), "ParseError", "'conv'"),
        ("Conv group -1", conv(group=-1), "ParseError", "'conv'"),
        ("Conv channels mismatch", lambda: one_node("Conv", {"x": [1, 4, 5, 5]}, {"w": w}), "ShapeError", "'conv'"),
        ("Conv input rank 2", lambda: one_node("Conv", {"x": [2, 5]}, {"w": w}), "ParseError", "'conv'"),
        ("Conv negative pads", conv(pads=[-1, 0, 0, 0]), "ParseError", "'conv'"),
        ("Conv pads length", conv(pads=[1, 1]), "ParseError", "'conv'"),
        ("Conv zero strides", conv(strides=[0, 1]), "ParseError", "'conv'"),
        ("Conv negative dilation", conv(dilations=[1, -1]), "ParseError", "'conv'"),
        ("Conv kernel larger than input", lambda: one_node("Conv", {"x": [1, 2, 2, 2]}, {"w": w}), "ShapeError", "'conv'"),
        ("Conv bias length", lambda: one_node("Conv", x4, {"w": w, "b": _rand(rng, 4)}), "ParseError", "'conv'"),
        ("MaxPool zero strides", lambda: one_node("MaxPool", x4, kernel_shape=[2, 2], strides=[0, 0]),
         "ParseError", "'maxpool'"),
        ("MaxPool negative pads", lambda: one_node("MaxPool", x4, kernel_shape=[2, 2], pads=[0, -1, 0, 0]),
         "ParseError", "'maxpool'"),
        ("MaxPool zero kernel", lambda: one_node("MaxPool", x4, kernel_shape=[0, 2]), "ParseError", "'maxpool'"),
        ("Concat rank mismatch", lambda: one_node("Concat", {"x": [2, 3], "z": [2, 3, 1]}, axis=0), "ShapeError", "'concat'"),
        ("Concat dim mismatch", lambda: one_node("Concat", {"x": [2, 3], "z": [2, 4]}, axis=0), "ShapeError", "'concat'"),
        ("Concat axis out of range", lambda: one_node("Concat", {"x": [2, 3], "z": [2, 3]}, axis=2), "ParseError", "'concat'"),
        ("Concat dtype mismatch", lambda: one_node("Concat", {"x": [2, 3]}, {"z": np.ones((2, 3), np.int64)}, axis=0),
         "ShapeError", "'concat'"),
        ("Gather index too big", lambda: one_node("Gather", {"x": [4, 3]}, {"i": _i64(1, 4)}), "ParseError", "'gather'"),
        ("Gather index too small", lambda: one_node("Gather", {"x": [4, 3]}, {"i": _i64(-5)}), "ParseError", "'gather'"),
        ("Gather scalar index too big", lambda: one_node("Gather", {"x": [4, 3]}, {"i": np.array(7, np.int64)}, axis=0),
         "ParseError", "'gather'"),
        ("Gather float index", lambda: one_node("Gather", {"x": [4, 3]}, {"i": np.array([1.0], np.float32)}),
         "ShapeError", "'gather'"),
        ("Gather axis out of range", lambda: one_node("Gather", {"x": [4, 3]}, {"i": _i64(0)}, axis=2), "ParseError", "'gather'"),
        ("Split sizes short", lambda: one_node("Split", {"x": [6, 2]}, {"s": _i64(1, 2, 2)}, n_out=3), "ParseError", "'split'"),
        ("Split sizes long", lambda: one_node("Split", {"x": [6, 2]}, {"s": _i64(4, 2, 2)}, n_out=3), "ParseError", "'split'"),
        ("Split negative size", lambda: one_node("Split", {"x": [6, 2]}, {"s": _i64(8, -2, 0)}, n_out=3), "ParseError", "'split'"),
        ("Split num_outputs 0", split(num_outputs=0, axis=0), "ParseError", "'split'"),
        ("Split num_outputs -2", split(num_outputs=-2, axis=0), "ParseError", "'split'"),
        ("Split num_outputs vs outputs", split(num_outputs=2, axis=0), "ParseError", "'split'"),
        ("Split sizes vs outputs", lambda: one_node("Split", {"x": [6, 2]}, {"s": _i64(3, 3)}, n_out=3), "ParseError", "'split'"),
        ("Slice step 0", lambda: one_node("Slice", {"x": [4, 3]}, {"s": _i64(0), "e": _i64(2), "a": _i64(0), "st": _i64(0)}),
         "ParseError", "'slice'"),
        ("Slice axis out of range", lambda: one_node("Slice", {"x": [4, 3]}, {"s": _i64(0), "e": _i64(2), "a": _i64(5)}),
         "ParseError", "'slice'"),
        ("Slice lengths differ", lambda: one_node("Slice", {"x": [4, 3]}, {"s": _i64(0, 0), "e": _i64(2)}),
         "ParseError", "'slice'"),
        ("Softmax axis float", lambda: one_node("Softmax", {"x": [2, 3]}, axis=1.5), "ParseError", "'softmax'"),
        ("Softmax axis string", lambda: one_node("Softmax", {"x": [2, 3]}, axis="1"), "ParseError", "'softmax'"),
        ("Transpose perm floats", transpose([2.0, 1.0, 0.0]), "ParseError", "'transpose'"),
        ("Conv strides string", conv(strides="11"), "ParseError", "'conv'"),
        ("Conv group float", conv(group=1.0), "ParseError", "'conv'"),
        ("LeakyRelu alpha string", lambda: one_node("LeakyRelu", {"x": [2, 3]}, alpha="big"), "ParseError", "'leakyrelu'"),
        ("Cast to 999", lambda: one_node("Cast", {"x": [2, 3]}, to=999), "ParseError", "'cast'"),
        ("Cast to STRING", lambda: one_node("Cast", {"x": [2, 3]}, to=TensorProto.STRING), "ParseError", "'cast'"),
        ("Expand float dims", lambda: one_node("Expand", {"x": [2, 1]}, {"s": np.array([2.0, 3.0], np.float32)}),
         "ParseError", "'expand'"),
        ("Expand negative dims", lambda: one_node("Expand", {"x": [2, 1]}, {"s": _i64(2, -3)}), "ParseError", "'expand'"),
        ("Expand huge", lambda: one_node("Expand", {"x": [2, 1]}, {"s": _i64(HUGE, HUGE)}), "ParseError", "'expand'"),
        ("ConstantOfShape float dims", lambda: one_node("ConstantOfShape", {}, {"s": np.array([2.5], np.float32)}),
         "ParseError", "'constantofshape'"),
        ("ConstantOfShape negative", lambda: one_node("ConstantOfShape", {}, {"s": _i64(-4)}), "ParseError",
         "'constantofshape'"),
        ("ConstantOfShape huge", lambda: one_node("ConstantOfShape", {}, {"s": _i64(HUGE, HUGE)}), "ShapeError",
         "'constantofshape'"),
        ("Tile float repeats", lambda: one_node("Tile", {"x": [2, 3]}, {"r": np.array([2.0, 1.0], np.float32)}),
         "ParseError", "'tile'"),
        ("Tile huge", lambda: one_node("Tile", {"x": [2, 3]}, {"r": _i64(HUGE, HUGE)}), "ShapeError", "'tile'"),
        ("Range huge", lambda: one_node("Range", {}, {"a": np.array(0, np.int64), "b": np.array(HUGE, np.int64),
                                                    "d": np.array(1, np.int64)}), "ParseError", "'range'"),
        ("Range delta 0", lambda: one_node("Range", {}, {"a": np.array(0, np.int64), "b": np.array(4, np.int64),
                                                       "d": np.array(0, np.int64)}), "ParseError", "'range'"),
        ("Squeeze non-1 axis", lambda: one_node("Squeeze", {"x": [2, 3]}, {"a": _i64(0)}), "ParseError", "'squeeze'"),
        ("Unsqueeze repeated axis", lambda: one_node("Unsqueeze", {"x": [2, 3]}, {"a": _i64(0, 0)}), "ParseError",
         "'unsqueeze'"),
        ("MatMul mismatch", lambda: one_node("MatMul", {"x": [2, 3]}, {"b": _rand(rng, 4, 2)}), "ParseError", "'matmul'"),
        ("Add not broadcastable", lambda: one_node("Add", {"x": [2, 3]}, {"b": _rand(rng, 4)}), "ParseError", "'add'"),
        ("Constant without value", lambda: model_of([helper.make_node("Constant", [], ["y"], name="k")], {}, ["y"]),
         "ParseError", "'k'"),
    ]


def _seeded_inputs(shapes: dict[str, tuple[int, ...]], seed: int) -> Callable[[], dict]:
    return lambda: {k: np.random.default_rng(seed + i).standard_normal(s).astype(np.float32)
                    for i, (k, s) in enumerate(shapes.items())}


def accepted_cases() -> list[Case]:
    """Unusual but valid models: they must parse, run, and give NumPy's answer, NaN and Inf included."""
    rng = np.random.default_rng(SEED + 4)
    nan_w = _rand(rng, 3, 4)
    nan_w[1, 2] = np.nan
    inf_b = _rand(rng, 4)
    inf_b[0], inf_b[3] = np.inf, -np.inf
    conv_w = _rand(rng, 3, 2, 1, 1)
    conv_w[2, 0, 0, 0] = np.nan
    big = np.full((2, 3), 3e38, np.float32)
    inputs23 = _seeded_inputs({"x": (2, 3)}, SEED)
    cases = [
        Case("NaN weight in MatMul", "model", "accept", source=lambda: one_node("MatMul", {"x": [2, 3]}, {"w": nan_w}),
             inputs=inputs23, check=has_nonfinite(same_as(lambda d: {"y": d["x"] @ nan_w}))),
        Case("Inf bias in Add", "model", "accept", source=lambda: one_node("Add", {"x": [2, 4]}, {"b": inf_b}),
             inputs=_seeded_inputs({"x": (2, 4)}, SEED), check=has_nonfinite(same_as(lambda d: {"y": d["x"] + inf_b}))),
        Case("NaN weight in Conv", "model", "accept", source=lambda: one_node("Conv", {"x": [1, 2, 4, 4]}, {"w": conv_w}),
             inputs=_seeded_inputs({"x": (1, 2, 4, 4)}, SEED),
             check=has_nonfinite(same_as(lambda d: {"y": np.einsum("nchw,mc->nmhw", d["x"], conv_w[:, :, 0, 0])}))),
        Case("overflow to Inf in Mul", "model", "accept", source=lambda: one_node("Mul", {"x": [2, 3]}, {"b": big}),
             inputs=lambda: {"x": np.full((2, 3), 10, np.float32)},
             check=has_nonfinite(same_as(lambda d: {"y": d["x"] * big}))),
        Case("NaN weight through Relu chain", "model", "accept",
             source=lambda: model_of([helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                                      helper.make_node("Relu", ["m"], ["y"], name="relu")], {"x": [2, 3]}, ["y"],
                                     {"w": nan_w}),
             inputs=inputs23, check=has_nonfinite(same_as(lambda d: {"y": np.maximum(d["x"] @ nan_w, 0)}))),
        Case("empty initializer in Concat", "model", "accept",
             source=lambda: one_node("Concat", {"x": [2, 3]}, {"e": np.zeros((0, 3), np.float32)}, axis=0),
             inputs=inputs23, check=same_as(lambda d: {"y": d["x"]})),
        Case("initializer listed as graph input", "model", "accept",
             source=_with(lambda: one_node("Add", {"x": [2, 3]}, {"b": nan_w[:2, :3].copy()}),
                          lambda m: m.graph.input.append(helper.make_tensor_value_info("b", F, [2, 3]))),
             inputs=inputs23, check=has_nonfinite(same_as(lambda d: {"y": d["x"] + nan_w[:2, :3]}))),
        Case("--input-dim overrides a dim", "model", "accept", source=relu_model, input_dims={"x": [4, 3]},
             inputs=_seeded_inputs({"x": (4, 3)}, SEED), check=same_as(lambda d: {"y": np.maximum(d["x"], 0)})),
        Case("input_dims huge", "model", "ParseError", "'x'", source=relu_model, input_dims={"x": [HUGE, 3]}),
        Case("input_dims negative", "model", "ArgumentError", "'x'", source=relu_model, input_dims={"x": [-2, 3]}),
        Case("input_dims wrong rank", "model", "ParseError", "'x'", source=relu_model, input_dims={"x": [6]}),
        Case("input_dims unknown name", "model", "ParseError", "'nope'", source=relu_model, input_dims={"nope": [2, 3]}),
    ]
    return cases


def yolo_cases(yolo: Callable[[], onnx.ModelProto]) -> list[Case]:
    """Corruptions of the zoo's yolov5s, a real exported graph with 263 nodes."""
    def edited(edit: Callable[[onnx.ModelProto], None]) -> Callable[[], onnx.ModelProto]:
        def build() -> onnx.ModelProto:
            m = onnx.ModelProto()
            m.CopyFrom(yolo())
            edit(m)
            return m
        return build

    def node_named(m: onnx.ModelProto, op: str, k: int = 0) -> onnx.NodeProto:
        return [n for n in m.graph.node if n.op_type == op][k]

    def rewire(op: str, k: int, i: int, to: str) -> Callable[[onnx.ModelProto], None]:
        return lambda m: node_named(m, op, k).input.__setitem__(i, to)

    def set_attr(op: str, k: int, name: str, value: Any) -> Callable[[onnx.ModelProto], None]:
        def edit(m: onnx.ModelProto) -> None:
            n = node_named(m, op, k)
            kept = [a for a in n.attribute if a.name != name]
            del n.attribute[:]
            n.attribute.extend(kept + [helper.make_attribute(name, value)])
        return edit

    def cycle(m: onnx.ModelProto) -> None:
        m.graph.node[0].input[0] = m.graph.node[5].output[0]

    def init(edit: Callable[[onnx.TensorProto], None], k: int = 0) -> Callable[[onnx.ModelProto], None]:
        return lambda m: edit(m.graph.initializer[k])

    def reshape_target(m: onnx.ModelProto) -> None:
        target = node_named(m, "Reshape").input[1]
        for t in m.graph.initializer:
            if t.name == target:
                t.CopyFrom(numpy_helper.from_array(np.array([1, 3, 85, 20, -1, -1], np.int64), target))
        for n in m.graph.node:
            if n.op_type == "Constant" and n.output[0] == target:
                n.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array([1, 3, -1, -1], np.int64)))

    return [Case(f"yolov5s {name}", "model", expect, needle, edited(edit)) for name, edit, expect, needle in [
        ("dangling input", rewire("Conv", 3, 0, "ghost"), "ParseError", "ghost"),
        ("dangling weight", rewire("Conv", 7, 1, "no.such.weight"), "ParseError", "no.such.weight"),
        ("cycle", cycle, "ParseError", "cycle"),
        ("duplicate input", _dup("input"), "ParseError", "'images'"),
        ("duplicate output", _dup("output"), "ParseError", "output"),
        ("duplicate initializer", _dup("initializer"), "ParseError", "initializer"),
        ("no outputs", _no_outputs, "ParseError", "output"),
        ("short initializer", init(_short_raw), "ParseError", "initializer"),
        ("initializer dtype 999", init(_dtype(999)), "ParseError", "initializer"),
        ("initializer huge dims", init(_dims(HUGE, HUGE)), "ParseError", "initializer"),
        ("input huge dims", _input_dims(1, 3, HUGE, HUGE), "ParseError", "'images'"),
        ("input negative dim", _input_dims(1, 3, -640, 640), "ParseError", "'images'"),
        ("bad Reshape target", reshape_target, "ParseError", "Reshape"),
        ("Conv group 2", set_attr("Conv", 0, "group", 2), "ShapeError", "Conv"),
        ("Conv zero strides", set_attr("Conv", 1, "strides", [0, 0]), "ParseError", "Conv"),
        ("Conv negative pads", set_attr("Conv", 2, "pads", [-1, -1, -1, -1]), "ParseError", "Conv"),
        ("Concat axis 3 mismatch", set_attr("Concat", 0, "axis", 3), "ShapeError", "Conv"),
        ("Transpose bad perm", set_attr("Transpose", 0, "perm", [0, 1, 2, 2, 4]), "ShapeError", "Transpose"),
        ("extra Sigmoid input", lambda m: node_named(m, "Sigmoid").input.append("images"), "ParseError", "Sigmoid"),
        ("Mul as custom op", lambda m: setattr(node_named(m, "Mul"), "domain", "com.vendor"), "UnsupportedOpError",
         "com.vendor.Mul"),
        ("opset 99", _opset(99), "ParseError", "opset 99"),
        ("opset 0", _opset(0), "ParseError", "opset 0"),
    ]]


def runtime_cases() -> list[Case]:
    """Bad and unusual run-time inputs to the chain model (x [2, 3] float32) on the ref target."""
    rng = np.random.default_rng(SEED + 5)
    m = chain_model()
    b, c = (numpy_helper.to_array(t) for t in m.graph.initializer[:2])
    want = same_as(lambda d: {"y": ((d["x"] + b) * c).reshape(3, 2).T})
    x = _rand(rng, 2, 3)
    wide = _rand(rng, 4, 6)
    nan_x = x.copy()
    nan_x[0, 1], nan_x[1, 2] = np.nan, np.inf
    run = lambda name, inputs, expect="accept", needle="", check=None: Case(  # noqa: E731
        name, "runtime", expect, needle, _const(m), inputs=inputs, check=check)
    return [
        run("ok", lambda: {"x": x}, check=want),
        run("transposed view", lambda: {"x": x.T.copy().T}, check=want),
        run("strided slice", lambda: {"x": wide[::2, ::2]}, check=want),
        run("negative strides", lambda: {"x": x[::-1, ::-1][::-1, ::-1]}, check=want),
        run("reversed view", lambda: {"x": wide[:2, :3][::-1]}, check=want),
        run("Fortran order", lambda: {"x": np.asfortranarray(x)}, check=want),
        run("read-only", lambda: {"x": _readonly(x)}, check=want),
        run("big-endian float32", lambda: {"x": x.astype(">f4")}, check=want),
        run("NaN and Inf values", lambda: {"x": nan_x}, check=has_nonfinite(want)),
        run("wrong name", lambda: {"z": x}, "InputError", "'z'"),
        run("missing input", lambda: {}, "InputError", "'x'"),
        run("extra input", lambda: {"x": x, "extra": x}, "InputError", "'extra'"),
        run("wrong rank", lambda: {"x": x.reshape(6)}, "InputError", "'x'"),
        run("wrong shape", lambda: {"x": x.T.copy()}, "InputError", "'x'"),
        run("0-d input", lambda: {"x": np.float32(1.0)}, "InputError", "'x'"),
        run("float64", lambda: {"x": x.astype(np.float64)}, "InputError", "float64"),
        run("float16", lambda: {"x": x.astype(np.float16)}, "InputError", "float16"),
        run("int32", lambda: {"x": x.astype(np.int32)}, "InputError", "int32"),
        run("object array", lambda: {"x": np.array([[1, 2, 3], [4, 5, "a"]], dtype=object)}, "InputError", "object"),
        run("nested list", lambda: {"x": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]}, "InputError", "'x'"),
        run("None", lambda: {"x": None}, "InputError", "'x'"),
        run("string", lambda: {"x": "image.png"}, "InputError", "'x'"),
        run("ragged list", lambda: {"x": [[1.0], [2.0, 3.0]]}, "InputError", "'x'"),
    ]


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


class Payload:
    """Unpickling this writes a marker file: a pickle-carrying .npy must never be unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.write_text, (Path(self.marker), "unpickled"))


def npy_cases(w: Writer, model_path: str) -> list[Case]:
    """`fusegraph run MODEL --input x=FILE` on the relu model (x [2, 3] float32)."""
    rng = np.random.default_rng(SEED + 6)
    good = _rand(rng, 2, 3)
    header = w.npy(good)
    raw = Path(header).read_bytes()
    marker = w.root / "unpickled.txt"
    pickled = w.npy(np.array([Payload(str(marker)), 1], dtype=object))

    def not_unpickled() -> None:
        assert not marker.exists(), "a pickled .npy was loaded"

    def cli(name: str, path: str, expect: str = "exit2", needle: str = "") -> Case:
        return Case(f"npy {name}", "cli", expect, needle, argv=["run", model_path, "--input", f"x={path}"],
                    after=not_unpickled)

    nan = good.copy()
    nan[0, 0] = np.nan
    npz = w.root / "inputs.npz"
    with zipfile.ZipFile(npz, "w") as archive:  # np.savez, with a fixed date so the bytes repeat
        archive.writestr(zipfile.ZipInfo("x.npy", date_time=(1980, 1, 1, 0, 0, 0)), raw)
    return [
        cli("good", header, "accept"),
        cli("big-endian", w.npy(good.astype(">f4")), "accept"),
        cli("NaN values", w.npy(nan), "accept", "non-finite"),
        cli("Fortran order", w.npy(np.asfortranarray(good)), "accept"),
        cli("corrupt magic", w.bytes(b"\x93NUMPX" + raw[6:], ".npy"), "exit2", "x"),
        cli("corrupt header dict", w.bytes(raw[:10] + b"{'descr': '<f4', 'shape': (2, 3" + raw[41:], ".npy"), "exit2", "x"),
        cli("header says float99", w.bytes(raw.replace(b"'<f4'", b"'<f9'"), ".npy"), "exit2", "x"),
        cli("truncated data", w.bytes(raw[:-5], ".npy"), "exit2", "x"),
        cli("truncated header", w.bytes(raw[:20], ".npy"), "exit2", "x"),
        cli("empty file", w.bytes(b"", ".npy"), "exit2", "x"),
        cli("text file", w.bytes(b"1 2 3\n4 5 6\n", ".npy"), "exit2", "x"),
        cli("pickled object array", pickled, "exit2", "x"),
        cli("plain pickle", w.bytes(pickle.dumps(Payload(str(marker))), ".npy"), "exit2", "x"),
        cli("npz archive", str(npz), "exit2", "x"),
        cli("missing file", str(w.root / "none.npy"), "exit2", "none.npy"),
        cli("directory", str(w.root), "exit2", "x"),
        cli("wrong shape", w.npy(good.reshape(3, 2)), "exit2", "'x'"),
        cli("wrong dtype", w.npy(good.astype(np.float64)), "exit2", "float64"),
        cli("0-d", w.npy(np.float32(2.0)), "exit2", "'x'"),
        Case("npy unknown input name", "cli", "exit2", "'z'", argv=["run", model_path, "--input", f"z={header}"]),
        Case("npy no '='", "cli", "exit2", "--input", argv=["run", model_path, "--input", header]),
    ]


def cli_cases(w: Writer, model_path: str, bad_paths: list[tuple[str, str]]) -> list[Case]:
    """Misuse of the command line, then each bad model file given to `fusegraph read`."""
    m = model_path
    cases = [Case(f"cli {' '.join(a[:1] + a[2:])}".replace(str(w.root), "TMP").strip(), "cli", expect, needle, argv=a)
             for a, expect, needle in [
                 (["frobnicate", m], "exit2", "frobnicate"),
                 ([], "exit2", "COMMAND"),
                 (["run"], "exit2", "MODEL"),
                 (["run", m, "--bogus"], "exit2", "--bogus"),
                 (["run", m, "--input-dim", "x"], "exit2", "--input-dim"),
                 (["run", m, "--input-dim", "x:a,b"], "exit2", "--input-dim"),
                 (["run", m, "--input-dim", "x:2.5,3"], "exit2", "--input-dim"),
                 (["run", m, "--input-dim", "x:"], "exit2", "'x'"),
                 (["run", m, "--input-dim", ":2,3"], "exit2", "--input-dim"),
                 (["run", m, "--input-dim", "x:-2,3"], "exit2", "'x'"),
                 (["run", m, "--input-dim", "x:2,3,4"], "exit2", "'x'"),
                 (["run", m, "--input-dim", f"x:{HUGE},{HUGE}"], "exit2", "'x'"),
                 (["run", m, "--input-dim", "images:1,3,64,64"], "exit2", "'images'"),
                 (["run", m, "--input-dim", "x:4,3"], "accept", ""),
                 (["run", m, "--seed", "-1"], "exit2", "--seed"),
                 (["run", m, "--seed", "1.5"], "exit2", "--seed"),
                 (["run", m, "--seed", str(1 << 70)], "accept", ""),
                 (["verify", m, "--tolerance", "-1"], "exit2", "--tolerance"),
                 (["verify", m, "--tolerance", "nan"], "exit2", "--tolerance"),
                 (["verify", m, "--tolerance", "inf"], "exit2", "--tolerance"),
                 (["verify", m, "--tolerance", "abc"], "exit2", "--tolerance"),
                 (["verify", m, "--target", "tpu"], "exit2", "--target"),
                 (["run", m, "--save", str(w.root / "no" / "such" / "dir")], "exit2", "--save"),
                 (["run", m, "--save", m], "exit2", "--save"),
                 (["run", m, "--save", str(w.root)], "accept", ""),
                 (["perf", m, "-n", "0"], "exit2", "--iterations"),
                 (["perf", m, "-n", "-5"], "exit2", "--iterations"),
                 (["compile", m, "--fp16", "--bf16"], "exit2", "--bf16"),
             ]]
    cases += [Case(f"cli read {Path(p).name}", "cli", "exit2", needle, argv=["read", p]) for p, needle in bad_paths]
    return cases


def generate(root: Path, yolo: Callable[[], onnx.ModelProto]) -> list[Case]:
    """Every case, its files written under `root`; `yolo` gives the zoo's yolov5s ModelProto."""
    root.mkdir(parents=True, exist_ok=True)
    w = Writer(root)
    cases = file_cases(w) + not_model_cases(w)
    for name, make in [("relu", relu_model), ("conv", conv_model), ("chain", chain_model)]:
        cases += truncated_cases(w, name, make(), 8, to_file=True)
    cases += truncated_cases(w, "yolov5s", yolo(), 10, to_file=False)
    for name, make, expect, needle in structure_cases() + op_cases():
        cases.append(Case(name, "model", expect, needle, _const(w.model(make()))))
    cases += accepted_cases() + yolo_cases(yolo) + runtime_cases()
    relu_path = w.model(relu_model())
    cases += npy_cases(w, relu_path)
    files = [c.source() for c in cases[:40] if isinstance(c.source(), str)][::3]
    bad = [(p, Path(p).name) for p in files] + [(w.model(m()), needle) for _, m, _, needle in structure_cases()[::4]]
    cases += cli_cases(w, relu_path, bad)
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases
