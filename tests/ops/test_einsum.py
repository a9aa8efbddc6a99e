"""Einsum (the forms models use: batched matrix products, attention's bhqd,bhkd->bhqk, bilinear
three-operand contractions, transposes, sums, diagonals, ellipses, outer products) against
ONNX Runtime on the reference target unfused and fused and on the gpu target under the
interpreter; and LpPool, another composition, likewise."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

EQUATIONS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    ("i,i", [(5,), (5,)]),
]


def einsum_case(rng, equation: str, shapes):
    names = [f"x{k}" for k in range(len(shapes))]
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)}
    return model_of([helper.make_node("Einsum", names, ["y"], equation=equation)], inputs, ["y"], opset=12), inputs


@pytest.mark.parametrize("equation,shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
def test_einsum(equation, shapes):
    check_ref(*einsum_case(np.random.default_rng(), equation, shapes), rtol=1e-4, atol=1e-5)


@needs_gpu_target
@pytest.mark.parametrize("equation,shapes", [EQUATIONS[1], EQUATIONS[2], EQUATIONS[6]], ids=lambda x: str(x))
def test_gpu_einsum(equation, shapes):
    check_gpu(*einsum_case(np.random.default_rng(), equation, shapes), rtol=1e-4, atol=1e-5)


def lp_pool_case(rng, p: int, pads):
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 3], p=p, pads=pads, strides=[1, 2])
    return model_of([node], {"x": x}, ["y"]), {"x": x}


@pytest.mark.parametrize("p,pads", [(2, [0, 0, 0, 0]), (3, [1, 1, 1, 1]), (1, [0, 1, 1, 0])])
def test_lp_pool(p, pads):
    check_ref(*lp_pool_case(np.random.default_rng(), p, pads), rtol=1e-4)


@needs_gpu_target
def test_gpu_lp_pool():
    check_gpu(*lp_pool_case(np.random.default_rng(), 2, [1, 1, 1, 1]), rtol=1e-4)
