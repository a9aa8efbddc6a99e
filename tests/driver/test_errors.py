"""Each kind of bad input yields one clear error naming the culprit, in the API and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.driver.cli import main
from fusegraph.errors import InputError, ModelLoadError, ParseError, ShapeError, UnsupportedOpError
from tests.helpers import make_model, rand


def _relu_model():
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="r")], {"x": [2, 3]}, ["y"])


def test_truncated_file(tmp_path):
    data = _relu_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="cut.onnx.*not a valid ONNX model"):
        parse_onnx(str(path))


def test_not_onnx(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\n" * 20)
    with pytest.raises(ModelLoadError, match="notes.onnx"):
        parse_onnx(str(path))


def test_missing_file_names_zoo():
    with pytest.raises(ModelLoadError, match="no such file.*zoo models: .*yolov5s"):
        parse_onnx("no/such/model.onnx")


def test_all_unsupported_ops_listed_at_once():
    model = make_model([
        helper.make_node("Unique", ["x"], ["v"], name="unique_1"),
        helper.make_node("NonMaxSuppression", ["v"], ["n"], name="nms_1"),
        helper.make_node("Relu", ["x"], ["r"], name="ok"),
        helper.make_node("Unique", ["x"], ["v2"], name="unique_2"),
        helper.make_node("MyOp", ["x"], ["m"], name="custom_1", domain="com.example"),
    ], {"x": [4]}, ["r"], {"k": np.array([2], np.int64)})
    with pytest.raises(UnsupportedOpError) as info:
        parse_onnx(model)
    text = str(info.value)
    for expected in ("Unique: unique_1, unique_2", "NonMaxSuppression: nms_1", "com.example.MyOp: custom_1", "4 node(s)"):
        assert expected in text
    assert "Relu" not in text


def test_invalid_attribute_names_node():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv_7", auto_pad="BOGUS")],
                       {"x": [1, 2, 5, 5]}, ["y"], {"w": rand(3, 2, 3, 3)})
    with pytest.raises(ParseError, match="node 'conv_7' \\(Conv\\): attribute auto_pad='BOGUS' is not supported"):
        parse_onnx(model)


def test_out_of_range_axis_names_node():
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=5)], {"x": [2, 3]}, ["y"])
    with pytest.raises(ParseError, match="node 'sm' \\(Softmax\\): axis 5 out of range for rank 2"):
        parse_onnx(model)


def test_shape_mismatch_names_node():
    model = make_model([helper.make_node("Add", ["x", "b"], ["y"], name="add_3")], {"x": [2, 3]}, ["y"],
                       {"b": rand(4)})
    with pytest.raises(ParseError, match="node 'add_3' \\(Add\\): operands cannot be broadcast together: \\[2, 3\\], \\[4\\]"):
        parse_onnx(model)


def test_conv_channel_mismatch_is_shape_error():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c1")], {"x": [1, 2, 5, 5]}, ["y"],
                       {"w": rand(3, 4, 3, 3)})
    with pytest.raises(ShapeError, match="node 'c1'.*input channels 2 != weight channels 4"):
        parse_onnx(model)


def test_runtime_input_errors():
    program = parse_onnx(_relu_model())
    with pytest.raises(InputError, match="unknown input\\(s\\) 'z'.*missing input\\(s\\) 'x'.*expects: x \\[2, 3\\] float32"):
        api.run(program, {"z": rand(2, 3)})
    with pytest.raises(InputError, match="input 'x' has shape \\[3, 2\\], expected \\[2, 3\\]"):
        api.run(program, {"x": rand(3, 2)})
    with pytest.raises(InputError, match="input 'x' has dtype float64, expected float32"):
        api.run(program, {"x": np.zeros((2, 3))})


def test_unknown_input_dim_name():
    with pytest.raises(ParseError, match="--input-dim names unknown input\\(s\\) 'images'.*inputs are: x"):
        parse_onnx(_relu_model(), input_dims={"images": [1, 3]})


@pytest.mark.parametrize("content,needle", [
    (b"", "empty file"),
    (b"\x08\x07garbage\xff\xff\xff", "not a valid ONNX model"),
])
def test_cli_prints_one_line_and_exits_2(tmp_path, capsys, content, needle):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    assert main(["read", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fusegraph: error: ") and needle in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_cli_unsupported_op_exit_2(tmp_path, capsys):
    model = make_model([helper.make_node("Unique", ["x"], ["v"], name="unique_1")], {"x": [4]}, ["v"])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["run", str(path)]) == 2
    assert "Unique: unique_1" in capsys.readouterr().err


def test_cli_bad_input_file(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    path.write_bytes(_relu_model().SerializeToString())
    np.save(tmp_path / "x.npy", rand(5))
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}"]) == 2
    assert "input 'x' has shape [5], expected [2, 3]" in capsys.readouterr().err


def test_cli_run_time_gather_index_out_of_range_names_the_node(tmp_path, capsys):
    """A token id past the embedding table is a run-time input error naming the node, not an
    IndexError traceback from NumPy."""
    from onnx import TensorProto, numpy_helper

    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], name="embed_tokens")], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rand(10, 4), "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    np.save(tmp_path / "ids.npy", np.array([1, 12, 3], np.int64))
    assert main(["run", str(path), "--input", f"ids={tmp_path / 'ids.npy'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fusegraph: error: node embed_tokens: gather index out of range [-10, 10)" in err
