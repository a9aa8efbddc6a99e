"""Weights stored with columns that sum to zero (ir/zero_sum_columns.py): centering in float64
and rounding leaves a residual the test must reject; the nudged values pass it while staying
within a step of their type of the centered values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fusegraph.ir.zero_sum_columns import columns_sum_to_zero, zero_sum_columns

TYPES = [np.float16, np.float32, ml_dtypes.bfloat16]


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("shape", [(96, 40), (2, 64, 24)])
def test_nudged_columns_sum_to_zero_and_plain_rounding_does_not(dtype, shape):
    rng = np.random.default_rng()
    w = rng.standard_normal(shape) * 0.05 + rng.standard_normal(shape[-1]) * 0.02  # columns with a mean
    stored = zero_sum_columns(w, np.dtype(dtype))
    assert stored.dtype == np.dtype(dtype) and stored.shape == w.shape
    centered = w - w.mean(axis=-2, keepdims=True)
    assert columns_sum_to_zero(stored)
    assert not columns_sum_to_zero(centered.astype(dtype))  # rounding's residual is too large
    assert not columns_sum_to_zero(w.astype(dtype))
    # each value moved at most one step of its binade (subnormals: the finest step) past plain rounding
    info = ml_dtypes.finfo(dtype)
    step = np.maximum(np.abs(centered) * 2.0 ** -info.nmant, float(info.smallest_subnormal))
    assert (np.abs(stored.astype(np.float64) - centered) <= 1.5 * step).all()


def test_only_floating_matrices_count():
    assert not columns_sum_to_zero(np.zeros(8, np.float32))  # a vector has no columns
    assert not columns_sum_to_zero(np.zeros((4, 3), np.int32))
    assert columns_sum_to_zero(np.zeros((4, 3), np.float16))
