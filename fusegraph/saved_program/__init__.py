"""Save a program, or what `fusegraph.compile` made of it, to one .fgx file, and load it back.

    fusegraph.save(fusegraph.compile(program, target="gpu", fp16=True), "model.fgx")
    compiled = fusegraph.load("model.fgx")  # compiled again for gpu, fp16, with the stored configs

A file holds the unfused program (JSON and safetensors arrays, see program_json and container),
the compile options and, for the gpu target, each kernel's config by the digest of its source.
Kernels are never read from a file: loading compiles the program again, which regenerates the
same sources, and sets each kernel's stored config instead of tuning it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Union

from fusegraph import api
from fusegraph.errors import ArgumentError, SavedProgramError
from fusegraph.ir.program import Program
from fusegraph.ops.base import is_fused
from fusegraph.saved_program import container
from fusegraph.saved_program.program_json import program_from_json, program_to_json

_OPTIONS = ("fp16", "bf16", "allow_tf32")


def save(program_or_compiled: Union[Program, api.Compiled], path: "str | os.PathLike[str]") -> None:
    """Write a Program (unfused) or a compiled program to `path` (by convention `.fgx`)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"path must be a file path, got {type(path).__name__}")
    where = os.fspath(path)
    if isinstance(program_or_compiled, Program):
        program, options, configs = program_or_compiled, None, {}
    elif getattr(program_or_compiled, "source_program", None) is not None:
        program = program_or_compiled.source_program
        options = program_or_compiled.source_options
        if any(is_fused(i) for i in program.main):
            raise SavedProgramError(f"{where}: the program this was compiled from has been fused since (or was "
                                    "fused when compiled); compile the unfused program and save that")
        configs = {k.src.digest: dict(k.config) for k in getattr(program_or_compiled, "kernels", [])}
    else:
        raise ArgumentError("program_or_compiled must be a Program or what fusegraph.compile returned, "
                            f"got {type(program_or_compiled).__name__}")
    doc, tensors = program_to_json(program, where)
    container.write(path, {"program": doc, "options": options, "configs": configs}, tensors)


def load(path: "str | os.PathLike[str]") -> Union[Program, api.Compiled]:
    """What `save` wrote: a Program, or the program compiled again for its target and options.

    A gpu kernel whose regenerated source has no stored config (the file was written by a
    fusegraph that generates other kernels, or under Triton's interpreter and loaded on a GPU, or
    the reverse) is retuned: the whole program is compiled with tuning, as `compile` would, and a
    warning says how many kernels had no config.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"path must be a file path, got {type(path).__name__}")
    where = os.fspath(path)
    doc, tensors = container.read(path)
    try:
        program_doc, options, configs = doc["program"], doc["options"], doc["configs"]
    except (KeyError, TypeError):
        raise SavedProgramError(f"{where}: the document lacks its program, options or configs") from None
    program = program_from_json(program_doc, tensors, where)
    if options is None:
        return program
    if not isinstance(options, dict) or options.get("target") not in api.TARGETS or not all(
            isinstance(options.get(k), bool) for k in _OPTIONS):
        raise SavedProgramError(f"{where}: bad compile options {options!r}")
    flags = {k: options[k] for k in _OPTIONS}
    if options["target"] == "ref":
        return api.compile(program, "ref", **flags)
    compiled = api.compile(program, "gpu", **flags, tune=False)
    if _apply_configs(compiled, configs, where):
        return compiled
    return api.compile(program, "gpu", **flags, tune=True)


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
