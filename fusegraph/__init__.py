"""fusegraph: an ONNX inference compiler that fuses anchors, pointwise ops and layout changes.

The public API is `fusegraph.api`, re-exported here: parse_onnx, fuse, compile, run; and save and
load (fusegraph.saved_program) for .fgx files; compile_dynamic_batch (fusegraph.dynamic_batch) for
one program that answers a range of batch sizes.
"""

from fusegraph import ops  # noqa: F401  (registers every operator)
from fusegraph.api import compile, fuse, parse_onnx, run
from fusegraph.dynamic_batch import DynamicBatchProgram, compile_dynamic_batch
from fusegraph.errors import ArgumentError, FusegraphError
from fusegraph.ir.program import Program
from fusegraph.saved_program import load, save

__all__ = ["ArgumentError", "DynamicBatchProgram", "FusegraphError", "Program", "compile", "compile_dynamic_batch",
           "fuse", "load", "parse_onnx", "run", "save"]
__version__ = "0.1.0"
