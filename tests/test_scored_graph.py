"""The `--mixer-op scored` prefill graph: one msar::SourceScores node per source (its scores against
every later mixer's query, made once) and one msar::ScoredMixer node per mixer. Judged against the
float64 eager model by msar_export.verdict, float32 and float16, on the function bodies and on the
native kernels; a 2% change of a weight the new nodes read fails; `check` passes and fails as for
the other graph kinds; TensorRT refuses the file in one line."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
import torch
from compare_fixtures import check_both_passes_then_fails_on_two_percent_taps
from conftest import load_tensors, make_checkpoint
from ort_ops_fixtures import ort_ops_library  # noqa: F401  (fixture)

from msar_export.checkpoint import load_checkpoint
from msar_export.cli import main
from msar_export.errors import InputError, OnnxModelError
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.model.precision import float64_one_sublayer_at_a_time
from msar_export.runners import ort_runner
from msar_export.runners.ort_runner import OrtGraph
from msar_export.verdict import judge

SCORED_OPS = {"SourceScores", "ScoredMixer"}


@pytest.fixture(scope="module")
def ckpt(faithful):
    # d 40 (not a multiple of the vector width), kernels [1,3,5], 2 blocks: the session's (conftest.py)
    return faithful[0]


@pytest.fixture(scope="module")
def scored(ckpt, tmp_path_factory):
    """{precision: scored prefill file}: made by the CLI, with its own validation (checker, strict
    shape inference, ONNX Runtime against float64), which must pass (exit 0)."""
    root = tmp_path_factory.mktemp("scored")
    made = {}

    def get(precision):
        if precision not in made:
            path = root / f"scored-{precision}.onnx"
            rc = main(["export", str(ckpt), "-o", str(path), "--mixer-op", "scored", "--dtype", precision])
            assert rc == 0, f"export --mixer-op scored --dtype {precision}: validation failed"
            made[precision] = path
        return made[precision]

    return get


def token_ids(seed=0):
    return torch.randint(0, 61, (2, 19), generator=torch.Generator().manual_seed(seed))  # traced at (2, 5)


def references(ckpt, ids, precision):
    """(float64 logits, eager logits at `precision`): the verdict's reference and its bound."""
    model = load_checkpoint(ckpt, dtype=torch.float32)
    with float64_one_sublayer_at_a_time(model), torch.inference_mode():
        ref = model(ids).numpy()
    with torch.inference_mode():
        eager = load_checkpoint(ckpt, dtype=getattr(torch, precision))(ids).float().numpy()
    return ref, eager


def run_profiled(path, ort_ops, ids, monkeypatch):
    """(logits, the op types ONNX Runtime's profile says it executed)."""
    make = ort_runner._options

    def options(*a, **k):
        opts = make(*a, **k)
        opts.enable_profiling = True
        return opts

    monkeypatch.setattr(ort_runner, "_options", options)
    graph = OrtGraph(path, providers=["cpu"], threads=2, ort_ops=ort_ops)
    logits = graph.logits(ids.numpy()).astype(np.float32)
    profile = graph.session.end_profiling()
    try:
        ops = {e["args"].get("op_name") for e in json.load(open(profile)) if e.get("cat") == "Node"}
    finally:
        os.remove(profile)
    return logits, ops


@pytest.mark.parametrize("precision", ["float32", pytest.param("float16", marks=pytest.mark.slow)])
def test_function_bodies_match_float64(ckpt, scored, precision, monkeypatch):
    ids = token_ids()
    ref, eager = references(ckpt, ids, precision)
    logits, ops = run_profiled(scored(precision), "function", ids, monkeypatch)
    verdict = judge(logits, eager, ref, precision)
    assert verdict.passed, verdict.describe("function bodies")
    assert not ops & SCORED_OPS and "Conv" in ops  # inlined: the bodies' standard ops ran


@pytest.mark.parametrize("precision", ["float32", pytest.param("float16", marks=pytest.mark.slow)])
def test_native_kernels_match_float64(ckpt, scored, precision, ort_ops_library, monkeypatch):
    """Fails (the op check) until plugins/msarOrtOps registers both ops: a library without them
    makes ONNX Runtime inline their function bodies, which then pass the verdict."""
    ids = token_ids()
    ref, eager = references(ckpt, ids, precision)
    logits, ops = run_profiled(scored(precision), ort_ops_library, ids, monkeypatch)
    verdict = judge(logits, eager, ref, precision)
    assert verdict.passed, verdict.describe("native")
    assert SCORED_OPS <= ops, f"ONNX Runtime ran {sorted(o for o in ops if o)}: no native SourceScores/ScoredMixer"


@pytest.mark.parametrize("name", ["mixer_queries_1", "conv_taps_1", "conv_bank"])
def test_two_percent_on_a_weight_the_scored_nodes_read_fails(ckpt, scored, tmp_path, name, monkeypatch):
    """Negative control: the scores' queries and taps (SourceScores) and the conv bank (ScoredMixer).
    One row, not the whole tensor: the key RMSNorm makes the scores blind to scaling all of a
    stream's taps (tried: all of conv_taps_1 x 1.02 passed the verdict, 4.1e-06 from float64)."""
    model = onnx.load(str(scored("float32")))
    init = next(t for t in model.graph.initializer if t.name == name)
    values = onnx.numpy_helper.to_array(init).copy()
    values[..., 1, :] *= np.float32(1.02)  # queries: stream 1 of every later mixer; taps: tap row 1
    init.CopyFrom(onnx.numpy_helper.from_array(values, name))
    onnx.save(model, str(tmp_path / "changed.onnx"))
    ids = token_ids()
    ref, eager = references(ckpt, ids, "float32")
    logits, _ = run_profiled(tmp_path / "changed.onnx", "function", ids, monkeypatch)
    assert not judge(logits, eager, ref, "float32").passed


def test_each_source_scores_against_the_queries_of_the_mixers_after_it(ckpt, scored):
    """mixer_queries_{i} is the checkpoint's mixers i+1..L+1 queries in order; one ScoredMixer per
    mixer, mixer l over l sources; the graph keeps the prefill graph's outputs."""
    model = onnx.load(str(scored("float32")))
    tensors = load_tensors(ckpt)
    L = 2 * json.loads((ckpt / "config.json").read_text())["n_blocks"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.domain == "msar"]
    sources = [n for n in nodes if n.op_type == "SourceScores"]
    assert [(n.input[0], n.input[1]) for n in sources] == [(f"conv_taps_{i}", f"mixer_queries_{i}")
                                                          for i in range(L + 1)]
    for i in range(L + 1):
        want = np.stack([tensors[f"mixers.{j}.query"] for j in range(i + 1, L + 2)])
        assert np.array_equal(inits[f"mixer_queries_{i}"], want), i
    assert not np.array_equal(inits["mixer_queries_0"], want[::-1])  # the comparison sees the order
    mixers = [n for n in nodes if n.op_type == "ScoredMixer"]
    assert [n.overload for n in mixers] == [f"n{l}" for l in range(1, L + 2)]
    assert [n.output[0] for n in mixers][:-1] == [f"hidden.{l}" for l in range(1, L + 1)]
    assert [o.name for o in model.graph.output] == ["logits"]


def test_check_both_passes_and_fails_on_two_percent_taps(ckpt, scored, tmp_path, capsys, ort_ops_library,
                                                        monkeypatch):
    monkeypatch.setenv(ort_runner.ORT_OPS_ENV, ort_ops_library)  # --ort-ops both: native is this build
    check_both_passes_then_fails_on_two_percent_taps(ckpt, scored("float32"), tmp_path, capsys)


def test_build_refuses_a_scored_file_in_one_line(faithful, scored, tmp_path, capsys):
    """TensorRT's parser keys local functions by name, and ScoredMixer has one body per source count
    (TensorRT-RTX 1.7: `node.input().size() == function.input().size()` for every other arity).
    Refused before TensorRT is loaded, so the same line with or without it."""
    from msar_export.engines.onnx_info import read_onnx

    path, plan = scored("float32"), tmp_path / "m.plan"
    for backend in ([], ["--backend", "tensorrt-rtx"]):
        assert main(["build", str(path), "-o", str(plan), *backend]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert "msar::ScoredMixer" in err and err.endswith("re-export with --mixer-op fused for TensorRT"), err
        assert not plan.exists()
    with pytest.raises(OnnxModelError, match="--mixer-op fused"):  # the in-memory engine's reader too
        read_onnx(path)
    # Negative control: the fused file is not refused for it (it needs --plugins, or TensorRT-RTX).
    assert main(["build", str(faithful[1]), "-o", str(plan), "--backend", "tensorrt-rtx"]) == 2
    err = capsys.readouterr().err
    assert ("--plugins" in err or "not installed" in err) and "--mixer-op" not in err, err


def test_a_decode_file_is_not_refused_for_its_one_conv_state_body(faithful_decode):
    """ConvState is variadic and has no plugin, like ScoredMixer, but a decode graph has one node of it,
    so one body, which TensorRT's parser imports as standard layers: no refusal."""
    from msar_export.engines.onnx_info import tensorrt_refusal
    from msar_export.graph_file import ExportedGraph

    graph = ExportedGraph.open(faithful_decode[1])
    assert graph.custom_ops.get("ConvState") == 1 and tensorrt_refusal(graph) is None


def test_check_skips_tensorrt_on_a_scored_file_and_says_why(faithful, scored, capsys):
    """`check` plans no engine for a scored file, on any machine: its ONNX Runtime rows still run."""
    ckpt, fused, _ = faithful
    skipped = {}
    for name, path in (("scored", scored("float32")), ("fused", fused)):
        assert main(["check", str(ckpt), "--onnx", str(path), "--ort-ops", "function"]) == 0
        out = " ".join(capsys.readouterr().out.split())  # the table wraps nothing off a terminal; joined anyway
        skipped[name] = "--mixer-op fused for TensorRT" in out
        assert "onnxrt: PASS" in out or "onnxrt-function: PASS" in out, out
    assert skipped == {"scored": True, "fused": False}  # the fused file's skip (if any) has another reason


def test_an_unknown_mixer_op_names_the_three():
    with pytest.raises(InputError, match="fused, retrieval, scored"):
        ExportOptions(mixer_op="score")
    assert ExportOptions(mixer_op="scored").mixer_op == "scored"


@pytest.mark.slow  # three exports (15 s) for the one branch in graphs.py's path_cls
def test_other_graphs_keep_their_form_under_scored(tmp_path):
    """attnres has one identity stream and no gate: scored means its fused graph (DepthRetrieval
    nodes), as --mixer-op retrieval does; decode graphs keep their SourceViews/DepthRetrieval form."""
    ckpt = make_checkpoint(tmp_path / "attnres", seed=3, residual="attnres", n_blocks=1)[0]
    ops = {}
    for mixer_op in ("fused", "scored"):
        export_checkpoint(ckpt, tmp_path / f"{mixer_op}.onnx", ExportOptions(mixer_op=mixer_op), validate=False)
        ops[mixer_op] = [n.op_type for n in onnx.load(str(tmp_path / f"{mixer_op}.onnx")).graph.node]
    assert ops["scored"] == ops["fused"] and "DepthRetrieval" in ops["fused"]
    msar = make_checkpoint(tmp_path / "msar", seed=3, n_blocks=1)[0]
    export_checkpoint(msar, tmp_path / "decode.onnx", ExportOptions(decode=True, mixer_op="scored"), validate=False)
    decode = {n.op_type for n in onnx.load(str(tmp_path / "decode.onnx")).graph.node}
    assert not decode & SCORED_OPS and {"SourceViews", "DepthRetrieval"} <= decode
