"""Files that load but cannot run as their metadata says (issue 22, section 5): one line and exit 2,
not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "msar_export.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def one_line_exit_2(r, needle):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip() and "native msar kernels" not in line]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr


# The graphs: the session's 1-block random ones (serving_fixtures.graphs, conftest.py), edited in copies.

def test_generate_on_a_graph_whose_vocabulary_exceeds_its_embedding(graphs, tmp_path):
    assert graphs["cfg"]["vocab_size"] == 61  # byte prompts index past it
    path = tmp_path / "decode.onnx"
    model = onnx.load(str(graphs["decode"]))
    for p in model.metadata_props:
        if p.key == "msar.config":
            p.value = json.dumps({**json.loads(p.value), "vocab_size": 300})
    onnx.save(model, str(path))
    one_line_exit_2(run_cli("generate", "--onnx", path, "--prompt", "def ", "--max-new-tokens", 2),
                    "ONNX Runtime failed running this graph")


def test_reference_on_an_initializer_with_dims_and_no_data(graphs, tmp_path):
    path = tmp_path / "model.onnx"
    model = onnx.load(str(graphs["prefill"]))
    victim = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    victim.raw_data = b""
    onnx.save(model, str(path))
    before = path.read_bytes()
    one_line_exit_2(run_cli("onnx", "reference", path), f"initializer {victim.name!r} declares dims")
    assert path.read_bytes() == before
