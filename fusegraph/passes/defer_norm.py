"""A layernorm that would keep its own kernel, moved past the matrix products that read it.

After `fold_norm_affine` a layernorm read by products is `(x - mean) * rstd` of one input, and a
centered norm's folded weights W have columns that sum to zero, so

    dot((x - mean) * rstd, W) = rstd * (dot(x, W) - mean * sum(W)) = rstd * dot(x, W)

(an RMS norm subtracts no mean, so there the identity holds for any W). The products then read
x itself and scale their rows by rstd in their epilogue; the norm's other readers, pointwise
ops (the affine `fold_norm_affine` moved out of the norm for a residual add after a post-norm,
as in BERT), read `(x - mean) * rstd` computed where they read it. What is left of the norm is
its statistics, `row_rstd` and `row_mean`, one float32 per row each, which join the epilogue of
the product that writes x (`reduction_epilogue.row_statistics`) or are a small reduction
kernel. The norm's kernel, which read x and wrote the normalized tensor for the products to
read back, is gone, and the products' A is a plain load.

By default (`FUSEGRAPH_DEFER_NORMS=free`, `DEFER_NORMS_ENV`) only where the statistics cost
nothing (`free_statistics`: after a depthwise convolution, measured faster); the rule below
only under `=1`: with fewer kernels, those deferred programs still measured slower on an H200,
so it stays for measuring and for where it wins.

Where products alone read the norm and the prologue rule lets them normalize it themselves
(`prologue_rule.norm_fits_product`: few rows or short ones, ViT-S/16 at batch 1), it stays
there, as measured. Where other readers need the normalized values, no product may compute it
without storing it (measured slower), so the norm is deferred at any row count, as long as
its input is an anchor's epilogue value whose kernel then takes the statistics too
(`in_an_epilogue`): the norm's kernel is replaced by nothing. The same holds for a product that
cannot scale its rows afterwards because its K walks several rows (a convolution after
ConvNeXt's downsampling layernorm, `normalizes_on_read`) or that reads them through views it
cannot normalize itself (Swin's window partitions at batch 2 and more): its kernel computes
`(x - mean) * rstd`, and an affine the norm kept, in its A loads, as it computes a
squeeze-and-excitation scale there.

Precision: the products sum raw x instead of centered rows, so a row far from zero (a mean m, a
spread s) leaves the float32 accumulator to carry `m * W` terms that cancel to nothing; its
rounding error grows by about m / s, which float32 absorbs for the rows transformers have
(m / s below 10^3 keeps it under 10^-4). The statistics are taken in float32 by two passes
(Chan's combination across tiles in an epilogue), as the norm's kernel takes them.

Applies to a layernorm (or RMS norm) over the last axis that is not returned and whose readers
are matrix products reading it directly as A along K, with literal weights whose columns sum
to zero for a centered norm (no affine left in the norm), other product anchors reading it as
A, and pointwise ops; and whose
input some kernel stores anyway (a transformer's residual stream, which the next residual
add reads too, or a product's epilogue value): a pointwise input only the norm reads is
computed inside the norm's kernel today, and deferred it would have to be stored for the
products.
"""

from __future__ import annotations

import os
from typing import Callable

from fusegraph.errors import ArgumentError
from fusegraph.ir.index_expr import free_vars
from fusegraph.ir.index_map import identity_map
from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.zero_sum_columns import columns_sum_to_zero
from fusegraph.ops import make_op
from fusegraph.ops.base import OpKind
from fusegraph.ops.base import input_map_of as view_input_map
from fusegraph.ops.reduce import RowMean, RowRstd
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.fuse_anchors import part_anchor
from fusegraph.passes.literal_values import broadcast_literal
from fusegraph.passes.prologue_rule import norm_fits_product, norms_stored, reads_as_a, reads_rows
from fusegraph.passes.reduction_epilogue import whole_rows
from fusegraph.passes.rewrite import rewrite_each


# "0": no norm is deferred. "free" (the default): only where the statistics come free
# (`free_statistics`: ConvNeXt's norms after its depthwise convolutions; ConvNeXt-T at batch 1
# 0.360 against 0.368 ms with "0" on an H100, fp16, bench/results/models-free-ab-h100.md). "1": also by the
# rule below, which measured slower on an H200 (fp16, bench/results/models-defer-ab.md)
# everywhere, BERT-base 0.389 against 0.358 ms at batch 1 and 2.049 against 1.839 at batch 32,
# ViT-S/16 1.145 against 1.101 at batch 32, though the programs had 23 kernels fewer; "all"
# also where the products would normalize the rows themselves (few or short rows: ViT-S/16 at
# batch 1). Unset or empty: DEFAULT_DEFERRAL.
DEFER_NORMS_ENV = "FUSEGRAPH_DEFER_NORMS"
DEFER_SETTINGS = ("0", "free", "1", "all")
DEFAULT_DEFERRAL = "free"


def deferrable_reader(ln: Instruction, product: Instruction) -> bool:
    """Whether `product` reads `ln` directly as its A along K with weights the identity above
    holds for."""
    if product.inputs[0] is not ln or not reads_rows(product, ln):
        return False
    if not ln.op.center:
        return True
    weights = broadcast_literal(product.inputs[1])
    return weights is not None and columns_sum_to_zero(weights)


def deferral_setting() -> str:
    """FUSEGRAPH_DEFER_NORMS, checked: a misspelt value would otherwise leave the norms as they
    are without a word."""
    setting = os.environ.get(DEFER_NORMS_ENV) or DEFAULT_DEFERRAL
    if setting not in DEFER_SETTINGS:
        raise ArgumentError(f"{DEFER_NORMS_ENV}={setting!r}: use 0 (no layernorm deferred), free (only where the "
                            "statistics come free, after a depthwise convolution), 1 (also by the rule) or all; "
                            f"unset: {DEFAULT_DEFERRAL}")
    return setting


def defers(module: Module, ln: Instruction, users: dict[Instruction, list[Instruction]],
           product_ok: Callable[[Instruction], bool]) -> bool:
    """Whether layernorm `ln` (over its last axis, not returned) is deferred: every reader is a
    matrix product that `product_ok` accepts, a product anchor that normalizes the rows as it
    loads them (`normalizes_on_read`: a convolution) or a pointwise op, at least one an anchor;
    with products alone, not where they would normalize it themselves (`norm_fits_product`);
    and its input is stored by some kernel anyway (`stored_anyway`). `fold_norm_affine` asks
    this before folding (of products with literal weights), `DeferNorm` after (of products
    whose folded weights make the identity hold)."""
    setting = deferral_setting()
    if setting == "0" or ln.op.algorithm != "layernorm" or ln in module.returns or ln.op.attrs["axis"] != ln.shape.ndim - 1:
        return False
    readers = users.get(ln, [])
    products = [u for u in readers if u.op.kind == OpKind.ANCHOR and product_ok(u)]
    loading = [u for u in readers if u not in products and normalizes_on_read(ln, u, module, users)]
    pointwise = [u for u in readers if u.op.kind == OpKind.POINTWISE]
    if len(products) + len(loading) + len(pointwise) != len(readers) or not (products or loading):
        return False
    if not pointwise and not loading:
        if free_statistics(ln, module):
            return True
        if setting == "free" or setting != "all" and any(norm_fits_product(ln, p) for p in products):
            return False
        return stored_anyway(ln.inputs[0], ln, module, users)
    # the others normalize as they read: only where the statistics cost no kernel of their own,
    # and not where a product is asked to compute the norm and store it (`prologue_rule.STORE_NORMS_ENV`)
    return setting != "free" and not norms_stored() and in_an_epilogue(ln.inputs[0], ln, module)


def free_statistics(ln: Instruction, module: Module) -> bool:
    """Whether the statistics of `ln`'s rows would join the epilogue of a kernel whose tile
    holds whole rows (`reduction_epilogue.whole_rows`: a depthwise convolution over at most
    1024 channels, read channels-last): computed from registers with no counter nor parts, they
    cost that kernel next to nothing, and its reader loses the norm's loop over each row."""
    x = ln.inputs[0]
    groups: dict[int, set[int]] = {}
    anchor = part_anchor(module, x, {id(i): k for k, i in enumerate(module.instructions)}, groups)
    return (anchor is not None and whole_rows(anchor) and id(ln) not in groups[id(anchor)]
            and channels_last(anchor, x))


def channels_last(anchor: Instruction, x: Instruction) -> bool:
    """Whether x is `anchor`'s output through views and pointwise ops of its shape with the
    anchor's channels as x's last axis, read by no other axis of x."""
    at, y = identity_map(x.shape.lens), x
    while y is not anchor:
        view = view_input_map(y)
        if view is not None:
            at, y = view.after(at), y.inputs[0]
            continue
        if y.op.kind != OpKind.POINTWISE:
            return False
        ahead = [i for i in y.inputs if i.shape.lens == y.shape.lens and _reaches(i, anchor)]
        if len(ahead) != 1:
            return False
        y = ahead[0]
    last, channel = at.out_vars[-1], anchor.op.channel_axis(anchor.shape.ndim)
    return (at.exprs[channel] == last and last.extent == anchor.shape.lens[channel]
            and not any(last in free_vars(e) for j, e in enumerate(at.exprs) if j != channel))


def _reaches(x: Instruction, anchor: Instruction) -> bool:
    """Whether `anchor` is x or above x through views and pointwise ops."""
    stack, seen = [x], set()
    while stack:
        y = stack.pop()
        if y is anchor:
            return True
        if id(y) not in seen and y.op.kind in (OpKind.VIEW, OpKind.POINTWISE):
            seen.add(id(y))
            stack.extend(y.inputs)
    return False


def normalizes_on_read(ln: Instruction, reader: Instruction, module: Module,
                       users: dict[Instruction, list[Instruction]]) -> bool:
    """Whether `reader` of `ln` (directly or through views nothing else reads) is a product
    anchor reading it as A that would not normalize the rows itself (`norm_fits_product`):
    a convolution after ConvNeXt's downsampling layernorm, whose K walks window taps as well as
    channels, so no row scale can move past it. Given the statistics, `(x - mean) * rstd` is
    two pointwise ops that its kernel computes in its A loads (`prologue_rule`), as it does
    for a squeeze-and-excitation scale."""
    x = reader
    while view_input_map(x) is not None:
        if x in module.returns or len(users.get(x, [])) != 1:
            return False
        x = users[x][0]
    if x.op.kind != OpKind.ANCHOR or x.op.family != "gemm" or not reads_as_a(x, ln):
        return False
    return not (reads_rows(x, ln) and norm_fits_product(ln, x))


def stored_anyway(x: Instruction, ln: Instruction, module: Module, users: dict[Instruction, list[Instruction]]) -> bool:
    """Whether some kernel writes x whatever becomes of the norm: read by others too, or the
    value of an anchor's epilogue that the norm does not join (a residual add after a
    product, read only by a post-norm). A pointwise value that the norm alone reads otherwise
    is computed inside the norm's kernel, and deferring would leave two kernels to compute it."""
    y = x
    while view_input_map(y) is not None:
        if len(users.get(y, [])) > 1 or y in module.returns:
            return True
        y = y.inputs[0]
    if y.op.kind != OpKind.POINTWISE or len(users.get(y, [])) > 1 or y in module.returns:
        return True
    return in_an_epilogue(x, ln, module)


def in_an_epilogue(x: Instruction, ln: Instruction, module: Module) -> bool:
    """Whether an anchor's kernel computes x in its epilogue (`fuse_anchors.part_anchor`) and
    the norm does not join it: the norm's statistics may then join it instead."""
    groups: dict[int, set[int]] = {}
    anchor = part_anchor(module, x, {id(i): k for k, i in enumerate(module.instructions)}, groups)
    return anchor is not None and id(ln) not in groups[id(anchor)]


class DeferNorm:
    name = "defer_norm"

    def apply(self, module: Module) -> bool:
        def defer(ln: Instruction) -> bool:
            if ln.op.algorithm != "layernorm" or len(ln.inputs) not in (1, 3):
                return False
            users = module.users()

            def scales_rows(p: Instruction) -> bool:  # not where the norm kept its affine
                return len(ln.inputs) == 1 and deferrable_reader(ln, p)

            if not defers(module, ln, users, scales_rows):
                return False
            x, readers = ln.inputs[0], users[ln]
            axis, origin = ln.op.attrs["axis"], ln.origin
            rstd = module.insert_before(ln, module.make(RowRstd(axis, ln.op.attrs["epsilon"], ln.op.center), [x], origin))
            products = [u for u in readers if u.op.kind == OpKind.ANCHOR and scales_rows(u)]
            others = [u for u in readers if u not in products]
            if others:
                normalized = self._normalized(module, ln, rstd)
                for u in others:
                    u.inputs = [normalized if i is ln else i for i in u.inputs]
            for product in dict.fromkeys(products):  # one reading it twice: once
                self._scale_rows(module, product, x, rstd)
            return True

        return rewrite_each(module, defer, drop_dead=True)

    @staticmethod
    def _normalized(module: Module, ln: Instruction, rstd: Instruction) -> Instruction:
        """`(x - mean) * rstd` (x * rstd for an RMS norm; times gamma plus beta for a norm that
        kept its affine) in x's type, the statistics converted:
        pointwise ops that the kernels of the norm's other readers compute as they read (a
        kernel computes half types in float32, so nothing is rounded there). No op reads x
        with operands that x's own kernel could compute, so that kernel stores x alone."""
        x, origin, lens = ln.inputs[0], ln.origin, ln.shape.lens

        def add(op: object, inputs: list[Instruction]) -> Instruction:
            return module.insert_before(ln, module.make(op, inputs, origin))

        def per_row(stat: Instruction) -> Instruction:
            wide = add(MultiBroadcast(lens), [stat])
            return wide if stat.shape.dtype == x.shape.dtype else add(make_op("convert", target=x.shape.dtype), [wide])

        centered = add(make_op("sub"), [x, per_row(add(RowMean(ln.op.attrs["axis"]), [x]))]) if ln.op.center else x
        normalized = add(make_op("mul"), [centered, per_row(rstd)])
        if len(ln.inputs) == 3:  # the affine, gamma and beta broadcast to x's shape
            normalized = add(make_op("add"), [add(make_op("mul"), [normalized, ln.inputs[1]]), ln.inputs[2]])
        return normalized

    @staticmethod
    def _scale_rows(module: Module, product: Instruction, x: Instruction, rstd: Instruction) -> None:
        """`product` reading x instead of the norm, times rstd broadcast along its N: in rstd's
        type, converted back, all in the product's epilogue (a kernel computes half types in
        float32, so the scale is not rounded before it is applied)."""
        origin = product.origin
        raw = module.make(product.op, [x, *product.inputs[1:]], origin)
        wide = module.make(MultiBroadcast(product.shape.lens), [rstd], origin)
        ops = [raw, wide]

        def then(op_name: str, inputs: list[Instruction], **attrs: object) -> Instruction:
            ops.append(module.make(make_op(op_name, **attrs), inputs, origin))
            return ops[-1]

        wider = raw if raw.shape.dtype == rstd.shape.dtype else then("convert", [raw], target=rstd.shape.dtype)
        value = then("mul", [wider, wide])
        if value.shape.dtype != raw.shape.dtype:
            value = then("convert", [value], target=raw.shape.dtype)
        for ins in ops:
            module.insert_before(product, ins)
        module.replace_uses(product, value)
