"""bench/processes.py: a goal ratio with each graph timed in a process of its own. Exercised on the
session's small prefill and decode graphs (one timed run per process): every round is recorded, the
order alternates, and a graph that cannot be run fails the call instead of giving a ratio."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from msar_export.bench.processes import process_ratio


@pytest.mark.parametrize("decode", [False, True])
def test_a_graph_against_itself(faithful, faithful_decode, decode):
    path = str(faithful_decode[1] if decode else faithful[1])
    seen = []
    res = process_ratio(path, path, batch=2 if decode else None, tokens=16, rounds=2, runs=1, threads=1,
                        vocab=faithful[2]["vocab_size"], log=seen.append)
    assert res["pairs"] == 2 and len(res["times"]) == 2 and len(seen) == 2
    assert all(t > 0 for pair in res["times"] for t in pair)
    assert res["min"] <= res["median"] <= res["max"]
    # The same file both sides: any ratio far from 1 would be the harness, not the graph (wide: tiny
    # graphs on a shared machine; one run per process).
    assert 0.25 < res["median"] < 4, res


def test_a_graph_that_cannot_run_fails(faithful, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(subprocess.CalledProcessError):
        process_ratio(str(faithful[1]), str(bad), tokens=16, rounds=1, runs=1, threads=1, vocab=faithful[2]["vocab_size"])


def test_the_bench_keys_its_process_rows_and_times_the_right_files(tmp_path, monkeypatch):
    """run.process_pairs through processes.goal_ratios, process_ratio stubbed: the standard file is
    always a, the msar file b, and each result lands under the bench's key for it."""
    import msar_export.bench.processes as processes
    from msar_export.bench.run import BenchSettings, process_pairs

    calls = []

    def stub(a, b, batch=None, tokens=512, rounds=4, threads=2, vocab=256, log=None):
        calls.append((Path(a).name, Path(b).name, batch, tokens, rounds))
        return {"median": float(len(calls))}

    monkeypatch.setattr(processes, "process_ratio", stub)
    s = BenchSettings(decode_batches=(1, 8), process_rounds=3)
    got = process_pairs(tmp_path, s, log=lambda *_: None)
    assert calls == [("standard-decomposed.onnx", "msar-scored.onnx", None, 512, 3),
                     ("standard-decode.onnx", "msar-decode.onnx", 1, 512, 3),
                     ("standard-decode.onnx", "msar-decode.onnx", 8, 512, 3)]
    assert got == {"msar/standard prefill time in ORT (ort-native-scored), one process each": {"median": 1.0},
                   "standard/msar decode tokens/s, batch 1 (ort), one process each": {"median": 2.0},
                   "standard/msar decode tokens/s, batch 8 (ort), one process each": {"median": 3.0}}
    calls.clear()
    s.prefill_shapes = ((4, 256),)  # a batched prefill shape: the one-process prefill row is the 1 x T one only
    assert list(process_pairs(tmp_path, s, log=lambda *_: None)) == [
        "standard/msar decode tokens/s, batch 1 (ort), one process each",
        "standard/msar decode tokens/s, batch 8 (ort), one process each"]
