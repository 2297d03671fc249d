"""Run a command in a child process and report its wall time and own peak RSS."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def run_probe(args: list[str], env: dict | None = None) -> dict:
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(p.pid, 0)  # this child's own rusage, not the max over all children
    seconds = time.perf_counter() - t0
    out, err = p.stdout.read().decode(), p.stderr.read().decode()
    p.stdout.close()
    p.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "returncode": code,
            "stdout": out[-2000:], "stderr": err[-2000:]}


def cli_probe(*args: str) -> dict:
    return run_probe([sys.executable, "-m", "msar_export.cli", *args])


def python_probe(code: str) -> dict:
    return run_probe([sys.executable, "-c", code])
