"""Dead code elimination: drop instructions nothing returned depends on.

Parameters are kept even when unused, since they are the program's interface. The pruning
itself is `Module.remove_dead_code`, which the importer also calls.
"""

from __future__ import annotations

from fusegraph.ir.program import Module


class DeadCodeElimination:
    name = "dead_code_elimination"

    def apply(self, module: Module) -> bool:
        return module.remove_dead_code()
