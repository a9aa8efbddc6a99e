"""The fused program a .fgx file holds for a gpu program: a load compiles it as it is (no
half precision, no fusion), regenerates the very kernels of the saved program, and refuses a
stored fused program that is malformed or addresses memory outside its buffers.

Outputs are compared bit for bit (tolerance 0) with the freshly compiled program on fresh
random inputs, on the gpu target under Triton's interpreter.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import fusegraph
from fusegraph.errors import SavedProgramError
from fusegraph.ir.index_expr import FloorDiv, Mod, Prod, Sum, Var
from fusegraph.passes import pipeline
from fusegraph.saved_program import container, expr_json
from fusegraph.saved_program.program_json import program_from_json, program_to_json
from tests.helpers import conv_silu_add_model, fresh_inputs, make_model
from fusegraph.passes.defer_norm import DEFER_NORMS_ENV
from tests.passes.test_defer_norm import post_norm_block


def concat_roll_model():
    """A concat written in place (an `allocate` in the main module), a roll as two slices
    concatenated (loads under domains), a transpose after it and a value read twice."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"]),
             helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("Concat", ["a", "s"], ["c"], axis=1),
             helper.make_node("Slice", ["c", "s0", "e0", "ax"], ["hi"]),
             helper.make_node("Slice", ["c", "s1", "e1", "ax"], ["lo"]),
             helper.make_node("Concat", ["hi", "lo"], ["r"], axis=2),
             helper.make_node("Mul", ["r", "a2"], ["m"]),
             helper.make_node("Transpose", ["m"], ["out"], perm=[0, 2, 3, 1]),
             helper.make_node("Relu", ["c"], ["out2"])]
    inits = {"w": w, "s0": np.array([3], np.int64), "e0": np.array([6], np.int64), "s1": np.array([0], np.int64),
             "e1": np.array([3], np.int64), "ax": np.array([2], np.int64),
             "a2": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    return make_model(nodes, {"x": [1, 4, 6, 6]}, ["out", "out2"], inits, opset=13)


def _no_fusion(*args, **kwargs):
    raise AssertionError("the load fused the program: it should have compiled the stored fused program")


@pytest.mark.parametrize("make, fp16", [(concat_roll_model, False), (lambda: conv_silu_add_model(21), True),
                                        (post_norm_block, True)])  # (a deferred norm's statistics in an epilogue)
def test_a_gpu_program_loads_its_fused_program_without_fusing(make, fp16, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(DEFER_NORMS_ENV, "1")  # (off by default)
    program = fusegraph.parse_onnx(make())
    compiled = fusegraph.compile(program, "gpu", fp16=fp16, tune=False)
    fusegraph.save(compiled, tmp_path / "g.fgx")
    doc, _ = container.read(tmp_path / "g.fgx")
    assert "fused" in doc and any(i["op"] == "fused" for i in doc["fused"]["instructions"])
    monkeypatch.setattr(pipeline, "fuse", _no_fusion)
    loaded = fusegraph.load(tmp_path / "g.fgx")
    assert str(loaded.program) == str(compiled.program)
    assert str(loaded.source_program) == str(program)
    assert [k.src.digest for k in loaded.kernels] == [k.src.digest for k in compiled.kernels]
    inputs = fresh_inputs(compiled)
    want, got = compiled.run(inputs), loaded.run(inputs)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_file_without_a_fused_program_is_fused_on_load(tmp_path: Path) -> None:
    """A fused program the file cannot spell is left out at save; the load then fuses."""
    program = fusegraph.parse_onnx(concat_roll_model())
    compiled = fusegraph.compile(program, "gpu", tune=False)
    fusegraph.save(compiled, tmp_path / "g.fgx")
    doc, tensors = container.read(tmp_path / "g.fgx")
    del doc["fused"]
    container.write(tmp_path / "unfused.fgx", doc, tensors)
    loaded = fusegraph.load(tmp_path / "unfused.fgx")
    inputs = fresh_inputs(program)
    np.testing.assert_array_equal(loaded.run(inputs)["out"], compiled.run(inputs)["out"])


@pytest.mark.parametrize("name", ["yolov5s-160", "swin_tiny_patch4_window7_224", "efficientnet_b1"])
def test_zoo_fused_programs_come_back_as_they_were(name: str) -> None:
    """Concats in place and selects (YOLOv5s), shifted windows whose loads and stores hold
    only under domains over sums of variables (Swin), depthwise and squeeze-excite groups."""
    program = fusegraph.parse_onnx(name)
    fused = fusegraph.compile(program, "gpu", tune=False).program
    doc, tensors = program_to_json(fused, name, fused=True)
    assert str(program_from_json(doc, tensors, name, fused=True)) == str(fused)


def test_expressions_round_trip_through_their_raw_nodes() -> None:
    i, j = Var("i", 85 * 3), Var("j", 7)
    for e in [(i // 85) * 6400 + i % 85 + 3, Prod([i, j]) + 2 * j - 1, FloorDiv(Sum(1, [(i, 2)]), 4), Mod(j, 3)]:
        back = expr_json.expr_from_json(expr_json.expr_to_json(e))
        assert back == e and str(back) == str(e)
    for bad in [["x", 1], ["v", "1bad", 3], ["v", "i", 0], ["d", ["v", "i", 3], 0], ["p", [["c", 1]]], ["c", True], "i"]:
        with pytest.raises((ValueError, TypeError)):
            expr_json.expr_from_json(bad)


def _tampered(tmp_path: Path, name: str, change) -> Path:
    """A valid file whose fused program `change` edited (checksums written anew)."""
    if not (tmp_path / "ok.fgx").exists():
        compiled = fusegraph.compile(fusegraph.parse_onnx(concat_roll_model()), "gpu", tune=False)
        fusegraph.save(compiled, tmp_path / "ok.fgx")
    doc, tensors = container.read(tmp_path / "ok.fgx")
    doc = copy.deepcopy(doc)
    change(doc["fused"])
    container.write(tmp_path / name, doc, tensors)
    return tmp_path / name


def _groups(fused: dict) -> list[dict]:
    return [i["module"] for i in fused["instructions"] if i["op"] == "fused"]


def _first(module: dict, op: str) -> dict:
    return next(i for i in module["instructions"] if i["op"] == op)


def _deep(depth: int) -> list:
    e: list = ["v", "i0", 1]
    for _ in range(depth):
        e = ["s", 0, [[e, 1]]]
    return e


def test_tampered_fused_programs_are_refused(tmp_path: Path) -> None:
    def out_of_bounds(f):  # a load reading far past its buffer
        _first(_groups(f)[0], "load")["attrs"]["map"]["index_map"]["exprs"][-1] = ["c", 10**6]

    def negative(f):  # a store writing before its buffer
        store = _first(_groups(f)[0], "store")["attrs"]["map"]["index_map"]
        store["exprs"][-1] = ["s", -1, [[store["exprs"][-1], 1]]]

    def nested_group(f):
        _first(_groups(f)[0], "load")["op"] = "fused"

    def load_in_main(f):
        _first(f, "fused")["op"] = "load"

    def further_output(f):  # a further output of a parameter, not of a group
        param = _first(f, "@param")
        f["instructions"].append({"op": "fused_output", "origin": "", "shape": param["shape"], "inputs": [0],
                                  "attrs": {"index": 1}})

    def unknown_tag(f):
        _first(_groups(f)[0], "load")["attrs"]["map"]["index_map"]["exprs"][0] = ["q", 1]

    def deep(f):
        m = _first(_groups(f)[0], "load")["attrs"]["map"]["index_map"]
        m["exprs"][0] = _deep(200)

    cases = [(out_of_bounds, "outside the buffer; refused"), (negative, "reaches -1.*outside the buffer"),
             (nested_group, "unknown op 'fused' .*in a fused group"), (load_in_main, "unknown op 'load'"),
             (further_output, "malformed: ValueError: a fused_output reads one fused group"),
             (unknown_tag, "malformed: ValueError: .*no index expression"),
             (deep, "malformed: ValueError: .*nested too deeply")]
    for k, (change, message) in enumerate(cases):
        path = _tampered(tmp_path, f"t{k}.fgx", change)
        with pytest.raises(SavedProgramError, match=message) as e:
            fusegraph.load(path)
        assert "fused program" in str(e.value) and str(path) in str(e.value)
    good = (tmp_path / "ok.fgx").read_bytes()
    at = good.index(b"index_map")
    (tmp_path / "flipped.fgx").write_bytes(good[:at] + b"indeX" + good[at + 5:])
    with pytest.raises(SavedProgramError, match="checksum does not match"):
        fusegraph.load(tmp_path / "flipped.fgx")
