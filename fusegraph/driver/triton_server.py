"""Running the Triton Inference Server that the nvidia-pytriton wheel ships, on a repository.

Only the wheel's binaries are used (tritonserver, the Python backend and its stubs), not
PyTriton's Python side: PyTriton 0.7.0 declares numpy < 2, which fusegraph's pins exclude, and
its data path breaks under NumPy 2, so it is installed with `pip install --no-deps`.

Two things make the Python backend work here. The stub for this interpreter's version is put
beside the backend, as PyTriton does. And the stub links `libpython3.X.so.1.0` with no path of
its own: the dynamic loader finds the system's copy (Debian's 3.11.2 here) while the stub's
`sys.path` is this interpreter's (pyenv's 3.11.7), whose `multiprocessing` then calls
`RLock._recursion_count`, missing from 3.11.2's C RLock, and the model fails to load. Putting
this interpreter's LIBDIR first on LD_LIBRARY_PATH makes the stub run the same Python.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

from fusegraph.errors import TargetUnavailableError

INSTALL_HINT = "pip install --no-deps nvidia-pytriton==0.7.0"


def wheel_dirs() -> tuple[Path, Path]:
    """The wheel's `tritonserver` folder and its bundled libraries; found without importing
    pytriton (whose import needs the packages it declares)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TargetUnavailableError(f"serving needs the Triton server of the nvidia-pytriton wheel: {INSTALL_HINT}")
    package = Path(list(spec.submodule_search_locations)[0])
    server, libs = package / "tritonserver", package.parent / "nvidia_pytriton.libs"
    if not (server / "bin" / "tritonserver").exists():
        raise TargetUnavailableError(f"{server} has no bin/tritonserver: reinstall with {INSTALL_HINT}")
    return server, libs


def prepare_server(workdir: Path) -> Path:
    """A copy of the wheel's server in `workdir` with this Python's backend stub in place."""
    server, _ = wheel_dirs()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise TargetUnavailableError(f"the nvidia-pytriton wheel has no Python backend stub for Python {version}")
    target = workdir / "tritonserver"
    shutil.copytree(server, target, ignore=shutil.ignore_patterns("python_backend_stubs"))
    shutil.copy(stub, target / "backends" / "python" / "triton_python_backend_stub")
    return target


def server_env(gpus: list[int] | None) -> dict[str, str]:
    """The environment of the server and its stubs: this Python's libpython and the wheel's
    libraries found first, this interpreter first on PATH (the stub takes its prefix, and so
    its site-packages, from there), and this fusegraph importable."""
    env = dict(os.environ)
    _, libs = wheel_dirs()
    paths = [str(libs)]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        paths.insert(0, str(sysconfig.get_config_var("LIBDIR")))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(paths + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    return env


class TritonServer:
    """One tritonserver process serving `repository`: HTTP on `port`, gRPC on `grpc_port`,
    metrics on `metrics_port`. `stop()` (or leaving a `with` block) shuts it down."""

    def __init__(self, repository: "str | Path", *, host: str = "127.0.0.1", port: int = 8000,
                 grpc_port: int | None = None, metrics_port: int | None = None, gpus: list[int] | None = None,
                 log: "str | Path | None" = None, device_pools: "list[int] | None" = None) -> None:
        self.repository = Path(repository)
        self.device_pools = list(device_pools or [])  # GPUs the model runs on (pools sized for them)
        self.host, self.port = host, port
        self.grpc_port = port + 1 if grpc_port is None else grpc_port
        self.metrics_port = port + 2 if metrics_port is None else metrics_port
        self.gpus = gpus
        self.workdir = Path(tempfile.mkdtemp(prefix="fusegraph-triton-"))
        self.log_path = Path(log) if log else self.workdir / "tritonserver.log"
        self.process: subprocess.Popen[bytes] | None = None
        #: directories removed when the server stops (a repository written for it alone)
        self.cleanup: list[Path] = []

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self, server: Path) -> list[str]:
        return [str(server / "bin" / "tritonserver"), f"--model-repository={self.repository}",
                f"--backend-directory={server / 'backends'}", f"--cache-directory={server / 'caches'}",
                f"--http-address={self.host}", f"--http-port={self.port}", f"--grpc-address={self.host}",
                f"--grpc-port={self.grpc_port}", f"--metrics-address={self.host}",
                f"--metrics-port={self.metrics_port}", "--exit-on-error=true", "--strict-readiness=true",
                f"--backend-config=python,shm-default-byte-size={64 << 20}",
                f"--backend-config=python,shm-growth-byte-size={64 << 20}"] + self.pool_options()

    def pool_options(self) -> list[str]:
        """Larger memory pools where the model runs on GPUs: tensors between Triton and the
        Python backend's stub go through the CUDA pool (64 MiB by default, less than one
        YOLOv5s batch of 32), and copies to and from clients through the pinned host pool."""
        if not self.device_pools:
            return []
        return [f"--cuda-memory-pool-byte-size={g}:{2 << 30}" for g in self.device_pools] + \
            [f"--pinned-memory-pool-byte-size={1 << 30}"]

    def start(self, timeout: float = 600.0) -> "TritonServer":
        """Start the server and wait until it and every model are ready (compiled and warmed
        up); a server that exits or is not ready in `timeout` seconds is an error showing the
        end of its log."""
        server = prepare_server(self.workdir)
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(self.command(server), env=server_env(self.gpus), stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                code = self.stop()
                raise TargetUnavailableError(f"tritonserver exited with code {code}:\n{tail}")
            if self.ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise TargetUnavailableError(f"tritonserver was not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def ready(self) -> bool:
        """Every model ready and the metrics endpoint answering: Triton opens its metrics port
        after the HTTP one, so a health check alone may pass before metrics can be read."""
        return _answers(f"{self.http_url}/v2/health/ready") and _answers(self.metrics_url)

    def log_tail(self, lines: int = 12) -> str:
        """What the log says went wrong: Triton's error lines (a model's traceback folded into
        one line each, cut at its `At:` part), then its last lines."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        errors = [ln.split("\\n\\nAt:")[0] for ln in text if ln.startswith("E") and "CudaDriverHelper" not in ln]
        return "\n".join(errors[-4:] + text[-lines:])

    def stop(self, timeout: float = 60.0) -> int | None:
        """Ask the server to finish its requests and exit (SIGINT), kill it after `timeout`
        seconds; returns its exit code."""
        p, self.process = self.process, None
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for d in [self.workdir / "tritonserver", *self.cleanup]:
            shutil.rmtree(d, ignore_errors=True)
        return p.returncode

    def __enter__(self) -> "TritonServer":
        return self if self.process else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False

