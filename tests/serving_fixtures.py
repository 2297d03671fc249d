"""The Triton fixtures test_serving.py and test_serving_load.py share: the Triton
install in .venv-triton, a small random checkpoint with both graphs exported, their
ONNX Runtime references and one `msar-export serve` on free loopback ports, each made
once per test session (registered in conftest.py: a module importing them by name
would get copies of its own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import make_checkpoint
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.runtime import OrtDecoder, OrtModel
from msar_export.serving.triton.client import json_tensor

REPO = Path(__file__).resolve().parent.parent
SETUP = REPO / "scripts" / "setup_triton_env.sh"
CLI = [sys.executable, "-m", "msar_export.cli"]


def run_cli(*args, timeout=300, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env, **kw)


# -- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def triton():
    """The Triton install in .venv-triton (created here if missing); skip only if it cannot be had."""
    from msar_export.errors import BackendUnavailable
    from msar_export.serving.triton.env import find_triton, triton_venv
    from msar_export.serving.triton.server import binary_check

    venv = triton_venv()
    check = [str(venv / "bin" / "python"), "-c", "import pytriton, tritonclient.grpc, onnxruntime, msar_export.serving"]
    if not (venv / "bin" / "python").is_file() or subprocess.run(check, capture_output=True).returncode != 0:
        try:
            out = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=600, cwd=REPO)
        except subprocess.TimeoutExpired:
            pytest.skip(f"{SETUP.name} took over 10 minutes; run it by hand, then the tests")
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"cannot create {venv} with {SETUP.name}: {tail[:300]}")
    try:
        install = find_triton(venv / "bin" / "python")
    except BackendUnavailable as e:
        pytest.skip(str(e))
    reason = binary_check(install)
    if reason:
        pytest.skip(f"tritonserver cannot start on this machine: {reason}")
    return install


@pytest.fixture(scope="session")
def graphs(tmp_path_factory):
    """A small random msar checkpoint (vocab 61, max_seq_len 128), both graphs exported."""
    root = tmp_path_factory.mktemp("serving")
    ckpt, cfg = make_checkpoint(root / "ckpt", seed=5, query_scale=0.5, n_blocks=1)  # 1 block: quick to export
    prefill, decode = root / "prefill.onnx", root / "decode.onnx"
    export_checkpoint(ckpt, prefill, ExportOptions(), validate=False)
    export_checkpoint(ckpt, decode, ExportOptions(decode=True), validate=False)
    return {"root": root, "ckpt": ckpt, "cfg": cfg, "prefill": prefill, "decode": decode}


@pytest.fixture(scope="session")
def refs(graphs):
    return OrtModel(graphs["prefill"], threads=1), OrtDecoder(graphs["decode"], threads=1)


@pytest.fixture(scope="session")
def served(triton, graphs):
    """`msar-export serve PREFILL DECODE` on free loopback ports, stopped with SIGTERM at the end."""
    from msar_export.serving.triton.server import free_port, http_get

    http, grpc = free_port(), free_port()
    workdir = graphs["root"] / "serve"
    proc = subprocess.Popen([*CLI, "serve", str(graphs["prefill"]), str(graphs["decode"]), "--workdir", str(workdir),
                             "--port-http", str(http), "--port-grpc", str(grpc), "--max-batch", "8"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"msar-export serve exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if http_get(f"{url}/v2/health/ready", timeout=1)[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)
            pytest.fail("server not ready after 180 s")
        time.sleep(0.2)
    yield {"http": url, "grpc": f"grpc://127.0.0.1:{grpc}", "workdir": workdir, "proc": proc}
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert "stopped" in err


def ids_of(cfg, T, seed, batch=1):
    return np.random.default_rng(seed).integers(0, cfg["vocab_size"], size=(batch, T), dtype=np.int64)


def logits_request(ids):
    return [json_tensor("input_ids", ids, "INT64")]


def generate_request(ids, n):
    return [json_tensor("input_ids", ids, "INT64"), json_tensor("max_new_tokens", np.full((len(ids), 1), n), "INT32")]


def output(body) -> np.ndarray:
    o = body["outputs"][0]
    return np.asarray(o["data"]).reshape(o["shape"])


# -- no server needed ----------------------------------------------------------------------
