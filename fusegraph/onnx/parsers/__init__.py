"""One small parser per ONNX op; importing this package registers them all."""

from fusegraph.onnx.parsers import elementwise, layout, nn  # noqa: F401
