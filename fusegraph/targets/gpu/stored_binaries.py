"""Compiled kernel binaries carried in a .fgx file, so a load on the same GPU compiles nothing.

Saving on a GPU keeps, for each kernel under its config, the files Triton's cache holds for it
(the metadata JSON and the cubin) with Triton's cache key. Loading regenerates every kernel from
the stored program; a binary is used only for the kernel whose regenerated source digest and
config it names, and only once Triton itself, asked for that kernel, computes the same cache key:
the files are placed in a private cache folder, the kernel is warmed up there (a cache hit loads
the binary instead of compiling it), and only a kernel whose key matched has its files copied
into Triton's own cache, where its first launch finds them. A binary for another GPU or Triton
version is not used (the kernels are compiled as usual, which one warning says).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from fusegraph.errors import SavedProgramError
from fusegraph.targets.gpu.kernel_source import Config

#: the file kinds kept of a Triton cache entry: what CompiledKernel needs to launch
KEPT_SUFFIXES = (".json", ".cubin")


@dataclass
class StoredBinary:
    digest: str  # KernelSource.digest of the kernel it was compiled from
    config: Config
    triton_hash: str  # Triton's cache key of the compiled kernel
    files: dict[str, bytes]  # the cache entry's files by name: "<kernel>.json", "<kernel>.cubin"
    #: Triton's type name of each kernel argument ("*fp16", "i32", "constexpr"): what a load
    #: builds the kernel's launcher from ahead of time (launch_prep); None when not known
    signature: tuple[str, ...] | None = None


def environment(capability: tuple[int, int] | None = None) -> str:
    """What a binary is valid for: the GPU's compute capability and the Triton version."""
    import triton

    if capability is None:
        import torch

        capability = torch.cuda.get_device_capability()
    return f"cuda-sm{capability[0]}{capability[1]}|triton-{triton.__version__}"


def from_compiled_kernel(kernel: Any, digest: str, config: Config) -> StoredBinary:
    """The stored form of Triton's CompiledKernel `kernel`, read from its cache entry."""
    group = getattr(kernel, "metadata_group", None)
    if not group:
        from triton.runtime.cache import get_cache_manager

        group = get_cache_manager(kernel.hash).get_group(f"{kernel.name}.json") or {}
    files = {name: open(path, "rb").read() for name, path in group.items() if name.endswith(KEPT_SUFFIXES)}
    if sorted(n.rsplit(".", 1)[1] for n in files) != ["cubin", "json"]:
        raise RuntimeError(f"Triton's cache entry of {kernel.name} lacks its metadata or cubin: {sorted(group)}")
    return StoredBinary(digest, dict(config), kernel.hash, files, launch_signature(kernel))


def launch_signature(kernel: Any) -> tuple[str, ...] | None:
    """The argument type names of Triton's CompiledKernel `kernel`, when Triton gives them as names."""
    signature = getattr(getattr(kernel, "src", None), "signature", None)
    if not isinstance(signature, dict) or not all(isinstance(v, str) for v in signature.values()):
        return None
    return tuple(signature.values())


def warm_up(kernel: Any) -> Any:
    """Triton's CompiledKernel of a program's `kernel` (a compiled_program.Kernel) under its
    config, from Triton's cache when there, compiled otherwise: what its first launch would use."""
    from fusegraph.targets.gpu.compiled_program import torch_dtype

    c = kernel.config
    constexprs, options = kernel.src.launch_arguments(c)
    dtypes = [torch_dtype(b.shape.dtype) for b in kernel.args]
    return kernel.fn.warmup(*dtypes, grid=(1,), **constexprs, **options)


def collect(kernels: list[Any], compile_one: Callable[[Any], Any] = warm_up) -> list[StoredBinary]:
    """The binary of each kernel (a compiled_program.Kernel) under its config; one per
    (digest, config) when kernels repeat."""
    out: dict[tuple[str, str], StoredBinary] = {}
    for k in kernels:
        key = (k.src.digest, json.dumps(k.config, sort_keys=True))
        if key not in out:
            out[key] = from_compiled_kernel(compile_one(k), k.src.digest, k.config)
    return list(out.values())


@dataclass
class Installed:
    """What `install` did: kernels whose binary Triton took (`used`), kernels compiled because
    none matched, Triton's CompiledKernel of each, and seconds by step."""

    used: int = 0
    compiled: int = 0
    kernels: list[Any] = field(default_factory=list)
    #: per kernel: Triton computing its key and reading the binary from the private cache
    lookup: list[tuple[str, float]] = field(default_factory=list)
    copy_seconds: float = 0.0  # the matched binaries written into Triton's own cache


def install(kernels: list[Any], binaries: list[StoredBinary], where: str,
            compile_one: Callable[[Any], Any] = warm_up) -> Installed:
    """Hand each kernel's stored binary to Triton (see the module's doc)."""
    by_key = {(b.digest, json.dumps(b.config, sort_keys=True)): b for b in binaries}
    names = {k.src.digest: k.src.name for k in kernels}
    for b in binaries:
        check(b, names, where)
    out, done = Installed(), set()
    with _private_cache() as private:
        for k in kernels:
            key = (k.src.digest, json.dumps(k.config, sort_keys=True))
            b = by_key.get(key)
            if key in done or b is None:
                continue
            done.add(key)
            start = time.perf_counter()
            _put(b, private)
            with _cache_dir(private):
                kernel = compile_one(k)
            out.lookup.append((k.src.name, time.perf_counter() - start))
            out.kernels.append(kernel)
            if kernel.hash == b.triton_hash:
                start = time.perf_counter()
                _put(b, None)
                out.copy_seconds += time.perf_counter() - start
                out.used += 1
            else:
                out.compiled += 1
    return out


def check(b: StoredBinary, names: dict[str, str], where: str) -> None:
    """A stored binary fit to hand to Triton: it names a regenerated kernel (by source digest)
    and its metadata agrees with its key and that kernel's name; else a SavedProgramError."""
    name = names.get(b.digest)
    if name is None:
        raise SavedProgramError(f"{where}: a stored binary names kernel source {b.digest}, which no kernel "
                                "regenerated from the stored program has: refused")
    meta_name = f"{name}.json"
    if set(b.files) != {meta_name, f"{name}.cubin"}:
        raise SavedProgramError(f"{where}: the stored binary of {name} holds {sorted(b.files)}, not {name}.json and .cubin")
    try:
        meta = json.loads(b.files[meta_name].decode())
    except (UnicodeDecodeError, ValueError):
        raise SavedProgramError(f"{where}: the stored metadata of {name} is not JSON") from None
    if not isinstance(meta, dict) or meta.get("hash") != b.triton_hash or meta.get("name") != name:
        raise SavedProgramError(f"{where}: the stored binary of {name} has metadata for another kernel or key: refused")


def _put(b: StoredBinary, folder: str | None) -> None:
    """Write `b`'s files as Triton's cache entry of its key, in `folder` (Triton's own cache when None)."""
    from triton.runtime.cache import get_cache_manager

    with _cache_dir(folder):
        cache = get_cache_manager(b.triton_hash)
        meta_name = next(n for n in b.files if n.endswith(".json"))
        if cache.get_group(meta_name) is not None:
            return
        paths = {n: cache.put(data, n, binary=True) for n, data in b.files.items()}
        cache.put_group(meta_name, paths)


@contextmanager
def _private_cache() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="fusegraph-binaries-") as folder:
        yield folder


@contextmanager
def _cache_dir(folder: str | None) -> Iterator[None]:
    """Triton's cache folder is `folder` for the duration (nothing changes for None)."""
    if folder is None:
        yield
        return
    saved = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = folder
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def warn_unused(stored: list[str], here: str, where: str) -> None:
    """Say once that a file's binaries are for other GPUs or Triton versions than this one."""
    warnings.warn(f"{where}: the stored kernel binaries are for {', '.join(stored)}, not {here}: compiling the "
                  "kernels (save the program again here to store binaries for this GPU)", stacklevel=3)
