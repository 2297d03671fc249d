"""`msar-export check`: a faithful export passes, every injected export bug fails
with exit 1 and names the first layer it corrupts, bad input exits 2."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from conftest import make_checkpoint, trained_checkpoint
from msar_export.checkpoint import load_checkpoint
from msar_export.cli import main
from msar_export.compare import check_parity
from msar_export.compare.inputs import check_shapes, default_shapes, parse_shapes, token_batches
from msar_export.compare.parity import REFERENCE, compare_backend
from msar_export.compare.tolerances import Tolerance, fixed, looser
from msar_export.errors import BackendUnavailable, InputError
from msar_export.export import ExportOptions, export_model
from msar_export.runners.common import layer_order
from msar_export.runners.trt import tensorrt_unavailable, trt_runner_from_onnx
from msar_export.verdict import rel_err

PYTHON = sys.executable
POLYGRAPHY = str(Path(sys.executable).parent / "polygraphy")
D = 40  # d_model of conftest.ODD


from compare_fixtures import faulted, scale_tap  # noqa: E402  (`faithful`, `faithful_decode`: conftest.py)


def flip_taps(sources):
    def edit(t):
        for name in [n for n in t if n.startswith("sources.")]:
            if int(name.split(".")[1]) in sources:
                t[name] = t[name].flip(-1)
    return edit


def swap_gate_blocks(j, a=0, b=1):
    """The gate reads the streams in the wrong order: swap column blocks a and b of W_j."""
    def edit(t):
        w = t[f"mixers.{j}.gate.weight"]
        blocks = list(w.split(D, dim=1))
        blocks[a], blocks[b] = blocks[b], blocks[a]
        t[f"mixers.{j}.gate.weight"] = torch.cat(blocks, dim=1)
    return edit


def scale_query(j, r, factor=1.02):
    def edit(t):
        t[f"mixers.{j}.query"][r] *= factor
    return edit


def shift_gate_bias(j, r, delta=0.01):
    def edit(t):
        t[f"mixers.{j}.gate.bias"][r] += delta
    return edit


FAULTS = {
    # fault: (edit, first bad layer).  Source i is first read by mixer i+1.
    "conv-tap-2pct-source0": (scale_tap(0, 2, 1), 1),
    "conv-tap-2pct-source2": (scale_tap(2, 1, 1), 3),
    "conv-tap-2pct-source4": (scale_tap(4, 2, 4), 5),
    "streams-fused-in-wrong-order-mixer3": (swap_gate_blocks(3, 0, 1), 3),
    "streams-fused-in-wrong-order-mixer1": (swap_gate_blocks(1, 1, 2), 1),
    "taps-reversed-all-sources": (flip_taps(range(5)), 1),
    "taps-reversed-source1": (flip_taps([1]), 2),
    "pseudo-query-2pct-mixer4": (scale_query(4, 1), 4),
    "gate-bias-off-by-0.01-mixer2": (shift_gate_bias(2, 0), 2),
}


def assert_first_bad(result, backend: str, layer: int):
    b = result.backend(backend)
    assert result.exit_code == 1 and not result.passed
    assert b.status == "fail" and b.first_bad is not None, b
    got = b.first_bad.layer
    assert got == layer, f"first bad layer h_{got}, expected h_{layer}: " + \
        ", ".join(f"{lr.name}={lr.error:.1e}" for lr in b.layers)
    for lr in b.layers:
        if lr.layer is not None and lr.layer < layer:
            assert lr.passed, f"{lr.name} should still match ({lr.error:.1e})"


# -- the check itself ---------------------------------------------------------------------

def test_faithful_export_passes(faithful):
    ckpt, onnx_path, cfg = faithful
    result = check_parity(ckpt, onnx_path)
    ort = result.backend("onnxrt")
    assert result.passed and result.exit_code == 0, ort
    assert [lr.name for lr in ort.layers] == layer_order(load_checkpoint(ckpt).cfg)
    assert all(lr.passed and lr.error < 1e-5 for lr in ort.layers)
    assert all(lr.max_abs is not None and lr.max_elementwise_rel is not None for lr in ort.layers)
    trt = result.backend("tensorrt")
    why = tensorrt_unavailable()
    if why is None:
        assert trt.passed, trt
    else:
        assert trt.status == "skipped" and trt.reason == why


def test_check_parses_the_graph_once(faithful, monkeypatch, capsys):
    """`msar-export check` opens the ONNX file once (ExportedGraph); ONNX Runtime then
    loads it itself.  No other reader (onnx.load, Polygraphy's loaders) parses it again."""
    import msar_export.graph_file as graph_file

    ckpt, onnx_path, _ = faithful
    parses, real_parse = [], graph_file._parse
    monkeypatch.setattr(graph_file, "_parse", lambda path, weights: parses.append(path) or real_parse(path, weights))

    def no_other_reader(*args, **kwargs):
        raise AssertionError("the graph was parsed outside ExportedGraph.open")

    monkeypatch.setattr(onnx, "load", no_other_reader)
    monkeypatch.setattr(onnx, "load_model", no_other_reader)
    assert main(["check", str(ckpt), "--onnx", str(onnx_path), "--no-trt", "--shapes", "1x9"]) == 0
    assert parses == [onnx_path], parses
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("fault", list(FAULTS))
def test_injected_fault_names_its_first_layer(fault, faithful, tmp_path):
    ckpt, onnx_path, _ = faithful
    edit, layer = FAULTS[fault]
    bad = faulted(ckpt, tmp_path / "bad", edit)
    result = check_parity(bad, onnx_path, tensorrt=False)
    assert_first_bad(result, "onnxrt", layer)


def test_fault_in_the_graph_is_found_too(faithful, tmp_path):
    """Vice versa: the checkpoint is right, the graph's mixer-3 gate bias is off."""
    import onnx_ir as ir

    ckpt, onnx_path, _ = faithful
    model = ir.load(str(onnx_path))
    bias = model.graph.initializers["model.mixers.3.gate.bias"]
    bias.const_value = ir.tensor(bias.const_value.numpy() + np.float32(0.01))
    bad_graph = tmp_path / "bad.onnx"
    ir.save(model, str(bad_graph))
    result = check_parity(ckpt, bad_graph, tensorrt=False)
    assert_first_bad(result, "onnxrt", 3)


def test_a_graph_onnx_runtime_cannot_run_fails_instead_of_passing(faithful, tmp_path):
    """Drop the msar function bodies: on the function bodies ONNX Runtime cannot build a session.
    The graph is the user's input, so that is a one-line OnnxModelError (exit 2), never a pass.
    The file is refused on opening, whichever kernels would run it: it is not what msar-export
    wrote, and the message names the repair."""
    from msar_export.errors import OnnxModelError

    ckpt, onnx_path, _ = faithful
    proto = onnx.load(str(onnx_path))
    del proto.functions[:]
    broken = tmp_path / "no-functions.onnx"
    onnx.save(proto, str(broken))
    for ort_ops in ("function", "native"):
        with pytest.raises(OnnxModelError, match="msar nodes find no function body .*`msar-export onnx repair"):
            check_parity(ckpt, broken, tensorrt=False, ort_ops=(ort_ops,))


def test_negative_control_wrong_weights_are_caught(faithful, tmp_path):
    """A different model with the same config (other seed) must fail from h_1 on."""
    _, onnx_path, cfg = faithful
    other, _ = make_checkpoint(tmp_path / "other", seed=6)
    result = check_parity(other, onnx_path, tensorrt=False)
    assert_first_bad(result, "onnxrt", 1)
    assert all(lr.status == "fail" for lr in result.backend("onnxrt").layers)


@pytest.fixture(scope="module")
def reference(faithful):
    from msar_export.compare.runs import run_runner
    from msar_export.runners.eager import TorchRunner

    cfg = load_checkpoint(faithful[0]).cfg
    feeds = token_batches(cfg, default_shapes(cfg))
    return cfg, run_runner(TorchRunner(load_checkpoint(faithful[0]), name=REFERENCE), feeds)


def _ref_and_copy(reference):
    cfg, ref = reference
    return cfg, ref, copy.deepcopy(ref)


def rebuilt(it, drop=None, add=None):
    from polygraphy.comparator import IterationResult

    outs = {k: v for k, v in it.items() if k != drop}
    return IterationResult(outputs={**outs, **(add or {})}, runner_name="fake")


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_or_inf_fails_whatever_the_tolerance(reference, value):
    cfg, ref, got = _ref_and_copy(reference)
    arr = got[1]["hidden.4"].copy()
    arr[0, 3, 7] = value
    got[1]["hidden.4"] = arr
    res = compare_backend(ref, got, layer_order(cfg), Tolerance(1e9, 1e9), "fake", "float32")
    assert res.status == "fail" and res.first_bad.name == "hidden.4" and not res.first_bad.finite


def test_identical_outputs_pass_and_nothing_goes_missing_unnoticed(reference):
    cfg, ref, got = _ref_and_copy(reference)
    names = layer_order(cfg)
    assert compare_backend(ref, got, names, FIXED, "fake", "float32").passed
    # an output the backend does not produce fails (unless declared optional) ...
    got = [rebuilt(it, drop="hidden.3") for it in got]
    res = compare_backend(ref, got, names, FIXED, "fake", "float32")
    assert res.status == "fail" and res.first_bad.name == "hidden.3"
    opt = compare_backend(ref, got, names, FIXED, "fake", "float32", optional=("hidden.3",))
    assert opt.passed and opt.layer("hidden.3").status == "missing"
    # ... and so does a backend that returns fewer batches than it was given
    assert compare_backend(ref, got[:2], names, FIXED, "fake", "float32").status == "fail"


def test_names_are_matched_exactly_not_by_polygraphy_substring_rules(reference):
    """Polygraphy's default matcher would compare 'hidden.1' with 'hidden.1x'."""
    cfg, ref, got = _ref_and_copy(reference)
    got = [rebuilt(it, drop="hidden.1", add={"hidden.1x": it["hidden.1"]}) for it in got]
    res = compare_backend(ref, got, layer_order(cfg), FIXED, "fake", "float32")
    assert res.layer("hidden.1").status == "fail"



def _one_output(ref, got):
    from polygraphy.comparator import IterationResult

    return ([IterationResult(outputs={"logits": ref}, runner_name="ref")],
            [IterationResult(outputs={"logits": got}, runner_name="fake")])


def test_verdict_and_reason_come_from_the_one_metric():
    """An error exactly at its tolerance passes (verdict.within: error <= tolerance).  When a
    second comparator (Polygraphy's, atol = tolerance * max|ref|, which rounds below max|diff|
    here) decided as well, this failed with the reason 'error 0.00443 > tolerance 0.00443'."""
    ref = np.array([[[1.0, -7.0]]])
    got = ref + np.array([[[0.031, 0.0]]])
    error = rel_err(got, ref)
    lr = compare_backend(*_one_output(ref, got), ["logits"], fixed(error), "onnxrt", "float32").layers[0]
    assert lr.passed and lr.error == error, lr.reason
    # Control: one ulp tighter it fails, and the reason's two numbers read as a true statement.
    bad = compare_backend(*_one_output(ref, got), ["logits"], fixed(np.nextafter(error, 0)), "onnxrt",
                          "float32").layers[0]
    assert bad.status == "fail"
    x, y = re.fullmatch(r"error (\S+) > tolerance (\S+)", bad.reason).groups()
    assert float(x) > float(y), bad.reason
    inf = compare_backend(*_one_output(ref, got), ["logits"], fixed(np.inf), "onnxrt", "float32").layers[0]
    assert inf.status == "fail" and "not a finite bound" in inf.reason


def test_an_engine_built_here_computes_in_the_graphs_precision(faithful):
    """The network is strongly typed, so an engine built from the graph computes in the graph's
    precision: trt_runner_from_onnx refuses another `precision` (it used to ignore it) before
    TensorRT is imported, and `check --dtype` below the graph's, without --engine, is refused on
    every machine (it judged a float32 engine by float16 bounds where TensorRT ran)."""
    ckpt, onnx_path, _ = faithful
    with pytest.raises(InputError, match="strongly typed"):
        trt_runner_from_onnx(onnx_path, ["logits"], "float16", (1, 9))
    with pytest.raises(InputError, match="strongly typed"):
        check_parity(ckpt, onnx_path, dtype="float16", shapes=[(1, 9)])
    # Control: the graph's own precision gets past the check, to TensorRT itself (lazy: nothing is built).
    try:
        assert trt_runner_from_onnx(onnx_path, ["logits"], "float32", (1, 9)) is not None
    except BackendUnavailable:
        assert tensorrt_unavailable() is not None


def test_bounds_at_a_lower_precision_convert_the_model_in_memory(faithful, tmp_path, monkeypatch):
    """A float16 graph's bounds come from the eager model at float16: the float32 model is
    converted in memory, the checkpoint is read once (it was read again, at float16)."""
    import msar_export.checkpoint as checkpoint

    ckpt, onnx_path, _ = faithful
    proto = onnx.load(str(onnx_path))
    for prop in proto.metadata_props:
        if prop.key == "msar.dtype":
            prop.value = "float16"  # a float32 graph labelled float16: judged at float16's bounds
    labelled = tmp_path / "labelled-fp16.onnx"
    onnx.save(proto, str(labelled))
    reads, real = [], checkpoint.load_checkpoint
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: reads.append(k.get("dtype")) or real(*a, **k))
    ort = check_parity(ckpt, labelled, tensorrt=False, shapes=[(1, 9), (2, 12)]).backend("onnxrt")
    assert reads == [torch.float32], reads
    assert ort.passed and ort.precision == "float16" and "eager float16" in ort.tolerance.source
    # the bound's eager run was at float16 (float32's own error here is ~1e-7)
    assert all(lr.eager_error > 1e-5 for lr in ort.layers), [lr.eager_error for lr in ort.layers]


def test_at_precision_is_the_model_load_checkpoint_reads(faithful):
    from msar_export.compare.runs import at_precision

    ckpt = faithful[0]
    model = load_checkpoint(ckpt, dtype=torch.float32)
    for precision in ("float16", "bfloat16"):
        low, read = at_precision(model, precision), load_checkpoint(ckpt, dtype=getattr(torch, precision))
        assert low.dtype == getattr(torch, precision)
        got, want = low.state_dict(), read.state_dict()
        assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert model.dtype == torch.float32  # converted into a new model, not in place

# Trained weights are the slow tier's: check_parity on a prefill graph runs in test_faithful_export_passes, and
# trained weights through the exporter in test_export.py::test_prefill_graph_matches_float64_reference[trained-prefill].
@pytest.mark.slow
def test_trained_checkpoint_passes(tmp_path):
    ckpt = trained_checkpoint("msar")
    onnx_path = tmp_path / "trained.onnx"
    export_model(load_checkpoint(ckpt), onnx_path, ExportOptions(), validate=False)
    result = check_parity(ckpt, onnx_path, tensorrt=False)
    ort = result.backend("onnxrt")
    assert result.passed, [(lr.name, lr.error) for lr in ort.layers]
    assert len(ort.layers) == 2 * 4 + 2
    assert max(lr.error for lr in ort.layers) < 1e-5


# -- inputs and tolerances -----------------------------------------------------------------

def test_default_inputs_cover_the_conv_window_and_differ_from_export_shapes(faithful):
    cfg = load_checkpoint(faithful[0]).cfg
    shapes = default_shapes(cfg)
    assert shapes == [(1, cfg.kmax + 5), (2, 37), (3, 64)]
    assert (2, 5) not in shapes  # the exporter traces at (2, 5)
    feeds = token_batches(cfg, shapes, seed=3)
    again = token_batches(cfg, shapes, seed=3)
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(feeds, again))
    ids = np.concatenate([f["input_ids"].ravel() for f in feeds])
    assert ids.dtype == np.int64 and ids.min() == 0 and ids.max() == cfg.vocab_size - 1
    with pytest.raises(InputError, match="conv window"):
        check_shapes([(2, cfg.kmax)], cfg)
    with pytest.raises(InputError, match="max_seq_len"):
        check_shapes([(1, cfg.max_seq_len + 1)], cfg)
    assert parse_shapes("1x17, 2X37") == [(1, 17), (2, 37)]
    with pytest.raises(InputError):
        parse_shapes("1by17")


def test_bounds_grow_with_the_precision_and_the_graph_precision_is_a_floor():
    from msar_export.compare.tolerances import from_eager

    bounds = [from_eager({"logits": 1e-6}, p).logits for p in ("float32", "float16", "bfloat16")]
    assert bounds == sorted(bounds) and bounds[0] == pytest.approx(4e-6 + 128 * 2.0**-24)
    assert looser("float32", "float16") == "float16" and looser("bfloat16", "float16") == "bfloat16"


def test_dtype_is_for_tensorrt_onnx_runtime_keeps_the_graphs_own_precision(faithful):
    from msar_export.verdict import bound

    ckpt, onnx_path, _ = faithful
    ort = check_parity(ckpt, onnx_path, dtype="float16", tensorrt=False).backend("onnxrt")
    assert ort.precision == "float32" and "eager float32 vs float64" in ort.tolerance.source
    plain = check_parity(ckpt, onnx_path, tensorrt=False).backend("onnxrt")
    assert ort.tolerance == plain.tolerance
    for lr in ort.layers:  # each output's bound is the verdict model's, from eager float32's own error there
        assert lr.eager_error is not None and lr.tolerance == bound(lr.eager_error, "float32")
        assert lr.error <= lr.tolerance
    over = check_parity(ckpt, onnx_path, tol=1e-12, tensorrt=False)
    assert over.exit_code == 1 and over.backend("onnxrt").tolerance.source == "--tol"


FIXED = fixed(1e-4)  # compare_backend's own tests: one bound, as --tol gives

# -- decode graphs ---------------------------------------------------------------------------

def test_decode_graph_is_checked_on_top_of_an_eager_past(faithful_decode):
    """The graph gets a past (KV cache + conv state) made eagerly from each batch's
    first half and must reproduce the eager step on the second half, layer by layer."""
    ckpt, path, cfg = faithful_decode
    result = check_parity(ckpt, path)
    assert result.passed and result.exit_code == 0, result.backend("onnxrt")
    assert [lr.name for lr in result.backend("onnxrt").layers] == layer_order(load_checkpoint(ckpt).cfg)
    assert result.backend("tensorrt").status == "skipped"


@pytest.mark.parametrize("fault", ["conv-tap-2pct-source2", "gate-bias-off-by-0.01-mixer2"])
def test_fault_in_a_decode_graph_names_its_first_layer(fault, faithful_decode, tmp_path):
    ckpt, path, _ = faithful_decode
    edit, layer = FAULTS[fault]
    result = check_parity(faulted(ckpt, tmp_path / "bad", edit), path, tensorrt=False)
    assert_first_bad(result, "onnxrt", layer)
