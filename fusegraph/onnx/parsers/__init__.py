"""One small parser per ONNX op; importing this package registers them all."""

from fusegraph.onnx.parsers import (cumulative, einsum, elementwise, gather, generators, integer_ops,  # noqa: F401
                                    layout, loss, nn, quantize, scatter, selection)
