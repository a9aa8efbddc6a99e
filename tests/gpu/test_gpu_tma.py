"""Product operands read through tensor descriptors (the TMA of Hopper GPUs, opt-in with
FUSEGRAPH_TMA=1), under Triton's interpreter (or on a GPU): which operands qualify, and the
results against the NumPy ref target on fresh random inputs, fp32 and fp16, under several
configs."""

from __future__ import annotations

import numpy as np
import pytest

from fusegraph import api, parse_onnx
from fusegraph.errors import FusegraphError
from tests.gpu.test_gpu_kernels import check_gpu, node
from tests.helpers import make_model, rand, rel_err

HALF_TOL = 3e-3


def two_products(m: int, k: int, n: int):
    """x @ w1 (A the caller's input), then its result @ w2 + b (A an intermediate)."""
    return make_model([node("MatMul", ["x", "w1"], ["h"]), node("Reshape", ["h", "flat"], ["h2"]),
                       node("Gemm", ["h2", "w2", "b"], ["y"])],
                      {"x": [1, m, 24]}, ["y"],
                      {"w1": rand(24, k, seed=1), "w2": rand(k, n, seed=2), "b": rand(n, seed=3),
                       "flat": np.array([m, k], np.int64)})


def descriptors(compiled) -> list[list[str]]:
    """Per kernel, the operands it reads through a tensor descriptor."""
    return [[key for key in ("a", "b") if f"{key}_desc = tl.make_tensor_descriptor" in k.src.body] for k in compiled.kernels]


@pytest.fixture
def tma(monkeypatch):
    monkeypatch.setenv("FUSEGRAPH_TMA", "1")


@pytest.mark.parametrize("fp16", [False, True])
def test_products_read_their_operands_through_descriptors(tma, fp16):
    """50 rows (a partial row tile) and k = 40 (a partial k chunk): the TMA's zero fill stands
    for the masks."""
    c = check_gpu(two_products(50, 40, 48), tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    assert descriptors(c) == [["a", "b"], ["a", "b"]]
    assert all(k.src.tensor_descriptors for k in c.kernels)


@pytest.mark.parametrize("fp16", [False, True])
def test_every_candidate_config_computes_the_same_product(tma, fp16):
    """Each tile shape and split-k factor the tuner may pick, the descriptors' blocks with it."""
    program = parse_onnx(two_products(70, 512, 80))
    compiled = api.compile(program, "gpu", tune=False, fp16=fp16)
    rng = np.random.default_rng(7)
    inputs = {"x": rng.standard_normal((1, 70, 24)).astype(np.float32)}
    want = api.run(program, inputs)["y"]
    bound = compiled.bind(inputs, capture=False)
    kernel = compiled.kernels[1]
    splits = [c for c in kernel.src.configs if c["SPLIT"] > 1][:1]
    assert splits  # a long k loop on few tiles
    for config in kernel.src.configs[:3] + splits:
        compiled.poison()
        bound.launch(0)
        bound.launch(kernel, config)
        got = bound.outputs()["y"].float().cpu().numpy()
        assert rel_err(got, want) <= (HALF_TOL if fp16 else 2e-5), config


def test_unaligned_rows_keep_pointer_loads(tma):
    """fp16 rows of 36 elements (72 bytes) are not 16-byte aligned: the TMA cannot step over
    them (w1 [24, 36] and the intermediate [20, 36]); x's rows of 24 and w2's of 16 are."""
    c = check_gpu(two_products(20, 36, 16), tolerance=HALF_TOL, fp16=True)
    assert descriptors(c) == [["a"], ["b"]]


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_batched_product_of_two_intermediates_offsets_each_batch(tma, fp16, transposed):
    """Both operands of a per-head product come from other products: each batch's descriptor
    starts at `gz` times the batch's size. Transposed, B is read [BN, BK] (its k axis
    contiguous) and turned in the kernel."""
    if transposed:  # k [128, 32] as [4, 32, 32], transposed; k is returned, so its layout stays
        views = [node("Reshape", ["k", "s32"], ["k3"]), node("Transpose", ["k3"], ["kt"], perm=[0, 2, 1])]
    else:  # k [128, 32] as [4, 32, 32]
        views = [node("Reshape", ["k", "s32"], ["kt"])]
    m = make_model([node("MatMul", ["x", "wq"], ["q"]), node("MatMul", ["z", "wk"], ["k"]),
                    node("Reshape", ["q", "s16"], ["q3"]), *views, node("MatMul", ["q3", "kt"], ["y"])],
                   {"x": [1, 64, 16], "z": [1, 128, 16]}, ["y", "k"],
                   {"wq": rand(16, 32, seed=1), "wk": rand(16, 32, seed=2),
                    "s16": np.array([4, 16, 32], np.int64), "s32": np.array([4, 32, 32], np.int64)})
    c = check_gpu(m, tolerance=HALF_TOL if fp16 else 2e-5, fp16=fp16)
    body = c.kernels[-1].src.body
    assert descriptors(c)[-1] == ["a", "b"]
    assert "(512 * gz)" in body.split("a_desc = ")[1].split("\n")[0] and "(1024 * gz)" in body.split("b_desc = ")[1].split("\n")[0]
    assert ("block_shape=[BN, BK]" in body and "b_desc.load([pid_n * BN, k0])" in body) == transposed


def test_an_input_tensor_at_an_unaligned_address_is_copied(tma):
    """A descriptor's base must be 16-byte aligned: a caller's view that starts 4 bytes into its
    storage is read through an aligned copy, and the result is still right."""
    import torch

    program = parse_onnx(two_products(50, 40, 48))
    compiled = api.compile(program, "gpu", tune=False)
    x = np.random.default_rng(3).standard_normal((1, 50, 24)).astype(np.float32)
    storage = torch.empty(1 + x.size, dtype=torch.float32, device="cuda" if torch.cuda.is_available() else "cpu")
    view = storage[1:].view(1, 50, 24)
    view.copy_(torch.from_numpy(x))
    assert view.data_ptr() % 16
    got = compiled.run({"x": view})["y"].float().cpu().numpy()
    assert rel_err(got, api.run(program, {"x": x})["y"]) <= 2e-5


def test_a_convolution_window_keeps_pointer_loads(tma):
    m = make_model([node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                   {"x": [1, 16, 6, 6]}, ["y"], {"w": rand(16, 16, 3, 3, seed=1)})
    c = check_gpu(m, tolerance=2e-5)
    assert descriptors(c) == [["b"]] or descriptors(c) == [[]]
    assert "a_desc" not in c.kernels[0].src.body


@pytest.mark.parametrize("setting", [None, "0"])
def test_off_by_default_and_a_bad_setting(monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv("FUSEGRAPH_TMA", raising=False)
    else:
        monkeypatch.setenv("FUSEGRAPH_TMA", setting)
    c = check_gpu(two_products(50, 40, 48), tolerance=2e-5)
    assert descriptors(c) == [[], []] and not any(k.src.tensor_descriptors for k in c.kernels)
    monkeypatch.setenv("FUSEGRAPH_TMA", "yes")
    with pytest.raises(FusegraphError, match="FUSEGRAPH_TMA='yes'"):
        api.compile(parse_onnx(two_products(50, 40, 48)), "gpu", tune=False)


def _ptx_copies(job) -> tuple[bool, bool]:
    """Whether the sm_90 PTX of (source, argument types) has bulk tensor copies and 16-byte
    asynchronous copies (run in a process without the interpreter switch)."""
    from fusegraph.targets.gpu.ahead_of_time import build_for

    ptx = build_for(*job).asm["ptx"]
    return "cp.async.bulk.tensor" in ptx, "cp.async.cg" in ptx


def test_the_descriptor_loads_build_for_sm90_as_tma_copies(tma):
    """Built for the H200 without a GPU, the product's operand chunks are bulk tensor copies,
    and no 16-byte asynchronous copies are left."""
    pytest.importorskip("triton")
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from fusegraph.ir.dtypes import DType
    from fusegraph.ops.base import is_fused
    from fusegraph.passes.pipeline import fuse
    from fusegraph.passes.to_half import ToHalf
    from fusegraph.targets.gpu.ahead_of_time import _without_interpreter, arg_dtypes
    from fusegraph.targets.gpu.codegen import generate, kernel_inputs, plan_program

    program = parse_onnx(two_products(256, 384, 512))
    ToHalf(DType.float16).apply(program.main)
    fuse(program)
    plan = plan_program(program.main)
    ins = [i for i in program.main if is_fused(i)][1]
    src = generate(ins, 1, kernel_inputs(ins, plan))
    assert src.tensor_descriptors
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_without_interpreter) as pool:
        bulk, cp_async = pool.submit(_ptx_copies, (src, arg_dtypes(ins, src))).result()
    assert bulk and not cp_async
