"""Run a command in a child process and report its wall time and peak RSS: its own
(rusage, which spans an exec) and the sampled sum over its process tree."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

SAMPLE_S = 0.025


def _tree_rss_mb(pid: int) -> float:
    """VmRSS summed over `pid` and its descendants (0 for a process that is gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total / 1024


def _sample_tree(pid: int, done: threading.Event, peak: list) -> None:
    while not done.wait(SAMPLE_S):
        peak[0] = max(peak[0], _tree_rss_mb(pid))


def _drain(stream, into: list) -> None:
    into.append(stream.read())
    stream.close()


def run_probe(args: list[str], env: dict | None = None) -> dict:
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    done, peak, out, err = threading.Event(), [0.0], [], []
    # read while it runs (a full pipe would block the child), sample its tree's RSS
    threads = [threading.Thread(target=_sample_tree, args=(p.pid, done, peak), daemon=True),
               threading.Thread(target=_drain, args=(p.stdout, out), daemon=True),
               threading.Thread(target=_drain, args=(p.stderr, err), daemon=True)]
    for t in threads:
        t.start()
    _, status, usage = os.wait4(p.pid, 0)  # this child's own rusage (spans an exec), not the max over all children
    p.returncode = code = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    done.set()
    for t in threads:
        t.join()
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "tree_peak_rss_mb": round(peak[0], 1),
            "returncode": code, "stdout": out[0].decode()[-2000:], "stderr": err[0].decode()[-2000:]}


def cli_probe(*args: str) -> dict:
    return run_probe([sys.executable, "-m", "msar_export.cli", *args])


def python_probe(code: str) -> dict:
    return run_probe([sys.executable, "-c", code])
