"""Save a program, or what `fusegraph.compile` made of it, to one .fgx file, and load it back.

    fusegraph.save(fusegraph.compile(program, target="gpu", fp16=True), "model.fgx")
    compiled = fusegraph.load("model.fgx")  # compiled again for gpu, fp16, with the stored configs

A dynamic-batch program (fusegraph.dynamic_batch) is saved as one program per size, its
weights once (tensors are named by their content).

A file holds the unfused program (JSON and safetensors arrays, see program_json and container),
the compile options and, for the gpu target, the fused program it compiled (so a load skips
half precision and fusion), each kernel's config by the digest of its source and, when saved
on a GPU, each kernel's compiled binary for that GPU (kernel_binaries, gpu_binaries). Kernel
source is never read from a file: loading generates the kernels again from the fused program,
checked as strictly as the unfused one and with every load and store inside its buffer, and
sets each kernel's stored config instead of tuning it; a stored binary is handed to Triton
only for the regenerated kernel it was compiled from. The unfused program comes back as the
compiled program's `source_program` (the oracle `fusegraph verify` runs, what saving it again writes).
"""

from __future__ import annotations

import gc
import os
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Union

import numpy as np

from fusegraph import api
from fusegraph.dynamic_batch import DynamicBatchProgram
from fusegraph.errors import ArgumentError, SavedProgramError
from fusegraph.ir.program import Program
from fusegraph.ops.base import is_fused
from fusegraph.saved_program import container, gpu_binaries
from fusegraph.saved_program.load_timing import Phases
from fusegraph.saved_program.program_json import program_from_json, program_to_json

_OPTIONS = ("fp16", "bf16", "allow_tf32")


def save(program_or_compiled: Union[Program, api.Compiled, DynamicBatchProgram], path: "str | os.PathLike[str]") -> None:
    """Write a Program (unfused), a compiled program or a dynamic-batch program to `path` (by
    convention `.fgx`). A dynamic batch's programs share their weights, which are stored once."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"path must be a file path, got {type(path).__name__}")
    where = os.fspath(path)
    if isinstance(program_or_compiled, DynamicBatchProgram):
        dynamic = program_or_compiled
        entries = [_compiled_entry(dynamic.programs[s], where, dynamic.tuned[s]) for s in dynamic.sizes]
        tensors = {k: v for _, t, _ in entries for k, v in t.items()}
        programs = [{"batch": s, **doc} for s, (doc, _, _) in zip(dynamic.sizes, entries)]
        options = dynamic.programs[dynamic.sizes[0]].source_options
        document = {"dynamic_batch": programs, "options": options}
        tuned = [dynamic.programs[s] for s in dynamic.sizes if dynamic.tuned[s]]
    elif isinstance(program_or_compiled, Program):
        doc, tensors = program_to_json(program_or_compiled, where)
        document, tuned = {"program": doc, "options": None, "configs": {}}, []
    elif getattr(program_or_compiled, "source_program", None) is not None:
        document, tensors, _ = _compiled_entry(program_or_compiled, where, True)
        document["options"] = program_or_compiled.source_options
        tuned = [program_or_compiled]
    else:
        raise ArgumentError("program_or_compiled must be a Program or what fusegraph.compile returned, "
                            f"got {type(program_or_compiled).__name__}")
    binaries, binary_tensors = gpu_binaries.for_save(tuned)
    if binaries is not None:
        document["binaries"] = binaries
    container.write(path, document, {**tensors, **binary_tensors})


def _compiled_entry(compiled: api.Compiled, where: str, tuned: bool) -> tuple[dict[str, Any], dict[str, np.ndarray], Any]:
    """The document of a compiled program (the program it was compiled from, the fused program
    of a gpu one when it can be stored, its kernels' configs: None for a size of a dynamic
    batch not tuned yet), its tensors, and the configs."""
    program = compiled.source_program
    if any(is_fused(i) for i in program.main):
        raise SavedProgramError(f"{where}: the program this was compiled from has been fused since (or was "
                                "fused when compiled); compile the unfused program and save that")
    doc, tensors = program_to_json(program, where)
    configs = {k.src.digest: dict(k.config) for k in getattr(compiled, "kernels", [])} if tuned else None
    document = {"program": doc, "configs": configs}
    fused = _fused_entry(compiled, where) if getattr(compiled, "kernels", None) is not None else None
    if fused is not None:
        document["fused"], fused_tensors = fused
        tensors = {**tensors, **fused_tensors}
    return document, tensors, configs


def _fused_entry(compiled: Any, where: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The fused program a gpu program compiled, as JSON and tensors; None when it does not
    come back from them as it is (an op whose attributes the file cannot spell): the load
    then fuses the unfused program again."""
    try:
        doc, tensors = program_to_json(compiled.program, where, fused=True)
        same = str(program_from_json(doc, tensors, where, fused=True)) == str(compiled.program)
    except SavedProgramError:
        return None
    return (doc, tensors) if same else None


def load(path: "str | os.PathLike[str]", verbose: bool = False) -> Union[Program, api.Compiled, DynamicBatchProgram]:
    """What `save` wrote: a Program, or the program(s) compiled again for its target and options.

    A gpu kernel whose regenerated source has no stored config (the file was written by a
    fusegraph that generates other kernels, or under Triton's interpreter and loaded on a GPU, or
    the reverse) is retuned: the whole program is tuned, as `compile` would tune it, and a
    warning says how many kernels had no config. On a GPU of the architecture (and Triton version)
    the file's binaries were compiled for, they are handed to Triton after their checks
    (targets/gpu/stored_binaries.py), so no kernel is compiled. `verbose` (or FUSEGRAPH_TIMING=1)
    prints the time of each phase of the load on stderr.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"path must be a file path, got {type(path).__name__}")
    with _collector_paused():
        return _load(path, os.fspath(path), Phases(verbose))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the load: the load allocates many objects
    that all live on (the programs, their kernels), and each full collection meanwhile scanned
    them and every module imported before (torch, Triton) for nothing, about 0.3 s in all for
    YOLOv5s on the CPU machine. The caller's setting comes back after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _load(path: "str | os.PathLike[str]", where: str, phases: Phases) -> Any:
    with phases.phase("read and check the file"):
        doc, tensors = container.read(path)
    options = _options(doc.get("options"), where)
    early = gpu_binaries.start_early(doc, options, tensors, where)
    if "dynamic_batch" in doc:
        loaded: Any = _load_dynamic(doc["dynamic_batch"], options, tensors, where, phases)
        programs = [loaded.programs[s] for s in loaded.sizes]
    else:
        try:
            program_doc, configs = doc["program"], doc["configs"]
        except (KeyError, TypeError):
            raise SavedProgramError(f"{where}: the document lacks its program, options or configs") from None
        with phases.phase("rebuild the program"):
            loaded = program_from_json(program_doc, tensors, where)
        if options is not None:
            fused = _fused(doc.get("fused"), options, tensors, where, phases)
            loaded = _compiled(loaded, options, configs, where, None, fused=fused, phases=phases)
        programs = [loaded]
    phases.notes.append(gpu_binaries.install_loaded(programs, doc.get("binaries"), tensors, where, phases, early))
    if "dynamic_batch" not in doc and gpu_binaries.has_binaries(loaded):
        loaded.prepare()  # the graph a run on NumPy inputs replays
        for step, seconds in loaded.last_capture.items():
            phases.add(f"{step} (the graph of NumPy inputs)", seconds)
    phases.report(where)
    return loaded


def _load_dynamic(entries: Any, options: Any, tensors: dict[str, np.ndarray], where: str,
                  phases: Phases) -> DynamicBatchProgram:
    if options is None or not isinstance(entries, list) or not entries or not all(
            isinstance(e, dict) and isinstance(e.get("batch"), int) and "program" in e and "configs" in e for e in entries):
        raise SavedProgramError(f"{where}: the dynamic batch's programs are malformed")
    weights = None
    if options["target"] == "gpu":
        from fusegraph.targets.gpu.compiled_program import WeightPool

        weights = WeightPool()
    programs, tuned = {}, {}
    for e in entries:
        at = f"{where}: batch {e['batch']}"
        with phases.phase(f"batch {e['batch']}: rebuild the program"):
            program = program_from_json(e["program"], tensors, at)
        fused = _fused(e.get("fused"), options, tensors, at, phases)
        with phases.phase(f"batch {e['batch']}: compile"):
            compiled = _compiled(program, options, e["configs"] or {}, where, weights, retune=False, fused=fused)
        configs = e["configs"] or {}
        programs[e["batch"]] = compiled
        tuned[e["batch"]] = e["configs"] is not None and all(k.src.digest in configs for k in getattr(compiled, "kernels", []))
    try:
        dynamic = DynamicBatchProgram(programs, lazy_tune=not all(tuned.values()))
    except ArgumentError as e:
        raise SavedProgramError(f"{where}: {e}") from None
    dynamic.tuned.update(tuned)
    return dynamic


def _options(options: Any, where: str) -> dict[str, Any] | None:
    if options is None:
        return None
    if not isinstance(options, dict) or options.get("target") not in api.TARGETS or not all(
            isinstance(options.get(k), bool) for k in _OPTIONS):
        raise SavedProgramError(f"{where}: bad compile options {options!r}")
    return options


def _fused(doc: Any, options: dict[str, Any], tensors: dict[str, np.ndarray], where: str,
           phases: Phases) -> Program | None:
    """The stored fused program of a gpu program, rebuilt and checked; None when the file has none."""
    if doc is None or options["target"] != "gpu":
        return None
    with phases.phase("rebuild the fused program"):
        return program_from_json(doc, tensors, f"{where}: fused program", fused=True)


def _compiled(program: Program, options: dict[str, Any], configs: Any, where: str, weights: Any,
              retune: bool = True, fused: Program | None = None, phases: Phases | None = None) -> api.Compiled:
    """`program` compiled for the stored target and options (from its stored `fused` form when
    given), each gpu kernel under its stored config; a program with kernels lacking one is
    tuned (`retune`) or left to a dynamic batch's lazy tuning."""
    flags = {k: options[k] for k in _OPTIONS}
    if options["target"] == "ref":
        return api.compile(program, "ref", **flags)
    timer = phases.phase if phases is not None else None
    compiled = api.compile(program, "gpu", **flags, tune=False, weights=weights, fused=fused, timer=timer)
    if not configs and not retune:
        return compiled
    if not _apply_configs(compiled, configs, where) and retune:
        from fusegraph.targets.gpu.compiler import tune_program

        tune_program(compiled)  # the program as compiled, tuned now: no second compile
    return compiled


def _apply_configs(compiled: Any, configs: Any, where: str) -> bool:
    """Set each kernel's stored config; False (nothing set) when some kernel has none stored."""
    if not isinstance(configs, dict):
        raise SavedProgramError(f"{where}: the kernel configs are not a mapping")
    missing = [k for k in compiled.kernels if k.src.digest not in configs]
    if missing:
        warnings.warn(f"{where}: {len(missing)} of {len(compiled.kernels)} kernels have no stored config "
                      f"(first: {missing[0].src.name}); retuning", stacklevel=3)
        return False
    for k in compiled.kernels:
        config = configs[k.src.digest]
        if config not in k.src.configs:
            raise SavedProgramError(f"{where}: the stored config {config} of kernel {k.src.name} is none of its candidates")
        k.config = dict(config)
    return True
