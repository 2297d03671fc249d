"""Files that load but cannot run as their metadata says (issue 22, section 5): one line and exit 2,
not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
from conftest import make_checkpoint

from msar_export.export import ExportOptions, export_checkpoint


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "msar_export.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def one_line_exit_2(r, needle):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip() and "native msar kernels" not in line]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_generate_on_a_graph_whose_vocabulary_exceeds_its_embedding(tmp_path):
    ckpt, cfg = make_checkpoint(tmp_path / "ckpt", seed=2, n_blocks=1)  # vocab 61: byte prompts index past it; 1 block: quick
    path = tmp_path / "decode.onnx"
    export_checkpoint(ckpt, path, ExportOptions(decode=True), validate=False)
    model = onnx.load(str(path))
    for p in model.metadata_props:
        if p.key == "msar.config":
            p.value = json.dumps({**json.loads(p.value), "vocab_size": 300})
    onnx.save(model, str(path))
    one_line_exit_2(run_cli("generate", "--onnx", path, "--prompt", "def ", "--max-new-tokens", 2),
                    "ONNX Runtime failed running this graph")


def test_reference_on_an_initializer_with_dims_and_no_data(tmp_path):
    ckpt, _ = make_checkpoint(tmp_path / "ckpt", seed=2, n_blocks=1)  # 1 block: a quicker export, the same refusal
    path = tmp_path / "model.onnx"
    export_checkpoint(ckpt, path, ExportOptions(), validate=False)
    model = onnx.load(str(path))
    victim = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    victim.raw_data = b""
    onnx.save(model, str(path))
    before = path.read_bytes()
    one_line_exit_2(run_cli("onnx", "reference", path), f"initializer {victim.name!r} declares dims")
    assert path.read_bytes() == before
