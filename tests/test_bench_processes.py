"""bench/processes.py: a goal ratio with each graph timed in a process of its own. Exercised on the
session's small prefill and decode graphs (one timed run per process): every round is recorded, the
order alternates, and a graph that cannot be run fails the call instead of giving a ratio."""

from __future__ import annotations

import subprocess

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
