"""fusegraph.save / fusegraph.load: a program, or a compiled one, through a .fgx file and back.

A loaded program must compute exactly what the saved one did: outputs are compared bit for bit
(tolerance 0) on fresh random inputs, on the ref target and on the gpu target under Triton's
interpreter (the same kernels with the same configs). Every damaged or foreign file is a
SavedProgramError that names the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import fusegraph
from fusegraph.errors import ArgumentError, SavedProgramError
from fusegraph.saved_program import container
from tests.helpers import conv_silu_add_model, fresh_inputs, make_model


def cast_model():
    """Element-type attributes, an integer literal and a reduction: x -> Cast(fp16) -> Cast(fp32)
    -> Clip(0, 6) -> ReduceMax over axis 1, plus ArgMax (int64) cast back to float."""
    lo, hi = np.array(0.0, np.float32), np.array(6.0, np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["h"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Clip", ["f", "lo", "hi"], ["c"]),
             helper.make_node("ReduceMax", ["c"], ["r"], axes=[1], keepdims=1),
             helper.make_node("ArgMax", ["x"], ["a"], axis=1, keepdims=1),
             helper.make_node("Cast", ["a"], ["af"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["r", "af"], ["out"])]
    return make_model(nodes, {"x": [2, 5, 3]}, ["out"], {"lo": lo, "hi": hi}, opset=13)


def pad_model():
    """A non-finite attribute (-inf padding), which JSON itself cannot spell."""
    pads, value = np.array([0, 1, 0, 1], np.int64), np.array(-np.inf, np.float32)
    return make_model([helper.make_node("Pad", ["x", "p", "v"], ["out"])], {"x": [2, 3]}, ["out"],
                      {"p": pads, "v": value}, opset=13)


def assert_same(before, after, inputs: dict[str, np.ndarray]) -> None:
    want, got = before.run(inputs), after.run(inputs)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def ref(program):
    return fusegraph.compile(program, "ref")


@pytest.mark.parametrize("make", [lambda: conv_silu_add_model(3), cast_model, pad_model, lambda: "light_squeezenet"])
def test_a_program_round_trips_on_the_ref_target(make, tmp_path: Path) -> None:
    program = fusegraph.parse_onnx(make())
    fusegraph.save(program, tmp_path / "p.fgx")
    loaded = fusegraph.load(tmp_path / "p.fgx")
    assert isinstance(loaded, fusegraph.Program) and str(loaded) == str(program)
    assert loaded.meta == program.meta
    assert_same(ref(program), ref(loaded), fresh_inputs(program))


def test_a_compiled_ref_program_keeps_its_half_precision(tmp_path: Path) -> None:
    program = fusegraph.parse_onnx(conv_silu_add_model(4))
    for flag in ("fp16", "bf16"):
        compiled = fusegraph.compile(program, "ref", **{flag: True})
        fusegraph.save(compiled, tmp_path / f"{flag}.fgx")
        loaded = fusegraph.load(tmp_path / f"{flag}.fgx")
        assert loaded.source_options == {"target": "ref", "fp16": flag == "fp16", "bf16": flag == "bf16",
                                         "allow_tf32": False}
        assert_same(compiled, loaded, fresh_inputs(compiled))


def test_bfloat16_literals_round_trip(tmp_path: Path) -> None:
    half = fusegraph.compile(fusegraph.parse_onnx(conv_silu_add_model(5)), "ref", bf16=True).program
    fusegraph.save(half, tmp_path / "b.fgx")
    loaded = fusegraph.load(tmp_path / "b.fgx")
    assert str(loaded) == str(half)
    assert_same(ref(half), ref(loaded), fresh_inputs(half))


def test_a_gpu_program_loads_with_its_stored_configs(tmp_path: Path) -> None:
    """Under the interpreter compile picks the largest tiles; one kernel is set to another of its
    candidates, and the loaded program must come back with that config, not the default."""
    program = fusegraph.parse_onnx(conv_silu_add_model(6))
    compiled = fusegraph.compile(program, "gpu", tune=False)
    kernel = compiled.kernels[0]
    other = next(c for c in kernel.src.configs if c != kernel.config)
    kernel.config = dict(other)
    fusegraph.save(compiled, tmp_path / "g.fgx")
    loaded = fusegraph.load(tmp_path / "g.fgx")
    assert [k.src.digest for k in loaded.kernels] == [k.src.digest for k in compiled.kernels]
    assert [k.config for k in loaded.kernels] == [k.config for k in compiled.kernels]
    assert loaded.kernels[0].config == other
    assert_same(compiled, loaded, fresh_inputs(program))


def test_a_gpu_program_keeps_fp16(tmp_path: Path) -> None:
    program = fusegraph.parse_onnx(conv_silu_add_model(7))
    compiled = fusegraph.compile(program, "gpu", fp16=True, tune=False)
    fusegraph.save(compiled, tmp_path / "h.fgx")
    loaded = fusegraph.load(tmp_path / "h.fgx")
    assert loaded.options["fp16"] and loaded.input_shapes["x"].dtype.numpy == np.float16
    assert_same(compiled, loaded, fresh_inputs(compiled))


def test_kernels_without_a_stored_config_are_retuned(tmp_path: Path) -> None:
    """A file whose digests match no regenerated kernel (another fusegraph wrote it) still loads."""
    program = fusegraph.parse_onnx(conv_silu_add_model(8))
    compiled = fusegraph.compile(program, "gpu", tune=False)
    fusegraph.save(compiled, tmp_path / "g.fgx")
    doc, tensors = container.read(tmp_path / "g.fgx")
    doc["configs"] = {"0123456789abcdef": {"XBLOCK": 64, "num_warps": 4, "num_stages": 1}}
    container.write(tmp_path / "other.fgx", doc, tensors)
    with pytest.warns(UserWarning, match="have no stored config.*retuning"):
        loaded = fusegraph.load(tmp_path / "other.fgx")
    assert_same(compiled, loaded, fresh_inputs(program))


def _rewritten(tmp_path: Path, name: str, change, op: str = "add") -> Path:
    """A valid file whose document `change` edited in the last instruction of op `op`
    (checksums written anew)."""
    fusegraph.save(fusegraph.parse_onnx(conv_silu_add_model(9)), tmp_path / "ok.fgx")
    doc, tensors = container.read(tmp_path / "ok.fgx")
    change([i for i in doc["program"]["instructions"] if i["op"] == op][-1])
    container.write(tmp_path / name, doc, tensors)
    return tmp_path / name


def _flip(path: Path, position: int) -> Path:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    out = path.with_name("flipped.fgx")
    out.write_bytes(bytes(data))
    return out


def test_bad_files_are_saved_program_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.numpy import save_file

    fusegraph.save(fusegraph.parse_onnx(conv_silu_add_model(10)), tmp_path / "ok.fgx")
    good = (tmp_path / "ok.fgx").read_bytes()
    (tmp_path / "text.fgx").write_text("not a model\n")
    (tmp_path / "short.fgx").write_bytes(good[:len(good) - 10])
    (tmp_path / "header.fgx").write_bytes(good[:40])
    save_file({"w": np.zeros(3, np.float32)}, str(tmp_path / "plain.safetensors"))
    header = 8 + int.from_bytes(good[:8], "little")
    document = good.index(b"convolution")
    cases = [(tmp_path / "missing.fgx", "no such file"),
             (tmp_path / "text.fgx", "not a .fgx file"),
             (tmp_path / "plain.safetensors", "without fusegraph's metadata"),
             (tmp_path / "short.fgx", "truncated"),
             (tmp_path / "header.fgx", "truncated"),
             (_flip(tmp_path / "ok.fgx", header + 5), "checksum does not match"),
             (_flip(tmp_path / "ok.fgx", len(good) - 1), "checksum does not match"),
             (_flip(tmp_path / "ok.fgx", document), "checksum does not match"),
             (_rewritten(tmp_path, "op.fgx", lambda i: i.update(op="frobnicate")), "unknown op 'frobnicate'"),
             (_rewritten(tmp_path, "fused.fgx", lambda i: i.update(op="fused")), "unknown op 'fused'"),
             (_rewritten(tmp_path, "input.fgx", lambda i: i["inputs"].append(10**6)), "not an earlier instruction"),
             (_rewritten(tmp_path, "attr.fgx", lambda i: i["attrs"].update(colour=1), "convolution"),
              "malformed: TypeError"),
             (_rewritten(tmp_path, "extra.fgx", lambda i: i["attrs"].update(colour=1)), "add takes no attributes, .* colour"),
             (_rewritten(tmp_path, "shape.fgx", lambda i: i["shape"].update(lens=[1, 4, 8, 9], strides=[288, 72, 9, 1])),
              "the file says")]
    for path, message in cases:
        with pytest.raises(SavedProgramError, match=message) as e:
            fusegraph.load(path)
        assert str(path) in str(e.value)
    for version in (0, container.VERSION - 1, container.VERSION + 1):  # VERSION - 1: files without fused programs
        monkeypatch.setattr(container, "VERSION", version)
        fusegraph.save(fusegraph.parse_onnx(conv_silu_add_model(10)), tmp_path / f"v{version}.fgx")
        monkeypatch.undo()
        with pytest.raises(SavedProgramError, match=f"format version '{version}'.*reads version {container.VERSION}"):
            fusegraph.load(tmp_path / f"v{version}.fgx")


def test_the_file_is_plain_json_and_arrays(tmp_path: Path) -> None:
    """Nothing in the file is code: the metadata is JSON text, the tensors are safetensors arrays."""
    from safetensors import safe_open

    program = fusegraph.parse_onnx(conv_silu_add_model(11))
    fusegraph.save(program, tmp_path / "p.fgx")
    with safe_open(str(tmp_path / "p.fgx"), framework="np") as f:
        metadata = f.metadata()
        names = sorted(f.keys())
    doc = json.loads(metadata["document"])
    assert metadata["format"] == "fusegraph-fgx" and doc["options"] is None and doc["configs"] == {}
    ops = [i["op"] for i in doc["program"]["instructions"]]
    assert ops.count("@literal") == len(names) and "convolution" in ops


def test_wrong_arguments_and_unsavable_programs(tmp_path: Path) -> None:
    program = fusegraph.parse_onnx(conv_silu_add_model(12))
    with pytest.raises(ArgumentError, match="path must be a file path"):
        fusegraph.save(program, 3)
    with pytest.raises(ArgumentError, match="must be a Program or what fusegraph.compile returned"):
        fusegraph.save("model.onnx", tmp_path / "x.fgx")
    compiled = fusegraph.compile(program, "ref")
    fusegraph.fuse(program)
    with pytest.raises(SavedProgramError, match="fused since"):
        fusegraph.save(compiled, tmp_path / "x.fgx")
    with pytest.raises(SavedProgramError, match="the program is fused"):
        fusegraph.save(program, tmp_path / "x.fgx")
