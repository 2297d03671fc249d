"""Triton serving: a real tritonserver on a free loopback port, real requests over
HTTP and gRPC, malformed requests, a crash and restart, and every generated
config.pbtxt parsed with Triton's ModelConfig schema (the load test is in
test_serving_load.py; the shared server in serving_fixtures.py).

The server lives in .venv-triton (nvidia-pytriton pins numpy<2).  When it is
missing, the session creates it with scripts/setup_triton_env.sh (about a minute
with PyPI reachable); tests that need it skip, with the reason, only when that
fails or when the tritonserver binary cannot start on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from msar_export.serving.repository.triton_model import MsarOnnx, Served, plan_groups
from msar_export.serving.repository.writer import MANIFEST, build_serving_repo, build_stock_repo, verify_repo
from msar_export.serving.triton.client import infer_json, json_tensor
from msar_export.verdict import rel_err
from serving_fixtures import REPO, generate_request, ids_of, logits_request, output, run_cli  # fixtures: conftest.py


def test_plan_groups_merges_only_similar_lengths():
    assert plan_groups([10, 50, 12, 48, 11], max_rows=8, merge_tokens=3) == [[1, 3], [2, 4, 0]]
    assert plan_groups([5, 5, 5], max_rows=2, merge_tokens=0) == [[0, 1], [2]]
    assert plan_groups([9], 4, 8) == [[0]]


def test_batched_model_logic_matches_batch1_ort(graphs, refs):
    """The code model.py runs in Triton, outside Triton: mixed lengths and token counts in
    one batch equal batch-1 ONNX Runtime (logits within 1e-4, tokens exactly)."""
    ref_logits, ref_dec = refs
    cfg = graphs["cfg"]
    gen = Served("generate", MsarOnnx(str(graphs["decode"])), max_rows=8, merge_tokens=4, max_new_tokens_limit=64)
    log = Served("logits", MsarOnnx(str(graphs["prefill"])), max_rows=8, merge_tokens=4, max_new_tokens_limit=64)
    batch = [(ids_of(cfg, T, T), n) for T, n in ((3, 5), (17, 9), (19, 2), (60, 7), (1, 4), (33, 12))]
    batch.append((ids_of(cfg, 21, 99, batch=2), 3))  # one request with two rows
    for (ids, n), out in zip(batch, gen.run(batch)):
        want = ref_dec.generate(torch.from_numpy(ids), max_new_tokens=n)[:, ids.shape[1]:].numpy()
        np.testing.assert_array_equal(out, want)
    for (ids, _), out in zip(batch, log.run([(ids, 0) for ids, _ in batch])):
        assert rel_err(out, ref_logits.logits(ids)) <= 1e-4


STANDALONE = """
import importlib, sys
for name in ("msar_export", "torch", "polygraphy"):  # what Triton's Python environment lacks
    sys.modules[name] = None
sys.path[:0] = [sys.argv[1]]
model = importlib.import_module("1.model")  # as Triton's stub imports it
import numpy as np
m = model.MsarOnnx(sys.argv[2])
out = m.generate([[np.arange(1, 6)]], [[4]])[0][0]
print(type(m.graph).__module__, " ".join(map(str, out)))
"""


def test_served_model_runs_on_the_copied_runner_without_msar_export(graphs, refs, tmp_path):
    """The repository's model.py runs the one ONNX Runtime runner, copied beside it, where
    neither msar_export nor torch can be imported (Triton's Python environment)."""
    repo, _ = build_serving_repo(None, graphs["decode"], tmp_path / "repo", validate=False)
    version = repo / "generate" / "1"
    assert (version / "ort_runner.py").read_bytes() == (REPO / "msar_export" / "runners" / "ort_runner.py").read_bytes()
    r = subprocess.run([sys.executable, "-c", STANDALONE, str(version.parent), str(version / "model.onnx")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    module, *tokens = r.stdout.split()
    want = refs[1].generate(torch.arange(1, 6)[None], max_new_tokens=4)[0, 5:].tolist()
    assert module == "ort_runner" and [int(t) for t in tokens] == want


def test_triton_repo_on_non_onnx_file_exits_2_with_one_line(tmp_path):
    for name, data in (("model.onnx", b"this is not a protobuf\n"), ("notes.txt", b"hello\n")):
        bad = tmp_path / name
        bad.write_bytes(data)
        r = run_cli("triton-repo", bad, "-o", tmp_path / f"repo-{name}")
        assert r.returncode == 2, (name, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("msar-export triton-repo: error:"), r.stderr
        assert not (tmp_path / f"repo-{name}").exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".repo-{name}")], "temp dir left behind"


# -- configs against Triton's ModelConfig schema ------------------------------------------------

def parsed_configs(triton, paths):
    script = REPO / "msar_export" / "serving" / "repository" / "pbtxt_check.py"
    out = subprocess.run([str(triton.python), str(script), "--dump", *map(str, paths)],
                         capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_generated_config_parses_with_model_config_schema(triton, graphs, tmp_path):
    # triton-repo: onnxruntime for both graphs, tensorrt for an engine (I/O from its ONNX), plugins copied in
    # (build_* validate with the schema themselves; the dump below re-parses every file for the asserts)
    r = run_cli("triton-repo", graphs["prefill"], "-o", tmp_path / "ort2", "--name", "msar")
    assert r.returncode == 0 and "validated with Triton's ModelConfig schema" in r.stdout, r.stderr
    build_stock_repo(graphs["prefill"], tmp_path / "ort4", batching=False, instances=2)
    build_stock_repo(graphs["decode"], tmp_path / "dec")
    engine, plugin = tmp_path / "model.plan", tmp_path / "libmsar_plugins.so"
    engine.write_bytes(b"\0" * 64)
    plugin.write_bytes(b"\0" * 16)
    build_stock_repo(engine, tmp_path / "trt", name="msar_trt", onnx_for_engine=graphs["prefill"], plugins=[plugin])
    # the serving repositories (Python backend), with and without dynamic batching
    build_serving_repo(graphs["prefill"], graphs["decode"], tmp_path / "srv", max_batch=4)
    build_serving_repo(None, graphs["decode"], tmp_path / "srv1", batching=False)
    paths = sorted(tmp_path.glob("*/*/config.pbtxt"))
    assert len(paths) >= 7
    cfgs = parsed_configs(triton, paths)
    assert all("error" not in c for c in cfgs.values()), cfgs
    by = {str(Path(k).relative_to(tmp_path).parent): c for k, c in cfgs.items()}

    msar = by["ort2/msar"]
    assert msar["backend"] == "onnxruntime" and msar["max_batch_size"] == 8 and "dynamic_batching" in msar
    assert msar["input"] == [{"name": "input_ids", "data_type": "TYPE_INT64", "dims": ["-1"]}]
    assert msar["output"][0]["dims"] == ["-1", str(graphs["cfg"]["vocab_size"])]
    assert "dynamic_batching" not in by["ort4/prefill"] and by["ort4/prefill"]["instance_group"][0]["count"] == 2
    dec = by["dec/decode"]  # conv state has batch second: no implicit batch dim
    assert dec.get("max_batch_size", 0) == 0 and "dynamic_batching" not in dec
    conv = next(t for t in dec["input"] if t["name"] == "past_conv_state")
    assert conv["dims"][1] == "-1" and conv["data_type"] == "TYPE_FP32"
    assert {t["name"] for t in dec["output"]} >= {"logits", "present_conv_state", "present.0.key"}
    trt = by["trt/msar_trt"]
    assert trt["backend"] == "tensorrt" and trt["instance_group"][0]["kind"] == "KIND_GPU"
    assert (tmp_path / "trt" / "msar_trt" / "1" / "model.plan").is_file()
    assert (tmp_path / "trt" / "msar_trt" / "plugins" / plugin.name).is_file()
    readme = (tmp_path / "trt" / "README.md").read_text()
    assert "LD_PRELOAD=" in readme and "--backend-config=tensorrt,plugins=" in readme
    gen = by["srv/generate"]
    assert gen["backend"] == "python" and gen["max_batch_size"] == 4 and "dynamic_batching" in gen
    assert gen["input"][0].get("allow_ragged_batch") is True
    assert "dynamic_batching" not in by["srv1/logits"]
    assert by["srv1/logits"]["parameters"]["graph"]["string_value"] == "decode"
    for repo in ("ort2", "dec", "srv", "srv1"):
        assert verify_repo(tmp_path / repo) == []
        assert (tmp_path / repo / "README.md").is_file()


def test_schema_rejects_a_broken_config(triton, tmp_path):
    bad = tmp_path / "m" / "config.pbtxt"
    bad.parent.mkdir()
    bad.write_text('name: "m"\nbackend: "onnxruntime"\nmax_batch_sise: 4\n')
    assert "does not parse" in parsed_configs(triton, [bad])[str(bad)]["error"]


# -- the running server -------------------------------------------------------------------------

def test_served_answers_equal_onnx_runtime(served, graphs, refs):
    ref_logits, ref_dec = refs
    cfg = graphs["cfg"]
    for T in (1, 9, 40, 128):
        ids = ids_of(cfg, T, T)
        code, body = infer_json(served["http"], "logits", logits_request(ids))
        assert code == 200, body
        assert rel_err(output(body), ref_logits.logits(ids)) <= 1e-4
    for T, n in ((5, 6), (30, 17)):
        ids = ids_of(cfg, T, 100 + T, batch=2)
        code, body = infer_json(served["http"], "generate", generate_request(ids, n))
        assert code == 200, body
        want = ref_dec.generate(torch.from_numpy(ids), max_new_tokens=n)[:, T:].numpy()
        np.testing.assert_array_equal(output(body), want)


def test_malformed_requests_get_clear_errors_and_the_server_keeps_serving(served, graphs, refs):
    cfg, url = graphs["cfg"], served["http"]
    V, L = cfg["vocab_size"], cfg["max_seq_len"]
    good = ids_of(cfg, 12, 7)
    cases = [
        ("logits", [json_tensor("input_ids", good, "INT32")], "data-type is 'INT32'"),
        ("logits", [json_tensor("input_ids", good[0, :4], "INT64")], "unexpected shape"),
        ("logits", [json_tensor("input_ids", good[None], "INT64")], "unexpected shape"),
        ("logits", logits_request(np.array([[1, V]])), f"token id {V} is outside the vocabulary [0, {V})"),
        ("logits", logits_request(np.array([[-3, 1]])), "token id -3 is outside the vocabulary"),
        ("logits", logits_request(np.ones((1, L + 1), np.int64)), f"exceeds max_seq_len={L}"),
        ("logits", logits_request(np.ones((9, 4), np.int64)), "batch"),                  # > max_batch_size 8
        ("generate", generate_request(ids_of(cfg, L - 2, 1), 5), f"exceeds max_seq_len={L}"),
        ("generate", generate_request(good, 0), "max_new_tokens must be in [1,"),
        ("generate", [json_tensor("input_ids", good, "INT64")], "max_new_tokens"),
        ("generate", generate_request(good, 3)[:1] + [json_tensor("max_new_tokens", [[3]], "INT64")], "data-type"),
        ("nosuchmodel", logits_request(good), "nosuchmodel"),
    ]
    for model, inputs, expect in cases:
        code, body = infer_json(url, model, inputs)
        assert 400 <= code < 500, (model, expect, code, body)
        assert expect in body.get("error", ""), (expect, body)
        # ... and a good request right after each bad one
        code, body = infer_json(url, "logits", logits_request(good))
        assert code == 200, body
    assert rel_err(output(body), refs[0].logits(good)) <= 1e-4


def test_crash_and_restart_lose_no_committed_files(triton, graphs, refs, tmp_path):
    """SIGKILL the server (and its stubs) mid-traffic, then SIGTERM it: the repository is
    intact each time, and a restart reuses it and answers as before."""
    from msar_export.serving.triton.server import TritonServer, free_port

    repo, rebuilt = build_serving_repo(graphs["prefill"], graphs["decode"], tmp_path / "repo", max_batch=4)
    assert rebuilt and verify_repo(repo) == []
    manifest = (repo / MANIFEST).read_text()
    ids = ids_of(graphs["cfg"], 20, 3)
    want = refs[1].generate(torch.from_numpy(ids), max_new_tokens=8)[:, 20:].numpy()
    for how in ("kill", "stop"):
        server = TritonServer(repo, free_port(), free_port()).start()
        stop_traffic = threading.Event()

        def traffic(url, stop):  # bounded: at most 200 requests, ends when the server is gone
            for _ in range(200):
                if stop.is_set():
                    return
                try:
                    infer_json(url, "logits", logits_request(ids), timeout=10)
                except OSError:
                    return

        th = threading.Thread(target=traffic, args=(server.http_url, stop_traffic), daemon=True)
        try:
            code, body = infer_json(server.http_url, "generate", generate_request(ids, 8))
            assert code == 200 and np.array_equal(output(body), want), body
            th.start()
            time.sleep(0.3)
        finally:
            server.kill() if how == "kill" else server.stop()
            stop_traffic.set()
            th.join(30) if th.is_alive() else None
        assert server.proc.returncode is not None
        assert verify_repo(repo) == [] and (repo / MANIFEST).read_text() == manifest
        again, rebuilt = build_serving_repo(graphs["prefill"], graphs["decode"], tmp_path / "repo", max_batch=4)
        assert again == repo and not rebuilt, "an intact repository is reused, not rewritten"
    # changed options: rebuilt atomically in place, nothing half-written left beside it
    _, rebuilt = build_serving_repo(graphs["prefill"], graphs["decode"], tmp_path / "repo", max_batch=2)
    assert rebuilt and verify_repo(repo) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo", "repo.tritonserver.log"]


# -- hostile requests: the validating front in front of tritonserver ---------------------------

def raw_post(url: str, path: str, body: bytes, headers: dict, timeout: float = 30) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def binary_request(shape, nbytes: int) -> tuple[bytes, dict]:
    head = json.dumps({"inputs": [{"name": "input_ids", "shape": shape, "datatype": "INT64",
                                   "parameters": {"binary_data_size": nbytes}}]}).encode()
    return head + b"\0" * nbytes, {"Inference-Header-Content-Length": str(len(head)),
                                   "Content-Type": "application/octet-stream"}


GRPC_BOMB = """
import sys, grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(sys.argv[1]))
req = service_pb2.ModelInferRequest(model_name="logits")
t = req.inputs.add(); t.name = "input_ids"; t.datatype = "INT64"; t.shape.extend([1, 2**61])
req.raw_input_contents.append(b"")
try:
    stub.ModelInfer(req, timeout=30); print("ANSWERED")
except grpc.RpcError as e:
    print(e.code().name, e.details())
"""


def grpc_bomb(triton, address: str) -> str:
    r = subprocess.run([str(triton.python), "-c", GRPC_BOMB, address], capture_output=True, text=True, timeout=60)
    return r.stdout.strip() + r.stderr.strip()[-500:]


def test_overflow_requests_never_reach_triton_and_serving_goes_on(served, triton, graphs, refs):
    """The two requests that took serving down (HTTP JSON shape [1, 10**12] with 4 values: a
    tritonserver abort; shape [1, 2**61] with no bytes: a dead stub behind a ready health
    check), a 2**32+5 that Triton narrowed to 5, and framing lies; each refused, then a good
    request is answered right and the server is still ready."""
    from msar_export.serving.triton.server import http_get

    url, good = served["http"], ids_of(graphs["cfg"], 12, 7)
    cases = [
        ("logits", [{"name": "input_ids", "shape": [1, 10**12], "datatype": "INT64", "data": [1, 2, 3, 4]}],
         "more than"),
        ("logits", [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3, 4]}], "data values"),
        ("logits", [{"name": "input_ids", "shape": [1, -4], "datatype": "INT64", "data": []}], "non-negative"),
        ("generate", [json_tensor("input_ids", good, "INT64"),
                      {"name": "max_new_tokens", "shape": [1, 1], "datatype": "INT32", "data": [2**32 + 5]}],
         "is not a INT32 value"),
    ]
    for model, inputs, expect in cases:
        code, body = infer_json(url, model, inputs)
        assert code == 400 and expect in body.get("error", ""), (expect, code, body)
    for shape, nbytes, expect in (([1, 2**61], 0, "more than"), ([1, 4], 8, "binary_data_size")):
        body, headers = binary_request(shape, nbytes)
        code, text = raw_post(url, "/v2/models/logits/infer", body, headers)
        assert code == 400 and expect in text, (code, text)
    code, text = raw_post(url, "/v2/models/logits/infer", b"x" * 16, {"Content-Length": str(1 << 40)})
    assert code == 413, (code, text)
    answer = grpc_bomb(triton, served["grpc"].removeprefix("grpc://"))
    assert answer.startswith("INVALID_ARGUMENT") and "more than" in answer, answer
    code, body = infer_json(url, "logits", logits_request(good))
    assert code == 200 and rel_err(output(body), refs[0].logits(good)) <= 1e-4, body
    assert http_get(f"{url}/v2/health/ready")[0] == 200 and served["proc"].poll() is None


def test_bypass_forms_never_reach_triton_and_serving_goes_on(served, triton, graphs, refs):
    """Issue 22: duplicate JSON keys (Python read the last 'shape', Triton the first: the server
    died), an absolute-form target, Triton's generate endpoints, shared-memory registration and
    outputs, model unload; gRPC shared-memory outputs and unserved models.  Each refused by the
    front, then a good request is answered right on a still-ready server."""
    from msar_export.serving.load.hostile import HTTP_CASES, send_http
    from msar_export.serving.triton.server import http_get

    url, good = served["http"], ids_of(graphs["cfg"], 12, 7)
    for k in range(len(HTTP_CASES)):
        refused, what = send_http(url, k)
        assert refused, what
    proc = subprocess.run([str(triton.python), "-c", "import sys; from msar_export.serving.load.hostile import "
                           "grpc_cases, send_grpc; r = [send_grpc(sys.argv[1], k) for k in range(len(grpc_cases()))]; "
                           "print(r); sys.exit(0 if all(ok for ok, _ in r) else 1)",
                           served["grpc"].removeprefix("grpc://")], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code, body = infer_json(url, "logits", logits_request(good))
    assert code == 200 and rel_err(output(body), refs[0].logits(good)) <= 1e-4, body
    assert http_get(f"{url}/v2/health/ready")[0] == 200 and served["proc"].poll() is None


@pytest.mark.slow  # kills a backend stub and waits for the server to stop
def test_a_dead_stub_stops_the_server_with_one_line(triton, graphs, tmp_path):
    """Behind the front the stub cannot be killed by a request; here it is, through Triton's
    private port (the bug reproduced): the next request through the front sees the dead stub,
    and the server stops with a line that says so instead of staying 'ready'."""
    from msar_export.serving.triton.server import TritonServer, free_port

    repo, _ = build_serving_repo(graphs["prefill"], None, tmp_path / "repo", max_batch=2)
    server = TritonServer(repo, free_port(), free_port()).start()
    try:
        answer = grpc_bomb(triton, f"127.0.0.1:{server.inner_grpc}")
        assert not answer.startswith("INVALID_ARGUMENT") or "more than" not in answer  # Triton itself took it
        ids = ids_of(graphs["cfg"], 5, 1)
        deadline = time.monotonic() + 60
        while server.front.poll() is None and time.monotonic() < deadline:
            try:
                infer_json(server.http_url, "logits", logits_request(ids), timeout=10)
            except OSError:
                pass
            time.sleep(0.5)
        assert server.front.poll() == 3, "the front must exit when the stub is dead"
        assert server.wait() == 3 and "stub died" in server.exit_reason()
    finally:
        server.stop()

