"""Folding a layernorm's constant affine into the matrix products that read it.

`dot(layernorm(x) * gamma + beta, W)` is `dot(layernorm(x), diag(gamma) W) + beta W`: with gamma,
beta and W constants, the weights become `W' = diag(gamma) W` and the epilogue gains the bias
`beta W` (added after the product, where fusion folds it into the epilogue with any bias the
product had). What is left is a layernorm of one input, which only normalizes: its readers'
kernels compute it in their own prologue (`prologue_rule.py`, `templates/gemm_prologue.py`).
Applies to the matrix products reading the layernorm as A along the normalized (last) axis,
with literal weights, directly or through views that keep its rows whole (a transpose or
reshape of the leading axes). A layernorm with other readers too (BERT's residual adds after a
post-norm) is folded where `defer_norm` will move it past its products (`defer_norm.defers`),
or where a product may store the norm (`prologue_rule.norms_stored`): its other readers then
read `norm * gamma + beta`, two pointwise ops their kernels compute. Otherwise the norm keeps its own kernel, which after a fold would write
both the bare norm (for the products) and its affine (for the others); unfolded it writes the
affine alone and the products read it with their own weights: at BERT-base's batch 32, 6 MB
less written per layernorm.

A centered norm's rows sum to zero, so `dot(norm, W' - 1 c)` is `dot(norm, W')` for any row
vector c: the folded weights are stored with each column's mean subtracted, rounded so that
each column of the stored values sums to zero (`zero_sum_columns`). A product that normalizes
after its k loop (`gemm_prologue.RowStatistics`, deferred) must subtract `sum(W)` times its
rows' shift; with columns that sum to zero that term vanishes, and the kernel takes no column
sums of W at all (`gemm_prologue.columns_vanish`).
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.zero_sum_columns import zero_sum_columns
from fusegraph.ops.base import input_map_of as view_input_map
from fusegraph.ops import make_op
from fusegraph.ops.base import is_literal
from fusegraph.ops.source import make_literal
from fusegraph.passes.defer_norm import defers
from fusegraph.passes.fold_into_weights import add_bias
from fusegraph.passes.literal_values import broadcast_literal
from fusegraph.passes.prologue_rule import keeps_last_axis, norms_stored, reads_rows
from fusegraph.passes.rewrite import rewrite_each


def _weights(product: Instruction) -> tuple[Instruction, np.ndarray] | None:
    """The literal behind a product's B (itself, or through one batch broadcast) and its value at
    B's rank; None unless it is one [K, N] matrix for every batch (constant folding may have
    materialized the batch broadcast)."""
    b = product.inputs[1]
    value = broadcast_literal(b)
    if value is None or value.shape[-2:] != b.shape.lens[-2:]:
        return None
    matrices = value.reshape(-1, *value.shape[-2:])
    if len(matrices) > 1 and not (matrices == matrices[0]).all():
        return None
    lit = b.inputs[0] if b.op.broadcasts else b
    return (lit, value) if is_literal(lit) and lit.shape.elements == value.size else None


def _affine(ln: Instruction) -> tuple[np.ndarray, np.ndarray] | None:
    """gamma and beta of a layernorm over the last axis as vectors, if they are constants."""
    rank, k = ln.shape.ndim, ln.shape.lens[-1]
    if len(ln.inputs) != 3 or ln.op.attrs["axis"] != rank - 1:
        return None
    gamma, beta = (_along_last_axis(broadcast_literal(p, wide=True), k) for p in ln.inputs[1:])
    return (gamma, beta) if gamma is not None and beta is not None else None


def _along_last_axis(value: np.ndarray | None, k: int) -> np.ndarray | None:
    """`value` as a vector over its last axis when every row holds the same one (a broadcast
    that constant propagation may already have materialized)."""
    if value is None:
        return None
    rows = np.broadcast_to(value, (*value.shape[:-1], k)).reshape(-1, k)
    return rows[0] if (rows == rows[0]).all() else None


def _bias_add(module: Module, product: Instruction) -> tuple[Instruction, np.ndarray | None]:
    """The product's bias add (its only reader, adding a constant vector over the output's last
    axis) and that vector, or the product itself and None."""
    readers = module.users().get(product, [])
    if len(readers) != 1 or readers[0].op.algebra != "sum" or product in module.returns:
        return product, None
    add = readers[0]
    other = add.inputs[1] if add.inputs[0] is product else add.inputs[0]
    vector = _along_last_axis(broadcast_literal(other, wide=True), product.shape.lens[-1])
    if vector is None or other is product or len(broadcast_literal(other).shape) != product.shape.ndim:
        return product, None
    return add, vector


def _path(module: Module, reader: Instruction, ln: Instruction) -> tuple[list[Instruction], Instruction] | None:
    """The views (read by nothing else) from `ln` to a matrix product reading whole rows of it as
    A, and the product; None when `reader` does not lead to one."""
    users, views, x = module.users(), [], reader
    while view_input_map(x) is not None:
        if x in module.returns or len(users.get(x, [])) != 1:
            return None
        views.append(x)
        x = users[x][0]
    if not reads_rows(x, ln) or x.inputs[0] is not (views[-1] if views else ln):
        return None
    if views:
        at = view_input_map(views[0])
        for v in views[1:]:
            at = at.after(view_input_map(v))  # type: ignore[union-attr]
        if not keeps_last_axis(at, ln.shape.lens[-1]):  # type: ignore[arg-type]
            return None
    return views, x


class FoldNormAffine:
    name = "fold_norm_affine"

    def apply(self, module: Module) -> bool:
        def fold(ln: Instruction) -> bool:
            if ln.op.algorithm != "layernorm" or ln in module.returns:
                return False
            affine = _affine(ln)
            readers = module.users().get(ln, [])
            paths = {id(u): _path(module, u, ln) for u in readers}
            weights = {id(u): _weights(p[1]) for u in readers if (p := paths[id(u)]) is not None}
            products = [(paths[k], w) for k, w in weights.items() if w is not None]
            others = [u for u in readers if weights.get(id(u)) is None]
            if affine is None or not products:
                return False
            if others and not norms_stored():  # folded only where the products will not read a stored norm
                direct = {id(p[1]) for p, _ in products if not p[0]}
                if not defers(module, ln, module.users(), lambda p: id(p) in direct):
                    return False
            norm = module.make(type(ln.op)(ln.op.attrs["axis"], ln.op.attrs["epsilon"]), [ln.inputs[0]], ln.origin)
            module.insert_before(ln, norm)
            for (views, product), w in products:
                self._rewrite(module, product, views, w, norm, *affine)
            if others:  # they read the norm's affine, two pointwise ops on the stored norm
                scaled = module.make(make_op("mul"), [norm, ln.inputs[1]], ln.origin)
                shifted = module.make(make_op("add"), [scaled, ln.inputs[2]], ln.origin)
                module.insert_before(ln, scaled)
                module.insert_before(ln, shifted)
                for u in others:
                    u.inputs = [shifted if x is ln else x for x in u.inputs]
            return True

        return rewrite_each(module, fold, drop_dead=True)

    def _rewrite(self, module: Module, product: Instruction, views: list[Instruction],
                 literal: tuple[Instruction, np.ndarray], norm: Instruction, gamma: np.ndarray, beta: np.ndarray) -> None:
        """`product` reading `norm` (through the same views) with its weights (`literal`, from
        `_weights`: the literal and its value) scaled by gamma, plus the bias beta W; a centered
        norm's weights stored with columns that sum to zero."""
        lit, w = literal
        exact = broadcast_literal(product.inputs[1], wide=True)  # the float32 weights a half program narrowed
        wide = (exact if exact is not None and exact.shape == w.shape else w).astype(np.float64)
        scaled = gamma.astype(np.float64)[:, None] * wide
        if norm.op.center and DType.from_numpy(w.dtype).is_float:
            stored = zero_sum_columns(scaled, w.dtype)
        else:
            stored = scaled.astype(w.dtype)
        new_lit = make_literal(stored.reshape(lit.shape.lens), origin=lit.origin)
        module.insert_before(product, new_lit)
        b = product.inputs[1]
        weights = new_lit if b is lit else module.make(b.op, [new_lit], b.origin)
        if weights is not new_lit:
            module.insert_before(product, weights)
        a = norm
        for v in views:
            a = module.make(v.op, [a], v.origin)
            module.insert_before(product, a)
        new = module.make(product.op, [a, weights], product.origin)
        module.insert_before(product, new)
        bias = beta.astype(np.float64) @ wide.reshape(-1, *wide.shape[-2:])[0]
        after, old_bias = _bias_add(module, product)
        if old_bias is not None:  # one bias: the product's own plus beta W
            bias = bias + old_bias.astype(np.float64)
        out = add_bias(module, product, new, bias, product.shape.ndim - 1)
        module.replace_uses(after, out)
