"""Common-subexpression elimination (passes/cse.py): equal ops on equal inputs and literals of
equal bytes are computed once; their readers read the first one."""

from __future__ import annotations

import numpy as np
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.pointwise import Where
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast, Transpose
from fusegraph.passes.cse import SAMPLE, CommonSubexpressions
from fusegraph.ops.base import OpKind, is_fused
from fusegraph.passes.manager import run_passes
from fusegraph.passes.pipeline import canonicalize_passes, count_kernels, fuse
from fusegraph.targets.ref.runner import run_program
from tests.helpers import assert_same_results, make_model, op_names, printed


def assert_equal_outputs(before: Program, after: Program, inputs: dict[str, np.ndarray], rtol: float = 0.0) -> None:
    """Both programs on the ref target; -inf outputs must sit at the same places."""
    want, got = run_program(before, inputs), run_program(after, inputs)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=0)


def per_layer_masks(layers: int = 3) -> Program:
    """BERT's shape: each layer builds where(mask, 0, -inf) again from the same mask, with its
    own copies of the two constants, and adds it to its scores."""
    p = Program()
    m = p.main
    lens = (2, 4)
    mask = add_param(m, "mask", Shape.of(DType.bool, lens))
    x = add_param(m, "x", Shape.of(DType.float32, lens))
    for _ in range(layers):
        zero = m.add(MultiBroadcast(lens), [add_literal(m, np.float32(0.0))])
        ninf = m.add(MultiBroadcast(lens), [add_literal(m, np.float32(-np.inf))])
        bias = m.add(Where(), [mask, zero, ninf])
        x = m.add(make_op("add"), [x, bias])
    m.set_returns([x], ["y"])
    return p


def test_a_mask_built_per_layer_is_built_once():
    before, after = per_layer_masks(), per_layer_masks()
    assert CommonSubexpressions().apply(after.main)
    assert op_names(before.main).count("where") == 3 and op_names(before.main).count("@literal") == 6
    assert printed(after.main) == [
        'module: "main"',
        "@0 = @param:mask -> bool_type, {2, 4}, {4, 1}",
        "@1 = @param:x -> float_type, {2, 4}, {4, 1}",
        "@2 = @literal{0} -> float_type, {}, {}",
        "@3 = multibroadcast[out_lens={2,4}](@2) -> float_type, {2, 4}, {0, 0}",
        "@4 = @literal{-inf} -> float_type, {}, {}",
        "@5 = multibroadcast[out_lens={2,4}](@4) -> float_type, {2, 4}, {0, 0}",
        "@6 = where(@0,@3,@5) -> float_type, {2, 4}, {4, 1}",
        "@7 = add(@1,@6) -> float_type, {2, 4}, {4, 1}",
        "@8 = add(@7,@6) -> float_type, {2, 4}, {4, 1}",
        "@9 = add(@8,@6) -> float_type, {2, 4}, {4, 1}",
        "@10 = @return(@9)",
    ]
    rng = np.random.default_rng()
    inputs = {"mask": rng.random((2, 4)) < 0.5, "x": rng.standard_normal((2, 4)).astype(np.float32)}
    assert_equal_outputs(before, after, inputs)
    assert not CommonSubexpressions().apply(after.main)


def different_work() -> Program:
    """Pairs that look alike and are not: transposes with other perms, literals of equal values
    in other dtypes or shapes, -0.0 against 0.0, and the same op on inputs in another order."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, (2, 2)))
    y = add_param(m, "y", Shape.of(DType.float32, (2, 2)))
    outs = [m.add(Transpose([1, 0]), [x]), m.add(Transpose([0, 1]), [x]),
            m.add(make_op("sub"), [x, y]), m.add(make_op("sub"), [y, x])]
    for value in (np.float32(0.0), np.float32(-0.0), np.float64(0.0), np.zeros((1,), np.float32)):
        lit = add_literal(m, value)
        outs.append(m.add(make_op("add"), [x, m.add(MultiBroadcast((2, 2)), [lit])]) if value.dtype == np.float32
                    else lit)
    m.set_returns(outs, [f"o{k}" for k in range(len(outs))])
    return p


def test_different_work_stays_apart():
    p = different_work()
    text = printed(p.main)
    assert not CommonSubexpressions().apply(p.main)
    assert printed(p.main) == text


def two_equal_outputs() -> Program:
    """exp(x) returned twice (two nodes), and neg of each added together."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, (3,)))
    a, b = m.add(make_op("exp"), [x]), m.add(make_op("exp"), [x])
    c, d = m.add(make_op("neg"), [a]), m.add(make_op("neg"), [b])
    m.set_returns([a, b, m.add(make_op("add"), [c, d])], ["a", "b", "s"])
    return p


def test_two_equal_outputs_keep_their_own_instructions_and_their_readers_merge():
    before, after = two_equal_outputs(), two_equal_outputs()
    m = after.main
    assert CommonSubexpressions().apply(m)
    assert op_names(m) == ["@param", "exp", "exp", "neg", "add"]
    add = m.instructions[-1]
    assert add.inputs[0] is add.inputs[1]
    assert m.returns[:2] == [m.instructions[1], m.instructions[2]]
    assert_same_results(before, after)


def bert_like_model(layers: int = 4):
    """Every layer: scores = x @ w_k + where(mask, 0, -inf), its own Where node and constants."""
    rng = np.random.default_rng(0)
    nodes, inits = [], {}
    x = "x"
    for k in range(layers):
        inits[f"zero{k}"] = np.array(0.0, np.float32)
        inits[f"ninf{k}"] = np.array(-np.inf, np.float32)
        inits[f"w{k}"] = rng.standard_normal((8, 8)).astype(np.float32)
        nodes += [helper.make_node("Where", ["mask", f"zero{k}", f"ninf{k}"], [f"bias{k}"]),
                  helper.make_node("MatMul", [x, f"w{k}"], [f"mm{k}"]),
                  helper.make_node("Add", [f"mm{k}", f"bias{k}"], [f"s{k}"]),
                  helper.make_node("Softmax", [f"s{k}"], [f"h{k}"], axis=-1)]
        x = f"h{k}"
    model = make_model(nodes, {"x": [2, 8], "mask": [2, 8]}, [x], inits)
    for vi in model.graph.input:
        if vi.name == "mask":
            vi.type.tensor_type.elem_type = 9  # bool
    return model


def test_the_pipeline_computes_a_per_layer_mask_once():
    """Canonicalization leaves one `where` for the four layers' masks; fusion then computes it
    inside each kernel that reads it (here attention kernels, whose mask input is recomputed per
    score), never as a kernel of its own."""
    model = bert_like_model()
    unfused = parse_onnx(model)
    canonical = parse_onnx(model)
    run_passes(canonical, canonicalize_passes())
    assert sum(1 for ins in canonical.main if ins.op.name == "where") == 1, str(canonical)
    fused = parse_onnx(model)
    fuse(fused)
    alone = [ins for ins in fused.main if is_fused(ins) and "where" in op_names(ins.op.module)
             and not any(i.op.kind in (OpKind.ANCHOR, OpKind.REDUCE) for i in ins.op.module)]
    assert not alone, str(fused)
    assert count_kernels(fused) <= 9
    rng = np.random.default_rng()
    inputs = {"x": rng.standard_normal((2, 8)).astype(np.float32), "mask": rng.random((2, 8)) < 0.8}
    inputs["mask"][:, 0] = True
    assert_equal_outputs(unfused, fused, inputs, rtol=1e-5)


def test_literals_equal_on_their_sampled_elements_merge_only_when_equal_everywhere():
    """The key digests a sample of each literal; values equal there but not elsewhere stay
    apart, and a later literal equal to the second of them merges with it, not the first."""
    p = Program()
    m = p.main
    n = 3 * SAMPLE + 1  # every third element sampled
    x = add_param(m, "x", Shape.of(DType.float32, (n,)))
    a = np.random.default_rng().standard_normal(n).astype(np.float32)
    b = a.copy()
    b[1] += 5.0  # not a sampled element
    lits = [add_literal(m, v.copy()) for v in (a, b, b)]
    outs = [m.add(make_op("add"), [x, lit]) for lit in lits]
    m.set_returns(outs, ["y0", "y1", "y2"])
    assert CommonSubexpressions().apply(m)
    kept = [i for i in m if i.op.name == "@literal"]
    assert len(kept) == 2
    assert outs[2].inputs[1] is lits[1] and outs[1].inputs[1] is lits[1] and outs[0].inputs[1] is lits[0]
