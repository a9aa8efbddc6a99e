"""Models of opsets 1 to 6 (the attribute forms of old exports) on the ref target.

Each case is one op (or a small CNN block) stamped with an old opset, run unfused and compared to
ONNX Runtime on fresh random inputs. ONNX Runtime has no kernel for many op versions before 7 (Add-6,
BatchNormalization-6, Gemm-6, ...); such cases are compared to a NumPy reference of the old
definition instead, or, where they have none, skipped with ONNX Runtime's reason. Tolerances:
rtol 1e-5, atol 1e-5 (float32 either way; sums in another order).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusegraph import api
from fusegraph.errors import ParseError

RTOL = ATOL = 1e-5
Values = dict[str, np.ndarray]


@dataclass
class Case:
    id: str
    opset: int
    nodes: list[onnx.NodeProto]
    inputs: dict[str, tuple[int, ...]]
    inits: Callable[[np.random.Generator], Values] = lambda rng: {}
    ref: Callable[[Values], np.ndarray] | None = None  # the old definition, for ops ONNX Runtime lacks
    positive: tuple[str, ...] = ()  # inputs drawn from (0.5, 1.5): divisors


def model_of(case: Case, inits: Values) -> onnx.ModelProto:
    """IR version 3, which lists initializers among the graph inputs too."""
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(k, f, list(v)) for k, v in case.inputs.items()]
    inputs += [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
               for k, v in inits.items()]
    graph = helper.make_graph(case.nodes, case.id, inputs, [helper.make_tensor_value_info("y", f, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=3)


def node(op: str, inputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, ["y"], **attrs)


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def draw(case: Case) -> tuple[Values, Values]:
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    feeds = {k: (rng.random(s) + 0.5).astype(np.float32) if k in case.positive else randn(rng, *s)
             for k, s in case.inputs.items()}
    return feeds, case.inits(rng)


def ort_or_ref(case: Case, model: onnx.ModelProto, feeds: Values, inits: Values) -> np.ndarray:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001  (ONNX Runtime refuses the old op version)
        if case.ref is None:
            pytest.skip(f"ONNX Runtime refuses the model: {' '.join(str(e).split())[:200]}")
        return case.ref({**feeds, **inits})
    return session.run(None, feeds)[0]


# NumPy references of the old definitions ---------------------------------------------------

def bn_ref(v: Values, eps: float = 1e-5, spatial: bool = True) -> np.ndarray:
    x = v["x"].astype(np.float64)
    shape = (-1,) + (1,) * (x.ndim - 2) if spatial else x.shape[1:]
    s, b, m, var = (v[k].astype(np.float64).reshape(shape) for k in ("s", "b", "m", "v"))
    return (x - m) / np.sqrt(var + eps) * s + b


def along(b: np.ndarray, rank: int, axis: int) -> np.ndarray:
    """B of the legacy broadcast placed at `axis` of a rank-`rank` A."""
    return b.reshape(b.shape + (1,) * (rank - axis - b.ndim))


def linear_1d(x: np.ndarray, axis: int, scale: int) -> np.ndarray:
    """Asymmetric linear upsampling along one axis: output i reads input i / scale."""
    n = x.shape[axis]
    src = np.arange(n * scale) / scale
    i0 = np.floor(src).astype(int)
    i1 = np.minimum(i0 + 1, n - 1)
    w = (src - i0).reshape((-1,) + (1,) * (x.ndim - axis - 1))
    return np.take(x, i0, axis) * (1 - w) + np.take(x, i1, axis) * w


def bn_params(c: tuple[int, ...]) -> Callable[[np.random.Generator], Values]:
    return lambda rng: {"s": randn(rng, *c), "b": randn(rng, *c), "m": randn(rng, *c),
                        "v": (rng.random(c) + 0.5).astype(np.float32)}


def cnn_ref(v: Values) -> np.ndarray:
    """The opset-6 CNN block rewritten in today's op forms and run on ONNX Runtime."""
    import onnxruntime as ort

    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["y"], transB=1, alpha=0.5)]
    f = TensorProto.FLOAT
    inits = {k: a for k, a in v.items() if k != "x"}
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", f, list(v["x"].shape))],
                              [helper.make_tensor_value_info("y", f, None)],
                              [numpy_helper.from_array(a, k) for k, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": v["x"]})[0]


def cnn_block() -> Case:
    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], epsilon=1e-3, is_test=1,
                              momentum=0.9, spatial=1),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["y"], transB=1, alpha=0.5, broadcast=1)]

    def inits(rng: np.random.Generator) -> Values:
        return {"w": randn(rng, 4, 3, 3, 3), "cb": randn(rng, 4), **bn_params((4,))(rng),
                "g": randn(rng, 5, 4 * 4 * 4), "gb": randn(rng, 5)}

    return Case("cnn block conv+bn+relu+maxpool+gemm", 6, nodes, {"x": (2, 3, 8, 8)}, inits, cnn_ref)


def binary_cases() -> list[Case]:
    out = []
    for op, fn in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide)):
        for k in (1, 6):
            extra = {"consumed_inputs": [0, 0]} if k == 1 else {}
            out += [
                Case(f"{op}-{k} broadcast axis=1", k, [node(op, ["a", "b"], broadcast=1, axis=1, **extra)],
                     {"a": (2, 3, 4, 5), "b": (3, 4)}, ref=lambda v, fn=fn: fn(v["a"], along(v["b"], 4, 1)),
                     positive=("b",)),
                Case(f"{op}-{k} broadcast axis=0", k, [node(op, ["a", "b"], broadcast=1, axis=0)],
                     {"a": (2, 3, 4), "b": (2,)}, ref=lambda v, fn=fn: fn(v["a"], along(v["b"], 3, 0)),
                     positive=("b",)),
                Case(f"{op}-{k} broadcast suffix", k, [node(op, ["a", "b"], broadcast=1)],
                     {"a": (2, 3, 4), "b": (3, 4)}, ref=lambda v, fn=fn: fn(v["a"], v["b"]), positive=("b",)),
                Case(f"{op}-{k} one-element B with axis", k, [node(op, ["a", "b"], broadcast=1, axis=2)],
                     {"a": (2, 3, 4), "b": (1, 1)}, ref=lambda v, fn=fn: fn(v["a"], v["b"]), positive=("b",)),
                Case(f"{op}-{k} same shapes", k, [node(op, ["a", "b"])],
                     {"a": (2, 3), "b": (2, 3)}, ref=lambda v, fn=fn: fn(v["a"], v["b"]), positive=("b",)),
            ]
    return out


def activation_cases() -> list[Case]:
    fns = {"Relu": lambda x: np.maximum(x, 0), "Sigmoid": lambda x: 1 / (1 + np.exp(-x)), "Tanh": np.tanh}
    out = []
    for op, fn in fns.items():
        out.append(Case(f"{op}-1 consumed_inputs", 1, [node(op, ["x"], consumed_inputs=[0])], {"x": (2, 3, 4)},
                        ref=lambda v, fn=fn: fn(v["x"].astype(np.float64))))
        out.append(Case(f"{op}-6", 6, [node(op, ["x"])], {"x": (2, 3, 4)}, ref=lambda v, fn=fn: fn(v["x"].astype(np.float64))))
    return out


def bn_cases() -> list[Case]:
    ins = ["x", "s", "b", "m", "v"]
    return [
        Case("BatchNormalization-1 consumed_inputs is_test", 1,
             [node("BatchNormalization", ins, consumed_inputs=[0, 0, 0, 1, 1], is_test=1, epsilon=1e-3, momentum=0.9)],
             {"x": (2, 3, 4, 4)}, bn_params((3,)), lambda v: bn_ref(v, 1e-3)),
        Case("BatchNormalization-6 is_test spatial=1", 6, [node("BatchNormalization", ins, is_test=1, spatial=1)],
             {"x": (2, 3, 4, 4)}, bn_params((3,)), bn_ref),
        Case("BatchNormalization-6 spatial=0", 6, [node("BatchNormalization", ins, is_test=1, spatial=0, epsilon=1e-2)],
             {"x": (2, 3, 4, 4)}, bn_params((3, 4, 4)), lambda v: bn_ref(v, 1e-2, spatial=False)),
        Case("BatchNormalization-7 spatial=0", 7, [node("BatchNormalization", ins, spatial=0)],
             {"x": (2, 3, 4)}, bn_params((3, 4)), lambda v: bn_ref(v, spatial=False)),
    ]


def pool_cases() -> list[Case]:
    def avg(v: Values) -> np.ndarray:
        x = v["x"]
        return x.reshape(x.shape[0], x.shape[1], x.shape[2] // 2, 2, x.shape[3] // 2, 2).mean(axis=(3, 5))

    return [
        Case("MaxPool-1", 1, [node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
             {"x": (1, 2, 7, 7)}),
        Case("AveragePool-1", 1, [node("AveragePool", ["x"], kernel_shape=[2, 2], strides=[2, 2])],
             {"x": (1, 2, 6, 6)}, ref=avg),
        Case("GlobalAveragePool-1", 1, [node("GlobalAveragePool", ["x"])], {"x": (1, 2, 5, 5)}),
        Case("Conv-1", 1, [node("Conv", ["x", "w", "b"], pads=[1, 0, 1, 0], strides=[1, 2], kernel_shape=[3, 3])],
             {"x": (1, 2, 6, 6)}, lambda rng: {"w": randn(rng, 3, 2, 3, 3), "b": randn(rng, 3)}),
        Case("Conv-1 group", 1, [node("Conv", ["x", "w"], group=2, dilations=[2, 2])],
             {"x": (1, 4, 7, 7)}, lambda rng: {"w": randn(rng, 4, 2, 3, 3)}),
    ]


def gemm_cases() -> list[Case]:
    return [
        Case("Gemm-6 broadcast C [N]", 6, [node("Gemm", ["a", "b", "c"], broadcast=1, alpha=0.5, beta=2.0)],
             {"a": (3, 4)}, lambda rng: {"b": randn(rng, 4, 5), "c": randn(rng, 5)},
             lambda v: 0.5 * v["a"] @ v["b"] + 2.0 * v["c"]),
        Case("Gemm-1 transA transB", 1, [node("Gemm", ["a", "b", "c"], transA=1, transB=1)],
             {"a": (4, 3)}, lambda rng: {"b": randn(rng, 5, 4), "c": randn(rng, 3, 5)},
             lambda v: v["a"].T @ v["b"].T + v["c"]),
    ]


def layout_cases() -> list[Case]:
    return [
        Case("Reshape-1 shape attribute", 1, [node("Reshape", ["x"], shape=[3, -1], consumed_inputs=[0])], {"x": (2, 3, 4)}),
        Case("Reshape-4 shape attribute with 0", 4, [node("Reshape", ["x"], shape=[0, 12])], {"x": (2, 3, 4)}),
        Case("Concat-1 default axis", 1, [node("Concat", ["a", "b"])], {"a": (2, 3, 4), "b": (2, 2, 4)},
             ref=lambda v: np.concatenate([v["a"], v["b"]], axis=1)),
        Case("Concat-4 axis", 4, [node("Concat", ["a", "b"], axis=0)], {"a": (2, 3), "b": (1, 3)}),
        Case("Dropout-1 is_test", 1, [node("Dropout", ["x"], is_test=1, ratio=0.3, consumed_inputs=[0])], {"x": (2, 3)},
             ref=lambda v: v["x"]),
        Case("Dropout-6 is_test", 6, [node("Dropout", ["x"], is_test=1, ratio=0.7)], {"x": (2, 3)}, ref=lambda v: v["x"]),
        Case("Softmax-1 axis default", 1, [node("Softmax", ["x"])], {"x": (2, 3, 4)}),
        Case("Softmax-1 axis 2", 1, [node("Softmax", ["x"], axis=2)], {"x": (2, 3, 4)}),
        Case("Flatten-1", 1, [node("Flatten", ["x"], axis=2)], {"x": (2, 3, 4, 5)}),
        Case("Slice-1 starts ends axes", 1, [node("Slice", ["x"], starts=[1, -3], ends=[3, 100], axes=[0, 2])],
             {"x": (4, 3, 5)}),
        Case("Slice-1 no axes", 1, [node("Slice", ["x"], starts=[1, 0], ends=[2, -1])], {"x": (4, 3, 5)}),
        Case("Unsqueeze-1 axes", 1, [node("Unsqueeze", ["x"], axes=[0, 3])], {"x": (2, 3)}),
        Case("Squeeze-1 axes", 1, [node("Squeeze", ["x"], axes=[0, 2])], {"x": (1, 3, 1, 2)}),
        Case("Tile-1 tiles axis", 1, [node("Tile", ["x", "t", "a"])], {"x": (2, 3)},
             lambda rng: {"t": np.array([3], np.int64), "a": np.array([1], np.int64)},
             ref=lambda v: np.tile(v["x"], (1, 3))),
        Case("Tile-6 repeats", 6, [node("Tile", ["x", "t"])], {"x": (2, 3)},
             lambda rng: {"t": np.array([2, 2], np.int64)}),
        Case("Transpose-1", 1, [node("Transpose", ["x"], perm=[2, 0, 1])], {"x": (2, 3, 4)}),
    ]


def pad_cases() -> list[Case]:
    return [
        Case("Pad-1 paddings value", 1, [node("Pad", ["x"], paddings=[1, 0, 2, 3], value=1.5)], {"x": (2, 3)},
             ref=lambda v: np.pad(v["x"], [(1, 2), (0, 3)], constant_values=1.5)),
        Case("Pad-1 reflect", 1, [node("Pad", ["x"], paddings=[0, 2, 0, 1], mode="reflect")], {"x": (2, 4)},
             ref=lambda v: np.pad(v["x"], [(0, 0), (2, 1)], mode="reflect")),
        Case("Pad-2 pads value", 2, [node("Pad", ["x"], pads=[1, 1, 0, 2], value=-2.0)], {"x": (2, 3)}),
        Case("Pad-2 reflect", 2, [node("Pad", ["x"], pads=[0, 2, 0, 1], mode="reflect")], {"x": (2, 4)}),
        Case("Pad-2 edge", 2, [node("Pad", ["x"], pads=[1, 1, 2, 0], mode="edge")], {"x": (2, 4)}),
    ]


def misc_cases() -> list[Case]:
    out = [
        Case("Upsample-7 nearest", 7, [node("Upsample", ["x"], scales=[1.0, 1.0, 2.0, 3.0])], {"x": (1, 2, 3, 3)}),
        Case("Upsample-7 linear", 7, [node("Upsample", ["x"], scales=[1.0, 1.0, 2.0, 2.0], mode="linear")],
             {"x": (1, 2, 3, 3)}),
        Case("Upsample-1 nearest", 1, [node("Upsample", ["x"], height_scale=2.0, width_scale=3.0)], {"x": (1, 2, 3, 3)},
             ref=lambda v: v["x"].repeat(2, axis=2).repeat(3, axis=3)),
        Case("Upsample-1 bilinear", 1, [node("Upsample", ["x"], height_scale=2.0, width_scale=2.0, mode="bilinear")],
             {"x": (1, 2, 3, 4)}, ref=lambda v: linear_1d(linear_1d(v["x"], 2, 2), 3, 2)),
        Case("Clip-6 min max", 6, [node("Clip", ["x"], min=-0.5, max=0.25)], {"x": (3, 4)}),
        Case("Clip-1 min max", 1, [node("Clip", ["x"], min=-0.5, max=0.25, consumed_inputs=[0])], {"x": (3, 4)},
             ref=lambda v: np.clip(v["x"], -0.5, 0.25)),
        Case("Clip-6 max only", 6, [node("Clip", ["x"], max=0.1)], {"x": (3, 4)}),
        Case("Cast-1 to string", 1, [node("Cast", ["x"], to="DOUBLE"), ], {"x": (3,)}, ref=lambda v: v["x"]),
    ]
    fns = {"Sum": lambda v: v["a"] + v["b"] + v["c"], "Max": lambda v: np.maximum(np.maximum(v["a"], v["b"]), v["c"]),
           "Min": lambda v: np.minimum(np.minimum(v["a"], v["b"]), v["c"])}
    for op, fn in fns.items():
        shapes = {"a": (2, 3), "b": (2, 3), "c": (2, 3)}
        out.append(Case(f"{op}-6", 6, [node(op, ["a", "b", "c"])], shapes, ref=fn))
        out.append(Case(f"{op}-1 consumed_inputs", 1, [node(op, ["a", "b", "c"], consumed_inputs=[0, 0, 0])], shapes, ref=fn))
    return out


CASES = (binary_cases() + activation_cases() + bn_cases() + pool_cases() + gemm_cases() + layout_cases()
         + pad_cases() + misc_cases() + [cnn_block()])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_old_opset_matches_reference(case: Case) -> None:
    feeds, inits = draw(case)
    model = model_of(case, inits)
    want = ort_or_ref(case, model, feeds, inits)
    got = api.run(api.parse_onnx(model), feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


FUSED = ["cnn block conv+bn+relu+maxpool+gemm", "Add-6 broadcast axis=1", "BatchNormalization-6 spatial=0",
         "Pad-1 paddings value", "Upsample-1 bilinear"]


@pytest.mark.parametrize("name", FUSED)
def test_old_opset_fused(name: str) -> None:
    case = next(c for c in CASES if c.id == name)
    feeds, inits = draw(case)
    model = model_of(case, inits)
    want = ort_or_ref(case, model, feeds, inits)
    got = api.run(api.fuse(api.parse_onnx(model)), feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op, attrs, message", [
    ("BatchNormalization", {}, "is_test=0"),
    ("Dropout", {"ratio": 0.5}, "is_test=0"),
])
def test_training_mode_is_refused(op: str, attrs: dict, message: str) -> None:
    ins = ["x", "s", "b", "m", "v"] if op == "BatchNormalization" else ["x"]
    inits = bn_params((3,))(np.random.default_rng(0)) if op == "BatchNormalization" else {}
    case = Case(op, 6, [node(op, ins, **attrs)], {"x": (2, 3, 4)})
    with pytest.raises(ParseError, match=message) as info:
        api.parse_onnx(model_of(case, inits))
    assert op in str(info.value)


def test_legacy_broadcast_mismatch_names_node() -> None:
    case = Case("bad", 6, [node("Add", ["a", "b"], broadcast=1, axis=1)], {"a": (2, 3, 4), "b": (4,)})
    with pytest.raises(ParseError, match=r"Add.*does not match A \[2, 3, 4\] from axis 1"):
        api.parse_onnx(model_of(case, {}))


def test_opset_0_is_refused() -> None:
    case = Case("zero", 0, [node("Relu", ["x"])], {"x": (2,)})
    with pytest.raises(ParseError, match="opset 0"):
        api.parse_onnx(model_of(case, {}))
