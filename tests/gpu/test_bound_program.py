"""The compiled program's public launch boundary (BoundProgram) and its scratch buffers.

Under Triton's interpreter (or on a GPU if present): a conv + relu and a matrix product with
split-k forced are bound to fresh random inputs, their kernels launched one by one through the
binding, and the outputs compared with the NumPy reference target (conv) and float64 NumPy
(matrix product), relative norm error at most 2e-5 (fp32 products, exact or ieee). The split-k
scratch of the memory plan must be a pair of buffers with ids of their own, sized for the
largest need of any config; the kernels leave the tile counters zeroed.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.targets.gpu.memory_plan import BufferKind
from fusegraph.targets.gpu.templates.gemm_emit import workspace_elements
from tests.helpers import make_model, rand, rel_err

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

TOL = 2e-5


def _conv_relu():
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                    helper.make_node("Relu", ["c"], ["y"])],
                   {"x": [1, 4, 6, 6]}, ["y"], {"w": rand(8, 4, 3, 3, seed=1, scale=0.3), "b": rand(8, seed=2)})
    return parse_onnx(m)


def _matmul(w: np.ndarray):
    m = make_model([helper.make_node("MatMul", ["a", "w"], ["y"])], {"a": [4, w.shape[0]]}, ["y"], {"w": w})
    return parse_onnx(m)


def test_launch_all_computes_the_conv_and_relu() -> None:
    program = _conv_relu()
    compiled = api.compile(program, "gpu", tune=False)
    x = np.random.default_rng().standard_normal((1, 4, 6, 6)).astype(np.float32)
    bound = compiled.bind({"x": x})
    assert compiled.bound is bound
    compiled.poison()
    bound.launch_all()
    got = bound.outputs()["y"].cpu().numpy()
    assert rel_err(got, api.run(program, {"x": x})["y"]) <= TOL


def test_kernels_launch_by_position_or_by_kernel_on_their_argument_lists() -> None:
    program = _conv_relu()
    compiled = api.compile(program, "gpu", tune=False)
    x = torch.from_numpy(np.random.default_rng().standard_normal((1, 4, 6, 6)).astype(np.float32))
    bound = compiled.bind({"x": x})
    want = api.run(program, {"x": x.numpy()})["y"]
    for i, k in enumerate(compiled.kernels):
        assert len(bound.args(i)) == len(k.src.args) and bound.args(k) is bound.args(i)
    compiled.poison()
    for k in compiled.kernels:
        bound.launch(k)
    assert rel_err(bound.outputs()["y"].cpu().numpy(), want) <= TOL
    compiled.poison()
    for i in range(len(compiled.kernels)):
        bound.launch(i, compiled.kernels[i].config)
    assert rel_err(bound.outputs()["y"].cpu().numpy(), want) <= TOL
    other = api.compile(_conv_relu(), "gpu", tune=False)
    with pytest.raises(ValueError, match="not one of this program's"):
        bound.launch(other.kernels[0])
    with pytest.raises(IndexError):
        bound.launch(len(compiled.kernels))


def test_split_k_matmul_through_the_binding_resets_its_counters() -> None:
    rng = np.random.default_rng()
    w = (rng.standard_normal((1024, 16)) * 0.05).astype(np.float32)
    compiled = api.compile(_matmul(w), "gpu", tune=False)
    (k,) = compiled.kernels
    split = [c for c in k.src.configs if c["SPLIT"] > 1]
    assert split, k.src.configs
    k.config = split[0]
    for _ in range(2):  # the second run relies on the first leaving the scratch clean
        a = rng.standard_normal((4, 1024)).astype(np.float32)
        bound = compiled.bind({"a": torch.from_numpy(a)})
        compiled.poison()
        bound.launch_all()
        got = bound.outputs()["y"].cpu().numpy()
        assert rel_err(got, a.astype(np.float64) @ w.astype(np.float64)) <= TOL
    assert not bound.tensor(compiled.plan.scratch["cnt"]).any()


def test_scratch_buffers_have_ids_of_their_own_and_the_largest_need() -> None:
    compiled = api.compile(_matmul(rand(1024, 16, seed=3)), "gpu", tune=False)
    plan = compiled.plan
    ids = [b.id for b in plan.buffers]
    assert len(set(ids)) == len(ids) and min(ids) >= 0
    scratch = [b for b in plan.buffers if b.kind == BufferKind.SCRATCH]
    assert sorted(b.name for b in scratch) == ["cnt", "ws"]
    assert [b.id for b in plan.scratch.values()] == [b.id for b in scratch]
    need = [workspace_elements(k.src, c) for k in compiled.kernels for c in k.src.configs]
    assert max(n for n, _ in need) > 0
    assert plan.scratch["ws"].shape.lens == (max(n for n, _ in need),)
    assert plan.scratch["cnt"].shape.lens == (max(t for _, t in need),)
    assert plan.scratch["ws"].shape.dtype.numpy == np.float32 and plan.scratch["cnt"].shape.dtype.numpy == np.int32
    (k,) = compiled.kernels
    named = [plan.scratch[a].id for a in k.src.args if a in plan.scratch]
    assert [b.id for b in k.args if b.kind == BufferKind.SCRATCH] == named and named
    bound = compiled.bind({"a": rand(4, 1024, seed=4)})
    assert bound.tensor(plan.scratch["ws"]).numel() == plan.scratch["ws"].shape.elements


def test_outputs_and_replay_need_bound_inputs() -> None:
    compiled = api.compile(_conv_relu(), "gpu", tune=False)
    with pytest.raises(RuntimeError, match="bind inputs first"):
        compiled.outputs()
    with pytest.raises(RuntimeError, match="bind inputs first"):
        compiled.replay()
