"""Weight matrices whose stored columns sum to zero, and the test for one.

A product of rows that sum to zero (a centered layernorm's) with W equals its product with W
less any row vector, so W's columns may be stored centered. A kernel that normalizes after its
product (`templates/gemm_prologue.py`) has to subtract each column's sum of W times the rows'
shift; when the stored columns sum to zero that term vanishes and the kernel need not compute
the sums. Centering in float64 is not enough: rounding to the storage type leaves each column
a residual of about the unit roundoff times its norm, as large as the error budget of a half
precision product. So the rounded values are nudged, each by at most one step of its type,
until every column's sum of the stored values is well inside `columns_sum_to_zero`'s bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fusegraph.ir.dtypes import is_bfloat16

# A column counts as summing to zero below this share of its 2-norm times the storage type's
# unit roundoff: the skipped term, the rows' shift times the sum, then stays under a quarter of
# the rounding of one product term (plain rounding leaves about 0.6, which fails).
ZERO_SUM_SHARE = 0.25


def _finfo(dtype: np.dtype) -> Any:
    """NumPy's float facts, or ml_dtypes' for bfloat16 (which NumPy's finfo does not know)."""
    if is_bfloat16(dtype):
        import ml_dtypes

        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def _unit_roundoff(dtype: np.dtype) -> float:
    return float(_finfo(dtype).eps) / 2


def zero_sum_columns(w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`w` (float64, [..., K, N]) with each column's mean over K subtracted, stored as `dtype`,
    its values nudged so that each column of the stored values sums to zero well within
    `columns_sum_to_zero`'s bound. The rows are visited in order, each value moving by at most
    one step of its own binade, and only while that step brings its column's sum closer to
    zero; the walk ends once every column is within a quarter of the bound (a few dozen rows:
    a typical value's step is a sizeable share of the residual)."""
    # half types' values and steps are exact in float32, which is faster to convert; sums in float64
    work = np.float64 if np.dtype(dtype).itemsize >= 4 else np.float32
    centered = (w - w.mean(axis=-2, keepdims=True)).astype(work)
    stored = centered.astype(dtype).astype(work)
    info = _finfo(dtype)
    mantissa, finest = info.nmant, float(info.smallest_subnormal)  # subnormals share one step
    target = ZERO_SUM_SHARE / 4 * _unit_roundoff(np.dtype(dtype)) * np.sqrt(np.square(stored, dtype=np.float64).sum(axis=-2))
    residual = stored.sum(axis=-2, dtype=np.float64)
    for j in range(w.shape[-2]):
        if (np.abs(residual) <= target).all():
            break
        row = stored[..., j, :]
        magnitude = np.abs(row)
        step = np.maximum(np.exp2(np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0))) - mantissa), finest)
        move = np.where((magnitude > 0) & (np.abs(residual) > step / 2), np.copysign(step, residual), 0.0)
        stored[..., j, :] = row - move
        residual = residual - move.astype(np.float64)
    return stored.astype(dtype)


def columns_sum_to_zero(value: np.ndarray) -> bool:
    """Whether every column (axis -2 summed) of the stored matrices `value` sums to zero up to
    `ZERO_SUM_SHARE` of the unit roundoff times the column's 2-norm: a floating-point literal
    that `zero_sum_columns` made, or any that is as near."""
    if value.ndim < 2 or not np.issubdtype(value.dtype, np.floating) and not is_bfloat16(value.dtype):
        return False
    wide = value.astype(np.float64)
    sums = np.abs(wide.sum(axis=-2))
    norms = np.sqrt((wide * wide).sum(axis=-2))
    return bool((sums <= ZERO_SUM_SHARE * _unit_roundoff(value.dtype) * norms).all())
