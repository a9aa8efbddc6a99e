"""The command line of the gpu target: compile --kernels, verify --target gpu, perf."""

from __future__ import annotations

import re

from pathlib import Path

import onnx
import pytest
from onnx import helper

from fusegraph import api
from fusegraph.driver.cli import main
from tests.helpers import has_gpu, make_model, rand

GPU = has_gpu()


def _model(tmp_path: Path) -> str:
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                    helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])],
                   {"x": [1, 16, 6, 6]}, ["y"], {"w": rand(8, 16, 3, 3, seed=1, scale=0.2), "b": rand(8, seed=2)})
    path = tmp_path / "conv_silu.onnx"
    onnx.save(m, str(path))
    return str(path)


def test_compile_prints_every_kernel(capsys):
    assert main(["compile", "yolov5s-160", "--kernels"]) == 0
    out = capsys.readouterr().out
    assert out.count("@triton.jit") == 56
    defs = re.findall(r"def (k_[0-9a-f]{10}_\w+)\(", out)
    assert defs[0].endswith("_pad") and defs[1].endswith("_conv_add_sigmoid_mul")  # space-to-depth, then the first conv
    assert "56 fused kernels" in out


def test_verify_gpu_target_passes(tmp_path, capsys):
    assert main(["verify", _model(tmp_path), "--target", "gpu", "--no-tune"]) == 0
    out = capsys.readouterr().out
    assert "gpu target (fp32, 1 kernels" in out and out.strip().endswith("PASS")


def test_verify_gpu_target_fp16(tmp_path, capsys):
    assert main(["verify", _model(tmp_path), "--target", "gpu", "--fp16", "--no-tune"]) == 0
    assert "tolerance 1e-02" in capsys.readouterr().out


@pytest.mark.skipif(GPU, reason="checks the message given without a GPU")
def test_perf_without_gpu_says_so(tmp_path, capsys):
    assert main(["perf", _model(tmp_path), "--no-tune"]) == 2
    assert "perf needs an NVIDIA GPU" in capsys.readouterr().err


def test_perf_line_shows_the_chosen_config_and_stays_readable(tmp_path):
    """`perf --configs` puts each kernel's launch config after its time; the per-kernel table of
    bench/kernel_floors.py still reads the line (kernel, time)."""
    from bench.kernel_floors import LINE
    from fusegraph import parse_onnx
    from fusegraph.driver.perf import kernel_line

    compiled = api.compile(parse_onnx(onnx.load(_model(tmp_path))), "gpu", tune=False)
    (k,) = compiled.kernels
    names = {id(ins): f"@{pos}" for pos, ins in enumerate(compiled.program.main.instructions)}
    plain, shown = kernel_line(k, 0.0125, 0.05, names), kernel_line(k, 0.0125, 0.05, names, config=True)
    assert shown.startswith(plain + "  [BM=") and shown.endswith(f"num_stages={k.config['num_stages']}]")
    assert all(f"{key}={value}" in shown[len(plain):] for key, value in k.config.items())
    for line in (plain, shown):
        m = LINE.match(line)
        assert m and m.group(2) == "conv_add_sigmoid_mul" and float(m.group(3)) == 0.0125, line
