"""A DLPack capsule for a NumPy array, built with ctypes, for Triton's Python backend stub.

The stub shipped with Triton 2.51 (nvidia-pytriton 0.7.0) was built against NumPy 1's C
layout: under NumPy 2 it reads a dtype's item size from where NumPy 2 keeps its flags, so
`pb_utils.Tensor(name, array)` makes a tensor of 0 bytes and `Tensor.as_numpy()` gives wrong
values. DLPack carries shape and dtype without NumPy's structs, and NumPy reads the stub's
capsules correctly (`np.from_dlpack(tensor)`). The other way, NumPy's own capsules cannot be
handed over: the stub marks a consumed capsule `used_dlpack` instead of the standard
`used_dltensor`, so NumPy's capsule destructor would free the array the stub still holds.
This capsule has no destructor; the stub calls its deleter when it is done with the tensor,
and only then is the array let go.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _ManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_ManagedTensor))
_ManagedTensor._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

#: DLPack type codes by NumPy kind (kDLInt, kDLUInt, kDLFloat; bool travels as 8-bit uint)
_CODES = {"i": 0, "u": 1, "b": 1, "f": 2}
_CPU = 1

#: what each capsule handed out keeps alive, by the address of its managed tensor
_alive: dict[int, tuple[Any, ...]] = {}


@_DELETER
def _release(managed: Any) -> None:
    _alive.pop(ctypes.addressof(managed.contents), None)


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def capsule(array: np.ndarray) -> Any:
    """A `dltensor` capsule over a C-contiguous copy-or-view of `array` (CPU memory)."""
    a = np.ascontiguousarray(array)
    if a.dtype.kind not in _CODES:
        raise TypeError(f"no DLPack type for dtype {a.dtype}")
    shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
    managed = _ManagedTensor()
    managed.dl_tensor.data = a.ctypes.data
    managed.dl_tensor.device = _Device(_CPU, 0)
    managed.dl_tensor.ndim = a.ndim
    managed.dl_tensor.dtype = _DataType(_CODES[a.dtype.kind], a.dtype.itemsize * 8, 1)
    managed.dl_tensor.shape = shape
    managed.dl_tensor.strides = None
    managed.dl_tensor.byte_offset = 0
    managed.deleter = _release
    _alive[ctypes.addressof(managed)] = (managed, a, shape)
    return _capsule_new(ctypes.addressof(managed), b"dltensor", None)

