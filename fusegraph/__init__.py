"""fusegraph: an ONNX inference compiler that fuses anchors, pointwise ops and layout changes.

The public API is `fusegraph.api`, re-exported here: parse_onnx, fuse, compile, run; and save and
load (fusegraph.saved_program) for .fgx files; compile_dynamic_batch (fusegraph.dynamic_batch) for
one program that answers a range of batch sizes.

The names are looked up at first use (PEP 562), not imported with the package: a process that
needs one module (a kernel-build worker unpickling a kernel source, `fusegraph --version`) then
does not pay for ONNX, ml_dtypes and every pass, 1.3 s of a build worker's start. Subpackages
are reachable as attributes too (`fusegraph.zoo` after `import fusegraph`).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"compile": "fusegraph.api", "fuse": "fusegraph.api", "parse_onnx": "fusegraph.api", "run": "fusegraph.api",
            "DynamicBatchProgram": "fusegraph.dynamic_batch", "compile_dynamic_batch": "fusegraph.dynamic_batch",
            "ArgumentError": "fusegraph.errors", "FusegraphError": "fusegraph.errors",
            "Program": "fusegraph.ir.program", "load": "fusegraph.saved_program", "save": "fusegraph.saved_program"}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
