"""Triton's own load generator, perf_analyzer, against `msar-export serve`, beside our load test.

perf_analyzer 2.51.0 (the binary tritonclient 2.51.0 ships; scripts/setup_triton_env.sh puts
it and the two libraries it links in .venv-triton/perf_analyzer) measures in windows of a
fixed number of requests (`count_windows`) until three in a row agree within the stability
percentage, with the load test's own prompt pool as its `--input-data` (real token ids and
lengths, the shapes the validating front accepts); its figures are read from its CSV report
(`-f`).  Its `--request-count` mode is not used: it rounds the measured time up to whole
seconds (10, 150 and 300 requests at concurrency 4 were reported as 9.9, 148 and 299 req/s).

A run counts only when every request was let through by the front and answered: the front's
refusal and error counters (GET /v2/front/stats, read before and after) did not move,
perf_analyzer exited 0 (it stops at the first failed request), and Triton's success count
for the model grew by exactly the number of infer requests the front passed on, its failure
count not at all.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from ...log import silent
from ...errors import BackendUnavailable, InputError
from ..triton.server import ServerError
from ..triton.env import SETUP_HINT, triton_venv

ENV_VAR = "MSAR_PERF_ANALYZER"  # a perf_analyzer binary to use instead of .venv-triton's
VERSION = "2.51.0"


@dataclass
class PerfSettings:
    concurrency: tuple[int, ...] = (1, 4, 16)
    requests: int = 1000        # per level: our load test's count; perf_analyzer's windows hold a third each
    stability: float = 25.0     # percent: the spread perf_analyzer accepts over its last three windows
    max_trials: int = 10        # windows before it gives up on a stable measurement
    timeout_s: float = 600.0    # per perf_analyzer run

    @property
    def window(self) -> int:
        return max(1, self.requests // 3)


def find_perf_analyzer() -> tuple[Path, dict]:
    """The binary and the environment it runs in; BackendUnavailable with the setup step when absent."""
    given = os.environ.get(ENV_VAR)
    binary = Path(given) if given else triton_venv() / "perf_analyzer" / "bin" / "perf_analyzer"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise BackendUnavailable(f"perf_analyzer is not installed ({binary} is missing); "
                                 f"{SETUP_HINT.replace('(creates .venv-triton)', '(installs it in .venv-triton)')}")
    env = dict(os.environ)
    lib = binary.parent.parent / "lib"  # libb64 and libcudart, fetched beside it by the setup
    if lib.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in (str(lib), env.get("LD_LIBRARY_PATH")) if x)
    return binary, env


def input_data(items, batched: bool) -> dict:
    """perf_analyzer's --input-data JSON: one step per prompt (a batch-1 request each; with
    max_batch_size > 0 Triton's shapes leave the batch dimension out)."""
    steps = []
    for it in items:
        lead = [] if batched else [1]
        step = {"input_ids": {"content": it.ids[0].tolist(), "shape": lead + [int(it.ids.shape[1])]}}
        if it.model == "generate":
            step["max_new_tokens"] = {"content": [int(it.new_tokens)], "shape": lead + [1]}
        steps.append(step)
    return {"data": steps}


def read_csv(path: Path) -> dict:
    """The one row perf_analyzer's -f report has for a single concurrency level (latencies in us)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if len(rows) != 1:
        raise ValueError(f"{path}: {len(rows)} result rows, expected 1")
    r = rows[0]
    return {"concurrency": int(r["Concurrency"]), "throughput_rps": round(float(r["Inferences/Second"]), 2),
            "latency_ms": {"p50": round(int(r["p50 latency"]) / 1e3, 2), "p99": round(int(r["p99 latency"]) / 1e3, 2)}}


def _get(url: str, hint: str = "") -> dict:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors
        raise ServerError(f"{url}: {e}{hint}") from None


def front_stats(http_url: str) -> dict:
    """The validating front's counters per protocol (front.py)."""
    return _get(f"{http_url}/v2/front/stats", " (--perf-analyzer needs a server that `msar-export serve` "
                                               "of this version started)")


def _success_fail(http_url: str, model: str) -> tuple[int, int]:
    st = _get(f"{http_url}/v2/models/{model}/stats")["model_stats"][0]["inference_stats"]
    return int(st["success"].get("count", 0)), int(st["fail"].get("count", 0))


def run_perf_analyzer(url: str, http_url: str, model: str, items, concurrency: int, p: PerfSettings,
                      batched: bool) -> dict:
    """One perf_analyzer run at one concurrency level against `url` (HTTP or gRPC); its figures,
    and what the front and Triton saw, both read at `http_url` (stdlib only: no tritonclient)."""
    from ..triton.client import parse_url

    binary, env = find_perf_analyzer()
    scheme, address = parse_url(url)
    with tempfile.TemporaryDirectory(prefix="msar-perf-") as tmp:
        data, report = Path(tmp) / "input.json", Path(tmp) / "report.csv"
        data.write_text(json.dumps(input_data(items, batched)))
        cmd = [str(binary), "-m", model, "-u", address, "-i", scheme, "--input-data", str(data),
               "--concurrency-range", str(concurrency), "--measurement-mode", "count_windows",
               "--measurement-request-count", str(p.window), "-s", f"{p.stability:g}", "-r", str(p.max_trials),
               "-f", str(report)]
        front0, triton0 = front_stats(http_url)[scheme], _success_fail(http_url, model)
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=p.timeout_s, env=env)
            rc, tail = proc.returncode, [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()][-2:]
        except subprocess.TimeoutExpired:
            rc, tail = None, [f"killed after {p.timeout_s:g} s"]
        elapsed = time.perf_counter() - t
        deadline = time.monotonic() + 10
        while True:  # requests the front passed on just before perf_analyzer exited may still be running
            front1, triton1 = front_stats(http_url)[scheme], _success_fail(http_url, model)
            passed = front1["infer_answered"] - front0["infer_answered"]
            if triton1[0] - triton0[0] >= passed or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        figures = read_csv(report) if rc == 0 and report.is_file() else None
    out = {"tool": "perf_analyzer", "url": url, "protocol": scheme, "model": model, "concurrency": concurrency,
           "requests": passed, "exit_status": rc, "duration_s": round(elapsed, 2),
           "front": {k: front1[k] - front0[k] for k in ("refused", "upstream_errors", "infer_answered")},
           "triton": {"succeeded": triton1[0] - triton0[0], "failed": triton1[1] - triton0[1]},
           "command": " ".join(Path(c).name if c == str(binary) else c for c in cmd),
           **(figures or {"throughput_rps": None, "latency_ms": {}})}
    problems = []
    if rc != 0:
        hint = " (allow more spread with --stability, or larger windows with --max-requests)" \
            if any("stable measurement" in ln for ln in tail) else ""
        problems.append(f"perf_analyzer exit status {rc}: {' | '.join(tail)[:400]}{hint}")
    if out["front"]["refused"] or out["front"]["upstream_errors"]:
        problems.append(f"the front refused {out['front']['refused']} request(s) and saw "
                        f"{out['front']['upstream_errors']} error answer(s)")
    if out["triton"] != {"succeeded": passed, "failed": 0} or not passed:
        problems.append(f"Triton answered {out['triton']['succeeded']} of the {passed} infer requests the front "
                        f"passed on ({out['triton']['failed']} failed)")
    out["problems"] = problems
    return out


def http_url_of(urls: list[str]) -> str:
    """The server's HTTP URL among `urls`: the front's counters and Triton's statistics are read there."""
    from ..triton.client import parse_url

    for u in urls:
        scheme, address = parse_url(u)
        if scheme == "http":
            return f"http://{address}"
    raise InputError("--perf-analyzer: give the server's HTTP URL too (--url http://127.0.0.1:PORT): "
                     "the front's counters are read there")


def compare(urls: list[str], s, p: PerfSettings, prefill=None, decode=None, say=None) -> dict:
    """perf_analyzer and our load test at each concurrency level, per protocol and model; each row
    to `say` as it is measured."""
    say = say or silent
    from .loadtest import make_pool, run_load

    http_url = http_url_of(urls)
    find_perf_analyzer()
    rows = []
    for url in urls:
        for model in s.models:
            config = _get(f"{http_url}/v2/models/{model}/config")
            params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
            one = replace(s, models=(model,))
            items = make_pool(one, int(params["vocab_size"]), int(params["max_seq_len"]))
            batched = int(config.get("max_batch_size", 0)) > 0
            for c in p.concurrency:
                pa = run_perf_analyzer(url, http_url, model, items, c, p, batched)
                say(format_row(pa))
                ours = run_load(url, replace(one, clients=c, max_requests=p.requests), prefill, decode, progress=None)
                rows.append({"perf_analyzer": pa, "loadtest": ours})
                say(format_row(_ours_row(ours, model, c)))
    return {"date": rows[0]["loadtest"]["date"] if rows else None,
            "machine": rows[0]["loadtest"]["machine"] if rows else None,
            "perf_analyzer": VERSION, "settings": {"requests_per_level": p.requests,
                                                   "concurrency": list(p.concurrency), "models": list(s.models)},
            "rows": rows}


def _ours_row(r: dict, model: str, c: int) -> dict:
    return {"tool": "msar-export loadtest", "protocol": r["protocol"], "model": model, "concurrency": c,
            "requests": r["requests"], "throughput_rps": r["throughput_rps"], "latency_ms": r["latency_ms"],
            "problems": [f"{r['errors']} errors, {r['mismatches']} mismatches"] if r["errors"] or r["mismatches"]
            else []}


def format_row(r: dict) -> str:
    lat = r.get("latency_ms") or {}
    tail = "; ".join(r["problems"]) if r["problems"] else "all answered"
    return (f"{r['tool']:<21} {r['protocol']:<4} {r['model']:<8} concurrency {r['concurrency']:>2}: "
            f"{r['requests']} requests, {r['throughput_rps']} req/s, p50 {lat.get('p50')} ms, "
            f"p99 {lat.get('p99')} ms; {tail}")


def format_table(result: dict) -> str:
    """The Markdown table docs/serving.md carries."""
    lines = ["| protocol | model | concurrency | perf_analyzer req/s | p50 ms | p99 ms "
             "| loadtest req/s | p50 ms | p99 ms |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in result["rows"]:
        pa, us = row["perf_analyzer"], row["loadtest"]
        a, b = pa.get("latency_ms") or {}, us.get("latency_ms") or {}
        model = next(iter(us["per_model"]))
        lines.append(f"| {pa['protocol']} | {model} | {pa['concurrency']} | {pa['throughput_rps']} | {a.get('p50')} "
                     f"| {a.get('p99')} | {us['throughput_rps']} | {b.get('p50')} | {b.get('p99')} |")
    return "\n".join(lines)


def failed(result: dict) -> bool:
    from .loadtest import run_failed

    return any(row["perf_analyzer"]["problems"] or run_failed(row["loadtest"]) for row in result["rows"])
