"""Save a program, or what `fusegraph.compile` made of it, to one .fgx file, and load it back.

    fusegraph.save(fusegraph.compile(program, target="gpu", fp16=True), "model.fgx")
    compiled = fusegraph.load("model.fgx")  # compiled again for gpu, fp16, with the stored configs

A dynamic-batch program (fusegraph.dynamic_batch) is saved as one program per size, its
weights once (tensors are named by their content).

A file holds the unfused program (JSON and safetensors arrays, see program_json and container),
the compile options and, for the gpu target, each kernel's config by the digest of its source
and, when saved on a GPU, each kernel's compiled binary for that GPU (kernel_binaries,
gpu_binaries). Kernel source is never read from a file: loading compiles the program again,
which regenerates the same sources, and sets each kernel's stored config instead of tuning it;
a stored binary is handed to Triton only for the regenerated kernel it was compiled from.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Union

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
        programs = [{"batch": s, "program": doc, "configs": configs} for s, (doc, _, configs) in zip(dynamic.sizes, entries)]
        options = dynamic.programs[dynamic.sizes[0]].source_options
        document = {"dynamic_batch": programs, "options": options}
        tuned = [dynamic.programs[s] for s in dynamic.sizes if dynamic.tuned[s]]
    elif isinstance(program_or_compiled, Program):
        doc, tensors = program_to_json(program_or_compiled, where)
        document, tuned = {"program": doc, "options": None, "configs": {}}, []
    elif getattr(program_or_compiled, "source_program", None) is not None:
        doc, tensors, configs = _compiled_entry(program_or_compiled, where, True)
        document = {"program": doc, "options": program_or_compiled.source_options, "configs": configs}
        tuned = [program_or_compiled]
    else:
        raise ArgumentError("program_or_compiled must be a Program or what fusegraph.compile returned, "
                            f"got {type(program_or_compiled).__name__}")
    binaries, binary_tensors = gpu_binaries.for_save(tuned)
    if binaries is not None:
        document["binaries"] = binaries
    container.write(path, document, {**tensors, **binary_tensors})


def _compiled_entry(compiled: api.Compiled, where: str, tuned: bool) -> tuple[dict[str, Any], dict[str, np.ndarray], Any]:
    """The program a compiled program was compiled from, its tensors and its kernels' configs
    (None for a size of a dynamic batch not tuned yet)."""
    program = compiled.source_program
    if any(is_fused(i) for i in program.main):
        raise SavedProgramError(f"{where}: the program this was compiled from has been fused since (or was "
                                "fused when compiled); compile the unfused program and save that")
    doc, tensors = program_to_json(program, where)
    configs = {k.src.digest: dict(k.config) for k in getattr(compiled, "kernels", [])} if tuned else None
    return doc, tensors, configs


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
    where = os.fspath(path)
    phases = Phases(verbose)
    with phases.phase("read and check the file"):
        doc, tensors = container.read(path)
    options = _options(doc.get("options"), where)
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
            with phases.phase("compile (fuse, generate kernels, upload weights)"):
                loaded = _compiled(loaded, options, configs, where, None)
        programs = [loaded]
    with phases.phase("kernel binaries"):
        phases.notes.append(gpu_binaries.install_loaded(programs, doc.get("binaries"), tensors, where))
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
        with phases.phase(f"batch {e['batch']}: rebuild the program"):
            program = program_from_json(e["program"], tensors, f"{where}: batch {e['batch']}")
        with phases.phase(f"batch {e['batch']}: compile"):
            compiled = _compiled(program, options, e["configs"] or {}, where, weights, retune=False)
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


def _compiled(program: Program, options: dict[str, Any], configs: Any, where: str, weights: Any,
              retune: bool = True) -> api.Compiled:
    """`program` compiled for the stored target and options, each gpu kernel under its stored
    config; a program with kernels lacking one is tuned (`retune`) or left to a
    dynamic batch's lazy tuning."""
    flags = {k: options[k] for k in _OPTIONS}
    if options["target"] == "ref":
        return api.compile(program, "ref", **flags)
    compiled = api.compile(program, "gpu", **flags, tune=False, weights=weights)
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
