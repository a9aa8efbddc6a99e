"""The `fusegraph serve` command: its options, and serving until Ctrl-C (or SIGTERM)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from fusegraph.errors import ArgumentError


def _gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU numbers such as 0,1, got {text!r}") from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"expected distinct non-negative GPU numbers, got {text!r}")
    return gpus


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= port <= 65533:
        raise argparse.ArgumentTypeError(f"a port must be from 1 to 65533 (gRPC and metrics take the next two), got {port}")
    return port


def _max_batch(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="an .onnx file, a zoo name or a saved program (.fgx)")
    p.add_argument("--target", choices=("gpu", "ref"), default="gpu", help="gpu (default) or the NumPy ref target")
    p.add_argument("--fp16", action="store_true", help="compile in float16 (inputs and outputs stay as declared)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000,
                   help="HTTP port (default 8000); gRPC listens on the next one, metrics on the one after")
    p.add_argument("--max-batch", type=_max_batch, default=32,
                   help="largest batch Triton's dynamic batcher gathers (default 32)")
    p.add_argument("--gpus", type=_gpu_list, default=None, metavar="0,1",
                   help="one model instance on each of these GPUs (gpu target; default 0)")
    p.add_argument("--instances", type=_max_batch, default=1, metavar="N",
                   help="model instances per GPU (default 1); more overlap one batch's copies with another's run")
    p.add_argument("--name", default=None, help="the model's name in Triton (default: the model's file stem)")
    p.add_argument("--model-repository", metavar="DIR",
                   help="write a Triton model repository to DIR (config.pbtxt, 1/model.py, the model) and exit, "
                        "for a Triton server of your own")


def serve_command(args: argparse.Namespace) -> int:
    if args.target == "ref" and args.gpus is not None:
        raise ArgumentError("--gpus applies to the gpu target: the ref target runs one CPU instance")
    gpus = args.gpus if args.gpus is not None else [0]
    if args.model_repository:
        from fusegraph.driver.triton_repository import write_repository

        model_dir = write_repository(args.model, args.model_repository, target=args.target, fp16=args.fp16,
                                     max_batch=args.max_batch, gpus=gpus, name=args.name, instances=args.instances)
        print(f"wrote {model_dir} (config.pbtxt, 1/model.py and the model); serve it with "
              f"`tritonserver --model-repository {args.model_repository}` (its Python backend needs fusegraph)")
        return 0
    from fusegraph.driver.serve import serve

    print(f"compiling {args.model} for the {args.target} target and starting Triton ...", flush=True)
    server = serve(args.model, host=args.host, port=args.port, max_batch=args.max_batch, gpus=gpus,
                   target=args.target, fp16=args.fp16, name=args.name, instances=args.instances)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"serving {server.model}: HTTP {server.http_url}/v2/models/{server.model}/infer, gRPC {server.grpc_address}, "
          f"metrics {server.metrics_url}; Ctrl-C stops", flush=True)
    try:
        while not stop.wait(1.0):
            if server.process is None or server.process.poll() is not None:
                print(f"fusegraph: error: tritonserver exited:\n{server.log_tail()}", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
