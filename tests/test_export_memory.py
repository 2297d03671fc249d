"""Memory-bounded export, checked by its outputs and by what is alive, not by RSS
(the RSS goals are measured by `msar-export bench --export-memory`): weights
written one at a time, inline or as external data, read back by every consumer;
the weightless skeleton the checker sees; the float64 reference without a
float64 model; dtype conversion one tensor at a time."""

from __future__ import annotations

import contextlib
import copy
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from conftest import make_checkpoint
from msar_export import load_checkpoint
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.export.report import ExportReport
from msar_export.export.save import ALIGN
from msar_export.model.precision import float64_one_sublayer_at_a_time
from msar_export.onnx_wire import load_without_weights
from msar_export.runtime import OrtModel


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("mem") / "msar", seed=4, n_blocks=3, tie_embeddings=False)[0]


@pytest.fixture(scope="module")
def inline_and_external(ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx")
    inline = export_checkpoint(ckpt, root / "inline.onnx", ExportOptions(), validate=False)
    external = export_checkpoint(ckpt, root / "ext.onnx", ExportOptions(external_data=True), validate=True)
    return inline, external


def _weights(path) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def test_external_data_holds_the_weights_and_ort_computes_the_same(ckpt, inline_and_external):
    inline, external = inline_and_external
    assert external.external_data and not inline.external_data
    assert external.validation.passed, external.summary()
    assert "weights in ext.onnx.data" in external.summary()
    proto = onnx.load(str(external.path), load_external_data=False)
    stored = {t.name: t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert "model.embed.weight" in stored and len(stored) > 10
    for t in stored.values():
        entry = {e.key: e.value for e in t.external_data}
        assert entry["location"] == "ext.onnx.data" and int(entry["offset"]) % ALIGN == 0
    # the same weights, bit for bit, whichever way they were stored
    a, b = _weights(inline.path), _weights(external.path)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    head = load_checkpoint(ckpt).lm_head.weight.detach().numpy()  # stored transposed (folded at export)
    assert any(v.shape == head.T.shape and np.array_equal(v, head.T) for v in b.values())
    ids = np.arange(26, dtype=np.int64).reshape(2, 13) % 61
    got = [OrtModel(p, threads=1, low_memory=low).logits(ids) for p in (inline.path, external.path) for low in (0, 1)]
    assert all(np.array_equal(got[0], g) for g in got[1:])


def test_skeleton_leaves_out_the_weights_and_points_at_them_in_the_file(inline_and_external):
    inline, _ = inline_and_external
    full = onnx.load(str(inline.path))
    skel = load_without_weights(inline.path)
    assert [n.op_type for n in skel.graph.node] == [n.op_type for n in full.graph.node]
    assert skel.metadata_props == full.metadata_props and len(skel.functions) == len(full.functions)
    raw = inline.path.read_bytes()
    left_out = 0
    for s, f in zip(skel.graph.initializer, full.graph.initializer):
        assert (s.name, list(s.dims), s.data_type) == (f.name, list(f.dims), f.data_type)
        if s.data_location == onnx.TensorProto.EXTERNAL:
            entry = {e.key: e.value for e in s.external_data}
            assert entry["location"] == inline.path.name
            off, n = int(entry["offset"]), int(entry["length"])
            assert raw[off:off + n] == f.raw_data
            left_out += n
        else:
            assert s == f
    assert left_out > 0.3 * inline.file_bytes  # this tiny model's tensors are mostly under 1 KiB
    assert len(skel.SerializeToString()) < inline.file_bytes - left_out + 4096


def test_truncated_file_is_one_clear_error(inline_and_external, tmp_path):
    from msar_export.errors import OnnxModelError
    from msar_export.graph_file import ExportedGraph

    from msar_export.onnx_wire import MODEL_GRAPH, _fields

    inline, _ = inline_and_external
    raw = inline.path.read_bytes()
    # Cut inside the graph field.  Half the file is not always inside it: node metadata
    # holds source paths, so the sizes move with the checkout's folder, and a cut that
    # lands on a boundary between top-level fields leaves a valid (shorter) protobuf.
    with open(inline.path, "rb") as f:
        for number, wire, _, length in _fields(f, len(raw)):
            if number == MODEL_GRAPH and wire == 2:
                start = f.tell()
                break
            f.seek(length, 1) if wire == 2 else None
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(raw[: start + length // 2])
    with pytest.raises(OnnxModelError, match="truncated"):
        ExportedGraph.open(cut)


def test_float64_reference_one_sublayer_at_a_time_is_model_double(ckpt):
    model = load_checkpoint(ckpt)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, model.cfg.vocab_size, (2, 15), generator=torch.Generator().manual_seed(1))
    want = copy.deepcopy(model).double()(ids).detach()
    seen = []  # float64 weights alive while each sublayer runs
    for layer in model.layers.values():
        layer.register_forward_hook(lambda mod, a, o: seen.append(
            sum(p.numel() for p in model.layers.parameters() if p.dtype == torch.float64)))
    storage = {k: p.data_ptr() for k, p in model.layers.named_parameters()}
    with torch.no_grad(), float64_one_sublayer_at_a_time(model):
        got = model(ids)
    assert got.dtype == torch.float64 and torch.equal(got, want)
    # each sublayer got its own tensors back, not float32 copies of the float64 ones
    assert {k: p.data_ptr() for k, p in model.layers.named_parameters()} == storage
    biggest = max(sum(p.numel() for p in layer.parameters()) for layer in model.layers.values())
    assert len(seen) == model.cfg.n_sublayers and max(seen) <= biggest
    after = model.state_dict()
    assert all(after[k].dtype == torch.float32 and torch.equal(after[k], v) for k, v in before.items())


def test_dtype_conversion_never_holds_both_precisions_of_every_weight(ckpt, monkeypatch):
    """Live float32 bytes counted at each read: tensors are read one at a time and each
    float32 original dies as its float16 copy is made, so at most one original (the one
    being read) is alive at any read; float16 copies are what the model keeps."""
    from msar_export.weights import WeightFiles

    originals: list[weakref.ref] = []
    live = []
    real_read = WeightFiles.read

    def read(self, name, dtype=None):
        live.append(sum(r().nbytes for r in originals if r() is not None))
        t = real_read(self, name, dtype)
        originals.append(weakref.ref(t))
        return t

    monkeypatch.setattr(WeightFiles, "read", read)
    model = load_checkpoint(ckpt, dtype=torch.float16)
    assert all(p.dtype == torch.float16 for p in model.parameters())
    assert len(originals) == len(model.state_dict())
    assert sum(r().nbytes for r in originals if r() is not None) == 0, "float32 originals outlived the load"
    largest = max(2 * p.nbytes for p in model.parameters())
    # Control: the float32 total is many times the largest tensor, so the bound means something.
    assert 2 * sum(p.nbytes for p in model.parameters()) > 4 * largest
    assert live and max(live) <= largest


def test_float16_beyond_range_is_one_line(tmp_path):
    from conftest import random_tensors, write_checkpoint
    from msar_export.config import MSARConfig
    from msar_export.errors import CheckpointError

    path, cfg = make_checkpoint(tmp_path / "c", seed=1)
    tensors = random_tensors(MSARConfig.from_dict(cfg), 1)
    tensors["final_norm.weight"][0] = 1e6  # finite in float32, inf in float16
    write_checkpoint(path, cfg, tensors)
    load_checkpoint(path)
    with pytest.raises(CheckpointError, match="beyond the range of torch.float16"):
        load_checkpoint(path, dtype=torch.float16)


def test_cli_external_data_and_float16(ckpt, tmp_path, capsys):
    from msar_export import cli

    out = tmp_path / "m.onnx"
    assert cli.main(["export", str(ckpt), "-o", str(out), "--external-data", "--dtype", "float16"]) == 0
    text = capsys.readouterr().out
    assert "weights in m.onnx.data" in text and "float16" in text and "validation: PASS" in text, text
    proto = onnx.load(str(out))  # external data resolved beside the file
    embed = next(t for t in proto.graph.initializer if t.name == "model.embed.weight")
    assert embed.data_type == onnx.TensorProto.FLOAT16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def _run(args, **env):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env={**os.environ, **env})


def test_validating_process_imports_no_torch():
    """The process a large export's validation runs in (export/handoff.py) must stay
    light: torch alone is ~180 MiB of RSS."""
    code = ("import sys, msar_export, msar_export.cli, msar_export.cli_export, msar_export.export.handoff, "
            "msar_export.export.validate, "
            "msar_export.runtime; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    assert _run(["-c", code]).stdout.strip() == "[]"
    # the control: the exporter does import it
    assert "'torch'" in _run(["-c", code.replace("msar_export.runtime;", "msar_export.export.exporter;")]).stdout


def test_validation_apart_reports_as_in_process(ckpt, tmp_path, capsys):
    """A checkpoint over handoff.APART_ABOVE (here: any) is validated by an exec'd process:
    the same file, the same numbers, the same report, exit 0."""
    from msar_export import cli
    from msar_export.export.handoff import APART_ENV

    assert cli.main(["export", str(ckpt), "-o", str(tmp_path / "a.onnx")]) == 0
    here = capsys.readouterr().out
    r = _run(["-m", "msar_export.cli", "export", str(ckpt), "-o", str(tmp_path / "b.onnx")], **{APART_ENV: "0"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    line = [ln for ln in here.splitlines() if "validation:" in ln]
    assert line and line == [ln for ln in r.stdout.splitlines() if "validation:" in ln], (here, r.stdout)
    assert "MB with validation" in r.stdout and not list(tmp_path.glob("msar-validate-*"))


def test_validation_apart_fails_with_exit_1_and_one_line(ckpt, tmp_path, monkeypatch):
    """The library validates a large export apart as the CLI does (here: any size), in a child:
    a file exported from a faulty model fails (the file kept), its control passes; the CLI's
    validating image, given the same state, exits 1 with one line."""
    from msar_export.export import handoff
    from msar_export.export.handoff import APART_ENV, write_state
    from msar_export.export.weightless import LazyWeights

    monkeypatch.setenv(APART_ENV, "0")
    good = export_checkpoint(ckpt, tmp_path / "good.onnx", ExportOptions())
    real = LazyWeights.read

    def read_with_fault(self, name):
        t = real(self, name)
        return t * 1.02 if name == "final_norm.weight" else t  # exported, not in the reference

    monkeypatch.setattr(LazyWeights, "read", read_with_fault)
    # The run's peak adds the child's peak to this process's RSS when validation starts; a parent
    # that seems to hold 100 GB then makes the sum show whatever the child's own peak is (the
    # child's real peak can be below the export's, so comparing them alone was a coin toss).
    monkeypatch.setattr(handoff, "rss_mb", lambda: 100_000.0)
    bad = export_checkpoint(ckpt, tmp_path / "bad.onnx", ExportOptions())
    assert good.validation.passed and good.validation.verdict.passed, good.validation.summary()
    assert not bad.validation.passed and "exceeds the bound" in bad.validation.failures[-1]
    assert bad.peak_rss_validated_mb > 100_000.0 > bad.peak_rss_mb and not list(tmp_path.glob("msar-valid*"))
    r = _run(["-m", "msar_export.cli_export", str(write_state(bad))])
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "written and kept" in err[0], r.stderr
    assert "validation: FAIL" in r.stdout and (tmp_path / "bad.onnx").is_file()


def test_the_library_and_the_cli_decide_alike_where_validation_runs(ckpt, tmp_path, monkeypatch):
    """export_checkpoint decides, for every caller: over the threshold both validate apart (the
    library in a child, the CLI by replacing its process), under it both in-process."""
    import os

    from msar_export import cli
    from msar_export.export import exporter, handoff

    calls = []

    class Replaced(BaseException):  # past run_command, as an exec leaves it
        pass

    def fake_export(load, out, opts, source, validate, owns_model, defer_validation=False, **kw):
        calls.append(("deferred" if defer_validation else "in-process", Path(out).name))
        return ExportReport(Path(out), opts)

    def execve(exe, argv, env):
        calls.append(("exec " + " ".join(argv[1:3]), os.path.basename(argv[0])))
        raise Replaced

    monkeypatch.setattr(exporter, "_export", fake_export)
    monkeypatch.setattr(handoff, "validate_in_child", lambda r: calls.append(("child", r.path.name)) or r)
    monkeypatch.setattr(handoff, "write_state", lambda report: tmp_path / "state.json")
    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setattr("msar_export.memory.map_large_buffers", lambda: calls.append(("mapped", "")))
    for limit, apart in (("0", True), (str(2**60), False)):
        monkeypatch.setenv(handoff.APART_ENV, limit)
        calls.clear()
        export_checkpoint(ckpt, tmp_path / "api.onnx", ExportOptions())
        with pytest.raises(Replaced) if apart else contextlib.nullcontext():
            cli.main(["export", str(ckpt), "-o", str(tmp_path / "cli.onnx")])
        if apart:  # the CLI's process alone maps its large buffers and becomes the validating image
            assert [c[0] for c in calls] == ["deferred", "child", "mapped", "deferred",
                                             "exec -m msar_export.cli_export"], calls
        else:
            assert [c[0] for c in calls] == ["in-process", "in-process"], calls
        assert [c[1] for c in calls if c[0] in ("deferred", "in-process")] == ["api.onnx", "cli.onnx"]


def test_low_memory_session_computes_the_same_logits(inline_and_external):
    """Validation's session (no pre-packing, no constant folding) against ORT's default:
    bit-identical logits, so the verdict is the same; the control, a changed input, differs."""
    inline, _ = inline_and_external
    ids = (np.arange(57, dtype=np.int64).reshape(3, 19) * 7) % 61
    lean = OrtModel(inline.path, threads=2, low_memory=True).session.run(["logits"], {"input_ids": ids})[0]
    full = OrtModel(inline.path, threads=2).session
    assert np.array_equal(lean, full.run(["logits"], {"input_ids": ids})[0])
    assert not np.array_equal(lean, full.run(["logits"], {"input_ids": (ids + 1) % 61})[0])


def _mapped(path) -> int:
    """Mappings of `path` in this process (Linux)."""
    with open("/proc/self/maps") as f:
        return sum(line.rstrip("\n").endswith(str(path)) for line in f)


def test_validation_session_maps_the_external_data(inline_and_external):
    """Validation's ORT session uses the weights from the mapped data file, not a copy read
    into memory; the mappings go with the session."""
    _, external = inline_and_external
    data = external.path.with_name(external.path.name + ".data").resolve()
    before = _mapped(data)
    model = OrtModel(external.path, threads=1, low_memory=True)
    model.ort.logits(np.arange(10, dtype=np.int64).reshape(2, 5))
    assert _mapped(data) > before
    del model
    import gc

    gc.collect()
    assert _mapped(data) == before
