"""Graph inputs and outputs of sequence and optional type, read as tensors.

fusegraph compiles for fixed shapes, and a sequence's length or an optional's presence is part of
the shape: a sequence input of length n becomes n tensor inputs named `x[0]` ... `x[n-1]`
(`element_name`), an empty optional input none. The caller binds them through `input_dims`:
a sequence input's entry is its length (`{"x": [3]}`), each element's dims are entries of their
own (`{"x[0]": [2, 4]}`, else the declared element shape), and an optional input's entry is None
when it is empty. Outputs likewise: a sequence output's elements are returned as `y[0]`, ...,
and `program.meta["structured_outputs"]` gives each sequence output's length (None for an empty
optional), so a caller can put the values back together.
"""

from __future__ import annotations

import re
import warnings
from typing import Mapping, Sequence

import onnx

from fusegraph.errors import ParseError
from fusegraph.ir.program import Instruction, Module
from fusegraph.ir.shape import Shape
from fusegraph.onnx.context import Value, onnx_dtype
from fusegraph.onnx.validate import check_elements
from fusegraph.ops.source import add_param

Dims = Mapping[str, "Sequence[int] | None"]


def element_name(name: str, k: int) -> str:
    """The name of element `k` of the sequence input or output `name`."""
    return f"{name}[{k}]"


def is_element_of(key: str, name: str) -> bool:
    return re.fullmatch(re.escape(name) + r"\[\d+\]", key) is not None


def bind_input(module: Module, name: str, type_proto: onnx.TypeProto, dims: Dims) -> Value:
    """The value of graph input `name`: a parameter, a list of them (a sequence) or None."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return add_param(module, name, tensor_input_shape(name, type_proto.tensor_type, dims.get(name)))
    if kind == "optional_type":
        if name in dims and dims[name] is None:
            return None
        return bind_input(module, name, type_proto.optional_type.elem_type, dims)
    if kind == "sequence_type":
        elem = type_proto.sequence_type.elem_type
        if elem.WhichOneof("value") != "tensor_type":
            raise ParseError(f"input {name!r}: only sequences of tensors are supported")
        length = dims.get(name)
        if length is None or len(length) != 1:
            raise ParseError(f"input {name!r} is a sequence: its length must be known when the model is compiled; "
                             f"bind it with input_dims {{{name!r}: [length]}} (each element's dims as "
                             f"{element_name(name, 0)!r}, ...)")
        return [add_param(module, element_name(name, k),
                          tensor_input_shape(element_name(name, k), elem.tensor_type, dims.get(element_name(name, k))))
                for k in range(int(length[0]))]
    raise ParseError(f"input {name!r}: only tensor, sequence and optional inputs are supported, not {kind or 'an untyped value'}")


def tensor_input_shape(name: str, tt: onnx.TypeProto.Tensor, override: Sequence[int] | None) -> Shape:
    """The shape of a tensor input: `override` (from --input-dim) or the declared one, symbolic
    dims read as 1 with a warning."""
    dtype = onnx_dtype(tt.elem_type, f"input {name!r}")
    declared = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if override is not None:
        lens = [int(d) for d in override]
        if tt.HasField("shape") and len(lens) != len(declared):
            raise ParseError(f"input {name!r}: --input-dim gives rank {len(lens)} but the model declares rank {len(declared)}")
        if any(d < 0 for d in lens):  # 0 is allowed: an empty tensor
            raise ParseError(f"input {name!r}: dimensions must be non-negative, got {lens}")
        check_elements(lens, f"input {name!r} (--input-dim)")
        return Shape.of(dtype, lens)
    if any(d is None or d <= 0 for d in declared):
        fixed = [d if d and d > 0 else 1 for d in declared]
        warnings.warn(f"input {name!r} has symbolic dimensions; using {fixed} (set them with --input-dim)", stacklevel=4)
        return Shape.of(dtype, fixed)
    return Shape.of(dtype, declared)  # type: ignore[arg-type]


def output_returns(name: str, value: Value, type_proto: onnx.TypeProto,
                   structure: dict[str, int | None]) -> list[tuple[str, Instruction]]:
    """The (name, instruction) pairs graph output `name` returns; `structure` records the length
    of a sequence output (None: an empty optional)."""
    kind = type_proto.WhichOneof("value")
    if isinstance(value, list):
        if kind not in ("sequence_type", "optional_type", None):
            raise ParseError(f"graph output {name!r} is declared a {kind} but its value is a sequence")
        structure[name] = len(value)
        return [(element_name(name, k), x) for k, x in enumerate(value)]
    if value is None:
        if kind != "optional_type":
            raise ParseError(f"graph output {name!r} is an empty optional but is declared a {kind}")
        structure[name] = None
        return []
    if kind == "sequence_type":
        raise ParseError(f"graph output {name!r} is declared a sequence but its value is a tensor")
    return [(name, value)]
