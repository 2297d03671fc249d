"""The load test against the shared server (serving_fixtures.py): both protocols,
malformed requests mixed in, answers judged against float64 with a faulty and a
foreign checkpoint as negative controls, and the job that travels to .venv-triton."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_checkpoint
from serving_fixtures import run_cli  # the fixtures: conftest.py


# The load generator and its negative control go to the slow tier together: each run is its own
# .venv-triton process and seconds of load; served answers are checked against ONNX Runtime in the
# default tier by test_served_answers_equal_onnx_runtime (and hostile requests by test_serving.py).
@pytest.mark.slow
def test_loadtest_http_and_grpc_zero_mismatches(served, tmp_path):
    """4 clients x 3 s on each protocol, mixed lengths, every answer checked (runs in .venv-triton)."""
    out = tmp_path / "load.json"
    r = run_cli("loadtest", "--url", served["http"], "--url", served["grpc"], "--clients", 4, "--seconds", 3,
                "--max-requests", 5000, "--min-len", 1, "--max-len", 120, "--new-tokens", 6, "--pool", 24,
                "--hostile-every", 7, "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [x["protocol"] for x in runs] == ["http", "grpc"]
    for x in runs:
        assert x["requests"] > 20 and x["errors"] == 0 and x["mismatches"] == 0, x
        assert x["hostile"]["sent"] >= 3 and x["hostile"]["refused"] == x["hostile"]["sent"], x["hostile"]
        assert x["server_ready_after"] is True
        assert x["ok"] == x["requests"] and set(x["latency_ms"]) >= {"p50", "p95", "p99"}
        assert x["per_model"]["logits"]["ok"] > 0 and x["per_model"]["generate"]["ok"] > 0
        assert x["server"]["generate"]["dynamic_batching"] is True
        assert x["machine"]["cpu_cores"] and x["date"]
    assert "req/s" in r.stdout and "p99" in r.stdout and "malformed requests:" in r.stdout


@pytest.mark.slow  # with the comparison it guards (test_loadtest_http_and_grpc_zero_mismatches)
def test_loadtest_judged_against_float64_and_a_faulty_checkpoint_fails(served, graphs, tmp_path):
    """--checkpoint: logits judged by the verdict model against the eager float64 run;
    the negative control is the same server judged against a checkpoint whose source-0
    kernel-4 taps are 2% larger, which must fail, and one of another shape, refused."""
    from msar_export.checkpoint import load_checkpoint, save_checkpoint

    common = ["--url", served["http"], "--clients", 2, "--seconds", 2, "--max-requests", 40, "--models", "logits",
              "--min-len", 1, "--max-len", 40, "--pool", 8]
    out = tmp_path / "ok.json"
    r = run_cli("loadtest", *common, "--checkpoint", graphs["ckpt"], "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["mismatches"] == 0 and report["ok"] > 0, report
    assert "eager float64" in report["references"]["logits_judged_against"]

    model = load_checkpoint(graphs["ckpt"])
    with torch.no_grad():
        model.sources["0"].conv["1"].weight.mul_(1.02)
    bad = save_checkpoint(model, tmp_path / "faulty")
    r = run_cli("loadtest", *common, "--checkpoint", bad)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "mismatch:" in r.stdout and "bound" in r.stdout, r.stdout

    other, _ = make_checkpoint(tmp_path / "other", seed=1, n_blocks=2)
    r = run_cli("loadtest", *common, "--checkpoint", other)
    assert r.returncode == 2 and "not the served model" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_loadtest_rejects_non_loopback_targets(triton):
    r = run_cli("loadtest", "--url", "http://10.1.2.3:8000", "--seconds", 1, timeout=120)
    assert r.returncode == 2 and "only targets this machine" in r.stderr




def test_load_job_travels_to_the_triton_venv_as_json():
    """The job .venv-triton runs is the one the CLI built, field for field."""
    from msar_export.serving.load.job import LoadJob
    from msar_export.serving.load.loadtest import CompareSettings, LoadSettings

    job = LoadJob(urls=["http://127.0.0.1:1"], settings=LoadSettings(models=("logits",), checkpoint="/ck", rtol=3e-4),
                  compare=CompareSettings(max_batch=4, workdir="/w"), prefill="/p.onnx", json_out="/o.json")
    assert LoadJob.from_json(job.to_json()) == job
    plain = LoadJob(urls=["grpc://[::1]:2"], settings=LoadSettings())
    assert LoadJob.from_json(plain.to_json()) == plain
    from msar_export.serving.load.perf_analyzer import PerfSettings

    perf = LoadJob(urls=["http://127.0.0.1:1"], settings=LoadSettings(), perf=PerfSettings((2, 8), 90, 40.0))
    assert LoadJob.from_json(perf.to_json()) == perf and perf != plain
