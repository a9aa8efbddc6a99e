"""fusegraph: an ONNX inference compiler that fuses anchors, pointwise ops and layout changes."""

from fusegraph import ops  # noqa: F401  (registers every operator)
from fusegraph.errors import FusegraphError
from fusegraph.ir.program import Program
from fusegraph.onnx.importer import parse_onnx

__all__ = ["FusegraphError", "Program", "parse_onnx"]
__version__ = "0.1.0"
