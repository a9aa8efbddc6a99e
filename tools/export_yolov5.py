"""Export YOLOv5s from the `yolov5` package's own model definition to ONNX for the model zoo.

Why this exists: YOLOv5s is fusegraph's founding benchmark (its detection head is the
conv -> reshape -> transpose -> sigmoid pattern that other compilers split). We need the real
graph exactly as the upstream exporter writes it, but nothing may be downloaded, so the model is
built from `yolov5s.yaml` with random weights; the weights are then stripped (tools/strip_weights.py)
and `fusegraph.zoo.load` regenerates them. The stripped graphs are committed under
fusegraph/zoo/models/; rerun this script only to refresh them.

It writes four graphs (names are the zoo's):
    yolov5s.onnx          640x640, BatchNormalization folded into the convs (`model.fuse()`, as
                          yolov5's own export.py does)
    yolov5s-160.onnx      160x160, folded
    yolov5s-bn.onnx       640x640, BatchNormalization left as nodes (no fuse)
    yolov5s-bn-160.onnx   160x160, unfolded
All: torch.onnx.export(..., opset_version=17, dynamo=False), input `images` [1,3,H,W], the Detect
head in export mode (one output `output0` [1, 3*(H/8*W/8 + H/16*W/16 + H/32*W/32), 85]).

Run it in a SEPARATE venv, never in the project's (it needs the heavy yolov5 package):
    python3.11 -m venv /tmp/yolo-venv
    /tmp/yolo-venv/bin/pip install torch==2.13.0          # pinned: CPU wheel; never unpinned
    /tmp/yolo-venv/bin/pip install --no-deps yolov5==7.0.14
    /tmp/yolo-venv/bin/pip install opencv-python-headless pandas requests pillow psutil pyyaml \
        tqdm matplotlib seaborn 'setuptools<81' onnx
    /tmp/yolo-venv/bin/python tools/export_yolov5.py [--out-dir fusegraph/zoo/models] [--full-dir DIR]
Do NOT `pip install torchvision` (it pulls a multi-GB CUDA torch) nor `ultralytics`.

Stand-in modules: `yolov5` imports `torchvision` (for NMS, data loaders and augmentations) and
`ultralytics.utils.checks.check_requirements` at import time, yet building the model and exporting
it use neither. `install_stand_ins()` therefore puts small placeholder modules into `sys.modules`
BEFORE `yolov5` is imported; any real use of them raises, so they cannot silently change the
exported graph.

BatchNormalization in the unfolded graphs: the TorchScript exporter folds Conv+BN itself when it
exports in EVAL mode with constant folding (`_jit_pass_onnx_eval_peephole`), so the unfolded graphs
are exported with training=TrainingMode.PRESERVE on a model already in eval mode (BN then exports as
an inference-mode BatchNormalization node, everything else is the same).
"""

from __future__ import annotations

import argparse
import sys
import types
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from strip_weights import strip  # noqa: E402  (tools/ is not a package)

#: (zoo name, image size, fold BatchNormalization)
VARIANTS = [
    ("yolov5s", 640, True),
    ("yolov5s-160", 160, True),
    ("yolov5s-bn", 640, False),
    ("yolov5s-bn-160", 160, False),
]

SEED = 0  # torch seed for the (random, later stripped) weights: keeps the export reproducible


def _unavailable(what: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{what} is a stand-in installed by tools/export_yolov5.py; "
                           "the export should never call it")
    return fail


def install_stand_ins() -> None:
    """Register placeholder `torchvision` and `ultralytics` modules so that `yolov5` imports.

    Only names touched at import time exist: torchvision.transforms(.functional), datasets.ImageFolder
    (a base class in yolov5's data loaders), ops.nms; ultralytics.utils.checks.check_requirements.
    """
    if "torchvision" not in sys.modules:
        tv = types.ModuleType("torchvision")
        tv.__version__ = "0.0.0+fusegraph-stand-in"
        tv.transforms = types.ModuleType("torchvision.transforms")
        tv.transforms.functional = types.ModuleType("torchvision.transforms.functional")
        tv.datasets = types.ModuleType("torchvision.datasets")
        tv.datasets.ImageFolder = type("ImageFolder", (), {"__init__": _unavailable("ImageFolder")})
        tv.ops = types.ModuleType("torchvision.ops")
        tv.ops.nms = _unavailable("torchvision.ops.nms")
        tv.ops.box_iou = _unavailable("torchvision.ops.box_iou")
        for mod in (tv, tv.transforms, tv.transforms.functional, tv.datasets, tv.ops):
            sys.modules[mod.__name__] = mod
    if "ultralytics" not in sys.modules:
        ul = types.ModuleType("ultralytics")
        ul.utils = types.ModuleType("ultralytics.utils")
        ul.utils.checks = types.ModuleType("ultralytics.utils.checks")
        # yolov5 calls check_requirements() to pip-install missing packages; here everything
        # the export needs is installed, so it is a no-op.
        ul.utils.checks.check_requirements = lambda *args, **kwargs: True
        for mod in (ul, ul.utils, ul.utils.checks):
            sys.modules[mod.__name__] = mod


def build_model(fold_bn: bool):
    """YOLOv5s from yolov5s.yaml with seeded random weights, in eval and Detect export mode."""
    import torch
    import yolov5
    from yolov5.models.yolo import Detect, DetectionModel

    torch.manual_seed(SEED)
    cfg = Path(yolov5.__file__).parent / "models" / "yolov5s.yaml"
    model = DetectionModel(str(cfg), ch=3, nc=80).eval()
    # Fresh BatchNorm layers all hold the same parameters (1, 0, 0, 1), and so do the biases that
    # folding makes of them; the exporter then deduplicates those equal initializers into one
    # tensor read through chains of Identity nodes, which a trained model never shows. Random
    # BN parameters keep every tensor distinct, as in a real checkpoint.
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    if fold_bn:
        model.fuse()  # what yolov5's attempt_load(fuse=True) does before export
    for m in model.modules():
        if isinstance(m, Detect):  # the same settings as yolov5/export.py run()
            m.inplace = False
            m.dynamic = False
            m.export = True
    return model


def export(name: str, size: int, fold_bn: bool, path: Path) -> None:
    import torch

    model = build_model(fold_bn)
    im = torch.zeros(1, 3, size, size)
    with torch.no_grad():
        for _ in range(2):  # dry runs, as yolov5 does: builds the grids for this size
            (y,) = model(im)
    expect = (1, 3 * sum((size // s) ** 2 for s in (8, 16, 32)), 85)
    assert tuple(y.shape) == expect, (name, tuple(y.shape), expect)
    training = torch.onnx.TrainingMode.EVAL if fold_bn else torch.onnx.TrainingMode.PRESERVE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (im,), str(path),
            opset_version=17, dynamo=False, do_constant_folding=True, training=training,
            input_names=["images"], output_names=["output0"],
        )


def finish(full_path: Path, name: str, size: int, fold_bn: bool) -> "onnx.ModelProto":
    """Check the full export, strip its weights and add a few facts to its metadata."""
    import onnx
    import torch
    import yolov5

    model = onnx.load(str(full_path))
    onnx.checker.check_model(model, full_check=True)
    assert not any(n.op_type == "Identity" for n in model.graph.node), name
    n_bn = sum(n.op_type == "BatchNormalization" for n in model.graph.node)
    assert (n_bn == 0) == fold_bn, (name, n_bn)
    stripped = strip(model)
    stripped.doc_string = (f"YOLOv5s {size}x{size}, BatchNormalization "
                           f"{'folded into convs' if fold_bn else 'unfolded'}; weights stripped")
    for key, value in [
        ("stride", "32"),
        ("fusegraph.zoo_name", name),
        ("fusegraph.source", f"yolov5=={yolov5.__version__} yolov5s.yaml, random weights, "
                             f"torch=={torch.__version__} torch.onnx.export(opset_version=17, "
                             f"dynamo=False); tools/export_yolov5.py"),
    ]:
        stripped.metadata_props.add(key=key, value=value)
    return stripped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Export YOLOv5s graphs (weights stripped) for fusegraph.zoo")
    ap.add_argument("--out-dir", type=Path, default=REPO / "fusegraph" / "zoo" / "models")
    ap.add_argument("--full-dir", type=Path, default=None,
                    help="also keep the unstripped exports (with torch's random weights) here")
    args = ap.parse_args(argv)

    install_stand_ins()
    import tempfile

    import onnx

    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        full_dir = args.full_dir or Path(tmp)
        full_dir.mkdir(parents=True, exist_ok=True)
        for name, size, fold_bn in VARIANTS:
            full = full_dir / f"{name}.onnx"
            export(name, size, fold_bn, full)
            stripped = finish(full, name, size, fold_bn)
            dst = args.out_dir / f"{name}.onnx"
            onnx.save(stripped, str(dst))
            print(f"{dst}: {dst.stat().st_size} bytes (full {full.stat().st_size} bytes)")
    print("Now recalibrate the weight gains with the project's venv: "
          ".venv/bin/python tools/calibrate_zoo.py yolov5s yolov5s-160 yolov5s-bn yolov5s-bn-160")
    return 0


if __name__ == "__main__":
    sys.exit(main())
