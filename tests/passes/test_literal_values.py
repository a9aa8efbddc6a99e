"""Constant operands seen through broadcasts (passes/literal_values.py): the canonicalizing
passes ask for a literal's value at its reader's rank and whether it varies along one axis only."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.dtypes import DType
from fusegraph.ir.program import Module
from fusegraph.ir.shape import Shape
from fusegraph.ops import make_op
from fusegraph.ops.source import add_literal, add_param
from fusegraph.ops.views import MultiBroadcast
from fusegraph.passes.literal_values import broadcast_literal, per_channel
from tests.helpers import rand


def test_a_literal_is_read_through_a_chain_of_broadcasts_at_the_outer_rank():
    m = Module()
    v = rand(3, 1, seed=1)
    b = m.add(MultiBroadcast((1, 3, 4)), [m.add(MultiBroadcast((3, 4)), [add_literal(m, v)])])
    got = broadcast_literal(b)
    assert got.shape == (1, 3, 1)
    np.testing.assert_array_equal(got.reshape(3), v.reshape(3))


def test_a_computed_value_has_no_literal_value():
    m = Module()
    x = add_param(m, "x", Shape.of(DType.float32, [3]))
    assert broadcast_literal(x) is None
    assert broadcast_literal(m.add(MultiBroadcast((2, 3)), [m.add(make_op("neg"), [x])])) is None


def test_per_channel_values():
    c = rand(1, 3, 1, 1, seed=2)
    np.testing.assert_array_equal(per_channel(c, 4, 1, 3), c.reshape(3))
    np.testing.assert_array_equal(per_channel(np.full((1, 1, 1, 1), 2.0), 4, 1, 3), [2.0, 2.0, 2.0])
    assert per_channel(rand(1, 3, 2, 1, seed=3), 4, 1, 3) is None  # varies along a spatial axis too
    assert per_channel(c, 3, 1, 3) is None  # another rank
    assert per_channel(rand(1, 2, 1, 1, seed=4), 4, 1, 3) is None  # another channel count
    assert per_channel(None, 4, 1, 3) is None
