"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against ONNX Runtime, with and without
class weights and ignore_index, every reduction, on the reference target unfused and fused and
on the gpu target under the interpreter. Ignored targets may lie outside the class range."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.ops.oracle import check_gpu, check_ref, model_of, needs_gpu_target

IGNORE = -1


def loss_case(op: str, reduction: str, weighted: bool, ignore: bool, rng, dims=(3,)):
    n, c = 4, 5
    x = rng.standard_normal((n, c, *dims)).astype(np.float32)
    target = rng.integers(0, c, (n, *dims)).astype(np.int64)
    if ignore:
        target.reshape(-1)[::3] = IGNORE
    inputs = {"x": x, "t": target}
    names = ["x", "t"]
    if weighted:
        inputs["w"] = rng.random(c).astype(np.float32) + 0.5
        names.append("w")
    attrs = {"reduction": reduction, **({"ignore_index": IGNORE} if ignore else {})}
    outputs = ["loss", "logp"] if op == "SoftmaxCrossEntropyLoss" else ["loss"]
    return model_of([helper.make_node(op, names, outputs, **attrs)], inputs, outputs), inputs


CASES = [(op, reduction, weighted, ignore) for op in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")
         for reduction in ("none", "sum", "mean") for weighted in (False, True) for ignore in (False, True)]


@pytest.mark.parametrize("op,reduction,weighted,ignore", CASES)
def test_loss_matches_onnxruntime(op, reduction, weighted, ignore):
    model, inputs = loss_case(op, reduction, weighted, ignore, np.random.default_rng())
    check_ref(model, inputs)


def test_loss_without_extra_dims():
    model, inputs = loss_case("SoftmaxCrossEntropyLoss", "mean", True, True, np.random.default_rng(), dims=())
    check_ref(model, inputs)


@needs_gpu_target
@pytest.mark.parametrize("op,reduction,weighted,ignore", [
    ("NegativeLogLikelihoodLoss", "mean", True, True), ("NegativeLogLikelihoodLoss", "none", False, False),
    ("SoftmaxCrossEntropyLoss", "sum", False, True), ("SoftmaxCrossEntropyLoss", "mean", True, False)])
def test_gpu_loss(op, reduction, weighted, ignore):
    model, inputs = loss_case(op, reduction, weighted, ignore, np.random.default_rng())
    check_gpu(model, inputs)
