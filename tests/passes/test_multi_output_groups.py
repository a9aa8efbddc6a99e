"""Multi-output fused groups (passes/fuse_anchors.py `_choose_outputs`): a group stores every
member value read outside it, each into a buffer of its own read through `fused_output`, so a
value needed elsewhere (a residual and its activation, a returned intermediate) does not split
the group; views read outside and concat parts keep the single-output rule, and so does a
group whose further members only products read that would compute them in their prologue."""

from __future__ import annotations

from fusegraph import api, parse_onnx
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import Transpose
from fusegraph.passes.fuse_anchors import FuseAnchors, FuseReductions
from fusegraph.passes.pipeline import count_kernels
from tests.helpers import assert_same_results, make_model, op_names, printed, rand
from onnx import helper

TOLERANCE = 1e-6  # the same ops on the same values, element by element


def residual_block(readers: int = 2) -> Program:
    """a = conv(x) + x; r = relu(a); y = conv2(r) + a, and with two readers also z = conv3(r):
    the residual add is read by the activation and by the next block's add. The 3x3 convs
    read each element of r 9 times, so with two of them neither computes r in its prologue
    (over `prologue_rule.RECOMPUTE_BUDGET`); a single one does."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [1, 4, 3, 3]))
    conv = make_op("convolution", padding=(0, 0, 0, 0), stride=(1, 1), dilation=(1, 1))
    conv3x3 = make_op("convolution", padding=(1, 1, 1, 1), stride=(1, 1), dilation=(1, 1))
    c = m.add(conv, [x, add_literal(m, rand(4, 4, 1, 1, seed=1))])
    a = m.add(make_op("add"), [c, x])
    r = m.add(make_op("relu"), [a])
    c2 = m.add(conv3x3, [r, add_literal(m, rand(4, 4, 3, 3, seed=2))])
    outs = [m.add(make_op("add"), [c2, a])]
    if readers == 2:
        outs.append(m.add(conv3x3, [r, add_literal(m, rand(4, 4, 3, 3, seed=3))]))
    m.set_returns(outs, ["y", "z"][:len(outs)])
    return p


def test_a_residual_and_its_activation_leave_one_kernel():
    before, after = residual_block(), residual_block()
    assert FuseAnchors().apply(after.main)
    assert printed(after.main)[1:] == [
        "@0 = @param:x -> float_type, {1, 4, 3, 3}, {36, 9, 3, 1}",
        "@1 = @literal -> float_type, {4, 4, 1, 1}, {4, 1, 1, 1}",
        "@2 = conv_add_relu[module=fused0](@0,@1) -> float_type, {1, 4, 3, 3}, {36, 9, 3, 1}",
        "@3 = fused_output[index=1](@2) -> float_type, {1, 4, 3, 3}, {36, 9, 3, 1}",
        "@4 = @literal -> float_type, {4, 4, 3, 3}, {36, 9, 3, 1}",
        "@5 = conv_add[module=fused1](@2,@4,@3) -> float_type, {1, 4, 3, 3}, {36, 9, 3, 1}",
        "@6 = @literal -> float_type, {4, 4, 3, 3}, {36, 9, 3, 1}",
        "@7 = conv[module=fused2](@2,@6) -> float_type, {1, 4, 3, 3}, {36, 9, 3, 1}",
        "@8 = @return(@5,@7)"]
    sub = after.main.instructions[2].op.module
    assert op_names(sub)[-5:] == ["relu", "allocate", "store", "allocate", "store"]
    assert printed(sub)[-1] == f"@{len(sub.instructions)} = @return(@{len(sub.instructions) - 3},@{len(sub.instructions) - 1})"
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_an_activation_one_product_reads_is_its_prologue_not_a_further_output():
    """With conv2 the relu's only reader, conv2 computes it in its prologue (`PrologueRule`):
    storing it from the first kernel as well would save no kernel, so that group keeps the
    single output it had (the residual) and nothing is stored twice."""
    before, after = residual_block(readers=1), residual_block(readers=1)
    assert FuseAnchors().apply(after.main)
    fused = [i for i in after.main if i.op.name == "fused"]
    assert [i.op.attrs["kernel"] for i in fused] == ["conv_add", "relu_conv_add"]
    assert "fused_output" not in op_names(after.main) and fused[1].inputs[0] is fused[0]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_returned_intermediate_is_a_further_output():
    """Both the pre- and the post-activation values are program outputs."""
    def build() -> Program:
        p = residual_block()
        m = p.main
        a = m.instructions[3]
        m.set_returns([*m.returns, a], ["y", "z", "a"])
        return p

    before, after = build(), build()
    FuseAnchors().apply(after.main)
    assert op_names(after.main).count("fused") == 3 and "relu" not in op_names(after.main)
    assert after.main.returns[2].op.name == "fused_output"
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_view_read_elsewhere_is_not_stored_twice():
    """relu(conv) is read by a transpose outside and by a sigmoid inside: the transpose stays a
    view of the stored relu rather than a second copy of the same elements."""
    def build() -> Program:
        p = Program()
        m = p.main
        x = add_param(m, "x", Shape.of(DType.float32, [1, 2, 3, 3]))
        conv = make_op("convolution", padding=(0, 0, 0, 0), stride=(1, 1), dilation=(1, 1))
        r = m.add(make_op("relu"), [m.add(conv, [x, add_literal(m, rand(3, 2, 1, 1, seed=1))])])
        t = m.add(Transpose([0, 2, 3, 1]), [r])
        s = m.add(make_op("sigmoid"), [r])
        m.set_returns([m.add(make_op("reduce_sum", axes=[2]), [t]), s], ["t", "s"])
        return p

    before, after = build(), build()
    FuseAnchors().apply(after.main)
    assert op_names(after.main) == ["@param", "@literal", "fused", "fused_output", "transpose", "reduce_sum"]
    assert after.main.instructions[2].op.attrs["kernel"] == "conv_relu_sigmoid"
    assert after.main.instructions[4].inputs == [after.main.instructions[3]]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_reduction_group_stores_its_value_and_its_epilogue():
    def build() -> Program:
        p = Program()
        m = p.main
        x = add_param(m, "x", Shape.of(DType.float32, [2, 5]))
        s = m.add(make_op("softmax", axis=1), [x])
        e = m.add(make_op("exp"), [s])
        m.set_returns([e, s], ["e", "s"])
        return p

    before, after = build(), build()
    assert FuseReductions().apply(after.main)
    assert op_names(after.main) == ["@param", "fused", "fused_output"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def residual_model(readers: int = 1):
    """conv -> add x -> relu -> 1x1 conv -> add the residual; with two readers the relu also
    feeds a 3x3 conv, whose 9 reads of each element put its recomputation over the budget."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "x"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["c2"]),
             helper.make_node("Add", ["c2", "a"], ["y"])]
    inits = {"w": rand(16, 16, 3, 3, seed=1, scale=0.1), "w2": rand(16, 16, 1, 1, seed=2, scale=0.2)}
    if readers == 2:
        nodes.append(helper.make_node("Conv", ["r", "w3"], ["z"], pads=[1, 1, 1, 1]))
        inits["w3"] = rand(16, 16, 3, 3, seed=3, scale=0.1)
    return make_model(nodes, {"x": [1, 16, 6, 6]}, ["y", "z"][:readers], inits)


def test_the_pipeline_fuses_a_residual_block_into_two_kernels():
    """conv+add and relu+conv+add: the relu is no kernel of its own, the second conv computes
    it in its prologue, so the first kernel stores the residual alone."""
    program = parse_onnx(residual_model())
    api.fuse(program)
    assert count_kernels(program) == 2
    assert [i.op.attrs["kernel"] for i in program.main if i.op.name == "fused"] == ["conv_add", "relu_conv_add"]
    assert_same_results(parse_onnx(residual_model()), program, tolerance=1e-5)


def test_a_movement_anchor_read_elsewhere_stays_in_its_group():
    """pad(x) is read by a relu in its group and by a return: the anchor of a movement group is
    stored as a further output, never cut off like a view."""
    from fusegraph.ops.movement import Pad
    from fusegraph.passes.fuse_anchors import FuseMovement

    def build() -> Program:
        p = Program()
        m = p.main
        x = add_param(m, "x", Shape.of(DType.float32, [1, 2, 3, 3]))
        padded = m.add(Pad([0, 0, 1, 1, 0, 0, 1, 1], "reflect"), [x])
        m.set_returns([m.add(make_op("relu"), [padded]), padded], ["r", "p"])
        return p

    before, after = build(), build()
    assert FuseMovement().apply(after.main)
    assert op_names(after.main) == ["@param", "fused", "fused_output"]
    assert_same_results(before, after, tolerance=TOLERANCE)
