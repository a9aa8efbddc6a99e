"""bench/models.py's CPU-side parts: every exported zoo model has a library module spec, the
cases build their inputs and rebatched graphs, the fp32 reference for fusegraph agrees with
ONNX Runtime, and a missing library falls back to the module generated from the zoo graph."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bench import model_specs  # noqa: E402
from bench import models as bm  # noqa: E402
from fusegraph import zoo  # noqa: E402
from tests.zoo_params import BIG_EXPORTED, DEFAULT_EXPORTED, exported  # noqa: E402

ARGS = argparse.Namespace(seed=0, tolerance=1e-2)
CPU = torch.device("cpu")


def test_every_exported_model_has_a_spec():
    assert sorted(model_specs.SPECS) == sorted(DEFAULT_EXPORTED + BIG_EXPORTED)
    assert all(zoo.is_zoo_name(n) for n in model_specs.SPECS)


def test_case_inputs_follow_batch_and_ranges():
    case = bm.Case("gpt2_2layer", 3, ARGS, CPU)
    (ids,) = case.inputs.values()
    assert tuple(ids.shape) == (3, 128) and ids.dtype == torch.int64
    assert 0 <= int(ids.min()) and int(ids.max()) < 50257
    assert case.program().input_shapes["input_ids"].lens == (3, 128)


@pytest.mark.parametrize("name", exported(["bert_base_s512"]))
def test_token_inputs_take_the_sequence_of_the_zoo_graph(name):
    """The sequence is the graph's (512 here), never a constant 128, at batch 1 and rebatched."""
    for batch in (1, 2):
        case = bm.Case(name, batch, ARGS, CPU)
        assert {k: tuple(v.shape) for k, v in case.inputs.items()} == \
            {k: (batch, 512) for k in ("input_ids", "attention_mask", "token_type_ids")}
        assert case.program().input_shapes["input_ids"].lens == (batch, 512)


def test_batch_32_uses_the_zoo_variant_where_there_is_one():
    case = bm.Case("vit_small_patch16_224", 32, ARGS, CPU)
    assert next(p.value for p in case.onnx_model.metadata_props if p.key == "fusegraph.zoo_name") \
        == "vit_small_patch16_224-b32"


def test_reference_and_generated_fallback_agree_with_onnxruntime(monkeypatch):
    import onnxruntime as ort

    case = bm.Case("unet_small", 1, ARGS, CPU)
    ref = bm.fp32_reference(case)
    sess = ort.InferenceSession(case.onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"input": case.inputs["input"].float().numpy()})[0]
    assert np.linalg.norm(ref.numpy() - want) / np.linalg.norm(want) < 1e-5
    monkeypatch.setattr(model_specs, "SPECS", {**model_specs.SPECS, "unet_small": model_specs.Spec(
        "no_such_library_xyz", model_specs.SPECS["unet_small"].build)})
    module, generated, note = bm.torch_module(case)
    assert generated and "no_such_library_xyz not importable" in note
    with torch.no_grad():
        out = case.call(module, torch.float32, generated)()
    assert np.linalg.norm(out.numpy() - want) / np.linalg.norm(want) < 1e-5


def test_library_unet_matches_the_graph_shapes():
    case = bm.Case("unet_small", 2, ARGS, CPU)
    module = model_specs.library_module("unet_small", 0)
    with torch.no_grad():
        out = case.call(module, torch.float32, generated=False)()
    assert tuple(out.shape) == (2, 2, 256, 256)


def test_a_file_written_mid_run_says_what_it_lacks_and_the_last_write_replaces_it(monkeypatch, tmp_path, capsys):
    """A run stopped from outside keeps the rows measured so far; a finished run's file has no such note."""
    from bench import timing

    monkeypatch.setattr(timing, "RESULTS_DIR", tmp_path)
    args = argparse.Namespace(seed=0, name="cut", no_save=False)
    cases = [("resnet18", 1), ("vit_small_patch16_224", 1)]
    late, early = bm.Row("vit_small_patch16_224", 1, "fusegraph"), bm.Row("resnet18", 1, "fusegraph")
    bm._write([late, early], cases, args, CPU, 0.0, "torch's contenders not yet run")
    text = (tmp_path / "cut.md").read_text()
    assert "written mid-run (torch's contenders not yet run)" in text
    assert text.index("| resnet18 |") < text.index("| vit_small_patch16_224 |")  # in case order
    assert capsys.readouterr().out == ""  # mid-run writes print nothing
    bm._write([late, early, bm.Row("resnet18", 1, "compile")], cases, args, CPU, 0.0)
    text = (tmp_path / "cut.md").read_text()
    assert "mid-run" not in text and text.count("| resnet18 |") == 2
    assert "written:" in capsys.readouterr().out


def test_each_fusegraph_mode_is_a_mode_and_chunk_stats_builds_no_lane_sums():
    """Every fusegraph contender's settings name a mode of the command line; under
    the default's a layernorm before a product sums its statistics lane by lane, and under
    fusegraph-chunk-stats's it does not."""
    import contextlib

    from fusegraph import api, parse_onnx
    from tests.gpu.test_gpu_kernels import node
    from tests.helpers import make_model, rand

    assert set(bm.FUSEGRAPH_MODES) <= set(bm.MODES)
    model = make_model([node("LayerNormalization", ["x", "g", "b"], ["t"], axis=-1), node("MatMul", ["t", "w"], ["y"])],
                       {"x": [1, 4, 96]}, ["y"], {"g": rand(96, seed=1), "b": rand(96, seed=2), "w": rand(96, 8, seed=3)})
    for mode, lanes in (("fusegraph", True), ("fusegraph-chunk-stats", False)):
        with contextlib.ExitStack() as settings:
            for name, value in bm.FUSEGRAPH_MODES[mode].items():
                settings.enter_context(bm.environment(name, value))
            (k,) = api.compile(parse_onnx(model), "gpu", tune=False).kernels
        assert ("ln0_s1 += " in k.src.source) == lanes, mode
