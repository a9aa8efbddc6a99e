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
    name = "to_half"

    def __init__(self, dtype: DType = DType.float16) -> None:
        self.dtype = dtype

    def apply(self, module: Module) -> bool:
        changed = False
        for ins in module.instructions:
            op = ins.op
            if isinstance(op, Param) and ins.shape.dtype == DType.float32:
                ins.shape = ins.shape.with_dtype(self.dtype)
                changed = True
            elif isinstance(op, Literal) and op.value.dtype == np.float32:
                ins.op = Literal(op.value.astype(self.dtype.numpy))
                ins.shape = ins.op.compute_shape([])
                changed = True
            elif isinstance(op, Convert) and op.attrs["target"] == DType.float32:
                ins.op = Convert(self.dtype)
                changed = True
            if ins.inputs:
                ins.shape = ins.op.compute_shape([x.shape for x in ins.inputs])
        return changed
