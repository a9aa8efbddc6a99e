"""Serving overhead: a model behind Triton (`fusegraph serve`) against the same model run directly.

N clients (16 by default) on loopback, each a process of its own (as real clients are; as
threads of one process they were bound by its GIL), each send requests of `--client-batch`
samples over KServe v2 HTTP as fast as answers come back, with the tensors in the HTTP body (binary tensors)
or in the client's own system shared memory region (`--transport shm`: the client writes its
inputs into the region and copies its outputs out of it on every request); Triton's dynamic
batcher gathers them into batches of up to `--max-batch` (32). Reported: served throughput (samples/s) and
per-request latency p50/p99, against the direct throughput of the same compiled program
(`run`, NumPy in and out, as the server's backend calls it) at the batch the
clients keep in flight. The first answer is checked against the direct run. Needs a GPU and
the nvidia-pytriton wheel (`pip install --no-deps nvidia-pytriton==0.7.0`); without the wheel
only the direct half runs and the table says why.

    python3 bench/serve.py --model yolov5s --clients 16 --max-batch 32 --transport both
"""

from __future__ import annotations

import importlib.util
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _free_port_run(n: int) -> int:
    """A port p with p, p+1 and p+2 free on loopback (HTTP, gRPC, metrics)."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n < 65535 and all(_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no three consecutive free ports on loopback")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _inputs(specs: dict, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Random inputs; float ones in float32, the dtype the server declares (a half-precision
    program converts inside)."""
    rng = np.random.default_rng(seed)
    return {k: rng.random((batch, *shape)).astype(np.float32 if np.dtype(dtype).kind == "f" else dtype)
            for k, (dtype, shape) in specs.items()}


def time_direct(program, batch: int, seconds: float, seed: int) -> tuple[float, float]:
    """Samples/s and median ms of `program.run` at `batch`, back to back for `seconds`."""
    x = _inputs(program.input_specs, batch, seed)
    program.run(x)
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t = time.perf_counter()
        program.run(x)
        times.append(time.perf_counter() - t)
    median = float(np.median(times))
    return batch / median, median * 1e3


def _client(host: str, port: int, transport: str):
    """A client of `transport`: "http" sends tensors in the body, "shm" through its own region."""
    from fusegraph.driver.kserve_client import HttpClient
    from fusegraph.driver.kserve_shm import SharedMemoryClient

    return (SharedMemoryClient if transport == "shm" else HttpClient)(host, port)


def _client_process(i: int, host: str, port: int, model: str, transport: str, specs: dict, client_batch: int,
                    seed: int, ready, go, stop_at, results) -> None:
    """One client, in a process of its own: threads of one process shared its GIL, and with
    YOLOv5s (9.8 MB in, 17 MB out per request) 16 of them spent it building and copying bytes
    (742 ms client p50 against 175 ms in Triton, which gathered batches of 3 on average).
    Says on `ready` that its first request went through (or why not), waits for `go`, times
    requests until the `time.time()` deadline `stop_at`, then puts (i, latencies, end, error)."""
    latencies: list[float] = []
    error, said_ready = None, False
    try:
        x = _inputs(specs, client_batch, seed)
        c = _client(host, port, transport)
        try:
            c.infer(model, x)  # one unmeasured request per connection (and region)
            ready.put((i, None))
            said_ready = True
            go.wait()
            deadline = stop_at.value
            while time.time() < deadline:
                t = time.perf_counter()
                c.infer(model, x)
                latencies.append(time.perf_counter() - t)
        finally:
            c.close()
    except BaseException as e:  # reported by the parent, the other clients go on
        error = f"client {i}: {type(e).__name__}: {e}"
        if not said_ready:
            ready.put((i, error))
    results.put((i, latencies, time.time(), error))


def time_served(server, specs: dict, clients: int, client_batch: int, seconds: float, seed: int,
                transport: str = "http"):
    """Samples/s, p50 and p99 latency (ms) and request count of `clients` concurrent clients,
    each a process of its own (see `_client_process`: the GIL of one client process was the
    bottleneck). "spawn", as the parent may hold CUDA; the clock starts once every client has
    made its first request, as starting processes takes seconds."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, results, go, stop_at = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_client_process, daemon=True,
                         args=(i, server.host, server.port, server.model, transport, specs, client_batch, seed,
                               ready, go, stop_at, results)) for i in range(clients)]
    for p in procs:
        p.start()
    try:
        errors = [e for _, e in _collect(ready, procs, 600) if e]
        start = time.time()
        stop_at.value = start if errors else start + seconds
        go.set()
        out = _collect(results, procs, seconds + 600)
    finally:
        go.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors += [e for *_, e in out if e and e not in errors]
    if errors:
        raise RuntimeError(errors[0])
    wall = max(end for _, _, end, _ in out) - start
    flat = np.array([v for _, lat, _, _ in out for v in lat]) * 1e3
    return len(flat) * client_batch / wall, float(np.percentile(flat, 50)), float(np.percentile(flat, 99)), len(flat)


def _collect(q, procs: list, timeout: float) -> list:
    """One message from each client process off `q`; one that died without a word (killed,
    crashed) is named at once rather than waited for until `timeout`."""
    import queue

    out, deadline = [], time.time() + timeout
    while len(out) < len(procs):
        try:
            out.append(q.get(timeout=1.0))
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead or time.time() > deadline:
                raise RuntimeError(f"client process {dead[0]} died with exit code {procs[dead[0]].exitcode}" if dead
                                   else f"{len(procs) - len(out)} clients silent after {timeout:.0f} s") from None
    return out


def main(argv: list[str] | None = None) -> int:
    # imported here, not at the top: each spawned client process re-runs this module's top level,
    # and these bring in torch (seconds and hundreds of MB per client)
    from bench.common import bench_parser
    from bench.timing import Table, write_results

    parser = bench_parser(__doc__)
    parser.add_argument("--model", default="yolov5s", help="zoo model, .onnx or .fgx (default yolov5s)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--client-batch", type=int, default=2, help="samples per request (default 2)")
    parser.add_argument("--max-batch", type=int, default=32, help="largest batch Triton gathers (default 32)")
    parser.add_argument("--instances", type=int, default=1, help="model instances on the GPU (default 1)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds of each half (default 20)")
    parser.add_argument("--fp32", action="store_true", help="compile in float32 (default fp16)")
    parser.add_argument("--transport", choices=["http", "shm", "both"], default="both",
                        help="tensors in the HTTP body, in system shared memory, or both rows (default)")
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else args.seconds
    target = "gpu" if args.device == "cuda" else "ref"
    fp16 = not args.fp32
    from fusegraph.driver.serving_program import load_batched
    from fusegraph.driver.triton_repository import write_repository

    work = Path(tempfile.mkdtemp(prefix="fusegraph-bench-serve-"))
    model_dir = write_repository(args.model, work, target=target, fp16=fp16, max_batch=args.max_batch, name="bench",
                                 instances=args.instances)
    saved = str(args.model).lower().endswith(".fgx")
    program = load_batched(model_dir / "1" / ("model.fgx" if saved else "model.onnx"), target, fp16, args.max_batch)
    in_flight = min(args.max_batch, args.clients * args.client_batch)
    direct_rate, direct_ms = time_direct(program, in_flight, seconds, args.seed)
    table = Table(f"{args.model} served by Triton vs run directly ({target} target, {'fp16' if fp16 else 'fp32'})",
                  ["how", "batch", "samples/s", "p50 ms", "p99 ms", "requests", "vs direct", "note"])
    table.add("direct (program.run)", in_flight, f"{direct_rate:.0f}", f"{direct_ms:.2f}", "-", "-", "1.00", "")
    for row in _served_rows(args, work, program, target, seconds, direct_rate):
        table.add(*row)
    sizes = getattr(program, "sizes", None)
    how = (f"dynamic-batch program compiled at batches {', '.join(map(str, sizes))}" if sizes else
           f"compiled at batch {program.compiled_batch} (a larger batch runs as several runs of it)")
    notes = [f"{args.clients} clients x {args.client_batch} samples per request, max batch {args.max_batch}, "
             f"{args.instances} model instance(s), {seconds:.0f} s each half; {how}"]
    write_results(args.name or f"serve-{args.model}", f"Serving {args.model} through Triton", args.device,
                  [table], notes, save=not args.no_save)
    return 0


TRANSPORTS = {"http": "served (Triton, KServe v2 HTTP)", "shm": "served (Triton, system shared memory)"}


def _served_rows(args, work: Path, program, target: str, seconds: float, direct_rate: float) -> list[list]:
    """The table rows of the served half, one per transport, or why they could not run."""
    transports = ["http", "shm"] if args.transport == "both" else [args.transport]
    if importlib.util.find_spec("pytriton") is None:
        return [[TRANSPORTS[t], "-", "-", "-", "-", "-", "-",
                 "not run: nvidia-pytriton is not installed here (pip install --no-deps nvidia-pytriton==0.7.0)"]
                for t in transports]
    from fusegraph.driver.triton_server import TritonServer

    port = _free_port_run(3)
    server = TritonServer(work, port=port, log=work / "tritonserver.log", device_pools=[0] if target == "gpu" else None)
    server.model = "bench"
    try:
        server.start(timeout=900)
        return [_served_row(args, server, program, t, seconds, direct_rate) for t in transports]
    except Exception as e:  # the direct half stands; the log says what Triton did
        return [[TRANSPORTS[t], "-", "-", "-", "-", "-", "-", f"failed: {type(e).__name__}: {str(e)[:300]}"]
                for t in transports]
    finally:
        server.stop()


def _served_row(args, server, program, transport: str, seconds: float, direct_rate: float) -> list:
    """One transport's row: the first answer checked against the direct run, then the timed loop."""
    try:
        x = _inputs(program.input_specs, args.client_batch, args.seed)
        client = _client(server.host, server.port, transport)
        try:
            got, want = client.infer("bench", x), program.run(x)
        finally:
            client.close()
        err = max(float(np.linalg.norm(got[k].astype(np.float64) - want[k]) / max(np.linalg.norm(want[k]), 1e-30))
                  for k in want)
        before = _triton_counters(server)
        rate, p50, p99, n = time_served(server, program.input_specs, args.clients, args.client_batch, seconds,
                                        args.seed, transport)
        where = _where_the_time_went(before, _triton_counters(server))
    except Exception as e:  # the other transport's row still runs
        return [TRANSPORTS[transport], "-", "-", "-", "-", "-", "-", f"failed: {type(e).__name__}: {str(e)[:300]}"]
    return [TRANSPORTS[transport], f"<= {args.max_batch}", f"{rate:.0f}", f"{p50:.2f}", f"{p99:.2f}", n,
            f"{rate / direct_rate:.2f}", f"first answer rel err vs direct {err:.1e}; {where}"]


#: Triton's cumulative counters (its metrics endpoint) that say where a served request's time goes
COUNTERS = ("nv_inference_count", "nv_inference_exec_count", "nv_inference_request_success",
            "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us")


def _triton_counters(server) -> dict[str, float]:
    """The model's COUNTERS, summed over its instances."""
    import urllib.request

    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in out and 'model="bench"' in line:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def _where_the_time_went(before: dict[str, float], after: dict[str, float]) -> str:
    """Triton's view of the timed loop: the batch its dynamic batcher gathered, and per request
    the time in its queue, in the backend's input, run and output steps, and in all."""
    d = {k: after[k] - before[k] for k in COUNTERS}
    if not d["nv_inference_exec_count"] or not d["nv_inference_request_success"]:
        return "no Triton counters"
    per = {k: d[f"nv_inference_{k}_duration_us"] / d["nv_inference_request_success"] / 1e3
           for k in ("request", "queue", "compute_input", "compute_infer", "compute_output")}
    return (f"Triton: mean batch {d['nv_inference_count'] / d['nv_inference_exec_count']:.1f}; per request ms: "
            f"in server {per['request']:.1f} = queue {per['queue']:.1f} + input {per['compute_input']:.1f} + "
            f"run {per['compute_infer']:.1f} + output {per['compute_output']:.1f}")


if __name__ == "__main__":
    sys.exit(main())
