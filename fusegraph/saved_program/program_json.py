"""An unfused Program as plain JSON plus one array per literal, and back.

The JSON holds only names, numbers and strings: an op is rebuilt by its registered name from
its attributes, and its shape is inferred again and compared to the stored one, so a file can
describe a program but never run code of its own.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from fusegraph.errors import FusegraphError, SavedProgramError
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Module, Program
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import REGISTRY, Op, OpKind, is_fused
from fusegraph.ops.source import Literal, make_literal, make_param

#: op kinds a saved program may hold: an unfused program has no fused groups or memory ops
_REBUILT_KINDS = {OpKind.POINTWISE, OpKind.VIEW, OpKind.REDUCE, OpKind.ANCHOR, OpKind.MOVE}


def program_to_json(program: Program, where: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON of `program` and its literals' arrays by tensor name. A tensor is named by its
    content, so equal literals (of this program or of others saved in the same file) are stored once."""
    if any(is_fused(i) for i in program.main):
        raise SavedProgramError(f"{where}: the program is fused; save the unfused program (from parse_onnx)")
    position = {id(ins): k for k, ins in enumerate(program.main)}
    instructions, tensors = [], {}
    for k, ins in enumerate(program.main):
        entry: dict[str, Any] = {"op": ins.op.name, "origin": ins.origin, "shape": _shape_json(ins.shape),
                                 "inputs": [position[id(x)] for x in ins.inputs]}
        if isinstance(ins.op, Literal):
            value = _storable(ins.op.value)
            entry["tensor"] = _tensor_name(value)
            tensors[entry["tensor"]] = value
        else:
            entry["attrs"] = {a: _value_json(v, f"{where}: instruction {k} ({ins.op.name}) attribute {a!r}")
                              for a, v in ins.op.attrs.items()}
        instructions.append(entry)
    doc = {"instructions": instructions, "returns": [position[id(r)] for r in program.main.returns],
           "return_names": list(program.main.return_names),
           "meta": {k: v for k, v in program.meta.items() if isinstance(v, (str, int, float, bool))}}
    return doc, tensors


def program_from_json(doc: dict[str, Any], tensors: dict[str, np.ndarray], where: str) -> Program:
    """Rebuild the Program `program_to_json` described; anything inconsistent is a SavedProgramError."""
    try:
        program = Program()
        built: list[Instruction] = []
        for k, entry in enumerate(doc["instructions"]):
            ins = _instruction(entry, built, tensors, f"{where}: instruction {k}")
            if ins.shape != _shape_from_json(entry["shape"]):
                raise SavedProgramError(f"{where}: instruction {k} ({entry['op']}) has shape {ins.shape}, "
                                        f"the file says {_shape_from_json(entry['shape'])}")
            built.append(program.main.append(ins))
        program.main.set_returns([built[_index(r, len(built))] for r in doc["returns"]], list(doc["return_names"]))
        program.meta.update(doc.get("meta", {}))
        return program
    except SavedProgramError:
        raise
    except (FusegraphError, KeyError, TypeError, ValueError, IndexError) as e:
        raise SavedProgramError(f"{where}: the program is malformed: {type(e).__name__}: {e}") from None


def _instruction(entry: dict[str, Any], built: list[Instruction], tensors: dict[str, np.ndarray],
                 where: str) -> Instruction:
    name = entry["op"]
    inputs = [built[_index(i, len(built))] for i in entry["inputs"]]
    if name == "@param":
        return make_param(entry["attrs"]["name"], _shape_from_json(entry["shape"]))
    if name == "@literal":
        shape = _shape_from_json(entry["shape"])
        value = tensors[entry["tensor"]]
        if shape.dtype == DType.bfloat16:
            value = value.view(shape.dtype.numpy)
        return make_literal(value.reshape(shape.lens), origin=entry["origin"])
    cls = REGISTRY.get(name)
    if cls is None or cls.kind not in _REBUILT_KINDS or cls.in_epilogue:  # those exist inside fused groups only
        raise SavedProgramError(f"{where}: unknown op {name!r} (this fusegraph has no such unfused op)")
    attrs = {a: _value_from_json(v) for a, v in entry["attrs"].items()}
    if attrs and cls.__init__ is Op.__init__:  # the base constructor would keep any name it is given
        raise SavedProgramError(f"{where}: {name} takes no attributes, the file gives {', '.join(sorted(attrs))}")
    op = cls(**attrs)
    if op.attrs != attrs:  # a constructor that reads its attributes differently than it stores them
        raise SavedProgramError(f"{where}: {name} rebuilt with attributes {op.attrs}, the file says {attrs}")
    return Module().make(op, inputs, entry["origin"])


def _index(i: Any, n: int) -> int:
    """An input position: an earlier instruction, never a later one (the program stays in order)."""
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
        raise ValueError(f"instruction reference {i!r} is not an earlier instruction")
    return i


def _tensor_name(value: np.ndarray) -> str:
    digest = hashlib.sha256(f"{value.dtype.str}:{list(value.shape)};".encode())
    digest.update(value.reshape(-1).view(np.uint8))
    return "t" + digest.hexdigest()[:32]


def _storable(value: np.ndarray) -> np.ndarray:
    """safetensors' NumPy side has no bfloat16: such a literal is stored as its 16-bit patterns."""
    arr = np.ascontiguousarray(value)
    return arr.view(np.uint16) if arr.dtype == DType.bfloat16.numpy else arr


def _shape_json(shape: Shape) -> dict[str, Any]:
    return {"dtype": shape.dtype.value, "lens": list(shape.lens), "strides": list(shape.strides), "offset": shape.offset}


def _shape_from_json(doc: dict[str, Any]) -> Shape:
    return Shape.of(DType(doc["dtype"]), doc["lens"], doc["strides"], doc["offset"])


def _value_json(v: Any, where: str) -> Any:
    """An attribute as JSON: tuples as lists, element types and non-finite floats as tagged objects."""
    if isinstance(v, tuple):
        return [_value_json(x, where) for x in v]
    if isinstance(v, DType):
        return {"dtype": v.value}
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise SavedProgramError(f"{where} is a {type(v).__name__}, which a .fgx file cannot hold")


def _value_from_json(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_value_from_json(x) for x in v)
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return DType(v["dtype"])
    if isinstance(v, dict) and set(v) == {"float"} and v["float"] in ("inf", "-inf", "nan"):
        return float(v["float"])
    if isinstance(v, dict):
        raise ValueError(f"attribute value {v!r} is no value a .fgx file holds")
    return v
