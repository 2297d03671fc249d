"""Exported graphs on the native kernels: every graph kind with msar nodes, float32 and float16,
judged against the float64 eager model by msar_export.verdict as the function bodies are; the
native kernel is shown to have run (ONNX Runtime's profile), `check --ort-ops both` passes and
fails on a 2% tap change, and the fallback says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from compare_fixtures import check_both_passes_then_fails_on_two_percent_taps, lazy_exports  # `faithful`: conftest.py
from ort_ops_fixtures import ort_ops_library  # noqa: F401  (fixture)

from msar_export import cli_common
from msar_export.checkpoint import load_checkpoint
from msar_export.export import ExportOptions
from msar_export.model.precision import float64_one_sublayer_at_a_time
from msar_export.runners import ort_runner
from msar_export.runners.ort_runner import OrtGraph
from msar_export.verdict import judge

VARIANTS = {"prefill": ExportOptions(), "retrieval": ExportOptions(mixer_op="retrieval"),
            "decode": ExportOptions(decode=True), "prefill-fp16": ExportOptions(dtype="float16"),
            "decode-fp16": ExportOptions(decode=True, dtype="float16")}


@pytest.fixture(scope="module")
def ckpt(faithful):
    # d 40 (not a multiple of the vector width), kernels [1,3,5], 2 blocks: the session's (conftest.py)
    return faithful[0]


@pytest.fixture(scope="module")
def exported(faithful, faithful_decode, tmp_path_factory):
    return lazy_exports(faithful[0], tmp_path_factory.mktemp("native-graphs"), VARIANTS,
                        {"prefill": faithful[1], "decode": faithful_decode[1]})


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 61, (2, 19), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # the second prompt is left-padded
    return ids, mask


def eager_logits(ckpt, ids, precision):
    model = load_checkpoint(ckpt, dtype=getattr(torch, precision))
    with torch.inference_mode():
        return model(ids).float().numpy()


def ort_logits(graph: OrtGraph, ids: torch.Tensor) -> np.ndarray:
    if not graph.is_decode:
        return graph.logits(ids.numpy()).astype(np.float32)
    # prefill 11 tokens with an empty past, then one token per step: the per-token expansion path
    logits, cache = graph.step(ids[:, :11].numpy(), np.ones((2, 11), np.int64),
                               np.broadcast_to(np.arange(11), (2, 11)).copy(), graph.empty_cache(2))
    out = [logits]
    for t in range(11, ids.shape[1]):
        logits, cache = graph.step(ids[:, t:t + 1].numpy(), np.ones((2, t + 1), np.int64),
                                   np.full((2, 1), t, np.int64), cache)
        out.append(logits)
    return np.concatenate(out, axis=1).astype(np.float32)


def ran_ops(graph: OrtGraph) -> set[str]:
    path = graph.session.end_profiling()
    try:
        return {e["args"].get("op_name") for e in json.load(open(path)) if e.get("cat") == "Node"}
    finally:
        os.remove(path)


# The default tier runs the two kernels' graph kinds in float32; the slow tier the rest.
SLOW = {"retrieval", "prefill-fp16", "decode-fp16"}


@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.slow) if v in SLOW else v for v in VARIANTS])
def test_graph_kinds_on_native_kernels_match_float64(ckpt, exported, variant, ort_ops_library, monkeypatch):
    precision = "float16" if variant.endswith("fp16") else "float32"
    ids, _ = batch()
    model = load_checkpoint(ckpt, dtype=torch.float32)
    with float64_one_sublayer_at_a_time(model), torch.inference_mode():
        ref = model(ids).numpy()
    eager = eager_logits(ckpt, ids, precision)
    results = {}
    for how in (ort_ops_library, "function"):
        monkeypatch.setattr(ort_runner, "_options", _profiling(ort_runner._options))
        graph = OrtGraph(exported(variant), providers=["cpu"], threads=2, ort_ops=how)
        results[how] = judge(ort_logits(graph, ids), eager, ref, precision)
        ops = ran_ops(graph)
        op = "FusedMixer" if variant.startswith("prefill") else "DepthRetrieval"
        assert (op in ops) == (how != "function"), (how, sorted(o for o in ops if o))
    assert results[ort_ops_library].passed, results[ort_ops_library].describe("native")
    assert results["function"].passed, results["function"].describe("function bodies")


def _profiling(make):
    def options(*a, **k):
        opts = make(*a, **k)
        opts.enable_profiling = True
        return opts
    return options


def test_left_padded_generation_same_tokens_native_and_eager(ckpt, exported, ort_ops_library):
    from msar_export.model import generate
    from msar_export.runtime import OrtDecoder

    ids, mask = batch(3)
    want = generate(load_checkpoint(ckpt), ids, mask, max_new_tokens=12)
    os.environ[ort_runner.ORT_OPS_ENV] = ort_ops_library
    try:
        got = OrtDecoder(exported("decode"), threads=2).generate(ids, mask, max_new_tokens=12)
    finally:
        del os.environ[ort_runner.ORT_OPS_ENV]
    assert torch.equal(got, want)


def test_check_both_passes_and_fails_on_two_percent_taps(faithful, tmp_path, capsys, ort_ops_library, monkeypatch):
    ckpt, onnx_path, _ = faithful
    monkeypatch.setenv(ort_runner.ORT_OPS_ENV, ort_ops_library)  # --ort-ops both: native is this build
    check_both_passes_then_fails_on_two_percent_taps(ckpt, onnx_path, tmp_path, capsys)


def test_missing_library_falls_back_with_one_line_and_native_is_an_error(faithful, tmp_path):
    _, onnx_path, _ = faithful
    code = ("import sys; from msar_export.runners import ort_runner as r; r.native_library = lambda: None; "
            "from msar_export.runtime import OrtModel; import numpy as np; "
            "m = OrtModel(sys.argv[1], threads=1); m.ort.logits(np.zeros((1, 4), np.int64)); "
            "print(m.session.msar_native); OrtModel(sys.argv[1], threads=1)")
    r = subprocess.run([sys.executable, "-c", code, str(onnx_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
    lines = [line for line in r.stderr.splitlines() if "native msar kernels not built" in line]
    assert len(lines) == 1 and "function bodies" in lines[0]  # once per process, not per session
    with pytest.raises(ort_runner.LoadError, match="native msar kernels requested"):
        env = os.environ.get(ort_runner.ORT_OPS_ENV)
        try:
            ort_runner.native_library, saved = (lambda: None), ort_runner.native_library
            ort_runner.open_session(str(onnx_path), ort_ops="native")
        finally:
            ort_runner.native_library = saved
            if env is not None:
                os.environ[ort_runner.ORT_OPS_ENV] = env


def test_cli_copy_of_the_runner_names_agrees():
    assert (cli_common.ORT_OPS_ENV, cli_common.ORT_OPS_CHOICES) == (ort_runner.ORT_OPS_ENV, ort_runner.ORT_OPS_CHOICES)
