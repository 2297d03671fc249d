"""Deep models: export validation judged against float64 (msar_export.verdict)
passes faithful exports at 12 blocks and still fails an injected 2% tap fault;
`msar-export export` exits 1 when validation fails.  Export-time growth is
tracked by `msar-export bench --export-scaling`, not by a timed test."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
import pytest
import torch

from conftest import make_checkpoint
from msar_export import cli, load_checkpoint
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.export.validate import validate_file
from msar_export.verdict import FLOOR, MULTIPLE, Verdict, bound, judge, rel_err

# 12 blocks (25 mixers), odd sizes: 3 heads over 1 kv head, kernels [1, 3, 5].
DEEP = dict(n_blocks=12, d_model=24, n_heads=3, n_kv_heads=1, mlp_hidden=40, vocab_size=61)


def test_metric_and_bound():
    ref = np.array([[1.0, -4.0], [2.0, 0.5]])
    assert rel_err(ref, ref) == 0.0
    assert rel_err(ref + np.array([[0.0, 0.04], [0.0, 0.0]]), ref) == pytest.approx(0.01)
    assert rel_err(np.array([[np.nan, 0], [0, 0]]), ref) == math.inf
    with pytest.raises(ValueError):
        rel_err(ref[:1], ref)
    assert bound(1e-5, "float32") == pytest.approx(MULTIPLE * 1e-5 + FLOOR["float32"])
    assert Verdict(4.7e-5, 1e-5, "float32").passed  # 4 x 1e-5 + 7.6e-6 = 4.76e-5
    assert not Verdict(4.9e-5, 1e-5, "float32").passed
    assert not Verdict(math.inf, 1e-5, "float32").passed
    assert not Verdict(math.nan, 1e-5, "float32").passed
    # Shallow model, eager error ~0: the floor decides.
    v = judge(ref * (1 + 5e-7), ref, ref, "float32")
    assert v.eager_error == 0.0 and v.passed and "bound" in v.describe("ORT")


@pytest.fixture(scope="module")
def deep_ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("deep") / "msar12", seed=5, **DEEP)[0]


def _faulty(ckpt, source: int):
    """The checkpoint's model with one source's kernel-3 conv taps 2% too large."""
    model = load_checkpoint(ckpt).eval()
    with torch.no_grad():
        model.sources[str(source)].conv["1"].weight.mul_(1.02)
    return model


def _fault_file(path, out, source: int):
    """A copy of an exported file with source `source`'s kernel-3 taps 2% too large
    (the packed FusedMixer bank, or the decode graph's per-source SourceViews taps: the same rows)."""
    from msar_export.export.custom_paths import conv_taps_name

    model = ir.load(path)
    inits = model.graph.initializers
    if "conv_bank" in inits:  # (L+1, K, d); kernel 3 is taps 0..2
        name, rows = "conv_bank", (source, slice(0, 3), slice(None))
    else:
        name, rows = conv_taps_name(source), (slice(0, 3), slice(None))
    value = inits[name].const_value.numpy().copy()
    value[rows] *= 1.02
    inits[name].const_value = ir.Tensor(value, name=name)
    ir.save(model, out)


# Depth is the slow tier's (pyproject.toml): the same export, validation and fault verdict at 2 blocks run in
# the default tier (test_export.py::test_ort_comparison_catches_a_wrong_export, and here
# test_cli_export_exits_1_on_failed_validation_and_keeps_the_file; the bound's arithmetic: test_metric_and_bound).
@pytest.mark.slow
@pytest.mark.parametrize("decode", [False, True], ids=["prefill", "decode"])
def test_deep_export_passes_and_a_two_percent_tap_fault_fails(deep_ckpt, tmp_path, decode):
    opts = ExportOptions(decode=decode)
    good = export_checkpoint(deep_ckpt, tmp_path / "good.onnx", opts)
    v = good.validation
    assert v.passed, good.summary()
    assert v.verdict.eager_error > 0 and v.verdict.error <= v.verdict.bound
    assert "eager float32 vs float64" in v.summary() and "ORT vs float64" in v.summary()

    # The same file with one tap tensor of source 13 (of 25) off by 2%, judged against the checkpoint's
    # reference, which the export computed before tracing.
    _fault_file(tmp_path / "good.onnx", tmp_path / "bad.onnx", 13)
    bad = validate_file(tmp_path / "bad.onnx", good.reference, decode, opts.dtype)
    assert not bad.passed and bad.verdict.error > 10 * bad.verdict.bound, bad.summary()
    assert any("exceeds the bound" in f for f in bad.failures)


def test_cli_export_exits_1_on_failed_validation_and_keeps_the_file(tmp_path, monkeypatch, capsys):
    ckpt = make_checkpoint(tmp_path / "small", seed=2, n_blocks=2)[0]
    import msar_export.export.reference as reference
    from msar_export.export.validate import reference_logits

    real, calls = reference.streamed_reference, []

    def reference_of_a_faulty_model(files, cfg, dtype, *a, **k):
        # The export reads its weights from the checkpoint file (weightless export), so the fault goes
        # into the reference: the logits of the checkpoint's model with one source's taps 2% off.
        calls.append(reference_logits(_faulty(ckpt, 2), dtype, *a, **k))
        return calls[-1]

    monkeypatch.setattr(reference, "streamed_reference", reference_of_a_faulty_model)
    out = tmp_path / "m.onnx"
    assert cli.main(["export", str(ckpt), "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "validation failed" in err[0] and "written and kept" in err[0], err
    assert out.is_file() and len(calls) == 1

    monkeypatch.setattr(reference, "streamed_reference", real)
    assert cli.main(["export", str(ckpt), "-o", str(out)]) == 0
