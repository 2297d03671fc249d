"""scripts/free_op_graph.py (docs/ort_kernels.md, "Measured, not kept"): the stand-ins replace exactly
the ops named, the copy still runs as a decode graph, and its logits differ from the original's (the
ops were really taken out; a copy that kept them would pass the first two checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from msar_export.runtime import OrtDecoder
from ort_ops_fixtures import ort_ops_library  # noqa: F401  (fixture)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "free_op_graph.py"


def op_counts(path: Path) -> dict:
    counts: dict = {}
    for n in onnx.load(str(path), load_external_data=False).graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def first_step_logits(path: Path) -> np.ndarray:
    dec = OrtDecoder(path, threads=1, ort_ops="function")
    ids = np.array([[3, 1, 4, 1, 5]], np.int64)
    logits, _ = dec.step(ids, np.ones_like(ids), np.arange(5, dtype=np.int64)[None], dec.empty_cache(1))
    return logits


@pytest.mark.parametrize("ops", [["DepthRetrieval"], ["DepthRetrieval", "StreamGate"],
                                 ["DepthRetrieval", "StreamGate", "SourceViews", "ConvState"]])
def test_stand_ins_replace_the_named_ops(faithful_decode, tmp_path, ops):
    _, graph, _ = faithful_decode
    out = tmp_path / "free.onnx"
    subprocess.run([sys.executable, str(SCRIPT), str(graph), str(out), "--ops", *ops], check=True,
                   capture_output=True)
    before, after = op_counts(graph), op_counts(out)
    assert before.get("DepthRetrieval", 0) > 0
    for op in ("DepthRetrieval", "StreamGate", "SourceViews", "ConvState"):
        assert after.get(op, 0) == (0 if op in ops else before.get(op, 0)), op
    assert after.get("Identity", 0) == (before.get("Identity", 0) + before["DepthRetrieval"]
                                        + (before.get("ConvState", 0) if "ConvState" in ops else 0))
    assert after.get("Expand", 0) == before.get("Expand", 0) + (before.get("SourceViews", 0) if "SourceViews" in ops else 0)
    assert after.get("Squeeze", 0) == before.get("Squeeze", 0) + (before.get("StreamGate", 0) if "StreamGate" in ops else 0)
    reference, free = first_step_logits(graph), first_step_logits(out)
    assert free.shape == reference.shape
    assert np.abs(free - reference).max() > 1e-3  # the negative control: the copy computes something else


def test_scored_pair_bound_leaves_every_even_mixer_its_newest_source(faithful, ort_ops_library, tmp_path):
    from msar_export.checkpoint import load_checkpoint
    from msar_export.export import ExportOptions, export_model
    from msar_export.runtime import OrtModel

    ckpt, _, _ = faithful
    graph, out = tmp_path / "scored.onnx", tmp_path / "bound.onnx"
    export_model(load_checkpoint(ckpt), graph, ExportOptions(mixer_op="scored"), validate=False)
    subprocess.run([sys.executable, str(SCRIPT), str(graph), str(out), "--ops", "ScoredMixer"], check=True,
                   capture_output=True)
    model = onnx.load(str(out), load_external_data=False)
    consts = {t.name: numpy_helper.to_array(t).tolist() for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT64}
    made = {o: n for n in model.graph.node for o in n.output}
    before = [n for n in onnx.load(str(graph), load_external_data=False).graph.node if n.op_type == "ScoredMixer"]
    after = [n for n in model.graph.node if n.op_type == "ScoredMixer"]
    sources = [len(n.input) - 5 for n in before]
    assert sources == list(range(1, len(before) + 1))  # mixer l reads sources 0..l-1
    assert [len(n.input) - 5 for n in after] == [1 if s % 2 == 0 else s for s in sources]
    for n, b, a in zip(sources, before, after):
        assert a.input[-1] == b.input[-1]  # the newest source kept
        if n % 2:
            assert list(a.input) == list(b.input) and a.overload == b.overload
            continue
        assert a.overload == "n1"
        for port in (3, 4):  # the conv bank and the scores: row n-1 of each, along axis 0
            pick = made[a.input[port]]
            assert pick.op_type == "Slice" and pick.input[0] == b.input[port]
            assert [consts[x] for x in pick.input[1:4]] == [[n - 1], [n], [0]]
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], np.int64)
    reference = OrtModel(graph, threads=1, ort_ops="function").logits(ids)
    for ops in ("function", ort_ops_library):
        bound = OrtModel(out, threads=1, ort_ops=ops).logits(ids)
        assert bound.shape == reference.shape
        assert np.abs(bound - reference).max() > 1e-3  # the negative control: the second mixers lost sources
