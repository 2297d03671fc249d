"""Triton's perf_analyzer against the shared `msar-export serve` (serving_fixtures.py): every
request it sends passes the validating front and is answered, over HTTP and gRPC; requests
the front refuses, and ones Triton answers with an error, fail the run (negative controls)."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from hostile_helpers import run_main
from serving_fixtures import CLI, REPO, SETUP, run_cli  # the fixtures: conftest.py


@pytest.fixture(scope="session")
def perf_analyzer(triton):
    """The binary setup_triton_env.sh installs (the setup runs again if an older .venv-triton lacks it)."""
    from msar_export.errors import BackendUnavailable
    from msar_export.serving.load.perf_analyzer import find_perf_analyzer

    try:
        return find_perf_analyzer()
    except BackendUnavailable:
        out = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=600, cwd=REPO)
    try:
        return find_perf_analyzer()
    except BackendUnavailable as e:
        pytest.skip(f"{e} ({(out.stderr.strip().splitlines() or ['no output'])[-1][:200]})")


def test_perf_analyzer_requests_all_pass_the_front_and_are_answered(served, perf_analyzer, tmp_path):
    """A short run: 16 concurrent streams (opened at once: the front's listen queue must hold them),
    windows of 20 requests, on both protocols, beside our load test."""
    out = tmp_path / "perf.json"
    r = run_cli("loadtest", "--perf-analyzer", "--url", served["http"], "--url", served["grpc"], "--models", "logits",
                "--concurrency", 16, "--max-requests", 60, "--stability", 200, "--seconds", 5, "--pool", 8,
                "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["perf_analyzer"]["protocol"] for row in rows] == ["http", "grpc"]
    for row in rows:
        pa, ours = row["perf_analyzer"], row["loadtest"]
        assert pa["exit_status"] == 0 and pa["problems"] == [], pa
        assert pa["front"]["refused"] == 0 and pa["front"]["upstream_errors"] == 0, pa
        assert pa["requests"] >= 60 and pa["triton"] == {"succeeded": pa["requests"], "failed": 0}, pa
        assert pa["throughput_rps"] > 0 and 0 < pa["latency_ms"]["p50"] <= pa["latency_ms"]["p99"], pa
        assert ours["errors"] == 0 and ours["mismatches"] == 0 and ours["ok"] == 60, ours
    assert "| http | logits | 16 |" in r.stdout and "| grpc | logits | 16 |" in r.stdout, r.stdout


def _run_one(served, ids, protocol="http"):
    """perf_analyzer with these prompts (this environment: no tritonclient needed)."""
    from msar_export.serving.load.loadtest import Item
    from msar_export.serving.load.perf_analyzer import PerfSettings, run_perf_analyzer

    items = [Item("logits", np.asarray([ids], dtype=np.int64))]
    settings = PerfSettings(requests=6, stability=200, max_trials=3, timeout_s=120)
    return run_perf_analyzer(served[protocol], served["http"], "logits", items, 1, settings, batched=True)


def test_refused_or_failed_requests_fail_the_run(served, graphs, perf_analyzer):
    """Negative controls for the counters the run is judged by: prompts longer than the front
    accepts (max batch 8 x 128 tokens) are refused there; token ids outside the vocabulary pass
    the front and the model answers them with an error (which Triton's statistics do not count
    as failed: the front's counter is what shows it).  Control: valid ids pass."""
    vocab = graphs["cfg"]["vocab_size"]
    good = _run_one(served, [1, 2, 3, vocab - 1], "grpc")
    assert good["problems"] == [] and good["front"]["refused"] == 0 and good["triton"]["succeeded"] > 0, good

    refused = _run_one(served, [1] * (8 * 128 + 1))
    assert refused["exit_status"] != 0 and refused["front"]["refused"] > 0, refused
    assert any("refused" in p for p in refused["problems"]), refused["problems"]

    failed = _run_one(served, [1, 2, vocab])
    assert failed["exit_status"] != 0 and failed["front"]["upstream_errors"] > 0, failed
    assert any("error answer" in p for p in failed["problems"]) and failed["front"]["refused"] == 0, failed


def _cli(*args, **env):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, **env})


def test_without_perf_analyzer_one_line_and_exit_2(tmp_path):
    """(Its control: the runs above, where it is installed.)  A child process: the one line and the exit
    status as a shell sees them (the tests below decide in this process)."""
    r = _cli("loadtest", "--perf-analyzer", "--url", "http://127.0.0.1:9",
             MSAR_PERF_ANALYZER=str(tmp_path / "missing" / "perf_analyzer"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stdout + r.stderr
    assert "perf_analyzer is not installed" in lines[0] and "setup_triton_env.sh" in lines[0], lines[0]


@pytest.mark.parametrize("args, says", [
    (["--perf-analyzer", "--url", "grpc://127.0.0.1:9"], "HTTP URL"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "4"], "go with --perf-analyzer"),
    (["--perf-analyzer", "--url", "http://127.0.0.1:9", "--concurrency", "0"], "concurrency"),
])
def test_perf_analyzer_usage_errors_are_one_line(args, says):
    r = run_main("loadtest", *args, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and says in lines[0], r.stdout + r.stderr


def test_no_server_there_is_one_line(perf_analyzer):
    r = run_main("loadtest", "--perf-analyzer", "--url", "http://127.0.0.1:9", "--models", "logits", text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "127.0.0.1:9" in lines[-1] and "Traceback" not in r.stderr, r.stdout + r.stderr


@pytest.mark.slow  # the fuller run of the default-tier test above: both models, concurrency 1, 4 and 16
def test_perf_analyzer_at_each_concurrency_both_models(served, perf_analyzer, tmp_path):
    out = tmp_path / "perf.json"
    r = run_cli("loadtest", "--perf-analyzer", "--url", served["http"], "--url", served["grpc"],
                "--max-requests", 90, "--stability", 200, "--seconds", 10, "--new-tokens", 4, "--json", out,
                timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(x["perf_analyzer"]["protocol"], x["perf_analyzer"]["model"], x["perf_analyzer"]["concurrency"])
            for x in rows] == [(p, m, c) for p in ("http", "grpc") for m in ("logits", "generate") for c in (1, 4, 16)]
    for x in rows:
        pa = x["perf_analyzer"]
        assert pa["problems"] == [] and pa["front"]["refused"] == 0 and pa["triton"]["succeeded"] == pa["requests"]
        assert x["loadtest"]["mismatches"] == 0 and x["loadtest"]["errors"] == 0
