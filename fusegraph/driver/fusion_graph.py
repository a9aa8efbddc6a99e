"""The graph `fusegraph graph` draws: one box per fused kernel holding the ONNX ops it computes.

Boxes are the fused program's `fused` instructions, numbered as `fusegraph compile --print`
numbers them; inside, each op of the kernel's sub-module that computes something (views and
memory ops are the kernel's index maps, and its name lists them) with the ONNX node it came
from. Edges follow the data from kernel to kernel through the views between them; the
model's inputs and outputs are small boxes of their own. Kernel times come from `fusegraph
perf` output (its text, or the Chrome trace of `perf --trace`), matched to kernels in order.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusegraph.errors import ArgumentError
from fusegraph.ops.base import is_allocate, is_fused, is_literal, is_load, is_param, is_store

def is_plumbing(ins: Any) -> bool:
    """Parameters, literals, loads, stores and allocations: how a kernel reaches its data, not
    what it computes, so a box lists only the others."""
    return is_param(ins) or is_literal(ins) or is_load(ins) or is_store(ins) or is_allocate(ins)


@dataclass
class Box:
    key: str
    kind: str  # "kernel", "input" or "output"
    title: str
    kernel: str = ""
    #: (op name, ONNX node) of each op the kernel computes
    ops: list[tuple[str, str]] = field(default_factory=list)
    ms: float | None = None


@dataclass
class FusionGraph:
    boxes: list[Box]
    edges: list[tuple[str, str]]
    model: str = ""


def fusion_graph(program: Any, model: str = "") -> FusionGraph:
    """The boxes and edges of a fused Program (in its main module's order, which is topological)."""
    main = program.main
    boxes: list[Box] = []
    edges: list[tuple[str, str]] = []
    key_of: dict[int, str] = {}
    for pos, ins in enumerate(main.instructions):
        if is_param(ins):
            key_of[id(ins)] = f"in:{ins.op.attrs['name']}"
            boxes.append(Box(key_of[id(ins)], "input", f"{ins.op.attrs['name']} {list(ins.shape.lens)}"))
        elif is_fused(ins):
            key = f"@{pos}"
            key_of[id(ins)] = key
            ops = [(x.op.name, x.origin) for x in ins.op.module.instructions if not is_plumbing(x)]
            ops = ops or [(ins.op.attrs["kernel"], ins.origin)]  # a kernel that only moves data
            boxes.append(Box(key, "kernel", key, ins.op.attrs["kernel"], ops))
            edges += [(src, key) for src in dict.fromkeys(_sources(ins, key_of))]
    for name, ins in zip(main.return_names, main.returns):
        key = f"out:{name}"
        boxes.append(Box(key, "output", f"{name} {list(ins.shape.lens)}"))
        edges += [(src, key) for src in dict.fromkeys(_sources_of(ins, key_of))]
    return FusionGraph(boxes, edges, model)


def _sources(ins: Any, key_of: dict[int, str]) -> list[str]:
    return [k for x in ins.inputs for k in _sources_of(x, key_of)]


def _sources_of(x: Any, key_of: dict[int, str]) -> list[str]:
    """The boxes a value comes from: itself when it is a box, else (a view, a buffer) its inputs'."""
    if id(x) in key_of:
        return [key_of[id(x)]]
    return [k for y in x.inputs for k in _sources_of(y, key_of)]


def kernel_count(program: Any) -> int:
    return sum(1 for ins in program.main if is_fused(ins))


_PERF_LINE = re.compile(r"^@\d+ = (\w+)\(.*: ([0-9.]+)ms, \d+%")


def read_perf(path: "str | Path") -> list[tuple[str, float]]:
    """(kernel name, ms) of each kernel, in run order, from `fusegraph perf` text or the Chrome
    trace (JSON) that `perf --trace` writes."""
    text = Path(path).read_text()
    if text.lstrip().startswith("{"):
        try:
            events = json.loads(text)["traceEvents"]
            return [(e["name"], float(e["dur"]) / 1000.0) for e in events if e.get("ph") == "X"]
        except (ValueError, KeyError, TypeError) as e:
            raise ArgumentError(f"{path}: not a Chrome trace from `fusegraph perf --trace` ({e})") from None
    times = [(m.group(1), float(m.group(2))) for m in map(_PERF_LINE.match, text.splitlines()) if m]
    if not times:
        raise ArgumentError(f"{path}: no kernel lines like `@41 = pad(@0) -> ...: 0.0045ms, 2%` "
                            "(the output of `fusegraph perf MODEL`)")
    return times


def attach_times(graph: FusionGraph, times: list[tuple[str, float]], where: str) -> None:
    """Give each kernel box its time; the perf data must list the same kernels in the same order."""
    kernels = [b for b in graph.boxes if b.kind == "kernel"]
    if len(times) != len(kernels):
        raise ArgumentError(f"{where} times {len(times)} kernels, but the fused program has {len(kernels)}: "
                            "was it measured on the same model and options?")
    for i, (box, (name, ms)) in enumerate(zip(kernels, times)):
        if name != box.kernel:
            raise ArgumentError(f"{where}: kernel {i} is {name} there but {box.kernel} ({box.key}) here: "
                                "was it measured on the same model and options?")
        box.ms = ms
