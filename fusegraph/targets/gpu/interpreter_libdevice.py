"""`libdevice` for Triton's interpreter, which has none (its calls return None).

Kernels run under the interpreter import this module under the name `libdevice`; each
function applies NumPy's own to the interpreter's arrays, so CPU tests check the generated
code with exact math functions, while on a GPU the same calls go to CUDA's libdevice.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import triton.language as tl
from triton.runtime.interpreter import TensorHandle


def _wrap(fn: Callable[..., np.ndarray]) -> Callable[..., Any]:
    def call(*args: Any, **_: Any) -> Any:
        tensors = [a for a in args if isinstance(a, tl.core.tensor)]
        like = tensors[0]
        data = [a.handle.data if isinstance(a, tl.core.tensor) else np.asarray(a) for a in args]
        with np.errstate(all="ignore"):
            out = np.asarray(fn(*data)).astype(like.handle.data.dtype)
        shape = np.broadcast_shapes(*(d.shape for d in data))
        out = np.broadcast_to(out, shape).copy()
        ty = like.type if like.handle.data.shape == shape else tl.block_type(like.dtype, list(shape))
        return tl.core.tensor(TensorHandle(out, like.dtype.scalar if hasattr(like.dtype, "scalar") else like.dtype), ty)

    return call


pow = _wrap(np.power)  # noqa: A001 - libdevice's name
tanh = _wrap(np.tanh)
erf = _wrap(np.vectorize(math.erf, otypes=[np.float64]))
rint = _wrap(np.rint)
tan = _wrap(np.tan)
asin = _wrap(np.arcsin)
acos = _wrap(np.arccos)
atan = _wrap(np.arctan)
sinh = _wrap(np.sinh)
cosh = _wrap(np.cosh)
asinh = _wrap(np.arcsinh)
acosh = _wrap(np.arccosh)
atanh = _wrap(np.arctanh)
log1p = _wrap(np.log1p)
