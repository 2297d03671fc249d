"""stream_kernels [1]: msar with the identity stream alone (no convolution streams, m = 1, K = 0).

Every graph kind exports and runs: the FusedMixer prefill (its conv bank (L+1, 0, d)), `--mixer-op
retrieval` and `--mixer-op scored`, and decode. The retrieval and decode graphs have no SourceViews
node (a source's one view is the source itself); the decode graph keeps MSAR_SPEC 3's
past_conv_state [L+1, batch, kmax-1 = 0, d], and its present_conv_state is one ConvState node's
output with zero positions. Each graph runs in ONNX Runtime on its function bodies and on the
native kernels, judged against the independent float64 reference (tests/reference64.py); the fused
and decode graphs in float16 too (slow tier)."""

from __future__ import annotations

import onnx
import pytest
import torch
from compare_fixtures import lazy_exports
from conftest import load_cfg, load_tensors, make_checkpoint
from ort_ops_fixtures import ort_ops_library  # noqa: F401  (fixture)
from test_ort_native_graphs import _profiling, batch, eager_logits, ort_logits, ran_ops

from msar_export.checkpoint import load_checkpoint
from msar_export.export import ExportOptions
from msar_export.runners import ort_runner
from msar_export.runners.ort_runner import OrtGraph
from msar_export.verdict import judge
from reference64 import reference_logits

KINDS = {"fused": ExportOptions(), "retrieval": ExportOptions(mixer_op="retrieval"),
         "scored": ExportOptions(mixer_op="scored"), "decode": ExportOptions(decode=True),
         "fused-fp16": ExportOptions(dtype="float16"), "decode-fp16": ExportOptions(decode=True, dtype="float16")}
# The op whose native kernel must have run (and must not have, on the function bodies).
NATIVE_OP = {"fused": "FusedMixer", "retrieval": "DepthRetrieval", "scored": "ScoredMixer", "decode": "ConvState"}
NATIVE_OP |= {f"{k}-fp16": NATIVE_OP[k] for k in ("fused", "decode")}
# float16: the float32 kinds' code paths in another storage type (the slow tier)
PARAMS = [pytest.param(k, marks=pytest.mark.slow) if k.endswith("fp16") else k for k in KINDS]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path, cfg = make_checkpoint(tmp_path_factory.mktemp("k1") / "ckpt", seed=11, stream_kernels=[1])
    assert cfg["stream_kernels"] == [1] and cfg["residual"] == "msar"
    return path


@pytest.fixture(scope="module")
def exported(ckpt, tmp_path_factory):
    return lazy_exports(ckpt, tmp_path_factory.mktemp("k1-graphs"), KINDS)


def msar_ops(model) -> dict:
    ops = {}
    for node in model.graph.node:
        if node.domain == "msar":
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ops


def dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.parametrize("kind", PARAMS)
def test_graph_holds_what_one_stream_needs(ckpt, exported, kind):
    cfg = load_cfg(ckpt)
    n_sources, d = 2 * cfg["n_blocks"] + 1, cfg["d_model"]
    model = onnx.load(exported(kind))
    onnx.checker.check_model(model, full_check=True)
    ops = msar_ops(model)
    assert "SourceViews" not in ops and not any(f.name == "SourceViews" for f in model.functions)
    assert all(list(n.attribute[0].ints) == [1] for n in model.graph.node
               if n.domain == "msar" and n.attribute and n.attribute[0].name == "stream_kernels")
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    if kind in ("fused", "scored", "fused-fp16"):  # one conv bank, with no taps
        assert [n_sources, 0, d] in inits.values()
    if kind.startswith("decode"):
        assert ops == {"DepthRetrieval": n_sources, "StreamGate": n_sources, "ConvState": 1}
        past = next(i for i in model.graph.input if i.name == "past_conv_state")
        present = next(o for o in model.graph.output if o.name == "present_conv_state")
        assert dims(past) == dims(present) == [n_sources, "batch", 0, d]
    else:
        assert ops[NATIVE_OP[kind]] == n_sources


@pytest.mark.parametrize("kind", PARAMS)
def test_graph_kind_matches_float64(ckpt, exported, kind, ort_ops_library, monkeypatch):
    precision = "float16" if kind.endswith("fp16") else "float32"
    ids, _ = batch()
    cfg, tensors = load_cfg(ckpt), load_tensors(ckpt)
    ref64 = reference_logits(cfg, tensors, ids.numpy())
    eager = eager_logits(ckpt, ids, precision)  # the verdict's scale: eager's own error in this dtype
    model = load_checkpoint(ckpt)
    # Negative control: mixer 3's query 5% larger, in the float64 reference and in eager alike.
    bad = dict(tensors, **{"mixers.3.query": tensors["mixers.3.query"] * 1.05})
    ref64_bad = reference_logits(cfg, bad, ids.numpy())
    with torch.no_grad():
        model.mixers["3"].query.mul_(1.05)
        eager_bad = model(ids).numpy()
    for how in (ort_ops_library, "function"):
        monkeypatch.setattr(ort_runner, "_options", _profiling(ort_runner._options))
        graph = OrtGraph(exported(kind), providers=["cpu"], threads=2, ort_ops=how)
        got = ort_logits(graph, ids)  # decode: prefill 11 tokens, then one token per step
        assert (NATIVE_OP[kind] in ran_ops(graph)) == (how != "function"), how
        what = f"{kind} on {'function bodies' if how == 'function' else 'native kernels'}"
        v = judge(got, eager, ref64, precision)
        assert v.passed, v.describe(what)
        assert not judge(got, eager_bad, ref64_bad, precision).passed, f"{what}: a 5% query change passes"
