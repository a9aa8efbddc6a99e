"""Integer inputs read as gather indices are checked on the host before a GPU run
(targets/gpu/index_bounds.py): a kernel would read a row past its table without a word."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusegraph import api, parse_onnx
from fusegraph.errors import InputError
from fusegraph.passes.pipeline import fuse
from fusegraph.targets.gpu.index_bounds import gather_index_bounds
from tests.helpers import embedding_model, rand


def test_bert_token_ids_and_types_are_bounded_by_their_tables():
    program = parse_onnx("bert_base")
    fuse(program)
    bounds = gather_index_bounds(program.main)
    assert {k: b.length for k, b in bounds.items()} == {"input_ids": 30522, "token_type_ids": 2}


def test_indices_found_through_a_cast_and_a_reshape_but_not_when_computed():
    nodes = [helper.make_node("Cast", ["i"], ["c"], to=TensorProto.INT64), helper.make_node("Reshape", ["c", "s"], ["r"]),
             helper.make_node("Gather", ["t", "r"], ["g"]),
             helper.make_node("ArgMax", ["x"], ["a"], axis=2, keepdims=0), helper.make_node("Gather", ["t", "a"], ["h"]),
             helper.make_node("Add", ["g", "h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("i", TensorProto.INT32, [6]),
                                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rand(7, 4, seed=1), "t"),
                               numpy_helper.from_array(np.array([2, 3], np.int64), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    for program in (parse_onnx(model), _fused(parse_onnx(model))):
        assert {k: b.length for k, b in gather_index_bounds(program.main).items()} == {"i": 7}


def _fused(program):
    fuse(program)
    return program


def test_a_run_refuses_an_index_past_the_table_and_takes_negative_ones():
    program = parse_onnx(embedding_model())
    compiled = api.compile(program, "gpu", tune=False)
    rng = np.random.default_rng()
    ids, types = rng.integers(-50, 50, (2, 8)), rng.integers(-4, 4, (2, 8))
    got = compiled.run({"ids": ids, "tt": types})["y"]
    want = api.run(program, {"ids": ids, "tt": types})["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    ids[1, 5] = 50
    with pytest.raises(InputError, match=r"input 'ids' holds 50, outside \[-50, 50\): node Gather_0"):
        compiled.run({"ids": ids, "tt": types})
    types[0, 0] = -5
    ids[1, 5] = 0
    with pytest.raises(InputError, match=r"input 'tt' holds -5, outside \[-4, 4\)"):
        compiled.run({"ids": ids, "tt": types})
