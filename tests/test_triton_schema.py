"""Triton's ModelConfig schema is bundled, so `triton-repo` validates its configs in
the main venv (no tritonclient, no .venv-triton), and the bundle is Triton's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import make_checkpoint
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.serving.repository.pbtxt_check import SCHEMA, check_config

REPO = Path(__file__).resolve().parent.parent
TRITON_PY = REPO / ".venv-triton" / "bin" / "python"

GOOD = """name: "m"
backend: "onnxruntime"
max_batch_size: 4
input [{ name: "input_ids" data_type: TYPE_INT64 dims: [-1] }]
output [{ name: "logits" data_type: TYPE_FP32 dims: [-1, 61] }]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


def test_bundled_schema_parses_and_refuses():
    assert check_config(GOOD, "m") is None
    assert "no field named" in check_config(GOOD.replace("max_batch_size", "max_batch"), "m")
    assert "dynamic_batching needs max_batch_size" in check_config(GOOD.replace("max_batch_size: 4", "max_batch_size: 0"), "m")
    assert "TYPE_FLOAT32" in check_config(GOOD.replace("TYPE_FP32", "TYPE_FLOAT32"), "m")  # enum values are Triton's


def test_triton_repo_validates_without_tritonclient(tmp_path):
    import importlib.util

    assert importlib.util.find_spec("tritonclient") is None, "the main venv is expected to lack tritonclient"
    ckpt, _ = make_checkpoint(tmp_path / "ckpt", seed=2)
    model = tmp_path / "m.onnx"
    export_checkpoint(ckpt, model, ExportOptions(), validate=False)
    env_without_triton_venv = {"PATH": "/usr/bin:/bin", "MSAR_TRITON_VENV": str(tmp_path / "no-such-venv")}
    r = subprocess.run([sys.executable, "-m", "msar_export.cli", "triton-repo", str(model), "-o", str(tmp_path / "repo")],
                       capture_output=True, text=True, timeout=300, env=env_without_triton_venv)
    assert r.returncode == 0, r.stderr
    assert "validated with Triton's ModelConfig schema" in r.stdout


def test_bundled_schema_is_tritonclients(triton):
    """Against tritonclient's own descriptor, in .venv-triton (the `triton` fixture makes it or skips)."""
    code = "import sys; from tritonclient.grpc import model_config_pb2 as m; sys.stdout.buffer.write(m.DESCRIPTOR.serialized_pb)"
    theirs = subprocess.run([str(TRITON_PY), "-c", code], capture_output=True, timeout=120, check=True).stdout
    assert theirs == SCHEMA.read_bytes()
