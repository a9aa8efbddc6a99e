"""What the GPU refuses, said as one clear error: no memory for the program's buffers, and a
kernel Triton cannot compile or launch. Both are simulated under the interpreter (the failing
call raises what torch or Triton would), since a real GPU cannot be made to fail on demand."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fusegraph import api, parse_onnx
from fusegraph.errors import DeviceError, TargetUnavailableError
from fusegraph.targets.gpu import compiled_program
from fusegraph.targets.gpu.device_errors import buffer_bytes, every_config_failed
from tests.helpers import make_model, rand

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def _conv_relu():
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                    helper.make_node("Relu", ["c"], ["y"])],
                   {"x": [1, 4, 6, 6]}, ["y"], {"w": rand(8, 4, 3, 3, seed=1, scale=0.3), "b": rand(8, seed=2)})
    return parse_onnx(m)


def test_out_of_memory_names_the_programs_needs_and_what_to_do(monkeypatch) -> None:
    real_empty = torch.empty

    def empty(*args, **kwargs):
        if args and args[0] != 0:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    with pytest.raises(DeviceError, match=r"out of GPU memory: the compiled program needs [0-9.]+ MiB "
                                          r"\(arena .* weights .* outputs .*\).*smaller --batch"):
        api.compile(_conv_relu(), "gpu", tune=False)


def test_buffer_bytes_counts_weights_outputs_and_the_arena() -> None:
    compiled = api.compile(_conv_relu(), "gpu", tune=False)
    need = buffer_bytes(compiled.plan)
    assert need["weights"] == (8 * 4 * 9 + 8) * 4
    assert need["outputs"] == 8 * 36 * 4
    assert need["arena"] == compiled.plan.arena_bytes


def test_a_kernel_triton_cannot_build_is_named_with_its_config() -> None:
    compiled = api.compile(_conv_relu(), "gpu", tune=False)
    (k,) = compiled.kernels

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("PTXAS error: Internal Triton PTX codegen error\nmore lines")
            return launch

    k.fn = Broken()
    x = np.random.default_rng().standard_normal((1, 4, 6, 6)).astype(np.float32)
    with pytest.raises(DeviceError) as e:
        compiled.run({"x": x})
    msg = str(e.value)
    assert k.src.name in msg and "RuntimeError: PTXAS error" in msg and "more lines" not in msg
    assert "--target ref" in msg and str(k.config) in msg


def test_every_candidate_failing_is_one_error_naming_the_first_failure() -> None:
    compiled = api.compile(_conv_relu(), "gpu", tune=False)
    (k,) = compiled.kernels
    failures = [f"{k.src.name} {{'BM': 64}}: OutOfResources: out of resource: shared memory", "k9_other {}: X: y"]
    msg = str(every_config_failed(k.src, k.ins.origin, failures))
    assert k.src.name in msg and "OutOfResources" in msg and "k9_other" not in msg


def test_no_gpu_and_triton_imported_without_the_interpreter_says_what_to_set(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(TargetUnavailableError, match="TRITON_INTERPRET=1"):
        compiled_program.use_interpreter_without_gpu()
