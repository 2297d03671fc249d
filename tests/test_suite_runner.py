"""scripts/test.sh's pytest-xdist flags: a worker that crashes (a segfault in native code) ends
the run with a failure that names the test, rather than a run that never finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CRASHING = """import os, signal, time
def test_before(): time.sleep(1)
def test_segfault(): os.kill(os.getpid(), signal.SIGSEGV)
def test_after(): pass
"""
FINE = "import time\ndef test_one(): time.sleep(1)\ndef test_two(): pass\n"


def worker_flags() -> list[str]:
    """The `workers` array scripts/test.sh hands pytest, read by bash from the script itself."""
    script = 'eval "$(grep -E "^workers=" scripts/test.sh)"; printf "%s\\n" "${workers[@]}"'
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, env={**os.environ, "MSAR_TEST_WORKERS": "2"},
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


def run_suite(folder: Path, flags: list[str], timeout: float) -> subprocess.CompletedProcess:
    (folder / "test_a_crash.py").write_text(CRASHING)
    for name in "bcde":
        (folder / f"test_{name}_fine.py").write_text(FINE)
    # A session of its own, so a run that hangs is ended with its xdist workers.
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *flags, str(folder)],
                            cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_flags_are_read_from_the_script():
    flags = worker_flags()
    assert flags[:4] == ["-n", "2", "--dist", "loadfile"], flags


def test_a_crashed_worker_fails_the_run_at_once(tmp_path):
    r = run_suite(tmp_path, worker_flags(), timeout=120)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "crashed while running 'test_a_crash.py::test_segfault'" in r.stdout, r.stdout[-2000:]


def test_control_replacing_the_crashed_worker_hangs(tmp_path):
    """Negative control: without --max-worker-restart 0, pytest-xdist 3.8.0 replaces the worker
    and its loadfile scheduler waits forever at the end of the run."""
    flags = worker_flags()
    i = flags.index("--max-worker-restart")
    with pytest.raises(subprocess.TimeoutExpired):
        run_suite(tmp_path, flags[:i] + flags[i + 2:], timeout=20)
