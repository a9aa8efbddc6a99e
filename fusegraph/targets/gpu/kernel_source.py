"""What a template produces: the source of one kernel and how to launch it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

LIBDEVICE = {
    False: "from triton.language.extra import libdevice",
    True: "from fusegraph.targets.gpu import interpreter_libdevice as libdevice",  # the interpreter has none
}
HEADER = """import triton
import triton.language as tl
{libdevice}


@triton.jit
def _prod_combine(a, b):
    return a * b
"""

Config = dict[str, int]
# candidates per kernel the default tune times (templates order them best first; the rest are
# for --exhaustive-tune) unless a source says otherwise
DEFAULT_TUNE_CONFIGS = 6


@dataclass
class KernelSource:
    """One generated kernel.

    `configs` are the tuning candidates (block sizes as constexpr arguments, plus `num_warps`
    and `num_stages`); the first is the default. `grid(config)` gives the launch grid (plain data, so a source can go to a worker process).
    `args` name the kernel's pointer arguments in order: `x0..` the fused instruction's
    inputs, `out` its fresh output buffer when it has one.
    """

    name: str
    kernel_name: str  # the fused group's name, e.g. conv_add_sigmoid_mul
    template: str
    body: str
    args: list[str]
    configs: list[Config]
    # per grid axis: extent, the config key dividing it (a block size), the key multiplying it
    grid_dims: list[tuple[int, str | None, str | None]]
    flops: int = 0
    interpret: bool = False
    default_tune: int = 0  # candidates the default tune times; 0: DEFAULT_TUNE_CONFIGS
    pixel_sums: Any = None  # a GEMM's sums over its pixels (templates/gemm_reduce.PixelSums), for their scratch

    @property
    def source(self) -> str:
        return HEADER.format(libdevice=LIBDEVICE[self.interpret]) + "\n\n" + self.body

    def grid(self, config: Config) -> tuple[int, ...]:
        return tuple((cdiv(n, config[b]) if b else n) * (config[m] if m else 1) for n, b, m in self.grid_dims)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def signature(name: str, args: list[str], constexprs: list[str]) -> str:
    params = args + [f"{c}: tl.constexpr" for c in constexprs]
    return f"@triton.jit\ndef {name}({', '.join(params)}):"
