"""Turns generated kernel source into a Triton function.

Triton reads a kernel's source through `inspect`, so generated code must live in a real file:
each kernel is written once under the cache directory, named by its source hash, and imported
from there. The same file is what `fusegraph compile --kernels` shows.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from fusegraph.targets.gpu.kernel_source import KernelSource


def cache_dir() -> Path:
    """`$FUSEGRAPH_CACHE_DIR`, else `~/.cache/fusegraph`."""
    root = os.environ.get("FUSEGRAPH_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "fusegraph")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_kernel(src: KernelSource) -> Any:
    """The `triton.jit` function of `src` (imported once per process and source)."""
    module_name = f"fusegraph_kernel_{src.digest}"
    if module_name in sys.modules:
        return getattr(sys.modules[module_name], src.name)
    folder = cache_dir() / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{src.name}_{src.digest}.py"
    if not path.exists() or path.read_text() != src.source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src.source)
        tmp.replace(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return getattr(module, src.name)
