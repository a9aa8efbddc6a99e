"""Index expressions and index maps as plain JSON, and back.

An expression is rebuilt node by node through its raw constructors (never simplified again),
so the kernels generated from a rebuilt fused program are those of the saved one, text for
text. Each node is a short list tagged by its kind:

    ["c", 3]  ["v", "i0", 80]  ["s", const, [[term, coeff], ...]]  ["p", [factor, ...]]
    ["d", arg, divisor]  ["m", arg, divisor]

A node the constructors refuse (a variable without a name or extent, a zero divisor, a
product of one factor) is a ValueError, as is a tag this reader does not know.
"""

from __future__ import annotations

from typing import Any

from fusegraph.ir.index_expr import Const, Expr, FloorDiv, Mod, Prod, Sum, Var
from fusegraph.ir.index_map import IndexMap

#: the deepest expression a file may hold (fusion builds them a few levels deep)
MAX_DEPTH = 64


def expr_to_json(e: Expr) -> list[Any]:
    if isinstance(e, Const):
        return ["c", e.value]
    if isinstance(e, Var):
        return ["v", e.name, e.extent]
    if isinstance(e, Sum):
        return ["s", e.const, [[expr_to_json(a), c] for a, c in e.terms]]
    if isinstance(e, Prod):
        return ["p", [expr_to_json(f) for f in e.factors]]
    if isinstance(e, (FloorDiv, Mod)):
        return ["d" if isinstance(e, FloorDiv) else "m", expr_to_json(e.arg), e.divisor]
    raise TypeError(f"no stored form for the expression {e!r}")


def expr_from_json(doc: Any, depth: int = 0) -> Expr:
    if depth > MAX_DEPTH:
        raise ValueError("an index expression is nested too deeply")
    if not isinstance(doc, list) or not doc or not isinstance(doc[0], str):
        raise ValueError(f"{doc!r} is no index expression")
    tag, args = doc[0], doc[1:]
    if tag == "c" and len(args) == 1:
        return Const(_int(args[0]))
    if tag == "v" and len(args) == 2:
        return Var(args[0], _int(args[1]))
    if tag == "s" and len(args) == 2 and isinstance(args[1], list):
        terms = []
        for t in args[1]:
            if not isinstance(t, list) or len(t) != 2:
                raise ValueError(f"{t!r} is no term of a sum")
            terms.append((expr_from_json(t[0], depth + 1), _int(t[1])))
        return Sum(_int(args[0]), terms)
    if tag == "p" and len(args) == 1 and isinstance(args[0], list):
        return Prod([expr_from_json(f, depth + 1) for f in args[0]])
    if tag in ("d", "m") and len(args) == 2:
        return (FloorDiv if tag == "d" else Mod)(expr_from_json(args[0], depth + 1), _int(args[1]))
    raise ValueError(f"{doc!r} is no index expression")


def map_to_json(m: IndexMap) -> dict[str, Any]:
    return {"vars": [[v.name, v.extent] for v in m.out_vars], "exprs": [expr_to_json(e) for e in m.exprs],
            "in_lens": list(m.in_lens)}


def map_from_json(doc: Any) -> IndexMap:
    if not isinstance(doc, dict) or set(doc) != {"vars", "exprs", "in_lens"}:
        raise ValueError("an index map holds vars, exprs and in_lens")
    variables = [Var(v[0], _int(v[1])) for v in doc["vars"] if isinstance(v, list) and len(v) == 2]
    if len(variables) != len(doc["vars"]):
        raise ValueError("an index map's variables are [name, extent] pairs")
    return IndexMap(variables, [expr_from_json(e) for e in doc["exprs"]], [_int(n) for n in doc["in_lens"]])


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{v!r} is not an integer")
    return v
