"""Horizontal fusion (passes/merge_siblings.py): sibling convolutions and matrix products that
read the same input become one anchor with stacked weights, and concat elimination lets the
merged kernel write both a concat part and its extra channels into one buffer. Each test checks
the program structure and that the fused program computes what the unfused one does."""

from __future__ import annotations

import numpy as np
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.driver.inputs import random_inputs
from fusegraph.ir.program import Instruction, Program
from fusegraph.passes.manager import run_passes
from fusegraph.passes.merge_siblings import MergeSiblings
from fusegraph.passes.pipeline import canonicalize_passes, count_kernels, default_pipeline, fuse
from tests.helpers import assert_same_results, make_model, op_names, rand, rel_err


def _silu(x: str, out: str) -> list:
    return [helper.make_node("Sigmoid", [x], [out + "_s"]), helper.make_node("Mul", [x, out + "_s"], [out])]


def _conv(x: str, w: str, b: str, out: str, **attrs) -> list:
    return [helper.make_node("Conv", [x, w, b], [out + "_c"], **attrs), *_silu(out + "_c", out)]


def c3_block(shortcut_bottleneck: bool = True):
    """YOLOv5's C3: cv1 and cv2 read x; cv1 feeds a bottleneck (with a residual add), whose
    output is concatenated with cv2's and read by cv3."""
    c = 4
    nodes = _conv("x", "w1", "b1", "h1") + _conv("h1", "wb", "bb", "hb", pads=[1, 1, 1, 1])
    nodes += [helper.make_node("Add", ["h1", "hb"], ["m"])] if shortcut_bottleneck else \
        [helper.make_node("Identity", ["hb"], ["m"])]
    nodes += _conv("x", "w2", "b2", "h2")
    nodes += [helper.make_node("Concat", ["m", "h2"], ["cat"], axis=1)]
    nodes += _conv("cat", "w3", "b3", "y")
    weights = {
        "w1": rand(c, 6, 1, 1, seed=1), "b1": rand(c, seed=2), "wb": rand(c, c, 3, 3, seed=3, scale=0.3),
        "bb": rand(c, seed=4), "w2": rand(c, 6, 1, 1, seed=5), "b2": rand(c, seed=6),
        "w3": rand(5, 2 * c, 1, 1, seed=7), "b3": rand(5, seed=8),
    }
    return make_model(nodes, {"x": [1, 6, 5, 5]}, ["y"], weights)


def canonical(model) -> Program:
    program = parse_onnx(model)
    run_passes(program, canonicalize_passes())
    return program


def fused_without_merge(model) -> Program:
    program = parse_onnx(model)
    run_passes(program, [p for p in default_pipeline() if p.name != "merge_siblings"])
    return program


def check_fused_equals_unfused(model, tolerance: float = 1e-6) -> Program:
    plain, fused = parse_onnx(model), parse_onnx(model)
    fuse(fused)
    inputs = random_inputs(plain.input_shapes, seed=3)
    want, got = api.run(plain, inputs), api.run(fused, inputs)
    for name in want:
        assert not np.isnan(got[name]).any(), f"{name}: elements left unwritten (NaN)"
        assert rel_err(got[name], want[name]) <= tolerance, name
    return fused


def ops(program: Program, name: str) -> list[Instruction]:
    return [i for i in program.main if i.op.name == name]


def kernels(program: Program) -> list[Instruction]:
    return ops(program, "fused")


def test_c3_siblings_become_one_conv_with_stacked_weights_and_bias():
    program = canonical(c3_block())
    x = program.main.params["x"]
    assert len([c for c in ops(program, "convolution") if c.inputs[0] is x]) == 2
    assert MergeSiblings().apply(program.main)
    (conv,) = [c for c in ops(program, "convolution") if c.inputs[0] is x]
    assert conv.inputs[1].shape.lens == (8, 6, 1, 1)
    # cv2 feeds the concat's last slot, so its channels come first: they will face the concat
    w1, w2 = rand(4, 6, 1, 1, seed=1), rand(4, 6, 1, 1, seed=5)
    np.testing.assert_array_equal(conv.inputs[1].op.value, np.concatenate([w2, w1]))
    (add,) = [u for u in program.main if conv in u.inputs]
    assert add.op.name == "add"
    bias = add.inputs[1].inputs[0].op.value
    np.testing.assert_array_equal(bias.reshape(-1), np.concatenate([rand(4, seed=6), rand(4, seed=2)]))
    (sig,) = [u for u in program.main if add in u.inputs and u.op.name == "sigmoid"]
    (mul,) = [u for u in program.main if add in u.inputs and u.op.name == "mul"]
    slices = sorted(((s.op.attrs["starts"][0], s.op.attrs["ends"][0]) for s in program.main
                     if s.op.name == "slice" and s.inputs[0] is mul))
    assert slices == [(0, 4), (4, 8)]


def test_c3_is_one_kernel_less_and_writes_the_concat_without_copies():
    model = c3_block()
    before = fused_without_merge(model)
    program = check_fused_equals_unfused(model)
    assert count_kernels(before) == 4 and count_kernels(program) == 3
    assert [k.op.attrs["kernel"] for k in kernels(program)] == ["conv_add_sigmoid_mul"] * 3
    merged, bottleneck, cv3 = kernels(program)
    # one buffer: the concat's 8 channels (bottleneck, cv2) and cv1's 4 extra channels after them
    (alloc,) = ops(program, "allocate")
    assert alloc.shape.lens == (1, 12, 5, 5)
    assert merged.inputs[-1] is alloc and bottleneck.inputs[-1] is merged
    (store,) = [i for i in merged.op.module if i.op.name == "store"]
    assert [str(e) for e in store.op.attrs["map"].exprs] == ["i0", "i1 + 4", "i2", "i3"]
    assert not store.op.attrs["domain"]
    # cv3 reads the concat through a slice view of the buffer; the bottleneck reads cv1 through one
    (view,) = [x for x in cv3.inputs if x.op.name == "slice"]
    assert view.inputs[0] is bottleneck and view.op.attrs["starts"] == (0,) and view.op.attrs["ends"] == (8,)
    (part,) = [x for x in bottleneck.inputs if x.op.name == "slice"]
    assert part.inputs[0] is merged and (part.op.attrs["starts"], part.op.attrs["ends"]) == ((4,), (12,))


def test_c3_without_residual():
    program = check_fused_equals_unfused(c3_block(shortcut_bottleneck=False))
    assert count_kernels(program) == 3


def test_sibling_at_the_first_concat_slot_extends_the_buffer_before_it():
    """Inception: a 1x1 branch goes straight into the concat's first slot, a 1x1 reduction of the
    same input feeds a 3x3 convolution that fills the second slot."""
    model = make_model([
        helper.make_node("Conv", ["x", "wa", "ba"], ["a"]), helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Conv", ["x", "wr", "br"], ["r"]), helper.make_node("Relu", ["r"], ["rr"]),
        helper.make_node("Conv", ["rr", "w3", "b3"], ["t"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["t"], ["rt"]),
        helper.make_node("Concat", ["ra", "rt"], ["cat"], axis=1),
        helper.make_node("MaxPool", ["cat"], ["y"], kernel_shape=[2, 2]),
    ], {"x": [1, 3, 6, 6]}, ["y"], {
        "wa": rand(2, 3, 1, 1, seed=1), "ba": rand(2, seed=2), "wr": rand(5, 3, 1, 1, seed=3), "br": rand(5, seed=4),
        "w3": rand(3, 5, 3, 3, seed=5), "b3": rand(3, seed=6)})
    assert count_kernels(fused_without_merge(model)) == 4
    program = check_fused_equals_unfused(model)
    assert count_kernels(program) == 3 and not any(k.op.attrs["kernel"] == "copy" for k in kernels(program))
    (alloc,) = ops(program, "allocate")
    assert alloc.shape.lens == (1, 10, 6, 6)  # the reduction's 5 channels, then the concat's 2 + 3
    merged = kernels(program)[0]
    (store,) = [i for i in merged.op.module if i.op.name == "store"]
    assert [str(e) for e in store.op.attrs["map"].exprs] == ["i0", "i1", "i2", "i3"]
    pool = kernels(program)[-1]
    assert pool.op.attrs["kernel"] == "pool"
    (view,) = pool.inputs
    assert view.op.name == "slice" and (view.op.attrs["starts"], view.op.attrs["ends"]) == ((5,), (10,))


def test_free_siblings_and_constant_side_inputs():
    """Siblings read by other convolutions only; their epilogues scale by a shared scalar and add
    per-channel and whole-tensor constants, which stack along channels."""
    nodes = []
    weights = {}
    for k, n in enumerate((3, 5)):
        nodes += [helper.make_node("Conv", ["x", f"w{k}"], [f"c{k}"], strides=[2, 2]),
                  helper.make_node("Add", [f"c{k}", f"b{k}"], [f"a{k}"]),
                  helper.make_node("Mul", [f"a{k}", "half"], [f"m{k}"]),
                  helper.make_node("Add", [f"m{k}", f"p{k}"], [f"q{k}"]),
                  helper.make_node("Tanh", [f"q{k}"], [f"h{k}"]),
                  helper.make_node("Conv", [f"h{k}", f"v{k}"], [f"y{k}"])]
        weights |= {f"w{k}": rand(n, 4, 1, 1, seed=k), f"b{k}": rand(n, 1, 1, seed=10 + k),
                    f"p{k}": rand(1, n, 3, 3, seed=20 + k), f"v{k}": rand(2, n, 1, 1, seed=30 + k)}
    weights["half"] = np.array(0.5, np.float32)
    model = make_model(nodes, {"x": [1, 4, 6, 6]}, ["y0", "y1"], weights)
    program = canonical(model)
    assert MergeSiblings().apply(program.main)
    x = program.main.params["x"]
    (conv,) = [c for c in ops(program, "convolution") if c.inputs[0] is x]
    assert conv.shape.lens == (1, 8, 3, 3)
    literals = {i.shape.lens for i in ops(program, "@literal")}
    assert (1, 8, 1, 1) in literals and (1, 8, 3, 3) in literals and (1, 1, 1, 1) in literals
    assert count_kernels(fused_without_merge(model)) == 4
    assert count_kernels(check_fused_equals_unfused(model)) == 3


def test_matmul_siblings_merge_along_columns():
    """Attention-style projections: q, k and v merge into one product of 12 columns; k's
    transpose stays behind as a reader of its slice (a view its reader's kernel reads through)."""
    model = make_model([
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ], {"x": [5, 8]}, ["y"], {"wq": rand(8, 4, seed=1), "wk": rand(8, 4, seed=2), "wv": rand(8, 4, seed=3)})
    program = canonical(model)
    assert MergeSiblings().apply(program.main)
    x = program.main.params["x"]
    dots = sorted(d.shape.lens for d in ops(program, "dot") if d.inputs[0] is x)
    assert dots == [(5, 12)]
    before = count_kernels(fused_without_merge(model))
    assert count_kernels(check_fused_equals_unfused(model)) == before - 2


def _pair(a_attrs: dict | None = None, b_attrs: dict | None = None, act_a: str = "Relu", act_b: str = "Relu",
          cat: bool = False, extra: list | None = None, outputs: tuple[str, ...] = ("y",)):
    """Two convolutions of x, each with an activation, read by further convolutions whose results
    are added (or concatenated, with `cat`)."""
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["a"], **(a_attrs or {})), helper.make_node(act_a, ["a"], ["ha"]),
        helper.make_node("Conv", ["x", "wb", "bb"], ["b"], **(b_attrs or {})), helper.make_node(act_b, ["b"], ["hb"]),
    ] + (extra or [])
    if cat:
        nodes += [helper.make_node("Concat", ["ha", "p"], ["ca"], axis=1),
                  helper.make_node("Concat", ["p", "hb"], ["cb"], axis=1),
                  helper.make_node("Add", ["ca", "cb"], ["y"])]
    elif "y" not in [o for n in nodes for o in n.output]:
        nodes += [helper.make_node("Conv", ["ha", "wc"], ["ya"]), helper.make_node("Conv", ["hb", "wc"], ["yb"]),
                  helper.make_node("Add", ["ya", "yb"], ["y"])]
    return make_model(nodes, {"x": [1, 3, 6, 6]}, list(outputs), {
        "wa": rand(4, 3, 1, 1, seed=1), "ba": rand(4, seed=2), "wb": rand(4, 3, 1, 1, seed=3), "bb": rand(4, seed=4),
        "wc": rand(2, 4, 1, 1, seed=5), "p": rand(1, 4, 6, 6, seed=6)})


def _assert_no_merge(model) -> None:
    program = canonical(model)
    assert not MergeSiblings().apply(program.main)
    assert count_kernels(check_fused_equals_unfused(model)) == count_kernels(fused_without_merge(model))


def test_positive_control_of_the_negative_cases():
    program = canonical(_pair())
    assert MergeSiblings().apply(program.main)
    assert count_kernels(check_fused_equals_unfused(_pair())) == count_kernels(fused_without_merge(_pair())) - 1


def test_no_merge_across_different_attributes():
    _assert_no_merge(_pair(b_attrs={"strides": [2, 2]}, extra=[
        helper.make_node("Conv", ["ha", "wc"], ["ya"], strides=[2, 2]), helper.make_node("Conv", ["hb", "wc"], ["yb"]),
        helper.make_node("Add", ["ya", "yb"], ["y"])]))


def test_no_merge_of_different_epilogues():
    _assert_no_merge(_pair(act_b="Sigmoid"))


def test_no_merge_when_an_epilogue_reads_a_computed_value():
    """b's kernel would add a value computed from a's result: merging would make a cycle."""
    _assert_no_merge(_pair(act_b="Identity", extra=[
        helper.make_node("Neg", ["ha"], ["n"]), helper.make_node("Add", ["hb", "n"], ["hb2"]),
        helper.make_node("Conv", ["ha", "wc"], ["ya"]), helper.make_node("Conv", ["hb2", "wc"], ["yb"]),
        helper.make_node("Add", ["ya", "yb"], ["y"])]))


def test_no_merge_when_the_results_feed_two_concats():
    """Each result would need its own concat buffer: one of them would be copied."""
    _assert_no_merge(_pair(cat=True))


def test_no_merge_of_returned_results():
    _assert_no_merge(_pair(extra=[helper.make_node("Add", ["ha", "hb"], ["y"])], outputs=("y", "ha")))


def test_no_merge_of_grouped_convolutions():
    model = make_model([
        helper.make_node("Conv", ["x", "wa"], ["a"], group=2), helper.make_node("Conv", ["x", "wb"], ["b"], group=2),
        helper.make_node("Conv", ["a", "wc"], ["ya"]), helper.make_node("Conv", ["b", "wc"], ["yb"]),
        helper.make_node("Add", ["ya", "yb"], ["y"]),
    ], {"x": [1, 4, 5, 5]}, ["y"], {"wa": rand(4, 2, 1, 1, seed=1), "wb": rand(4, 2, 1, 1, seed=2),
                                    "wc": rand(2, 4, 1, 1, seed=3)})
    _assert_no_merge(model)


def test_a_kernel_in_two_slots_of_one_concat_writes_one_and_is_copied_into_the_other():
    model = make_model([
        helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Concat", ["r", "z", "r"], ["cat"], axis=1), helper.make_node("Softmax", ["cat"], ["y"], axis=1),
    ], {"x": [1, 3, 4, 4], "z": [1, 2, 4, 4]}, ["y"], {"w": rand(2, 3, 1, 1, seed=1)})
    program = check_fused_equals_unfused(model)
    assert sorted(k.op.attrs["kernel"] for k in kernels(program)) == ["conv_relu", "copy", "copy", "softmax"]


def test_siblings_scaled_by_one_row_value_merge_and_share_it(monkeypatch):
    """Q, K and V products of a deferred layernorm (`defer_norm`, turned on) each scale their rows
    by the same 1 / std: the value is shared by the merged epilogue, broadcast along all its
    channels, not stacked; one product kernel is left, as before the norm was deferred."""
    from fusegraph.passes.defer_norm import DEFER_NORMS_ENV
    from tests.passes.test_defer_norm import K, ROWS
    monkeypatch.setenv(DEFER_NORMS_ENV, "1")
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["t"], axis=-1)]
    nodes += [helper.make_node("MatMul", ["t", f"w{j}"], [f"m{j}"]) for j in range(3)]
    nodes += [helper.make_node("Add", ["m0", "m1"], ["s"]), helper.make_node("Add", ["s", "m2"], ["y"])]
    literals = {"g": 1 + 0.1 * rand(K, seed=1), "b": rand(K, seed=2)} | {f"w{j}": rand(K, 16, seed=3 + j, scale=0.2) for j in range(3)}
    model = make_model(nodes, {"x": [1, ROWS, K]}, ["y"], literals)
    before, after = parse_onnx(model), parse_onnx(model)
    fuse(after)
    products = [i for i in after.main if i.op.name == "fused" and "dot" in op_names(i.op.module)]
    assert len(products) == 1
    (dot,) = [i for i in products[0].op.module if i.op.name == "dot"]
    assert dot.shape.lens[-1] == 48
    assert_same_results(before, after, tolerance=1e-5)
