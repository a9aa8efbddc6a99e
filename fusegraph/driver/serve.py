"""`fusegraph serve`: a model behind NVIDIA Triton Inference Server (KServe v2 HTTP and gRPC,
health and metrics endpoints, dynamic batching), started from Python or the command line.

    server = serve("model.onnx", target="ref", port=8000, max_batch=8)
    ...                                   # POST http://127.0.0.1:8000/v2/models/model/infer
    server.stop()

The model repository is written to a fresh directory (`triton_repository`), and the Triton
server of the nvidia-pytriton wheel runs on it (`triton_server`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from fusegraph.driver.triton_repository import model_name, write_repository
from fusegraph.driver.triton_server import TritonServer, wheel_dirs
from fusegraph.errors import ArgumentError


def serve(model: str, *, host: str = "127.0.0.1", port: int = 8000, grpc_port: int | None = None,
          metrics_port: int | None = None, max_batch: int = 32, gpus: Sequence[int] = (0,), target: str = "gpu",
          fp16: bool = False, name: str | None = None, timeout: float = 600.0, instances: int = 1) -> TritonServer:
    """Serve `model` (an .onnx path, a zoo name or a .fgx file) and return once Triton reports it
    ready, each instance compiled and warmed up: one instance per GPU in `gpus` on the gpu
    target, one CPU instance on the ref target, each `instances` times. The returned server's
    `model` is its name."""
    wheel_dirs()  # says what to install before anything is compiled
    if target == "gpu":
        from fusegraph.targets.gpu.availability import require_gpu_device

        require_gpu_device("serve --target gpu")
        if not gpus:
            raise ArgumentError("serving on the gpu target needs at least one GPU in gpus")
    repository = Path(tempfile.mkdtemp(prefix="fusegraph-repository-"))
    name = name or model_name(model)
    write_repository(model, repository, target=target, fp16=fp16, max_batch=max_batch, gpus=list(gpus), name=name,
                     instances=instances)
    server = TritonServer(repository, host=host, port=port, grpc_port=grpc_port, metrics_port=metrics_port,
                          device_pools=list(gpus) if target == "gpu" else None)
    server.model = name
    server.cleanup.append(repository)
    return server.start(timeout)
