"""The attention pass: attention written in plain ONNX ops, as ViT's, BERT's and GPT-2's
exporters write it, becomes one `attention` anchor with the scales folded, the mask kept as an
input or recognized as causal, and fused programs compute what unfused ones do."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from fusegraph import api, parse_onnx
from fusegraph.driver.inputs import random_inputs
from fusegraph.ir.program import Instruction, Program
from fusegraph.passes.fuse_attention import FuseAttention, constant_mask_kind
from fusegraph.passes.manager import run_passes
from fusegraph.passes.pipeline import canonicalize_passes, fuse
from tests.attention_models import (bert_attention, causal_attention, float32_softmax_attention,
                                    guarded_bool_mask_attention, vit_block, window_attention)
from tests.helpers import ort_run, rel_err


def attentions(program: Program) -> list[Instruction]:
    """The attention instructions, inside fused groups or not."""
    return [i for m in program.modules() for i in m if i.op.name == "attention"]


def fused_equals_unfused(model, tolerance: float, mask_binary: bool = False) -> Program:
    plain, fused = parse_onnx(model), parse_onnx(model)
    fuse(fused)
    inputs = random_inputs(plain.input_shapes, 5)
    if mask_binary:  # a padding mask of ones and zeros, every row keeping its first key
        m = (np.random.default_rng(1).random(inputs["m"].shape) < 0.7).astype(inputs["m"].dtype)
        m[:, 0] = 1
        inputs["m"] = m
    want, got = api.run(plain, inputs), api.run(fused, inputs)
    for name in want:
        assert not np.isnan(got[name]).any(), name
        assert rel_err(got[name], want[name]) <= tolerance, name
    return fused


@pytest.mark.parametrize("scale_on", ["q", "qk", "k"])
def test_vit_attention_is_one_anchor_with_the_scales_folded(scale_on):
    model = vit_block(scale_on=scale_on)
    program = fused_equals_unfused(model, 1e-5)
    (att,) = attentions(program)
    assert att.op.attrs["scale"] == pytest.approx(16 ** -0.5, rel=1e-6)
    assert att.op.attrs["causal"] is False and len(att.inputs) == 3
    kernels = [i.op.attrs["kernel"] for i in program.main if i.op.name == "fused"]
    assert kernels == ["dot_add_reshape_transpose", "attention_transpose_reshape", "dot"]
    x = random_inputs(program.input_shapes, 2)
    (want,) = ort_run(model, x)
    assert rel_err(api.run(program, x)["y"], want) < 1e-5


def test_printed_program_before_and_after_the_pass():
    program = parse_onnx(vit_block(scale_on="q"))
    run_passes(program, canonicalize_passes())
    before = str(program.main)
    assert "softmax[axis=3]" in before and "attention" not in before
    assert FuseAttention().apply(program.main)
    after = str(program.main)
    assert "softmax" not in after and after.count("dot") == 2  # the QKV and output projections
    assert "attention[scale=0.25,causal=False]" in after


def test_bert_padding_mask_is_an_input_computed_in_the_kernel():
    program = fused_equals_unfused(bert_attention(), 1e-5, mask_binary=True)
    (att,) = attentions(program)
    assert len(att.inputs) == 4 and att.op.attrs["causal"] is False
    assert att.op.attrs["scale"] == pytest.approx(0.25)
    # (1 - m) * -10000 is recomputed where the attention kernel reads it: no kernel of its own
    kernels = [i.op.attrs["kernel"] for i in program.main if i.op.name == "fused"]
    # the Q, K and V projections are one product (merge_siblings); the attention kernel reads each
    # head split through its index map from that product's output
    assert kernels == ["dot", "sub_mul_attention_transpose_reshape", "dot"]


def test_bert_without_mask():
    (att,) = attentions(fused_equals_unfused(bert_attention(mask="none"), 1e-5))
    assert len(att.inputs) == 3


@pytest.mark.parametrize("form", ["where", "add"])
def test_causal_constant_mask_becomes_causal(form):
    program = fused_equals_unfused(causal_attention(form=form), 1e-5)
    (att,) = attentions(program)
    assert att.op.attrs["causal"] is True and len(att.inputs) == 3
    (fused,) = [i for i in program.main if i.op.name == "fused" and "attention" in i.op.attrs["kernel"]]
    assert all(x.op.name != "@literal" for x in fused.inputs)  # no mask read


def test_half_precision_attention():
    program = fused_equals_unfused(vit_block(scale_on="qk", dtype=TensorProto.FLOAT16), 3e-3)
    assert len(attentions(program)) == 1


def test_attention_weights_returned_stay_unfused():
    model = vit_block()
    model.graph.output.add().CopyFrom(model.graph.output[0])
    model.graph.output[1].name = "p"
    program = fused_equals_unfused(model, 1e-5)
    assert attentions(program) == []


def test_constant_mask_kinds():
    tri = np.where(np.tril(np.ones((4, 6), bool), 2), 0, -np.inf)
    assert constant_mask_kind(tri[None, None], 4, 6) == "causal"
    assert constant_mask_kind(np.zeros((1, 1, 1, 1)), 4, 6) == "zero"
    assert constant_mask_kind(np.where(np.tril(np.ones((4, 6), bool), 2), 0, -1e9), 4, 6) == "causal"
    assert constant_mask_kind(np.where(np.tril(np.ones((4, 6), bool), 2), 0, -1.0), 4, 6) is None
    assert constant_mask_kind(np.where(np.tril(np.ones((4, 6), bool)), 0, -np.inf), 4, 6) is None  # offset 0, not 2
    varying = np.stack([tri, np.zeros((4, 6))])[:, None]
    assert constant_mask_kind(varying, 4, 6) is None


def test_swin_window_attention_with_bias_and_shift_mask():
    """Two masks, the second added between batch reshapes: both summed into one mask input."""
    program = fused_equals_unfused(window_attention(), 1e-5)
    (att,) = attentions(program)
    assert len(att.inputs) == 4 and att.op.attrs["scale"] == pytest.approx(0.25)


def test_softmax_in_float32_between_casts():
    program = fused_equals_unfused(float32_softmax_attention(), 3e-3)
    (att,) = attentions(program)
    assert att.shape.dtype.numpy == np.float16


def test_boolean_mask_with_the_exporters_nan_guard():
    """where(m, 0, -inf) added, softmax, where(isnan(p), 0, p): the guard's zeros for emptied
    rows are what the attention op gives; here row 3 of the first batch entry sees no key."""
    model = guarded_bool_mask_attention()
    plain, fused = parse_onnx(model), parse_onnx(model)
    fuse(fused)
    (att,) = attentions(fused)
    assert len(att.inputs) == 4
    inputs = random_inputs(plain.input_shapes, 5)
    inputs["m"] = np.random.default_rng(2).random(inputs["m"].shape) < 0.7
    inputs["m"][0, 0, 3] = False
    want, got = api.run(plain, inputs)["y"], api.run(fused, inputs)["y"]
    assert rel_err(got, want) < 1e-5


def _torch_block(torch, mode: str):
    """A timm-style attention block: one QKV projection, heads split by reshape and permute,
    attention by `scaled_dot_product_attention` or written out (`q * scale @ kᵀ`, softmax, @ v)."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.proj, self.heads = nn.Linear(32, 96), nn.Linear(32, 32), 2

        def forward(self, x, mask=None):
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
            if mode == "explicit":
                a = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
                o = (a + mask).softmax(-1) @ v
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mode == "causal")
            return self.proj(o.transpose(1, 2).reshape(b, n, c))

    return Block().eval()


@pytest.mark.parametrize("mode", ["causal", "bool-mask", "explicit"])
def test_blocks_exported_by_torch(mode, tmp_path):
    """PyTorch's own export (the TorchScript exporter, opset 17) of each form: one attention
    anchor, causal found from the exported triangle, fused == unfused."""
    torch = pytest.importorskip("torch")
    import warnings

    torch.manual_seed(0)
    x = torch.randn(2, 9, 32)
    mask = {"causal": None, "bool-mask": torch.rand(2, 1, 9, 9) < 0.7, "explicit": torch.randn(2, 1, 9, 9)}[mode]
    if mode == "bool-mask":
        mask[..., 0] = True
    args = (x,) if mask is None else (x, mask)
    path = tmp_path / "block.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_torch_block(torch, mode), args, str(path), dynamo=False, opset_version=17)
    program = fused_equals_unfused(onnx.load(str(path)), 1e-5, mask_binary=False)
    (att,) = attentions(program)
    assert att.op.attrs["causal"] is (mode == "causal") and len(att.inputs) == (3 if mode == "causal" else 4)
