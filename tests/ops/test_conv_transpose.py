"""ConvTranspose: an anchor lowered as an implicit GEMM that gathers the input pixel each output
tap comes from (masked where the stride does not divide the offset).

Checked against ONNX Runtime on fresh random float32 inputs, on the ref target (relative error
1e-5: both sum float32 products, in other orders) and on the gpu target under Triton's
interpreter (2e-5), alone and followed by BatchNormalization and Relu in the fused epilogue;
folding a batch norm or scale into the weights is checked on programs built here.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.errors import ParseError
from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Program
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.anchors import ConvTranspose
from fusegraph.ops.pointwise import BatchNorm
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.fold_into_weights import FoldIntoWeights
from fusegraph.passes.pipeline import fuse
from fusegraph.targets.ref.runner import run_program
from tests.helpers import assert_same_results, make_model, op_names, ort_run, rel_err

# fp32 sums in another order than ONNX Runtime's; the batch norm's scale and the relu's cut can lift
# the relative error of fresh random inputs past 1e-5 (1.3e-5 seen), so the bound leaves room
REF_TOL, GPU_TOL = 5e-5, 5e-5

# (input shape, output channels, kernel, attributes)
CASES = [
    ((1, 3, 4, 5), 4, (3, 3), {}),
    ((2, 4, 3, 4), 6, (3, 2), {"strides": [2, 2], "pads": [1, 0, 0, 1]}),
    ((1, 2, 4, 3), 3, (3, 3), {"strides": [3, 2], "output_padding": [2, 1]}),
    ((1, 4, 3, 3), 4, (2, 3), {"dilations": [2, 1], "strides": [2, 1], "pads": [0, 1, 1, 0]}),
    ((1, 4, 4, 4), 6, (3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 6, 3, 4), 6, (3, 3), {"group": 6, "strides": [2, 2]}),  # depthwise
    ((1, 3, 4, 3), 2, (3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    ((1, 3, 4, 3), 2, (4, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 2, 3, 3), 3, (3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    ((1, 2, 3, 3), 3, (3, 3), {"strides": [2, 2], "output_shape": [6, 5], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 7), 4, (3,), {"strides": [3], "pads": [1, 2], "dilations": [2], "output_padding": [1]}),  # 1-D
    ((1, 32, 3, 3), 8, (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # channels in chunks of 16: taps outermost
]


def _model(x_shape, cout, kernel, attrs, epilogue=False, seed=None):
    rng = np.random.default_rng(seed)
    g = attrs.get("group", 1)
    inits = {"w": (rng.standard_normal((x_shape[1], cout // g, *kernel)) * 0.3).astype(np.float32),
             "b": rng.standard_normal(cout).astype(np.float32)}
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c" if epilogue else "y"], **attrs)]
    if epilogue:
        for name in ("scale", "beta", "mean"):
            inits[name] = rng.standard_normal(cout).astype(np.float32)
        inits["var"] = rng.uniform(0.5, 2.0, cout).astype(np.float32)
        nodes += [helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["n"]),
                  helper.make_node("Relu", ["n"], ["y"])]
    return make_model(nodes, {"x": x_shape}, ["y"], inits)


def _x(shape):
    return np.random.default_rng().standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("x_shape,cout,kernel,attrs", CASES)
def test_ref_matches_onnxruntime(x_shape, cout, kernel, attrs, epilogue):
    model = _model(x_shape, cout, kernel, attrs, epilogue)
    x = _x(x_shape)
    (want,) = ort_run(model, {"x": x})
    program = parse_onnx(model)
    got = run_program(program, {"x": x})["y"]
    assert got.shape == want.shape
    assert rel_err(got, want) <= REF_TOL
    fuse(program)  # bias, batch norm and relu in the anchor's epilogue
    assert rel_err(run_program(program, {"x": x})["y"], want) <= REF_TOL


@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("x_shape,cout,kernel,attrs", CASES)
def test_gpu_matches_onnxruntime(x_shape, cout, kernel, attrs, epilogue):
    model = _model(x_shape, cout, kernel, attrs, epilogue)
    x = _x(x_shape)
    (want,) = ort_run(model, {"x": x})
    compiled = api.compile(parse_onnx(model), "gpu", tune=False)
    assert [k.src.template for k in compiled.kernels] == ["gemm"]  # one kernel, the epilogue fused
    compiled.poison()
    got = np.asarray(compiled.run({"x": x})["y"])
    assert not np.isnan(got).any()
    assert rel_err(got, want) <= GPU_TOL


def _transposed(group: int, epilogue: str) -> Program:
    """conv_transpose(x, W) followed by `epilogue`: a bias add and batch norm ("bn") or a
    per-channel scale ("mul"), the parameters broadcast to the output as the importer does."""
    rng = np.random.default_rng(11)
    p = Program()
    m = p.main
    x = add_param(m, "x", Shape.of(DType.float32, [1, 4, 3, 3]))
    w = add_literal(m, rng.standard_normal((4, 6 // group, 3, 3)).astype(np.float32))
    c = m.add(ConvTranspose((2, 2), (1, 1, 0, 0), (1, 1), group), [x, w])

    def const(v):
        return m.add(MultiBroadcast(c.shape.lens), [add_literal(m, v.reshape(1, 6, 1, 1).astype(np.float32))])

    if epilogue == "mul":
        out = m.add(make_op("mul"), [c, const(rng.standard_normal(6))])
    else:
        a = m.add(make_op("add"), [c, const(rng.standard_normal(6))])
        params = [rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(6), rng.uniform(0.5, 2, 6)]
        out = m.add(BatchNorm(1e-5), [a, *(const(v) for v in params)])
    m.set_returns([out], ["y"])
    return p


@pytest.mark.parametrize("epilogue", ["bn", "mul"])
@pytest.mark.parametrize("group", [1, 2])
def test_fold_into_weights_only_where_weights_list_every_channel(group, epilogue):
    """An ungrouped ConvTranspose takes the scale into its weights (axis 1); a grouped one,
    whose weight axis 1 holds one group's channels, keeps the epilogue. Either way the results
    stay those of the unfolded program (float32 weights rounded once: 1e-5)."""
    before, after = _transposed(group, epilogue), _transposed(group, epilogue)
    assert FoldIntoWeights().apply(after.main) == (group == 1)
    names = op_names(after.main)
    assert ("batch_norm" not in names and "mul" not in names) == (group == 1), names
    assert_same_results(before, after, tolerance=1e-5)


@pytest.mark.parametrize("attrs,message", [
    ({"output_padding": [2, 0], "strides": [2, 1]}, "output_padding"),
    ({"pads": [1, 1]}, "pads"),
    ({"auto_pad": "WRONG"}, "auto_pad"),
    ({"strides": [0, 1]}, "strides"),
    ({"output_shape": [30, 5]}, "output_shape"),
    ({"group": 3}, "group"),
    ({"kernel_shape": [2, 2]}, "kernel_shape"),
])
def test_bad_attributes_name_the_node(attrs, message):
    w = np.zeros((4, 2, 3, 3), np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up1", **attrs)
    with pytest.raises(ParseError, match=message) as err:
        parse_onnx(make_model([node], {"x": (1, 4, 3, 3)}, ["y"], {"w": w}))
    assert "up1" in str(err.value)
