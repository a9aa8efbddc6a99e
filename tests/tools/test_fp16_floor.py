"""tools/fp16_floor.py: the plain fp16 run of a zoo graph differs from its fp32 run by fp16
rounding, no more and no less."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from fp16_floor import fp16_error  # noqa: E402


def test_gpt2_in_fp16_carries_rounding_error_only():
    err = fp16_error("gpt2_2layer", 1)
    # fp16 keeps 11 bits (4.9e-4 per rounding): two blocks of rounding noise sit well above
    # 1e-4 (an fp32 run would be ~1e-7) and far below a wrong result (order 1)
    assert 1e-4 < err < 2e-2
