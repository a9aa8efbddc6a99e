"""Run ONNX's own backend test cases through any `onnx.backend.base.Backend`.

The cases come from `onnx.backend.test`: the *node* tests are generated in memory from
`onnx/backend/test/case/node/*.py` by `onnx.backend.test.loader.load_model_tests(kind="node")`
(the onnx wheel ships the generators, not the data files; generating takes about 5 s, less
than writing and re-reading 1,900 directories would), and the *light* models are the files in
`onnx/backend/test/data/light` with their stored outputs, fed the same deterministic dummy input
(`Runner.generate_dummy_data`) that onnx's runner feeds them. Outputs are compared with
`Runner.assert_similar_outputs` and each case's own rtol/atol, as onnx's runner does (a
sequence output's elements as outputs of their own: `_assert_similar`).

The same `run_case` drives fusegraph's reference target (tests/test_conformance.py), its gpu
target (tests/test_conformance_gpu.py) and ONNX Runtime (tools/conformance_report.py), so all
are judged by one rule.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import re
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner

from fusegraph.errors import ParseError, UnsupportedOpError

ONNX_TEST_DIR = Path(onnx.__file__).parent / "backend" / "test"
#: Seed of NumPy's global generator while onnx generates the node cases, so that the random
#: inputs (and so every comparison) are the same in every run.
SEED = 0


class Status(enum.Enum):
    PASS = "pass"
    SKIP = "skip"  # the backend does not support the model (op, attribute value or element type)
    FAIL = "fail"


@dataclasses.dataclass(frozen=True)
class Case:
    """One conformance case: a model and the (inputs, expected outputs) pairs it must reproduce."""

    name: str  # onnx's test name, e.g. "test_softmax_axis_0_expanded"
    op: str  # the ONNX op under test; "(light model)" for the light models
    kind: str  # "node" or "light"
    model: onnx.ModelProto = dataclasses.field(repr=False)
    data_sets: Sequence[tuple[Sequence[Any], Sequence[Any]]] = dataclasses.field(repr=False)
    rtol: float = 1e-3
    atol: float = 1e-7

    @property
    def expanded(self) -> bool:
        """Whether the model is the op's function body expanded into primitive ops."""
        return "_expanded" in self.name


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: Status
    message: str = ""
    error: str = ""  # the exception's type name, for skips and failures


_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@functools.cache
def node_cases() -> tuple[Case, ...]:
    """All node test cases of the installed onnx, generated once per process, deterministically."""
    state = np.random.get_state()
    np.random.seed(SEED)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            raw = list(load_model_tests(kind="node"))
    finally:
        np.random.set_state(state)
    op_of = {t.name: t.model.graph.node[0].op_type for t in raw if not _EXPANDED.search(t.name)}
    cases = [Case(t.name, op_of[_EXPANDED.sub("", t.name)], "node", t.model, t.data_sets, t.rtol, t.atol)
             for t in raw]
    return tuple(sorted(cases, key=lambda c: c.name))


@functools.cache
def light_cases() -> tuple[Case, ...]:
    """The light models (real networks with small constant weights) and their stored outputs.

    Names and tolerances come from onnx's `data/real/*/data.json`, which point at these files.
    """
    known = {}
    for info in (ONNX_TEST_DIR / "data" / "real").glob("*/data.json"):
        data = json.loads(info.read_text())
        known[Path(data["url"]).name] = (info.parent.name, data.get("rtol", 1e-3), data.get("atol", 1e-7))
    cases = []
    for path in sorted((ONNX_TEST_DIR / "data" / "light").glob("*.onnx")):
        model = onnx.load(path)
        inits = {t.name for t in model.graph.initializer}
        feeds = [Runner.generate_dummy_data(x, seed=0, name=path.stem, random=False)
                 for x in model.graph.input if x.name not in inits]
        outputs = []
        for k in range(len(model.graph.output)):
            tensor = onnx.TensorProto()
            tensor.ParseFromString((path.parent / f"{path.stem}_output_{k}.pb").read_bytes())
            outputs.append(numpy_helper.to_array(tensor))
        name, rtol, atol = known.get(path.name, (f"test_{path.stem}", 1e-3, 1e-7))
        cases.append(Case(name, "(light model)", "light", model, [(feeds, outputs)], rtol, atol))
    return tuple(cases)


def _tensor(x: Any) -> Any:
    """A case's value as an array (cases hold some as TensorProtos, some as NumPy scalars)."""
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    return np.asarray(x) if isinstance(x, np.generic) else x


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def run_case(case: Case, backend: Any, unsupported: tuple[type[BaseException], ...] = ()) -> Outcome:
    """Prepare and run `case` on `backend`, as onnx's runner does.

    An exception of the `unsupported` types skips the case: the backend declined the model (when
    a backend specializes on input values it may only decline at the first run). Any other
    exception, or outputs that differ, fail it.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = backend.prepare(case.model, "CPU")
            for inputs, expected in case.data_sets:
                with np.errstate(all="ignore"):
                    got = rep.run([_tensor(x) for x in inputs])
                _assert_similar([_tensor(x) for x in expected], list(got), case.rtol, case.atol)
    except unsupported as e:
        if isinstance(e.__context__, _INTERNAL):  # a parser crashed; the importer wrapped it
            return Outcome(Status.FAIL, f"internal error while parsing: {_describe(e)}", type(e.__context__).__name__)
        return Outcome(Status.SKIP, str(e).strip(), type(e).__name__)
    except Exception as e:  # noqa: BLE001  (anything else is a failure of the case)
        return Outcome(Status.FAIL, _describe(e), type(e).__name__)
    return Outcome(Status.PASS)


def _assert_similar(expected: Sequence[Any], got: Sequence[Any], rtol: float, atol: float) -> None:
    """onnx's runner's rule, with a sequence output's elements compared as outputs of their own.

    The runner compares a sequence element by element by calling itself on each pair of arrays
    as if they were lists of outputs, which takes `len()` of a 0-d element and fails every
    backend on a sequence of scalars (test_loop16_seq_none); as outputs their shape, dtype and
    values are compared, as for any tensor output.
    """
    np.testing.assert_equal(len(got), len(expected), err_msg="number of outputs")
    for k, (e, g) in enumerate(zip(expected, got)):
        if not isinstance(e, list):
            Runner.assert_similar_outputs([e], [g], rtol=rtol, atol=atol)
            continue
        if not isinstance(g, (list, tuple)):
            raise AssertionError(f"output {k}: a sequence expected, got {type(g).__name__}")
        np.testing.assert_equal(len(g), len(e), err_msg=f"output {k}: length of the sequence")
        Runner.assert_similar_outputs(e, list(g), rtol=rtol, atol=atol)


#: Exceptions that, wrapped in a ParseError by the importer, mean a parser bug rather than a
#: feature fusegraph declines; such a case fails instead of skipping.
_INTERNAL = (TypeError, AssertionError, IndexError, AttributeError)


#: What fusegraph reports for a model it cannot take: an op without a parser, or a ParseError
#: (an attribute value, an element type or a dynamic shape it does not support).
FUSEGRAPH_UNSUPPORTED = (UnsupportedOpError, ParseError)


def run_fusegraph(case: Case, fused: bool = False) -> Outcome:
    from fusegraph.driver.onnx_backend import FusedFusegraphBackend, FusegraphBackend

    return run_case(case, FusedFusegraphBackend if fused else FusegraphBackend, FUSEGRAPH_UNSUPPORTED)


def run_gpu(case: Case) -> Outcome:
    """The case on the gpu target (fused, one kernel per group, default configs).

    A group without a GPU template (`CodegenError`) skips like an unsupported op does; the
    outcome's `error` tells the two apart, so that what the GPU target lacks is counted on its own.
    """
    from fusegraph.driver.onnx_backend import GpuFusegraphBackend
    from fusegraph.targets.gpu.kernel_writer import CodegenError

    return run_case(case, GpuFusegraphBackend, FUSEGRAPH_UNSUPPORTED + (CodegenError,))


class _OnnxRuntimeBackend:
    """`onnxruntime.backend`, retried with the model's IR version lowered to the newest ORT reads.

    onnx stamps its generated test models with its own newest IR version, even those that use
    nothing new, and ONNX Runtime refuses a newer IR version outright. Lowering the stamp lets
    ORT judge the op itself; a model that really needs the newer IR still fails on its content.
    """

    @staticmethod
    def prepare(model: onnx.ModelProto, device: str = "CPU") -> Any:
        import onnxruntime.backend

        try:
            return onnxruntime.backend.prepare(model, device)
        except Exception as e:
            newest = re.search(r"max supported IR version: (\d+)", str(e))
            if newest is None or model.ir_version <= int(newest.group(1)):
                raise
            lowered = onnx.ModelProto()
            lowered.CopyFrom(model)
            lowered.ir_version = int(newest.group(1))
            return onnxruntime.backend.prepare(lowered, device)


def run_onnxruntime(case: Case) -> Outcome:
    """ONNX Runtime on the CPU; it skips nothing: anything it cannot load counts as a failure."""
    return run_case(case, _OnnxRuntimeBackend)


# the per-op table -----------------------------------------------------------------------------

COLUMNS = ("pass", "skip", "fail", "excluded")


def op_table(outcomes: Iterable[tuple[Case, str]]) -> dict[str, Counter[str]]:
    """op -> counts of each column, from (case, column) pairs; column is one of COLUMNS."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for case, column in outcomes:
        table[case.op][column] += 1
    return dict(sorted(table.items()))


def format_table(table: Mapping[str, Counter[str]], extra: Mapping[str, Counter[str]] | None = None,
                 extra_columns: Sequence[str] = (), columns: Sequence[str] = COLUMNS) -> str:
    """The per-op table with a totals row; `extra` adds columns (e.g. ONNX Runtime's passes).

    `columns` names the table's own columns (the gpu target adds "no-template" to COLUMNS).
    """
    cols = list(columns) + list(extra_columns)
    width = max([len("op"), len("TOTAL")] + [len(op) for op in table])
    cell = max([8] + [len(c) for c in cols])
    lines = [f"{'op':<{width}} " + " ".join(f"{c:>{cell}}" for c in cols)]
    totals: Counter[str] = Counter()

    def row(name: str, counts: Counter[str], more: Counter[str]) -> str:
        values = [counts[c] for c in columns] + [more[c] for c in extra_columns]
        return f"{name:<{width}} " + " ".join(f"{v:>{cell}}" for v in values)

    for op, counts in table.items():
        more = (extra or {}).get(op, Counter())
        lines.append(row(op, counts, more))
        totals.update(counts)
        totals.update({c: more[c] for c in extra_columns})
    lines.append(row("TOTAL", totals, totals))
    return "\n".join(lines)
