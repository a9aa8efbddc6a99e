"""The page `fusegraph graph` writes: one self-contained HTML file, inline SVG and CSS, no script.

Each kernel is a colored box (one color per kernel name, listed in a legend) titled with its
number and name and, given perf data, its time; inside, one chip per op it computes, the ONNX
node in the chip's tooltip. Sizes are computed from character counts in a monospace font, so
the layout needs no browser to measure text.
"""

from __future__ import annotations

import re
from html import escape
from typing import Iterable

from fusegraph.driver.fusion_graph import Box, FusionGraph
from fusegraph.driver.graph_layout import Layout, Placed, layout

CHAR_W, CHIP_CHAR_W = 7.3, 6.1  # widths of a 12 px and a 10 px monospace character
TITLE_CHARS, CHIP_H, PAD, LINE_H = 34, 16.0, 8.0, 15.0
MAX_INNER = 250.0
PALETTE = ["#cfe3f7", "#fbe0c3", "#d7efd2", "#f6d2d8", "#e4daf2", "#fff1b8", "#d2efec", "#eadfd2",
           "#f2d7ee", "#dde5c8", "#c9d9ee", "#f7e3d9"]
STROKES = ["#3b78b8", "#c67a22", "#4d9a43", "#b8485d", "#7a5bb0", "#b39500", "#2f938a", "#8c6d4f",
           "#a04d94", "#6f8440", "#4b6b9a", "#b06f52"]
CSS = """
body { font-family: sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 18px; margin: 0 0 4px 0; }
p.summary { margin: 0 0 8px 0; font-size: 13px; }
ul.legend { list-style: none; padding: 0; margin: 0 0 12px 0; font: 12px monospace; }
ul.legend li { display: inline-block; margin: 0 14px 4px 0; }
ul.legend span { display: inline-block; width: 12px; height: 12px; border: 1px solid; vertical-align: -2px; margin-right: 4px; }
svg text { font-family: monospace; }
.kernel text.title { font-size: 12px; font-weight: bold; }
.kernel text.time { font-size: 11px; }
.op text { font-size: 10px; }
.io text { font-size: 11px; }
path.edge { fill: none; stroke: #777; stroke-width: 1.2; }
"""


def _title_lines(box: Box) -> list[str]:
    """The number and the kernel name, broken after underscores to fit the box."""
    lines = [""]
    for token in re.split(r"(?<=_)", f"{box.title} {box.kernel}"):
        if lines[-1] and len(lines[-1]) + len(token) > TITLE_CHARS:
            lines.append(token)
        else:
            lines[-1] += token
    return lines


def _chip_rows(box: Box) -> list[list[tuple[str, str, float]]]:
    rows: list[list[tuple[str, str, float]]] = [[]]
    used = 0.0
    for op, origin in box.ops:
        w = len(op) * CHIP_CHAR_W + 8
        if rows[-1] and used + w > MAX_INNER:
            rows.append([])
            used = 0.0
        rows[-1].append((op, origin, w))
        used += w + 4
    return rows


def _size(box: Box) -> tuple[float, float]:
    if box.kind != "kernel":
        return len(box.title) * 6.7 + 2 * PAD, 24.0
    lines = _title_lines(box) + (["t"] if box.ms is not None else [])
    rows = _chip_rows(box)
    inner = max([len(t) * CHAR_W for t in lines] + [sum(w + 4 for *_, w in r) - 4 for r in rows] + [120.0])
    return inner + 2 * PAD, PAD + LINE_H * len(lines) + len(rows) * (CHIP_H + 4) + PAD


def render(graph: FusionGraph) -> str:
    """The whole page."""
    sizes = {b.key: _size(b) for b in graph.boxes}
    placed = layout(sizes, graph.edges)
    colors = _colors(graph.boxes)
    svg = _svg(graph, placed, colors)
    kernels = [b for b in graph.boxes if b.kind == "kernel"]
    total = sum(b.ms for b in kernels if b.ms is not None)
    timed = f"; kernel time {total:.4f} ms (from perf)" if any(b.ms is not None for b in kernels) else ""
    head = f"{escape(graph.model)}: {len(kernels)} fused kernels{timed}"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>fusegraph fusion: {escape(graph.model)}</title>", f"<style>{CSS}</style></head><body>",
        f"<h1>{head}</h1>",
        '<p class="summary">Each box is one fused kernel (one Triton kernel), numbered as in '
        "<code>fusegraph compile --print</code>; its chips are the ops it computes (hover for the ONNX node).</p>",
        _legend(kernels, colors), svg, "</body></html>", ""])


def _colors(boxes: Iterable[Box]) -> dict[str, int]:
    colors: dict[str, int] = {}
    for b in boxes:
        if b.kind == "kernel" and b.kernel not in colors:
            colors[b.kernel] = len(colors) % len(PALETTE)
    return colors


def _legend(kernels: list[Box], colors: dict[str, int]) -> str:
    items = []
    for name, c in colors.items():
        mine = [b for b in kernels if b.kernel == name]
        ms = sum(b.ms for b in mine if b.ms is not None)
        time = f", {ms:.4f} ms" if any(b.ms is not None for b in mine) else ""
        items.append(f'<li><span style="background:{PALETTE[c]};border-color:{STROKES[c]}"></span>'
                     f"{escape(name)} &times; {len(mine)}{time}</li>")
    return '<ul class="legend">' + "".join(items) + "</ul>"


def _svg(graph: FusionGraph, placed: Layout, colors: dict[str, int]) -> str:
    margin = 12.0
    w, h = placed.width + 2 * margin, placed.height + 2 * margin
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
             f'viewBox="{-margin:.0f} {-margin:.0f} {w:.0f} {h:.0f}">',
             '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#777"/></marker></defs>']
    parts += [_edge(points) for points in placed.routes.values()]
    for box in graph.boxes:
        node = placed.nodes[box.key]
        parts.append(_kernel(box, node, colors[box.kernel]) if box.kind == "kernel" else _io(box, node))
    return "\n".join(parts + ["</svg>"])


def _edge(points: list[tuple[float, float]]) -> str:
    """A smooth path through the route's points, vertical at each of them."""
    (x0, y0), rest = points[0], points[1:]
    d = [f"M{x0:.1f},{y0:.1f}"]
    for x1, y1 in rest:
        mid = (y0 + y1) / 2
        d.append(f"C{x0:.1f},{mid:.1f} {x1:.1f},{mid:.1f} {x1:.1f},{y1:.1f}")
        x0, y0 = x1, y1
    return f'<path class="edge" d="{" ".join(d)}" marker-end="url(#arrow)"/>'


def _kernel(box: Box, node: Placed, c: int) -> str:
    x, y = node.x, node.y
    origins = ", ".join(dict.fromkeys(o for _, o in box.ops if o))
    out = [f'<g class="kernel" data-key="{escape(box.key)}" data-kernel="{escape(box.kernel)}">',
           f"<title>{escape(box.key)} {escape(box.kernel)}: {escape(origins)}</title>",
           f'<rect x="{x:.1f}" y="{y:.1f}" width="{node.width:.1f}" height="{node.height:.1f}" rx="6" '
           f'fill="{PALETTE[c]}" stroke="{STROKES[c]}" stroke-width="1.5"/>']
    ty = y + PAD + 11
    for line in _title_lines(box):
        out.append(f'<text class="title" x="{x + PAD:.1f}" y="{ty:.1f}">{escape(line)}</text>')
        ty += LINE_H
    if box.ms is not None:
        out.append(f'<text class="time" x="{x + PAD:.1f}" y="{ty:.1f}">{box.ms:.4f} ms</text>')
        ty += LINE_H
    cy = ty - 11 + 2
    for row in _chip_rows(box):
        cx = x + PAD
        for op, origin, w in row:
            out.append(f'<g class="op"><title>{escape(op)}: {escape(origin)}</title>'
                       f'<rect x="{cx:.1f}" y="{cy:.1f}" width="{w:.1f}" height="{CHIP_H:.0f}" rx="3" fill="#fff" '
                       f'stroke="{STROKES[c]}" stroke-width="0.8"/>'
                       f'<text x="{cx + 4:.1f}" y="{cy + 11.5:.1f}">{escape(op)}</text></g>')
            cx += w + 4
        cy += CHIP_H + 4
    return "\n".join(out + ["</g>"])


def _io(box: Box, node: Placed) -> str:
    return (f'<g class="io {box.kind}" data-key="{escape(box.key)}"><rect x="{node.x:.1f}" y="{node.y:.1f}" '
            f'width="{node.width:.1f}" height="{node.height:.1f}" rx="12" fill="#eee" stroke="#888"/>'
            f'<text x="{node.x + PAD:.1f}" y="{node.y + 16:.1f}">{escape(box.title)}</text></g>')
