"""Re-batching a model and one compile for a range of batch sizes.

Answers are checked against ONNX Runtime running each sample alone through the model as it was
exported (batch 1), so neither the re-batching nor the padding is trusted: a padded sample
leaking into an answer, or a Reshape left at batch 1, shows as a wrong number or shape.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fusegraph
from fusegraph.dynamic_batch import DynamicBatchProgram, batch_sizes
from fusegraph.errors import ArgumentError, InputError
from fusegraph.onnx.rebatch import batched_inputs, with_batch
from tests.helpers import conv_silu_add_model, make_model, rel_err

SQUEEZENET_DIMS = {"data_0": [1, 3, 64, 64]}  # global average pooling: any image size works


def with_dims(model: onnx.ModelProto, dims: dict[str, list[int]]) -> onnx.ModelProto:
    """A copy of `model` declaring `dims` for its inputs and leaving its outputs' shapes open (for ONNX Runtime)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in out.graph.input:
        if value.name in dims:
            for d, n in zip(value.type.tensor_type.shape.dim, dims[value.name]):
                d.Clear()
                d.dim_value = n
    for value in out.graph.output:
        value.type.tensor_type.ClearField("shape")
    return out


def per_sample(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's outputs of the batch-1 `model`, one sample at a time, stacked."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    batch = next(iter(inputs.values())).shape[0]
    runs = [session.run(None, {k: v[i:i + 1] for k, v in inputs.items()}) for i in range(batch)]
    return [np.concatenate(parts) for parts in zip(*runs)]


def reshape_head_model() -> onnx.ModelProto:
    """x[1,6] -> Reshape to the literal [1, 2, 3] (as exporters write the traced batch) -> + w,
    where w[1,3] is a weight reshaped from [3] by a constant [1, 3] that must keep its 1."""
    nodes = [helper.make_node("Constant", [], ["s"], value=helper.make_tensor("sv", TensorProto.INT64, [3], [1, 2, 3])),
             helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("Constant", [], ["ws"], value=helper.make_tensor("wv", TensorProto.INT64, [2], [1, 3])),
             helper.make_node("Reshape", ["w", "ws"], ["w2"]),
             helper.make_node("Add", ["r", "w2"], ["out"])]
    return make_model(nodes, {"x": [1, 6]}, ["out"], {"w": np.arange(3, dtype=np.float32)})


def test_batch_sizes_are_the_ends_and_the_powers_of_two_between() -> None:
    assert batch_sizes(1, 32) == [1, 2, 4, 8, 16, 32]
    assert batch_sizes(3, 20) == [3, 4, 8, 16, 20]
    assert batch_sizes(5, 5) == [5]
    for bad in ((0, 4), (4, 2), (1.5, 4), (True, 2)):
        with pytest.raises(ArgumentError, match="batch range"):
            batch_sizes(*bad)


def test_with_batch_rebatches_traced_reshapes_and_keeps_weight_reshapes() -> None:
    model = reshape_head_model()
    x = np.random.default_rng().standard_normal((5, 6)).astype(np.float32)
    got = fusegraph.run(fusegraph.parse_onnx(model, batch=5), {"x": x})["out"]
    want = x.reshape(5, 2, 3) + np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(got, want)
    assert [d.dim_value for d in with_batch(model, 5).graph.input[0].type.tensor_type.shape.dim] == [5, 6]


def class_token_model() -> onnx.ModelProto:
    """x[1, 4, 8] (patch tokens) -> Concat along the tokens with a class token [1, 1, 8]
    expanded to the traced batch of 1 by a constant shape, as timm's vision transformers export
    it, -> + a position table [1, 5, 8] -> Relu."""
    nodes = [helper.make_node("Constant", [], ["cs"], value=helper.make_tensor("csv", TensorProto.INT64, [3], [1, -1, -1])),
             helper.make_node("Abs", ["cs"], ["shape"]),  # a computed shape, as the exporter's Where chain is
             helper.make_node("Expand", ["cls", "shape"], ["c"]),
             helper.make_node("Concat", ["c", "x"], ["t"], axis=1),
             helper.make_node("Add", ["t", "pos"], ["p"]), helper.make_node("Relu", ["p"], ["out"])]
    rng = np.random.default_rng(4)
    return make_model(nodes, {"x": [1, 4, 8]}, ["out"],
                      {"cls": rng.standard_normal((1, 1, 8)).astype(np.float32),
                       "pos": rng.standard_normal((1, 5, 8)).astype(np.float32)})


def test_a_class_token_joins_every_sample_of_a_rebatched_model() -> None:
    model = class_token_model()
    x = np.random.default_rng().standard_normal((3, 4, 8)).astype(np.float32)
    got = fusegraph.run(fusegraph.parse_onnx(model, batch=3), {"x": x})["out"]
    assert got.shape == (3, 5, 8)
    assert rel_err(got, per_sample(model, {"x": x})[0]) < 1e-6
    assert [n.op_type for n in with_batch(model, 3).graph.node].count("Expand") == 2  # the token broadcast to 3


def assembled_target_model() -> onnx.ModelProto:
    """x[1, 4, 6] reshaped to [1, 4 / 2, 2, 6], its target a Concat of the literal [1] and
    parts computed from x's shape, as Swin's window partitions export."""
    def const(name, values):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name + "v", TensorProto.INT64, [len(values)], values))

    nodes = [helper.make_node("Shape", ["x"], ["sh"]), const("one", [1]), const("i1", [1]), const("two", [2]),
             const("six", [6]), helper.make_node("Gather", ["sh", "i1"], ["rows"]),
             helper.make_node("Div", ["rows", "two"], ["half"]),
             helper.make_node("Concat", ["one", "half", "two", "six"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]), helper.make_node("Relu", ["r"], ["out"])]
    return make_model(nodes, {"x": [1, 4, 6]}, ["out"])


def test_a_reshape_target_assembled_from_a_literal_batch_is_rebatched() -> None:
    model = assembled_target_model()
    x = np.random.default_rng().standard_normal((3, 4, 6)).astype(np.float32)
    got = fusegraph.run(fusegraph.parse_onnx(model, batch=3), {"x": x})["out"]
    np.testing.assert_array_equal(got, np.maximum(x.reshape(3, 2, 2, 6), 0))


def test_rebatched_transformers_parse() -> None:
    for name in ("vit_small_patch16_224", "swin_tiny_patch4_window7_224"):
        assert fusegraph.parse_onnx(name, batch=2).input_shapes["input"].lens == (2, 3, 224, 224)


def test_a_symbolic_batch_is_rebatched_and_a_fixed_one_refused() -> None:
    symbolic = make_model([helper.make_node("Relu", ["x"], ["out"])], {"x": ["N", 4]}, ["out"])
    assert batched_inputs(symbolic) == ["x"]
    assert fusegraph.parse_onnx(symbolic, batch=7).input_shapes["x"].lens == (7, 4)
    fixed = make_model([helper.make_node("Relu", ["x"], ["out"])], {"x": [8, 4]}, ["out"])
    with pytest.raises(ArgumentError, match=r"no input has a first dimension of 1 or a symbolic one.*x \[8, 4\]"):
        fusegraph.parse_onnx(fixed, batch=2)
    with pytest.raises(ArgumentError, match="a batch of 3, but batch=2"):
        fusegraph.parse_onnx(symbolic, input_dims={"x": [3, 4]}, batch=2)


def test_one_compile_answers_batches_1_3_17_32_on_the_ref_target() -> None:
    dynamic = fusegraph.compile_dynamic_batch("light_squeezenet", (1, 32), "ref", input_dims=SQUEEZENET_DIMS)
    assert dynamic.sizes == (1, 2, 4, 8, 16, 32) and dynamic.max_batch == 32
    assert dynamic.input_specs == {"data_0": (np.dtype(np.float32), (3, 64, 64))}
    reference = with_dims(fusegraph.zoo.load("light_squeezenet"), SQUEEZENET_DIMS)
    rng = np.random.default_rng()
    for batch in (1, 3, 17, 32):
        x = {"data_0": rng.random((batch, 3, 64, 64), dtype=np.float32)}
        got = dynamic.run(x)["softmaxout_1"]
        assert got.shape == (batch, 1000, 1, 1)
        assert got.flags.owndata or batch in dynamic.sizes  # a padded answer is a copy, not a view of the padding
        assert rel_err(got, per_sample(reference, x)[0]) < 1e-5, batch


def test_one_compile_answers_batches_1_3_17_32_on_the_gpu_target_under_the_interpreter() -> None:
    model = conv_silu_add_model(2)
    dynamic = fusegraph.compile_dynamic_batch(model, (1, 32), "gpu")
    assert dynamic.sizes == (1, 2, 4, 8, 16, 32) and dynamic.target == "gpu"
    rng = np.random.default_rng()
    for batch in (1, 3, 17, 32):
        x = {"x": rng.standard_normal((batch, 3, 8, 8), dtype=np.float32),
             "y": rng.standard_normal((batch, 4, 1, 1), dtype=np.float32)}
        got = dynamic.run(x)["out"]
        assert got.shape == (batch, 4, 8, 8)
        assert rel_err(got, per_sample(model, x)[0]) < 1e-5, batch
    weights = [_conv_weight(p) for p in dynamic.programs.values()]
    assert len(set(weights)) == 1  # one device copy of the conv weights for every size


def _conv_weight(compiled) -> int:
    """The device address of the conv weight [4, 3, 3, 3] (the literals of batch-sized shapes differ per size)."""
    from fusegraph.targets.gpu.memory_plan import BufferKind

    (buffer,) = [b for b in compiled.plan.buffers if b.kind == BufferKind.LITERAL and b.shape.elements == 4 * 3 * 3 * 3]
    return compiled._tensors[buffer.id].data_ptr()


def test_specs_give_the_compiled_dtypes() -> None:
    dynamic = fusegraph.compile_dynamic_batch(conv_silu_add_model(6), (1, 2), "ref", fp16=True)
    assert dynamic.input_specs["x"] == (np.dtype(np.float16), (3, 8, 8))
    assert dynamic.output_specs == {"out": (np.dtype(np.float16), (4, 8, 8))}
    x = {"x": np.ones((2, 3, 8, 8), np.float32), "y": np.ones((2, 4, 1, 1), np.float32)}
    assert dynamic.run(x)["out"].dtype == np.float16


@pytest.mark.parametrize("target", ["ref", "gpu"])
def test_a_half_precision_batch_answers_in_the_model_s_dtypes_when_asked(target) -> None:
    """What a server of an fp16 program needs: float32 in (of any batch, padded), float32 out
    (converted on the device for the gpu target), every sample within fp16's error of the
    model run sample by sample, and the model's own dtypes in `model_specs`."""
    model = conv_silu_add_model(2)
    dynamic = fusegraph.compile_dynamic_batch(model, (1, 4), target, fp16=True)
    ins, outs = dynamic.model_specs()
    assert ins["x"] == (np.dtype(np.float32), (3, 8, 8)) and outs == {"out": (np.dtype(np.float32), (4, 8, 8))}
    rng = np.random.default_rng()
    for batch in (1, 3, 4):
        x = {"x": rng.standard_normal((batch, 3, 8, 8), dtype=np.float32),
             "y": rng.standard_normal((batch, 4, 1, 1), dtype=np.float32)}
        got = dynamic.run(x, output_dtypes={"out": np.float32})["out"]
        assert got.dtype == np.float32 and got.shape == (batch, 4, 8, 8)
        assert rel_err(got, per_sample(model, x)[0]) < 2e-3, batch
        again = dynamic.run(x, output_dtypes={"out": np.float32})["out"]
        assert np.array_equal(got, again) and not np.shares_memory(got, again)  # each answer is the caller's own


def test_device_tensors_run_without_the_host_and_give_new_tensors() -> None:
    """`run_on_device` (what a server's GPU instance calls): torch tensors in, in float32 for an
    fp16 program, new tensors out in the asked dtype, equal to `run`'s NumPy answers; a wrong
    sample shape is an InputError naming the input."""
    import torch

    model = conv_silu_add_model(2)
    dynamic = fusegraph.compile_dynamic_batch(model, (1, 4), "gpu", fp16=True)
    rng = np.random.default_rng()
    x = {"x": rng.standard_normal((3, 3, 8, 8), dtype=np.float32), "y": rng.standard_normal((3, 4, 1, 1), dtype=np.float32)}
    want = dynamic.run(x, output_dtypes={"out": np.float32})["out"]
    got = dynamic.run_on_device({k: torch.from_numpy(v) for k, v in x.items()}, output_dtypes={"out": np.float32})["out"]
    assert got.dtype == torch.float32 and tuple(got.shape) == (3, 4, 8, 8)
    assert np.array_equal(got.cpu().numpy(), want)
    again = dynamic.run_on_device({k: torch.from_numpy(v) for k, v in x.items()})["out"]
    assert again.dtype == torch.float16 and again.data_ptr() != got.data_ptr()
    with pytest.raises(InputError, match="'y'"):
        dynamic.run_on_device({"x": torch.from_numpy(x["x"]), "y": torch.zeros(3, 4, 2, 1)})


def test_a_request_outside_the_range_or_of_mixed_batches_is_an_input_error() -> None:
    dynamic = fusegraph.compile_dynamic_batch(conv_silu_add_model(3), (1, 4), "ref")
    x, y = np.zeros((5, 3, 8, 8), np.float32), np.zeros((5, 4, 1, 1), np.float32)
    with pytest.raises(InputError, match="outside 1..4"):
        dynamic.run({"x": x, "y": y})
    with pytest.raises(InputError, match="disagree on the batch: x 2, y 3"):
        dynamic.run({"x": x[:2], "y": y[:3]})
    with pytest.raises(InputError, match=r"input 'x' has shape \[2, 3, 8\], expected \[batch, 3, 8, 8\]"):
        dynamic.run({"x": x[:2, :, :, 0], "y": y[:2]})
    with pytest.raises(InputError, match="missing \\['y'\\]"):
        dynamic.run({"x": x[:2]})


def test_an_output_without_the_batch_first_is_refused() -> None:
    """A sum over the batch would include the padding: such a model cannot batch dynamically."""
    model = make_model([helper.make_node("ReduceSum", ["x"], ["out"], keepdims=0)], {"x": [1, 4]}, ["out"], opset=11)
    with pytest.raises(ArgumentError, match="output 'out' has shape .* needs the batch as the first dimension"):
        fusegraph.compile_dynamic_batch(model, (1, 2), "ref")
    assert isinstance(fusegraph.compile_dynamic_batch(conv_silu_add_model(4), (2, 2), "ref"), DynamicBatchProgram)


def test_a_dynamic_batch_saves_its_weights_once_and_loads_back(tmp_path) -> None:
    from safetensors import safe_open

    model = conv_silu_add_model(5)
    for target in ("ref", "gpu"):
        dynamic = fusegraph.compile_dynamic_batch(model, (1, 4), target, lazy_tune=True)
        fusegraph.save(dynamic, tmp_path / f"{target}.fgx")
        fusegraph.save(dynamic.programs[1], tmp_path / f"{target}-1.fgx")
        with safe_open(str(tmp_path / f"{target}.fgx"), framework="np") as all_sizes, \
                safe_open(str(tmp_path / f"{target}-1.fgx"), framework="np") as one_size:
            # weights ("t" + content digest) only: a gpu program tuned alone also stores kernel binaries ("b...")
            weights = {k for k in all_sizes.keys() if k.startswith("t")}
            shapes = [all_sizes.get_slice(k).get_shape() for k in weights]
            assert {k for k in one_size.keys() if k.startswith("t")} <= weights and shapes.count([4, 3, 3, 3]) == 1  # w, once
        loaded = fusegraph.load(tmp_path / f"{target}.fgx")
        assert isinstance(loaded, DynamicBatchProgram) and loaded.sizes == (1, 2, 4) and loaded.target == target
        x = {"x": np.random.default_rng().standard_normal((3, 3, 8, 8), dtype=np.float32),
             "y": np.random.default_rng().standard_normal((3, 4, 1, 1), dtype=np.float32)}
        np.testing.assert_array_equal(loaded.run(x)["out"], dynamic.run(x)["out"])
