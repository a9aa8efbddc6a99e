"""The ONNX backend API over the reference target, and semantics the node tests do not pin down."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fusegraph.errors import UnsupportedOpError
from fusegraph.driver.onnx_backend import FusegraphBackend, FusegraphRep


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list]], outputs: list[str],
           opset: int = 18, initializers: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              initializer=initializers or [])
    for o in graph.output:  # an output of unknown shape (onnx's checker wants the field present)
        o.type.tensor_type.shape.Clear()
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _prepare(model: onnx.ModelProto) -> FusegraphRep:
    return FusegraphBackend.prepare(model, "CPU")


def test_devices() -> None:
    assert FusegraphBackend.supports_device("CPU")
    assert not FusegraphBackend.supports_device("CUDA")
    assert not FusegraphBackend.supports_device("TPU")


def test_run_node_and_named_outputs() -> None:
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a, b = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    out = FusegraphBackend.run_node(node, [a, b])
    np.testing.assert_array_equal(out["c"], a + b)
    np.testing.assert_array_equal(out[0], a + b)


def test_run_model_with_dict_inputs() -> None:
    model = _model([helper.make_node("Mul", ["x", "y"], ["z"])],
                   [("x", TensorProto.FLOAT, [2]), ("y", TensorProto.FLOAT, [2])], ["z"])
    rep = _prepare(model)
    x, y = np.array([1, 2], np.float32), np.array([3, 4], np.float32)
    np.testing.assert_array_equal(rep.run({"y": y, "x": x})[0], x * y)


def test_symbolic_dims_specialize_per_input_shape() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, ["n", 3])], ["y"])
    rep = _prepare(model)
    for n in (1, 4):
        x = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, 0))


def test_shape_inputs_specialize_per_value() -> None:
    """A Reshape target fed as a graph input: the rep fixes it to each value it is run with."""
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                   [("x", TensorProto.FLOAT, [2, 3]), ("shape", TensorProto.INT64, [2])], ["y"])
    rep = _prepare(model)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for shape in ([3, 2], [1, 6]):
        np.testing.assert_array_equal(rep.run([x, np.array(shape)])[0], x.reshape(shape))
    assert rep.fixed == {"shape"}


def test_unsupported_op_is_reported_at_prepare() -> None:
    model = _model([helper.make_node("Unique", ["x"], ["y"])], [("x", TensorProto.FLOAT, [3])], ["y"])
    with pytest.raises(UnsupportedOpError, match="Unique"):
        _prepare(model)


def test_pow_integer_base_float_exponent_is_computed_in_float() -> None:
    model = _model([helper.make_node("Pow", ["x", "y"], ["z"])],
                   [("x", TensorProto.INT32, [3]), ("y", TensorProto.FLOAT, [3])], ["z"], opset=15)
    z = _prepare(model).run([np.array([2, 3, 9], np.int32), np.array([0.5, 1.5, 0.5], np.float32)])[0]
    np.testing.assert_array_equal(z, np.array([1, 5, 3], np.int32))  # trunc(2**0.5), trunc(3**1.5), 9**0.5


def test_reduce_log_sum_exp_does_not_overflow() -> None:
    model = _model([helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=0)],
                   [("x", TensorProto.FLOAT, [2, 3])], ["y"],
                   initializers=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    x = np.array([[1.0, 2.0, 300.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    y = _prepare(model).run([x])[0]
    np.testing.assert_allclose(y, [300.0, -np.inf])


@pytest.mark.parametrize("op, expected", [("ReduceSumSquare", np.square), ("ReduceL1", np.abs), ("ReduceMax", lambda x: x)])
def test_reduce_noop_with_empty_axes_keeps_the_elementwise_part(op: str, expected) -> None:  # noqa: ANN001
    """onnx/onnx#7394: with empty axes and noop_with_empty_axes=1 only the reduction is skipped."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [0], [])
    model = _model([helper.make_node(op, ["x", "axes"], ["y"], noop_with_empty_axes=1)],
                   [("x", TensorProto.FLOAT, [2, 3])], ["y"], initializers=[axes])
    x = -np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(_prepare(model).run([x])[0], expected(x))


def test_reduce_max_of_an_empty_axis_is_the_identity() -> None:
    model = _model([helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=1)],
                   [("x", TensorProto.FLOAT, [2, 0, 4])], ["y"],
                   initializers=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    rep = _prepare(model)  # a declared 0 reads as unknown; the run with real shapes re-specializes
    y = rep.run([np.zeros((2, 0, 4), np.float32)])[0]
    assert y.shape == (2, 1, 4) and np.all(y == -np.inf)
