"""DepthToSpace and SpaceToDepth: view ops whose index map is a reshape-transpose-reshape.

The reference target is checked against ONNX Runtime; fused, a convolution followed by the
rearrangement and a pointwise op must be one kernel that stores through the inverse map.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import FusegraphError
from fusegraph.passes.pipeline import fuse
from fusegraph.targets.ref.runner import run_program
from tests.helpers import make_model, ort_run, rel_err

CASES = [("DepthToSpace", 2, "DCR", (1, 8, 3, 5)), ("DepthToSpace", 2, "CRD", (2, 12, 4, 3)),
         ("DepthToSpace", 3, "DCR", (1, 18, 2, 2)), ("SpaceToDepth", 2, None, (2, 3, 4, 6)),
         ("SpaceToDepth", 3, None, (1, 2, 6, 3))]


def _model(op: str, b: int, mode: str | None, shape: tuple[int, ...]):
    attrs = {"blocksize": b} | ({"mode": mode} if mode else {})
    return make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": shape}, ["y"])


@pytest.mark.parametrize("op,b,mode,shape", CASES)
def test_reference_matches_onnxruntime(op, b, mode, shape):
    model = _model(op, b, mode, shape)
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    (want,) = ort_run(model, {"x": x})
    got = run_program(parse_onnx(model), {"x": x})["y"]
    np.testing.assert_array_equal(got, want)  # a permutation: exact


@pytest.mark.parametrize("op,b,mode,shape", CASES)
def test_input_map_inverts(op, b, mode, shape):
    """The map reads each input element exactly once (bijective), as the ops' trait says."""
    program = parse_onnx(_model(op, b, mode, shape))
    view = next(i for i in program.main if i.op.kind.value == "view")
    m = view.op.input_map(view.inputs[0].shape.lens, view.shape.lens)
    assert view.op.bijective and m.inverse() is not None
    flat = np.arange(np.prod(shape)).reshape(shape)
    np.testing.assert_array_equal(view.op.reference([flat]), flat[tuple(np.asarray(i) for i in _gather(m))])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_inverts_depth_to_space(mode):
    """SpaceToDepth's mode attribute (opset 28) is newer than the ONNX Runtime the tests pin, so
    its CRD form is checked as the inverse of the DepthToSpace that ONNX Runtime checks."""
    from fusegraph.ops.views import DepthToSpace, SpaceToDepth

    x = np.random.default_rng().standard_normal((2, 3, 4, 6)).astype(np.float32)
    down = SpaceToDepth(2, mode).reference([x])
    assert down.shape == (2, 12, 2, 3)
    np.testing.assert_array_equal(DepthToSpace(2, mode).reference([down]), x)


def _gather(m):
    from fusegraph.ir.index_expr import evaluate

    grid = np.indices(m.out_lens, sparse=True)
    env = {v.name: g for v, g in zip(m.out_vars, grid)}
    return [np.broadcast_to(np.asarray(evaluate(e, env)), m.out_lens) for e in m.exprs]


def test_conv_epilogue_stores_through_the_rearrangement():
    rng = np.random.default_rng()
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("DepthToSpace", ["c"], ["d"], blocksize=2, mode="CRD"),
             helper.make_node("Sigmoid", ["d"], ["y"])]
    model = make_model(nodes, {"x": (1, 3, 5, 4)}, ["y"], {"w": w})
    x = rng.standard_normal((1, 3, 5, 4)).astype(np.float32)
    (want,) = ort_run(model, {"x": x})
    program = parse_onnx(model)
    fuse(program)
    kernels = [i for i in program.main if i.op.kind.value == "fused"]
    assert len(kernels) == 1, str(program)
    assert rel_err(run_program(program, {"x": x})["y"], want) < 1e-5


def test_bad_blocksize_names_the_node():
    model = make_model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=4, name="s2d")], {"x": (1, 2, 6, 6)}, ["y"])
    with pytest.raises(FusegraphError, match="s2d"):
        parse_onnx(model)
