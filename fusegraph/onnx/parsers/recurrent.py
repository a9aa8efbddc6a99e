"""RNN, GRU and LSTM, unrolled over the sequence at import into products and pointwise ops.

Shapes are fixed when a program is compiled, so the number of steps is known: each step is a
product of the hidden state with the recurrence weights plus gate math, all ops that fuse and
have kernels. The input projection of every step is one product over the whole sequence.
Sequence lengths, constant or read at run time, mask the state updates (a finished sequence
keeps its state, its outputs are zeros); a reverse direction reads each sequence backwards from
its own last element, a gather at indices computed from the lengths.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops import pointwise as pw
from fusegraph.ops import views as v
from fusegraph.ops.base import make_op
from fusegraph.ops.gather import GatherElements
from fusegraph.ops.movement import Concat
from fusegraph.onnx.context import ImportContext, onnx_op
from fusegraph.onnx.parsers.elementwise import binary
from fusegraph.onnx.parsers.nn import matmul

Unary = Callable[[Instruction], Instruction]

#: activation name (lower case) -> (builder from (ctx, x, alpha, beta), default alpha, default beta);
#: a default of None means the activation takes no such value from activation_alpha/beta.
_ACTIVATIONS: dict[str, tuple[Callable[..., Instruction], float | None, float | None]] = {
    "sigmoid": (lambda c, x, a, b: c.add(make_op("sigmoid"), [x]), None, None),
    "tanh": (lambda c, x, a, b: c.add(make_op("tanh"), [x]), None, None),
    "relu": (lambda c, x, a, b: c.add(make_op("relu"), [x]), None, None),
    "softsign": (lambda c, x, a, b: c.add(make_op("softsign"), [x]), None, None),
    "softplus": (lambda c, x, a, b: c.add(make_op("softplus"), [x]), None, None),
    "leakyrelu": (lambda c, x, a, b: c.add(pw.LeakyRelu(a), [x]), 0.01, None),
    "thresholdedrelu": (lambda c, x, a, b: c.add(pw.ThresholdedRelu(a), [x]), 1.0, None),
    "elu": (lambda c, x, a, b: c.add(pw.Elu(a), [x]), 1.0, None),
    "hardsigmoid": (lambda c, x, a, b: c.add(pw.HardSigmoid(a, b), [x]), 0.2, 0.5),
    "affine": (lambda c, x, a, b: _scalar_op(c, "add", _scalar_op(c, "mul", x, a), b), 1.0, 0.0),
    "scaledtanh": (lambda c, x, a, b: _scalar_op(c, "mul", c.add(make_op("tanh"), [_scalar_op(c, "mul", x, b)]), a),
                   1.0, 1.0),
}


def _scalar_op(ctx: ImportContext, name: str, x: Instruction, value: float) -> Instruction:
    return binary(ctx, name, x, ctx.literal(np.array(value, x.shape.dtype.numpy)))


def _activations(ctx: ImportContext, defaults: list[str], num_dir: int) -> list[list[Unary]]:
    """Each direction's activation functions; alpha and beta values are taken in order by the
    activations that use them, the op's defaults where the lists run out."""
    names = list(ctx.attr("activations", defaults * num_dir))
    if len(names) != len(defaults) * num_dir:
        raise ctx.error(f"attribute activations needs {len(defaults) * num_dir} names, got {len(names)}")
    alphas, betas = list(ctx.attr("activation_alpha", [])), list(ctx.attr("activation_beta", []))
    funcs: list[Unary] = []
    for name in names:
        if name.lower() not in _ACTIVATIONS:
            raise ctx.error(f"attribute activations: {name!r} is not supported "
                            f"(supported: {', '.join(sorted(_ACTIVATIONS))})")
        build, alpha, beta = _ACTIVATIONS[name.lower()]
        a = alphas.pop(0) if alpha is not None and alphas else alpha
        b = betas.pop(0) if beta is not None and betas else beta
        funcs.append(lambda x, build=build, a=a, b=b: build(ctx, x, a, b))
    n = len(defaults)
    return [funcs[d * n:(d + 1) * n] for d in range(num_dir)]


def _pick(ctx: ImportContext, x: Instruction, axis: int, start: int, stop: int | None = None) -> Instruction:
    """x[start:stop] along `axis`; with no stop the one element at `start`, the axis dropped."""
    part = ctx.add(v.Slice([axis], [start], [stop if stop is not None else start + 1]), [x])
    return part if stop is not None else ctx.add(v.Squeeze([axis]), [part])


@dataclasses.dataclass
class Cell:
    """One direction's weights and activations: what a step's gate math needs."""

    ctx: ImportContext
    hidden: int
    r: Instruction  # [gates * hidden, hidden]
    rb: Instruction | None  # [gates * hidden]
    p: Instruction | None  # LSTM peepholes [3 * hidden]
    acts: list[Unary]
    clip: float | None

    def gate(self, x: Instruction, k: int, n: int = 1) -> Instruction:
        """Gates k .. k+n-1 of a [batch, gates * hidden] value."""
        return _pick(self.ctx, x, x.shape.ndim - 1, k * self.hidden, (k + n) * self.hidden)

    def recur(self, h: Instruction, k: int, n: int) -> Instruction:
        """h R_k^T + Rb_k for gates k .. k+n-1."""
        ctx, rows = self.ctx, (k * self.hidden, (k + n) * self.hidden)
        out = matmul(ctx, h, ctx.add(v.Transpose([1, 0]), [_pick(ctx, self.r, 0, *rows)]))
        return binary(ctx, "add", out, _pick(ctx, self.rb, 0, *rows)) if self.rb is not None else out

    def act(self, k: int, x: Instruction, clip: bool = True) -> Instruction:
        if clip and self.clip is not None:
            lo, hi = (self.ctx.literal(np.array(c, x.shape.dtype.numpy)) for c in (-self.clip, self.clip))
            x = self.ctx.add(pw.Clip(), self.ctx.broadcast(x, lo, hi))
        return self.acts[k](x)

    def peephole(self, x: Instruction, k: int, c: Instruction) -> Instruction:
        return binary(self.ctx, "add", x, binary(self.ctx, "mul", self.gate(self.p, k), c)) if self.p is not None else x


Step = Callable[[Cell, Instruction, list[Instruction]], list[Instruction]]


@dataclasses.dataclass
class _Lens:
    """Sequence lengths: none (all full), known at import, or read at run time ([batch] int64)."""

    steps: int
    value: np.ndarray | None
    ins: Instruction | None

    @property
    def full(self) -> bool:
        return self.ins is None or (self.value is not None and bool(np.all(self.value >= self.steps)))

    def running(self, ctx: ImportContext, t: int, like: Instruction) -> Instruction | None:
        """Where sequences are still running at step t, broadcast to `like`; None where all are."""
        if self.full or (self.value is not None and np.all(self.value > t)):
            return None
        assert self.ins is not None
        keep = binary(ctx, "less", ctx.literal(np.array(t, np.int64)), ctx.add(v.Unsqueeze([1]), [self.ins]))
        return ctx.broadcast(keep, like)[0]

    def nonempty(self, ctx: ImportContext, like: Instruction) -> Instruction | None:
        """Where sequences have any element, broadcast to `like`; None where all do. An empty
        sequence's final states are zeros, not the initial ones (as ONNX Runtime gives them)."""
        if self.full or (self.value is not None and np.all(self.value > 0)):
            return None
        return self.running(ctx, 0, like)

    def reversal(self, ctx: ImportContext, width: int) -> Instruction:
        """[steps, batch, width] indices along time: each sequence backwards from its own end."""
        assert self.ins is not None
        t = ctx.literal(np.arange(self.steps, dtype=np.int64).reshape(-1, 1))
        n = ctx.add(v.Unsqueeze([0]), [self.ins])
        back = binary(ctx, "sub", binary(ctx, "sub", n, ctx.literal(np.array(1, np.int64))), t)
        idx = ctx.add(pw.Where(), ctx.broadcast(binary(ctx, "less", t, n), back, t))
        idx = ctx.add(v.Unsqueeze([2]), [idx])
        return ctx.add(v.MultiBroadcast(idx.shape.lens[:2] + (width,)), [idx])


def _lengths(ctx: ImportContext, lens: Instruction | None, steps: int) -> _Lens:
    """Lengths known at import must lie in [0, steps]; those read at run time are clamped there, so
    that the reversal gathers in bounds."""
    if lens is None:
        return _Lens(steps, None, None)
    lens = ctx.convert(lens, DType.int64)
    value = ctx.const(lens)
    if value is not None and (np.any(value < 0) or np.any(value > steps)):
        raise ctx.error(f"sequence_lens {value.tolist()} outside [0, {steps}]")
    if value is None:
        lo, hi = ctx.literal(np.array(0, np.int64)), ctx.literal(np.array(steps, np.int64))
        lens = ctx.add(pw.Clip(), ctx.broadcast(lens, lo, hi))
    return _Lens(steps, value, lens)


def _zeros(ctx: ImportContext, like: Instruction, lens: tuple[int, ...] | None = None) -> Instruction:
    zero = ctx.literal(np.zeros((), like.shape.dtype.numpy))
    return ctx.add(v.MultiBroadcast(lens or like.shape.lens), [zero])


def _stack(ctx: ImportContext, parts: list[Instruction], axis: int) -> Instruction:
    parts = [ctx.add(v.Unsqueeze([axis]), [p]) for p in parts]
    return parts[0] if len(parts) == 1 else ctx.add(Concat(axis), parts)


def _direction(ctx: ImportContext, cell: Cell, step: Step, xw: Instruction, states: list[Instruction],
               lens: _Lens, reverse: bool) -> tuple[Instruction, list[Instruction]]:
    """One direction over the sequence: its outputs [steps, batch, hidden] and final states."""
    steps = xw.shape.lens[0]
    gathered = reverse and not lens.full
    if gathered:
        xw = ctx.add(GatherElements(0), [xw, lens.reversal(ctx, xw.shape.lens[2])])
    order = range(steps - 1, -1, -1) if reverse and not gathered else range(steps)
    ys: dict[int, Instruction] = {}
    for s, t in enumerate(order):
        new = step(cell, _pick(ctx, xw, 0, t), states)
        keep = lens.running(ctx, s, new[0])
        if keep is not None:
            ys[t] = ctx.add(pw.Where(), [keep, new[0], _zeros(ctx, new[0])])
            new = [ctx.add(pw.Where(), [keep, a, b]) for a, b in zip(new, states)]
        else:
            ys[t] = new[0]
        states = new
    some = lens.nonempty(ctx, states[0])
    if some is not None:
        states = [ctx.add(pw.Where(), [some, x, _zeros(ctx, x)]) for x in states]
    y = _stack(ctx, [ys[t] for t in range(steps)], 0)
    if gathered:
        y = ctx.add(GatherElements(0), [y, lens.reversal(ctx, y.shape.lens[2])])
    return y, states


def _check_shapes(ctx: ImportContext, opt: list[Instruction | None], expected: dict[int, tuple[int, ...]]) -> None:
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    for k, lens in expected.items():
        if opt[k] is not None and opt[k].shape.lens != lens:  # type: ignore[union-attr]
            raise ctx.error(f"input {names[k]} has shape {list(opt[k].shape.lens)}, "  # type: ignore[union-attr]
                            f"expected {list(lens)} (from X, hidden_size, direction and layout)")


def _cell(ctx: ImportContext, opt: list[Instruction | None], d: int, gates: int, hidden: int, acts: list[Unary],
          flat: Instruction) -> tuple[Cell, Instruction]:
    """Direction d's cell and its input projection X W^T + Wb of every step, [steps * batch, gates * hidden]."""
    w, r, b, p = opt[1], opt[2], opt[3], opt[7]
    n = gates * hidden
    xw = matmul(ctx, flat, ctx.add(v.Transpose([1, 0]), [_pick(ctx, w, 0, d)]))  # type: ignore[arg-type]
    if b is not None:
        b = _pick(ctx, b, 0, d)
        xw = binary(ctx, "add", xw, _pick(ctx, b, 0, 0, n))
    cell = Cell(ctx, hidden, _pick(ctx, r, 0, d), _pick(ctx, b, 0, n, 2 * n) if b is not None else None,  # type: ignore[arg-type]
                _pick(ctx, p, 0, d) if p is not None else None, acts, ctx.attr("clip"))
    return cell, xw


def _recurrent(ctx: ImportContext, ins: list[Instruction | None], gates: int, acts: list[str], step: Step,
               n_states: int) -> list[Instruction]:
    """What RNN, GRU and LSTM share: attributes, weights per direction, the unrolled directions
    and the outputs Y, Y_h (and Y_c) in the requested layout."""
    x, r = ins[0], ins[2]
    if x is None or ins[1] is None or r is None:
        raise ctx.error("inputs X, W and R are required")
    opt = ins + [None] * (8 - len(ins))
    direction = ctx.check_attr("direction", ctx.attr("direction", "forward"), ("forward", "reverse", "bidirectional"))
    layout = ctx.check_attr("layout", ctx.attr("layout", 0), (0, 1))
    num_dir = 2 if direction == "bidirectional" else 1
    if layout:
        x = ctx.add(v.Transpose([1, 0, 2]), [x])
    steps, batch, width = x.shape.lens
    hidden = int(ctx.attr("hidden_size", r.shape.lens[-1]))
    state = (batch, num_dir, hidden) if layout else (num_dir, batch, hidden)
    _check_shapes(ctx, opt, {1: (num_dir, gates * hidden, width), 2: (num_dir, gates * hidden, hidden),
                             3: (num_dir, 2 * gates * hidden), 4: (batch,), 5: state, 6: state, 7: (num_dir, 3 * hidden)})
    funcs = _activations(ctx, acts, num_dir)
    lens = _lengths(ctx, opt[4], steps)
    zeros = _zeros(ctx, x, state)
    initial = [opt[k] if opt[k] is not None else zeros for k in (5, 6)[:n_states]]
    initial = [ctx.add(v.Transpose([1, 0, 2]), [s]) if layout else s for s in initial]  # type: ignore[list-item]
    flat = ctx.add(v.Reshape([steps * batch, width]), [x])
    ys, finals = [], []
    for d in range(num_dir):
        cell, xw = _cell(ctx, opt, d, gates, hidden, funcs[d], flat)
        xw = ctx.add(v.Reshape([steps, batch, gates * hidden]), [xw])
        y, states = _direction(ctx, cell, step, xw, [_pick(ctx, s, 0, d) for s in initial], lens,  # type: ignore[arg-type]
                               direction == "reverse" or d == 1)
        ys.append(y)
        finals.append(states)
    y = _stack(ctx, ys, 1)
    outs = [ctx.add(v.Transpose([2, 0, 1, 3]), [y]) if layout else y]
    for k in range(n_states):
        s = _stack(ctx, [f[k] for f in finals], 0)
        outs.append(ctx.add(v.Transpose([1, 0, 2]), [s]) if layout else s)
    return outs


def _rnn_step(cell: Cell, xw: Instruction, states: list[Instruction]) -> list[Instruction]:
    return [cell.act(0, binary(cell.ctx, "add", xw, cell.recur(states[0], 0, 1)))]


def _gru_step(cell: Cell, xw: Instruction, states: list[Instruction], linear_before_reset: bool) -> list[Instruction]:
    ctx, h = cell.ctx, states[0]
    zr = cell.act(0, binary(ctx, "add", cell.gate(xw, 0, 2), cell.recur(h, 0, 2)))
    z, r = cell.gate(zr, 0), cell.gate(zr, 1)
    if linear_before_reset:
        hidden = binary(ctx, "mul", r, cell.recur(h, 2, 1))
    else:
        hidden = cell.recur(binary(ctx, "mul", r, h), 2, 1)
    hh = cell.act(1, binary(ctx, "add", cell.gate(xw, 2), hidden))
    return [binary(ctx, "add", hh, binary(ctx, "mul", z, binary(ctx, "sub", h, hh)))]


def _lstm_step(cell: Cell, xw: Instruction, states: list[Instruction], input_forget: bool) -> list[Instruction]:
    ctx, (h, c) = cell.ctx, states
    g = binary(ctx, "add", xw, cell.recur(h, 0, 4))
    i = cell.act(0, cell.peephole(cell.gate(g, 0), 0, c))
    if input_forget:
        f = binary(ctx, "sub", ctx.literal(np.array(1, i.shape.dtype.numpy)), i)
    else:
        f = cell.act(0, cell.peephole(cell.gate(g, 2), 2, c))
    c_new = binary(ctx, "add", binary(ctx, "mul", f, c), binary(ctx, "mul", i, cell.act(1, cell.gate(g, 3))))
    o = cell.act(0, cell.peephole(cell.gate(g, 1), 1, c_new))
    return [binary(ctx, "mul", o, cell.act(2, c_new, clip=False)), c_new]


@onnx_op("RNN")
def parse_rnn(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    return _recurrent(ctx, ins, 1, ["Tanh"], _rnn_step, 1)


@onnx_op("GRU")
def parse_gru(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    linear = bool(ctx.attr("linear_before_reset", 0))
    return _recurrent(ctx, ins, 3, ["Sigmoid", "Tanh"], lambda c, x, s: _gru_step(c, x, s, linear), 1)


@onnx_op("LSTM")
def parse_lstm(ctx: ImportContext, ins: list[Instruction | None]) -> list[Instruction]:
    forget = bool(ctx.check_attr("input_forget", ctx.attr("input_forget", 0), (0, 1)))
    return _recurrent(ctx, ins, 4, ["Sigmoid", "Tanh", "Tanh"], lambda c, x, s: _lstm_step(c, x, s, forget), 2)
