"""YOLOv8's detection tail over three levels under Triton's interpreter (or on a GPU): the
softmax over the bins and their weighted sum run in each level's box conv kernel
(passes/sink_concat.py, passes/weighted_sum_epilogue.py), the class sigmoid in each class conv
kernel, the box arithmetic in one pointwise kernel that reads its concat as a select; every
buffer poisoned with NaN and every output compared with the NumPy ref target, in fp32 and fp16."""

from __future__ import annotations

import pytest

from tests.gpu.test_gpu_kernels import check_gpu, node
from tests.helpers import make_model, rand
from tests.passes.test_sink_concat import dfl_levels_model
from tests.passes.test_weighted_sum_epilogue import head_sum_model

HALF_TOL = 3e-3  # fp16 storage of fp32-computed values


@pytest.mark.parametrize("fp16", [False, True])
def test_the_three_level_dfl_tail_runs_in_the_head_conv_kernels(fp16):
    c = check_gpu(dfl_levels_model(), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    names = [k.src.kernel_name for k in c.kernels]
    assert sorted(names) == sorted(["conv_add_reshape_transpose_softmax"] * 3 + ["conv_add_reshape_sigmoid"] * 3
                                   + ["sub_add_div_concat_mul"])
    boxes = [k for k in c.kernels if k.src.kernel_name.endswith("softmax")]
    assert all({cfg["BN"] for cfg in k.src.configs} == {16} for k in boxes)  # a tile is one box side's 16 bins
    assert all("tl.sum(" in k.src.source for k in boxes)


@pytest.mark.parametrize("fp16", [False, True])
def test_a_one_column_product_sums_the_heads_in_the_first_products_epilogue(fp16):
    c = check_gpu(head_sum_model(), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert [k.src.kernel_name for k in c.kernels] == ["dot_reshape_softmax"]


@pytest.mark.parametrize("fp16", [False, True])
def test_a_pointwise_kernel_reads_a_concat_of_an_input_and_a_computed_part(fp16):
    """ViT's class token before the position embedding: concat(token, patches * 2) + pos, one
    kernel and no copy of the token."""
    m = make_model([node("Mul", ["x", "two"], ["p"]), node("Concat", ["t", "p"], ["c"], axis=1),
                    node("Add", ["c", "pos"], ["y"])],
                   {"x": [2, 5, 8], "t": [2, 1, 8]}, ["y"], {"two": rand(1, seed=1), "pos": rand(1, 6, 8, seed=2)})
    c = check_gpu(m, tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert [k.src.kernel_name for k in c.kernels] == ["mul_concat_add"]
