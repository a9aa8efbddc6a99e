"""Errors that fusegraph reports to its users.

Every error a user can cause (a bad file, an unsupported op, a wrong input) is a
`FusegraphError` whose message names the culprit, so the command line can print it
as one clear line and exit 2 instead of showing a traceback from deep inside.
"""

from __future__ import annotations


class FusegraphError(Exception):
    """Base class: an error caused by the user's model, inputs or options."""


class ModelLoadError(FusegraphError):
    """The model file could not be read (missing, truncated, not ONNX, unknown zoo name)."""


class UnsupportedOpError(FusegraphError):
    """One or more ONNX nodes use ops fusegraph does not support; lists all of them at once."""


class ParseError(FusegraphError):
    """An ONNX node is malformed: a bad attribute, a missing input, a non-constant shape."""


class DynamicValueError(ParseError):
    """A value that must be known when the model is compiled (a Reshape target, Slice bounds,
    reduction axes, resize scales, ...) is computed at run time.

    fusegraph compiles for fixed shapes. `inputs` names the graph inputs the value depends on, so a
    caller that knows their values (the ONNX backend, at run time) can fix them and parse again.
    """

    def __init__(self, message: str, inputs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.inputs = inputs


class ShapeError(FusegraphError):
    """Shape inference failed for an instruction; the message names the node and its input shapes."""


class InputError(FusegraphError):
    """A run-time input has the wrong name, shape or dtype."""


class ArgumentError(FusegraphError):
    """A fusegraph function was called with an argument of the wrong type or value; the message
    names the argument and what it accepts."""


class TargetUnavailableError(FusegraphError):
    """The gpu target cannot run here (torch or triton missing, no GPU where one is needed, or
    Triton's interpreter not switched on in time); the message says what to install or set."""


class DeviceError(FusegraphError):
    """The GPU could not run a compiled program: it has too little free memory for the
    program's buffers, or Triton could not compile or launch a kernel for it; the message
    names the kernel or the buffers and says what to do."""


class SavedProgramError(FusegraphError):
    """A saved program (.fgx) cannot be written or read: missing, not a .fgx file, truncated,
    changed since it was written (a checksum fails), of another format version, or naming an op
    this fusegraph does not have; the message names the file and what is wrong."""
