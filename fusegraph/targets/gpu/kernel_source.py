"""What a template produces: the source of one kernel and how to launch it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
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
LAUNCH_OPTIONS = ("num_warps", "num_stages")  # the config keys that are Triton launch options, not constexprs
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
    # a reduction across programs in the epilogue (templates/gemm_reduce.py: PixelSums, sums over
    # pixels; RowParts, rows' statistics over column tiles): `.workspace(src, config)` sizes its scratch
    parts: Any = None
    dependent_launch: bool = False  # launched with programmatic dependent launch (`with_dependent_launch`)
    # body lines a kernel may run before its predecessor has finished, under dependent launch:
    # L2 prefetches of the weights it reads (`templates/gemm_prefetch.py`)
    before_wait: list[str] = field(default_factory=list)
    # makes tensor descriptors in the kernel (`templates/gemm_tma.py`): Triton allocates their
    # global scratch at each launch
    tensor_descriptors: bool = False

    @property
    def source(self) -> str:
        return HEADER.format(libdevice=LIBDEVICE[self.interpret]) + "\n\n" + self.body

    def launch_arguments(self, config: Config) -> tuple[dict[str, int], dict[str, Any]]:
        """A config as the kernel's constexpr arguments and Triton's launch options, the split
        every launch, warm-up and ahead-of-time build makes."""
        constexprs = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
        options: dict[str, Any] = {k: config[k] for k in LAUNCH_OPTIONS}
        if self.dependent_launch:
            options["launch_pdl"] = True
        return constexprs, options

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


# The environment switch of programmatic dependent launch: 1 every kernel, 0 none (codegen.launches_early).
DEPENDENT_LAUNCH_ENV = "FUSEGRAPH_DEPENDENT_LAUNCH"
DEPENDENT_LAUNCH_CAPABILITY = 90  # the compute capability that has it (Hopper)
# What a kernel does first under it: wait until the kernel before it in the stream has finished
# and its writes are visible, then let the next kernel be launched.
DEPENDENT_LAUNCH_LINES = ["    tl.extra.cuda.gdc_wait()", "    tl.extra.cuda.gdc_launch_dependents()"]


def with_dependent_launch(src: KernelSource) -> KernelSource:
    """`src` launched with programmatic dependent launch: the GPU starts it while the kernel
    before it still runs, instead of after that kernel has drained, and hides most of the gap
    between two dependent kernels, which at batch 1 is a large part of a kernel's time.

    Every kernel of a program waits (`gdc_wait`) before its first load or store, so no kernel
    reads a value before its producer has written it, nor overwrites a buffer an earlier kernel
    still reads: when a kernel passes its wait, the one before it has finished, and that one
    had passed its own wait, so all earlier kernels have. It lets its successor launch at once
    (`gdc_launch_dependents`): the successor's programs are placed only once every program of
    this kernel has started, so they never take the place of one still to run.

    Before its wait a kernel may touch only memory no kernel writes: its `before_wait` lines
    pull its weights into L2 while its predecessor still runs, so at batch 1, where a
    product's time is the latency of its weight reads, the k loop finds them on chip."""
    lines = src.body.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(f"def {src.name}("))
    lines[at + 1:at + 1] = src.before_wait + DEPENDENT_LAUNCH_LINES
    return replace(src, body="\n".join(lines), dependent_launch=True)
