"""Chained products: a matrix product whose whole value feeds the next one, in one kernel.

A transformer's MLP at batch 1 is two products of a few hundred rows: `fc1` (with its
layernorm, bias and GELU) writes the hidden rows, `fc2` reads them back once. Each kernel is a
few microseconds of latency around little work, and the hidden tensor exists only to be read
by the next kernel. Here the two fused groups become one: each program of the first product
holds a block of rows times a block of hidden columns, multiplies that block by the matching
rows of the second product's weights, and the programs sharing a block of rows sum their
parts (the GPU template's split over the hidden dimension, summed in a fixed order by the
last program to arrive at each output tile: `templates/gemm_chain.py`). The second group's
epilogue (bias, residual, its stores) then runs on the sums.

The pair merges when:
* the first group's anchor is a product (`dot`) and its one stored value, written at the
  anchor's own index, is read by nothing but the second group;
* the second group's anchor is a product with literal weights that reads that value as its A
  operand through the identity map, with no prologue of its own;
* neither group holds a reduction across programs (a pixel sum, row statistics) or a second
  product already, and the rows are few (`CHAIN_MAX_ROWS`): the parts cost a float32 slot per
  hidden block, which at many rows would outweigh the tensor they save.

Off unless `FUSEGRAPH_CHAIN_PRODUCTS=1` (not yet timed on a GPU against the two kernels).
"""

from __future__ import annotations

import math
import os

from fusegraph.ir.index_map import identity_map
from fusegraph.ir.program import Instruction, Module
from fusegraph.ops.base import OpKind, is_allocate, is_fused, is_literal, is_load, is_param, is_store
from fusegraph.ops.fused import Fused
from fusegraph.ops.source import add_param
from fusegraph.passes.rewrite import rewrite_each

CHAIN_ENV = "FUSEGRAPH_CHAIN_PRODUCTS"

# Products of at most this many rows chain: ViT-S/16 (197 tokens) and BERT-base at sequence
# 128 at batch 1. The parts are rows x output columns x hidden blocks float32 values.
CHAIN_MAX_ROWS = 256


def chains_enabled() -> bool:
    """Whether chained products are built (`CHAIN_ENV`)."""
    return os.environ.get(CHAIN_ENV) == "1"


def group_products(module: Module) -> list[Instruction]:
    """The products (`dot`) of a fused group's sub-module, in program order."""
    return [i for i in module if i.op.kind == OpKind.ANCHOR and i.op.name == "dot"]


def _params(module: Module) -> list[Instruction]:
    return [i for i in module if is_param(i)]


def _plain(module: Module) -> bool:
    """Whether a group holds one product and no reduction across its programs."""
    anchors = [i for i in module if i.op.kind == OpKind.ANCHOR]
    return len(anchors) == 1 and anchors[0].op.name == "dot" and not any(i.op.only_stored for i in module)


def _rows(product: Instruction) -> int:
    return math.prod(product.shape.lens[:-1])


def _first_value(a: Instruction) -> Instruction | None:
    """The value the first group stores, when it stores one value, whole, at its product's index."""
    sub: Module = a.op.module
    (product,) = group_products(sub)
    if len(sub.returns) != 1:
        return None
    store = sub.returns[0]
    if not is_store(store) or not is_allocate(store.inputs[0]) or store.op.attrs["domain"]:
        return None
    if store.shape.lens != product.shape.lens or store.op.attrs["map"] != identity_map(product.shape.lens):
        return None
    return store.inputs[1]


def _second_operand(b: Instruction, position: int) -> Instruction | None:
    """The second group's load of its input `position` when its product reads it whole as A
    (identity map, no domain) and its weights are a literal's plain load."""
    sub: Module = b.op.module
    (product,) = group_products(sub)
    param = _params(sub)[position]
    a_in, w_in = product.inputs
    if not (is_load(a_in) and a_in.inputs[0] is param and not a_in.op.attrs["domain"]
            and a_in.op.attrs["map"] == identity_map(a_in.shape.lens)):
        return None
    if not (is_load(w_in) and is_param(w_in.inputs[0]) and not w_in.op.attrs["domain"]):
        return None
    outside = b.inputs[_params(sub).index(w_in.inputs[0])]
    if not is_literal(outside):
        return None
    readers = [i for i in sub if param in i.inputs]
    return a_in if readers == [a_in] else None


def merge(a: Instruction, b: Instruction, position: int, name: str) -> Instruction:
    """One fused instruction computing `a`'s group and then `b`'s, `b`'s input `position` (`a`'s
    value) read from `a`'s computation in place of its load."""
    sa, sb = a.op.module, b.op.module
    sub = Module(name)
    inputs: list[Instruction] = []
    param_of: dict[int, Instruction] = {}  # outside instruction -> merged param
    copy: dict[int, Instruction] = {}

    def param(outside: Instruction) -> Instruction:
        if id(outside) not in param_of:
            param_of[id(outside)] = add_param(sub, f"x{len(inputs)}", outside.shape.as_standard())
            inputs.append(outside)
        return param_of[id(outside)]

    for outside, p in zip(a.inputs, _params(sa)):
        copy[id(p)] = param(outside)
    value = _first_value(a)
    keep_a = _ancestors(value)
    for ins in sa:
        if not is_param(ins) and id(ins) in keep_a:
            copy[id(ins)] = sub.add(ins.op, [copy[id(x)] for x in ins.inputs], ins.origin)
    load = _second_operand(b, position)
    for k, (outside, p) in enumerate(zip(b.inputs, _params(sb))):
        if k != position:
            copy[id(p)] = param(outside)
    copy[id(load)] = copy[id(value)]
    for ins in sb:
        if not is_param(ins) and ins is not load:
            copy[id(ins)] = sub.add(ins.op, [copy[id(x)] for x in ins.inputs], ins.origin)
    sub.set_returns([copy[id(r)] for r in sb.returns], ["out"] + [f"out{k}" for k in range(1, len(sb.returns))])
    kernel = f"{a.op.attrs['kernel']}_{b.op.attrs['kernel']}"
    return Instruction(Fused(sub, kernel), inputs, b.shape, b.origin)


def _ancestors(value: Instruction) -> set[int]:
    out, stack = set(), [value]
    while stack:
        x = stack.pop()
        if id(x) not in out:
            out.add(id(x))
            stack.extend(x.inputs)
    return out


class ChainProducts:
    """Merges a product's group with the product group that alone reads its value (see the
    module docstring); off unless `FUSEGRAPH_CHAIN_PRODUCTS=1`."""

    name = "chain_products"

    def apply(self, module: Module) -> bool:
        if not chains_enabled():
            return False

        def try_chain(a: Instruction) -> bool:
            if not is_fused(a) or not _plain(a.op.module) or a not in module.instructions:
                return False
            (first,) = group_products(a.op.module)
            if _rows(first) > CHAIN_MAX_ROWS or a in module.returns or _first_value(a) is None:
                return False
            readers = module.users().get(a, [])
            if len(readers) != 1 or not is_fused(readers[0]) or not _plain(readers[0].op.module):
                return False
            b = readers[0]
            positions = [k for k, x in enumerate(b.inputs) if x is a]
            if len(positions) != 1 or _second_operand(b, positions[0]) is None:
                return False
            (second,) = group_products(b.op.module)
            if _rows(second) != _rows(first) or second.shape.lens[:-1] != first.shape.lens[:-1]:
                return False
            merged = merge(a, b, positions[0], b.op.module.name)
            merged.module = module
            module.insert_before(b, merged)
            module.replace_uses(b, merged)
            module.instructions = [i for i in module.instructions if i is not a and i is not b]
            return True

        return rewrite_each(module, try_chain, drop_dead=True)
