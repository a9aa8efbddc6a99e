"""Half-precision programs: float32 parameters and weights become float16 (or bfloat16).

Runs before fusion, on the whole program: weights are converted once at compile time, every
instruction's type is inferred again, and converts that asked for float32 ask for the new
type, so the kernels read and write half the bytes. Arithmetic inside kernels stays fp32
(the code generator computes half values in fp32 and accumulates products in fp32).
"""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Module
from fusegraph.ops.pointwise import Convert
from fusegraph.ops.source import Literal, Param


class ToHalf:
    """`keep_wide`: each narrowed literal keeps its float32 values (`Literal.wide`) for the folds
    of the fusion that follows (`fuse` forgets them after its passes, `forget_wide_values`)."""

    name = "to_half"

    def __init__(self, dtype: DType = DType.float16, keep_wide: bool = False) -> None:
        self.dtype = dtype
        self.keep_wide = keep_wide

    def apply(self, module: Module) -> bool:
        changed = False
        for ins in module.instructions:
            op = ins.op
            if isinstance(op, Param) and ins.shape.dtype == DType.float32:
                ins.shape = ins.shape.with_dtype(self.dtype)
                changed = True
            elif isinstance(op, Literal) and op.value.dtype == np.float32:
                ins.op = Literal(self.narrowed(op.value), wide=op.value if self.keep_wide else None)
                ins.shape = ins.op.compute_shape([])
                changed = True
            elif isinstance(op, Convert) and op.attrs["target"] == DType.float32:
                ins.op = Convert(self.dtype)
                changed = True
            if ins.inputs:
                ins.shape = ins.op.compute_shape([x.shape for x in ins.inputs])
        return changed

    def narrowed(self, value: np.ndarray) -> np.ndarray:
        """`value` in the half type, finite values past its range clamped to its largest: an
        exporter's "minus infinity" mask fill, -3.4e38 (float32's lowest), would otherwise
        become -inf in float16, and the mask's `0 * fill` for a kept token NaN instead of 0.
        Infinities and NaNs written as such stay what they are."""
        if self.dtype == DType.float16:
            top = float(np.finfo(np.float16).max)
        else:
            import ml_dtypes  # bfloat16's range; imported at its first use (ir/dtypes.py)

            top = float(ml_dtypes.finfo(self.dtype.numpy).max)
        clamped = np.where(np.isfinite(value), np.clip(value, -top, top), value)
        return clamped.astype(self.dtype.numpy)


def forget_wide_values(module: Module) -> None:
    """Drop the float32 values half literals kept for the folds, once they have run: a compiled
    half program holds its weights once, in the half type."""
    for ins in module.instructions:
        if isinstance(ins.op, Literal):
            ins.op.wide = None
