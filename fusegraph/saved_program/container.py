"""The .fgx container: one safetensors file whose metadata holds a JSON document.

safetensors stores raw little-endian arrays behind a JSON header and never unpickles, so reading
a file runs none of its content. The metadata holds the format name and version, the document
and two SHA-256 checksums, one of the document and one of the tensor bytes: a changed byte
anywhere is caught, not only one that breaks the layout.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from fusegraph.errors import SavedProgramError

FORMAT = "fusegraph-fgx"
#: bumped whenever the document changes meaning; a file of another version is refused
VERSION = 3


def write(path: "str | os.PathLike[str]", doc: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """Write `doc` (plain JSON values) and `tensors` to `path`, all at once."""
    from safetensors.numpy import save

    text = json.dumps(doc, allow_nan=False, sort_keys=True)
    metadata = {"format": FORMAT, "version": str(VERSION), "document": text,
                "document_sha256": _sha(text.encode()), "tensors_sha256": _tensor_digest(tensors)}
    try:
        Path(path).write_bytes(save(tensors, metadata=metadata))
    except OSError as e:
        raise SavedProgramError(f"{os.fspath(path)}: cannot write the file: {e.strerror or e}") from None


def read(path: "str | os.PathLike[str]") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The document and tensors of the .fgx file at `path`, checked against their checksums."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    where = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise SavedProgramError(f"{where}: no such file") from None
    except OSError as e:
        raise SavedProgramError(f"{where}: cannot read the file: {e.strerror or e}") from None
    try:
        metadata = _metadata(data)
        tensors = load(data)
    except (SafetensorError, ValueError, UnicodeDecodeError) as e:
        raise SavedProgramError(f"{where}: not a .fgx file, or truncated ({e})") from None
    if metadata.get("format") != FORMAT:
        raise SavedProgramError(f"{where}: not a .fgx file (a safetensors file without fusegraph's metadata)")
    if metadata.get("version") != str(VERSION):
        raise SavedProgramError(f"{where}: format version {metadata.get('version')!r}, this fusegraph reads "
                                f"version {VERSION} only: save the program again with this fusegraph")
    text = metadata.get("document", "")
    if _sha(text.encode()) != metadata.get("document_sha256") or _tensor_digest(tensors) != metadata.get("tensors_sha256"):
        raise SavedProgramError(f"{where}: the checksum does not match: the file was changed or damaged after it was written")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise SavedProgramError(f"{where}: the document is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise SavedProgramError(f"{where}: the document is not a JSON object")
    return doc, tensors


def _metadata(data: bytes) -> dict[str, str]:
    """The header's `__metadata__`, read as safetensors lays it out (8-byte length, JSON)."""
    if len(data) < 8:
        raise ValueError(f"{len(data)} bytes, shorter than a safetensors header")
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        raise ValueError(f"the header claims {size} bytes, the file has {len(data) - 8} after its length")
    header = json.loads(data[8:8 + size].decode("utf-8"))
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def _tensor_digest(tensors: dict[str, np.ndarray]) -> str:
    """SHA-256 over each tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        h.update(f"{name}:{arr.dtype.str}:{list(arr.shape)};".encode())
        h.update(arr.reshape(-1).view(np.uint8))  # the bytes in place, not a copy of them
    return h.hexdigest()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
