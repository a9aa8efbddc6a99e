"""A Program as plain JSON plus one array per literal, and back.

The JSON holds only names, numbers and strings: an op is rebuilt by its registered name from
its attributes, and its shape is inferred again and compared to the stored one, so a file can
describe a program but never run code of its own.

A fused program (what the gpu target compiles, after half precision and fusion) is stored the
same way, each fused group's sub-module nested in its instruction and index maps as their
expression trees (expr_json). It is checked as strictly as an unfused one, and more: every
group's loads and stores must stay inside the buffers they address (index_bounds), so a
changed map cannot make a regenerated kernel read or write outside its buffers.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from fusegraph.errors import FusegraphError, SavedProgramError
from fusegraph.ir.dtypes import DType
from fusegraph.ir.index_expr import Expr
from fusegraph.ir.index_map import IndexMap
from fusegraph.ir.program import Instruction, Module, Program
from fusegraph.ir.shape import Shape
from fusegraph.ops.base import REGISTRY, MemoryKind, Op, OpKind, is_fused
from fusegraph.ops.fused import Fused, FusedOutput
from fusegraph.ops.source import Literal, make_literal, make_param
from fusegraph.saved_program import expr_json
from fusegraph.saved_program.index_bounds import check_in_bounds

#: op kinds an unfused program may hold: no fused groups or memory ops
_UNFUSED_KINDS = {OpKind.POINTWISE, OpKind.VIEW, OpKind.REDUCE, OpKind.ANCHOR, OpKind.MOVE}
#: a fused program's main module adds groups, their further outputs and buffers; a group's sub-module
#: adds the memory ops and the reductions computed in an anchor's epilogue, but no nested group
_MAIN_KINDS = _UNFUSED_KINDS | {OpKind.FUSED, OpKind.OUTPUT, OpKind.MEMORY}
_GROUP_KINDS = _UNFUSED_KINDS | {OpKind.MEMORY}
#: the deepest nesting a stored value may have (index expressions are rarely deeper than 10)
_MAX_DEPTH = 64


def program_to_json(program: Program, where: str, fused: bool = False) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON of `program` and its literals' arrays by tensor name. A tensor is named by its
    content, so equal literals (of this program or of others saved in the same file) are stored
    once. `fused`: the program is a fused one (else a fused program is refused)."""
    if not fused and any(is_fused(i) for i in program.main):
        raise SavedProgramError(f"{where}: the program is fused; save the unfused program (from parse_onnx)")
    tensors: dict[str, np.ndarray] = {}
    doc = _module_json(program.main, tensors, where)
    doc["meta"] = {k: v for k, v in program.meta.items() if isinstance(v, (str, int, float, bool))}
    return doc, tensors


def _module_json(module: Module, tensors: dict[str, np.ndarray], where: str) -> dict[str, Any]:
    position = {id(ins): k for k, ins in enumerate(module)}
    instructions = []
    for k, ins in enumerate(module):
        at = f"{where}: instruction {k} ({ins.op.name})"
        entry: dict[str, Any] = {"op": ins.op.name, "origin": ins.origin, "shape": _shape_json(ins.shape),
                                 "inputs": [position[id(x)] for x in ins.inputs]}
        if isinstance(ins.op, Literal):
            value = _storable(ins.op.value)
            entry["tensor"] = _tensor_name(value)
            tensors[entry["tensor"]] = value
        else:
            entry["attrs"] = {a: _value_json(v, f"{at} attribute {a!r}") for a, v in ins.op.attrs.items()
                              if not isinstance(ins.op, Fused) or a != "module"}
        if isinstance(ins.op, Fused):
            entry["module"] = {"name": ins.op.module.name, **_module_json(ins.op.module, tensors, f"{at} group")}
        if isinstance(ins.op, FusedOutput) and ins.op.group is not ins.inputs[0].op.module:
            raise SavedProgramError(f"{at} reads another group than its input's")
        instructions.append(entry)
    return {"instructions": instructions, "returns": [position[id(r)] for r in module.returns],
            "return_names": list(module.return_names)}


def program_from_json(doc: dict[str, Any], tensors: dict[str, np.ndarray], where: str, fused: bool = False) -> Program:
    """Rebuild the Program `program_to_json` described (`fused`: a fused one); anything
    inconsistent is a SavedProgramError."""
    try:
        program = Program(_module_from_json(doc, tensors, where, _MAIN_KINDS if fused else _UNFUSED_KINDS, "main", set()))
        meta = doc.get("meta", {})
        if not isinstance(meta, dict):
            raise TypeError("meta is not a mapping")
        program.meta.update(meta)
        return program
    except SavedProgramError:
        raise
    except RecursionError:
        raise SavedProgramError(f"{where}: the program is malformed: nested too deeply") from None
    except (FusegraphError, KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise SavedProgramError(f"{where}: the program is malformed: {type(e).__name__}: {e}") from None


def _module_from_json(doc: dict[str, Any], tensors: dict[str, np.ndarray], where: str, kinds: set[OpKind],
                      name: str, names: set[str]) -> Module:
    if name in names:
        raise ValueError(f"two groups are named {name!r}")
    names.add(name)
    module = Module(name)
    built: list[Instruction] = []
    for k, entry in enumerate(doc["instructions"]):
        at = f"{where}: instruction {k}"
        ins = _instruction(entry, built, tensors, at, kinds, names)
        if ins.shape != _shape_from_json(entry["shape"]):
            raise SavedProgramError(f"{where}: instruction {k} ({entry['op']}) has shape {ins.shape}, "
                                    f"the file says {_shape_from_json(entry['shape'])}")
        if ins.op.kind == OpKind.MEMORY:
            check_in_bounds(ins, f"{at} ({ins.op.name})")
        built.append(module.append(ins))
    returns, return_names = doc["returns"], doc["return_names"]
    if not isinstance(returns, list) or not isinstance(return_names, list) or len(returns) != len(return_names) \
            or not all(isinstance(n, str) for n in return_names):
        raise ValueError("returns and return_names must be lists of one length, the names strings")
    module.set_returns([built[_index(r, len(built))] for r in returns], list(return_names))
    return module


def _instruction(entry: dict[str, Any], built: list[Instruction], tensors: dict[str, np.ndarray],
                 where: str, kinds: set[OpKind], names: set[str]) -> Instruction:
    name = entry["op"]
    inputs = [built[_index(i, len(built))] for i in entry["inputs"]]
    origin = entry["origin"]
    if not isinstance(origin, str):
        raise TypeError("origin is not a string")
    if name == "@param":
        return make_param(entry["attrs"]["name"], _shape_from_json(entry["shape"]))
    if name == "@literal":
        shape = _shape_from_json(entry["shape"])
        value = tensors[entry["tensor"]]
        if shape.dtype == DType.bfloat16:
            value = value.view(shape.dtype.numpy)
        return make_literal(value.reshape(shape.lens), origin=origin)
    cls = REGISTRY.get(name)
    if cls is None or not _allowed(cls, kinds):
        raise SavedProgramError(f"{where}: unknown op {name!r} (this fusegraph has no such "
                                f"{'op in a fused group' if OpKind.MEMORY in kinds else 'op here'})"
                                if OpKind.FUSED in kinds or OpKind.MEMORY in kinds else
                                f"{where}: unknown op {name!r} (this fusegraph has no such unfused op)")
    attrs = {a: _value_from_json(v, 0) for a, v in entry["attrs"].items()}
    if cls is Fused:
        return _group(entry, attrs, inputs, tensors, where, names, origin)
    if cls is FusedOutput:
        return _further_output(attrs, inputs, origin)
    if attrs and cls.__init__ is Op.__init__:  # the base constructor would keep any name it is given
        raise SavedProgramError(f"{where}: {name} takes no attributes, the file gives {', '.join(sorted(attrs))}")
    op = cls(**attrs)
    if op.attrs != attrs:  # a constructor that reads its attributes differently than it stores them
        raise SavedProgramError(f"{where}: {name} rebuilt with attributes {op.attrs}, the file says {attrs}")
    return Module().make(op, inputs, origin)


def _allowed(cls: type[Op], kinds: set[OpKind]) -> bool:
    """Whether an op of class `cls` may stand in a module of `kinds`: a fused program's main
    module also holds the buffers (`allocate`) that groups store concatenated parts into."""
    if cls.kind == OpKind.MEMORY and OpKind.FUSED in kinds:
        return cls.memory == MemoryKind.ALLOCATE
    return cls.kind in kinds and (not cls.in_epilogue or OpKind.MEMORY in kinds)


def _group(entry: dict[str, Any], attrs: dict[str, Any], inputs: list[Instruction], tensors: dict[str, np.ndarray],
           where: str, names: set[str], origin: str) -> Instruction:
    """A fused group: its sub-module rebuilt (no nested group), stores writing into its buffers."""
    if set(attrs) != {"kernel"} or not isinstance(attrs["kernel"], str):
        raise ValueError("a fused group's attributes are its kernel name only")
    doc = entry["module"]
    if not isinstance(doc["name"], str):
        raise TypeError("group name is not a string")
    sub = _module_from_json(doc, tensors, f"{where} group", _GROUP_KINDS, doc["name"], names)
    if not sub.returns or any(r.op.memory != MemoryKind.STORE for r in sub.returns):
        raise ValueError("a fused group must return the values of its stores")
    return Module().make(Fused(sub, attrs["kernel"]), inputs, origin)


def _further_output(attrs: dict[str, Any], inputs: list[Instruction], origin: str) -> Instruction:
    if set(attrs) != {"index"} or len(inputs) != 1 or not isinstance(inputs[0].op, Fused):
        raise ValueError("a fused_output reads one fused group and has an index only")
    index = attrs["index"]
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError("fused_output index is not an integer")
    return Module().make(FusedOutput(inputs[0].op.module, index), inputs, origin)


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
    """An attribute as JSON: tuples as lists; element types, non-finite floats, index
    expressions and index maps as tagged objects."""
    if isinstance(v, tuple):
        return [_value_json(x, where) for x in v]
    if isinstance(v, DType):
        return {"dtype": v.value}
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    if isinstance(v, Expr):
        return {"expr": expr_json.expr_to_json(v)}
    if isinstance(v, IndexMap):
        return {"index_map": expr_json.map_to_json(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise SavedProgramError(f"{where} is a {type(v).__name__}, which a .fgx file cannot hold")


def _value_from_json(v: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError("an attribute value is nested too deeply")
    if isinstance(v, list):
        return tuple(_value_from_json(x, depth + 1) for x in v)
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return DType(v["dtype"])
    if isinstance(v, dict) and set(v) == {"float"} and v["float"] in ("inf", "-inf", "nan"):
        return float(v["float"])
    if isinstance(v, dict) and set(v) == {"expr"}:
        return expr_json.expr_from_json(v["expr"])
    if isinstance(v, dict) and set(v) == {"index_map"}:
        return expr_json.map_from_json(v["index_map"])
    if isinstance(v, dict):
        raise ValueError(f"attribute value {v!r} is no value a .fgx file holds")
    return v
