"""The benchmarks' PyTorch model (bench/torch_reference.py) computes what fusegraph's NumPy reference computes.

The torch contenders of bench/ are only a fair comparison if they run the same function as
fusegraph. These tests run the generated module and the ref target (`fusegraph.run`, the NumPy oracle) on fresh
random inputs, in float32 on the CPU, for YOLOv5s (160x160), two light_* models and small
graphs that reach the translation's less common paths (asymmetric and ceil-mode pooling,
resize modes, negative-step slices, reflect padding, ...). Tolerance, elementwise:
|torch - numpy| <= 1e-3 + 1e-4 |numpy| and a relative norm error under 2e-5 (both compute
in float32; measured about 1e-6). Each seed is printed in the failure message.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")

from bench.torch_reference import TorchReferenceError, build_module  # noqa: E402
from fusegraph import api, parse_onnx  # noqa: E402
from fusegraph.driver.inputs import random_inputs  # noqa: E402
from fusegraph.passes.pipeline import fuse  # noqa: E402
from tests.helpers import make_model, rel_err  # noqa: E402

RTOL, ATOL, MAX_REL_NORM = 1e-4, 1e-3, 2e-5


def _random(program, scale: float = 1.0) -> tuple[int, dict[str, np.ndarray]]:
    seed = secrets.randbits(32)
    inputs = random_inputs(program.input_shapes, seed)
    return seed, {k: (v * scale if v.dtype.kind == "f" else v) for k, v in inputs.items()}


def _check(program, seed: int, inputs: dict[str, np.ndarray], want: dict[str, np.ndarray], idioms: bool,
           channels_last: bool = False) -> None:
    module = build_module(program, idioms=idioms)
    feed = {k: torch.from_numpy(v) for k, v in inputs.items()}
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
        feed = {k: v.contiguous(memory_format=torch.channels_last) for k, v in feed.items()}
    with torch.no_grad():
        got = module.run(feed)
    assert list(got) == list(want)
    for name, ref in want.items():
        out = got[name].numpy()
        assert out.shape == ref.shape, f"{name}: shape {out.shape} != {ref.shape} (seed {seed})"
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=f"{name} (seed {seed})")
        if np.issubdtype(ref.dtype, np.floating):
            assert rel_err(out, ref) < MAX_REL_NORM, f"{name}: relative norm error {rel_err(out, ref):.2e} (seed {seed})"


def _compare(program, scale: float = 1.0, modes: tuple[bool, ...] = (True, False), channels_last: bool = False) -> None:
    """Module == NumPy reference on one fresh random input, with idioms and without."""
    seed, inputs = _random(program, scale)
    want = api.run(program, inputs)
    for idioms in modes:
        _check(program, seed, inputs, want, idioms)
    if channels_last:
        _check(program, seed, inputs, want, True, channels_last=True)


@pytest.fixture(scope="module")
def yolov5s_160():
    return parse_onnx("yolov5s-160")


def test_yolov5s_160(yolov5s_160) -> None:
    # channels_last too: the model holds 5-d constants (the grids), which must stay as they are
    _compare(yolov5s_160, channels_last=True)


@pytest.mark.parametrize("model", ["light_shufflenet", "light_inception_v1"])
def test_light_models(model: str) -> None:
    # shufflenet: grouped convs, channel shuffle (reshape/transpose), BN, average pooling;
    # inception_v1: LRN, asymmetric average pooling (the general path), concat, Gemm
    _compare(parse_onnx(model), modes=(True,))


def test_one_graph_for_torch_compile(yolov5s_160) -> None:
    """The generated forward has no Python control flow: dynamo captures it whole."""
    module = build_module(yolov5s_160)
    x = torch.rand(*yolov5s_160.input_shapes["images"].lens)
    explained = torch._dynamo.explain(module)(x)
    torch._dynamo.reset()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def _graph(nodes, inputs, outputs, inits=None, opset=17):
    return parse_onnx(make_model(nodes, inputs, outputs, inits or {}, opset=opset))


def test_pooling_paths() -> None:
    n = helper.make_node
    program = _graph([
        n("MaxPool", ["x"], ["a"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1),
        n("MaxPool", ["x"], ["b"], kernel_shape=[2, 3], strides=[1, 2], pads=[1, 1, 1, 1], dilations=[2, 1]),
        n("AveragePool", ["x"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
          count_include_pad=1),
        n("AveragePool", ["x"], ["d"], kernel_shape=[3, 2], strides=[2, 1], pads=[0, 1, 2, 0]),
        n("GlobalAveragePool", ["x"], ["e"]),
    ], {"x": [2, 3, 10, 9]}, ["a", "b", "c", "d", "e"])
    _compare(program)


def test_resize_paths() -> None:
    n = helper.make_node
    inits = {"s2": np.array([1, 1, 2, 2], np.float32), "s15": np.array([1, 1, 1.5, 2.5], np.float32)}
    program = _graph([
        n("Resize", ["x", "", "s2"], ["a"], mode="nearest", coordinate_transformation_mode="asymmetric",
          nearest_mode="floor"),
        n("Resize", ["x", "", "s15"], ["b"], mode="nearest"),
        n("Resize", ["x", "", "s15"], ["c"], mode="linear"),
        n("Resize", ["x", "", "s2"], ["d"], mode="linear", coordinate_transformation_mode="align_corners"),
    ], {"x": [1, 2, 6, 5]}, ["a", "b", "c", "d"], inits)
    code = build_module(program).code
    assert "F.interpolate" in code  # the 2x floor upsample takes torch's own kernel
    _compare(program)


def test_movement_and_pointwise_paths() -> None:
    n = helper.make_node
    inits = {
        "starts": np.array([-1, 4], np.int64), "ends": np.array([-100, 0], np.int64),
        "axes": np.array([1, 3], np.int64), "steps": np.array([-1, -2], np.int64),
        "pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
        "idx": np.array([[0, -1], [2, 1]], np.int64),
        "lo": np.array(-0.5, np.float32), "hi": np.array(0.75, np.float32),
        "two": np.full((1, 4, 5, 6), 2.0, np.float32),
        "raxes": np.array([1, 3], np.int64),
    }
    program = _graph([
        n("Slice", ["x", "starts", "ends", "axes", "steps"], ["a"]),
        n("Pad", ["x", "pads"], ["b"], mode="reflect"),
        n("Pad", ["x", "pads"], ["b2"], mode="edge"),
        n("Gather", ["x", "idx"], ["c"], axis=2),
        n("LRN", ["x"], ["d"], size=4, alpha=0.5, beta=0.75, bias=1.5),
        n("Clip", ["x", "lo", "hi"], ["e"]),
        n("Sub", ["two", "x"], ["f"]),
        n("Div", ["x", "two"], ["g"]),
        n("LeakyRelu", ["x"], ["h"], alpha=0.1),
        n("Softmax", ["x"], ["i"], axis=3),
        n("ReduceMax", ["x", "raxes"], ["j"], keepdims=0),
        n("ReduceProd", ["x", "raxes"], ["k"], keepdims=1),
        n("ArgMax", ["x"], ["l"], axis=2, select_last_index=1),
        n("Flatten", ["x"], ["m"], axis=2),
    ], {"x": [1, 4, 5, 6]}, ["a", "b", "b2", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m"], inits,
        opset=18)  # ReduceMax and ReduceProd take their axes as an input from opset 18
    _compare(program, scale=2.0)


def test_unsupported_ops_are_named() -> None:
    program = _graph([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 2, 3, 3]}, ["y"])
    fuse(program)
    with pytest.raises(TorchReferenceError, match="fused"):
        build_module(program)
