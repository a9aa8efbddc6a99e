"""Small attention blocks written in plain ONNX ops, the way exporters write them.

Shared by the attention pass tests and the gpu attention tests: a ViT block (one QKV
projection, head split by reshape and transpose, q, k, v picked with Gather), a BERT
self-attention (three projections, K pre-transposed by its Transpose, scores divided by
sqrt(d), an additive padding mask [B, 1, 1, S]) and a GPT-2 style causal block.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

from tests.helpers import make_model, rand

I64 = np.int64


def _heads_out(nodes: list, b: int, s: int, c: int, inits: dict) -> None:
    """attn·V [B, H, S, D] -> transpose -> reshape [B, S, C] -> projection -> y."""
    inits["merge"] = np.array([b, s, c], I64)
    inits["w_proj"] = rand(c, c, seed=9, scale=c ** -0.5)
    nodes += [helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["om"]),
              helper.make_node("MatMul", ["om", "w_proj"], ["y"])]


def vit_block(b: int = 2, s: int = 17, h: int = 2, d: int = 16, scale_on: str = "qk",
              dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """timm's attention: `scale_on` "q" multiplies q by d**-0.5 (timm's own code), "qk" q and
    kᵀ by d**-0.25 each (the exporters' SDPA decomposition), "k" k before its transpose and q."""
    c = h * d
    inits = {"w_qkv": rand(c, 3 * c, seed=1, scale=c ** -0.5), "b_qkv": rand(3 * c, seed=2, scale=0.1),
             "split": np.array([b, s, 3, h, d], I64), "i0": np.array(0, I64), "i1": np.array(1, I64),
             "i2": np.array(2, I64)}
    nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv0"]), helper.make_node("Add", ["qkv0", "b_qkv"], ["qkv"]),
             helper.make_node("Reshape", ["qkv", "split"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4])]
    nodes += [helper.make_node("Gather", ["t", f"i{j}"], [n], axis=0) for j, n in enumerate("qkv")]
    root = d ** -0.25
    if scale_on == "q":
        inits["sc"] = np.array(d ** -0.5, np.float32)
        nodes += [helper.make_node("Mul", ["q", "sc"], ["qs"]), helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    elif scale_on == "qk":
        inits["sc"] = np.array(root, np.float32)
        nodes += [helper.make_node("Mul", ["q", "sc"], ["qs"]), helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 1, 3, 2]),
                  helper.make_node("Mul", ["k_t", "sc"], ["kt"])]
    else:
        inits["sc"] = np.array(root, np.float32)
        nodes += [helper.make_node("Mul", ["q", "sc"], ["qs"]), helper.make_node("Mul", ["sc", "k"], ["ks"]),
                  helper.make_node("Transpose", ["ks"], ["kt"], perm=[0, 1, 3, 2])]
    nodes += [helper.make_node("MatMul", ["qs", "kt"], ["sc0"]), helper.make_node("Softmax", ["sc0"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"])]
    _heads_out(nodes, b, s, c, inits)
    return _typed(make_model(nodes, {"x": [b, s, c]}, ["y"], inits), dtype)


def _projection(nodes: list, inits: dict, name: str, perm: list[int], seed: int, b: int, s: int, h: int, d: int) -> None:
    c = h * d
    inits[f"w_{name}"] = rand(c, c, seed=seed, scale=c ** -0.5)
    inits["heads"] = np.array([b, s, h, d], I64)
    nodes += [helper.make_node("MatMul", ["x", f"w_{name}"], [f"{name}0"]),
              helper.make_node("Reshape", [f"{name}0", "heads"], [f"{name}r"]),
              helper.make_node("Transpose", [f"{name}r"], [name], perm=perm)]


def bert_attention(b: int = 2, s: int = 19, h: int = 2, d: int = 16, mask: str = "padding",
                   dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """BERT's self-attention: K transposed by the head split itself, scores / sqrt(d), and
    with `mask` "padding" the extended mask (1 - m[B, 1, 1, S]) * -10000 added."""
    c = h * d
    nodes: list = []
    inits: dict = {"sqrt_d": np.array(np.sqrt(d), np.float32)}
    _projection(nodes, inits, "q", [0, 2, 1, 3], 1, b, s, h, d)
    _projection(nodes, inits, "k", [0, 2, 3, 1], 2, b, s, h, d)
    _projection(nodes, inits, "v", [0, 2, 1, 3], 3, b, s, h, d)
    nodes += [helper.make_node("MatMul", ["q", "k"], ["qk"]), helper.make_node("Div", ["qk", "sqrt_d"], ["sc0"])]
    inputs = {"x": [b, s, c]}
    last = "sc0"
    if mask == "padding":
        inputs["m"] = [b, s]
        inits.update({"axes12": np.array([1, 2], I64), "one": np.array(1, np.float32), "neg": np.array(-10000, np.float32)})
        nodes += [helper.make_node("Unsqueeze", ["m", "axes12"], ["m4"]), helper.make_node("Sub", ["one", "m4"], ["inv"]),
                  helper.make_node("Mul", ["inv", "neg"], ["ext"]), helper.make_node("Add", ["sc0", "ext"], ["sc1"])]
        last = "sc1"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"])]
    _heads_out(nodes, b, s, c, inits)
    return _typed(make_model(nodes, inputs, ["y"], inits), dtype)


def causal_attention(b: int = 1, s: int = 18, h: int = 2, d: int = 16, form: str = "where",
                     dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """GPT-2's masked attention: `form` "where" keeps scores under a constant lower triangle
    sliced from a larger [1, 1, 32, 32] buffer against finfo.min; "add" adds a 0 / -inf
    triangle."""
    c = h * d
    nodes: list = []
    inits: dict = {"sqrt_d": np.array(np.sqrt(d), np.float32)}
    _projection(nodes, inits, "q", [0, 2, 1, 3], 1, b, s, h, d)
    _projection(nodes, inits, "k", [0, 2, 3, 1], 2, b, s, h, d)
    _projection(nodes, inits, "v", [0, 2, 1, 3], 3, b, s, h, d)
    nodes += [helper.make_node("MatMul", ["q", "k"], ["qk"]), helper.make_node("Div", ["qk", "sqrt_d"], ["sc0"])]
    tril = np.tril(np.ones((32, 32), bool))
    if form == "where":
        inits.update({"bias": tril[None, None], "zero2": np.array([0, 0], I64), "end2": np.array([s, s], I64),
                      "ax23": np.array([2, 3], I64), "fill": np.array(np.finfo(np.float32).min, np.float32)})
        nodes += [helper.make_node("Slice", ["bias", "zero2", "end2", "ax23"], ["cm"]),
                  helper.make_node("Where", ["cm", "sc0", "fill"], ["sc1"])]
    else:
        inits["tri"] = np.where(tril[:s, :s], 0, -np.inf).astype(np.float32)
        nodes += [helper.make_node("Add", ["sc0", "tri"], ["sc1"])]
    nodes += [helper.make_node("Softmax", ["sc1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"])]
    _heads_out(nodes, b, s, c, inits)
    return _typed(make_model(nodes, {"x": [b, s, c]}, ["y"], inits), dtype)


def _typed(model: onnx.ModelProto, dtype: int) -> onnx.ModelProto:
    """The model in `dtype` (float16: inputs, outputs and float initializers converted)."""
    if dtype == TensorProto.FLOAT:
        return model
    from onnx import numpy_helper

    g = model.graph
    for vi in list(g.input) + list(g.output):
        vi.type.tensor_type.elem_type = dtype
    for k, t in enumerate(g.initializer):
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32:
            g.initializer[k].CopyFrom(numpy_helper.from_array(a.astype(np.float16), t.name))
    return model


def window_attention(windows: int = 4, n: int = 16, h: int = 2, d: int = 16, batch: int = 1,
                     dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """Swin's shifted-window attention on [B * nW, N, C] windows: q scaled, a relative position
    bias [H, N, N] added, the scores regrouped to [B, nW, H, N, N] to add the shift mask
    [nW, 1, N, N] (0 / -100), then back to [B * nW, H, N, N] for the softmax."""
    c, bw = h * d, batch * windows
    rng = np.random.default_rng(7)
    shift = np.where(rng.random((windows, 1, n, n)) < 0.3, -100.0, 0.0).astype(np.float32)
    shift[..., 0] = 0.0
    inits = {"w_qkv": rand(c, 3 * c, seed=1, scale=c ** -0.5), "split": np.array([bw, n, 3, h, d], I64),
             "i0": np.array(0, I64), "i1": np.array(1, I64), "i2": np.array(2, I64),
             "sc": np.array(d ** -0.5, np.float32), "rel": rand(h, n, n, seed=3), "shift": shift,
             "groups": np.array([batch, windows, h, n, n], I64), "flat": np.array([bw, h, n, n], I64),
             "merge": np.array([bw, n, c], I64), "w_proj": rand(c, c, seed=9, scale=c ** -0.5)}
    nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"]), helper.make_node("Reshape", ["qkv", "split"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4])]
    nodes += [helper.make_node("Gather", ["t", f"i{j}"], [nm], axis=0) for j, nm in enumerate("qkv")]
    nodes += [helper.make_node("Mul", ["q", "sc"], ["qs"]), helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qs", "kt"], ["a0"]), helper.make_node("Add", ["a0", "rel"], ["a1"]),
              helper.make_node("Reshape", ["a1", "groups"], ["a2"]), helper.make_node("Add", ["a2", "shift"], ["a3"]),
              helper.make_node("Reshape", ["a3", "flat"], ["a4"]), helper.make_node("Softmax", ["a4"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"]), helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["om"]), helper.make_node("MatMul", ["om", "w_proj"], ["y"])]
    return _typed(make_model(nodes, {"x": [bw, n, c]}, ["y"], inits), dtype)


def float32_softmax_attention(b: int = 2, s: int = 17, h: int = 2, d: int = 16) -> onnx.ModelProto:
    """A float16 model whose softmax runs in float32 (Hugging Face's `softmax(..., dtype=float32)`):
    the scores cast up, the probabilities cast back down before the product with V."""
    model = vit_block(b, s, h, d, scale_on="q", dtype=TensorProto.FLOAT16)
    g = model.graph
    k = next(i for i, nd in enumerate(g.node) if nd.op_type == "Softmax")
    g.node[k].input[0], g.node[k].output[0] = "sc32", "p32"
    g.node.insert(k, helper.make_node("Cast", ["sc0"], ["sc32"], to=TensorProto.FLOAT))
    g.node.insert(k + 2, helper.make_node("Cast", ["p32"], ["p"], to=TensorProto.FLOAT16))
    return model


def guarded_bool_mask_attention(b: int = 2, s: int = 17, h: int = 2, d: int = 16) -> onnx.ModelProto:
    """PyTorch's export of `scaled_dot_product_attention` with a boolean mask: the mask as
    where(m, 0, -inf) added to the scores, and the probabilities guarded by
    where(isnan(p), 0, p) for rows the mask empties."""
    model = vit_block(b, s, h, d, scale_on="qk")
    g = model.graph
    k = next(i for i, nd in enumerate(g.node) if nd.op_type == "Softmax")
    g.node[k].input[0], g.node[k].output[0] = "masked", "p0"
    g.initializer.extend([onnx.numpy_helper.from_array(np.array(0, np.float32), "zero"),
                          onnx.numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")])
    g.node.insert(k, helper.make_node("Where", ["m", "zero", "ninf"], ["madd"]))
    g.node.insert(k + 1, helper.make_node("Add", ["sc0", "madd"], ["masked"]))
    g.node.insert(k + 3, helper.make_node("IsNaN", ["p0"], ["nan"]))
    g.node.insert(k + 4, helper.make_node("Where", ["nan", "zero", "p0"], ["p"]))
    g.input.append(helper.make_tensor_value_info("m", TensorProto.BOOL, [b, 1, s, s]))
    return model
