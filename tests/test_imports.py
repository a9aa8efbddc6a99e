"""What importing fusegraph costs a process that needs only part of it.

Every kernel-build worker of a compile unpickles kernel sources before its first build, a
server loads a saved program, and `fusegraph --version` answers from the package alone: none
of them may import ONNX or ml_dtypes, about a second on their own (the names of `fusegraph`
load at first use, the ONNX importer at the first parse, ml_dtypes at the first bfloat16).
Each check runs in a fresh interpreter, since this one has imported everything.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

import fusegraph
from fusegraph.ir.dtypes import DType
from fusegraph.ops.base import is_fused
from fusegraph.passes.pipeline import fuse
from fusegraph.passes.to_half import ToHalf
from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program

HEAVY = ("onnx", "ml_dtypes", "onnxruntime")
ROOT = Path(__file__).resolve().parents[1]


def _imported_after(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_the_package_and_its_version_import_no_onnx():
    assert _imported_after("import fusegraph; assert fusegraph.__version__") == []


def test_unpickling_kernel_sources_imports_no_onnx_nor_ml_dtypes(tmp_path):
    program = fusegraph.parse_onnx("light_squeezenet")
    ToHalf(DType.float16, keep_wide=True).apply(program.main)
    fuse(program)
    plan = plan_program(program.main)
    fused = [i for i in program.main if is_fused(i)]
    sources = [generate(ins, pos, kernel_inputs(ins, plan)) for pos, ins in enumerate(fused)]
    assert sources
    path = tmp_path / "jobs.pkl"
    path.write_bytes(pickle.dumps([(s, s.configs[0]) for s in sources]))
    code = f"import pickle; jobs = pickle.loads(open({str(path)!r}, 'rb').read()); assert len(jobs) == {len(sources)}"
    assert _imported_after(code) == []


def test_loading_a_saved_program_imports_no_onnx(tmp_path):
    compiled = fusegraph.compile(fusegraph.parse_onnx("light_squeezenet"), "ref")
    path = tmp_path / "squeezenet.fgx"
    fusegraph.save(compiled, path)
    x = np.random.default_rng().random((1, 3, 224, 224), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    expected = compiled.run({"data_0": x})
    code = (f"import fusegraph, numpy as np\nc = fusegraph.load({str(path)!r})\n"
            f"out = c.run({{'data_0': np.load({str(tmp_path / 'x.npy')!r})}})\n"
            f"np.save({str(tmp_path / 'y.npy')!r}, next(iter(out.values())))")
    assert _imported_after(code) == []
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), next(iter(expected.values())))


def test_the_public_names_and_subpackages_load_on_first_use():
    code = ("import fusegraph, fusegraph.api as api\n"
            "from fusegraph import compile, parse_onnx, load, FusegraphError, compile_dynamic_batch\n"
            "assert compile is api.compile and parse_onnx is api.parse_onnx and callable(load)\n"
            "assert issubclass(FusegraphError, Exception) and callable(compile_dynamic_batch)\n"
            "assert fusegraph.zoo.is_zoo_name('light_squeezenet')\n"
            "try:\n    fusegraph.no_such_name\nexcept AttributeError as e:\n    assert 'no_such_name' in str(e)\n"
            "else:\n    raise SystemExit('no AttributeError')\n"
            "assert set(fusegraph.__all__) <= set(dir(fusegraph))")
    assert "onnx" in _imported_after(code)  # parse_onnx's module needs it
