"""The text form of programs, the main debugging tool.

One line per instruction, in the style of MIGraphX:
`@12 = convolution[padding={1,1,1,1},stride={1,1}](@10,@11) -> float_type, {1, 32, 320, 320}, {...}`.
Names are positions in the module, so the same program always prints the same text, which the
pass tests compare. Sub-modules of fused instructions print after their parent module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fusegraph.ir.program import Instruction, Module, Program


def instruction_names(module: "Module") -> dict[int, str]:
    return {id(ins): f"@{k}" for k, ins in enumerate(module.instructions)}


def format_instruction(ins: "Instruction", names: dict[int, str]) -> str:
    args = ",".join(names.get(id(x), "@?") for x in ins.inputs)
    call = f"{ins.op}({args})" if ins.inputs else str(ins.op)
    return f"{names[id(ins)]} = {call} -> {ins.shape}"


def format_module(module: "Module") -> str:
    names = instruction_names(module)
    lines = [f'module: "{module.name}"']
    lines += [format_instruction(ins, names) for ins in module.instructions]
    rets = ",".join(names.get(id(r), "@?") for r in module.returns)
    lines.append(f"@{len(module.instructions)} = @return({rets})")
    return "\n".join(lines)


def format_program(program: "Program") -> str:
    return "\n\n".join(format_module(m) for m in program.modules()) + "\n"
