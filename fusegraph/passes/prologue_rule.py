"""Which producers of a product anchor's input its kernel computes in its own tile loads.

A convolution or matrix product reads its A operand through `GroupBuilder.gather`; a producer
this rule accepts is computed there, at the index the tile reads, instead of by a kernel of its
own that writes a tensor the anchor then reads back. The rule, per producer P of the A operand
(looked at from the anchor, through views):

* P is pointwise (an activation, a cast, the squeeze-and-excitation scale `x * s` read through
  a broadcast): computed inside when no other kernel needs it stored (every reader, through
  views, is the anchor or a value computed inside; or a reduction, whose kernel computes its
  pointwise producers again; or a pointwise op on P and constants whose readers pass the same
  test: `only_inside`), or when every reader is a product
  that recomputes it cheaply, `pointwise_ops(P) * reads_per_element(reader) <= RECOMPUTE_BUDGET`
  (this anchor included). Either way P's own kernel and the round trip of its tensor through
  memory go away; the price is P's arithmetic repeated at every read of an element, which is
  free beside a product's multiply-adds when P has no other reader (its kernel would have cost
  a write and a read of every element), and kept small by the budget when several products
  repeat it. A P that another kind of reader needs keeps its kernel, and the anchor reads it.
  A P computed from reductions' outputs and constants alone and read through a broadcast (a
  group's `1 / sqrt(var + eps)`) is left to the reduction's epilogue, computed once per value.
* P is a concat nothing outside reads, with a part that concat elimination would have to copy
  (a view such as a nearest resize, or a program input or constant): the kernel selects between
  the parts by the index range (`Select`). A concat of kernel outputs only stays: its parts
  are written in place into one buffer already, at no cost, and a select would only add masks.
* P is a layernorm (or an RMS norm) over the last axis (of one input, its affine folded into
  the weights by `fold_norm_affine`, or of three: x and gamma, beta broadcast to it), read by
  this product along that axis (its K) with each row whole, the product having at most
  `NORM_PROLOGUE_MAX_ROWS` rows or the rows at most `NORM_PROLOGUE_ANY_ROWS_K` elements (else the
  norm's own kernel measured cheaper, and `defer_norm` moves the norm past the products where it
  can, leaving its statistics): the kernel computes the row
  statistics and normalizes, the affine applied (`templates/gemm_prologue.py`: in the k loop
  and after the product, or in a loop of their own before it). When every other reader is a
  product reading its rows the same way, each computes it and nothing stores it. Otherwise (a residual add reads it,
  as in BERT's post-norm layers, or it is returned) it keeps its own kernel, which measured
  faster; with `FUSEGRAPH_STORE_NORMS=1` the first product in program order that
  reads it as A through a bijective map (`FuseAnchors` visits anchors in that order) computes
  it and also stores it, whole, as a further output of its group (`stored`): its other
  readers, other products included, read that tensor, and the layernorm's own kernel goes
  away. The store is refused where a concat reads it (a further output would be copied into
  the concat's buffer, while the layernorm's kernel writes there in place), and `FuseAnchors`
  builds the group again without it when the group would read a value computed from what it
  stores (a cycle once placed: a weight or an epilogue side input computed from it).
* Reductions (other than that layernorm), anchors and data movement are never computed inside.

Only product anchors (family `gemm`) take computed prologues, and only on A: the weights stay
a plain load, which their layout and tiling rely on.
"""

from __future__ import annotations

import math
import os

from fusegraph.ir.index_expr import free_vars
from fusegraph.ir.index_map import IndexMap
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind, view_source
from fusegraph.ops.base import input_map_of as view_input_map
from fusegraph.passes.literal_values import broadcast_literal

RECOMPUTE_BUDGET = 8  # pointwise ops per element of A, summed over its reads, for a value also computed elsewhere
N_TILE = 128  # the widest N tile of the GEMM template: each N tile reads all of A once
# A layernorm in a product's prologue is computed again by every N tile, each first walking its
# rows' K for the statistics; its own kernel costs a launch and a round trip of its rows. Measured
# on an H100 (fp16, Triton 3.6; one product, end to end in a CUDA graph) the prologue won with
# short rows at any count (ConvNeXt-T's and Swin-T's first stage, 3136 rows of 96) and with few
# rows (ViT-S/16 at batch 1, 197 of 384: 0.354 ms against 0.372 split), was even at 256 rows of
# 384, and lost beyond (512 rows of 384: 11.9 against 11.2 us; 4096: 40.8 against 30.0 us; 512
# of 768: 22.2 against 15.3 us; ViT-S/16 at batch 32: 1.338 against 1.231 ms).
NORM_PROLOGUE_MAX_ROWS = 256
NORM_PROLOGUE_ANY_ROWS_K = 192  # rows this short are normalized inside at any count (none measured longer)
# A layernorm that other readers need too (BERT's post-norms) is computed in the product and
# stored by it only on request: the stored rows cost more than the norm's own kernel at every
# batch measured (BERT-base on an H100, fp16: batch 1 0.612 ms stored against 0.442 split,
# batch 8 1.160 against 0.744, batch 32 3.092 against 2.195).
STORE_NORMS_ENV = "FUSEGRAPH_STORE_NORMS"


def norms_stored() -> bool:
    """Whether a product may compute and store a layernorm that other ops read too (`STORE_NORMS_ENV`)."""
    return os.environ.get(STORE_NORMS_ENV) == "1"


def reads_per_element(anchor: Instruction) -> int:
    """How often the anchor's kernel loads each element of A: once per N tile (of `N_TILE`
    output channels per group) and, for a convolution, once per window tap covering it,
    taps / stride on average (a 3x3 stride-1 convolution: 9 per N tile)."""
    op = anchor.op
    w = anchor.inputs[op.weight_input] if op.weight_input is not None else None
    n = anchor.shape.lens[op.channel_axis(anchor.shape.ndim)] // op.attrs.get("group", 1)
    taps = math.prod(w.shape.lens[2:]) if w is not None and not op.k_is_last_axis else 1  # a window's taps
    if op.spatial_window:
        taps = -(-taps // math.prod(op.attrs["stride"]))
    return max(1, taps) * -(-n // N_TILE)


def pointwise_ops(ins: Instruction) -> int:
    """The pointwise ops computing `ins` from non-pointwise values (through views), each once."""
    seen: set[int] = set()
    stack = [ins]
    while stack:
        x = view_source(stack.pop())
        if x.op.kind == OpKind.POINTWISE and id(x) not in seen:
            seen.add(id(x))
            stack.extend(x.inputs)
    return len(seen)


class PrologueRule:
    """The rule above for one anchor of `module`: `__call__` is `GroupBuilder`'s `inline`
    predicate while the anchor's A operand is gathered; `inside` grows with what it accepts."""

    def __init__(self, module: Module, anchor: Instruction, may_store: bool | None = None) -> None:
        self.anchor, self.module = anchor, module
        self.users = module.users()
        self.returned = {id(r) for r in module.returns}
        self.inside: set[int] = {id(anchor)}
        self.reads = reads_per_element(anchor) if anchor.op.family == "gemm" else 0
        self.may_store = norms_stored() if may_store is None else may_store
        self.stored: list[Instruction] = []  # layernorms the kernel computes and also stores for other readers

    def __call__(self, ins: Instruction, at: IndexMap | None = None) -> bool:
        if self.anchor.op.family != "gemm":
            return False
        if ins.op.kind == OpKind.POINTWISE:
            ok = not self.reduction_tail(ins, at) and (self.only_inside(ins) or self.cheap_everywhere(ins))
        elif ins.op.concatenates:
            ok = self.only_inside(ins) and any(_needs_copy(x, ins.op.attrs["axis"]) for x in ins.inputs)
        elif ins.op.algorithm == "layernorm":
            ok = at is not None and self.normalizes_k(ins, at)
        else:
            ok = False
        if ok:
            self.inside.add(id(ins))
        return ok

    def readers(self, ins: Instruction) -> list[Instruction] | None:
        """The non-view readers of `ins` through views; None when it or a view of it is returned."""
        out, returned = self._readers(ins)
        return None if returned else out

    def _readers(self, ins: Instruction) -> tuple[list[Instruction], bool]:
        """The non-view readers of `ins` through views, and whether it or a view of it is returned."""
        out, stack, returned = [], [ins], False
        while stack:
            x = stack.pop()
            returned = returned or id(x) in self.returned
            for u in self.users.get(x, []):
                (stack if view_input_map(u) is not None else out).append(u)
        return out, returned

    def read_outside(self, values: list[Instruction], members: list[Instruction]) -> list[Instruction]:
        """Those of `values` that are returned or read (through views) by something neither
        computed in the prologue nor one of the epilogue's `members`: what the group must
        store. An epilogue member reading one at the anchor's index reads the computed value."""
        group = self.inside | {id(m) for m in members}
        out = []
        for x in values:
            readers, returned = self._readers(x)
            if returned or any(id(u) not in group for u in readers):
                out.append(x)
        return out

    def constant_tails(self, x: Instruction, members: list[Instruction]) -> tuple[list[Instruction], list[Instruction]] | None:
        """When every reader of stored value `x` outside the group is a pointwise op on `x` and
        constants (a layernorm's affine, `fold_norm_affine` having moved it out of the norm
        for the products), the kernel computes those too and stores what they lead to
        instead of `x`: the ops (in program order) and those whose values are stored (read
        by something else, or returned). None: `x` itself is stored."""
        group = self.inside | {id(m) for m in members}
        readers, returned = self._readers(x)
        outside = [u for u in readers if id(u) not in group]
        if returned or not outside or not all(_on_constants(u, x) for u in outside):
            return None
        ops: list[Instruction] = []
        ends: list[Instruction] = []
        seen: set[int] = set()
        stack = list(outside)
        while stack:
            u = stack.pop()
            if id(u) in seen:
                continue
            seen.add(id(u))
            ops.append(u)
            readers = self.users.get(u, [])
            if id(u) in self.returned or not readers or not all(_on_constants(r, u) for r in readers):
                ends.append(u)
            else:
                stack.extend(readers)
        order = {id(i): k for k, i in enumerate(self.module)}
        return sorted(ops, key=lambda i: order[id(i)]), ends

    def only_inside(self, ins: Instruction) -> bool:
        """Whether no kernel but this one needs `ins` stored. Each reader (through views) must
        be computed inside; or be a reduction reading a pointwise `ins` (a reduction's kernel
        computes its pointwise producers again where it reads them, `FuseReductions`); or be a
        pointwise op on `ins` and constants alone (no epilogue can take it, since it reads no
        anchor's output) whose own readers pass the same test, the anchor itself only through
        A. SiLU's `y * sigmoid(y)` asks about y before sigmoid(y) is in; GroupNorm's centered
        `d = x - mean`, read by the normalization and by the variance's `d * d`, is computed
        here and again in the variance's kernel, never stored."""
        return self._needed_inside_only(ins, {id(ins)}, {}, top=True)

    def _needed_inside_only(self, ins: Instruction, cone: set[int], known: dict[int, bool], top: bool = False) -> bool:
        if id(ins) in known:
            return known[id(ins)]
        readers = self.readers(ins)
        recomputed = ins.op.kind == OpKind.POINTWISE
        ok = readers is not None and all(
            (id(u) in self.inside and (top or u is not self.anchor or reads_as_a(u, ins)))
            or (recomputed and u.op.kind == OpKind.REDUCE)
            or (recomputed and u.op.kind == OpKind.POINTWISE and _reads_only(u, cone)
                and self._needed_inside_only(u, cone | {id(u)}, known))
            for u in readers)
        known[id(ins)] = ok
        return ok

    def reduction_tail(self, ins: Instruction, at: IndexMap | None) -> bool:
        """Whether `ins` is pointwise on reductions' outputs (and constants) only, read here
        through a broadcast: GroupNorm's `1 / sqrt(var + eps)`, one value per group. It joins
        the reduction's kernel as its epilogue (`FuseReductions` runs after the anchors),
        computed once per value instead of at every read of this anchor's tiles."""
        return at is not None and _on_reductions(ins) and at.inverse() is None

    def cheap_everywhere(self, ins: Instruction) -> bool:
        """Whether every reader of `ins` (through views) is a product whose A it is and that
        repeats its arithmetic within the budget, or a value already computed inside."""
        readers, ops = self.readers(ins), pointwise_ops(ins)
        if readers is None or ops * self.reads > RECOMPUTE_BUDGET:
            return False
        return all(id(u) in self.inside or reads_as_a(u, ins) and ops * reads_per_element(u) <= RECOMPUTE_BUDGET
                   for u in readers)

    def normalizes_k(self, ln: Instruction, at: IndexMap) -> bool:
        """A layernorm over its last axis, read by this product's A at rows that keep that
        axis whole (`at` sends the last index to the last). Computed without a store when its
        other readers are matrix products reading it as A (each computes the statistics);
        else also stored when the rule may store (`STORE_NORMS_ENV`), where `at` reaches
        each element once and no concat reads it."""
        rank = ln.shape.ndim
        if ln.op.attrs["axis"] != rank - 1 or not self.anchor.op.k_is_last_axis:
            return False
        if not keeps_last_axis(at, ln.shape.lens[-1]):
            return False
        if not norm_fits_product(ln, self.anchor):
            return False
        readers, returned = self._readers(ln)
        if not returned and all(id(u) in self.inside or reads_rows(u, ln) for u in readers):
            return True
        if any(x is ln for x in self.stored):
            return True  # read again at another map: computed again, stored once
        if not self.may_store or at.inverse() is None or any(u.op.concatenates for u in readers):
            return False
        self.stored.append(ln)
        return True


def norm_fits_product(ln: Instruction, anchor: Instruction) -> bool:
    """Whether a product computing `ln`'s statistics in its own tiles measured no slower than
    the norm's own kernel: short rows, or few of them (`NORM_PROLOGUE_MAX_ROWS`)."""
    return ln.shape.lens[-1] <= NORM_PROLOGUE_ANY_ROWS_K or product_rows(anchor) <= NORM_PROLOGUE_MAX_ROWS


def product_rows(anchor: Instruction) -> int:
    """The rows M of a matrix product's output: its elements over its N (output channels)."""
    return anchor.shape.elements // max(1, anchor.shape.lens[anchor.op.channel_axis(anchor.shape.ndim)])


def keeps_last_axis(at: IndexMap, k: int) -> bool:
    """Whether a map sends every index's last coordinate (of extent k) to the last, and nothing
    else to it: each row it reads is a whole row of its input, in order."""
    last = at.out_vars[-1]
    return (at.exprs[-1] == last and last.extent == k == at.in_lens[-1]
            and not any(last in free_vars(e) for e in at.exprs[:-1]))


def reads_rows(product: Instruction, x: Instruction) -> bool:
    """Whether `product` is a matrix product reading `x` as its A (directly or through views),
    summing along x's last axis."""
    return product.op.k_is_last_axis and reads_as_a(product, x)


def reads_as_a(product: Instruction, x: Instruction) -> bool:
    """Whether `product` is a product anchor whose first input is `x` or a view chain of it."""
    if product.op.kind != OpKind.ANCHOR or product.op.family != "gemm":
        return False
    a = product.inputs[0]
    while a is not x and view_input_map(a) is not None:
        a = a.inputs[0]
    return a is x


def _reads_only(u: Instruction, values: set[int]) -> bool:
    """Whether every operand of `u` (through views) is one of `values` or a constant."""
    return all(id(x) in values or broadcast_literal(x) is not None for x in map(view_source, u.inputs))


def _on_reductions(ins: Instruction) -> bool:
    """Whether pointwise `ins` computes from reductions' outputs and constants only (through
    views and other such pointwise ops), at least one reduction among them."""
    sources = [x for x in map(view_source, ins.inputs) if broadcast_literal(x) is None]
    return bool(sources) and all(x.op.kind == OpKind.REDUCE or x.op.kind == OpKind.POINTWISE and _on_reductions(x)
                                 for x in sources)


def _on_constants(u: Instruction, x: Instruction) -> bool:
    """Whether `u` is a pointwise op reading `x` whose other operands are constants."""
    return (u.op.kind == OpKind.POINTWISE and any(i is x for i in u.inputs)
            and all(i is x or broadcast_literal(i) is not None for i in u.inputs))


def _needs_copy(part: Instruction, axis: int) -> bool:
    """Whether concat elimination would copy `part` into its slot: a program input, a constant or
    a view (a slice along the concat's axis of a kernel's output is written in place)."""
    if part.op.kind.is_source:
        return True
    cut = part.op.ranges()
    if cut is not None and len(cut) == 1 and cut[0][0] == axis:
        return False
    return view_input_map(part) is not None
