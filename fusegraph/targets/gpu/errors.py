"""The GPU target's error, kept in a module of its own so every code generation module can
raise it without importing the kernel writer; and the on/off settings it checks."""

from __future__ import annotations

import os

from fusegraph.errors import FusegraphError


class CodegenError(FusegraphError):
    """A fused instruction the GPU target cannot generate code for; names the op."""


def switch_setting(env: str, on: str, off: str) -> str:
    """An on/off environment setting of code generation, checked: "1", "0" or "" (unset). A
    misspelt value would otherwise leave the default in force without a word; the error says
    what 1 (`on`) and 0 (`off`) do."""
    setting = os.environ.get(env, "")
    if setting not in ("", "0", "1"):
        raise CodegenError(f"{env}={setting!r}: use 1 ({on}) or 0 ({off})")
    return setting
