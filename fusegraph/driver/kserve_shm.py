"""Triton's system shared memory extension: tensors of a same-host client through a POSIX
shared memory region instead of the HTTP body.

A large request (YOLOv5s at batch 32: 157 MB in, 137 MB out) otherwise crosses the loopback
socket twice and is parsed out of the HTTP body; through shared memory the client writes its
inputs into a region Triton has mapped, the request carries only their places
(`shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size`), and Triton writes
the outputs into the same region. Each client owns one region (created with
`multiprocessing.shared_memory`, registered under its own name, grown when a request needs
more) and reuses it for every request, so one client per thread, as with `HttpClient`.
"""

from __future__ import annotations

import json
import math
import mmap
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Mapping, Sequence

import numpy as np

from fusegraph.driver.kserve_client import DATATYPES, DTYPES, HttpClient, check_status
from fusegraph.errors import InputError

#: every tensor starts on a multiple of this many bytes (a cache line), so NumPy views and
#: the server's copies into and out of the region stay aligned
ALIGN = 64
_JSON = {"Content-Type": "application/json"}


class SharedMemoryClient:
    """KServe v2 HTTP with inputs and outputs in this client's shared memory region.

    `infer` returns copies: the region is overwritten by the next request. Server refusals
    raise `InferenceError` with the HTTP status, as `HttpClient.infer` does. `close` (or leaving
    a `with` block) unregisters the region and unlinks it, so nothing is left in /dev/shm.
    """

    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        self.http = HttpClient(host, port, timeout)
        self.region: SharedMemory | None = None
        self._metadata: dict[str, dict[str, Any]] = {}

    @property
    def region_name(self) -> str | None:
        """The name the server knows the region by (its shm name, unique on the host)."""
        return None if self.region is None else self.region.name

    def _post(self, path: str, doc: Any = None) -> dict[str, Any]:
        body = None if doc is None else json.dumps(doc).encode()
        status, _, data = self.http.request("POST", path, body, _JSON if body else None)
        check_status(status, data)
        return json.loads(data) if data else {}

    def reserve(self, byte_size: int) -> None:
        """Make the region at least `byte_size` bytes: a larger one replaces it (at least twice
        the old size, so mixed batch sizes settle after a few requests) and is registered in
        its place; Triton cannot resize a registered region."""
        if self.region is not None and self.region.size >= byte_size:
            return
        old = 0 if self.region is None else self.region.size
        size = math.ceil(max(byte_size, 2 * old, 1) / mmap.PAGESIZE) * mmap.PAGESIZE
        self._release()
        region = SharedMemory(create=True, size=size)
        try:  # the key is the shm_open name, with its leading slash
            self._post(f"/v2/systemsharedmemory/region/{region.name}/register",
                       {"key": f"/{region.name}", "offset": 0, "byte_size": size})
        except BaseException:
            region.close()
            region.unlink()
            raise
        self.region = region

    def _release(self) -> None:
        """Unregister and unlink the region; it is unlinked even when the server refuses."""
        region, self.region = self.region, None
        if region is None:
            return
        try:
            self._post(f"/v2/systemsharedmemory/region/{region.name}/unregister")
        finally:
            region.close()
            region.unlink()

    def metadata(self, model: str) -> dict[str, Any]:
        """The model's metadata (inputs and outputs with datatypes and shapes, -1 for the batch),
        read once: it sizes each output's place in the region."""
        if model not in self._metadata:
            status, _, data = self.http.request("GET", f"/v2/models/{model}")
            check_status(status, data)
            self._metadata[model] = json.loads(data)
        return self._metadata[model]

    def output_sizes(self, model: str, inputs: Mapping[str, np.ndarray],
                     output_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, int]:
        """Bytes of each output: its metadata shape with the leading -1 the inputs' batch, or
        the shape the caller gives (for outputs whose other dimensions vary)."""
        meta = self.metadata(model)
        batched = [i["name"] for i in meta["inputs"] if i["shape"][:1] == [-1] and i["name"] in inputs]
        batch = inputs[batched[0]].shape[0] if batched else None
        sizes = {}
        for o in meta["outputs"]:
            shape = list((output_shapes or {}).get(o["name"], o["shape"]))
            if shape[:1] == [-1] and batch is not None:
                shape[0] = batch
            if any(d < 0 for d in shape):
                raise InputError(f"output {o['name']!r} of {model!r} has shape {o['shape']}: pass its shape "
                                 f"in output_shapes to size its place in shared memory")
            sizes[o["name"]] = math.prod(shape) * np.dtype(DTYPES[o["datatype"]]).itemsize
        return sizes

    def infer(self, model: str, inputs: Mapping[str, np.ndarray],
              output_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
        """Outputs by name, copied out of the region; inputs are written into it first."""
        arrays = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
        sizes = self.output_sizes(model, arrays, output_shapes)
        offsets = _offsets([v.nbytes for v in arrays.values()] + list(sizes.values()))
        self.reserve(offsets[-1])
        assert self.region is not None
        for (k, v), offset in zip(arrays.items(), offsets):
            np.ndarray(v.shape, v.dtype, self.region.buf, offset)[...] = v
        name = self.region.name
        request = {
            "inputs": [{"name": k, "shape": list(v.shape), "datatype": DATATYPES[v.dtype],
                        "parameters": _place(name, offset, v.nbytes)}
                       for (k, v), offset in zip(arrays.items(), offsets)],
            "outputs": [{"name": k, "parameters": _place(name, offset, size)}
                        for (k, size), offset in zip(sizes.items(), offsets[len(arrays):])]}
        answer = self._post(f"/v2/models/{model}/infer", request)
        where = dict(zip(sizes, offsets[len(arrays):]))
        return {o["name"]: np.ndarray(o["shape"], DTYPES[o["datatype"]], self.region.buf, where[o["name"]]).copy()
                for o in answer["outputs"]}

    def close(self) -> None:
        """Unregister and unlink the region and close the connection. A server that is gone
        (connection refused) has no registration left to undo, so that is not an error here."""
        try:
            self._release()
        except OSError:
            pass
        finally:
            self.http.close()

    def __enter__(self) -> "SharedMemoryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _place(region: str, offset: int, byte_size: int) -> dict[str, Any]:
    return {"shared_memory_region": region, "shared_memory_offset": offset, "shared_memory_byte_size": byte_size}


def _offsets(sizes: Sequence[int]) -> list[int]:
    """Where each tensor starts in the region, ALIGN-aligned, then where the last one ends."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += math.ceil(size / ALIGN) * ALIGN
    return offsets + [end]
