"""Issue 22, section 2: every command checks its whole output set before any work (type,
identity against every input, writability, name length), writes temporaries and renames them
together; a failure leaves every file the user gave exactly as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import make_checkpoint
from hostile_helpers import one_line_exit_2, run_cli, run_main, tiny_model, tree


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("outputs") / "ckpt", seed=2, n_blocks=1)[0]


def test_check_outputs_is_one_rule(tmp_path):
    from msar_export.errors import OutputError
    from msar_export.fileio import check_outputs

    src = tmp_path / "in.onnx"
    src.write_bytes(b"model")
    os.link(src, tmp_path / "hard.onnx")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    cases = {
        "input itself": ([src], [src]),
        "a hard link to the input": ([tmp_path / "hard.onnx"], [src]),
        "a file inside an input directory": ([tmp_path / "dir" / "x"], [tmp_path / "dir"]),
        "two outputs, one path": ([tmp_path / "a", tmp_path / "a"], []),
        "a FIFO": ([tmp_path / "out", tmp_path / "fifo"], []),
        "a directory": ([tmp_path / "dir"], []),
        "a name over NAME_MAX": ([tmp_path / ("n" * 256)], []),
    }
    (tmp_path / "dir" / "x").write_bytes(b"theirs")
    for what, (outs, ins) in cases.items():
        with pytest.raises(OutputError):
            check_outputs(outs, ins)
            pytest.fail(what)
    # controls: new files, an existing regular file, a legal 250-byte name
    assert check_outputs([tmp_path / "new", src.with_name("other"), tmp_path / ("n" * 250)], [src])


def test_a_250_byte_name_is_written_not_refused_after_the_work(tmp_path):
    from msar_export.fileio import atomic_paths, atomic_write_text

    target = tmp_path / ("m" * 245 + ".onnx")
    atomic_write_text(target, "x")  # before: the temp name (14 bytes longer) failed after the work
    assert target.read_text() == "x"
    with atomic_paths([tmp_path / ("a" * 250), tmp_path / "b"]) as (ta, tb):
        ta.write_text("1")
        tb.write_text("2")
    assert (tmp_path / ("a" * 250)).read_text() == "1" and (tmp_path / "b").read_text() == "2"


def test_a_failed_rename_puts_every_old_file_back(tmp_path, monkeypatch):
    from msar_export import fileio
    from msar_export.errors import OutputError

    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("old a")
    b.write_text("old b")
    real = os.replace
    calls = []

    def failing(src, dst):
        calls.append(dst)
        if Path(dst) == b:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(fileio.os, "replace", failing)
    with pytest.raises(OutputError):
        with fileio.atomic_paths([a, b]) as (ta, tb):
            ta.write_text("new a")
            tb.write_text("new b")
    assert a.read_text() == "old a" and b.read_text() == "old b"  # a was renamed, then restored
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_export_into_its_own_checkpoint_is_refused(ckpt, tmp_path):
    import shutil

    c = tmp_path / "c"
    shutil.copytree(ckpt, c)
    before = tree(c)
    line = one_line_exit_2(run_main("export", c, "-o", c / "model.safetensors", "--no-validate"))
    assert "input" in line and tree(c) == before  # before: the checkpoint's weights became an ONNX file


def test_onnx_reference_save_onto_the_model_is_refused(tmp_path):
    model = tiny_model(tmp_path / "m", "w.bin")
    before = tree(tmp_path / "m")
    for target in (model, tmp_path / "m" / "w.bin"):
        line = one_line_exit_2(run_main("onnx", "reference", model, "--save", target))
        assert "input" in line, line
    line = one_line_exit_2(run_main("onnx", "sanitize", model, "-o", model))
    assert "input" in line
    assert tree(tmp_path / "m") == before


def test_build_outputs_checked_before_anything_is_written(tmp_path, monkeypatch, capsys):
    import sys

    from msar_export import cli

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # every case must be refused before TensorRT
    model = tiny_model(tmp_path / "m", "w.bin")
    plan = tmp_path / "e.plan"
    plan.write_bytes(b"old plan")
    (tmp_path / "e.plan.json").write_text("old metadata")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir.plan.json").mkdir()
    before = tree(tmp_path)
    cases = [(["-o", plan, "--timing-cache", model], "input"),        # before: replaced the model, exit 0
             (["-o", plan, "--timing-cache", plan], "two outputs"),   # before: the engine was the cache
             (["-o", plan, "--timing-cache", tmp_path / "fifo"], "not a regular file"),
             (["-o", tmp_path / "dir.plan"], "directory"),            # before: a plan without metadata
             (["-o", tmp_path / "m" / "w.bin"], "input")]
    for args, want in cases:
        assert cli.main(["build", str(model), *map(str, args)]) == 2
        err = capsys.readouterr().err
        assert want in err and err.count("\n") == 1, (args, err)
    assert tree(tmp_path) == before


def test_check_report_is_one_output_set(ckpt, tmp_path):
    onnx_path = tmp_path / "m.onnx"
    report = tmp_path / "report"
    report.mkdir()
    (report / "summary.txt").mkdir()  # the fifth file cannot be written
    for n in ("parity.json", "inputs.json"):
        (report / n).write_text("old")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    onnx_path.write_bytes(b"x")  # never read: the report is refused first
    before = tree(tmp_path)
    line = one_line_exit_2(run_main("check", ckpt, "--onnx", onnx_path, "--report", report, "--no-trt"))
    assert "summary.txt" in line  # before: four files rewritten, then the fifth failed
    line = one_line_exit_2(run_main("check", ckpt, "--onnx", onnx_path, "--report", tmp_path / "link", "--no-trt"))
    assert "symbolic link" in line  # before: followed into another directory
    line = one_line_exit_2(run_main("check", ckpt, "--onnx", onnx_path, "--report", ckpt, "--no-trt"))
    assert tree(tmp_path) == before and not any(elsewhere.iterdir())


def test_triton_repo_keeps_models_a_user_added(tmp_path):  # the refusal in a child process (exit codes)
    model = tiny_model(tmp_path / "m", "w.bin")
    repo = tmp_path / "repo"
    r = run_main("triton-repo", model, "-o", repo, "--no-validate")
    assert r.returncode == 0, r.stderr.decode()
    added = repo / "mine" / "1" / "model.onnx"
    added.parent.mkdir(parents=True)
    added.write_bytes(b"a model the user put here")
    before = tree(repo)
    line = one_line_exit_2(run_cli("triton-repo", model, "-o", repo, "--no-validate"))
    assert "mine/1/model.onnx" in line and tree(repo) == before  # before: deleted with the old repository
    added.unlink()  # control: with nothing foreign, the repository is ours to replace
    assert run_main("triton-repo", model, "-o", repo, "--no-validate").returncode == 0
