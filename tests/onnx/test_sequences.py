"""Sequences and optionals read away at import, and loops unrolled (onnx/parsers/sequences.py,
parsers/loop.py, onnx/structure.py): small models of each op on fresh random inputs, through the ONNX backend
(which feeds a sequence input as its elements and puts sequence outputs back together), against
ONNX Runtime (onnx's reference evaluator holds an empty Optional as [None], so it says it has an
element), on the reference target unfused and fused and on the gpu target (Triton's interpreter
without a GPU). Structure known only at run time, or wrong, is a ParseError naming the node or
the input."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusegraph import parse_onnx
from fusegraph.driver.onnx_backend import FusedFusegraphBackend, FusegraphBackend, GpuFusegraphBackend
from fusegraph.errors import DynamicValueError, InputError, ParseError
from tests.ops.oracle import needs_gpu_target

F = TensorProto.FLOAT


def tensor(name: str, shape: list[Any], elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def sequence(name: str, shape: list[Any], elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_sequence_value_info(name, elem, shape)


def optional(name: str, inner: onnx.TypeProto) -> onnx.ValueInfoProto:
    return helper.make_value_info(name, helper.make_optional_type_proto(inner))


def model_of(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
             initializers: dict[str, np.ndarray] | None = None, opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def ort(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    import onnxruntime

    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_same(got: Any, want: Any, where: str) -> None:
    """Equal structure (a sequence's length, an optional's presence), dtypes, shapes and values
    within rtol=1e-5, atol=1e-6 (float32 adds in another order at most)."""
    if want is None or isinstance(want, list):
        assert type(got) is type(want) and (want is None or len(got) == len(want)), (where, got, want)
        for k, (g, w) in enumerate(zip(got or [], want or [])):
            assert_same(g, w, f"{where}[{k}]")
        return
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (where, got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=where)


def check(model: onnx.ModelProto, feeds: dict[str, Any], backends: tuple[type, ...]) -> None:
    want = ort(model, feeds)
    for backend in backends:
        got = backend.prepare(model).run(feeds)
        for name, g, w in zip([o.name for o in model.graph.output], got, want):
            assert_same(g, w, f"{backend.__name__} {name}")


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# the cases: (model, feeds) from a fresh generator ---------------------------------

def construct_erase_at_concat(rng):
    """SequenceConstruct, SequenceErase at a negative position, SequenceAt, SequenceLength and
    ConcatFromSequence on an axis and on a new axis."""
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("SequenceErase", ["s", "minus2"], ["t"]),
             helper.make_node("SequenceAt", ["t", "minus1"], ["last"]),
             helper.make_node("SequenceLength", ["t"], ["n"]),
             helper.make_node("ConcatFromSequence", ["t"], ["cat"], axis=1),
             helper.make_node("ConcatFromSequence", ["s"], ["stack"], axis=-1, new_axis=1)]
    inputs = {k: rand(rng, 2, 3) for k in "abc"}
    model = model_of(nodes, [tensor(k, [2, 3]) for k in "abc"],
                     [tensor("last", [2, 3]), tensor("n", [], TensorProto.INT64), tensor("cat", [2, 6]), tensor("stack", [2, 3, 3])],
                     {"minus2": np.array(-2, np.int64), "minus1": np.array(-1, np.int64)})
    return model, inputs


def insert_into_input(rng):
    """A sequence graph input, SequenceInsert at a position and at the end, a sequence output."""
    nodes = [helper.make_node("SequenceInsert", ["s", "x", "one"], ["t"]),
             helper.make_node("SequenceInsert", ["t", "x"], ["u"])]
    model = model_of(nodes, [sequence("s", [None, 4]), tensor("x", [3, 4])], [sequence("u", [None, 4])],
                     {"one": np.array(1, np.int64)})
    return model, {"s": [rand(rng, 2, 4), rand(rng, 5, 4)], "x": rand(rng, 3, 4)}


def split_to_sequence(rng):
    """SplitToSequence without sizes (keepdims 0), with one size (a shorter last part) and
    with sizes; the parts joined again by ConcatFromSequence."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["each"], axis=1, keepdims=0),
             helper.make_node("SplitToSequence", ["x", "two"], ["pairs"], axis=1),
             helper.make_node("SplitToSequence", ["x", "sizes"], ["rows"], axis=-3),
             helper.make_node("ConcatFromSequence", ["rows"], ["back"], axis=0)]
    model = model_of(nodes, [tensor("x", [4, 5, 2])], [sequence("each", [4, 2]), sequence("pairs", [4, None, 2]), sequence("rows", [None, 5, 2]),
                      tensor("back", [4, 5, 2])],
                     {"two": np.array(2, np.int64), "sizes": np.array([1, 3], np.int64)})
    return model, {"x": rand(rng, 4, 5, 2)}


def sequence_map(rng):
    """SequenceMap over a sequence of elements of different shapes with a tensor added to each,
    two outputs per element (a sum and a shape)."""
    body = helper.make_graph([helper.make_node("Add", ["e", "bias"], ["sum"]), helper.make_node("Shape", ["e"], ["shape"])],
                             "body", [tensor("e", [None, 4]), tensor("bias", [4])],
                             [tensor("sum", [None, 4]), tensor("shape", [2], TensorProto.INT64)])
    node = helper.make_node("SequenceMap", ["s", "bias"], ["sums", "shapes"], body=body)
    model = model_of([node], [sequence("s", [None, 4]), tensor("bias", [4])],
                     [sequence("sums", [None, 4]), sequence("shapes", [2], TensorProto.INT64)])
    return model, {"s": [rand(rng, 3, 4), rand(rng, 1, 4), rand(rng, 2, 4)], "bias": rand(rng, 4)}


def optionals(rng):
    """Optional of a tensor and an empty one, OptionalHasElement of both, OptionalGetElement,
    and an optional graph input holding a sequence, passed through Identity."""
    nodes = [helper.make_node("Optional", ["x"], ["some"]),
             helper.make_node("Optional", [], ["none"], type=helper.make_tensor_type_proto(F, [2])),
             helper.make_node("OptionalHasElement", ["some"], ["has"]),
             helper.make_node("OptionalHasElement", ["none"], ["has_not"]),
             helper.make_node("OptionalGetElement", ["some"], ["got"]),
             helper.make_node("Identity", ["maybe"], ["same"])]
    seq_type = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [3]))
    model = model_of(nodes, [tensor("x", [2, 3]), optional("maybe", seq_type)],
                     [tensor("has", [], TensorProto.BOOL), tensor("has_not", [], TensorProto.BOOL), tensor("got", [2, 3]),
                      optional("same", seq_type)])
    return model, {"x": rand(rng, 2, 3), "maybe": [rand(rng, 3), rand(rng, 3)]}


def unrolled_loop(rng):
    """A Loop of constant trip count carrying a tensor and a sequence, with a scan output."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("SequenceInsert", ["seq_in", "acc_out"], ["seq_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Add", ["acc_out", "fi"], ["scan"])],
        "body", [tensor("i", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("acc_in", [2]),
                 sequence("seq_in", [2])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("acc_out", [2]), sequence("seq_out", [2]), tensor("scan", [2])])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["trips", "yes", "acc", "empty"], ["acc_final", "seq_final", "scans"], body=body)]
    model = model_of(nodes, [tensor("acc", [2]), tensor("x", [2])], [tensor("acc_final", [2]), sequence("seq_final", [2]), tensor("scans", [3, 2])],
                     {"trips": np.array(3, np.int64), "yes": np.array(True)})
    return model, {"acc": rand(rng, 2), "x": rand(rng, 2)}


def unrolled_scan(rng):
    """A Scan carrying a running sum over rows read backwards from axis 1, its scan output
    stacked on axis 1."""
    body = helper.make_graph([helper.make_node("Add", ["sum_in", "row"], ["sum_out"]),
                              helper.make_node("Mul", ["sum_out", "row"], ["scan"])],
                             "body", [tensor("sum_in", [2]), tensor("row", [2])],
                             [tensor("sum_out", [2]), tensor("scan", [2])])
    node = helper.make_node("Scan", ["init", "x"], ["total", "scans"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1])
    model = model_of([node], [tensor("init", [2]), tensor("x", [2, 5])], [tensor("total", [2]), tensor("scans", [2, 5])])
    return model, {"init": rand(rng, 2), "x": rand(rng, 2, 5)}


CASES = [construct_erase_at_concat, insert_into_input, split_to_sequence, sequence_map, optionals, unrolled_loop,
         unrolled_scan]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_ref(case):
    model, feeds = case(np.random.default_rng())
    check(model, feeds, (FusegraphBackend, FusedFusegraphBackend))


@needs_gpu_target
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_gpu(case):
    model, feeds = case(np.random.default_rng())
    check(model, feeds, (GpuFusegraphBackend,))


def test_an_empty_optional_input():
    """An optional input fed None (bound None) holds nothing; one fed a tensor holds it."""
    nodes = [helper.make_node("OptionalHasElement", ["maybe"], ["has"])]
    model = model_of(nodes, [optional("maybe", helper.make_tensor_type_proto(F, [2]))], [tensor("has", [], TensorProto.BOOL)])
    rep = FusegraphBackend.prepare(model)
    assert rep.run({"maybe": None}).has.item() is False
    assert rep.run({"maybe": np.ones(2, np.float32)}).has.item() is True


def test_a_sequence_input_fed_a_tensor_names_the_input():
    model, feeds = insert_into_input(np.random.default_rng())
    with pytest.raises(InputError, match=r"input 's' is a sequence: feed a list of arrays, got ndarray"):
        FusegraphBackend.prepare(model).run({"s": feeds["x"], "x": feeds["x"]})


def test_graph_inputs_bind_by_element_names():
    """input_dims gives a sequence input's length and its elements' dims as inputs x[k]."""
    model, feeds = insert_into_input(np.random.default_rng())
    program = parse_onnx(model, input_dims={"s": [2], "s[0]": [2, 4], "s[1]": [5, 4]})
    assert sorted(program.input_shapes) == ["s[0]", "s[1]", "x"]
    assert program.meta["structured_outputs"] == {"u": 4}


# errors -----------------------------------------------------------------------------------

def test_a_sequence_input_of_unknown_length_names_the_input():
    model, _ = insert_into_input(np.random.default_rng())
    with pytest.raises(ParseError, match=r"input 's' is a sequence: its length must be known"):
        parse_onnx(model)


def test_a_position_known_at_run_time_names_the_node():
    node = helper.make_node("SequenceAt", ["s", "pos"], ["y"], name="pick")
    model = model_of([node], [sequence("s", [2]), tensor("pos", [], TensorProto.INT64)], [tensor("y", [2])])
    with pytest.raises(DynamicValueError, match=r"node 'pick' \(SequenceAt\): the position must be a constant") as e:
        parse_onnx(model, input_dims={"s": [3]})
    assert e.value.inputs == ("pos",)


def test_a_position_out_of_range_names_the_node():
    node = helper.make_node("SequenceAt", ["s", "pos"], ["y"], name="pick")
    model = model_of([node], [sequence("s", [2])], [tensor("y", [2])], {"pos": np.array(-4, np.int64)})
    with pytest.raises(ParseError, match=r"node 'pick' \(SequenceAt\): position -4 is out of range for a sequence of length 3"):
        parse_onnx(model, input_dims={"s": [3]})


def test_a_sequence_given_to_a_tensor_op_names_the_node():
    node = helper.make_node("Relu", ["s"], ["y"], name="act")
    model = model_of([node], [sequence("s", [2])], [tensor("y", [2])])
    with pytest.raises(ParseError, match=r"node 'act' \(Relu\): input 's' is a sequence; Relu takes tensors"):
        parse_onnx(model, input_dims={"s": [1]})


def test_sequences_of_different_lengths_name_the_map():
    model, _ = sequence_map(np.random.default_rng())
    model.graph.node[0].name = "map"
    model.graph.node[0].input[1] = "s2"
    model.graph.input[1].CopyFrom(sequence("s2", [4]))
    with pytest.raises(ParseError, match=r"node 'map' \(SequenceMap\): the input sequences have different lengths \[2, 3\]"):
        parse_onnx(model, input_dims={"s": [3], "s2": [2]})


def test_a_loop_of_run_time_length_names_the_node():
    model, _ = unrolled_loop(np.random.default_rng())
    model.graph.node[1].name = "repeat"
    del model.graph.initializer[0]
    model.graph.input.append(tensor("trips", [], TensorProto.INT64))
    with pytest.raises(DynamicValueError, match=r"node 'repeat' \(Loop\): the trip count must be a constant"):
        parse_onnx(model)


def test_getting_from_an_empty_optional_names_the_node():
    nodes = [helper.make_node("Optional", [], ["none"], type=helper.make_tensor_type_proto(F, [2])),
             helper.make_node("OptionalGetElement", ["none"], ["y"], name="get")]
    with pytest.raises(ParseError, match=r"node 'get' \(OptionalGetElement\): the optional is empty"):
        parse_onnx(model_of(nodes, [], [tensor("y", [2])]))


def test_a_scan_of_opset_8_names_the_node():
    model, _ = unrolled_scan(np.random.default_rng())
    model.graph.node[0].name = "scan"
    model.opset_import[0].version = 8
    with pytest.raises(ParseError, match=r"node 'scan' \(Scan\): Scan before opset 9"):
        parse_onnx(model)
