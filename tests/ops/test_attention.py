"""The attention operators: ONNX's `Attention` (opset 23) and ONNX Runtime's `com.microsoft`
`MultiHeadAttention` and `Attention`, each against ONNX Runtime on fresh random inputs, on
the reference target unfused and fused (one attention kernel); and the op's own reference
against a float64 softmax written out in NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from fusegraph import api, parse_onnx
from fusegraph.ops.attention import Attention
from fusegraph.passes.pipeline import fuse
from tests.helpers import make_model, ort_run, rel_err

TOL = 1e-5


def _inputs(model, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        t = vi.type.tensor_type.elem_type
        if t == TensorProto.BOOL:
            keep = rng.random(shape) < 0.75
            keep[..., 0] = True
            out[vi.name] = keep
        elif t == TensorProto.INT32:
            mask = (rng.random(shape) < 0.75).astype(np.int32)
            mask[..., 0] = 1
            out[vi.name] = mask
        else:
            out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def check(model, n_outputs: int = 1) -> None:
    inputs = _inputs(model, 4)
    want = ort_run(model, inputs)
    program = parse_onnx(model)
    got = api.run(program, inputs)
    fuse(program)
    fused = api.run(program, inputs)
    kernels = [i.op.attrs["kernel"] for i in program.main if i.op.name == "fused"]
    assert sum("attention" in k for k in kernels) == 1, kernels
    for k, name in enumerate([o.name for o in model.graph.output][:n_outputs]):
        assert rel_err(got[name], want[k]) < TOL, name
        assert rel_err(fused[name], want[k]) < TOL, name


def _with_types(model, types: dict[str, int]):
    for vi in model.graph.input:
        if vi.name in types:
            vi.type.tensor_type.elem_type = types[vi.name]
    return model


@pytest.mark.parametrize("mask,causal,scale", [(None, 0, None), ("float", 0, 0.3), ("bool", 1, None), (None, 1, None)])
def test_onnx_attention_4d(mask, causal, scale):
    b, h, s, d = 2, 3, 9, 8
    shapes = {"q": [b, h, s, d], "k": [b, h, s, d], "v": [b, h, s, d]}
    names = ["q", "k", "v"]
    if mask:
        shapes["m"] = [b, 1, s, s]
        names.append("m")
    attrs = {"is_causal": causal} | ({"scale": scale} if scale else {})
    model = make_model([helper.make_node("Attention", names, ["y"], **attrs)], shapes, ["y"], opset=23)
    check(_with_types(model, {"m": TensorProto.BOOL} if mask == "bool" else {}))


def test_onnx_attention_3d_grouped_query_heads():
    """Packed [B, S, heads * D] inputs, 4 query heads sharing 2 key/value heads."""
    b, s, d = 2, 7, 8
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=4, kv_num_heads=2)
    check(make_model([node], {"q": [b, s, 4 * d], "k": [b, s, 2 * d], "v": [b, s, 2 * d]}, ["y"], opset=23))


def test_onnx_attention_cached_keys_causal_and_present_outputs():
    b, h, s, past, d = 1, 2, 5, 6, 8
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "present_k", "present_v"], is_causal=1)
    shapes = {"q": [b, h, s, d], "k": [b, h, s, d], "v": [b, h, s, d], "pk": [b, h, past, d], "pv": [b, h, past, d]}
    check(make_model([node], shapes, ["y", "present_k", "present_v"], opset=23), n_outputs=3)


def _ms_model(nodes, inputs, types=None):
    model = make_model(nodes, inputs, ["y"], opset=17)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return _with_types(model, types or {})


@pytest.mark.parametrize("padding,unidirectional", [(False, 0), (True, 0), (False, 1)])
def test_ms_multi_head_attention(padding, unidirectional):
    b, s, h, d = 2, 6, 2, 8
    names = ["q", "k", "v", "bias"] + (["pad"] if padding else [])
    inputs = {"q": [b, s, h * d], "k": [b, s, h * d], "v": [b, s, h * d], "bias": [3 * h * d]}
    if padding:
        inputs["pad"] = [b, s]
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain="com.microsoft", num_heads=h,
                            unidirectional=unidirectional)
    check(_ms_model([node], inputs, {"pad": TensorProto.INT32}))


def test_ms_attention_with_weights_and_mask():
    b, s, h, d, c = 2, 5, 2, 8, 12
    node = helper.make_node("Attention", ["x", "w", "bias", "mask"], ["y"], domain="com.microsoft", num_heads=h)
    inputs = {"x": [b, s, c], "w": [c, 3 * h * d], "bias": [3 * h * d], "mask": [b, s]}
    check(_ms_model([node], inputs, {"mask": TensorProto.INT32}))


def test_reference_is_a_float64_softmax():
    rng = np.random.default_rng(0)
    q, k, v, m = (rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 4), (2, 7, 4), (2, 7, 3), (2, 5, 7)))
    got = Attention(0.5, causal=True).reference([q, k, v, m])
    s = np.einsum("bqd,bkd->bqk", q.astype(np.float64), k) * 0.5 + m
    s = np.where(np.arange(7)[None, :] <= np.arange(5)[:, None] + 2, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    assert got.dtype == np.float32 and rel_err(got, want) < 1e-6
