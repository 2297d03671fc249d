"""Run a command in a child process and report its wall time and peak RSS: its own
(rusage, which spans an exec) and the sampled sum over its process tree, all of it and its
anonymous part (file pages of a mapped checkpoint or data file count in RSS but are the
kernel's to drop).  With a floor on the system's MemAvailable the child's whole process
group is killed when memory runs that low, so a run too big for the machine fails on its
own rather than waking the OOM killer for whatever else runs here."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time

SAMPLE_S = 0.025


def _tree_rss_mb(pid: int) -> tuple[float, float]:
    """VmRSS and RssAnon (MiB) summed over `pid` and its descendants (0 for a process that is gone)."""
    rss, anon, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                fields = dict(ln.split(":", 1) for ln in f if ln.startswith(("VmRSS:", "RssAnon:")))
            rss += int(fields.get("VmRSS", "0 kB").split()[0])
            anon += int(fields.get("RssAnon", "0 kB").split()[0])
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return rss / 1024, anon / 1024


def mem_available_mib() -> float:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:")) / 1024


class _Watch:
    """The sampler's findings: peaks over the tree, the lowest MemAvailable seen, and why
    the tree was killed (None when it was not)."""

    def __init__(self, min_available_mib: float | None):
        self.floor, self.rss, self.anon, self.available, self.aborted = min_available_mib, 0.0, 0.0, math.inf, None

    def sample(self, pid: int) -> None:
        rss, anon = _tree_rss_mb(pid)
        self.rss, self.anon = max(self.rss, rss), max(self.anon, anon)
        self.available = min(self.available, mem_available_mib())
        if self.floor is not None and self.available < self.floor and self.aborted is None:
            self.aborted = (f"killed: MemAvailable {self.available:.0f} MiB < {self.floor:.0f} MiB "
                            f"(tree RSS {rss:.0f} MiB, anonymous {anon:.0f})")
            _kill_group(pid)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child leads its own group (start_new_session)
    except OSError:
        pass


def _sample_tree(pid: int, done: threading.Event, watch: _Watch) -> None:
    while not done.wait(SAMPLE_S):
        watch.sample(pid)


def _drain(stream, into: list) -> None:
    into.append(stream.read())
    stream.close()


def _reset_own_peak() -> None:
    """A child's rusage peak starts at this process's peak RSS (the kernel carries it over the
    fork and the exec): a bench that made the checkpoint itself would lend every child that
    peak.  Writing 5 to clear_refs resets this process's peak to its current RSS (Linux 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def run_probe(args: list[str], env: dict | None = None, min_available_mib: float | None = None) -> dict:
    """min_available_mib: kill the child's process group when the system's MemAvailable
    falls below it (the result's "aborted" says so; its returncode is -9)."""
    _reset_own_peak()
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    done, watch, out, err = threading.Event(), _Watch(min_available_mib), [], []
    # read while it runs (a full pipe would block the child), sample its tree's RSS
    threads = [threading.Thread(target=_sample_tree, args=(p.pid, done, watch), daemon=True),
               threading.Thread(target=_drain, args=(p.stdout, out), daemon=True),
               threading.Thread(target=_drain, args=(p.stderr, err), daemon=True)]
    for t in threads:
        t.start()
    try:
        _, status, usage = os.wait4(p.pid, 0)  # this child's own rusage (spans an exec), not the max over all children
    except BaseException:  # interrupted (Ctrl-C, SIGTERM made an exception): the child's tree goes with this run
        done.set()
        _kill_group(p.pid)
        p.wait()
        raise
    # the group once more: a grandchild the child left behind would hold the pipes open
    _kill_group(p.pid)
    p.returncode = code = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    done.set()
    for t in threads:
        t.join()
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "tree_peak_rss_mb": round(watch.rss, 1),
            "tree_peak_anon_mb": round(watch.anon, 1), "min_available_mb": None if watch.available == math.inf else round(watch.available, 1),
            "aborted": watch.aborted, "returncode": code, "stdout": out[0].decode()[-2000:],
            "stderr": err[0].decode()[-2000:]}


def cli_probe(*args: str, env: dict | None = None, min_available_mib: float | None = None) -> dict:
    return run_probe([sys.executable, "-m", "msar_export.cli", *args], env, min_available_mib)


def python_probe(code: str) -> dict:
    return run_probe([sys.executable, "-c", code])
