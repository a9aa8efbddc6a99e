"""Compiling generated kernels for a GPU that is not there.

Triton can build PTX and a cubin for a named target without a device, so CI (which has no
GPU) compiles every kernel of a model for sm_90 and a kernel an sm_90 device would reject fails
there. The argument types come from the buffers the kernel reads and writes.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator

from fusegraph.ir.dtypes import DType
from fusegraph.targets.gpu.kernel_source import Config, KernelSource

POINTER_TYPES = {DType.float32: "*fp32", DType.float16: "*fp16", DType.bfloat16: "*bf16", DType.float64: "*fp64",
                 DType.int64: "*i64", DType.int32: "*i32", DType.int16: "*i16", DType.int8: "*i8",
                 DType.uint8: "*u8", DType.uint16: "*u16", DType.uint32: "*u32", DType.uint64: "*u64",
                 DType.bool: "*i1"}


# the split-k workspace and tile counters, the pixel sums' parts (float32 bits) and counters
SCRATCH_TYPES = {"ws": DType.float32, "cnt": DType.int32, "part": DType.float32, "pcnt": DType.int32}


def arg_dtypes(fused: Any, src: KernelSource) -> list[DType]:
    """Element type of each pointer argument of `src`, the kernel of fused instruction `fused`."""
    out = []
    for a in src.args:
        if a == "out":
            out.append(fused.shape.dtype)
        elif a.startswith("out"):  # a further output
            out.append(fused.op.module.returns[int(a[3:])].shape.dtype)
        elif a in SCRATCH_TYPES:
            out.append(SCRATCH_TYPES[a])
        else:
            out.append(fused.inputs[int(a[1:])].shape.dtype)
    return out


@dataclass
class Compiled:
    name: str
    ptx_lines: int
    cubin_bytes: int
    shared_bytes: int


@contextmanager
def _compiled_mode() -> Iterator[None]:
    """Define kernels as real (not interpreted) Triton functions for the duration."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def _without_interpreter() -> None:
    os.environ.pop("TRITON_INTERPRET", None)


def _compile_job(job: tuple[KernelSource, list[DType]]) -> Compiled:
    return compile_for(*job)


def compile_many(jobs: list[tuple[KernelSource, list[DType]]], workers: int = 2) -> list[Compiled]:
    """`compile_for` each (source, argument types) in fresh worker processes.

    Triton defines its standard library as interpreted or compiled when it is first imported,
    so the workers start without TRITON_INTERPRET (a test session without a GPU sets it) and
    import triton only then.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_without_interpreter) as pool:
        return list(pool.map(_compile_job, jobs))


def compile_for(src: KernelSource, arg_dtypes: list[DType], config: Config | None = None,
                capability: int = 90, warp_size: int = 32) -> Compiled:
    """Build `src` for CUDA compute capability `capability`; raises what Triton raises."""
    kernel = build_for(src, arg_dtypes, config, capability, warp_size)
    meta = kernel.metadata
    return Compiled(src.name, kernel.asm["ptx"].count("\n"), len(kernel.asm["cubin"]), getattr(meta, "shared", 0))


def build_for(src: KernelSource, arg_dtypes: list[DType], config: Config | None = None,
              capability: int = 90, warp_size: int = 32) -> Any:
    """Triton's compiled kernel of `src` under `config` (default: the first) for a CUDA
    target: its `asm` holds the PTX and the cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fusegraph.targets.gpu.kernel_loader import load_kernel

    gpu_src = replace(src, interpret=False)
    c = config or src.configs[0]
    with _compiled_mode():
        fn = load_kernel(gpu_src)
        signature = {a: POINTER_TYPES[d] for a, d in zip(src.args, arg_dtypes)}
        constexprs, options = src.launch_arguments(c)
        signature.update({k: "constexpr" for k in constexprs})
        # pointers 16-byte aligned, as the launcher specializes the arena's and torch's buffers:
        # without it Triton builds a less pipelined kernel (a third of the shared memory)
        aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(src.args))}
        ast = ASTSource(fn, signature, constexprs, aligned)
        return triton.compile(ast, target=GPUTarget("cuda", capability, warp_size),
                              options=options)
