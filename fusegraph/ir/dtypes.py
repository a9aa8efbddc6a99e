"""Element types of fusegraph tensors.

Each type has the name MIGraphX prints (`float_type`, `half_type`, ...) so printed programs
read the same across tools, and maps to one NumPy dtype so the reference target can run it.
bfloat16 comes from `ml_dtypes` (which `onnx` already depends on), imported at its first use:
its import takes about a second, which a process that never meets bfloat16 (a kernel-build
worker, a saved fp16 program's load) need not pay.
"""

from __future__ import annotations

import enum
import functools

import numpy as np


class DType(enum.Enum):
    """An element type; its value is the printed name."""

    float32 = "float_type"
    float16 = "half_type"
    bfloat16 = "bf16_type"
    float64 = "double_type"
    int64 = "int64_type"
    int32 = "int32_type"
    int16 = "int16_type"
    int8 = "int8_type"
    uint8 = "uint8_type"
    uint16 = "uint16_type"
    uint32 = "uint32_type"
    uint64 = "uint64_type"
    bool = "bool_type"

    @property
    def numpy(self) -> np.dtype:
        dt = _TO_NUMPY.get(self)
        return dt if dt is not None else bfloat16_numpy()

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.float32, DType.float16, DType.bfloat16, DType.float64)

    @property
    def is_integer(self) -> bool:
        return self in (DType.int64, DType.int32, DType.int16, DType.int8, DType.uint8, DType.uint16, DType.uint32,
                        DType.uint64)

    def __str__(self) -> str:
        return self.value

    @staticmethod
    def from_numpy(dtype: np.dtype | type) -> "DType":
        """The DType of a NumPy dtype; raises ValueError for types fusegraph does not carry."""
        dt = np.dtype(dtype)
        for k, v in _TO_NUMPY.items():
            if v == dt:
                return k
        if is_bfloat16(dt):
            return DType.bfloat16
        raise ValueError(f"unsupported element type {dt}")


@functools.cache
def bfloat16_numpy() -> np.dtype:
    """ml_dtypes' bfloat16, the NumPy type of DType.bfloat16 (imported here, at first use)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def is_bfloat16(dtype: np.dtype | type) -> bool:
    """Whether a NumPy dtype is ml_dtypes' bfloat16, without importing ml_dtypes for any other
    (a bfloat16 array exists only once ml_dtypes is imported)."""
    dt = np.dtype(dtype)
    return dt.name == "bfloat16" and dt == bfloat16_numpy()


_TO_NUMPY: dict[DType, np.dtype] = {  # bfloat16's: bfloat16_numpy()
    DType.float32: np.dtype(np.float32),
    DType.float16: np.dtype(np.float16),
    DType.float64: np.dtype(np.float64),
    DType.int64: np.dtype(np.int64),
    DType.int32: np.dtype(np.int32),
    DType.int16: np.dtype(np.int16),
    DType.int8: np.dtype(np.int8),
    DType.uint8: np.dtype(np.uint8),
    DType.uint16: np.dtype(np.uint16),
    DType.uint32: np.dtype(np.uint32),
    DType.uint64: np.dtype(np.uint64),
    DType.bool: np.dtype(np.bool_),
}
