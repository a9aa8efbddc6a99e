"""The facts about the GPU that code generation and tuning depend on.

Tile and split-k choices depend on how many programs run at once (the SM count) and on the
shared memory a block may use. They are read from the device when one is present; a build
without a GPU (CI, ahead-of-time builds for sm_90) uses the facts of the target it builds
for, named once here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class DeviceFacts:
    name: str
    sm_count: int
    shared_bytes_per_block: int  # the opt-in maximum a kernel may ask for
    capability: int  # CUDA compute capability as major * 10 + minor


# the GPU the project targets when none is present: an NVIDIA H200 (sm_90)
H200 = DeviceFacts("NVIDIA H200", 132, 232448, 90)


@lru_cache(maxsize=1)
def current_device() -> DeviceFacts:
    """The facts of CUDA device 0, or of the H200 target when there is no GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return H200
        p = torch.cuda.get_device_properties(0)
    except Exception:  # no torch, or no driver: build for the default target
        return H200
    shared = getattr(p, "shared_memory_per_block_optin", 0) or H200.shared_bytes_per_block
    return DeviceFacts(p.name, p.multi_processor_count, shared, p.major * 10 + p.minor)
