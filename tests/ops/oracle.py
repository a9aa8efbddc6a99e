"""What the op tests of the coverage work share: a one-node model with inputs of any element
type, and the checks of fusegraph against ONNX Runtime on both targets.

`check_ref` runs the reference target unfused and fused; `check_gpu` the gpu target (Triton's
interpreter without a GPU) with NaN-poisoned buffers. Both compare with `np.testing` at the
given tolerance (exactly for integers).
"""

from __future__ import annotations

import importlib.util
from typing import Sequence

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from fusegraph import api, parse_onnx
from fusegraph.passes.pipeline import fuse
from fusegraph.targets.ref.runner import run_program
from tests.helpers import ort_run

needs_gpu_target = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None,
    reason="the gpu target needs torch and triton (the 'gpu' extra)")


def model_of(nodes: Sequence[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: Sequence[str],
             initializers: dict[str, np.ndarray] | None = None, opset: int = 18) -> onnx.ModelProto:
    """A model whose graph inputs take the shapes and element types of `inputs`."""
    graph = helper.make_graph(
        list(nodes), "test",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [onnx.ValueInfoProto(name=o) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _compare(got: dict, want: Sequence[np.ndarray], names: Sequence[str], rtol: float, atol: float) -> None:
    for name, w in zip(names, want):
        g = np.asarray(got[name])
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, err_msg=name)


def check_ref(model: onnx.ModelProto, inputs: dict[str, np.ndarray], rtol: float = 1e-5,
              atol: float = 1e-6) -> list[np.ndarray]:
    """ONNX Runtime's outputs, matched by the reference target unfused and fused; returns them.
    The program is read for the inputs' shapes (a declared 0 would otherwise read as unknown)."""
    want = ort_run(model, inputs)
    names = [o.name for o in model.graph.output]
    program = parse_onnx(model, input_dims={k: v.shape for k, v in inputs.items()})
    _compare(run_program(program, inputs), want, names, rtol, atol)
    fuse(program)
    _compare(run_program(program, inputs), want, names, rtol, atol)
    return want


def check_gpu(model: onnx.ModelProto, inputs: dict[str, np.ndarray], rtol: float = 1e-5,
              atol: float = 1e-6) -> None:
    """ONNX Runtime's outputs, matched by the gpu target (every kernel's buffers NaN-poisoned)."""
    want = ort_run(model, inputs)
    names = [o.name for o in model.graph.output]
    compiled = api.compile(parse_onnx(model, input_dims={k: v.shape for k, v in inputs.items()}), "gpu", tune=False)
    compiled.poison()
    _compare(compiled.run(inputs), want, names, rtol, atol)
