"""Triton's Python-backend model for fusegraph (what a repository's model.py imports).

Each instance compiles the model beside its model.py for the target its config names (on the
GPU Triton gives the instance) and runs it once before returning from `initialize`: Triton
reports the model ready only after that, so the first request finds it compiled and tuned.
`execute` receives what Triton's dynamic batcher gathered, runs the requests as one batch and
answers each with its own rows. Tensors cross the stub through DLPack (`dlpack_capsule` for
host arrays). On the gpu target they stay on the device: the inputs arrive there (the config
lets Triton place them on the GPU) and the answers are handed over there, so the stub copies
nothing to or from the host (a YOLOv5s batch of 32 is 157 MB in and 274 MB out).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fusegraph.driver.dlpack_capsule import capsule
from fusegraph.driver.serving_program import load_batched
from fusegraph.errors import FusegraphError


class TritonPythonModel:
    """The class Triton's Python backend looks for in model.py."""

    program: Any  # a BatchedProgram or a dynamic-batch program: run, input_specs, output_specs

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        target = params["fusegraph_target"]
        self.on_device = target == "gpu"  # tensors stay on the GPU: Triton moves them to and from its clients
        if self.on_device:
            import torch

            torch.cuda.set_device(int(args["model_instance_device_id"]))
        model = Path(args["model_repository"]) / args["model_version"] / params["fusegraph_model"]
        self.program = load_batched(model, target, params["fusegraph_fp16"] == "true", int(config["max_batch_size"]))
        self.program.run(_zeros(self.program, 1))  # warm-up
        if self.on_device:
            self.program.run_on_device(_device_zeros(self.program, 1))

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        names = list(self.program.input_specs)
        got = [[pb_utils.get_input_tensor_by_name(r, k) for k in names] for r in requests]
        try:
            outputs, sizes = (self._run_on_device if self.on_device else self._run_on_host)(names, got)
        except FusegraphError as e:
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))) for _ in requests]
        responses, start = [], 0
        for n in sizes:
            tensors = [pb_utils.Tensor.from_dlpack(k, _capsule(outputs[k][start:start + n]))
                       for k in self.program.output_specs]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += n
        return responses

    def _run_on_host(self, names: list[str], got: list[list[Any]]) -> tuple[dict[str, Any], list[int]]:
        per_request = [{k: np.from_dlpack(t) for k, t in zip(names, ts)} for ts in got]
        joined = per_request[0] if len(per_request) == 1 else {
            k: np.concatenate([x[k] for x in per_request]) for k in names}
        outputs = self.program.run(joined)
        declared = {k: dtype for k, (dtype, _) in self.program.output_specs.items()}
        return {k: outputs[k].astype(d, copy=False) for k, d in declared.items()}, [len(x[names[0]]) for x in per_request]

    def _run_on_device(self, names: list[str], got: list[list[Any]]) -> tuple[dict[str, Any], list[int]]:
        """Each request's tensors (on the GPU where Triton put them there, else moved there part by
        part) joined on the device; the answers stay there for Triton to copy to its clients."""
        import torch

        per_request = [{k: torch.from_dlpack(t).to("cuda") for k, t in zip(names, ts)} for ts in got]
        joined = per_request[0] if len(per_request) == 1 else {
            k: torch.cat([x[k] for x in per_request]) for k in names}
        return self.program.run_on_device(joined), [int(x[names[0]].shape[0]) for x in per_request]

    def finalize(self) -> None:
        self.program = None  # type: ignore[assignment]


def _zeros(program: Any, batch: int) -> dict[str, np.ndarray]:
    return {k: np.zeros((batch, *shape), dtype) for k, (dtype, shape) in program.input_specs.items()}


def _device_zeros(program: Any, batch: int) -> dict[str, Any]:
    import torch

    return {k: torch.from_numpy(v).to("cuda") for k, v in _zeros(program, batch).items()}


def _capsule(value: Any) -> Any:
    """A DLPack capsule of an answer: a host array through `dlpack_capsule`, a device tensor through torch."""
    if isinstance(value, np.ndarray):
        return capsule(value)
    from torch.utils.dlpack import to_dlpack

    return to_dlpack(value)
