"""`fusegraph verify --target gpu --bisect`: every fused instruction's kernel output, read right
after the kernel runs, against the ref target's value of the same instruction (kernels run
under Triton's interpreter without a GPU). A deliberately broken Triton spelling of `relu`
must be pinned on the one kernel that uses it, with figures checked against ONNX Runtime."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from fusegraph.driver.cli import main
from fusegraph.targets.gpu.scalar_ops import SPELLINGS
from tests.helpers import make_model, ort_run, rand

X = [1, 4, 6, 6]


def _save(tmp_path: Path, model: onnx.ModelProto) -> tuple[str, str, np.ndarray]:
    """The model's path, an `--input` argument and that input (fresh random values)."""
    path, x_path = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(model, str(path))
    x = np.random.default_rng(20261204).standard_normal(X).astype(np.float32)
    np.save(x_path, x)
    return str(path), f"x={x_path}", x


def _conv_add_transpose_relu() -> onnx.ModelProto:
    """Two kernels: conv+add (an output) and transpose+relu, the relu a kernel of its own because
    it reads the transposed sum through a broadcast to batch 2, which no epilogue absorbs."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv_0", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["a"], name="add_1"),
             helper.make_node("Transpose", ["a"], ["t"], name="transpose_2", perm=[0, 2, 3, 1]),
             helper.make_node("Expand", ["t", "batch2"], ["e"], name="expand_3"),
             helper.make_node("Relu", ["e"], ["y"], name="relu_3")]
    return make_model(nodes, {"x": X}, ["y", "a"], {"w": rand(4, 4, 3, 3, seed=3, scale=0.3),
                                                     "batch2": np.array([2, 1, 1, 1], np.int64)})


def _step_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"  @\d+ kernel ", line)]


def test_every_instruction_agrees(tmp_path, capsys):
    path, given, _ = _save(tmp_path, _conv_add_transpose_relu())
    assert main(["verify", path, "--target", "gpu", "--bisect", "--input", given]) == 0
    out = capsys.readouterr().out
    steps = _step_lines(out)
    assert len(steps) == 2
    assert re.match(r"  @2 kernel k_[0-9a-f]{10}_conv_add: conv_add: \[1, 4, 6, 6\] ", steps[0]) and steps[0].endswith("PASS")
    assert re.match(r"  @3 kernel k_[0-9a-f]{10}_relu: relu: \[2, 6, 6, 4\] ", steps[1]) and steps[1].endswith("PASS")
    assert out.rstrip().endswith("all 2 fused instructions agree with the ref target")


def test_intermediates_are_read_where_the_arena_holds_them(tmp_path, capsys):
    """Three convs where the first one's value lives until the last: the second kernel's value
    sits at a non-zero arena offset (channels-last), and is read there."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv_0", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w2"], ["d"], name="conv_1", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "d"], ["e"], name="add_2"),
             helper.make_node("Conv", ["e", "w3"], ["f"], name="conv_3", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["f", "c"], ["y"], name="add_4")]
    weights = {k: rand(4, 4, 3, 3, seed=5 + i, scale=0.3) for i, k in enumerate(["w1", "w2", "w3"])}
    path, given, _ = _save(tmp_path, make_model(nodes, {"x": X}, ["y"], weights))
    assert main(["verify", path, "--target", "gpu", "--bisect", "--input", given]) == 0
    out = capsys.readouterr().out
    steps = _step_lines(out)
    names = [s.split()[2] for s in steps]
    assert [re.sub(r"^k_[0-9a-f]{10}_", "", n) for n in names] == ["conv:", "conv_add:", "conv_add:"]
    assert len(set(names)) == 3  # equal groups of other shapes are other kernels
    assert all(s.endswith("PASS") for s in steps)


def test_concat_parts_are_compared_where_each_kernel_writes(tmp_path, capsys):
    """Concat elimination: two kernels store into halves of one buffer; each is compared on its
    own half (the other half is not written yet when it is read)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv_0", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid_1"),
             helper.make_node("Concat", ["c", "s"], ["k"], name="concat_2", axis=1),
             helper.make_node("Softmax", ["k"], ["y"], name="softmax_3", axis=1)]  # over both parts: the concat stays
    model = make_model(nodes, {"x": X}, ["y"], {"w": rand(4, 4, 3, 3, seed=4, scale=0.3)})
    path, given, _ = _save(tmp_path, model)
    assert main(["verify", path, "--target", "gpu", "--bisect", "--input", given]) == 0
    out = capsys.readouterr().out
    steps = _step_lines(out)
    assert len(steps) == 3 and all(s.endswith("PASS") for s in steps)
    half = 4 * 6 * 6  # of the 8 concatenated channels
    assert re.match(rf"  @3 kernel k_[0-9a-f]{{10}}_conv: conv: \[{half}\] ", steps[0])
    assert re.match(rf"  @4 kernel k_[0-9a-f]{{10}}_sigmoid: sigmoid: \[{half}\] ", steps[1])
    assert out.rstrip().endswith("all 3 fused instructions agree with the ref target")


def test_a_broken_kernel_is_named(tmp_path, capsys, monkeypatch):
    """relu spelled `x * 2`: the conv+add kernel still agrees, the transpose+relu kernel is the
    first difference; its figures are those of 2t against max(t, 0) from ONNX Runtime's t."""
    monkeypatch.setattr(SPELLINGS["relu"], "template", "({0} * 2.0)")
    model = _conv_add_transpose_relu()
    path, given, x = _save(tmp_path, model)
    assert main(["verify", path, "--target", "gpu", "--bisect", "--input", given]) == 1
    out = capsys.readouterr().out
    steps = _step_lines(out)
    assert len(steps) == 2 and steps[0].endswith("PASS") and steps[1].endswith("FAIL")
    assert "first difference: @3 (1 earlier fused instructions agree)" in out
    assert re.search(r"  kernel: k_[0-9a-f]{10}_relu \(relu, template ", out)
    assert "  origin: relu_3\n" in out  # the transpose is the load's index map: no work of its own
    assert re.search(r"^    module: \"\S+\"$", out, re.M) and re.search(r"^    @\d+ = relu\(@\d+\)", out, re.M)
    t = np.transpose(ort_run(model, {"x": x})[1], (0, 2, 3, 1)).astype(np.float64)
    diff = 2 * t - np.maximum(t, 0)
    figures = re.search(r"  max abs error (\S+), relative norm error (\S+) \(tolerance 1e-04\)\n", out)
    assert figures, out
    assert float(figures[1]) == pytest.approx(np.abs(diff).max(), rel=1e-3)
    assert float(figures[2]) == pytest.approx(np.linalg.norm(diff) / np.linalg.norm(np.maximum(t, 0)), rel=1e-3)


def test_a_failing_verify_bisects_without_the_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(SPELLINGS["relu"], "template", "({0} * 2.0)")
    path, given, _ = _save(tmp_path, _conv_add_transpose_relu())
    assert main(["verify", path, "--target", "gpu", "--input", given]) == 1
    out = capsys.readouterr().out
    assert "\nFAIL\n" in out and "first difference: @3" in out


def test_instruction_values_keep_every_value_and_agree_with_a_run():
    """The ref runner's per-instruction values: one for every instruction of the main module,
    the returned ones equal to a run's outputs (which NumPy's own transpose and max confirm)."""
    from fusegraph import api
    from fusegraph.targets.ref.runner import instruction_values

    program = api.parse_onnx(_conv_add_transpose_relu())
    x = np.random.default_rng(7).standard_normal(X).astype(np.float32)
    values = instruction_values(program, {"x": x})
    assert set(values) == {id(ins) for ins in program.main.instructions}
    outputs = api.run(program, {"x": x}, target="ref")
    for name, ret in zip(program.main.return_names, program.main.returns):
        np.testing.assert_array_equal(values[id(ret)], outputs[name])
    a = outputs["a"].astype(np.float64)
    want = np.broadcast_to(np.maximum(np.transpose(a, (0, 2, 3, 1)), 0), outputs["y"].shape)
    np.testing.assert_allclose(outputs["y"], want, rtol=1e-6)


def test_bisect_needs_the_gpu_target(capsys):
    assert main(["verify", "light_squeezenet", "--bisect"]) == 2
    err = capsys.readouterr().err
    assert err == "fusegraph: error: --bisect compares the gpu target's kernels one by one: add --target gpu\n"
