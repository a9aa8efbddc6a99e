"""The loop most rewriting passes share: offer each instruction to a rewrite, once, in order.

The instructions are listed before the first rewrite, so a rewrite may insert, replace and
remove instructions freely: what it adds is not visited, and what it removes may still be
offered (a rewrite that can meet a removed instruction checks for it).
"""

from __future__ import annotations

from typing import Callable

from fusegraph.ir.program import Instruction, Module
from fusegraph.passes.dead_code import DeadCodeElimination


def rewrite_each(module: Module, rewrite: Callable[[Instruction], bool], drop_dead: bool = False) -> bool:
    """Call `rewrite` on every instruction of `module` in program order; True if any call
    returned True (it changed the module). With `drop_dead`, a changed module then loses the
    instructions nothing reads any more, which rewrites leave behind when they replace a chain."""
    changed = False
    for ins in list(module.instructions):
        if rewrite(ins):
            changed = True
    if changed and drop_dead:
        DeadCodeElimination().apply(module)
    return changed
