"""Hostile files and careless paths: nothing is read or written outside what the user
named, outputs that are not ours are never replaced, and every hostile input costs
little and ends in one line with exit code 2 (crafted ONNX bundles are in
test_hostile_bundles.py).  The end-to-end cases use a real msar export."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import make_checkpoint
from hostile_helpers import CLI, REPO, W, one_line_exit_2, run_cli, run_main, run_tiny, tiny_model, tree  # noqa: F401

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("hostile") / "ckpt", seed=1, query_scale=0.5, n_blocks=1)[0]


def _device_or_fifo(path: Path) -> str:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a fake /dev/null, in a temp folder
        return "char device"
    except PermissionError:  # not root: a FIFO exercises the same rule
        os.mkfifo(path)
        return "fifo"


def test_export_never_replaces_a_device_fifo_or_directory(ckpt, tmp_path):
    dev, fifo, folder = tmp_path / "null", tmp_path / "fifo", tmp_path / "dir.onnx"
    kind = _device_or_fifo(dev)
    os.mkfifo(fifo)
    folder.mkdir()
    # a child for the FIFO: an open for writing would block, and only a child can be timed out
    for target, run in ((dev, run_main), (fifo, lambda *a: run_cli(*a, timeout=120))):
        assert "not a regular file" in one_line_exit_2(run("export", ckpt, "-o", target, "--no-validate"))
    assert (stat.S_ISCHR if kind == "char device" else stat.S_ISFIFO)(os.lstat(dev).st_mode)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert "is a directory" in one_line_exit_2(run_main("export", ckpt, "-o", folder, "--no-validate"))
    assert "cannot write" in one_line_exit_2(run_main("export", ckpt, "-o", "/proc/msar-test.onnx", "--no-validate"))
    parent_file = tmp_path / "plain"
    parent_file.write_text("x")
    line = one_line_exit_2(run_main("export", ckpt, "-o", parent_file / "m.onnx", "--no-validate"))
    assert "not a directory" in line.lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.onnx", "fifo", "null", "plain"]
    assert list(folder.iterdir()) == []


def test_export_leaves_no_parts_or_temp_litter(ckpt, tmp_path, monkeypatch):
    from msar_export.export import ExportOptions, export_checkpoint
    import msar_export.export.exporter as exporter

    export_checkpoint(ckpt, tmp_path / "a.onnx", ExportOptions(), validate=False)
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_ABOVE", 1024)
    export_checkpoint(ckpt, tmp_path / "b.onnx", ExportOptions(), validate=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "b.onnx", "b.onnx.data"]


def test_triton_repo_output_must_be_new_or_ours(tmp_path):
    model = tiny_model(tmp_path / "model", "w.data")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    line = one_line_exit_2(run_main("triton-repo", model, "-o", other, "--no-validate"))
    assert "not a repository msar-export wrote" in line and (other / "keep.txt").read_text() == "precious"
    for target in (tmp_path / "model", tmp_path, model):  # the model's folder, a folder above it, the model file
        before = tree(tmp_path)
        for force in ([], ["--force"]):
            one_line_exit_2(run_main("triton-repo", model, "-o", target, "--no-validate", *force))
            assert tree(tmp_path) == before
    # ours: replaced in place; with --force a foreign folder is replaced too
    ours = tmp_path / "repo"
    for _ in range(2):
        assert run_main("triton-repo", model, "-o", ours, "--no-validate").returncode == 0
    assert run_main("triton-repo", model, "-o", other, "--no-validate", "--force").returncode == 0
    assert not (other / "keep.txt").exists() and (other / "manifest.json").is_file()


# -- 5: bounded cost ------------------------------------------------------------------------------

def test_config_claiming_huge_sizes_is_refused_before_any_table(ckpt, tmp_path):
    import shutil

    from msar_export.checkpoint import load_checkpoint
    from msar_export.errors import MsarError

    for key, value in (("n_blocks", 10**8), ("n_blocks", 4000), ("vocab_size", 10**9), ("max_seq_len", 10**12)):
        bad = tmp_path / f"{key}-{value}"
        shutil.copytree(ckpt, bad)
        cfg = json.loads((bad / "config.json").read_text())
        (bad / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(MsarError) as info:
            load_checkpoint(bad)  # before the fix: a 10**8-block table, 4 GB after a minute
        assert key in str(info.value) or "tensor" in str(info.value)


def test_oversized_and_special_config_files_are_refused_unread(ckpt, tmp_path):
    import shutil

    big, fifo = tmp_path / "big", tmp_path / "fifo"
    shutil.copytree(ckpt, big)
    with open(big / "config.json", "r+") as f:
        f.seek(0, os.SEEK_END)
        f.write(" " * (3 << 20))  # valid JSON padded to 3 MB
    assert "over the" in one_line_exit_2(run_main("export", big, "-o", tmp_path / "x.onnx"))
    shutil.copytree(ckpt, fifo)
    (fifo / "config.json").unlink()
    os.mkfifo(fifo / "config.json")  # stands in for /proc/kmsg: a read that never ends
    assert "not a regular file" in one_line_exit_2(run_cli("export", fifo, "-o", tmp_path / "y.onnx", timeout=60))
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "y.onnx").exists()


# -- 7, 8: user errors are one line and exit 2 -------------------------------------------------

def _with_config_text(ckpt: Path, dst: Path, text: str) -> Path:
    import shutil

    shutil.copytree(ckpt, dst)
    (dst / "config.json").write_text(text)
    return dst


@pytest.mark.slow  # every hostile JSON form through the CLI
def test_hostile_json_in_config(ckpt, tmp_path):
    cfg = json.loads((ckpt / "config.json").read_text())
    body = json.dumps(cfg)[1:-1]
    cases = {
        "deep": ('{"x": ' + "[" * 5000 + "]" * 5000 + ", " + body + "}", "nested too deeply|not valid JSON"),
        "digits": ('{"vocab_size": ' + "9" * 5000 + ", " + body.replace('"vocab_size"', '"v_"') + "}",
                   "not valid JSON"),
        "duplicate": ("{" + body + ', "d_model": 8}', "duplicate key 'd_model'"),
        "version_true": (json.dumps({**cfg, "format_version": True}), "format_version true|format_version True"),
        "version_float": (json.dumps({**cfg, "format_version": 1.0}), "format_version 1.0"),
        "nan": (json.dumps({**cfg, "norm_eps": float("nan")}), "NaN is not JSON"),
    }
    import re

    for name, (text, want) in cases.items():
        line = one_line_exit_2(run_cli("export", _with_config_text(ckpt, tmp_path / name, text), "-o",
                                       tmp_path / f"{name}.onnx"))
        assert re.search(want, line), (name, line)


def test_hostile_msar_config_metadata(tmp_path):
    """The same JSON rules for the `msar.config` an ONNX file carries (read by generate --onnx, serve, check)."""
    from msar_export.errors import MsarError
    from msar_export.runtime import OrtModel

    model = tiny_model(tmp_path, "w.data")
    for text in ("[" * 5000 + "]" * 5000, '{"vocab_size": ' + "1" * 5000 + "}", '{"a": 1, "a": 2}'):
        proto = onnx.load(str(model), load_external_data=False)
        onnx.helper.set_model_props(proto, {"msar.config": text})
        model.write_bytes(proto.SerializeToString())
        with pytest.raises(MsarError):
            OrtModel(model, threads=1)
    assert "Traceback" not in run_main("generate", "--onnx", model).stderr.decode()


def test_bad_generation_settings(tmp_path):
    """Every setting through the library check; two through the CLI (one line, exit 2)."""
    from msar_export.errors import InputError
    from msar_export.model.generate import check_sampling

    for temperature, top_k, want in ((1.0, 0, "top_k"), (1.0, -1, "top_k"), (float("nan"), None, "temperature"),
                                     (0, None, "temperature"), (1.0, True, "top_k")):
        with pytest.raises(InputError, match=want):
            check_sampling(True, temperature, top_k)
    ckpt = REPO / "checkpoints" / "default" / "msar"
    for args, want, run in ((["--max-new-tokens", "-1"], "max-new-tokens", run_main),
                            (["--prompt", b"\xff\xfe"], "UTF-8", run_cli)):  # argv bytes: through a real argv
        assert want in one_line_exit_2(run("generate", ckpt, "--max-new-tokens", "2", *args)), args
    assert "temperature" in one_line_exit_2(run_main("generate", ckpt, "--sample", "--temperature", "nan"))


def test_check_shapes_bounded_and_non_empty(tmp_path):
    from msar_export.compare.inputs import check_shapes
    from msar_export.config import MSARConfig
    from msar_export.errors import InputError

    ckpt = REPO / "checkpoints" / "default" / "msar"
    line = one_line_exit_2(run_main("check", ckpt, "--onnx", tmp_path / "any.onnx", "--shapes", ""))
    assert "--shapes is empty" in line
    cfg = MSARConfig(max_seq_len=1 << 20, vocab_size=256)
    assert check_shapes([(2, 64)], cfg) == [(2, 64)]
    for shape in ((1000000, 32), (300, 16), (8, 1 << 20)):  # 2 GB+ of logits before the fix
        with pytest.raises(InputError, match="too large"):
            check_shapes([shape], cfg)


def test_loadtest_loopback_is_an_exact_match():
    from msar_export.errors import InputError
    from msar_export.serving.load.loadtest import check_loopback

    for ok in ("http://127.0.0.1:8000", "grpc://127.0.0.2:8001", "http://localhost:8000", "http://[::1]:8000"):
        check_loopback(ok)
    for bad in ("http://localhost.example.com:8000", "http://127.0.0.1.example.com:8000", "http://10.0.0.1:8000",
                "grpc://[::2]:8001"):
        with pytest.raises(InputError):
            check_loopback(bad)


# -- 6: external data end to end ---------------------------------------------------------------

def test_serving_repository_carries_external_data_and_the_original_stays_checkable(ckpt, tmp_path, monkeypatch):
    """`serve MODEL.onnx` used to copy model.onnx alone; triton-repo hard-linked the data, after
    which the onnx library refused the original ('potential hardlink attack')."""
    import msar_export.export.exporter as exporter
    from msar_export.compare.preflight import inspect_onnx as preflight
    from msar_export.config import MSARConfig
    from msar_export.export import ExportOptions, export_checkpoint
    from msar_export.runtime import OrtModel
    from msar_export.serving.repository.writer import build_serving_repo, build_stock_repo, verify_repo

    monkeypatch.setattr(exporter, "EXTERNAL_DATA_ABOVE", 1024)
    src = tmp_path / "src" / "prefill.onnx"
    export_checkpoint(ckpt, src, ExportOptions(), validate=False)
    data = src.parent / "prefill.onnx.data"
    assert data.is_file()
    repo, _ = build_serving_repo(src, None, tmp_path / "serve-repo", validate=False)
    build_stock_repo(src, tmp_path / "stock-repo", name="m", validate=False)
    ids = np.arange(12, dtype=np.int64).reshape(1, 12) % 61
    want = OrtModel(src, threads=1).logits(ids)
    for served in (repo / "logits" / "1" / "model.onnx", tmp_path / "stock-repo" / "m" / "1" / "model.onnx"):
        copy = served.parent / "prefill.onnx.data"
        assert copy.is_file() and not os.path.samefile(copy, data)
        np.testing.assert_array_equal(OrtModel(served, threads=1).logits(ids), want)
    assert verify_repo(repo) == [] and os.stat(data).st_nlink == 1
    onnx.load(str(src), load_external_data=True)  # refused before the fix
    cfg = MSARConfig.from_json((ckpt / "config.json").read_text())
    assert preflight(src, cfg).path == src


def test_a_manifest_that_is_not_an_object_is_not_ours(faithful, tmp_path):
    """build_serving_repo read an existing manifest.json with json.loads and called .get on it: a
    JSON list there was an AttributeError (exit 1, a traceback).  Now it is a folder msar-export
    did not write: one line, the folder left as it was; the control, an object, too."""
    from msar_export.errors import OutputError
    from msar_export.serving.repository.writer import build_serving_repo

    for text in ("[1, 2]", '{"generator": "someone else"}'):
        out = tmp_path / f"repo{len(text)}"
        out.mkdir()
        (out / "manifest.json").write_text(text)
        with pytest.raises(OutputError, match="not a repository msar-export wrote"):
            build_serving_repo(faithful[1], None, out, validate=False)
        assert [p.name for p in out.iterdir()] == ["manifest.json"]


def test_disk_full_while_writing_is_one_line_and_leaves_nothing(ckpt, tmp_path, monkeypatch):
    import errno

    from msar_export.errors import OutputError
    from msar_export.export import ExportOptions, export_checkpoint

    def full(model, path, release, data_name=None):  # half a file, then the disk is full
        path.write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    import msar_export.export.save as save

    monkeypatch.setattr(save, "_write_streamed", full)
    with pytest.raises(OutputError, match="No space left on device"):
        export_checkpoint(ckpt, tmp_path / "m.onnx", ExportOptions(), validate=False)
    assert list(tmp_path.iterdir()) == []


def test_check_on_a_graph_ort_cannot_load_is_exit_2(ckpt, tmp_path):
    from msar_export.export import ExportOptions, export_checkpoint

    good = tmp_path / "good.onnx"
    export_checkpoint(ckpt, good, ExportOptions(decomposed=True), validate=False)
    proto = onnx.load(str(good))
    node = next(n for n in proto.graph.node if n.op_type == "MatMul")
    node.op_type = "NoSuchOp"  # metadata, names and weights still pass the preflight
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(proto.SerializeToString())
    r = run_main("check", ckpt, "--onnx", bad, "--no-trt")
    err = r.stderr.decode()
    errors = [ln for ln in err.splitlines() if ": error: " in ln]  # the others are progress lines
    assert r.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert len(errors) == 1 and "ONNX Runtime cannot load" in errors[0] and err.strip().endswith(errors[0])


def test_saving_a_checkpoint_never_replaces_a_foreign_directory(tmp_path):
    from msar_export.checkpoint import load_checkpoint, save_checkpoint
    from msar_export.errors import OutputError

    src, _ = make_checkpoint(tmp_path / "src", seed=2)
    model = load_checkpoint(src)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a checkpoint directory"):
        save_checkpoint(model, foreign)
    assert (foreign / "notes.txt").read_text() == "mine"
    save_checkpoint(model, src)  # a checkpoint is replaced, atomically
    assert load_checkpoint(src).cfg == model.cfg


def test_checkpoint_files_are_not_followed_out_of_the_checkpoint(ckpt, tmp_path):
    import shutil

    from msar_export.checkpoint import load_checkpoint
    from msar_export.errors import CheckpointError

    outside = tmp_path / "outside"
    shutil.copytree(ckpt, outside)
    for name in ("config.json", "model.safetensors"):
        bad = tmp_path / f"link-{name}"
        shutil.copytree(ckpt, bad)
        (bad / name).unlink()
        (bad / name).symlink_to(outside / name)  # a real, valid file: only the path rule refuses it
        with pytest.raises(CheckpointError, match="leads outside"):
            load_checkpoint(bad)
    inside = tmp_path / "inside"
    shutil.copytree(ckpt, inside)
    (inside / "model.safetensors").rename(inside / "blob")
    (inside / "model.safetensors").symlink_to("blob")  # a link within the checkpoint is fine
    os.link(inside / "config.json", tmp_path / "second-name.json")  # so is a hard link: only read
    assert load_checkpoint(inside).cfg.d_model == load_checkpoint(ckpt).cfg.d_model
