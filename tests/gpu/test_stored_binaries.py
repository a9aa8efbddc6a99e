"""Kernel binaries stored in a .fgx file: they round-trip, are checked by hash, and reach
Triton's cache only under the key Triton computes for the regenerated kernel.

Triton builds sm_90 binaries without a GPU (targets/gpu/ahead_of_time.py), so the scenarios
run where the GPU's own path would warm a kernel up: the kernels of a small model are built for
sm_90 in a worker process (Triton's standard library must be imported there without the
interpreter) and everything around it is the code `save` and `load` run. Compilation is made
to fail while the stored binaries are installed, so a cache hit is the only way through.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import fusegraph
from fusegraph.errors import SavedProgramError
from fusegraph.saved_program import container, gpu_binaries
from fusegraph.saved_program.kernel_binaries import binaries_from_json, binaries_to_json
from fusegraph.targets.gpu import stored_binaries
from fusegraph.targets.gpu.stored_binaries import StoredBinary
from tests.helpers import conv_silu_add_model, has_gpu

ENV = "cuda-sm90|triton-test"


@pytest.fixture(scope="module")
def in_worker(tmp_path_factory):
    """Run `scenario(folder)` in one process, shared by the tests, where Triton compiles for
    real (no interpreter); the kernels are built once, into the Triton cache under folder/save."""
    pytest.importorskip("triton")
    from fusegraph.targets.gpu.ahead_of_time import _without_interpreter

    folder = tmp_path_factory.mktemp("binaries")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_without_interpreter) as pool:
        yield lambda scenario: pool.submit(scenario, str(folder)).result()


def _kernels():
    """The fused kernels of a small model as a compiled program holds them (source, config,
    instruction), generated for the GPU."""
    from fusegraph.ops.base import is_fused
    from fusegraph.passes.pipeline import fuse
    from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program
    from fusegraph.targets.gpu.compiled_program import Kernel

    program = fusegraph.parse_onnx(conv_silu_add_model(1), batch=2)
    fuse(program)
    plan = plan_program(program.main)
    fused = [i for i in program.main if is_fused(i)]
    return [Kernel(ins, src, None, src.configs[0], []) for ins, src in
            ((ins, generate(ins, pos, kernel_inputs(ins, plan))) for pos, ins in enumerate(fused))]


def _build(kernel):
    from fusegraph.targets.gpu.ahead_of_time import arg_dtypes, build_for

    return build_for(kernel.src, arg_dtypes(kernel.ins, kernel.src), kernel.config)


class _NoCompiling:
    """While active, Triton's CUDA backend refuses to compile: only a cache hit succeeds."""

    def __enter__(self):
        from triton.backends.nvidia.compiler import CUDABackend

        self.saved = CUDABackend.add_stages

        def refuse(*args, **kwargs):
            raise AssertionError("Triton compiled a kernel that a stored binary should have provided")

        CUDABackend.add_stages = refuse

    def __exit__(self, *exc):
        from triton.backends.nvidia.compiler import CUDABackend

        CUDABackend.add_stages = self.saved
        return False


def _saved(folder: str) -> tuple[list, list[StoredBinary], Path]:
    """Build the kernels (in Triton's cache under folder/save), store their binaries in a .fgx
    container and read them back."""
    os.environ["FUSEGRAPH_CACHE_DIR"] = f"{folder}/fusegraph"
    os.environ["TRITON_CACHE_DIR"] = f"{folder}/save"
    kernels = _kernels()
    binaries = stored_binaries.collect(kernels, _build)
    doc, tensors = binaries_to_json(ENV, binaries)
    path = Path(folder) / "binaries.fgx"
    container.write(path, {"binaries": doc}, tensors)
    read_doc, read_tensors = container.read(path)
    loaded = binaries_from_json(read_doc["binaries"], read_tensors, str(path))[ENV]
    assert [(b.digest, b.config, b.triton_hash, b.files, b.signature) for b in loaded] == \
        [(b.digest, b.config, b.triton_hash, b.files, b.signature) for b in binaries]
    assert all(b.signature and any(t.startswith("*") for t in b.signature) for b in loaded)
    return kernels, loaded, path


def scenario_round_trip_without_compiling(folder: str) -> int:
    from triton.runtime.cache import get_cache_manager

    kernels, loaded, path = _saved(folder)
    os.environ["TRITON_CACHE_DIR"] = f"{folder}/load-1"  # an empty cache: another machine of the same kind
    with _NoCompiling():
        done = stored_binaries.install(kernels, loaded, str(path), _build)
        used = done.used
        assert (done.used, done.compiled) == (len(loaded), 0)
        assert [name for name, _ in done.lookup] == [k.src.name for k in kernels][:len(done.lookup)]
        again = _build(kernels[0])  # the first launch's lookup: a hit in Triton's own cache
    assert again.hash == loaded[0].triton_hash
    assert again.asm["cubin"] == next(v for n, v in loaded[0].files.items() if n.endswith(".cubin"))
    entry = get_cache_manager(loaded[0].triton_hash).get_group(f"{kernels[0].src.name}.json")
    assert entry is not None and sorted(Path(p).suffix for p in entry.values()) == [".cubin", ".json"]
    return used


def scenario_a_key_triton_does_not_compute_is_not_used(folder: str) -> tuple[int, int, bool]:
    """Files rewritten consistently under another key pass the checks, but Triton computes the
    real key for the regenerated kernel: they are not used, and never reach Triton's cache."""
    import json

    from triton.runtime.cache import get_cache_manager

    kernels, loaded, path = _saved(folder)
    b = loaded[0]
    fake = "f" * 64
    meta_name = next(n for n in b.files if n.endswith(".json"))
    meta = json.loads(b.files[meta_name])
    meta["hash"] = fake
    forged = StoredBinary(b.digest, b.config, fake, {**b.files, meta_name: json.dumps(meta).encode()})
    os.environ["TRITON_CACHE_DIR"] = f"{folder}/load-2"
    done = stored_binaries.install(kernels[:1], [forged], str(path), _build)
    return done.used, done.compiled, get_cache_manager(fake).get_group(meta_name) is not None


def scenario_bad_binaries_are_refused(folder: str) -> list[str]:
    """Each damaged or mismatched binary is a SavedProgramError before anything reaches Triton."""
    kernels, loaded, path = _saved(folder)
    b = loaded[0]
    names = {k.src.digest: k.src.name for k in kernels}
    messages = []
    doc, tensors = container.read(path)
    cubin = next(f for n, f in doc["binaries"][ENV][0]["files"].items() if n.endswith(".cubin"))
    flipped = dict(tensors)
    flipped[cubin["tensor"]] = tensors[cubin["tensor"]].copy()
    flipped[cubin["tensor"]][100] ^= 1  # the checksums are written anew: only the per-file SHA-256 sees it
    for bad in (lambda: binaries_from_json(doc["binaries"], flipped, "f.fgx"),
                lambda: stored_binaries.check(StoredBinary(b.digest, b.config, "0" * 64, b.files), names, "f.fgx"),
                lambda: stored_binaries.check(StoredBinary("0123456789abcdef", b.config, b.triton_hash, b.files),
                                              names, "f.fgx"),
                lambda: stored_binaries.check(StoredBinary(b.digest, b.config, b.triton_hash,
                                                           {**b.files, "x.py": b"import os"}), names, "f.fgx")):
        try:
            bad()
        except SavedProgramError as e:
            messages.append(str(e))
    return messages


def test_stored_binaries_round_trip_and_load_without_compiling(in_worker) -> None:
    assert in_worker(scenario_round_trip_without_compiling) >= 1


def test_a_binary_under_a_key_triton_does_not_compute_is_compiled_instead(in_worker) -> None:
    assert in_worker(scenario_a_key_triton_does_not_compute_is_not_used) == (0, 1, False)


def test_tampered_and_mismatched_binaries_are_refused(in_worker) -> None:
    messages = in_worker(scenario_bad_binaries_are_refused)
    assert len(messages) == 4, messages
    assert "do not have the SHA-256 the document gives" in messages[0] and "refused" in messages[0]
    assert "metadata for another kernel or key: refused" in messages[1]
    assert "names kernel source 0123456789abcdef, which no kernel regenerated from the stored program has" in messages[2]
    assert "x.py" in messages[3]


def test_a_load_refuses_a_damaged_binary_and_says_once_when_binaries_are_for_another_gpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `fusegraph.load` (the gpu target under the interpreter, posing as a GPU)."""
    program = fusegraph.parse_onnx(conv_silu_add_model(2))
    compiled = fusegraph.compile(program, "gpu", tune=False)
    fusegraph.save(compiled, tmp_path / "g.fgx")
    doc, tensors = container.read(tmp_path / "g.fgx")
    k = compiled.kernels[0]
    fake = StoredBinary(k.src.digest, k.config, "a" * 64, {f"{k.src.name}.json": b"{}", f"{k.src.name}.cubin": b"\0"})
    binaries, binary_tensors = binaries_to_json("cuda-sm80|triton-0", [fake])
    container.write(tmp_path / "other.fgx", {**doc, "binaries": binaries}, {**tensors, **binary_tensors})
    broken = dict(binary_tensors)
    name = next(iter(broken))
    broken[name] = np.concatenate([broken[name], np.zeros(1, np.uint8)])
    container.write(tmp_path / "broken.fgx", {**doc, "binaries": binaries}, {**tensors, **broken})
    with pytest.raises(SavedProgramError, match="broken.fgx: stored binary 0 .* SHA-256"):
        fusegraph.load(tmp_path / "broken.fgx")
    monkeypatch.setattr(gpu_binaries, "has_binaries", lambda compiled: True)
    monkeypatch.setattr(stored_binaries, "environment", lambda: "cuda-sm90|triton-0")
    with pytest.warns(UserWarning, match="binaries are for cuda-sm80.triton-0, not cuda-sm90.triton-0: compiling") as w:
        loaded = fusegraph.load(tmp_path / "other.fgx")
    assert len([x for x in w if "binaries" in str(x.message)]) == 1
    x = {"x": np.random.default_rng().standard_normal((1, 3, 8, 8), dtype=np.float32),
         "y": np.random.default_rng().standard_normal((1, 4, 1, 1), dtype=np.float32)}
    np.testing.assert_array_equal(loaded.run(x)["out"], compiled.run(x)["out"])


def test_a_launch_signature_holds_only_triton_type_names(tmp_path: Path) -> None:
    """A load has Triton build launchers from stored signatures before any check of the kernels
    against them, so anything but Triton's type names is refused when the file is read."""
    files = {"k.json": b"{}", "k.cubin": b"\0"}
    good = StoredBinary("0123456789abcdef", {"BLOCK": 64}, "a" * 64, files, ("*fp16", "*fp32", "i32", "constexpr"))
    doc, tensors = binaries_to_json(ENV, [good])
    assert binaries_from_json(doc, tensors, "f.fgx")[ENV][0].signature == good.signature
    for bad in (["*fp16", "i32); system(\"x\""], ["*fp16", 3], "i32", ["i32"] * 1000):
        entry = dict(doc[ENV][0], signature=bad)
        with pytest.raises(SavedProgramError, match="stored binary 0 .* malformed .*launch signature"):
            binaries_from_json({ENV: [entry]}, tensors, "f.fgx")
    unsigned = dict(doc[ENV][0])
    del unsigned["signature"]  # a binary whose signature Triton did not give as names
    assert binaries_from_json({ENV: [unsigned]}, tensors, "f.fgx")[ENV][0].signature is None


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="binaries, launchers and CUDA graphs need a GPU")
def test_a_load_on_a_gpu_prepares_every_kernel_and_the_first_run_replays(tmp_path: Path) -> None:
    """On the GPU: the load hands Triton the stored binaries (compiling none), builds the
    launchers, loads every module and captures the graph of NumPy inputs; the first run then
    replays it and gives the fresh compile's outputs bit for bit."""
    import torch

    program = fusegraph.parse_onnx(conv_silu_add_model(3))
    compiled = fusegraph.compile(program, "gpu", fp16=True)
    fusegraph.save(compiled, tmp_path / "g.fgx")
    doc, _ = container.read(tmp_path / "g.fgx")
    (entries,) = doc["binaries"].values()
    assert all(e.get("signature") for e in entries)
    loaded = fusegraph.load(tmp_path / "g.fgx")
    ready = [stored_binaries.warm_up(k) for k in loaded.kernels]
    assert all(k._run is not None and k.module is not None for k in ready)
    assert loaded.last_capture and len(loaded._graphs) == 1
    loaded.last_capture = {}
    x = {k: np.random.default_rng().standard_normal(s.lens).astype(s.dtype.numpy) for k, s in loaded.input_shapes.items()}
    got = loaded.run(x)
    torch.cuda.synchronize()
    assert loaded.last_capture == {}  # replayed the graph the load captured
    want = compiled.run(x)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


class _FakeKernel:
    """What load_handles reads of Triton's CompiledKernel: name, src.signature, metadata, _run."""

    def __init__(self, name: str, signature: tuple[str, ...]) -> None:
        from types import SimpleNamespace

        self.name, self.metadata, self._run = name, SimpleNamespace(), None
        self.src = SimpleNamespace(signature=dict(enumerate(signature)))
        self.handled = 0

    def _init_handles(self) -> None:
        self.handled += 1


def test_launch_preparation_builds_one_launcher_per_signature_and_loads_every_kernel() -> None:
    import threading

    from fusegraph.targets.gpu import launch_prep

    built, lock = [], threading.Lock()

    def launcher(src, metadata):
        with lock:
            built.append(tuple(src.signature.values()))

    kernels = [_FakeKernel(f"k{i}", sig) for i, sig in enumerate(
        [("*fp16", "i32"), ("*fp16", "i32"), ("*fp32", "constexpr"), ("*fp16", "*fp16", "i32")])]
    times = launch_prep.load_handles(kernels, launcher)
    assert sorted(built) == sorted({("*fp16", "i32"), ("*fp32", "constexpr"), ("*fp16", "*fp16", "i32")})
    assert [k.handled for k in kernels] == [1, 1, 1, 1] and [n for n, _ in times] == ["k0", "k1", "k2", "k3"]
    early = launch_prep.EarlyStart(lambda: 1 / 0)  # a failure ahead of time is left to Triton
    early.wait()
    assert isinstance(early.error, ZeroDivisionError)


def test_this_triton_says_whether_it_compiles_launchers_per_signature() -> None:
    """Triton 3.6 (the GPU machine's) has `make_launcher`; 3.9 launches through one generic launcher."""
    triton = pytest.importorskip("triton")
    from fusegraph.targets.gpu import launch_prep

    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    if (major, minor) <= (3, 6):
        assert launch_prep.per_signature_launchers()
    elif (major, minor) >= (3, 9):
        assert not launch_prep.per_signature_launchers()
