"""Integer inputs drawn within the ranges a model declares (token ids inside the vocabulary,
masks in {0, 1}), on the command line as in the API."""

from __future__ import annotations

import json

import numpy as np
from onnx import TensorProto, helper

from fusegraph import parse_onnx
from fusegraph.driver.cli import main
from fusegraph.driver.inputs import input_ranges, random_inputs


def _embedding_model(ranges: dict | None):
    """Gather rows of a 7-row table by `ids`, times a 0/1 `mask`: ids >= 7 are out of range."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [7, 3], np.arange(21, dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"]),
         helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
         helper.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
         helper.make_node("Mul", ["rows", "m3"], ["y"])],
        "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 50]),
                helper.make_tensor_value_info("mask", TensorProto.INT64, [2, 50])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 50, 3])],
        [table, helper.make_tensor("axes", TensorProto.INT64, [1], [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if ranges is not None:
        model.metadata_props.add(key="fusegraph.input_ranges", value=json.dumps(ranges))
    return model


def test_declared_ranges_bound_the_random_integers():
    program = parse_onnx(_embedding_model({"ids": [0, 7], "mask": [0, 2]}))
    ranges = input_ranges(program)
    assert ranges == {"ids": (0, 7), "mask": (0, 2)}
    x = random_inputs(program.input_shapes, 3, ranges)
    assert x["ids"].min() >= 0 and x["ids"].max() == 6 and set(np.unique(x["mask"])) == {0, 1}


def test_without_ranges_integers_stay_in_0_to_10():
    program = parse_onnx(_embedding_model(None))
    assert input_ranges(program) == {}
    x = random_inputs(program.input_shapes, 3)
    assert x["ids"].max() == 9 and x["mask"].max() == 9


def test_run_draws_ids_inside_the_table(tmp_path, capsys):
    path = tmp_path / "emb.onnx"
    path.write_bytes(_embedding_model({"ids": [0, 7], "mask": [0, 2]}).SerializeToString())
    assert main(["run", str(path)]) == 0  # an id >= 7 would be an out-of-range Gather
    out = capsys.readouterr().out
    assert "non-finite" not in out and "y: float32 [2, 50, 3]" in out
