"""One small parser per ONNX op; importing this package registers them all."""

from fusegraph.onnx.parsers import (attention, cumulative, deform_conv, einsum, elementwise, gather,  # noqa: F401
                                    generators, grid_sample, integer_ops, layout, linalg, loop, loss, nn, quantize, recurrent,
                                    scatter, selection, sequences)
