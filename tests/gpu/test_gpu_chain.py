"""Chained products (`passes/chain_products.py`, `templates/gemm_chain.py`) under Triton's
interpreter (or on a GPU): a transformer MLP (layernorm, fc1, bias, GELU, fc2, bias, residual)
as one kernel, against the NumPy reference target on NaN-poisoned buffers, under every
candidate config, with row, hidden and output widths that no tile divides; a second run of
the same kernel gives the same bits (the counters were reset, the sums kept their order)."""

from __future__ import annotations

import numpy as np
import pytest

from fusegraph import api, parse_onnx
from fusegraph.ops.base import is_fused
from fusegraph.passes.chain_products import CHAIN_ENV, CHAIN_MAX_ROWS
from fusegraph.passes.pipeline import fuse
from tests.gpu.test_gpu_kernels import TOL, node
from tests.helpers import make_model, rand, rel_err

FP16_TOL = 2e-2


def mlp(rows: int, width: int, hidden: int, out: int, norm: bool = True):
    """[1, rows, width] -> (layernorm) -> fc1 + bias -> GELU (erf form) -> fc2 + bias (+ x when out == width)."""
    nodes = [node("LayerNormalization", ["x", "g", "be"], ["n"], axis=-1, epsilon=1e-5)] if norm else []
    a = "n" if norm else "x"
    nodes += [node("MatMul", [a, "w1"], ["h0"]), node("Add", ["h0", "b1"], ["h1"]),
              node("Div", ["h1", "sq2"], ["h2"]), node("Erf", ["h2"], ["h3"]), node("Add", ["h3", "one"], ["h4"]),
              node("Mul", ["h1", "h4"], ["h5"]), node("Mul", ["h5", "half"], ["h"]),
              node("MatMul", ["h", "w2"], ["y0"]), node("Add", ["y0", "b2"], ["y1" if out == width else "y"])]
    if out == width:
        nodes.append(node("Add", ["y1", "x"], ["y"]))
    weights = {"w1": rand(width, hidden, seed=1, scale=width ** -0.5), "b1": rand(hidden, seed=2, scale=0.1),
               "w2": rand(hidden, out, seed=3, scale=hidden ** -0.5), "b2": rand(out, seed=4, scale=0.1),
               "sq2": np.array(2 ** 0.5, np.float32), "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    if norm:
        weights.update(g=1 + rand(width, seed=5, scale=0.1), be=rand(width, seed=6, scale=0.1))
    return make_model(nodes, {"x": [1, rows, width]}, ["y"], weights)


@pytest.fixture
def chains(monkeypatch):
    monkeypatch.setenv(CHAIN_ENV, "1")


def _kernels(model) -> list[str]:
    p = parse_onnx(model)
    fuse(p)
    return [i.op.attrs["kernel"] for i in p.main if is_fused(i)]


def test_the_pass_merges_an_mlp_only_when_asked(monkeypatch):
    model = mlp(37, 48, 96, 48)
    monkeypatch.delenv(CHAIN_ENV, raising=False)
    assert _kernels(model) == ["layernorm_dot_add_div_erf_mul", "dot_add"]
    monkeypatch.setenv(CHAIN_ENV, "1")
    assert _kernels(model) == ["layernorm_dot_add_div_erf_mul_dot_add"]


def test_many_rows_keep_two_kernels(chains):
    assert len(_kernels(mlp(CHAIN_MAX_ROWS + 1, 16, 32, 16, norm=False))) == 2


def test_a_hidden_value_read_elsewhere_keeps_two_kernels(chains):
    """The hidden rows are also returned: the first group's value is needed outside."""
    model = mlp(20, 16, 32, 16, norm=False)
    model.graph.output.append(type(model.graph.output[0])(name="h"))
    p = parse_onnx(model)
    fuse(p)
    assert sum(1 for i in p.main if is_fused(i)) >= 2


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("rows,width,hidden,out", [(37, 48, 160, 48), (19, 32, 64, 40), (5, 24, 300, 24)])
def test_mlp_as_one_kernel_under_every_candidate(chains, rows, width, hidden, out, fp16):
    model = mlp(rows, width, hidden, out)
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False, fp16=fp16)
    (k,) = compiled.kernels
    assert k.src.template == "gemm" and k.src.chain_columns == out
    rng = np.random.default_rng()
    for config in k.src.configs:
        k.config = config
        x = rng.standard_normal((1, rows, width)).astype(np.float32)
        want = api.run(program, {"x": x})["y"]
        compiled.poison()
        got = np.asarray(compiled.run({"x": x})["y"])
        assert not np.isnan(got).any(), config
        assert rel_err(got, want) <= (FP16_TOL if fp16 else TOL), config
        again = np.asarray(compiled.run({"x": x})["y"])
        np.testing.assert_array_equal(again, got)


def convnext_block(channels: int, side: int):
    """ConvNeXt's MLP: NCHW -> NHWC -> layernorm -> fc1 -> GELU -> fc2 -> layer scale -> NCHW,
    plus the block's input: the second product stores through a transpose."""
    c, hidden = channels, 4 * channels
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             node("LayerNormalization", ["t", "g", "be"], ["n"], axis=-1, epsilon=1e-6),
             node("MatMul", ["n", "w1"], ["h0"]), node("Add", ["h0", "b1"], ["h1"]),
             node("Div", ["h1", "sq2"], ["h2"]), node("Erf", ["h2"], ["h3"]), node("Add", ["h3", "one"], ["h4"]),
             node("Mul", ["h1", "h4"], ["h5"]), node("Mul", ["h5", "half"], ["h"]),
             node("MatMul", ["h", "w2"], ["y0"]), node("Add", ["y0", "b2"], ["y1"]), node("Mul", ["y1", "ls"], ["y2"]),
             node("Transpose", ["y2"], ["y3"], perm=[0, 3, 1, 2]), node("Add", ["y3", "x"], ["y"])]
    weights = {"w1": rand(c, hidden, seed=1, scale=c ** -0.5), "b1": rand(hidden, seed=2, scale=0.1),
               "w2": rand(hidden, c, seed=3, scale=hidden ** -0.5), "b2": rand(c, seed=4, scale=0.1),
               "ls": rand(c, seed=7, scale=0.5), "g": 1 + rand(c, seed=5, scale=0.1), "be": rand(c, seed=6, scale=0.1),
               "sq2": np.array(2 ** 0.5, np.float32), "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    return make_model(nodes, {"x": [1, c, side, side]}, ["y"], weights)


def classifier(width: int, hidden: int, classes: int):
    """One pooled row through two linear layers (MobileNetV3's head: hard swish between)."""
    nodes = [node("Gemm", ["x", "w1", "b1"], ["h0"]), node("HardSwish", ["h0"], ["h"]),
             node("Gemm", ["h", "w2", "b2"], ["y"])]
    weights = {"w1": rand(width, hidden, seed=1, scale=width ** -0.5), "b1": rand(hidden, seed=2, scale=0.1),
               "w2": rand(hidden, classes, seed=3, scale=hidden ** -0.5), "b2": rand(classes, seed=4, scale=0.1)}
    return make_model(nodes, {"x": [1, width]}, ["y"], weights)


@pytest.mark.parametrize("model", [convnext_block(24, 5), classifier(40, 200, 70)], ids=["convnext-block", "classifier"])
def test_other_chains_as_one_kernel(chains, model):
    program = parse_onnx(model)
    compiled = api.compile(program, "gpu", tune=False)
    (k,) = [k for k in compiled.kernels if k.src.chain_columns]
    rng = np.random.default_rng()
    x = rng.standard_normal(program.input_shapes["x"].lens).astype(np.float32)
    want = api.run(program, {"x": x})["y"]
    for config in k.src.configs[:3]:
        k.config = config
        compiled.poison()
        got = np.asarray(compiled.run({"x": x})["y"])
        assert not np.isnan(got).any(), config
        assert rel_err(got, want) <= TOL, config
