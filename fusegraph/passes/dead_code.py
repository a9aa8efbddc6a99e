"""Dead code elimination: drop instructions nothing returned depends on.

Parameters are kept even when unused, since they are the program's interface.
"""

from __future__ import annotations

from fusegraph.ir.program import Module
from fusegraph.ops.base import is_param


class DeadCodeElimination:
    name = "dead_code_elimination"

    def apply(self, module: Module) -> bool:
        live: set[int] = set()
        stack = list(module.returns)
        while stack:
            ins = stack.pop()
            if id(ins) in live:
                continue
            live.add(id(ins))
            stack.extend(ins.inputs)
        before = len(module.instructions)
        module.instructions = [i for i in module.instructions if id(i) in live or is_param(i)]
        return len(module.instructions) != before
