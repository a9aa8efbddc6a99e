"""Reading an ONNX model from a path, bytes, a ModelProto or a zoo name, with clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from fusegraph.errors import ModelLoadError


def load_model(source: "str | os.PathLike[str] | bytes | onnx.ModelProto") -> onnx.ModelProto:
    """The ModelProto for `source`; a path that does not exist may name a zoo model."""
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, (bytes, bytearray)):
        return _parse_bytes(bytes(source), "<bytes>")
    path = Path(source)
    if not path.exists():
        from fusegraph import zoo

        if zoo.is_zoo_name(str(source)):
            return zoo.load(str(source))
        raise ModelLoadError(f"{source}: no such file, and not a zoo model (zoo models: {', '.join(zoo.names())})")
    if path.is_dir():
        raise ModelLoadError(f"{source}: is a directory, not an ONNX file")
    model = _parse_bytes(path.read_bytes(), str(source))
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except Exception as e:  # the external files are the user's: say which is missing
            raise ModelLoadError(f"{source}: cannot load external weights: {e}") from None
    return model


def _parse_bytes(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"{where}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{where}: not a valid ONNX model (truncated or not ONNX: {e})") from None
    if not model.HasField("graph") or not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"{where}: not a valid ONNX model (no graph)")
    if not model.opset_import:
        raise ModelLoadError(f"{where}: not a valid ONNX model (no opset_import; truncated?)")
    return model
