"""Concat elimination (passes/eliminate_concat.py): the concat's buffer is allocated once and
each input's kernel stores straight into its slot; an input that is not a kernel of its own
(or whose kernel is returned) is copied into its slot by a copy kernel."""

from __future__ import annotations

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.movement import Concat
from fusegraph.ops.reduce import Softmax
from fusegraph.ops.source import add_param
from fusegraph.ops.views import Slice
from fusegraph.passes.eliminate_concat import EliminateConcat
from fusegraph.passes.fuse_pointwise import FusePointwise
from tests.helpers import assert_same_results, op_names, printed

TOLERANCE = 0.0  # only where values are written changes


def _store_maps(kernel: Instruction) -> list[str]:
    return [str(i.op.attrs["map"]).split(": ")[1] for i in kernel.op.module if i.op.name == "store"]


def _fused(program: Program) -> Program:
    FusePointwise().apply(program.main)
    return program


def three_parts(return_exp: bool = False) -> Program:
    """softmax(concat(exp(x), neg(z), z)) along rows, after pointwise fusion (a pointwise
    reader would read the concat as a select of its parts, recomputing them)."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
    z = add_param(m, "z", Shape.of(DType.float32, [1, 3]))
    e = m.add(make_op("exp"), [x])
    c = m.add(Concat(0), [e, m.add(make_op("neg"), [z]), z])
    y = m.add(Softmax(1), [c])
    m.set_returns([y, e] if return_exp else [y], ["y", "e"] if return_exp else ["y"])
    return _fused(p)


def test_kernels_write_their_slots_of_one_buffer():
    before, after = three_parts(), three_parts()
    assert op_names(before.main) == ["@param", "@param", "fused", "fused", "concat", "softmax"]
    assert EliminateConcat().apply(after.main)
    assert printed(after.main) == [
        'module: "main"',
        "@0 = @param:x -> float_type, {2, 3}, {3, 1}",
        "@1 = allocate[float_type,{4,3}] -> float_type, {4, 3}, {3, 1}",
        "@2 = @param:z -> float_type, {1, 3}, {3, 1}",
        "@3 = copy[module=fused2](@2,@1) -> float_type, {4, 3}, {3, 1}",
        "@4 = exp[module=fused0](@0,@3) -> float_type, {4, 3}, {3, 1}",
        "@5 = neg[module=fused1](@2,@4) -> float_type, {4, 3}, {3, 1}",
        "@6 = softmax[axis=1](@5) -> float_type, {4, 3}, {3, 1}",
        "@7 = @return(@6)",
    ]
    copy, exp, neg = after.main.instructions[3:6]
    assert [_store_maps(k) for k in (exp, neg, copy)] == [["(i0, i1) -> (i0, i1)"], ["(i0, i1) -> (2, i1)"],
                                                          ["(i0, i1) -> (3, i1)"]]
    assert not any(i.op.name == "allocate" for k in (exp, neg, copy) for i in k.op.module)
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_returned_kernel_keeps_its_own_buffer_and_is_copied():
    before, after = three_parts(return_exp=True), three_parts(return_exp=True)
    exp_text = printed(before.main.instructions[2].op.module)
    assert EliminateConcat().apply(after.main)
    assert op_names(after.main) == ["@param", "allocate", "@param", "fused", "fused", "fused", "fused", "softmax"]
    kernels = [i.op.attrs["kernel"] for i in after.main if i.op.name == "fused"]
    assert kernels == ["exp", "copy", "copy", "neg"]
    exp, exp_copy = after.main.instructions[3], after.main.instructions[5]
    assert after.main.returns[1] is exp and printed(exp.op.module) == exp_text
    assert exp_copy.inputs[0] is exp and _store_maps(exp_copy) == ["(i0, i1) -> (i0, i1)"]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_kernel_computing_more_than_its_slot_extends_the_buffer():
    """exp(x) has four rows; its first two are the concat's last slot and its other two are
    read by sin: the buffer gets two extra rows after the concat's, read back as slices."""
    def build() -> Program:
        p = Program()
        m = p.main
        x = add_param(m, "x", Shape.of(DType.float32, [4, 3]))
        z = add_param(m, "z", Shape.of(DType.float32, [1, 3]))
        k = m.add(make_op("exp"), [x])
        c = m.add(Concat(0), [m.add(make_op("neg"), [z]), m.add(Slice([0], [0], [2]), [k])])
        w = m.add(make_op("sin"), [m.add(Slice([0], [2], [4]), [k])])
        m.set_returns([m.add(Softmax(1), [c]), w], ["y", "w"])
        return _fused(p)

    before, after = build(), build()
    assert EliminateConcat().apply(after.main)
    assert op_names(after.main) == ["@param", "@param", "allocate", "fused", "slice", "fused", "slice", "fused", "softmax"]
    assert after.main.instructions[2].shape.lens == (5, 3)
    exp, exp_part, neg, cat = (after.main.instructions[k] for k in (3, 4, 5, 6))
    assert _store_maps(exp) == ["(i0, i1) -> (i0 + 1, i1)"] and _store_maps(neg) == ["(i0, i1) -> (0, i1)"]
    assert (exp_part.op.attrs["starts"], exp_part.op.attrs["ends"]) == ((1,), (5,))
    assert (cat.op.attrs["starts"], cat.op.attrs["ends"]) == ((0,), (3,))
    readers = {i.op.attrs.get("kernel", i.op.name): i.inputs for i in after.main.instructions[7:]}
    assert readers == {"softmax": [cat], "sin": [exp_part]}
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_program_without_concat_is_left_as_it_is():
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
    m.set_returns([m.add(make_op("exp"), [x])], ["y"])
    _fused(p)
    text = str(p)
    assert not EliminateConcat().apply(m)
    assert str(p) == text


def nested(copied: bool = False, shared: bool = False) -> Program:
    """softmax(concat(exp(x), concat(neg(z), sin(w)) along columns) along rows), after pointwise
    fusion: the inner concat is one slot of the outer (w itself instead of sin(w) when `copied`;
    sin(w) also read by a softmax returned as well when `shared`)."""
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [2, 3]))
    z = add_param(m, "z", Shape.of(DType.float32, [1, 2]))
    w = add_param(m, "w", Shape.of(DType.float32, [1, 1]))
    first = m.add(make_op("neg"), [z])
    last = w if copied else m.add(make_op("sin"), [w])
    inner = m.add(Concat(1), [first, last])
    outer = m.add(Concat(0), [m.add(make_op("exp"), [x]), inner])
    y = m.add(Softmax(1), [outer])
    m.set_returns([y, m.add(Softmax(0), [last])] if shared else [y], ["y", "v"] if shared else ["y"])
    return _fused(p)


def test_the_parts_of_a_nested_concat_write_their_boxes_of_the_outer_buffer():
    before, after = nested(), nested()
    assert op_names(before.main) == ["@param", "@param", "@param", "fused", "fused", "concat", "fused", "concat", "softmax"]
    assert EliminateConcat().apply(after.main)
    assert op_names(after.main) == ["@param", "@param", "@param", "allocate", "fused", "fused", "fused", "softmax"]
    neg, sin, exp = after.main.instructions[4:7]
    assert [k.op.attrs["kernel"] for k in (neg, sin, exp)] == ["neg", "sin", "exp"]
    assert [_store_maps(k) for k in (neg, sin, exp)] == [["(i0, i1) -> (2, i1)"], ["(i0, i1) -> (2, 2)"],
                                                          ["(i0, i1) -> (i0, i1)"]]
    assert after.main.instructions[7].inputs == [exp]
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_a_part_of_a_nested_concat_that_is_no_kernel_is_copied_into_its_box():
    before, after = nested(copied=True), nested(copied=True)
    assert EliminateConcat().apply(after.main)
    kernels = {i.op.attrs["kernel"]: i for i in after.main if i.op.name == "fused"}
    assert sorted(kernels) == ["copy", "exp", "neg"]
    assert _store_maps(kernels["copy"]) == ["(i0, i1) -> (2, 2)"]
    assert not any(i.op.name == "concat" for i in after.main)
    assert_same_results(before, after, tolerance=TOLERANCE)


def test_other_readers_of_a_nested_part_read_its_box_of_the_buffer():
    before, after = nested(shared=True), nested(shared=True)
    assert EliminateConcat().apply(after.main)
    (sin,) = [i for i in after.main if i.op.name == "fused" and i.op.attrs["kernel"] == "sin"]
    (box,) = [i for i in after.main if i.op.name == "slice" and i.inputs == [sin]]
    assert (box.op.attrs["axes"], box.op.attrs["starts"], box.op.attrs["ends"]) == ((0, 1), (2, 2), (3, 3))
    assert [i.inputs for i in after.main if i.op.name == "softmax"][-1] == [box]
    assert_same_results(before, after, tolerance=TOLERANCE)
