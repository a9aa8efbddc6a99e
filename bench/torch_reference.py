"""A fusegraph Program as a plain PyTorch module: the eager and torch.compile contenders.

Why: the benchmarks compare fusegraph with PyTorch on exactly the same graph and weights. The
yolov5 package is not available on the benchmark machine, and a model rebuilt by hand could
drift from the ONNX graph fusegraph reads. So the PyTorch model is generated from the unfused
Program that `fusegraph.parse_onnx` returns: one torch call per instruction, weights and
constants as registered buffers (so `.to(device, dtype)` and `.to(memory_format=...)` move
them), and a `forward` written out as straight-line Python source. No loop over instructions
runs at call time, so eager mode pays only for the torch calls themselves and torch.compile
traces the whole network as ONE graph: there is no Python-side control flow at all, let alone
data-dependent control flow. `module.code` shows the generated source.

With `idioms=True` (the default) a few patterns are written the way a PyTorch user writes
them, because a contender handicapped by the ONNX decomposition would make a poor baseline:

* convolution + bias add -> `F.conv2d(x, w, b)` (the ONNX importer splits Conv's bias off);
* dot + bias add (Gemm) -> `torch.addmm`;
* `x * sigmoid(x)` -> `F.silu(x)`;
* batch_norm with per-channel constants -> `F.batch_norm` (cuDNN's inference kernel);
* a pointwise operand that is a constant of one repeated value (the ONNX exporter turns
  `xy * 2` into a multiply by a full tensor of 2s) -> a Python number.

Every rewrite computes the same function; `idioms=False` gives the literal one-op-per-instruction
translation (the tests check both against fusegraph's NumPy reference).
"""

from __future__ import annotations

import itertools
import keyword
import linecache
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Instruction, Program

__all__ = ["TorchReference", "TorchReferenceError", "build_module", "torch_dtype", "SUPPORTED_OPS"]


class TorchReferenceError(NotImplementedError):
    """The program holds ops (named in the message) that this translation does not cover."""


_TORCH_DTYPES: dict[DType, torch.dtype] = {
    DType.float32: torch.float32,
    DType.float16: torch.float16,
    DType.bfloat16: torch.bfloat16,
    DType.float64: torch.float64,
    DType.int64: torch.int64,
    DType.int32: torch.int32,
    DType.int16: torch.int16,
    DType.int8: torch.int8,
    DType.uint8: torch.uint8,
    DType.bool: torch.bool,
}


def torch_dtype(dtype: DType) -> torch.dtype:
    """The torch dtype of a fusegraph element type."""
    return _TORCH_DTYPES[dtype]


def _tensor_from_numpy(value: np.ndarray) -> torch.Tensor:
    """A torch copy of a NumPy array (literals are read-only; bfloat16 comes from ml_dtypes)."""
    arr = np.array(value, copy=True, order="C")
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


# --------------------------------------------------------------------------------------------
# Helpers the generated code calls. Each is straight-line torch code over arguments that are
# fixed when the module is built (Python ints and tuples), so torch.compile inlines them.
# --------------------------------------------------------------------------------------------

def _lerp_axis(x: torch.Tensor, axis: int, i0: torch.Tensor, i1: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Linear interpolation along one axis between the rows i0 and i1 with weights t."""
    shape = [1] * x.ndim
    shape[axis] = -1
    w = t.reshape(shape)
    return x.index_select(axis, i0) * (1 - w) + x.index_select(axis, i1) * w


def _lrn_window(x: torch.Tensor, size: int, alpha: float, beta: float, bias: float) -> torch.Tensor:
    """ONNX LRN for any window size: the window spans (size-1)//2 channels before, the rest after.

    (F.local_response_norm puts the larger half before; the two agree for odd sizes only.)
    """
    lo = (size - 1) // 2
    hi = size - 1 - lo
    c = x.shape[1]
    pads = [0, 0] * (x.ndim - 2) + [lo, hi]
    sq = F.pad(x * x, pads)
    total = sq[:, 0:c]
    for i in range(1, size):
        total = total + sq[:, i:i + c]
    return x / torch.pow(bias + (alpha / size) * total, beta)


def _layernorm(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, axes: tuple[int, ...], eps: float) -> torch.Tensor:
    """Layer normalization over `axes` with scale and bias already broadcast to x (fusegraph's form)."""
    mean = x.mean(dim=axes, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=axes, keepdim=True)
    return centered / torch.sqrt(var + eps) * scale + bias


_GLOBALS: dict[str, Any] = {
    "torch": torch,
    "F": F,
    "_lerp_axis": _lerp_axis,
    "_lrn_window": _lrn_window,
    "_layernorm": _layernorm,
}


# --------------------------------------------------------------------------------------------
# Code generation
# --------------------------------------------------------------------------------------------

_UNARY: dict[str, str] = {
    "neg": "torch.neg({0})", "abs": "torch.abs({0})", "exp": "torch.exp({0})", "log": "torch.log({0})",
    "sqrt": "torch.sqrt({0})", "recip": "torch.reciprocal({0})", "sigmoid": "torch.sigmoid({0})",
    "tanh": "torch.tanh({0})", "relu": "torch.relu({0})", "erf": "torch.erf({0})", "floor": "torch.floor({0})",
    "ceil": "torch.ceil({0})", "round": "torch.round({0})", "sin": "torch.sin({0})", "cos": "torch.cos({0})",
    "sign": "torch.sign({0})", "tan": "torch.tan({0})", "asin": "torch.asin({0})", "acos": "torch.acos({0})",
    "atan": "torch.atan({0})", "sinh": "torch.sinh({0})", "cosh": "torch.cosh({0})", "asinh": "torch.asinh({0})",
    "acosh": "torch.acosh({0})", "atanh": "torch.atanh({0})", "softplus": "F.softplus({0})",
    "softsign": "F.softsign({0})", "isnan": "torch.isnan({0})", "not": "torch.logical_not({0})",
    "hard_swish": "F.hardswish({0})",
}

_BINARY: dict[str, str] = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "pow": "torch.pow({0}, {1})",
    "max": "torch.maximum({0}, {1})", "min": "torch.minimum({0}, {1})", "equal": "torch.eq({0}, {1})",
    "less": "torch.lt({0}, {1})", "greater": "torch.gt({0}, {1})", "less_or_equal": "torch.le({0}, {1})",
    "greater_or_equal": "torch.ge({0}, {1})", "logical_and": "torch.logical_and({0}, {1})",
    "logical_or": "torch.logical_or({0}, {1})", "logical_xor": "torch.logical_xor({0}, {1})",
    "mod": "torch.remainder({0}, {1})", "fmod": "torch.fmod({0}, {1})",
}

# binary ops whose operands may be Python numbers in the generated code (the others need tensors)
_SCALAR_OK = {"add", "sub", "mul", "pow"}

_VIEWS = {"reshape", "flatten", "squeeze", "unsqueeze", "transpose", "multibroadcast", "slice"}
_OTHER = {"div", "where", "clip", "leaky_relu", "hard_sigmoid", "isinf", "elu", "celu", "thresholded_relu",
          "shrink", "convert", "batch_norm", "convolution", "dot", "pooling", "concat", "gather", "pad",
          "resize", "lrn", "softmax", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod",
          "arg_reduce", "layernorm"}

SUPPORTED_OPS: frozenset[str] = frozenset(_UNARY) | frozenset(_BINARY) | _VIEWS | _OTHER
"""fusegraph op names this translation covers (besides @param and @literal)."""


def _num(v: float | int | bool) -> str:
    """A Python number as source text (inf and nan have no literal)."""
    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    f = float(v)
    if math.isnan(f):
        return "float('nan')"
    if math.isinf(f):
        return "float('inf')" if f > 0 else "float('-inf')"
    return repr(f)


def _tup(values: Sequence[int]) -> str:
    """A tuple of ints as source text (a one-element tuple keeps its comma)."""
    vals = [int(v) for v in values]
    return "(" + ", ".join(map(str, vals)) + ("," if len(vals) == 1 else "") + ")"


def _torch_pads(begins: Sequence[int], ends: Sequence[int]) -> tuple[int, ...]:
    """F.pad's order for per-axis (begin, end) pads: last axis first."""
    out: list[int] = []
    for b, e in zip(reversed(list(begins)), reversed(list(ends))):
        out += [int(b), int(e)]
    return tuple(out)


def _identifier(name: str, taken: set[str]) -> str:
    """A Python identifier for an ONNX input name ('gpu_0/data_0' -> 'gpu_0_data_0').

    It must not clash with the names the generated code uses itself: `self`, `torch`, `F`,
    the helpers (all start with '_') and the locals `v<k>`.
    """
    base = re.sub(r"\W", "_", name) or "input"
    if not base[0].isalpha() or keyword.iskeyword(base) or base in ("self", "torch", "F") or re.fullmatch(r"v\d+", base):
        base = "in_" + base
    out, k = base, 1
    while out in taken:
        out, k = f"{base}_{k}", k + 1
    taken.add(out)
    return out


@dataclass
class _Step:
    """How one instruction is written: the values it reads and a function giving its expression.

    The expression is produced only for instructions that are live, so constants that an idiom
    consumed at build time (a bias folded into a conv) never become buffers.
    """

    deps: list[Instruction]
    emit: Callable[[], str]


class _CodeGen:
    """Writes the forward source of a Program and collects its buffers."""

    def __init__(self, program: Program, idioms: bool) -> None:
        self.module = program.main
        self.idioms = idioms
        self.index = {id(ins): k for k, ins in enumerate(self.module.instructions)}
        self.users = self.module.users()
        self.returned = {id(r) for r in self.module.returns}
        self.buffers: dict[str, torch.Tensor] = {}
        self._literal_names: dict[int, str] = {}
        self._derived = itertools.count()
        taken: set[str] = set()
        self.args: dict[int, str] = {}
        self.input_names: list[str] = []
        for ins in self.module.instructions:
            if ins.op.name == "@param":
                name = ins.op.attrs["name"]
                self.args[id(ins)] = _identifier(name, taken)
                self.input_names.append(name)

    # values ---------------------------------------------------------------------------------
    def value(self, ins: Instruction) -> str:
        """Source text of an instruction's value: an argument, a buffer or a local variable."""
        if ins.op.name == "@param":
            return self.args[id(ins)]
        if ins.op.name == "@literal":
            return self.literal_buffer(ins)
        return f"v{self.index[id(ins)]}"

    def literal_buffer(self, ins: Instruction) -> str:
        key = id(ins)
        if key not in self._literal_names:
            name = f"c{self.index[key]}"
            self.buffers[name] = _tensor_from_numpy(ins.op.value)
            self._literal_names[key] = name
        return f"self.{self._literal_names[key]}"

    def array_buffer(self, array: np.ndarray) -> str:
        """A constant derived at build time (a bias vector, gather indices, pooling counts)."""
        name = f"k{next(self._derived)}"
        self.buffers[name] = _tensor_from_numpy(array)
        return f"self.{name}"

    def literal_through_broadcast(self, ins: Instruction) -> Instruction | None:
        """The literal an instruction is, possibly behind multibroadcast views; else None."""
        while ins.op.name == "multibroadcast":
            ins = ins.inputs[0]
        return ins if ins.op.name == "@literal" else None

    def scalar(self, ins: Instruction, result: DType) -> str | None:
        """Source text of a constant of one repeated value (behind any broadcasts), else None."""
        if not self.idioms:
            return None
        lit = self.literal_through_broadcast(ins)
        if lit is None:
            return None
        v = lit.op.value
        if v.size == 0 or DType.from_numpy(v.dtype) != result or result == DType.bool:
            return None
        first = v.reshape(-1)[0]
        if not np.all(v == first):
            return None
        return _num(first.item())

    def channel_vector(self, ins: Instruction, channels: int) -> np.ndarray | None:
        """The [C] values of a constant that varies along axis 1 only (a bias or BN parameter)."""
        lit = self.literal_through_broadcast(ins)
        if lit is None or ins.shape.ndim < 2 or ins.shape.lens[1] != channels:
            return None
        v = lit.op.value
        lens = (1,) * (ins.shape.ndim - v.ndim) + tuple(v.shape)
        if len(lens) != ins.shape.ndim or any(n != 1 for i, n in enumerate(lens) if i != 1):
            return None
        flat = v.reshape(-1)
        if flat.size == channels:
            return flat
        if flat.size == 1:
            return np.full(channels, flat[0], dtype=v.dtype)
        return None

    def only_user(self, producer: Instruction, consumer: Instruction) -> bool:
        """Whether `consumer` is the single reader of `producer` (so the two may be written as one call)."""
        return self.users.get(producer, []) == [consumer] and id(producer) not in self.returned

    # planning -------------------------------------------------------------------------------
    def plan(self, ins: Instruction) -> _Step:
        name = ins.op.name
        if self.idioms:
            step = self._idiom(ins)
            if step is not None:
                return step
        if name in _UNARY:
            return self._simple(ins, _UNARY[name])
        if name in _BINARY:
            return self._binary(ins, _BINARY[name])
        method = getattr(self, "_op_" + name, None)
        if method is None:  # pragma: no cover - guarded by the SUPPORTED_OPS check
            raise TorchReferenceError(f"op {name!r} is not supported")
        return method(ins)

    def _simple(self, ins: Instruction, template: str) -> _Step:
        return _Step(list(ins.inputs), lambda: template.format(*(self.value(x) for x in ins.inputs)))

    def _binary(self, ins: Instruction, template: str) -> _Step:
        """A binary op; with idioms, one constant operand of a repeated value becomes a Python number."""
        a, b = ins.inputs
        if ins.op.name in _SCALAR_OK:
            sb = self.scalar(b, ins.shape.dtype)
            if sb is not None:
                return _Step([a], lambda: template.format(self.value(a), sb))
            sa = self.scalar(a, ins.shape.dtype)
            if sa is not None:
                return _Step([b], lambda: template.format(sa, self.value(b)))
        return self._simple(ins, template)

    def _idiom(self, ins: Instruction) -> _Step | None:
        name = ins.op.name
        if name == "add":
            for prod, other in (ins.inputs, ins.inputs[::-1]):
                if prod.op.name == "convolution" and self.only_user(prod, ins):
                    vec = self.channel_vector(other, prod.shape.lens[1])
                    if vec is not None:
                        return _Step(list(prod.inputs), lambda p=prod, v=vec: self._conv_expr(p, self.array_buffer(v)))
                if prod.op.name == "dot" and prod.shape.ndim == 2 and self.only_user(prod, ins):
                    lit = self.literal_through_broadcast(other)
                    if lit is not None and lit.op.value.ndim <= 2:
                        a, b = prod.inputs
                        return _Step([a, b], lambda a=a, b=b, lit=lit: f"torch.addmm({self.literal_buffer(lit)}, {self.value(a)}, {self.value(b)})")
        if name == "mul":
            for x, s in (ins.inputs, ins.inputs[::-1]):
                if s.op.name == "sigmoid" and s.inputs[0] is x and self.only_user(s, ins):
                    return _Step([x], lambda x=x: f"F.silu({self.value(x)})")
        if name == "batch_norm":
            x = ins.inputs[0]
            if x.shape.ndim >= 2:
                c = x.shape.lens[1]
                vecs = [self.channel_vector(p, c) for p in ins.inputs[1:]]
                if all(v is not None for v in vecs):
                    scale, bias, mean, var = vecs
                    eps = ins.op.attrs["epsilon"]
                    return _Step([x], lambda: (
                        f"F.batch_norm({self.value(x)}, {self.array_buffer(mean)}, {self.array_buffer(var)}, "
                        f"{self.array_buffer(scale)}, {self.array_buffer(bias)}, False, 0.0, {_num(eps)})"))
        return None

    # anchors --------------------------------------------------------------------------------
    def _conv_expr(self, ins: Instruction, bias: str) -> str:
        op = ins.op
        x, w = ins.inputs
        k = x.shape.ndim - 2
        begins, ends = op.padding[:k], op.padding[k:]
        xs = self.value(x)
        if tuple(begins) == tuple(ends):
            padding = _tup(begins)
        else:
            xs = f"F.pad({xs}, {_tup(_torch_pads(begins, ends))})"
            padding = "0"
        return (f"F.conv{k}d({xs}, {self.value(w)}, {bias}, {_tup(op.stride)}, {padding}, "
                f"{_tup(op.dilation)}, {op.group})")

    def _op_convolution(self, ins: Instruction) -> _Step:
        k = ins.inputs[0].shape.ndim - 2
        if k not in (1, 2, 3):
            raise TorchReferenceError(f"convolution with {k} spatial dims is not supported")
        return _Step(list(ins.inputs), lambda: self._conv_expr(ins, "None"))

    def _op_dot(self, ins: Instruction) -> _Step:
        return self._simple(ins, "torch.matmul({0}, {1})")

    def _op_pooling(self, ins: Instruction) -> _Step:
        op = ins.op
        (x,) = ins.inputs
        k = len(op.lengths)
        if k not in (1, 2, 3):
            raise TorchReferenceError(f"pooling over {k} spatial dims is not supported")
        in_sp = x.shape.lens[2:]
        out_sp = ins.shape.lens[2:]
        begins, ends = tuple(op.padding[:k]), tuple(op.padding[k:])
        lengths, stride, dilation = tuple(op.lengths), tuple(op.stride), tuple(op.dilation)
        # torch takes symmetric padding of at most half the window only
        native = begins == ends and all(p <= n // 2 for p, n in zip(begins, lengths))
        if op.mode == "max":
            if native:
                return _Step([x], lambda: f"F.max_pool{k}d({self.value(x)}, {_tup(lengths)}, {_tup(stride)}, "
                                          f"{_tup(begins)}, {_tup(dilation)}, ceil_mode={op.ceil_mode})")
            # explicit -inf padding, including what the last (ceil mode) window needs past the end
            extra = self._pool_extra(in_sp, out_sp, lengths, stride, dilation, begins, ends)
            pads = _tup(_torch_pads(begins, [e + x_ for e, x_ in zip(ends, extra)]))
            return _Step([x], lambda: f"F.max_pool{k}d(F.pad({self.value(x)}, {pads}, value=float('-inf')), "
                                      f"{_tup(lengths)}, {_tup(stride)}, 0, {_tup(dilation)})")
        if native and all(d == 1 for d in dilation):
            return _Step([x], lambda: f"F.avg_pool{k}d({self.value(x)}, {_tup(lengths)}, {_tup(stride)}, {_tup(begins)}, "
                                      f"ceil_mode={op.ceil_mode}, count_include_pad={op.count_include_pad})")
        # general average: window sums over an explicitly padded input, divided by the counts
        # of elements that ONNX counts for each output position (computed now, per axis)
        extra = self._pool_extra(in_sp, out_sp, lengths, stride, dilation, begins, ends)
        pads = _tup(_torch_pads(begins, [e + x_ for e, x_ in zip(ends, extra)]))
        count = np.ones((1, 1), dtype=np.float32)
        for i in range(k):
            pos = np.arange(out_sp[i])[:, None] * stride[i] - begins[i] + np.arange(lengths[i])[None, :] * dilation[i]
            lo, hi = (-begins[i], in_sp[i] + ends[i]) if op.count_include_pad else (0, in_sp[i])
            per_axis = ((pos >= lo) & (pos < hi)).sum(axis=1).astype(np.float32)
            count = np.multiply.outer(count, per_axis)
        count = count.reshape((1, 1, *out_sp))
        channels = x.shape.lens[1]
        ones = np.ones((channels, 1, *lengths), dtype=np.float32)

        def emit() -> str:
            padded = f"F.pad({self.value(x)}, {pads})"
            sums = (f"F.conv{k}d({padded}, {self.array_buffer(ones)}, None, {_tup(stride)}, 0, "
                    f"{_tup(dilation)}, {channels})")
            return f"({sums} / {self.array_buffer(count)})"

        return _Step([x], emit)

    @staticmethod
    def _pool_extra(in_sp: Sequence[int], out_sp: Sequence[int], lengths: Sequence[int], stride: Sequence[int],
                    dilation: Sequence[int], begins: Sequence[int], ends: Sequence[int]) -> list[int]:
        """End padding beyond the declared one that the last window needs (ceil mode)."""
        extra = []
        for n, o, l, s, d, b, e in zip(in_sp, out_sp, lengths, stride, dilation, begins, ends):
            need = (o - 1) * s + d * (l - 1) + 1
            extra.append(max(0, need - (n + b + e)))
        return extra

    # pointwise ops with attributes or special typing ----------------------------------------
    def _op_div(self, ins: Instruction) -> _Step:
        a, b = ins.inputs
        if ins.shape.dtype.is_float:
            sb = self.scalar(b, ins.shape.dtype)
            if sb is not None:
                return _Step([a], lambda: f"({self.value(a)} / {sb})")
            return self._simple(ins, "({0} / {1})")
        # ONNX integer division truncates toward zero
        return self._simple(ins, "torch.div({0}, {1}, rounding_mode='trunc')")

    def _op_where(self, ins: Instruction) -> _Step:
        return self._simple(ins, "torch.where({0}, {1}, {2})")

    def _op_clip(self, ins: Instruction) -> _Step:
        x, lo, hi = ins.inputs
        slo, shi = self.scalar(lo, ins.shape.dtype), self.scalar(hi, ins.shape.dtype)
        if slo is not None and shi is not None:
            return _Step([x], lambda: f"torch.clamp({self.value(x)}, {slo}, {shi})")
        return self._simple(ins, "torch.clamp({0}, {1}, {2})")

    def _op_leaky_relu(self, ins: Instruction) -> _Step:
        return self._simple(ins, f"F.leaky_relu({{0}}, {_num(ins.op.attrs['alpha'])})")

    def _op_hard_sigmoid(self, ins: Instruction) -> _Step:
        a, b = _num(ins.op.attrs["alpha"]), _num(ins.op.attrs["beta"])
        return self._simple(ins, f"torch.clamp({{0}} * {a} + {b}, 0.0, 1.0)")

    def _op_isinf(self, ins: Instruction) -> _Step:
        pos, neg = ins.op.attrs["detect_positive"], ins.op.attrs["detect_negative"]
        if pos and neg:
            return self._simple(ins, "torch.isinf({0})")
        if pos:
            return self._simple(ins, "torch.isposinf({0})")
        if neg:
            return self._simple(ins, "torch.isneginf({0})")
        return self._simple(ins, "torch.zeros_like({0}, dtype=torch.bool)")

    def _op_elu(self, ins: Instruction) -> _Step:
        alpha, gamma = ins.op.attrs["alpha"], ins.op.attrs["gamma"]
        core = f"F.elu({{0}}, {_num(alpha)})"
        return self._simple(ins, core if gamma == 1.0 else f"({_num(gamma)} * {core})")

    def _op_celu(self, ins: Instruction) -> _Step:
        return self._simple(ins, f"F.celu({{0}}, {_num(ins.op.attrs['alpha'])})")

    def _op_thresholded_relu(self, ins: Instruction) -> _Step:
        return self._simple(ins, f"F.threshold({{0}}, {_num(ins.op.attrs['alpha'])}, 0.0)")

    def _op_shrink(self, ins: Instruction) -> _Step:
        lam, bias = _num(ins.op.attrs["lambd"]), _num(ins.op.attrs["bias"])
        return self._simple(ins, f"torch.where({{0}} < -{lam}, {{0}} + {bias}, "
                                 f"torch.where({{0}} > {lam}, {{0}} - {bias}, torch.zeros_like({{0}})))")

    def _op_convert(self, ins: Instruction) -> _Step:
        target = torch_dtype(ins.op.attrs["target"])
        return self._simple(ins, f"{{0}}.to({target})")

    def _op_batch_norm(self, ins: Instruction) -> _Step:
        eps = _num(ins.op.attrs["epsilon"])
        return self._simple(ins, f"(({{0}} - {{3}}) * ({{1}} / torch.sqrt({{4}} + {eps})) + {{2}})")

    # views ----------------------------------------------------------------------------------
    def _reshape_to_out(self, ins: Instruction) -> _Step:
        return self._simple(ins, f"{{0}}.reshape({_tup(ins.shape.lens)})")

    _op_reshape = _reshape_to_out
    _op_flatten = _reshape_to_out
    _op_squeeze = _reshape_to_out
    _op_unsqueeze = _reshape_to_out

    def _op_transpose(self, ins: Instruction) -> _Step:
        return self._simple(ins, f"{{0}}.permute({_tup(ins.op.attrs['permutation'])})")

    def _op_multibroadcast(self, ins: Instruction) -> _Step:
        return self._simple(ins, f"{{0}}.expand({_tup(ins.op.attrs['out_lens'])})")

    def _op_slice(self, ins: Instruction) -> _Step:
        op = ins.op
        (x,) = ins.inputs
        rank = x.shape.ndim
        if all(st > 0 for st in op.steps):
            text = [":"] * rank
            for a, s, e, st in zip(op.axes, op.starts, op.ends, op.steps):
                e = max(e, s)  # normalized bounds: an empty slice may carry end < start
                text[a] = f"{s}:{e}" + (f":{st}" if st != 1 else "")
            while text and text[-1] == ":":
                text.pop()
            return self._simple(ins, "{0}[" + ", ".join(text) + "]" if text else "{0}")
        # negative steps: torch slicing has none, so gather the positions (fixed at build time)
        picks = [(a, np.arange(s, e, st, dtype=np.int64)) for a, s, e, st in
                 zip(op.axes, op.starts, op.ends, op.steps)]

        def emit() -> str:
            expr = self.value(x)
            for a, positions in picks:
                expr = f"{expr}.index_select({a}, {self.array_buffer(positions)})"
            return expr

        return _Step([x], emit)

    # data movement --------------------------------------------------------------------------
    def _op_concat(self, ins: Instruction) -> _Step:
        axis = ins.op.attrs["axis"]
        return _Step(list(ins.inputs), lambda: f"torch.cat([{', '.join(self.value(x) for x in ins.inputs)}], {axis})")

    def _op_gather(self, ins: Instruction) -> _Step:
        data, idx = ins.inputs
        axis = ins.op.attrs["axis"]
        n = data.shape.lens[axis]
        out = _tup(ins.shape.lens)
        lit = self.literal_through_broadcast(idx)
        if lit is not None:
            values = np.broadcast_to(lit.op.value, idx.shape.lens).astype(np.int64)
            flat = np.where(values < 0, values + n, values).reshape(-1)
            return _Step([data], lambda: f"{self.value(data)}.index_select({axis}, {self.array_buffer(flat)}).reshape({out})")

        def emit() -> str:
            i = self.value(idx)
            return (f"{self.value(data)}.index_select({axis}, torch.where({i} < 0, {i} + {n}, {i})"
                    f".reshape(-1).to(torch.int64)).reshape({out})")

        return _Step([data, idx], emit)

    def _op_pad(self, ins: Instruction) -> _Step:
        op = ins.op
        (x,) = ins.inputs
        r = x.shape.ndim
        begins, ends = list(op.pads[:r]), list(op.pads[r:])
        if op.mode == "constant":
            pads = _tup(_torch_pads(begins, ends))  # negative pads crop, as in ONNX
            return self._simple(ins, f"F.pad({{0}}, {pads}, value={_num(op.value)})")
        mode = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}[op.mode]
        # crop first (negative pads), then pad the trailing axes that need it
        crop = [f"{max(0, -b)}:{x.shape.lens[i] - max(0, -e)}" for i, (b, e) in enumerate(zip(begins, ends))]
        begins = [max(0, b) for b in begins]
        ends = [max(0, e) for e in ends]
        padded = [i for i in range(r) if begins[i] or ends[i]]
        first = min(padded) if padded else r
        if r - first > 3 or (padded and first == 0):
            raise TorchReferenceError(f"pad mode {op.mode!r} on axes {padded} of a rank-{r} tensor is not supported")
        pads = _tup(_torch_pads(begins[first:], ends[first:]))
        sliced = "{0}[" + ", ".join(crop) + "]"
        if not padded:
            return self._simple(ins, sliced)
        return self._simple(ins, f"F.pad({sliced}, {pads}, mode='{mode}')")

    def _op_resize(self, ins: Instruction) -> _Step:
        op = ins.op
        (x,) = ins.inputs
        lens = x.shape.lens
        if op.mode == "cubic":
            raise TorchReferenceError("resize mode 'cubic' is not supported")
        axes = [a for a in range(x.shape.ndim) if not (op.out_lens[a] == lens[a] and op.scales[a] == 1.0)]
        if op.mode == "nearest":
            picks = {a: _nearest_index(op, a, lens[a]) for a in axes}
            if _interpolate_matches(lens, op.out_lens, picks):
                size = _tup(op.out_lens[2:])
                return _Step([x], lambda: f"F.interpolate({self.value(x)}, size={size}, mode='nearest')")

            def emit_nearest() -> str:
                expr = self.value(x)
                for a in axes:
                    expr = f"{expr}.index_select({a}, {self.array_buffer(picks[a])})"
                return expr

            return _Step([x], emit_nearest)
        weights = {}
        for a in axes:
            n = lens[a]
            c = np.clip(op.source_coords(a, n), 0, n - 1)
            i0 = np.floor(c).astype(np.int64)
            weights[a] = (i0, np.minimum(i0 + 1, n - 1), (c - i0).astype(np.float32))

        def emit_linear() -> str:
            expr = self.value(x)
            for a in axes:
                i0, i1, t = weights[a]
                expr = (f"_lerp_axis({expr}, {a}, {self.array_buffer(i0)}, {self.array_buffer(i1)}, "
                        f"{self.array_buffer(t)})")
            return expr

        return _Step([x], emit_linear)

    # reductions -----------------------------------------------------------------------------
    def _op_lrn(self, ins: Instruction) -> _Step:
        op = ins.op
        size, alpha, beta, bias = op.attrs["size"], _num(op.attrs["alpha"]), _num(op.attrs["beta"]), _num(op.attrs["bias"])
        if size % 2 == 1 and ins.inputs[0].shape.ndim >= 3:
            return self._simple(ins, f"F.local_response_norm({{0}}, {size}, {alpha}, {beta}, {bias})")
        return self._simple(ins, f"_lrn_window({{0}}, {size}, {alpha}, {beta}, {bias})")

    def _op_softmax(self, ins: Instruction) -> _Step:
        fn = "torch.log_softmax" if ins.op.attrs["log"] else "torch.softmax"
        return self._simple(ins, f"{fn}({{0}}, {ins.op.attrs['axis']})")

    def _reduce(self, ins: Instruction, fn: str) -> _Step:
        axes = tuple(ins.op.attrs["axes"])
        if not axes:
            return self._simple(ins, "{0}")
        return self._simple(ins, f"{fn}({{0}}, dim={_tup(axes)}, keepdim=True)")

    def _op_reduce_sum(self, ins: Instruction) -> _Step:
        return self._reduce(ins, "torch.sum")

    def _op_reduce_mean(self, ins: Instruction) -> _Step:
        return self._reduce(ins, "torch.mean")

    def _op_reduce_max(self, ins: Instruction) -> _Step:
        return self._reduce(ins, "torch.amax")

    def _op_reduce_min(self, ins: Instruction) -> _Step:
        return self._reduce(ins, "torch.amin")

    def _op_reduce_prod(self, ins: Instruction) -> _Step:
        expr = "{0}"
        for a in ins.op.attrs["axes"]:  # torch.prod reduces one dim at a time
            expr = f"torch.prod({expr}, dim={a}, keepdim=True)"
        return self._simple(ins, expr)

    def _op_arg_reduce(self, ins: Instruction) -> _Step:
        op = ins.op
        fn = "torch.argmax" if op.attrs["largest"] else "torch.argmin"
        a = op.attrs["axis"]
        if op.attrs["select_last_index"]:
            n = ins.inputs[0].shape.lens[a]
            return self._simple(ins, f"({n - 1} - {fn}(torch.flip({{0}}, ({a},)), dim={a}, keepdim=True))")
        return self._simple(ins, f"{fn}({{0}}, dim={a}, keepdim=True)")

    def _op_layernorm(self, ins: Instruction) -> _Step:
        axis = ins.op.attrs["axis"]
        axes = _tup(range(axis, ins.shape.ndim))
        return self._simple(ins, f"_layernorm({{0}}, {{1}}, {{2}}, {axes}, {_num(ins.op.attrs['epsilon'])})")

    # the whole function ---------------------------------------------------------------------
    def build(self) -> tuple[str, list[str]]:
        """The forward source and the output names; raises TorchReferenceError listing every unsupported op."""
        unsupported: list[str] = []
        for ins in self.module.instructions:
            name = ins.op.name
            if name in ("@param", "@literal") or name in SUPPORTED_OPS:
                continue
            where = f" (node {ins.origin!r})" if ins.origin else ""
            hint = " (fused programs are not supported: pass the unfused program from fusegraph.parse_onnx)" \
                if name in ("fused", "load", "store", "allocate") else ""
            unsupported.append(f"{name}{where}{hint}")
        if unsupported:
            raise TorchReferenceError("torch_reference does not support op(s): " + "; ".join(sorted(set(unsupported))))
        steps: dict[int, _Step] = {}
        problems: list[str] = []
        for ins in self.module.instructions:
            if ins.op.name in ("@param", "@literal"):
                continue
            try:
                steps[id(ins)] = self.plan(ins)
            except TorchReferenceError as e:
                where = f" (node {ins.origin!r})" if ins.origin else ""
                problems.append(f"{ins.op.name}{where}: {e}")
        if problems:
            raise TorchReferenceError("torch_reference cannot translate: " + "; ".join(problems))
        live: set[int] = set()
        stack = list(self.module.returns)
        while stack:
            ins = stack.pop()
            if id(ins) in live:
                continue
            live.add(id(ins))
            if id(ins) in steps:
                stack.extend(steps[id(ins)].deps)
        body: list[str] = []
        for ins in self.module.instructions:
            step = steps.get(id(ins))
            if step is not None and id(ins) in live:
                body.append(f"    v{self.index[id(ins)]} = {step.emit()}")
        rets = ", ".join(self.value(r) for r in self.module.returns)
        args = ", ".join(["self"] + [self.args[id(i)] for i in self.module.instructions if i.op.name == "@param"])
        lines = [f"def forward({args}):"] + body + [f"    return ({rets}{',' if len(self.module.returns) == 1 else ''})"]
        return "\n".join(lines) + "\n", list(self.module.return_names)


def _nearest_index(op: Any, axis: int, n: int) -> np.ndarray:
    """For each output position along `axis`, the input position ONNX nearest resize reads."""
    c = op.source_coords(axis, n)
    mode = op.attrs["nearest_mode"]
    half = (c - np.floor(c)) == 0.5
    if mode == "round_prefer_floor":
        i = np.where(half, np.floor(c), np.round(c))
    elif mode == "round_prefer_ceil":
        i = np.where(half, np.ceil(c), np.round(c))
    elif mode == "floor":
        i = np.floor(c)
    elif mode == "ceil":
        i = np.ceil(c)
    else:
        raise TorchReferenceError(f"resize nearest_mode {mode!r} is not supported")
    return np.clip(i, 0, n - 1).astype(np.int64)


def _interpolate_matches(in_lens: Sequence[int], out_lens: Sequence[int], picks: Mapping[int, np.ndarray]) -> bool:
    """Whether F.interpolate(mode='nearest', size=...) reads exactly the positions in `picks`.

    It does for an integer upscale of the spatial axes with floor rounding, which is YOLOv5's
    Upsample. torch computes those positions in float arithmetic, so the claim is checked on a
    probe tensor here rather than trusted.
    """
    rank = len(in_lens)
    if rank not in (3, 4, 5) or any(a < 2 for a in picks):
        return False
    if any(out_lens[a] % in_lens[a] != 0 for a in range(2, rank)):
        return False
    for a in range(2, rank):
        want = picks.get(a, np.arange(out_lens[a]))
        if not np.array_equal(want, np.arange(out_lens[a]) // (out_lens[a] // in_lens[a])):
            return False
    spatial = list(in_lens[2:])
    probe = torch.arange(math.prod(spatial), dtype=torch.float64).reshape(1, 1, *spatial)
    got = F.interpolate(probe, size=tuple(out_lens[2:]), mode="nearest").reshape(-1).numpy()
    grid = np.arange(math.prod(spatial)).reshape(spatial)
    want_all = grid[np.ix_(*[picks.get(a, np.arange(out_lens[a])) for a in range(2, rank)])].reshape(-1)
    return bool(np.array_equal(got, want_all))


# --------------------------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------------------------

class TorchReference(torch.nn.Module):
    """A Program as a torch module; `build_module` makes one (with its generated `forward`).

    `forward` takes the program's inputs positionally, in `input_names` order, and returns a
    tuple of outputs in `output_names` order. `run` takes and returns dicts by name.
    """

    input_names: list[str]
    output_names: list[str]
    code: str

    def run(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run with inputs by ONNX name; outputs by ONNX name."""
        missing = [n for n in self.input_names if n not in inputs]
        unknown = [n for n in inputs if n not in self.input_names]
        if missing or unknown:
            raise KeyError(f"inputs: missing {missing}, unknown {unknown}; expected {self.input_names}")
        outs = self(*(inputs[n] for n in self.input_names))
        return dict(zip(self.output_names, outs))

    def to(self, *args: Any, **kwargs: Any) -> "TorchReference":
        """nn.Module.to, except that a memory format applies only to the buffers of its rank.

        nn.Module.to(memory_format=torch.channels_last) converts every 4-d *and* 5-d tensor,
        and a 5-d tensor has no channels_last layout (YOLOv5's grids are 5-d), so it fails.
        Here channels_last converts the 4-d buffers (conv weights), channels_last_3d the 5-d
        ones, contiguous_format all of them.
        """
        memory_format = kwargs.pop("memory_format", None)
        if args or kwargs:
            super().to(*args, **kwargs)
        if memory_format is not None:
            rank = {torch.channels_last: 4, torch.channels_last_3d: 5}.get(memory_format)
            for name, buf in self._buffers.items():
                if buf is not None and buf.is_floating_point() and (rank is None or buf.dim() == rank):
                    self._buffers[name] = buf.contiguous(memory_format=memory_format)
        return self

    def extra_repr(self) -> str:
        n = sum(1 for line in self.code.splitlines() if line.startswith("    v"))
        return f"inputs={self.input_names}, outputs={self.output_names}, statements={n}, buffers={len(list(self.buffers()))}"


_counter = itertools.count()


def build_module(program: Program, idioms: bool = True) -> TorchReference:
    """Translate an unfused Program into a TorchReference module (fp32 weights, on the CPU).

    Move it with `.to(device, dtype)`; floating-point buffers follow the dtype, index buffers
    stay int64. Raises TorchReferenceError naming every op it cannot translate.
    """
    gen = _CodeGen(program, idioms)
    source, output_names = gen.build()
    filename = f"<torch_reference_{next(_counter)}>"
    # registered so tracebacks, inspect and torch.compile can show the generated lines
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), dict(_GLOBALS), namespace)
    cls = type("TorchReferenceModel", (TorchReference,), {"forward": namespace["forward"], "__module__": __name__})
    module = cls()
    for name, tensor in gen.buffers.items():
        module.register_buffer(name, tensor)
    module.input_names = gen.input_names
    module.output_names = output_names
    module.code = source
    return module.eval()
