"""The default pass pipelines.

Canonicalization first, so fusion sees the simplest graph; then attention written as plain
ops becomes one anchor, sibling anchors that read the same input merge into one (horizontal
fusion), anchors take their epilogues (they are
the expensive kernels and must absorb the most), then reductions and data movement, then
whatever pointwise ops are left, and finally concats become buffers that their producers
write into.
"""

from __future__ import annotations

from typing import TextIO

from fusegraph.ir.program import Program
from fusegraph.ops.base import is_fused
from fusegraph.passes.compact_literals import CompactLiterals
from fusegraph.passes.constant_propagation import ConstantPropagation
from fusegraph.passes.cse import CommonSubexpressions
from fusegraph.passes.dead_code import DeadCodeElimination
from fusegraph.passes.defer_norm import DeferNorm
from fusegraph.passes.eliminate_concat import EliminateConcat
from fusegraph.passes.eliminate_identity import EliminateIdentity
from fusegraph.passes.fold_into_weights import FoldIntoWeights
from fusegraph.passes.fold_norm_affine import FoldNormAffine
from fusegraph.passes.fuse_anchors import FuseAnchors, FuseMovement, FuseReductions
from fusegraph.passes.fuse_attention import FuseAttention
from fusegraph.passes.fuse_pointwise import FusePointwise
from fusegraph.passes.manager import Pass, PassReport, run_passes
from fusegraph.passes.merge_siblings import MergeSiblings
from fusegraph.passes.pad_channel_groups import PadChannelGroups
from fusegraph.passes.simplify_views import SimplifyViews
from fusegraph.passes.sink_concat import SinkConcat
from fusegraph.passes.space_to_depth import SpaceToDepth
from fusegraph.passes.to_half import forget_wide_values


def canonicalize_passes() -> list[Pass]:
    return [DeadCodeElimination(), ConstantPropagation(), EliminateIdentity(), CommonSubexpressions(), SimplifyViews(),
            FoldIntoWeights(), FoldNormAffine(), DeferNorm(), PadChannelGroups(), SpaceToDepth(), ConstantPropagation(), CompactLiterals(), EliminateIdentity(), DeadCodeElimination()]


def fusion_passes() -> list[Pass]:
    return [FuseAttention(), MergeSiblings(), SinkConcat(), FuseAnchors(), FuseReductions(), FuseMovement(), FusePointwise(), EliminateConcat(), DeadCodeElimination()]


def default_pipeline() -> list[Pass]:
    return canonicalize_passes() + fusion_passes()


def fuse(program: Program, trace: bool = False, out: TextIO | None = None) -> PassReport:
    """Canonicalize and fuse `program` in place."""
    report = run_passes(program, default_pipeline(), trace, out)
    forget_wide_values(program.main)
    return report


def count_kernels(program: Program) -> int:
    return sum(1 for i in program.main if is_fused(i))


def compile_program(program: Program, trace: bool = False, out: TextIO | None = None) -> str:
    """Fuse `program` and return a report: the kernels and the pass times."""
    report = fuse(program, trace, out)
    kernels = [i for i in program.main if is_fused(i)]
    names: dict[str, int] = {}
    for k in kernels:
        names[k.op.attrs["kernel"]] = names.get(k.op.attrs["kernel"], 0) + 1
    lines = [f"{len(kernels)} fused kernels:"]
    lines += [f"  {n:5d} x {name}" for name, n in sorted(names.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines) + "\n" + str(report)
