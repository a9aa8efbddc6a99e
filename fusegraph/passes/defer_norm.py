"""A layernorm that would keep its own kernel, moved past the matrix products that read it.

After `fold_norm_affine` a layernorm read only by products is `(x - mean) * rstd` of one input,
and a centered norm's folded weights W have columns that sum to zero, so

    dot((x - mean) * rstd, W) = rstd * (dot(x, W) - mean * sum(W)) = rstd * dot(x, W)

(an RMS norm subtracts no mean, so there the identity holds for any W). Where the prologue
rule would not compute the norm in the product (`prologue_rule.norm_fits_product`: many long
rows, ViT-S/16 at batch 32), the norm's kernel reads x and writes the normalized tensor, which
the product reads back. Deferred, a `row_rstd` kernel reads x and writes one float32 per row,
and the product reads x itself and scales its rows by rstd in its epilogue: half the norm's
traffic gone, and the product's A is a plain load.

Precision: the product sums raw x instead of centered rows, so a row far from zero (a mean m, a
spread s) leaves the float32 accumulator to carry `m * W` terms that cancel to nothing; its
rounding error grows by about m / s, which float32 absorbs for the rows transformers have
(m / s below 10^3 keeps it under 10^-4). The statistics themselves are taken in two passes in
float32, as the norm's kernel takes them.

Applies to a layernorm (or RMS norm) over the last axis, with no affine left, that is not
returned and whose every reader is a matrix product reading it directly as A along K, with
literal weights whose columns sum to zero for a centered norm, and whose input some kernel
stores anyway (a transformer's residual stream, which the next residual add reads too): a
pointwise input only the norm reads is computed inside the norm's kernel today, and deferred it
would have to be stored for the products.
"""

from __future__ import annotations

from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.zero_sum_columns import columns_sum_to_zero
from fusegraph.ops import make_op
from fusegraph.ops.base import OpKind
from fusegraph.ops.base import input_map_of as view_input_map
from fusegraph.ops.reduce import RowRstd
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.literal_values import broadcast_literal
from fusegraph.passes.prologue_rule import norm_fits_product, reads_rows
from fusegraph.passes.rewrite import rewrite_each


def deferrable_reader(ln: Instruction, product: Instruction) -> bool:
    """Whether `product` reads `ln` as its own A along K with weights the identity above holds
    for, and would not compute the norm in its tiles."""
    if product.inputs[0] is not ln or not reads_rows(product, ln) or norm_fits_product(ln, product):
        return False
    if not ln.op.center:
        return True
    weights = broadcast_literal(product.inputs[1])
    return weights is not None and columns_sum_to_zero(weights)


def stored_anyway(x: Instruction, module: Module, users: dict[Instruction, list[Instruction]]) -> bool:
    """Whether some kernel writes x whatever becomes of the norm: it is not a pointwise value
    that the norm alone reads (through views), which the norm's kernel computes as it reads
    it and which deferring would leave two kernels to compute."""
    while view_input_map(x) is not None:
        if len(users.get(x, [])) > 1 or x in module.returns:
            return True
        x = x.inputs[0]
    return x.op.kind != OpKind.POINTWISE or len(users.get(x, [])) > 1 or x in module.returns


class DeferNorm:
    name = "defer_norm"

    def apply(self, module: Module) -> bool:
        def defer(ln: Instruction) -> bool:
            if ln.op.algorithm != "layernorm" or len(ln.inputs) != 1 or ln in module.returns:
                return False
            if ln.op.attrs["axis"] != ln.shape.ndim - 1:
                return False
            users = module.users()
            readers = users.get(ln, [])
            if not readers or not all(deferrable_reader(ln, p) for p in readers):
                return False
            if not stored_anyway(ln.inputs[0], module, users):
                return False
            x = ln.inputs[0]
            rstd = module.make(RowRstd(ln.op.attrs["axis"], ln.op.attrs["epsilon"], ln.op.center), [x], ln.origin)
            module.insert_before(ln, rstd)
            for product in dict.fromkeys(readers):  # a product reading it twice is one reader
                self._scale_rows(module, product, x, rstd)
            return True

        return rewrite_each(module, defer, drop_dead=True)

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
