"""Attention found in plain ops: `dot(q, kᵀ)`, scalar scales, masks, softmax, `dot(·, v)`
become one `attention` anchor.

Exporters write attention as the ops it is made of: a product of Q and Kᵀ, a multiplication
or division by a constant (on Q, on K, on the scores, or on two of them), optional additive
masks (a padding mask broadcast over heads, a causal triangle, a relative position bias, a
`where` against a large negative fill), a softmax over the keys (maybe in float32, between
conversions) and a product with V. Split into kernels, the scores
make a round trip through memory and each scale is a kernel of its own. Here the scales fold
into the anchor's `scale`, a constant causal triangle into `causal`, and Q, K and V are read
through whatever views lie between them and their producers (the head split of the QKV
projection), so fusion gives one kernel with the head merge as its epilogue.

Runs before anchor fusion, after canonicalization has folded constant masks to literals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.anchors import Dot
from fusegraph.ops.attention import Attention, causal_keep
from fusegraph.ops.base import OpKind, make_op
from fusegraph.ops.pointwise import Convert
from fusegraph.ops.source import make_literal
from fusegraph.ops.views import MultiBroadcast, Reshape, Transpose
from fusegraph.passes.literal_values import broadcast_literal
from fusegraph.passes.rewrite import rewrite_each

# A fill at or below this is "minus infinity" to a softmax: exp(-1e4 + any score seen in
# practice) is 0 in float32, so a large negative fill drops scores as -inf would.
LARGE_NEGATIVE = -1e4


@dataclass
class _Mask:
    """What the scores add before the softmax: an additive tensor, or `where(cond, s, fill)`
    (keeping the scores where `cond == keep`); `at` is the add or where, whose shape the mask
    has (the softmax's up to a reshape of the batch dims)."""

    at: Instruction
    additive: Instruction | None = None
    cond: Instruction | None = None
    fill: float = 0.0
    keep: bool = True


@dataclass
class _Scores:
    """The scores feeding a softmax: the product, the folded scale and the masks (added in
    dataflow order)."""

    dot: Instruction
    scale: float = 1.0
    masks: list[_Mask] = field(default_factory=list)


def uniform_value(ins: Instruction) -> float | None:
    """The one value of a constant whose elements are all equal (a scale seen through its
    broadcast); None for anything else."""
    v = broadcast_literal(ins)
    if v is None or v.size == 0 or v.dtype.kind not in "fiu":
        return None
    first = v.reshape(-1)[0]
    return float(first) if bool((v == first).all()) else None


def _scalar_factor(x: Instruction) -> tuple[Instruction, float] | None:
    """`(y, c)` when `x` is `y * c`, `c * y` or `y / c` for a constant scalar c."""
    if x.op.algebra == "product":
        for i in (0, 1):
            c = uniform_value(x.inputs[1 - i])
            if c is not None:
                return x.inputs[i], c
    if x.op.algebra == "quotient":
        c = uniform_value(x.inputs[1])
        if c:
            return x.inputs[0], 1.0 / c
    return None


def _mask_steps(x: Instruction) -> list[tuple[Instruction, _Mask]]:
    """The ways `x` can be (scores, mask): an add of either operand, or a `where` with a
    large negative constant on one side."""
    if x.op.algebra == "sum":
        return [(x.inputs[i], _Mask(x, additive=x.inputs[1 - i])) for i in (0, 1)]
    if x.op.algebra == "select":
        cond, a, b = x.inputs
        out = []
        for inner, other, keep in ((a, b, True), (b, a, False)):
            fill = uniform_value(other)
            if fill is not None and fill <= LARGE_NEGATIVE:
                out.append((inner, _Mask(x, cond=cond, fill=fill, keep=keep)))
        return out
    return []


def _passes_through(x: Instruction) -> bool:
    """Whether the scores may pass `x` unchanged in value: a conversion between float types
    (a softmax computed in float32), or a row-major reshape of the batch dims (Swin's windows
    regrouped to add their mask) that keeps the [query, key] dims."""
    if x.op.converts_type:
        return x.shape.dtype.is_float and x.inputs[0].shape.dtype.is_float
    return (x.op.kind == OpKind.VIEW and x.op.keeps_order and x.shape.ndim >= 2 and x.inputs[0].shape.ndim >= 2
            and x.shape.lens[-2:] == x.inputs[0].shape.lens[-2:])


def find_scores(x: Instruction, users: dict[Instruction, list[Instruction]], returned: set[int],
                allow_mask: bool = True) -> _Scores | None:
    """The scores behind softmax input `x`: a `Dot` under scalar scales and then masks (a
    relative position bias, a window or padding mask; a scale after a mask would scale the
    mask too), through conversions and batch reshapes anywhere."""
    if isinstance(x.op, Dot):
        return _Scores(x) if len(users[x]) == 1 and id(x) not in returned else None
    if len(users[x]) != 1 or id(x) in returned:
        return None
    if _passes_through(x):
        return find_scores(x.inputs[0], users, returned, allow_mask)
    step = _scalar_factor(x)
    if step is not None:
        got = find_scores(step[0], users, returned, allow_mask=False)
        if got is not None:
            got.scale *= step[1]
            return got
    for inner, mask in _mask_steps(x) if allow_mask else []:
        got = find_scores(inner, users, returned)
        if got is not None:
            got.masks.append(mask)
            return got
    return None


def unscaled(module: Module, x: Instruction, before: Instruction) -> tuple[Instruction, float]:
    """`x` as `y' * c`: the scalar factors of a product operand taken out from under the views
    between them and the product (`transpose(k * c)` -> `transpose(k)` and c). The views are
    built again on the unscaled value, before `before`; the scaled value stays for any other
    reader."""
    views = []
    cur = x
    while cur.op.kind == OpKind.VIEW and cur.inputs:
        views.append(cur)
        cur = cur.inputs[0]
    step = _scalar_factor(cur)
    if step is None:
        return x, 1.0
    inner, factor = step
    for view in reversed(views):
        inner = module.insert_before(before, module.make(view.op, [inner, *view.inputs[1:]], view.origin))
    rest, more = unscaled(module, inner, before)
    return rest, factor * more


def constant_mask_kind(value: np.ndarray, sq: int, sk: int) -> str | None:
    """`zero` when an additive mask's constant value adds nothing, `causal` when it is the
    causal triangle (0 where `causal_keep`, large negative above) for every batch entry and
    head; None otherwise."""
    if value.ndim < 2 or value.shape[-2] not in (1, sq) or value.shape[-1] not in (1, sk):
        return None
    rows = value.reshape(-1, *value.shape[-2:]).astype(np.float64)
    if not bool((rows == rows[:1]).all()):
        return None
    plane = np.broadcast_to(rows[0], (sq, sk))
    if bool((plane == 0).all()):
        return "zero"
    keep = causal_keep(sq, sk)
    if bool((plane[keep] == 0).all()) and bool((plane[~keep] <= LARGE_NEGATIVE).all()):
        return "causal"
    return None


def _broadcast(module: Module, value: Instruction, lens: tuple[int, ...], before: Instruction) -> Instruction:
    module.insert_before(before, value)
    return module.insert_before(before, module.make(MultiBroadcast(lens), [value]))


def mask_input(module: Module, masks: list[_Mask], lens: tuple[int, ...], before: Instruction) -> tuple[Instruction | None, bool]:
    """The attention's additive mask input of shape `lens` (None for none) and whether it is
    causal. A constant mask that adds nothing or draws the causal triangle is dropped (the
    kernel then reads no mask and, when causal, skips the key tiles past the diagonal); a
    `where` becomes the additive mask `where(cond, 0, fill)`, a literal when the condition is
    constant. A mask added before a batch reshape is read through the same reshape; several
    masks are summed (in the order the scores met them)."""
    total, causal = None, False
    for mask in masks:
        out, is_causal = _mask_value(module, mask, before)
        causal = causal or is_causal
        if out is None:
            continue
        if out.shape.lens != lens:
            out = module.insert_before(before, module.make(Reshape(lens), [out], out.origin))
        if total is not None:
            if out.shape.dtype != total.shape.dtype:
                out = module.insert_before(before, module.make(Convert(total.shape.dtype), [out], out.origin))
            out = module.insert_before(before, module.make(make_op("add"), [total, out], out.origin))
        total = out
    return total, causal


def _mask_value(module: Module, mask: _Mask, before: Instruction) -> tuple[Instruction | None, bool]:
    """The additive mask in the shape of the add or where it came from, and causality."""
    lens, dtype = mask.at.shape.lens, mask.at.shape.dtype.numpy
    sq, sk = lens[-2:]
    if mask.additive is not None:
        value = broadcast_literal(mask.additive)
        kind = constant_mask_kind(value, sq, sk) if value is not None else None
        return (None, kind == "causal") if kind else (mask.additive, False)
    assert mask.cond is not None
    cond = broadcast_literal(mask.cond)
    if cond is not None:
        add = np.where(cond.astype(bool) == mask.keep, 0.0, mask.fill).astype(dtype)
        kind = constant_mask_kind(add, sq, sk)
        if kind:
            return None, kind == "causal"
        return _broadcast(module, make_literal(add, origin=mask.cond.origin), lens, before), False
    zero = _broadcast(module, make_literal(np.array(0, dtype)), lens, before)
    fill = _broadcast(module, make_literal(np.array(mask.fill, dtype)), lens, before)
    sides = [zero, fill] if mask.keep else [fill, zero]
    where = module.make(make_op("where"), [mask.cond, *sides], mask.cond.origin)
    return module.insert_before(before, where), False


class FuseAttention:
    """Each `softmax(scale · dot(q, kᵀ) + mask)` read only by `dot(·, v)` becomes one
    `attention` instruction; the scores and the softmax are left to dead-code removal."""

    name = "fuse_attention"

    def apply(self, module: Module) -> bool:
        return rewrite_each(module, lambda ins: self.rewrite(module, ins), drop_dead=True)

    def rewrite(self, module: Module, sm: Instruction) -> bool:
        op = sm.op
        if op.algorithm != "softmax" or op.attrs.get("log") or op.attrs.get("axis") != sm.shape.ndim - 1:
            return False
        users = module.users()
        returned = {id(r) for r in module.returns}
        pv = value_product(sm, users, returned)
        scores = find_scores(sm.inputs[0], users, returned) if pv is not None else None
        if pv is None or scores is None or scores.dot.inputs[0].shape.dtype != pv.inputs[1].shape.dtype:
            return False
        batch = pv.shape.lens[:-2]
        q, q_scale = unscaled(module, scores.dot.inputs[0], pv)
        kt, k_scale = unscaled(module, scores.dot.inputs[1], pv)
        r = kt.shape.ndim
        k = module.insert_before(pv, module.make(Transpose([*range(r - 2), r - 1, r - 2]), [kt], kt.origin))
        q, k = (_with_batch(module, x, batch, pv) for x in (q, k))
        mask, causal = mask_input(module, scores.masks, sm.shape.lens, pv)
        scale = scores.scale * q_scale * k_scale
        inputs = [q, k, pv.inputs[1]] + ([mask] if mask is not None else [])
        att = module.make(Attention(scale, causal), inputs, sm.origin or pv.origin)
        module.replace(pv, att)
        return True


def value_product(sm: Instruction, users: dict[Instruction, list[Instruction]], returned: set[int]) -> Instruction | None:
    """The `dot(softmax, v)` that alone reads softmax `sm`, through a float conversion (a
    softmax computed in float32 read in float16) and the exporters' `where(isnan(p), 0, p)`
    (zeros for a fully masked row, what the attention op gives anyway); or None."""
    x = sm
    while id(x) not in returned:
        readers = users.get(x, [])
        guard = _nan_guard(x, readers, users)
        if guard is not None:
            x = guard
            continue
        if len(readers) != 1:
            return None
        (reader,) = readers
        if not (reader.op.converts_type and reader.shape.dtype.is_float):
            ok = isinstance(reader.op, Dot) and reader.inputs[0] is x and reader.inputs[1] is not x
            return reader if ok else None
        x = reader
    return None


def _nan_guard(x: Instruction, readers: list[Instruction], users: dict[Instruction, list[Instruction]]) -> Instruction | None:
    """The `where(isnan(x), 0, x)` that, with its `isnan`, alone reads `x`; else None."""
    if len(readers) != 2:
        return None
    nan = [r for r in readers if r.op.algebra == "nan_test"]
    guard = [r for r in readers if r.op.algebra == "select"]
    if len(nan) != 1 or len(guard) != 1 or users.get(nan[0]) != guard:
        return None
    w = guard[0]
    return w if w.inputs[0] is nan[0] and w.inputs[2] is x and uniform_value(w.inputs[1]) == 0 else None


def _with_batch(module: Module, x: Instruction, batch: tuple[int, ...], before: Instruction) -> Instruction:
    """`x` [..., S, D] with the batch dims `batch` (a row-major reshape), as the product with V has them."""
    if x.shape.lens[:-2] == batch:
        return x
    return module.insert_before(before, module.make(Reshape([*batch, *x.shape.lens[-2:]]), [x], x.origin))
