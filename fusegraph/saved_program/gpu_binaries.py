"""What `save` and `load` do about kernel binaries: collect them from gpu programs compiled on
a GPU, and hand them back to Triton when a file is loaded on a GPU of the same kind.

Under Triton's interpreter there are no binaries, so nothing is stored or installed.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from fusegraph.saved_program.kernel_binaries import binaries_from_json, binaries_to_json
from fusegraph.targets.gpu import stored_binaries


def has_binaries(compiled: Any) -> bool:
    """Whether `compiled` runs real kernels (a gpu program on a GPU), whose binaries a file can carry."""
    return getattr(compiled, "kernels", None) is not None and not getattr(compiled, "interpreted", True)


def for_save(programs: list[Any]) -> tuple[dict[str, Any] | None, dict[str, np.ndarray]]:
    """The binaries document and tensors of `programs` (tuned gpu programs of one file)."""
    kernels = [k for p in programs if has_binaries(p) for k in p.kernels]
    if not kernels:
        return None, {}
    return binaries_to_json(stored_binaries.environment(), stored_binaries.collect(kernels))


def install_loaded(programs: list[Any], doc: Any, tensors: dict[str, np.ndarray], where: str) -> str:
    """Hand the stored binaries of `doc` to Triton for the kernels of `programs` (just loaded);
    a line saying what happened, for the load's timing report."""
    stored = binaries_from_json(doc, tensors, where)
    kernels = [k for p in programs if has_binaries(p) for k in p.kernels]
    if not stored or not kernels:
        return "no binaries"
    here = stored_binaries.environment()
    if here not in stored:
        stored_binaries.warn_unused(sorted(stored), here, where)
        return f"binaries for {', '.join(sorted(stored))}, not {here}"
    used, compiled = stored_binaries.install(kernels, stored[here], where)
    if compiled:
        warnings.warn(f"{where}: {compiled} stored kernel binaries do not match the cache key this Triton "
                      f"computes for their regenerated kernels; those kernels were compiled", stacklevel=3)
    return f"{used} binaries used, {compiled} kernels compiled"
