"""The GPU target's error, kept in a module of its own so every code generation module can
raise it without importing the kernel writer."""

from __future__ import annotations

from fusegraph.errors import FusegraphError


class CodegenError(FusegraphError):
    """A fused instruction the GPU target cannot generate code for; names the op."""
