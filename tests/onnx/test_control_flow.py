"""Loop and Scan unrolled at import, their bodies read once per iteration (and If inside them).

Each model runs on fresh random float32 inputs against ONNX Runtime on the ref target, unfused
and fused, and on the gpu target under Triton's interpreter (relative 1e-5, absolute 1e-6: the
same float32 ops in the same order, up to the libraries' tanh). A loop whose trip count or
condition is known only at run time is refused with a ParseError naming the node or the input.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from fusegraph import parse_onnx
from fusegraph.errors import DynamicValueError, ParseError, UnsupportedOpError
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

F = TensorProto.FLOAT


def _vi(name: str, dtype: int = F, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def _scan9():
    """Two states, two scan inputs (axes 0 and 1, the second read backwards), two scan outputs
    (the first stacked backwards, the second along axis 1)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "a"], ["s_out"]),
         helper.make_node("Tanh", ["b"], ["tb"]),
         helper.make_node("Mul", ["p_in", "tb"], ["p_out"]),
         helper.make_node("Mul", ["a", "scale"], ["a2"])],
        "scan_body", [_vi("s_in"), _vi("p_in"), _vi("a"), _vi("b")],
        [_vi("s_out"), _vi("p_out"), _vi("s_out_copy"), _vi("a2")])
    body.node.append(helper.make_node("Identity", ["s_out"], ["s_out_copy"]))
    rng = np.random.default_rng()
    inputs = {"s0": rng.standard_normal(3).astype(np.float32), "p0": rng.standard_normal(3).astype(np.float32),
              "xa": rng.standard_normal((4, 3)).astype(np.float32), "xb": rng.standard_normal((3, 4)).astype(np.float32)}
    node = helper.make_node("Scan", ["s0", "p0", "xa", "xb"], ["s", "p", "ys", "ya"], body=body, num_scan_inputs=2,
                            scan_input_axes=[0, 1], scan_input_directions=[0, 1],
                            scan_output_axes=[0, 1], scan_output_directions=[1, 0])
    return model_of([node], inputs, ["s", "p", "ys", "ya"], {"scale": rng.standard_normal(3).astype(np.float32)}), inputs


def _scan8():
    """Opset 8's Scan: a batch axis first, the scan input read backwards."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x"], ["s_out"]), helper.make_node("Sigmoid", ["s_out"], ["y"])],
        "scan_body", [_vi("s_in"), _vi("x")], [_vi("s_out"), _vi("y")])
    rng = np.random.default_rng()
    inputs = {"s0": rng.standard_normal((2, 3)).astype(np.float32), "x": rng.standard_normal((2, 4, 3)).astype(np.float32)}
    node = helper.make_node("Scan", ["", "s0", "x"], ["s", "y"], body=body, num_scan_inputs=1, directions=[1])
    return model_of([node], inputs, ["s", "y"], opset=8), inputs


def _loop(trip: int | None, stop_at: int | None):
    """y <- y * w + iteration; a scan output of each y; the body's condition is `i + 1 < stop_at`
    (or passes through), and an If on the first iteration adds w once more."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Mul", ["y_in", "w"], ["yw"]),
             helper.make_node("Add", ["yw", "fi"], ["y_next"]),
             helper.make_node("Equal", ["i", "zero"], ["first"]),
             helper.make_node("If", ["first"], ["y_out"],
                              then_branch=helper.make_graph([helper.make_node("Add", ["y_next", "w"], ["t"])], "then", [], [_vi("t")]),
                              else_branch=helper.make_graph([helper.make_node("Identity", ["y_next"], ["e"])], "else", [], [_vi("e")])),
             helper.make_node("Tanh", ["y_out"], ["scan"])]
    if stop_at is None:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        nodes += [helper.make_node("Add", ["i", "one"], ["i1"]), helper.make_node("Less", ["i1", "stop"], ["c_out"])]
    body = helper.make_graph(nodes, "loop_body", [_vi("i", TensorProto.INT64, []), _vi("c_in", TensorProto.BOOL, []), _vi("y_in")],
                             [_vi("c_out", TensorProto.BOOL, []), _vi("y_out"), _vi("scan")])
    rng = np.random.default_rng()
    inputs = {"y": rng.standard_normal((2, 3)).astype(np.float32)}
    inits = {"w": rng.uniform(0.5, 1.0, (2, 3)).astype(np.float32), "zero": np.array(0, np.int64),
             "one": np.array(1, np.int64), "stop": np.array(stop_at or 0, np.int64), "cond": np.array(True)}
    if trip is not None:
        inits["M"] = np.array(trip, np.int64)
    node = helper.make_node("Loop", ["M" if trip is not None else "", "cond", "y"], ["y_final", "ys"], body=body)
    return model_of([node], inputs, ["y_final", "ys"], inits), inputs


MODELS = {"scan9": _scan9, "loop_trip_count": lambda: _loop(3, None),
          "loop_condition": lambda: _loop(None, 4), "loop_both": lambda: _loop(6, 2)}


@pytest.mark.parametrize("name", MODELS)
def test_control_flow_ref(name):
    check_ref(*MODELS[name]())


@needs_gpu_target
@pytest.mark.parametrize("name", MODELS)
def test_control_flow_gpu(name):
    check_gpu(*MODELS[name]())


def test_loop_unrolls_the_iterations_it_runs():
    model, inputs = _loop(10, 4)
    want = check_ref(model, inputs)
    assert want[1].shape == (4, 2, 3)


def test_trip_count_read_at_run_time_names_the_input():
    model, _ = _loop(3, None)
    m = model.graph.initializer
    trip = next(t for t in m if t.name == "M")
    m.remove(trip)
    model.graph.input.append(_vi("M", TensorProto.INT64, []))
    with pytest.raises(DynamicValueError, match="trip count") as e:
        parse_onnx(model)
    assert e.value.inputs == ("M",)


def test_condition_computed_at_run_time_is_refused():
    model, _ = _loop(3, None)
    body = model.graph.node[0].attribute[0].g
    cond = next(n for n in body.node if n.output[0] == "c_out")
    body.node.remove(cond)
    body.node.extend([helper.make_node("ReduceSum", ["y_out"], ["total"], keepdims=0),
                      helper.make_node("Less", ["total", "limit"], ["c_out"])])
    model.graph.initializer.append(helper.make_tensor("limit", F, [], [5.0]))
    model.graph.node[0].name = "the_loop"
    with pytest.raises(ParseError, match="the_loop.*condition after iteration 0 must be a constant"):
        parse_onnx(model)


def test_scan_before_opset_9_is_refused_by_name():
    """Opset 8's Scan (a batch axis and per-batch sequence lengths) is declined, naming the node."""
    model, _ = _scan8()
    with pytest.raises(ParseError, match="Scan.*before opset 9"):
        parse_onnx(model)


def test_unsupported_op_in_a_body_is_reported():
    model, _ = _scan9()
    model.graph.node[0].attribute[0].g.node[1].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):
        parse_onnx(model)
