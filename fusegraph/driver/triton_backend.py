"""Triton's Python-backend model for fusegraph (what a repository's model.py imports).

Each instance compiles the model beside its model.py for the target its config names (on the
GPU Triton gives the instance) and runs it once before returning from `initialize`: Triton
reports the model ready only after that, so the first request finds it compiled and tuned.
`execute` receives what Triton's dynamic batcher gathered, runs the requests as one batch and
answers each with its own rows. Tensors cross the stub through DLPack (`dlpack_capsule`).
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
        if target == "gpu":
            import torch

            torch.cuda.set_device(int(args["model_instance_device_id"]))
        model = Path(args["model_repository"]) / args["model_version"] / params["fusegraph_model"]
        self.program = load_batched(model, target, params["fusegraph_fp16"] == "true", int(config["max_batch_size"]))
        self.program.run(_zeros(self.program, 1))  # warm-up

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        names = list(self.program.input_specs)
        per_request = [{k: np.from_dlpack(pb_utils.get_input_tensor_by_name(r, k)) for k in names} for r in requests]
        sizes = [len(x[names[0]]) for x in per_request]
        try:
            joined = per_request[0] if len(requests) == 1 else {
                k: np.concatenate([x[k] for x in per_request]) for k in names}
            outputs = self.program.run(joined)
        except FusegraphError as e:
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))) for _ in requests]
        responses, start = [], 0
        for n in sizes:
            tensors = [pb_utils.Tensor.from_dlpack(k, capsule(outputs[k][start:start + n].astype(dtype, copy=False)))
                       for k, (dtype, _) in self.program.output_specs.items()]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += n
        return responses

    def finalize(self) -> None:
        self.program = None  # type: ignore[assignment]


def _zeros(program: Any, batch: int) -> dict[str, np.ndarray]:
    return {k: np.zeros((batch, *shape), dtype) for k, (dtype, shape) in program.input_specs.items()}
