"""`fusegraph serve`: the model repository it writes, and a real Triton server on loopback.

The server test starts the nvidia-pytriton wheel's Triton server on 127.0.0.1 (free ports) with
a small model on the ref target, sends concurrent requests of mixed batch sizes over HTTP
(binary and JSON) and gRPC, checks every answer against the ref target run sample by sample,
checks that bad requests get 400-class answers while the server stays up, and stops it by
its handle. It is skipped when the wheel is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest

import fusegraph
from fusegraph.driver.cli import main
from fusegraph.driver.kserve_client import GrpcClient, HttpClient, InferenceError
from fusegraph.driver.kserve_shm import SharedMemoryClient
from tests.helpers import conv_silu_add_model

MAX_BATCH = 8
HAS_TRITON = importlib.util.find_spec("pytriton") is not None
HAS_GRPC = importlib.util.find_spec("grpc") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="nvidia-pytriton is not installed "
                                                         "(pip install --no-deps nvidia-pytriton==0.7.0)")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("serve") / "small.onnx"
    onnx.save(conv_silu_add_model(3), path)
    return str(path)


def _read(path) -> str:
    return path.read_text()


def test_model_repository_for_the_ref_target(small_model, tmp_path, capsys):
    assert main(["serve", small_model, "--target", "ref", "--max-batch", "4", "--model-repository", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / 'small'}" in capsys.readouterr().out
    config = _read(tmp_path / "small" / "config.pbtxt")
    assert 'name: "small"' in config and 'backend: "python"' in config and "max_batch_size: 4" in config
    assert '{ name: "x" data_type: TYPE_FP32 dims: [ 3, 8, 8 ] }' in config
    assert '{ name: "out" data_type: TYPE_FP32 dims: [ 4, 8, 8 ] }' in config
    assert "dynamic_batching" in config and "KIND_CPU" in config and "KIND_GPU" not in config
    assert "fusegraph.driver.triton_backend import TritonPythonModel" in _read(tmp_path / "small" / "1" / "model.py")
    assert onnx.load(str(tmp_path / "small" / "1" / "model.onnx")).graph.node[0].op_type == "Conv"


def test_a_saved_half_precision_program_is_served_in_the_model_s_dtypes(small_model, tmp_path):
    """The server declares the dtypes of the model the .fgx was compiled from: the program
    converts float32 inputs to float16 inside, so requests stay float32."""
    saved = tmp_path / "small.fgx"
    assert main(["compile", small_model, "--fp16", "--target", "ref", "-o", str(saved)]) == 0
    assert main(["serve", str(saved), "--target", "ref", "--max-batch", "4", "--model-repository",
                 str(tmp_path / "repo")]) == 0
    config = _read(tmp_path / "repo" / "small" / "config.pbtxt")
    assert '{ name: "x" data_type: TYPE_FP32 dims: [ 3, 8, 8 ] }' in config
    assert '{ name: "out" data_type: TYPE_FP32 dims: [ 4, 8, 8 ] }' in config


def test_model_repository_has_one_instance_per_gpu(small_model, tmp_path):
    assert main(["serve", small_model, "--gpus", "0,1", "--name", "conv", "--model-repository", str(tmp_path)]) == 0
    config = _read(tmp_path / "conv" / "config.pbtxt")
    assert "{ kind: KIND_GPU count: 1 gpus: [ 0 ] }" in config and "{ kind: KIND_GPU count: 1 gpus: [ 1 ] }" in config
    assert "max_batch_size: 32" in config and 'string_value: "gpu"' in config


def test_instances_per_gpu_and_device_tensors_in_the_config(small_model, tmp_path, capsys):
    """--instances N runs N instances on each GPU; a gpu-target model takes its inputs on the GPU;
    a count that is not a positive integer is refused by name."""
    assert main(["serve", small_model, "--gpus", "0,1", "--instances", "3", "--name", "conv",
                 "--model-repository", str(tmp_path)]) == 0
    config = _read(tmp_path / "conv" / "config.pbtxt")
    assert "{ kind: KIND_GPU count: 3 gpus: [ 0 ] }" in config and "{ kind: KIND_GPU count: 3 gpus: [ 1 ] }" in config
    assert 'key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" }' in config
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", small_model, "--instances", "0", "--model-repository", str(tmp_path)])
    assert exit_info.value.code == 2 and "--instances: must be positive" in capsys.readouterr().err


def test_serve_refuses_gpus_on_the_ref_target(small_model, tmp_path, capsys):
    assert main(["serve", small_model, "--target", "ref", "--gpus", "0", "--model-repository", str(tmp_path)]) == 2
    assert "--gpus applies to the gpu target" in capsys.readouterr().err


def _per_sample(model: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    want = fusegraph.compile(fusegraph.parse_onnx(model), "ref")
    n = len(inputs["x"])
    return np.concatenate([want.run({k: v[i:i + 1] for k, v in inputs.items()})["out"] for i in range(n)])


def test_batched_program_answers_any_batch_in_the_declared_dtypes(small_model):
    """A program compiled at batch 1 answers 5 samples as five runs; an fp16 program takes and
    gives the model's float32, converting inside; batches outside 1..max are refused."""
    from fusegraph.driver.serving_program import BatchedProgram
    from fusegraph.errors import InputError

    rng = np.random.default_rng()
    inputs = _inputs(5, rng)
    expected = _per_sample(small_model, inputs)
    fp32 = BatchedProgram(fusegraph.compile(fusegraph.parse_onnx(small_model), "ref"), MAX_BATCH)
    np.testing.assert_array_equal(fp32.run(inputs)["out"], expected)
    half = BatchedProgram(fusegraph.compile(fusegraph.parse_onnx(small_model), "ref", fp16=True), MAX_BATCH)
    assert half.input_specs["x"] == (np.dtype(np.float32), (3, 8, 8)) and half.compiled_dtypes["x"] == np.float16
    out = half.run(inputs)["out"]
    assert out.dtype == np.float32
    assert np.linalg.norm(out - expected) / np.linalg.norm(expected) < 1e-2  # float16 rounding
    with pytest.raises(InputError, match="batch of 1 to 8"):
        fp32.run(_inputs(MAX_BATCH + 1, rng))


@pytest.mark.parametrize("fp16", [False, True])
def test_what_the_server_loads_answers_every_batch(small_model, fp16):
    """`load_batched` (a dynamic-batch program where fusegraph has one) against the model run
    sample by sample: float32 to 1e-6, float16 to 1e-2."""
    from fusegraph.driver.serving_program import load_batched

    program = load_batched(small_model, "ref", fp16, MAX_BATCH)
    rng = np.random.default_rng()
    for n in (1, 3, MAX_BATCH):
        inputs = _inputs(n, rng)
        got = program.run(inputs)["out"]
        assert got.dtype == np.float32  # the model's own dtype, as the server declares it
        expected = _per_sample(small_model, inputs)
        assert got.shape == expected.shape
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < (1e-2 if fp16 else 1e-6)


@pytest.mark.parametrize("saved_range", [False, True])
def test_a_gpu_server_program_answers_device_tensors(small_model, tmp_path, saved_range):
    """What a GPU instance runs (`run_on_device`), here under Triton's interpreter: a program of the
    model's own batch run as often as needed, and a saved dynamic batch; float32 in, float32
    device tensors out, equal to the same program's NumPy answers."""
    import torch

    from fusegraph.driver.serving_program import load_batched

    saved = tmp_path / "small.fgx"
    batch = ["--batch", "1..4"] if saved_range else []
    assert main(["compile", small_model, "--fp16", "--target", "gpu", *batch, "-o", str(saved)]) == 0
    program = load_batched(saved, "gpu", True, 4)
    rng = np.random.default_rng()
    for n in (1, 3):
        inputs = _inputs(n, rng)
        got = program.run_on_device({k: torch.from_numpy(v) for k, v in inputs.items()})["out"]
        want = program.run(inputs)["out"]
        assert got.dtype == torch.float32 and want.dtype == np.float32
        assert np.array_equal(got.numpy(), want)
        assert np.linalg.norm(want - _per_sample(small_model, inputs)) / np.linalg.norm(want) < 1e-2


def test_a_saved_dynamic_batch_is_served_for_its_range(small_model, tmp_path):
    """A .fgx of a batch range answers each batch with its own program (no padding to the
    largest); a server wanting more than the range is refused by name."""
    from fusegraph.driver.serving_program import load_batched
    from fusegraph.errors import ArgumentError

    saved = tmp_path / "small-dynamic.fgx"
    assert main(["compile", small_model, "--target", "ref", "--batch", "1..4", "-o", str(saved)]) == 0
    program = load_batched(saved, "ref", False, 4)
    rng = np.random.default_rng()
    for n in (1, 3, 4):
        inputs = _inputs(n, rng)
        got = program.run(inputs)["out"]
        expected = _per_sample(small_model, inputs)
        assert got.shape == expected.shape
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-6
    with pytest.raises(ArgumentError, match="small-dynamic.fgx answers batches of 1 to 4"):
        load_batched(saved, "ref", False, 8)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def server(small_model):
    from fusegraph.driver.serve import serve

    http, grpc, metrics = _free_ports(3)
    s = serve(small_model, target="ref", host="127.0.0.1", port=http, grpc_port=grpc, metrics_port=metrics,
              max_batch=MAX_BATCH, timeout=240)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(small_model):
    compiled = fusegraph.compile(fusegraph.parse_onnx(small_model), "ref")

    def run(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.concatenate([compiled.run({"x": x[i:i + 1], "y": y[i:i + 1]})["out"] for i in range(len(x))])
    return run


def _inputs(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((batch, 3, 8, 8)).astype(np.float32),
            "y": rng.standard_normal((batch, 4, 1, 1)).astype(np.float32)}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@needs_triton
def test_health_and_metrics(server):
    assert _get(f"{server.http_url}/v2/health/live")[0] == 200
    assert _get(f"{server.http_url}/v2/health/ready")[0] == 200
    status, meta = _get(f"{server.http_url}/v2/models/{server.model}")
    assert status == 200 and '"name":"x"' in meta.replace(" ", "")
    assert _get(f"{server.metrics_url}")[1].count("nv_inference_request_success") > 0


@needs_triton
def test_concurrent_requests_of_mixed_batch_sizes(server, reference):
    sizes = [1, 3, 8, 2, 5, 1, 7, 4, 6, 2, 8, 3, 1, 5, 2, 4, 7, 1, 3, 6, 8, 2, 1, 5]
    ways = ["binary", "json"] + (["grpc"] if HAS_GRPC else [])

    def one(i: int) -> tuple[str, np.ndarray, np.ndarray]:
        inputs = _inputs(sizes[i], np.random.default_rng(1000 + i))
        way = ways[i % len(ways)]
        if way == "grpc":
            client = GrpcClient(server.grpc_address)
            out = client.infer(server.model, inputs)["out"]
        else:
            client = HttpClient(server.host, server.port)
            out = client.infer(server.model, inputs, binary=way == "binary")["out"]
        client.close()
        return way, out, reference(inputs["x"], inputs["y"])

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(len(sizes))))
    for (way, got, want), n in zip(results, sizes):
        assert got.shape == (n, 4, 8, 8), way
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=way)
    _, text = _get(server.metrics_url)
    line = next(x for x in text.splitlines() if x.startswith(f'nv_inference_request_success{{model="{server.model}"'))
    assert float(line.split()[-1]) >= len(sizes)


BAD = {
    "wrong shape": lambda rng: {"x": np.zeros((1, 3, 8, 9), np.float32), "y": np.zeros((1, 4, 1, 1), np.float32)},
    "wrong dtype": lambda rng: {"x": np.zeros((1, 3, 8, 8), np.float64), "y": np.zeros((1, 4, 1, 1), np.float32)},
    "wrong name": lambda rng: {"z": np.zeros((1, 3, 8, 8), np.float32), "y": np.zeros((1, 4, 1, 1), np.float32)},
    "missing input": lambda rng: {"x": np.zeros((1, 3, 8, 8), np.float32)},
    "batch too large": lambda rng: _inputs(MAX_BATCH + 1, rng),
}


@needs_triton
@pytest.mark.parametrize("case", list(BAD))
def test_bad_requests_get_400_and_the_server_stays_up(server, reference, case):
    rng = np.random.default_rng(7)
    client = HttpClient(server.host, server.port)
    with pytest.raises(InferenceError) as info:
        client.infer(server.model, BAD[case](rng))
    assert 400 <= info.value.status < 500, info.value
    if HAS_GRPC:
        with pytest.raises(InferenceError) as info:
            GrpcClient(server.grpc_address).infer(server.model, BAD[case](rng))
        assert info.value.status == "INVALID_ARGUMENT", info.value
    good = _inputs(2, rng)
    np.testing.assert_allclose(client.infer(server.model, good)["out"], reference(good["x"], good["y"]),
                               rtol=1e-6, atol=1e-6)
    client.close()


@needs_triton
@pytest.mark.skipif(not HAS_GRPC, reason="grpcio is not installed")
def test_grpc_health(server):
    client = GrpcClient(server.grpc_address)
    assert client.server_ready() and client.model_ready(server.model)
    client.close()


def _regions(server) -> dict[str, dict]:
    """The server's registered system shared memory regions by name."""
    status, text = _get(f"{server.http_url}/v2/systemsharedmemory/status")
    assert status == 200, text
    return {r["name"]: r for r in json.loads(text)}


@needs_triton
def test_shared_memory_answers_mixed_batch_sizes(server, reference):
    """One client, one region reused across requests and grown when a batch needs more; every
    answer against the ref target; the region is unregistered and unlinked on close."""
    sizes = [1, 3, 8, 2, 5, 8, 1]
    with SharedMemoryClient(server.host, server.port) as client:
        grown = set()
        for i, n in enumerate(sizes):
            inputs = _inputs(n, np.random.default_rng(2000 + i))
            out = client.infer(server.model, inputs)["out"]
            assert out.shape == (n, 4, 8, 8)
            np.testing.assert_allclose(out, reference(inputs["x"], inputs["y"]), rtol=1e-6, atol=1e-6)
            grown.add(client.region.size)
            name, size = client.region_name, client.region.size
            assert _regions(server)[name] == {"name": name, "key": f"/{name}", "offset": 0, "byte_size": size}
        assert 1 < len(grown) <= 3  # grew for the larger batches, at least doubling each time
        assert os.path.exists(f"/dev/shm/{name}")
    assert client.region is None and name not in _regions(server)
    assert not os.path.exists(f"/dev/shm/{name}")


@needs_triton
def test_concurrent_shared_memory_clients(server, reference):
    """Several threads, each with its own region, at once; every region is gone afterwards."""
    def one(i: int) -> tuple[str, list[tuple[np.ndarray, np.ndarray]]]:
        with SharedMemoryClient(server.host, server.port) as client:
            answers = []
            for j, n in enumerate([1 + (i + j) % MAX_BATCH for j in range(4)]):
                inputs = _inputs(n, np.random.default_rng(3000 + 10 * i + j))
                answers.append((client.infer(server.model, inputs)["out"], reference(inputs["x"], inputs["y"])))
            return client.region_name, answers

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    names = [name for name, _ in results]
    assert len(set(names)) == len(names)
    for _, answers in results:
        for got, want in answers:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not set(names) & set(_regions(server))
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)


@needs_triton
def test_bad_shared_memory_requests_are_refused_and_the_server_stays_up(server, reference):
    """A wrong shape (400), a region the server no longer knows (404) and an output place too
    small for the answer (Triton says 500: its response allocator fails after the model ran)
    each raise InferenceError; a good request then still gets the right answer."""
    rng = np.random.default_rng(9)
    client = SharedMemoryClient(server.host, server.port)
    with pytest.raises(InferenceError) as info:
        client.infer(server.model, BAD["wrong shape"](rng))
    assert info.value.status == 400, info.value
    with pytest.raises(InferenceError, match="should be at least 2048 bytes") as info:
        client.infer(server.model, _inputs(2, rng), output_shapes={"out": [1, 4, 8, 8]})
    assert info.value.status == 500, info.value
    raw = HttpClient(server.host, server.port)
    assert raw.request("POST", f"/v2/systemsharedmemory/region/{client.region_name}/unregister")[0] == 200
    with pytest.raises(InferenceError, match="Unable to find shared memory region") as info:
        client.infer(server.model, _inputs(2, rng))
    assert info.value.status == 404, info.value
    client.close()
    raw.close()
    with SharedMemoryClient(server.host, server.port) as good:
        inputs = _inputs(3, rng)
        np.testing.assert_allclose(good.infer(server.model, inputs)["out"], reference(inputs["x"], inputs["y"]),
                                   rtol=1e-6, atol=1e-6)


def test_shared_memory_needs_the_shape_of_an_output_that_varies_beyond_the_batch(monkeypatch):
    """An output with a -1 past the batch cannot be given a place in the region from the
    metadata: the error names it and says to pass its shape; passing it sizes it."""
    from fusegraph.errors import InputError

    client = SharedMemoryClient("127.0.0.1", 9)  # no connection is made: the metadata is stubbed
    meta = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "boxes", "datatype": "FP16", "shape": [-1, -1, 4]}]}
    monkeypatch.setattr(client, "metadata", lambda model: meta)
    x = {"x": np.zeros((5, 3), np.float32)}
    with pytest.raises(InputError, match="output 'boxes' of 'det' has shape \\[-1, -1, 4\\]: pass its shape"):
        client.output_sizes("det", x)
    assert client.output_sizes("det", x, {"boxes": [-1, 7, 4]}) == {"boxes": 5 * 7 * 4 * 2}
    client.close()


@needs_triton
def test_stop_by_its_handle(server):
    process = server.process
    assert server.stop() == 0 and process.poll() == 0
    with pytest.raises(OSError):
        socket.create_connection((server.host, server.port), timeout=2).close()
    assert server.stop() is None  # stopping twice is harmless


def test_serve_without_the_wheel_says_what_to_install(small_model, monkeypatch, capsys):
    import fusegraph.driver.triton_server as triton_server

    real = importlib.util.find_spec
    monkeypatch.setattr(triton_server.importlib.util, "find_spec", lambda name: None if name == "pytriton" else real(name))
    assert main(["serve", small_model, "--target", "ref"]) == 2
    assert "pip install --no-deps nvidia-pytriton==0.7.0" in capsys.readouterr().err


@needs_triton
def test_a_model_that_fails_to_load_is_a_clear_error(small_model, tmp_path):
    """The backend's error reaches the caller with the end of Triton's log, and no server is left."""
    from fusegraph.driver.triton_repository import write_repository
    from fusegraph.driver.triton_server import TritonServer
    from fusegraph.errors import TargetUnavailableError

    model_dir = write_repository(small_model, tmp_path, target="ref", max_batch=2)
    (model_dir / "1" / "model.onnx").write_bytes(b"not an onnx model")
    http, grpc, metrics = _free_ports(3)
    server = TritonServer(tmp_path, port=http, grpc_port=grpc, metrics_port=metrics)
    with pytest.raises(TargetUnavailableError, match="tritonserver exited") as info:
        server.start(timeout=120)
    assert "model.onnx" in str(info.value) and server.process is None
