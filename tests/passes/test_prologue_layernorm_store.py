"""A layernorm computed by a product's prologue and also stored for its other readers
(passes/prologue_rule.py `normalizes_k`, FuseAnchors): the post-norm residual of BERT's layers,
a returned layernorm, a second product. The first product in program order that reads it as A
computes it, stores it as a further output of its group (`fused_output[index=k]`) and every
other reader reads that tensor; no layernorm kernel is left. Where storing would need a copy
(a concat reads it) or would make the group read its own output (a weight or an epilogue
operand computed from it), the layernorm keeps its kernel. Every case runs on the ref target,
fused against unfused, on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.ir.program import Instruction, Program
from fusegraph.ops.base import is_fused_output, is_load, is_param, is_store
from fusegraph.passes.pipeline import fuse
from fusegraph.passes.prologue_rule import STORE_NORMS_ENV
from tests.helpers import assert_same_results, make_model, rand


@pytest.fixture(autouse=True)
def _stored_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stores these tests check are taken on request only (`prologue_rule.STORE_NORMS_ENV`)."""
    monkeypatch.setenv(STORE_NORMS_ENV, "1")


TOLERANCE = 1e-6  # the same ops on the same values: only the products' sums may round differently
M, K, H = 7, 48, 40


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def post_norm_block(m: int = M, k: int = K, h: int = H, returned: bool = False):
    """y = LayerNormalization(x + r); a = MatMul(y, W1) + b1; out = MatMul(gelu(a), W2) + y:
    BERT's feed-forward block, y read by the first product as A and by the residual add."""
    nodes = [node("Add", ["x", "r"], ["s"]), node("LayerNormalization", ["s", "g", "bt"], ["y"], axis=-1, epsilon=1e-5),
             node("MatMul", ["y", "w1"], ["a0"]), node("Add", ["a0", "b1"], ["a"]), node("Gelu", ["a"], ["ga"]),
             node("MatMul", ["ga", "w2"], ["o"]), node("Add", ["o", "y"], ["out"])]
    literals = {"g": 1 + rand(k, seed=1, scale=0.1), "bt": rand(k, seed=2, scale=0.1), "w1": rand(k, h, seed=3, scale=0.2),
                "b1": rand(h, seed=4), "w2": rand(h, k, seed=5, scale=0.2)}
    return make_model(nodes, {"x": [1, m, k], "r": [1, m, k]}, ["out", "y"] if returned else ["out"], literals, opset=20)


def post_norm_layer(s: int = 9, c: int = 32, heads: int = 2, f: int = 64):
    """One BERT encoder layer: e = LN(x); self-attention on e; l1 = LN(proj + e);
    out = LN(fc2(gelu(fc1(l1))) + l1). e and l1 are each read by a product (QKV, fc1) and a
    residual add; out is returned and read by no product."""
    d = c // heads
    nodes = [node("LayerNormalization", ["x", "g0", "b0"], ["e"], axis=-1)]
    literals: dict = {"g0": 1 + rand(c, seed=1, scale=0.1), "b0": rand(c, seed=2, scale=0.1), "sqrt_d": np.array(np.sqrt(d), np.float32),
                      "split": np.array([1, s, heads, d], np.int64), "merge": np.array([1, s, c], np.int64)}
    for j, (name, perm) in enumerate([("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])]):
        literals.update({f"w{name}": rand(c, c, seed=10 + j, scale=0.2), f"c{name}": rand(c, seed=20 + j, scale=0.1)})
        nodes += [node("MatMul", ["e", f"w{name}"], [f"{name}0"]), node("Add", [f"{name}0", f"c{name}"], [f"{name}1"]),
                  node("Reshape", [f"{name}1", "split"], [f"{name}2"]), node("Transpose", [f"{name}2"], [name], perm=perm)]
    nodes += [node("MatMul", ["q", "k"], ["qk"]), node("Div", ["qk", "sqrt_d"], ["sc"]), node("Softmax", ["sc"], ["p"], axis=-1),
              node("MatMul", ["p", "v"], ["o0"]), node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              node("Reshape", ["o1", "merge"], ["o"]), node("MatMul", ["o", "wo"], ["a0"]), node("Add", ["a0", "co"], ["a1"]),
              node("Add", ["a1", "e"], ["a"]), node("LayerNormalization", ["a", "g1", "b1"], ["l1"], axis=-1),
              node("MatMul", ["l1", "w1"], ["h0"]), node("Add", ["h0", "c1"], ["h1"]), node("Gelu", ["h1"], ["h"]),
              node("MatMul", ["h", "w2"], ["f0"]), node("Add", ["f0", "c2"], ["f1"]), node("Add", ["f1", "l1"], ["f"]),
              node("LayerNormalization", ["f", "g2", "b2"], ["out"], axis=-1)]
    literals.update({"wo": rand(c, c, seed=30, scale=0.2), "co": rand(c, seed=31, scale=0.1), "g1": 1 + rand(c, seed=32, scale=0.1),
                     "b1": rand(c, seed=33, scale=0.1), "w1": rand(c, f, seed=34, scale=0.2), "c1": rand(f, seed=35, scale=0.1),
                     "w2": rand(f, c, seed=36, scale=0.2), "c2": rand(c, seed=37, scale=0.1), "g2": 1 + rand(c, seed=38, scale=0.1),
                     "b2": rand(c, seed=39, scale=0.1)})
    return make_model(nodes, {"x": [1, s, c]}, ["out"], literals, opset=20)


def chained_norms(tail: list, n: int, outputs: list[str]):
    """e = LayerNormalization(x); y = LayerNormalization(e); p = MatMul(y, W [32, n]), then
    `tail` nodes reading p or e: Swin's patch embedding norm before its first block's norm."""
    nodes = [node("LayerNormalization", ["x", "g", "bt"], ["e"], axis=-1),
             node("LayerNormalization", ["e", "g2", "bt2"], ["y"], axis=-1), node("MatMul", ["y", "w"], ["p"])]
    literals = {"g": rand(32, seed=1), "bt": rand(32, seed=2), "g2": rand(32, seed=3), "bt2": rand(32, seed=4),
                "w": rand(32, n, seed=5, scale=0.3)}
    return make_model(nodes + tail, {"x": [6, 32]}, outputs, literals)


def _fused(p: Program) -> list[Instruction]:
    return [i for i in p.main if i.op.name == "fused"]


def _kernels(p: Program) -> list[str]:
    return [f.op.attrs["kernel"] for f in _fused(p)]


def _norms(group: Instruction) -> list[Instruction]:
    return [i for i in group.op.module if i.op.algorithm == "layernorm"]


def _fused_both(model) -> tuple[Program, Program]:
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    return before, after


def test_post_norm_block_has_no_layernorm_kernel():
    before, after = _fused_both(post_norm_block())
    first, second = _fused(after)
    assert _kernels(after) == ["add_layernorm_dot_mul_erf", "dot_add"]
    (ln,) = _norms(first)
    assert len(ln.inputs) == 1  # the affine is in the weights (`fold_norm_affine`)
    # the group's further output is what the residual reads, norm * gamma + beta, computed from
    # the normalized rows and stored whole through the A index (`PrologueRule.constant_tails`)
    value, stored = first.op.module.returns
    assert is_store(stored) and stored.op.attrs["map"].is_identity()
    shifted = stored.inputs[1]
    assert shifted.op.name == "add" and shifted.inputs[0].op.name == "mul" and shifted.inputs[0].inputs[0] is ln
    (selector,) = [i for i in after.main if is_fused_output(i)]
    assert selector.inputs == [first] and selector.op.attrs["index"] == 1
    assert second.inputs[-1] is selector  # the residual add reads the stored rows
    assert not _norms(second)
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_post_norm_encoder_layer_keeps_only_its_returned_layernorm_kernel():
    """BERT's layer, 320 wide (rows wider than an epilogue's tile): the QKV product (three
    merged siblings) computes and stores the input layernorm, which the projection's residual
    add reads; fc1 does the same for the middle one; the last is returned and no product reads
    it, so it keeps its kernel."""
    before, after = _fused_both(post_norm_layer(c=320))
    kernels = _kernels(after)
    assert [k for k in kernels if "layernorm" in k] == ["layernorm_dot_add", "layernorm_dot_add_mul_erf", "layernorm"]
    assert len(kernels) == 6 and sum(is_fused_output(i) for i in after.main) == 2
    assert_same_results(before, after, tolerance=1e-5)


def test_a_narrow_post_norm_layer_takes_its_norms_in_the_epilogues():
    """32 wide, each post-norm row fits one tile of the product before it: the projection and
    fc2 take their layernorms in their epilogues (`segment_layernorm`), and only the input
    layernorm is computed by the QKV product, which stores its affine for the residual. The
    projection's epilogue stores its norm twice: normalized for fc1 (whose weights hold the
    affine) and with the affine for the residual."""
    before, after = _fused_both(post_norm_layer(c=32))
    kernels = _kernels(after)
    assert sorted(k for k in kernels if "layernorm" in k) == ["dot_add_layernorm", "dot_add_layernorm_mul", "layernorm_dot_add"]
    assert len(kernels) == 5
    assert_same_results(before, after, tolerance=1e-5)


def test_gamma_and_beta_are_read_as_vectors():
    """The importer folds a small broadcast of gamma into a full [1, M, K] literal; literal
    compaction makes it a row again, and the kernel reads it through its broadcast map."""
    _, after = _fused_both(post_norm_block())
    first = _fused(after)[0]
    (ln,) = _norms(first)
    for p in ln.inputs[1:]:
        assert is_load(p) and is_param(p.inputs[0])
        assert p.inputs[0].shape.elements == K  # one value per column, not M x K
        outside = first.inputs[list(first.op.module.params.values()).index(p.inputs[0])]
        assert outside.shape.elements == K


def test_returned_layernorm_is_the_products_further_output():
    before, after = _fused_both(post_norm_block(returned=True))
    assert _kernels(after) == ["add_layernorm_dot_mul_erf", "dot_add"]
    selector = after.main.returns[1]
    assert is_fused_output(selector) and selector.inputs[0] is _fused(after)[0]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_the_first_product_computes_and_stores_the_others_load():
    """y read by two products (the second's weights an input, so the two do not merge) and a
    relu: the first product in program order computes y (its affine in the weights: the add is
    beta W) and stores y, the second loads it."""
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["y"], axis=-1), node("MatMul", ["y", "w"], ["p"]),
                        node("MatMul", ["y", "v"], ["q"]), node("Relu", ["y"], ["z"])],
                       {"x": [6, 32], "v": [32, 5]}, ["p", "q", "z"],
                       {"g": rand(32, seed=1), "bt": rand(32, seed=2), "w": rand(32, 8, seed=3)})
    before, after = _fused_both(model)
    assert _kernels(after) == ["layernorm_dot_add", "dot", "relu"]
    first, second, relu = _fused(after)
    assert len(_norms(first)) == 1 and not _norms(second)
    (selector,) = [i for i in after.main if is_fused_output(i)]
    assert second.inputs[0] is selector and relu.inputs[0] is selector
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_chained_layernorms_are_both_computed_by_the_product():
    """Swin's patch embedding: a layernorm read by the residual and by the first block's
    layernorm, which only the product reads (its affine folded into the weights)."""
    before, after = _fused_both(chained_norms([node("Add", ["p", "e"], ["out"])], 32, ["out"]))
    (group,) = _fused(after)
    first, second = _norms(group)
    assert (len(first.inputs), second.inputs) == (3, [first])
    # the residual add joined the epilogue and reads the computed rows there (N = K, the same
    # index): nothing outside reads them, so nothing stores them
    assert len(group.op.module.returns) == 1 and any(i.op.name == "add" and first in i.inputs for i in group.op.module)
    assert_same_results(before, after, tolerance=1e-5)


def test_a_stored_layernorm_read_by_a_later_layernorm_and_a_residual():
    """As above with N != K, a relu reading the first layernorm: a pointwise op on the stored
    rows alone, so the product computes it too and stores the relu instead (one kernel)."""
    before, after = _fused_both(chained_norms([node("Relu", ["e"], ["q"])], 8, ["p", "q"]))
    assert _kernels(after) == ["layernorm_dot_add"]
    (group,) = _fused(after)
    assert len(group.op.module.returns) == 2 and group.op.module.returns[1].inputs[1].op.name == "relu"
    assert_same_results(before, after, tolerance=1e-5)


def test_a_concat_reader_keeps_the_layernorm_kernel():
    """The layernorm's own kernel writes into the concat's buffer in place; a further output
    would be copied there. (The product's weights are an input here: with literal weights the
    affine moves into them and the concat reads norm * gamma + beta, which the product stores,
    as the next test shows.)"""
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["y"], axis=-1), node("MatMul", ["y", "w"], ["p"]),
                        node("Concat", ["y", "z"], ["c"], axis=1), node("Relu", ["c"], ["q"])],
                       {"x": [6, 32], "z": [6, 4], "w": [32, 8]}, ["p", "q"], {"g": rand(32, seed=1), "bt": rand(32, seed=2)})
    before, after = _fused_both(model)
    assert not any(is_fused_output(i) for i in after.main)
    assert any(k.startswith("layernorm") and "dot" not in k for k in _kernels(after))
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_concat_of_the_affine_reads_the_products_stored_rows():
    model = make_model([node("LayerNormalization", ["x", "g", "bt"], ["y"], axis=-1), node("MatMul", ["y", "w"], ["p"]),
                        node("Concat", ["y", "z"], ["c"], axis=1), node("Relu", ["c"], ["q"])], {"x": [6, 32], "z": [6, 4]},
                       ["p", "q"], {"g": rand(32, seed=1), "bt": rand(32, seed=2), "w": rand(32, 8, seed=3)})
    before, after = _fused_both(model)
    assert _kernels(after) == ["layernorm_dot_add", "concat_relu"]
    (selector,) = [i for i in after.main if is_fused_output(i)]
    assert selector in _fused(after)[1].inputs
    assert_same_results(before, after, tolerance=1e-5)


@pytest.mark.parametrize("reader", ["weights", "epilogue"])
def test_a_group_that_would_read_its_own_store_keeps_the_layernorm_kernel(reader):
    """y @ relu(y)^T (the weights computed from y) or y @ W + relu(y) (an epilogue operand
    computed from y): storing y would make the product's group wait for itself."""
    nodes = [node("LayerNormalization", ["x", "g", "bt"], ["y"], axis=-1), node("Relu", ["y"], ["z"])]
    if reader == "weights":
        nodes += [node("Transpose", ["z"], ["zt"], perm=[1, 0]), node("MatMul", ["y", "zt"], ["out"])]
    else:
        nodes += [node("MatMul", ["y", "w"], ["p"]), node("Add", ["p", "z"], ["out"])]
    model = make_model(nodes, {"x": [6, 32]}, ["out"], {"g": rand(32, seed=1), "bt": rand(32, seed=2), "w": rand(32, 32, seed=3)})
    before, after = _fused_both(model)
    (product,) = [f for f in _fused(after) if any(i.op.name == "dot" for i in f.op.module)]
    assert not _norms(product) and len(product.op.module.returns) == 1
    assert any(_norms(f) for f in _fused(after) if f is not product)  # the layernorm's own kernel
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_post_norm_block_on_random_shapes():
    """Rows and columns that fit no tile: the same structure, the same values."""
    rng = np.random.default_rng(4)
    for _ in range(3):
        m, k, h = (int(v) for v in rng.integers(1, 40, 3))
        before, after = _fused_both(post_norm_block(m, k + 1, h))
        assert not any(name.startswith("layernorm") and "dot" not in name for name in _kernels(after))
        assert_same_results(before, after, tolerance=1e-5)
