"""One small parser per ONNX op; importing this package registers them all."""

from fusegraph.onnx.parsers import elementwise, gather, layout, loss, nn, scatter  # noqa: F401
