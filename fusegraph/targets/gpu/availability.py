"""Whether the gpu target can run in this process, checked before any work is done.

Compiling for the gpu target takes seconds to minutes, and without torch or triton it would
end in a ModuleNotFoundError from a generated kernel file; without a GPU the kernels need
Triton's interpreter, which only takes effect if it is switched on before triton is imported.
These checks import neither triton nor (unless the question is about the GPU itself) torch,
so they cost nothing and leave the interpreter choice open.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from fusegraph.errors import TargetUnavailableError

INSTALL = "pip install 'fusegraph[gpu]'"


def _missing_packages() -> list[str]:
    return [name for name in ("torch", "triton") if _not_installed(name)]


def _not_installed(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is None  # None: the import is blocked
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def require_gpu_target() -> None:
    """Raise TargetUnavailableError unless `compile(target="gpu")` can run here: on a GPU, or
    under Triton's interpreter without one (switched on here unless triton is imported already)."""
    missing = _missing_packages()
    if missing:
        raise TargetUnavailableError(f"the gpu target needs {' and '.join(missing)}, which "
                                     f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL}")
    if _has_gpu() or os.environ.get("TRITON_INTERPRET") == "1" or "triton" not in sys.modules:
        return
    raise TargetUnavailableError("no GPU here, and triton was imported before Triton's interpreter was switched "
                                 "on: set TRITON_INTERPRET=1 in the environment to run the kernels on the CPU")


def require_gpu_device(what: str) -> None:
    """Raise TargetUnavailableError unless kernels can run on a real GPU (`what` needs one:
    timings under the interpreter would mean nothing)."""
    missing = _missing_packages()
    if missing:
        raise TargetUnavailableError(f"{what} needs {' and '.join(missing)}, which "
                                     f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL}")
    if not _has_gpu():
        raise TargetUnavailableError(f"{what} needs an NVIDIA GPU and torch sees none here; without one, "
                                     "`fusegraph verify MODEL --target gpu` checks the kernels under Triton's "
                                     "interpreter")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise TargetUnavailableError(f"{what} times the kernels on the GPU, but TRITON_INTERPRET=1 would run them "
                                     "under Triton's interpreter: unset TRITON_INTERPRET")
