"""What `save` and `load` do about kernel binaries: collect them from gpu programs compiled on
a GPU, and hand them back to Triton when a file is loaded on a GPU of the same kind.

Under Triton's interpreter there are no binaries, so nothing is stored or installed. A load
that will install binaries starts Triton's per-process preparation early (launch_prep), and
after installing them makes every kernel ready to launch, so the first run only launches.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from fusegraph.saved_program.kernel_binaries import binaries_from_json, binaries_to_json
from fusegraph.saved_program.load_timing import Phases
from fusegraph.targets.gpu import launch_prep, stored_binaries


def has_binaries(compiled: Any) -> bool:
    """Whether `compiled` runs real kernels (a gpu program on a GPU), whose binaries a file can carry."""
    return getattr(compiled, "kernels", None) is not None and not getattr(compiled, "interpreted", True)


def for_save(programs: list[Any]) -> tuple[dict[str, Any] | None, dict[str, np.ndarray]]:
    """The binaries document and tensors of `programs` (tuned gpu programs of one file)."""
    kernels = [k for p in programs if has_binaries(p) for k in p.kernels]
    if not kernels:
        return None, {}
    return binaries_to_json(stored_binaries.environment(), stored_binaries.collect(kernels))


def start_early(doc: dict[str, Any], options: Any, tensors: dict[str, np.ndarray],
                where: str) -> launch_prep.EarlyStart | None:
    """Triton's per-process preparation and the launchers of the binaries for this GPU begun in
    the background, when the file holds binaries for a gpu program and this process runs real
    kernels (not under the interpreter)."""
    if not doc.get("binaries") or not isinstance(options, dict) or options.get("target") != "gpu" \
            or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    stored = binaries_from_json(doc["binaries"], tensors, where).get(stored_binaries.environment(), [])
    return launch_prep.start_early(sorted({b.signature for b in stored if b.signature is not None}))


def install_loaded(programs: list[Any], doc: Any, tensors: dict[str, np.ndarray], where: str,
                   phases: Phases, early: launch_prep.EarlyStart | None = None) -> str:
    """Hand the stored binaries of `doc` to Triton for the kernels of `programs` (just loaded)
    and make them ready to launch; a line saying what happened, for the load's timing report."""
    stored = binaries_from_json(doc, tensors, where)
    kernels = [k for p in programs if has_binaries(p) for k in p.kernels]
    if early is not None:
        phases.add("wait for Triton's driver utilities and launchers", early.wait())
        phases.notes.append(f"Triton's driver utilities and launchers prepared in the background in {early.seconds * 1e3:.0f} ms")
        if early.error is not None:  # Triton builds them itself at the first launch
            phases.notes.append(f"building them ahead failed: {type(early.error).__name__}: {early.error}")
    if not stored or not kernels:
        return "no binaries"
    here = stored_binaries.environment()
    if here not in stored:
        stored_binaries.warn_unused(sorted(stored), here, where)
        return f"binaries for {', '.join(sorted(stored))}, not {here}"
    done = stored_binaries.install(kernels, stored[here], where)
    phases.add_kernels("binaries: Triton's key and cache lookup", done.lookup)
    phases.add("binaries: copy into Triton's cache", done.copy_seconds)
    with phases.phase("binaries: launchers and device modules"):
        handles = launch_prep.load_handles(done.kernels)
    phases.add_kernels("binaries: launcher and module load", handles, total=False)
    if done.compiled:
        warnings.warn(f"{where}: {done.compiled} stored kernel binaries do not match the cache key this Triton "
                      f"computes for their regenerated kernels; those kernels were compiled", stacklevel=3)
    return f"{done.used} binaries used, {done.compiled} kernels compiled"
