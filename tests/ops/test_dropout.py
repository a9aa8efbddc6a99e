"""Dropout in training mode with ratio 0 drops nothing: the data and an all-true mask, as ONNX
Runtime gives; any other training ratio is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import parse_onnx
from fusegraph.errors import ParseError
from tests.ops.oracle import check_ref, model_of


def _model(ratio: float):
    x = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "m"], name="drop")
    return model_of([node], {"x": x}, ["y", "m"], {"r": np.array(ratio, np.float32), "t": np.array(True)}), {"x": x}


def test_training_with_ratio_zero():
    check_ref(*_model(0.0), rtol=0, atol=0)


def test_training_with_a_ratio_is_refused():
    model, _ = _model(0.5)
    with pytest.raises(ParseError, match="'drop'.*training_mode=true"):
        parse_onnx(model)
