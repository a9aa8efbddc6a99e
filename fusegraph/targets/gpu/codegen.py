"""Chooses a template for each fused instruction and generates its kernel.

The anchor of a group (a convolution, matrix product, pooling, reduction or data movement
op inside its sub-module) decides the template by its family; a group without one is
pointwise and takes the flat template. Everything around the anchor (prologue loads,
epilogue ops, stores through index maps) is written by the same kernel writer whatever the
template.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from typing import Any

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction
from fusegraph.ops.base import is_fused, is_literal
from fusegraph.targets.gpu.activation_layout import choose_activation_layouts
from fusegraph.targets.gpu.anchor import find_anchor
from fusegraph.targets.gpu.device import current_device
from fusegraph.targets.gpu.errors import switch_setting
from fusegraph.targets.gpu.kernel_source import DEPENDENT_LAUNCH_CAPABILITY, DEPENDENT_LAUNCH_ENV, KernelSource, with_dependent_launch
from fusegraph.targets.gpu.kernel_writer import CodegenError, KernelInputs
from fusegraph.targets.gpu.memory_plan import MemoryPlan, physical_shape, plan_memory, stored_buffer_input, strided_shape
from fusegraph.targets.gpu.templates import attention, depthwise, gemm, movement, reduction, window  # noqa: F401  (they register what they lower)
from fusegraph.targets.gpu.templates.flat import flat_kernel
from fusegraph.targets.gpu.templates.registry import template_for
from fusegraph.targets.gpu.weight_layout import choose_weight_layouts

INLINED_CONSTANT_TYPES = (DType.float16, DType.float32, DType.float64)  # exact as a Python float


def kernel_function_name(position: int, kernel: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", f"k{position}_{kernel}")[:96]


def named_by_content(src: KernelSource) -> KernelSource:
    """`src` with its function named by what it computes, not by its position.

    Models repeat their blocks: a 12-layer transformer has 12 copies of each block's kernels,
    equal but for the position in their names. Named by a hash of the body (with the name taken
    out), the candidate configs and the grid, equal kernels have one source and one digest, so
    Triton builds each once and the tuner times each once (BERT-base: 111 kernels, 9 distinct).
    """
    placeholder = "KERNEL"
    body = src.body.replace(f"def {src.name}(", f"def {placeholder}(", 1)
    key = repr((body, src.configs, src.grid_dims, src.default_tune, src.interpret)).encode()
    name = re.sub(r"[^A-Za-z0-9_]", "_", f"k_{hashlib.sha256(key).hexdigest()[:10]}_{src.kernel_name}")[:96]
    return replace(src, name=name, body=body.replace(f"def {placeholder}(", f"def {name}(", 1))


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
        else:
            src = template_for(anchor.op, [x.shape for x in anchor.inputs])(name, kernel, module, inputs, anchor, allow_tf32, interpret)
    except CodegenError as e:
        raise CodegenError(f"kernel {name} ({fused.origin or kernel}): {e}") from None
    src.interpret = interpret
    if launches_early(fused) and not interpret:  # the interpreter runs one kernel at a time
        src = with_dependent_launch(src)
    return named_by_content(src)


# By default a kernel that writes at most this many elements is built for dependent launch. At
# batch 1 every kernel of the zoo's measured models does (the largest: EfficientNet-B1's
# 120x120x96, 1.4M), and with dependent launch each of the six ran faster on an H100 (BERT-base
# 0.443 -> 0.368 ms); at batch 32 none of BERT-base's does (the smallest: 3.1M), where with it
# BERT-base ran 2.293 ms against 2.068 plain (bench/results/models-b1-prefetch.md,
# models-transformers-b32-pdl.md). A short kernel's launch gap is a large share of its time.
EARLY_LAUNCH_MAX_ELEMENTS = 1 << 21


def launches_early(fused: Instruction) -> bool:
    """Whether `fused`'s kernel is built for programmatic dependent launch
    (`kernel_source.with_dependent_launch`): by default a kernel of at most
    EARLY_LAUNCH_MAX_ELEMENTS outputs on a GPU that has it (compute capability 9.0 and later; a
    build without a GPU targets the H200); `FUSEGRAPH_DEPENDENT_LAUNCH=1` every kernel, `=0` none."""
    setting = switch_setting(DEPENDENT_LAUNCH_ENV, "every kernel launched early",
                             "none; unset: the short kernels on a GPU that has it")
    if setting:
        return setting == "1"
    return (current_device().capability >= DEPENDENT_LAUNCH_CAPABILITY
            and fused.shape.elements <= EARLY_LAUNCH_MAX_ELEMENTS)


def plan_program(main: Any) -> MemoryPlan:
    """The memory plan of a fused main module with the physical layouts its kernels read."""
    plan = plan_memory(main)
    choose_weight_layouts(main, plan)
    choose_activation_layouts(main, plan)
    return plan


def program_kernels(program: Any, allow_tf32: bool = False, interpret: bool = False) -> list[KernelSource]:
    """The kernels of a fused program, generated without loading them (for printing)."""
    plan = plan_program(program.main)
    out = []
    for pos, ins in enumerate(i for i in program.main if is_fused(i)):
        out.append(generate(ins, pos, kernel_inputs(ins, plan), allow_tf32, interpret))
    return out


def kernel_inputs(fused: Instruction, plan: MemoryPlan) -> KernelInputs:
    """Inputs of `fused` as its kernel sees them (in their buffers' layouts); views of one
    buffer share a pointer."""
    first: dict[int, int] = {}
    names = []
    shapes = []
    constants = {}
    literals = {}
    for k, x in enumerate(fused.inputs):
        b = plan.of[id(x)]
        first.setdefault(b.id, k)
        names.append(f"x{first[b.id]}")
        shapes.append(physical_shape(x, plan))
        if is_literal(x):
            literals[k] = np.asarray(x.op.value)
        if is_literal(x) and x.shape.dtype in INLINED_CONSTANT_TYPES:
            value = _uniform_value(literals[k])
            if value is not None:
                constants[k] = value
    out = physical_shape(fused, plan) if stored_buffer_input(fused) is None else None
    further = [strided_shape(b.shape, b.perm) for b in plan.further.get(id(fused), [])]
    return KernelInputs(shapes, names, out, constants, further, literals)


def _uniform_value(values: np.ndarray) -> float | None:
    """The value of a small literal whose elements are all equal (a scalar, or one broadcast
    by constant folding), which a kernel can write as a number; else None."""
    if values.size == 0 or values.size > 1 << 16:
        return None
    first = values.reshape(-1)[0]
    return float(first) if bool((values == first).all()) else None
