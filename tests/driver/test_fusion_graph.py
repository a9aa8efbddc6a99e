"""`fusegraph graph`: one box per fused kernel, holding the ops that kernel computes, laid out
without overlaps; rendered by headless Chromium when it is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import onnx
import pytest

import fusegraph
from fusegraph.driver.cli import main
from fusegraph.driver.fusion_graph import attach_times, fusion_graph, is_plumbing, kernel_count, read_perf
from fusegraph.driver.fusion_html import render
from fusegraph.errors import ArgumentError
from fusegraph.ops.base import is_fused
from tests.helpers import conv_silu_add_model

CHROMIUM = "/usr/bin/chromium"


class _Boxes(HTMLParser):
    """Each kernel group's key, kernel name, rect and number of op chips."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[dict] = []
        self.depth = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "g" and a.get("class") == "kernel":
            self.kernels.append({"key": a["data-key"], "kernel": a["data-kernel"], "ops": 0, "rect": None})
            self.depth = 1
        elif self.depth and tag == "g":
            self.depth += 1
            self.kernels[-1]["ops"] += a.get("class") == "op"
        elif self.depth and tag == "rect" and self.kernels[-1]["rect"] is None:
            self.kernels[-1]["rect"] = tuple(float(a[k]) for k in ("x", "y", "width", "height"))

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag == "g":
            self.depth -= 1


def _boxes(html: str) -> list[dict]:
    parser = _Boxes()
    parser.feed(html)
    return parser.kernels


def _fused(source) -> fusegraph.Program:
    return fusegraph.fuse(fusegraph.parse_onnx(source))


@pytest.fixture(scope="module")
def yolo() -> fusegraph.Program:
    return _fused("yolov5s-160")


def _check_page(program: fusegraph.Program, html: str) -> list[dict]:
    fused = [(pos, ins) for pos, ins in enumerate(program.main.instructions) if is_fused(ins)]
    boxes = _boxes(html)
    assert len(boxes) == kernel_count(program) == len(fused)
    for box, (pos, ins) in zip(boxes, fused):
        assert box["key"] == f"@{pos}" and box["kernel"] == ins.op.attrs["kernel"]
        assert box["ops"] == max(1, sum(not is_plumbing(x) for x in ins.op.module.instructions))
    rects = [b["rect"] for b in boxes]
    for i, (x0, y0, w0, h0) in enumerate(rects):
        for x1, y1, w1, h1 in rects[i + 1:]:
            assert x0 + w0 <= x1 or x1 + w1 <= x0 or y0 + h0 <= y1 or y1 + h1 <= y0, "kernel boxes overlap"
    return boxes


def test_one_box_per_kernel_yolov5s(yolo):
    html = render(fusion_graph(yolo, "yolov5s-160"))
    boxes = _check_page(yolo, html)
    want = sum(ins.op.attrs["kernel"] == "conv_add_sigmoid_mul" for ins in yolo.main if is_fused(ins))
    assert want > 40 and sum(b["kernel"] == "conv_add_sigmoid_mul" for b in boxes) == want
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_small_model_page_from_the_command_line(tmp_path, capsys):
    model = tmp_path / "small.onnx"
    onnx.save(conv_silu_add_model(0), model)
    out = tmp_path / "fusion.html"
    assert main(["graph", str(model), "-o", str(out)]) == 0
    assert f"wrote {out}: 1 fused kernels" in capsys.readouterr().out
    (box,) = _check_page(_fused(str(model)), out.read_text())
    assert box["kernel"] == "conv_add_sigmoid_mul" and box["ops"] == 5  # conv, bias add, sigmoid, mul, add


def test_perf_times_are_matched_to_kernels_in_order(yolo, tmp_path):
    kernels = [ins for ins in yolo.main if is_fused(ins)]
    lines = [f"@{i} = {k.op.attrs['kernel']}(@0) -> half_type, {{1}}, {{1}}: {0.001 * (i + 1):.4f}ms, 2%"
             for i, k in enumerate(kernels)]
    perf = tmp_path / "perf.txt"
    perf.write_text("\n".join(["compiling ...", *lines, "", "Summary:", "pad: 0.0045ms / 1 = 0.0045ms, 2%"]))
    graph = fusion_graph(yolo, "yolov5s-160")
    attach_times(graph, read_perf(perf), str(perf))
    times = [b.ms for b in graph.boxes if b.kind == "kernel"]
    assert times == pytest.approx([0.001 * (i + 1) for i in range(len(kernels))])
    html = render(graph)
    assert f"{0.001 * len(kernels):.4f} ms" in html
    with pytest.raises(ArgumentError, match=f"times {len(kernels) - 1} kernels, but the fused program has {len(kernels)}"):
        attach_times(graph, read_perf(perf)[1:], "perf.txt")
    perf.write_text("nothing here\n")
    with pytest.raises(ArgumentError, match="no kernel lines"):
        read_perf(perf)


def _chromium(*args: str) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="fusegraph-chromium-")
    try:
        return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                               "--no-first-run", "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": profile})
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="headless Chromium is not installed (apt-get install chromium)")
def test_rendered_in_headless_chromium(yolo, tmp_path):
    page = tmp_path / "fusion.html"
    page.write_text(render(fusion_graph(yolo, "yolov5s-160")))
    dom = _chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    _check_page(yolo, dom.stdout)
    shot = tmp_path / "fusion.png"
    done = _chromium(f"--screenshot={shot}", "--window-size=800,1200", page.as_uri())
    assert done.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", done.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a page of colored boxes, not a blank one
