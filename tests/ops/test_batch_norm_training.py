"""BatchNormalization with training_mode=1 against ONNX Runtime: the output normalized by the
batch's per-channel mean and biased variance, and the running mean and variance updated by
momentum, for [N, C], [N, C, L] and [N, C, H, W] inputs, on the reference target unfused and
fused and on the gpu target under the interpreter (float32 sums in other orders: 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import ParseError
from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target


def case(shape, **attrs):
    rng = np.random.default_rng()
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    params = {"s": rng.standard_normal(c), "b": rng.standard_normal(c), "m": rng.standard_normal(c),
              "v": rng.uniform(0.5, 2, c)}
    feeds = {"x": x, **{k: p.astype(np.float32) for k, p in params.items()}}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1, **attrs)
    return model_of([node], feeds, ["y", "rm", "rv"], opset=15), feeds


@pytest.mark.parametrize("shape,attrs", [((2, 3, 4, 5), {}), ((4, 6), dict(momentum=0.7, epsilon=1e-2)),
                                         ((3, 2, 7), dict(momentum=0.0))])
def test_training_mode(shape, attrs):
    check_ref(*case(shape, **attrs), rtol=1e-5, atol=1e-5)


@needs_gpu_target
def test_gpu_training_mode():
    check_gpu(*case((2, 3, 4, 5), momentum=0.8), rtol=1e-5, atol=1e-5)


def test_bad_training_mode_names_the_node():
    model, _ = case((2, 3, 4))
    model.graph.node[0].name = "bn1"
    model.graph.node[0].attribute[0].i = 2
    with pytest.raises(ParseError, match="training_mode") as err:
        parse_onnx(model)
    assert "bn1" in str(err.value)
