"""Chooses a template for each fused instruction and generates its kernel.

The anchor of a group (a convolution, matrix product, pooling, reduction or data movement
op inside its sub-module) decides the template; a group without one is pointwise and takes
the flat template. Everything around the anchor (prologue loads, epilogue ops, stores
through index maps) is written by the same kernel writer whatever the template.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.targets.gpu.kernel_source import KernelSource
from fusegraph.targets.gpu.kernel_writer import CodegenError, KernelInputs
from fusegraph.targets.gpu.templates.flat import flat_kernel
from fusegraph.targets.gpu.templates.gemm import gemm_kernel
from fusegraph.targets.gpu.templates.movement import emit_concat, emit_gather, emit_pad
from fusegraph.targets.gpu.templates.reduction import REDUCE_OPS, reduction_kernel
from fusegraph.targets.gpu.templates.window import emit_lrn, emit_pooling

INLINED_CONSTANT_TYPES = (DType.float16, DType.float32, DType.float64)  # exact as a Python float
FLAT_ANCHORS = {"pooling": emit_pooling, "lrn": emit_lrn, "concat": emit_concat, "pad": emit_pad, "gather": emit_gather}
ANCHORS = ("convolution", "dot", *FLAT_ANCHORS, *REDUCE_OPS)


def find_anchor(fused: Instruction) -> Instruction | None:
    """The one op of the group that is not pointwise, load, store or allocation."""
    anchors = []
    for ins in fused.op.module:
        if ins.op.name in ("@param", "load", "store", "allocate") or ins.op.kind.value == "pointwise":
            continue
        if ins.op.name not in ANCHORS:
            raise CodegenError(f"kernel {fused.op.attrs['kernel']}: the GPU target has no template for op {ins.op.name}")
        anchors.append(ins)
    if len(anchors) > 1:
        raise CodegenError(f"kernel {fused.op.attrs['kernel']} holds {len(anchors)} anchors "
                           f"({', '.join(a.op.name for a in anchors)}); one per kernel is supported")
    return anchors[0] if anchors else None


def kernel_function_name(position: int, kernel: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", f"k{position}_{kernel}")[:96]


def generate(fused: Instruction, position: int, inputs: KernelInputs, allow_tf32: bool = False,
             interpret: bool = False) -> KernelSource:
    """The kernel of fused instruction `fused` (the `position`-th kernel of its program)."""
    kernel = fused.op.attrs["kernel"]
    name = kernel_function_name(position, kernel)
    module = fused.op.module
    anchor = find_anchor(fused)
    try:
        if anchor is None:
            src = flat_kernel(name, kernel, module, inputs)
        elif anchor.op.name in ("convolution", "dot"):
            src = gemm_kernel(name, kernel, module, inputs, anchor, allow_tf32, interpret)
        elif anchor.op.name in FLAT_ANCHORS:
            src = flat_kernel(name, kernel, module, inputs, anchor, FLAT_ANCHORS[anchor.op.name])
        else:
            src = reduction_kernel(name, kernel, module, inputs, anchor)
    except CodegenError as e:
        raise CodegenError(f"kernel {name} ({fused.origin or kernel}): {e}") from None
    src.interpret = interpret
    return src


def plan_program(main: Any) -> Any:
    """The memory plan of a fused main module with the physical layouts its kernels read."""
    from fusegraph.targets.gpu.activation_layout import choose_activation_layouts
    from fusegraph.targets.gpu.memory_plan import plan_memory
    from fusegraph.targets.gpu.weight_layout import choose_weight_layouts

    plan = plan_memory(main)
    choose_weight_layouts(main, plan)
    choose_activation_layouts(main, plan)
    return plan


def program_kernels(program: Any, allow_tf32: bool = False, interpret: bool = False) -> list[KernelSource]:
    """The kernels of a fused program, generated without loading them (for printing)."""
    plan = plan_program(program.main)
    out = []
    for pos, ins in enumerate(i for i in program.main if i.op.name == "fused"):
        out.append(generate(ins, pos, kernel_inputs(ins, plan), allow_tf32, interpret))
    return out


def kernel_inputs(fused: Instruction, plan: Any) -> KernelInputs:
    """Inputs of `fused` as its kernel sees them (in their buffers' layouts); views of one
    buffer share a pointer."""
    from fusegraph.targets.gpu.memory_plan import physical_shape, stored_buffer_input

    first: dict[int, int] = {}
    names = []
    shapes = []
    constants = {}
    for k, x in enumerate(fused.inputs):
        b = plan.of[id(x)]
        first.setdefault(b.id, k)
        names.append(f"x{first[b.id]}")
        shapes.append(physical_shape(x, plan))
        if x.op.name == "@literal" and x.shape.dtype in INLINED_CONSTANT_TYPES:
            value = _uniform_value(np.asarray(x.op.value))
            if value is not None:
                constants[k] = value
    out = physical_shape(fused, plan) if stored_buffer_input(fused) is None else None
    return KernelInputs(shapes, names, out, constants)


def _uniform_value(values: np.ndarray) -> float | None:
    """The value of a small literal whose elements are all equal (a scalar, or one broadcast
    by constant folding), which a kernel can write as a number; else None."""
    if values.size == 0 or values.size > 1 << 16:
        return None
    first = values.reshape(-1)[0]
    return float(first) if bool((values == first).all()) else None
