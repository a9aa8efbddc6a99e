"""Small ONNX graph builders shared by the tests."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(nodes: Sequence[onnx.NodeProto], inputs: dict[str, Sequence[int]], outputs: Sequence[str],
               initializers: dict[str, np.ndarray] | None = None, opset: int = 17,
               dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """A model with float inputs of fixed shapes and outputs of unknown shape."""
    graph = helper.make_graph(
        list(nodes), "test",
        [helper.make_tensor_value_info(k, dtype, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, dtype, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    # IR version 10: what ONNX Runtime 1.31 reads (onnx 1.23 would write a newer one)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible, decided without importing torch or triton."""
    import shutil
    from pathlib import Path

    return Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def ort_run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))
