"""Start, watch and stop a real `tritonserver` on 127.0.0.1 (stdlib only on this side).

The binary and the Python backend come from the Triton venv (env.py); the
process is started in its own session, so stopping it also ends the backend
stub processes it started.  Clients never talk to tritonserver directly: it
listens on private loopback ports behind the validating front (front.py), which
holds the public ports, so one malformed request cannot take the server down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ...errors import BackendUnavailable, MsarError
from .env import TritonInstall, find_triton

HOST = "127.0.0.1"


class ServerError(MsarError):
    """The server did not come up (the message carries the end of its log)."""


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        return s.connect_ex((HOST, port)) == 0


def binary_check(install: TritonInstall | None = None, timeout: float = 60) -> str | None:
    """None when `tritonserver --help` runs here, else why not (the one reason tests skip for)."""
    try:
        install = install or find_triton()
    except BackendUnavailable as e:
        return str(e)
    try:
        out = subprocess.run([str(install.binary), "--help"], capture_output=True, text=True, timeout=timeout,
                             env=install.server_env())
    except (OSError, subprocess.SubprocessError) as e:
        return f"{install.binary} cannot start: {type(e).__name__}: {e}"
    if "--model-repository" not in out.stdout + out.stderr:
        tail = (out.stderr.strip().splitlines() or out.stdout.strip().splitlines() or ["no output"])[-1]
        return f"{install.binary} cannot start (exit {out.returncode}): {tail[:300]}"
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies (Linux), so a
    killed `msar-export serve` does not leave an orphaned server holding its ports."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class TritonServer:
    """`with TritonServer(repo, http_port, grpc_port) as s:` runs tritonserver until the block ends."""

    def __init__(self, repo: str | os.PathLike, http_port: int = 8000, grpc_port: int = 8001,
                 log_path: str | os.PathLike | None = None, install: TritonInstall | None = None,
                 exit_timeout_s: int = 10, verbose: bool = False, max_elements: int = 1 << 22):
        self.repo = Path(repo).resolve()
        self.http_port, self.grpc_port = http_port, grpc_port
        self.max_elements = max_elements
        self.front: subprocess.Popen | None = None
        self.inner_http = self.inner_grpc = 0
        self.log_path = Path(log_path) if log_path else self.repo.parent / f"{self.repo.name}.tritonserver.log"
        self.install = install
        self.exit_timeout_s = exit_timeout_s
        self.verbose = verbose
        self.proc: subprocess.Popen | None = None
        self._log = None
        # Unique shared-memory names (several servers may run at once), removed after a kill.
        self.shm_prefix = f"msar{os.getpid()}_{http_port}_"

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"grpc://{HOST}:{self.grpc_port}"

    def command(self) -> list[str]:
        inst = self.install
        return [
            str(inst.binary),
            f"--model-repository={self.repo}",
            f"--backend-directory={inst.backend_dir()}",
            f"--http-address={HOST}", f"--http-port={self.inner_http}",
            f"--grpc-address={HOST}", f"--grpc-port={self.inner_grpc}",
            "--allow-metrics=false",
            "--disable-auto-complete-config",
            "--strict-readiness=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--log-verbose={1 if self.verbose else 0}",
        ]

    def start(self, timeout: float = 180.0) -> "TritonServer":
        for port in (self.http_port, self.grpc_port):
            if port_in_use(port):
                raise ServerError(f"port {port} on {HOST} is already in use; pick another with --port-http/--port-grpc")
        self.install = self.install or find_triton()
        self.inner_http, self.inner_grpc = free_port(), free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(f"\n==== msar-export: starting tritonserver at {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
        self._log.flush()
        try:
            self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.install.server_env(),
                                         start_new_session=True, preexec_fn=_die_with_parent)
            self.front = subprocess.Popen(self.front_command(), stdout=self._log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=self._front_env(), start_new_session=True,
                                          preexec_fn=_die_with_parent)
        except OSError as e:
            self._kill_group()
            raise BackendUnavailable(f"{self.install.binary} cannot start: {e}") from None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._kill_group()
                raise ServerError(f"tritonserver exited with status {self.proc.returncode} while starting: "
                                  f"{self.log_summary()} (log: {self.log_path})")
            if self.front.poll() is not None:
                self._kill_group()
                raise ServerError(f"the request front exited with status {self.front.returncode} while starting: "
                                  f"{self.log_summary()} (log: {self.log_path})")
            if self.ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise ServerError(f"tritonserver was not ready after {timeout:.0f} s: {self.log_summary()} (log: {self.log_path})")

    def front_command(self) -> list[str]:
        return [str(self.install.python), "-m", "msar_export.serving.triton.front", "--http", str(self.http_port),
                "--grpc", str(self.grpc_port), "--upstream-http", str(self.inner_http),
                "--upstream-grpc", str(self.inner_grpc), "--max-elements", str(self.max_elements),
                "--models", ",".join(self.served_models())]

    def served_models(self) -> list[str]:
        """The repository's models: the only ones the front lets requests reach."""
        return sorted(p.parent.name for p in self.repo.glob("*/config.pbtxt"))

    def _front_env(self) -> dict:
        from .env import with_package_path

        return with_package_path(os.environ)

    def ready(self) -> bool:
        try:
            code, _ = http_get(f"{self.http_url}/v2/health/ready", timeout=1.0)
        except (OSError, urllib.error.URLError):
            return False
        return code == 200 and port_in_use(self.grpc_port) and port_in_use(self.inner_grpc)

    def log_summary(self, n: int = 3) -> str:
        """The server's last error lines (or last lines), on one line."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        start = max((i for i, ln in enumerate(lines) if ln.startswith("==== msar-export: starting")), default=0)
        lines = [ln.strip() for ln in lines[start + 1:] if ln.strip()]
        errors = [ln for ln in lines if ln[:1] == "E" or "error" in ln.lower()]
        picked = (errors or lines)[-n:]
        return " | ".join(x[:300] for x in picked) or "no output"

    def wait(self) -> int:
        """Until tritonserver or the front exits (the front exits when a backend stub died)."""
        if self.proc is None:
            return 0
        while True:
            for p in (self.proc, self.front):
                if p is not None and p.poll() is not None:
                    return p.returncode
            time.sleep(0.2)

    def exit_reason(self) -> str:
        if self.front is not None and self.front.poll() is not None:
            return f"the request front exited with status {self.front.returncode}: {self.log_summary()}"
        return f"tritonserver exited with status {self.proc.returncode}: {self.log_summary()}"

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM (Triton drains in-flight requests), then SIGKILL to its process group."""
        if self.proc is None:
            return None
        timeout = self.exit_timeout_s + 10 if timeout is None else timeout
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group()
        rc = self.proc.wait()
        if self._log:
            self._log.close()
            self._log = None
        return rc

    def kill(self) -> None:
        """SIGKILL the server and its stubs at once (crash test)."""
        if self.proc is not None:
            self._kill_group()
            self.proc.wait()
        if self._log:
            self._log.close()
            self._log = None

    def _kill_group(self) -> None:
        # Each group is a session this object started (pgid == the child's pid): the
        # server and the backend stubs it spawned, and the front; nothing else.
        for p in (self.proc, self.front):
            if p is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
        self._remove_shm()

    def _remove_shm(self) -> None:
        """A killed Python backend cannot unlink its shared-memory regions; this server's
        regions all start with its own prefix."""
        shm = Path("/dev/shm")
        if shm.is_dir():
            time.sleep(0.1)
            for p in shm.glob(self.shm_prefix + "*"):
                with contextlib.suppress(OSError):
                    p.unlink()

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()
