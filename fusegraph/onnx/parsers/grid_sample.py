"""The GridSample parser: sampling at run-time coordinates, as pointwise coordinate arithmetic
and one GatherElements per interpolation tap, so both targets run it with kernels they have.

Each output position reads the grid's normalized coordinates (last axis, x first), maps them to
input pixels (`align_corners` or not), applies the padding mode to the coordinate (border:
clamped; reflection: reflected into the borders), and takes 1 (nearest), 2 (linear) or 4
(cubic, Keys' a = -0.75) taps per axis; a tap's pixel is fetched clamped (border), reflected
(reflection) or masked to 0 outside the input (zeros). The taps' products of weights sum up.
Follows onnx's reference implementation step by step, except that cubic sampling with border
padding clamps each tap, not the coordinate, as ONNX Runtime and PyTorch do.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import make_op
from fusegraph.ops import pointwise as pw
from fusegraph.ops import views as v
from fusegraph.ops.gather import GatherElements
from fusegraph.onnx.context import ImportContext, onnx_op
from fusegraph.onnx.parsers.elementwise import binary

CUBIC_A = -0.75


class PointwiseMath:
    """Pointwise ops on broadcast operands; numbers become scalar literals of one float type."""

    def __init__(self, ctx: ImportContext, dtype: DType) -> None:
        self.ctx, self.dtype = ctx, dtype

    def __call__(self, name: str, *xs: Instruction | float) -> Instruction:
        ops = [x if isinstance(x, Instruction) else self.ctx.literal(np.array(x, self.dtype.numpy)) for x in xs]
        if name in ("where", "clip"):
            return self.ctx.add(pw.Where() if name == "where" else pw.Clip(), self.ctx.broadcast(*ops))
        return self.ctx.add(make_op(name), ops) if len(ops) == 1 else binary(self.ctx, name, *ops)

    def trunc(self, x: Instruction) -> Instruction:
        return self.ctx.convert(self.ctx.convert(x, DType.int64), self.dtype)


def _reflect(m: PointwiseMath, x: Instruction, lo: float, hi: float) -> Instruction:
    """x reflected by the near border until it lies in [lo, hi] (onnx's _gs_reflect)."""
    span = hi - lo
    below, above = m("less", x, lo), m("greater", x, hi)
    dx = m("where", below, m("sub", lo, x), m("sub", x, hi))
    n = m.trunc(m("div", dx, span))
    r = m("sub", dx, m("mul", n, span))
    even = m("equal", m("sub", n, m("mul", m("floor", m("div", n, 2.0)), 2.0)), 0.0)
    up, down = m("add", lo, r), m("sub", hi, r)
    return m("where", below, m("where", even, up, down), m("where", above, m("where", even, down, up), x))


def _coordinate(m: PointwiseMath, g: Instruction, n: int, mode: str, padding: str, align: bool) -> Instruction:
    lo, hi = (0.0, n - 1.0) if align else (-0.5, n - 0.5)
    x = m("mul", m("add", g, 1.0), (n - 1) / 2.0) if align else m("div", m("sub", m("mul", m("add", g, 1.0), float(n)), 1.0), 2.0)
    if mode == "nearest":
        x = m("round", x)
    if padding == "border" and mode != "cubic":  # cubic clamps each tap instead, as ONNX Runtime does
        x = m("where", m("logical_or", m("less", x, lo), m("greater", x, hi)), m("clip", x, 0.0, n - 1.0), x)
    elif padding == "reflection":
        x = _reflect(m, x, lo, hi)
    return x


def _taps(m: PointwiseMath, x: Instruction, mode: str) -> list[tuple[Instruction, Instruction | None]]:
    """(pixel index, weight) of each tap along one axis; indices are whole numbers as floats."""
    if mode == "nearest":
        return [(m.trunc(x), None)]
    f = m("floor", x)
    t = m("sub", x, f)
    if mode == "linear":
        return [(f, m("sub", 1.0, t)), (m("add", f, 1.0), t)]
    a = CUBIC_A

    def keys(d: Instruction) -> Instruction:  # weight of a tap at distance d in [1, 2]
        return m("sub", m("mul", m("add", m("mul", m("sub", m("mul", d, a), 5 * a), d), 8 * a), d), 4 * a)

    def near(d: Instruction) -> Instruction:  # weight of a tap at distance d in [0, 1]
        return m("add", m("mul", m("mul", m("sub", m("mul", d, a + 2), a + 3), d), d), 1.0)

    one_minus = m("sub", 1.0, t)
    return [(m("sub", f, 1.0), keys(m("add", t, 1.0))), (f, near(t)), (m("add", f, 1.0), near(one_minus)),
            (m("add", f, 2.0), keys(m("sub", 2.0, t)))]


def fetch_tap(m: PointwiseMath, i: Instruction, n: int, padding: str,
              align: bool) -> tuple[Instruction, Instruction | None]:
    """The in-range pixel a tap index reads, and (zeros padding) whether it lies inside."""
    if padding == "reflection":
        lo, hi = (0.0, n - 1.0) if align else (-0.5, n - 0.5)
        i = m.trunc(_reflect(m, i, lo, hi))
    inside = m("logical_and", m("greater_or_equal", i, 0.0), m("less_or_equal", i, n - 1.0)) if padding == "zeros" else None
    return m("clip", i, 0.0, n - 1.0), inside


@onnx_op("GridSample")
def parse_grid_sample(ctx: ImportContext, ins: list[Instruction | None]) -> Instruction:
    x, grid = ins[0], ins[1]
    assert x is not None and grid is not None
    k = x.shape.ndim - 2
    if k < 1 or grid.shape.ndim != k + 2 or grid.shape.lens[0] != x.shape.lens[0] or grid.shape.lens[-1] != k:
        raise ctx.error(f"grid {list(grid.shape.lens)} does not fit input {list(x.shape.lens)}")
    mode = ctx.attr("mode", "linear" if ctx.opset >= 20 else "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    ctx.check_attr("mode", mode, ["nearest", "linear", "cubic"])
    padding = ctx.check_attr("padding_mode", ctx.attr("padding_mode", "zeros"), ["zeros", "border", "reflection"])
    align = bool(ctx.attr("align_corners", 0))
    if mode == "cubic" and k != 2:
        raise ctx.error("cubic sampling is defined for 2-d inputs only")
    n, c, dims = x.shape.lens[0], x.shape.lens[1], x.shape.lens[2:]
    points = math.prod(grid.shape.lens[1:-1])
    m = PointwiseMath(ctx, grid.shape.dtype if grid.shape.dtype.is_float else DType.float32)
    flat_grid = ctx.add(v.Reshape([n, 1, points, k]), [ctx.convert(grid, m.dtype)])
    per_axis = []
    for d in range(k):  # input axis 2 + d reads grid component k - 1 - d
        g = ctx.add(v.Reshape([n, 1, points]), [ctx.add(v.Slice([3], [k - 1 - d], [k - d]), [flat_grid])])
        per_axis.append(_taps(m, _coordinate(m, g, dims[d], mode, padding, align), mode))
    strides = [math.prod(dims[d + 1:]) for d in range(k)]
    data = ctx.add(v.Reshape([n, c, math.prod(dims)]), [x])
    total = None
    for combo in itertools.product(*per_axis):
        flat, weight, inside = None, None, None
        for d, (i, w) in enumerate(combo):
            pixel, ok = fetch_tap(m, i, dims[d], padding, align)
            term = m("mul", pixel, float(strides[d]))
            flat = term if flat is None else m("add", flat, term)
            weight = w if weight is None else (weight if w is None else m("mul", weight, w))
            inside = ok if inside is None else (inside if ok is None else m("logical_and", inside, ok))
        index = ctx.add(v.MultiBroadcast([n, c, points]), [ctx.convert(flat, DType.int64)])
        value = ctx.add(GatherElements(2), [data, index])
        if inside is not None:
            value = ctx.add(pw.Where(), ctx.broadcast(inside, value, ctx.literal(np.zeros((), x.shape.dtype.numpy))))
        if weight is not None:
            value = binary(ctx, "mul", value, ctx.convert(weight, x.shape.dtype))
        total = value if total is None else binary(ctx, "add", total, value)
    assert total is not None
    return ctx.add(v.Reshape([n, c, *grid.shape.lens[1:-1]]), [total])
