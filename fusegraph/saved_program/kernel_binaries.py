"""Stored kernel binaries in a .fgx document and its tensors, and back.

The document holds, per environment (GPU architecture and Triton version), one entry per
kernel binary: the kernel's source digest and config, Triton's cache key, each file's tensor
name and SHA-256, and the kernel's argument type names (its launch signature: only Triton's
own type names are accepted, from which a load has Triton build launchers early). The file bytes are uint8 tensors named by their content, so a binary
shared by the sizes of a dynamic batch is stored once. Reading checks each file's SHA-256
against the document (the container's checksums cover both), and never runs anything: the
binaries are only handed to Triton later, by stored_binaries.install, after their checks.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from fusegraph.errors import SavedProgramError
from fusegraph.targets.gpu.stored_binaries import StoredBinary

#: a type name in a stored launch signature: constexpr, or a scalar type, a pointer to one
TYPE_NAME = re.compile(r"constexpr|\*?(i1|i8|i16|i32|i64|u1|u8|u16|u32|u64|fp8e4nv|fp8e5|fp8e4b15|fp16|bf16|fp32|fp64)")
MAX_ARGUMENTS = 256


def binaries_to_json(environment: str, binaries: list[StoredBinary]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    entries, tensors = [], {}
    for b in binaries:
        files = {}
        for name, data in sorted(b.files.items()):
            sha = hashlib.sha256(data).hexdigest()
            files[name] = {"tensor": f"b{sha[:32]}", "sha256": sha}
            tensors[f"b{sha[:32]}"] = np.frombuffer(data, dtype=np.uint8).copy()
        entry = {"digest": b.digest, "config": dict(b.config), "triton_hash": b.triton_hash, "files": files}
        if b.signature is not None:
            entry["signature"] = list(b.signature)
        entries.append(entry)
    return {environment: entries}, tensors


def binaries_from_json(doc: Any, tensors: dict[str, np.ndarray], where: str) -> dict[str, list[StoredBinary]]:
    """The stored binaries by environment; a malformed entry or a file whose bytes do not have
    the SHA-256 the document gives is a SavedProgramError."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise SavedProgramError(f"{where}: the stored kernel binaries are malformed")
    return {env: [_binary(e, tensors, f"{where}: stored binary {k} for {env}") for k, e in enumerate(entries)]
            for env, entries in _entries(doc, where)}


def _entries(doc: dict[str, Any], where: str) -> list[tuple[str, list[Any]]]:
    if not all(isinstance(env, str) and isinstance(entries, list) for env, entries in doc.items()):
        raise SavedProgramError(f"{where}: the stored kernel binaries are malformed")
    return list(doc.items())


def _binary(entry: Any, tensors: dict[str, np.ndarray], where: str) -> StoredBinary:
    try:
        digest, config, key, files = entry["digest"], entry["config"], entry["triton_hash"], entry["files"]
        if not (isinstance(digest, str) and isinstance(key, str) and isinstance(files, dict) and isinstance(config, dict)
                and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in config.items())):
            raise TypeError("field types")
        data = {name: _file(f, tensors, f"{where}, file {name}") for name, f in files.items()}
        signature = _signature(entry.get("signature"))
    except (KeyError, TypeError) as e:
        raise SavedProgramError(f"{where} is malformed ({e})") from None
    return StoredBinary(digest, config, key, data, signature)


def _signature(v: Any) -> tuple[str, ...] | None:
    """A binary's argument type names: each a Triton scalar or pointer type, or constexpr."""
    if v is None:
        return None
    if not isinstance(v, list) or len(v) > MAX_ARGUMENTS or not all(isinstance(t, str) and TYPE_NAME.fullmatch(t) for t in v):
        raise TypeError(f"the launch signature {v!r} is not a list of Triton type names")
    return tuple(v)


def _file(f: dict[str, Any], tensors: dict[str, np.ndarray], where: str) -> bytes:
    tensor = tensors.get(f["tensor"])
    if tensor is None or tensor.dtype != np.uint8 or tensor.ndim != 1:
        raise SavedProgramError(f"{where}: no such byte tensor {f['tensor']!r}")
    data = tensor.tobytes()
    if hashlib.sha256(data).hexdigest() != f["sha256"]:
        raise SavedProgramError(f"{where}: its bytes do not have the SHA-256 the document gives: the binary was "
                                "changed after it was written; refused")
    return data
