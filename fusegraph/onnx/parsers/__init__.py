"""One small parser per ONNX op; importing this package registers them all."""

from fusegraph.onnx.parsers import attention, elementwise, layout, nn  # noqa: F401
