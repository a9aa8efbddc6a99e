"""What the GPU itself refuses, said as a user can act on it.

Two things go wrong on a real GPU that no check of the model foresees: the program's buffers do
not fit in the memory left free (another process holds it, or the batch is too large), and
Triton cannot compile or launch a kernel for this GPU (a config past the shared memory, a
compiler defect of one Triton version). Both would otherwise end in an error from deep inside
torch or Triton that names neither the model's kernel nor a way out.
"""

from __future__ import annotations

from typing import Any

from fusegraph.errors import DeviceError
from fusegraph.targets.gpu.kernel_source import Config, KernelSource
from fusegraph.targets.gpu.memory_plan import BufferKind, MemoryPlan

MIB = 1 << 20


def buffer_bytes(plan: MemoryPlan) -> dict[str, int]:
    """Bytes the program holds on the device, by kind: the arena once, every other buffer whole."""
    need = {"arena": plan.arena_bytes, "weights": 0, "outputs": 0, "scratch": 0}
    kind_names = {BufferKind.LITERAL: "weights", BufferKind.OUTPUT: "outputs", BufferKind.SCRATCH: "scratch"}
    for b in plan.buffers:
        name = kind_names.get(b.kind)
        if name:
            need[name] += b.shape.elements * b.shape.dtype.itemsize
    return need


def out_of_memory(plan: MemoryPlan, device: Any) -> DeviceError:
    """The error for a program whose buffers do not fit in the device's free memory."""
    import torch

    need = buffer_bytes(plan)
    parts = ", ".join(f"{k} {v / MIB:.1f}" for k, v in need.items())
    try:
        free, total = torch.cuda.mem_get_info(device)
        have = f"has {free / MIB:.0f} MiB free of {total / MIB:.0f} MiB"
    except Exception:  # noqa: BLE001 - the figure is a courtesy; the advice stands without it
        have = "has too little free memory"
    return DeviceError(f"out of GPU memory: the compiled program needs {sum(need.values()) / MIB:.1f} MiB "
                       f"({parts} MiB) and the GPU {have}; free the GPU (other processes hold memory), or "
                       "compile with a smaller --batch or with --fp16")


def kernel_failed(src: KernelSource, origin: str, config: Config, exc: BaseException) -> DeviceError:
    """The error for a kernel Triton could not compile or launch under `config` on this GPU."""
    import triton

    first = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {first[0] if first else ''}"
    return DeviceError(f"Triton {triton.__version__} could not compile or launch kernel {src.name} "
                       f"({origin or src.template}) with config {config} on this GPU ({detail}); "
                       "`fusegraph compile --exhaustive-tune` tries every other config, and "
                       "`--target ref` runs the model without the GPU")


def every_config_failed(src: KernelSource, origin: str, failures: list[str]) -> DeviceError:
    """The error for a kernel none of whose tuned candidates compiled: the program cannot run."""
    import triton

    mine = [f for f in failures if f.startswith(f"{src.name} ")]
    detail = f" (first: {mine[0].splitlines()[0]})" if mine else ""
    return DeviceError(f"Triton {triton.__version__} could not compile kernel {src.name} ({origin or src.template}) "
                       f"for this GPU under any of its candidate configs{detail}; `fusegraph compile "
                       "--exhaustive-tune` tries every config, and `--target ref` runs the model without the GPU")
