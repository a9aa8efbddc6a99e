"""A small KServe v2 (Open Inference Protocol) client: HTTP with JSON or binary tensors, gRPC.

tritonclient cannot share an environment with fusegraph (it pins ml-dtypes <= 0.5.4 and
protobuf < 7), so the tests and bench/serve.py speak the protocol themselves: HTTP through
http.client, gRPC through grpcio with the few protobuf messages they need encoded here.
"""

from __future__ import annotations

import http.client
import json
from typing import Any, Mapping

import numpy as np

#: KServe v2 datatypes by NumPy dtype, and back
DATATYPES = {np.dtype(k): v for k, v in {
    "float32": "FP32", "float16": "FP16", "float64": "FP64", "int64": "INT64", "int32": "INT32",
    "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}.items()}
DTYPES = {v: k for k, v in DATATYPES.items()}


class InferenceError(Exception):
    """The server refused a request: `status` is the HTTP status or the gRPC status code's name."""

    def __init__(self, status: Any, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def check_status(status: int, data: bytes) -> None:
    """Raise InferenceError for a non-200 answer with the server's own message: Triton sends
    `{"error": ...}`, sometimes as text/plain (a 500 from its response allocator)."""
    if status == 200:
        return
    try:
        message = json.loads(data or b"{}").get("error")
    except (ValueError, AttributeError):
        message = None
    raise InferenceError(status, message or data.decode(errors="replace"))


class HttpClient:
    """One keep-alive HTTP connection (not thread-safe: one client per thread)."""

    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        self.conn.request(method, path, body=body, headers=dict(headers or {}))
        r = self.conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], binary: bool = True) -> dict[str, np.ndarray]:
        """Outputs by name; a refused request raises InferenceError with the HTTP status."""
        body, headers = (_binary_body(inputs) if binary else (_json_body(inputs), {"Content-Type": "application/json"}))
        status, got, data = self.request("POST", f"/v2/models/{model}/infer", body, headers)
        check_status(status, data)
        header_len = int(got.get("inference-header-content-length", len(data)))
        doc, offset, out = json.loads(data[:header_len]), header_len, {}
        for o in doc["outputs"]:
            dtype, shape = DTYPES[o["datatype"]], o["shape"]
            size = (o.get("parameters") or {}).get("binary_data_size")
            if size is None:
                out[o["name"]] = np.asarray(o["data"], dtype).reshape(shape)
            else:
                out[o["name"]] = np.frombuffer(data[offset:offset + size], dtype).reshape(shape)
                offset += size
        return out

    def close(self) -> None:
        self.conn.close()


def _json_body(inputs: Mapping[str, np.ndarray]) -> bytes:
    tensors = [{"name": k, "shape": list(v.shape), "datatype": DATATYPES[v.dtype], "data": v.ravel().tolist()}
               for k, v in inputs.items()]
    return json.dumps({"inputs": tensors}).encode()


def _binary_body(inputs: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The binary tensor extension: a JSON header, then each tensor's raw bytes."""
    arrays = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
    header = json.dumps({
        "inputs": [{"name": k, "shape": list(v.shape), "datatype": DATATYPES[v.dtype],
                    "parameters": {"binary_data_size": v.nbytes}} for k, v in arrays.items()],
        "parameters": {"binary_data_output": True}}).encode()
    body = header + b"".join(v.tobytes() for v in arrays.values())
    return body, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}


# gRPC -------------------------------------------------------------------------------------
_SERVICE = "/inference.GRPCInferenceService/"


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _fields(data: bytes) -> list[tuple[int, Any]]:
    """(field number, int or bytes) of each field of a protobuf message, in order."""
    out, i = [], 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 2:
            size, i = _read_varint(data, i)
            value, i = data[i:i + size], i + size
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        out.append((number, value))
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[i]
        n, shift, i = n | (b & 0x7F) << shift, shift + 7, i + 1
        if not b & 0x80:
            return n, i


def _infer_request(model: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    """ModelInferRequest: model_name (1), inputs (5: name 1, datatype 2, packed shape 3) and
    raw_input_contents (7)."""
    msg = _field(1, model.encode())
    arrays = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
    for k, v in arrays.items():
        shape = b"".join(_varint(d) for d in v.shape)
        msg += _field(5, _field(1, k.encode()) + _field(2, DATATYPES[v.dtype].encode()) + _field(3, shape))
    return msg + b"".join(_field(7, v.tobytes()) for v in arrays.values())


def _infer_response(data: bytes) -> dict[str, np.ndarray]:
    metas, raws = [], []
    for number, value in _fields(data):
        if number == 5:
            metas.append(value)
        elif number == 6:
            raws.append(value)
    out = {}
    for meta, raw in zip(metas, raws):
        name, datatype, shape = "", "", []
        for number, value in _fields(meta):
            if number == 1:
                name = value.decode()
            elif number == 2:
                datatype = value.decode()
            elif number == 3:
                shape += [_read_varint(value, i)[0] for i in _starts(value)] if isinstance(value, bytes) else [value]
        out[name] = np.frombuffer(raw, DTYPES[datatype]).reshape(shape)
    return out


def _starts(packed: bytes) -> list[int]:
    starts, i = [], 0
    while i < len(packed):
        starts.append(i)
        _, i = _read_varint(packed, i)
    return starts


class GrpcClient:
    """KServe v2 over gRPC: server and model readiness, inference."""

    def __init__(self, address: str, timeout: float = 60.0) -> None:
        import grpc

        self.grpc = grpc
        self.channel = grpc.insecure_channel(address)
        self.timeout = timeout

    def _call(self, method: str, request: bytes) -> bytes:
        call = self.channel.unary_unary(_SERVICE + method, request_serializer=None, response_deserializer=None)
        try:
            return call(request, timeout=self.timeout)
        except self.grpc.RpcError as e:
            raise InferenceError(e.code().name, e.details()) from None

    def server_ready(self) -> bool:
        return dict(_fields(self._call("ServerReady", b""))).get(1, 0) == 1

    def model_ready(self, model: str) -> bool:
        return dict(_fields(self._call("ModelReady", _field(1, model.encode())))).get(1, 0) == 1

    def infer(self, model: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return _infer_response(self._call("ModelInfer", _infer_request(model, inputs)))

    def close(self) -> None:
        self.channel.close()
