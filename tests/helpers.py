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


def embedding_model(vocab: int = 50, types: int = 4, seq: int = 8, width: int = 32) -> onnx.ModelProto:
    """BERT's embeddings in small: word and token-type rows gathered by int64 ids [2, seq], their
    sum plus a position table, then a layernorm over `width`."""
    nodes = [helper.make_node("Gather", ["word", "ids"], ["w"]), helper.make_node("Gather", ["types", "tt"], ["t"]),
             helper.make_node("Add", ["w", "t"], ["s"]), helper.make_node("Add", ["s", "pos"], ["e"]),
             helper.make_node("LayerNormalization", ["e", "g", "b"], ["y"], axis=-1)]
    tables = {"word": rand(vocab, width, seed=1), "types": rand(types, width, seed=2), "pos": rand(1, seq, width, seed=3),
              "g": rand(width, seed=4), "b": rand(width, seed=5)}
    ids = [helper.make_tensor_value_info(k, TensorProto.INT64, [2, seq]) for k in ("ids", "tt")]
    graph = helper.make_graph(nodes, "embeddings", ids, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in tables.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def conv_silu_add_model(seed: int) -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv 3x3 (bias, weights from `seed`) -> SiLU -> + y broadcast per channel:
    one anchor with an epilogue and a side input, the smallest model that exercises a fused kernel."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Add", ["m", "y"], ["out"])]
    return make_model(nodes, {"x": [1, 3, 8, 8], "y": [1, 4, 1, 1]}, ["out"], {"w": w, "b": b})


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


def op_names(module) -> list[str]:
    """The op names of a module's instructions in order: the structure a pass test compares."""
    return [ins.op.name for ins in module]


def printed(module) -> list[str]:
    """A module's printed lines, for comparing short programs exactly."""
    return str(module).splitlines()


def fresh_inputs(program, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """New standard-normal inputs for every parameter (floats) or small integers, drawn anew on
    each call unless `rng` is given, so a pass test checks more than one fixed point."""
    rng = rng or np.random.default_rng()
    out: dict[str, np.ndarray] = {}
    for name, shape in program.input_shapes.items():
        dt = shape.dtype.numpy
        if shape.dtype.is_float:
            out[name] = rng.standard_normal(shape.lens).astype(dt)
        else:
            out[name] = rng.integers(0, 4, shape.lens).astype(dt)
    return out


def assert_same_results(before, after, tolerance: float = 0.0, inputs: dict[str, np.ndarray] | None = None) -> None:
    """Run both programs on the ref target with the same fresh inputs (cast to each program's
    parameter types) and require every output within `tolerance` relative error."""
    from fusegraph.targets.ref.runner import run_program

    inputs = inputs if inputs is not None else fresh_inputs(before)

    def run(program):
        shapes = program.input_shapes
        return run_program(program, {k: np.asarray(v).astype(shapes[k].dtype.numpy) for k, v in inputs.items()})

    want, got = run(before), run(after)
    assert list(got) == list(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        assert not np.isnan(got[name]).any() or np.isnan(want[name]).any(), f"{name}: NaN only after the pass"
        assert rel_err(got[name], want[name]) <= tolerance, (name, rel_err(got[name], want[name]))
