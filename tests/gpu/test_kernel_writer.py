"""The kernel writer's code for one tile (targets/gpu/kernel_writer.py): index sums grouped by
tile axis, masks joined per axis, and the test that merged concat stores cover their range.
Each grouped expression is evaluated with NumPy broadcasting and compared with the plain one."""

from __future__ import annotations

import numpy as np

from fusegraph.ir.index_expr import evaluate
from fusegraph.targets.gpu.kernel_writer import Tile, _cover, var

RM, RK = var("rm", 100), var("rk", 72)


def gemm_tile() -> Tile:
    return Tile({"rm": "rm[:, None]", "rk": "rk[None, :]", "tap": "tap"}, {"rm": "(rm[:, None] < 100)", "rk": None})


def run(code: str, tap: int = 2) -> np.ndarray:
    rm, rk = np.arange(100), np.arange(72)
    return eval(code, {"rm": rm, "rk": rk, "tap": tap})


def test_im2col_address_is_grouped_by_axis_and_keeps_its_value():
    tap, rm = var("tap", 9), var("rm", 102400)
    # the first convolution's address: channel, kernel row and column from rk; pixel from rm
    e = 409600 * (RK // 36) + 1280 * (rm // 320) + 640 * ((RK // 6) % 6) + 2 * (rm % 320) + RK % 6 + 3 * tap - 1282
    tile = gemm_tile()
    code = tile.code(e)
    # one sum of two groups: the rk part (with the scalar tap and the constant) and the rm part
    assert code.count("rk[None, :]") == 3 and code.count("rm[:, None]") == 2
    assert code.startswith("((") and ") + (" in code
    pixels = np.arange(0, 102400, 997)
    want = evaluate(e, {"rm": pixels[:, None], "rk": np.arange(72)[None, :], "tap": 2})
    np.testing.assert_array_equal(eval(code, {"rm": pixels, "rk": np.arange(72), "tap": 2}), want)


def test_single_axis_sums_are_left_as_they_are():
    tile = gemm_tile()
    assert tile.code(512 * RM + 7) == "(512 * rm[:, None] + 7)"


def test_range_conditions_compare_the_whole_sum():
    e = 2 * (RM // 10) + RK % 6 - 2
    conds = gemm_tile().range_conds(e, 0, 18)
    assert len(conds) == 2
    got = run(" & ".join(conds))
    want = evaluate(e, {"rm": np.arange(100)[:, None], "rk": np.arange(72)[None, :]})
    np.testing.assert_array_equal(got, (want >= 0) & (want < 18))


def test_a_range_condition_on_scalars_alone_is_a_one_element_tensor():
    """`tap < 2` alone: Triton's interpreter rejects `tensor & scalar` in a mask."""
    tap = var("tap", 9)
    (cond,) = gemm_tile().range_conds(tap, 0, 2)
    assert cond == "(tl.full([1], 1, tl.int1) & (tap < 2))"
    (tile_cond,) = gemm_tile().range_conds(RM + tap, 0, 100)
    assert "tl.full" not in tile_cond


def test_conjunction_joins_each_axis_first_and_scalars_last():
    tile = gemm_tile()
    code = tile.conjunction(["(rm[:, None] < 100)", "last", "(rk[None, :] < 70)", "(rm[:, None] >= 3)", "last"])
    assert code == "(rk[None, :] < 70) & ((rm[:, None] < 100) & (rm[:, None] >= 3)) & last"
    last = np.ones((1, 1), bool)
    got = eval(code, {"rm": np.arange(100), "rk": np.arange(72), "last": last})
    want = (np.arange(72)[None, :] < 70) & (np.arange(100)[:, None] >= 3)
    np.testing.assert_array_equal(got, want)


def test_concat_pieces_cover_their_range_only_without_gaps():
    c = var("c", 85)
    x = c % 85
    assert _cover([[(x, 0, 2)], [(x, 2, 4)], [(x, 4, 85)]])
    assert not _cover([[(x, 0, 2)], [(x, 3, 85)]])  # column 2 is written by nobody
    assert not _cover([[(x, 0, 2)], [(x, 2, 80)]])  # the last columns are not written
    assert not _cover([[(x, 0, 2), (x, 0, 85)], [(x, 2, 85)]])  # two ranges in one piece: not judged
