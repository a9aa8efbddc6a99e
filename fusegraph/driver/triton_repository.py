"""A Triton Inference Server model repository for a fusegraph model.

    DIR/NAME/config.pbtxt      inputs and outputs, dynamic batching, one instance per GPU
    DIR/NAME/1/model.py        Triton's Python backend entry point: fusegraph's TritonPythonModel
    DIR/NAME/1/model.onnx      the model (or model.fgx, a saved fusegraph program)

`fusegraph serve` writes one and runs the Triton server shipped in the nvidia-pytriton wheel on
it; a user with a Triton server of their own points it at the same directory (the Python
backend's environment must have fusegraph installed).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fusegraph.errors import ArgumentError

#: Triton's data types by NumPy dtype
TRITON_TYPES = {np.dtype(k): v for k, v in {
    "float32": "TYPE_FP32", "float16": "TYPE_FP16", "float64": "TYPE_FP64", "int64": "TYPE_INT64",
    "int32": "TYPE_INT32", "int16": "TYPE_INT16", "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL",
}.items()}

MODEL_PY = '''"""Triton Python-backend entry point: fusegraph compiles the model beside this file and serves it."""

from fusegraph.driver.triton_backend import TritonPythonModel  # noqa: F401
'''


def model_name(source: str) -> str:
    """A Triton model name from a model path or zoo name: its stem, other characters as `_`."""
    stem = Path(str(source)).name
    for suffix in (".onnx", ".fgx"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "model"


def write_repository(source: str, directory: "str | Path", *, target: str = "gpu", fp16: bool = False,
                     max_batch: int = 32, gpus: Sequence[int] = (0,), name: str | None = None,
                     queue_delay_us: int = 200, instances: int = 1) -> Path:
    """Write the repository of `source` (an .onnx path, a zoo name or a .fgx file) under
    `directory`; returns the model's directory. The model's inputs and outputs, read here, must
    each have the batch first; config.pbtxt declares one sample's shape. `instances` model
    instances run per GPU (or on the CPU): while one waits on its copies, another runs."""
    if target not in ("ref", "gpu"):
        raise ArgumentError(f"unknown target {target!r}; serving runs on 'ref' or 'gpu'")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ArgumentError(f"max_batch must be a positive integer, got {max_batch!r}")
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ArgumentError(f"instances must be a positive integer, got {instances!r}")
    name = name or model_name(source)
    model_dir = Path(directory) / name
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    file_name, inputs, outputs = _copy_model(source, version)
    (version / "model.py").write_text(MODEL_PY)
    params = {"fusegraph_model": file_name, "fusegraph_target": target, "fusegraph_fp16": str(bool(fp16)).lower()}
    if target == "gpu":  # Triton hands the inputs over on the GPU (the backend runs on device tensors)
        params["FORCE_CPU_ONLY_INPUT_TENSORS"] = "no"
    text = config_text(name, inputs, outputs, max_batch, [] if target == "ref" else list(gpus), params, queue_delay_us,
                       instances)
    (model_dir / "config.pbtxt").write_text(text)
    return model_dir


def _copy_model(source: str, version: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Put the model in the version directory; its file name and the shapes of its inputs and
    outputs (dtype, full shape) read from its program."""
    import fusegraph
    from fusegraph import api
    from fusegraph.onnx.loader import load_model

    if str(source).lower().endswith(".fgx"):
        shutil.copyfile(source, version / "model.fgx")
        loaded = fusegraph.load(version / "model.fgx")
        program = _declared_program(loaded) if api.compiled_target(loaded) else loaded
        file_name = "model.fgx"
    else:
        model = load_model(source)
        (version / "model.onnx").write_bytes(model.SerializeToString())
        program = fusegraph.parse_onnx(model)
        file_name = "model.onnx"
    main = program.main
    inputs = {k: (s.dtype.numpy, list(s.lens)) for k, s in program.input_shapes.items()}
    outputs = {k: (r.shape.dtype.numpy, list(r.shape.lens)) for k, r in zip(main.return_names, main.returns)}
    return file_name, inputs, outputs


def _declared_program(compiled: Any) -> Any:
    """The program a saved compiled program was compiled from: the server declares its dtypes,
    since a half-precision program takes float32 inputs and returns float32 outputs (it converts
    inside); a dynamic batch declares its largest size's."""
    programs = getattr(compiled, "programs", None)  # a dynamic batch: one program per size
    if programs:
        compiled = programs[max(programs)]
    return compiled.source_program


def config_text(name: str, inputs: dict[str, Any], outputs: dict[str, Any], max_batch: int, gpus: list[int],
                params: dict[str, str], queue_delay_us: int, instances: int = 1) -> str:
    """config.pbtxt: Triton's dynamic batcher gathers requests up to `max_batch` samples; one
    instance per listed GPU, or one CPU instance when there are none (the ref target), each
    `instances` times."""
    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {max_batch}"]
    lines += ["input ["] + _tensors(inputs) + ["]", "output ["] + _tensors(outputs) + ["]"]
    lines += [f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}"]
    groups = [f"  {{ kind: KIND_GPU count: {instances} gpus: [ {g} ] }}" for g in gpus] or \
        [f"  {{ kind: KIND_CPU count: {instances} }}"]
    lines += ["instance_group ["] + [",\n".join(groups)] + ["]"]
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    return "\n".join(lines) + "\n"


def _tensors(specs: dict[str, Any]) -> list[str]:
    out = []
    for k, (dtype, shape) in specs.items():
        if dtype not in TRITON_TYPES:
            raise ArgumentError(f"{k}: dtype {dtype} has no Triton data type")
        if len(shape) < 2:
            raise ArgumentError(f"{k}: shape {shape} has no dimensions after the batch to serve")
        dims = ", ".join(map(str, shape[1:]))
        out.append(f'  {{ name: "{k}" data_type: {TRITON_TYPES[np.dtype(dtype)]} dims: [ {dims} ] }}')
    return [",\n".join(out)]
