"""Comparing fusegraph's results with ONNX Runtime (or any other reference).

The figures are the ones a user can act on: the largest absolute error and the relative
norm error ||a - b|| / ||b|| per output, against a stated tolerance, with NaN/Inf
mismatches called out instead of hidden in a norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


@dataclass
class Comparison:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    rel_norm: float
    nonfinite_mismatch: int
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.nonfinite_mismatch == 0 and self.rel_norm <= self.tolerance

    def line(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        extra = f", {self.nonfinite_mismatch} NaN/Inf mismatches" if self.nonfinite_mismatch else ""
        return (f"{self.name}: {list(self.shape)} max abs error {self.max_abs:.3e}, "
                f"relative norm error {self.rel_norm:.3e} (tolerance {self.tolerance:.0e}){extra}: {status}")


def compare(name: str, got: np.ndarray, want: np.ndarray, tolerance: float) -> Comparison:
    """Compare one output; shapes must agree (a shape mismatch is a failure by itself)."""
    got64 = np.asarray(got).astype(np.float64)
    want64 = np.asarray(want).astype(np.float64)
    if got64.shape != want64.shape:
        return Comparison(name, tuple(got64.shape), float("inf"), float("inf"), 0, tolerance)
    fin_g, fin_w = np.isfinite(got64), np.isfinite(want64)
    mismatch = int(np.count_nonzero((fin_g != fin_w) | (~fin_w & (got64 != want64) & ~(np.isnan(got64) & np.isnan(want64)))))
    both = fin_g & fin_w
    diff = np.where(both, got64 - want64, 0.0)
    denom = np.linalg.norm(np.where(both, want64, 0.0))
    num = np.linalg.norm(diff)
    rel = float(num / denom) if denom > 0 else (0.0 if num == 0 else float("inf"))
    max_abs = float(np.abs(diff).max()) if diff.size else 0.0
    return Comparison(name, tuple(got64.shape), max_abs, rel, mismatch, tolerance)


def run_onnxruntime(model_bytes: bytes, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ONNX Runtime on the CPU with all graph optimizations (what users deploy with)."""
    try:
        import onnxruntime as ort
    except ImportError:
        from fusegraph.errors import FusegraphError

        raise FusegraphError("verify needs onnxruntime: pip install 'fusegraph[ort]'") from None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(inputs))))
