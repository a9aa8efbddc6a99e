"""One small parser per ONNX op; importing this package registers them all."""

from fusegraph.onnx.parsers import (attention, cumulative, einsum, elementwise, gather, generators, grid_sample,  # noqa: F401
                                    integer_ops, layout, loop, loss, nn, quantize, scatter, selection, sequences)
