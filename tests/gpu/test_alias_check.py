"""The memory plan's aliasing assumption, checked on whole models.

A kernel that stores into its slice of a concat buffer may read another slice of the same
buffer; that is only correct when the two element sets are disjoint (alias_check.py).
"""

from __future__ import annotations

import pytest

from fusegraph import parse_onnx
from fusegraph.passes.pipeline import fuse
from fusegraph.targets.gpu.alias_check import overlapping_reads
from fusegraph.targets.gpu.codegen import plan_program
from fusegraph.targets.gpu.memory_plan import stored_buffer_input
from fusegraph.targets.gpu.returned_views import copy_returned_views


def _planned(name):
    program = parse_onnx(name)
    fuse(program)
    copy_returned_views(program.main)
    return program.main, plan_program(program.main)


def _same_buffer_reads(main, plan):
    """(kernel, input position, position of the buffer it stores into) for each read of a buffer
    by a kernel that also writes it."""
    out = []
    for ins in main:
        if ins.op.name == "fused" and (k := stored_buffer_input(ins)) is not None:
            out += [(ins, j, k) for j, x in enumerate(ins.inputs) if j != k and plan.of[id(x)] is plan.of[id(ins)]]
    return out


@pytest.mark.parametrize("name", ["yolov5s-160", "light_inception_v1"])
def test_no_kernel_reads_what_it_writes(name):
    main, plan = _planned(name)
    assert overlapping_reads(main, plan) == []


def test_a_kernel_reading_its_whole_destination_is_reported():
    main, plan = _planned("yolov5s-160")
    pairs = _same_buffer_reads(main, plan)
    assert pairs, "yolov5s-160 has kernels that read a slice of the concat buffer they write"
    ins, j, k = pairs[0]
    ins.inputs[j] = ins.inputs[k]  # read all of the buffer, the slice it writes included
    (problem,) = overlapping_reads(main, plan)
    assert ins.op.attrs["kernel"] in problem and f"input {j}" in problem
