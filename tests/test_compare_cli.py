"""`msar-export check` from the command line: the report folder and its Polygraphy
command (which must pass and fail with the check), and bad input as one line, exit 2."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from conftest import REPO, make_checkpoint
from msar_export.cli import main
from msar_export.compare.parity import REFERENCE

PYTHON = sys.executable
POLYGRAPHY = str(Path(sys.executable).parent / "polygraphy")
D = 40  # d_model of conftest.ODD


from compare_fixtures import faulted, scale_tap  # noqa: E402  (the `faithful` fixture: conftest.py)


# -- command line, report, golden files ----------------------------------------------------

def test_report_dir_holds_json_png_and_golden_files_and_the_polygraphy_command_works(faithful, tmp_path, capsys):
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    ckpt, onnx_path, _ = faithful
    rep = tmp_path / "report"
    assert main(["check", str(ckpt), "--onnx", str(onnx_path), "--report", str(rep)]) == 0
    out = capsys.readouterr().out
    assert "RESULT: PASS" in out and "polygraphy run" in out
    assert sorted(p.name for p in rep.iterdir()) == ["golden.json", "inputs.json", "parity.json", "parity.png",
                                                       "summary.txt"]
    assert (rep / "parity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((rep / "parity.json").read_text())
    assert report["passed"] and report["exit_code"] == 0
    assert report["backends"][0]["name"] == "onnxrt" and report["backends"][0]["first_bad_layer"] is None
    feeds = load_json(str(rep / "inputs.json"))
    golden = RunResults.load(str(rep / "golden.json"))
    assert len(feeds) == 3 and list(golden.keys()) == [REFERENCE] and len(golden[REFERENCE]) == 3
    assert set(golden[REFERENCE][0].keys()) == set(report["layers"])

    cmd = shlex.split(report["polygraphy_command"])
    assert cmd[0] == "polygraphy"
    run = subprocess.run([POLYGRAPHY, *cmd[1:]], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "PASSED" in run.stdout


FULL_NUMBER = re.compile(r"-|-?\d\.\d\de[+-]\d\d")  # how the table prints a number ("-": none)


def table_numbers(text: str) -> list[list[str]]:
    """The four number cells (max abs, error, eager error, tolerance) of each row of the parity table."""
    rows = [[c.strip() for c in line.strip().strip("│").split("│")] for line in text.splitlines()
            if line.startswith("│")]
    return [r[2:6] for r in rows]


def test_failing_report_and_its_polygraphy_command_fail_too(faithful, tmp_path, capsys):
    """Also: stdout to a file (a CI log, `| tee`) carries the whole table, every number whole (rich
    cut them to `5.63e-…` off a terminal), and nothing but the report: progress and --verbose's
    Polygraphy log go to stderr."""
    ckpt, onnx_path, _ = faithful
    bad = faulted(ckpt, tmp_path / "bad", scale_tap(2, 1, 1))
    rep, log = tmp_path / "report", tmp_path / "stdout.log"
    with open(log, "w", encoding="utf-8") as f, contextlib.redirect_stdout(f):
        rc = main(["check", str(bad), "--onnx", str(onnx_path), "--report", str(rep), "--no-trt", "--verbose"])
    out, err = log.read_text(encoding="utf-8"), capsys.readouterr().err
    assert rc == 1
    assert "first bad layer h_3 (hidden.3)" in out and "RESULT: FAIL" in out
    report = json.loads((rep / "parity.json").read_text())
    cells = table_numbers(out)
    assert len(cells) == len(report["layers"]) + 1, out  # onnxrt's layers and the skipped TensorRT's row
    assert all(FULL_NUMBER.fullmatch(c) for row in cells for c in row), out
    assert sum(c != "-" for row in cells for c in row) == 4 * len(report["layers"]), out
    assert not FULL_NUMBER.fullmatch("5.63e-…") and "…" not in out  # control: a cut number is caught
    assert (rep / "summary.txt").read_text(encoding="utf-8") in out  # the saved summary is the same, whole
    assert "msar-export check: eager-torch" in err and "[I]" in err  # progress and Polygraphy's log ...
    assert "msar-export check:" not in out and "[I]" not in out  # ... are not in the report
    assert report["format_version"] == 2
    assert report["backends"][0]["first_bad_layer"] == {"name": "hidden.3", "layer": 3}
    assert report["backends"][1] == {**report["backends"][1], "status": "skipped", "reason": "--no-trt"}
    run = subprocess.run([POLYGRAPHY, *shlex.split(report["polygraphy_command"])[1:]], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode != 0 and "FAILED" in run.stdout + run.stderr


def run_cli(*args):
    return subprocess.run([PYTHON, "-m", "msar_export.cli", "check", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def assert_one_line_error(rc, err, *needles):
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("msar-export check: error:"), err
    for n in needles:
        assert n in lines[0], lines[0]


def test_bad_input_exits_2_with_one_line_subprocess(faithful, tmp_path):
    ckpt, onnx_path, _ = faithful
    p = run_cli(ckpt, "--onnx", tmp_path / "nope.onnx")
    assert_one_line_error(p.returncode, p.stderr, "no such file")
    other, _ = make_checkpoint(tmp_path / "wide", seed=1, d_model=50)
    p = run_cli(other, "--onnx", onnx_path)
    assert_one_line_error(p.returncode, p.stderr, "different model", "d_model")


def _edited_graph(onnx_path, dst, **config_changes):
    proto = onnx.load(str(onnx_path))
    for prop in proto.metadata_props:
        if prop.key == "msar.config":
            prop.value = json.dumps({**json.loads(prop.value), **config_changes})
    onnx.save(proto, str(dst))
    return dst


@pytest.mark.parametrize("case", ["missing-checkpoint", "not-onnx", "empty-file", "no-msar-metadata",
                                  "vocab-mismatch", "decode-graph", "missing-engine", "missing-plugin",
                                  "short-shapes", "dtype-an-engine-built-here-cannot-run"])
def test_bad_input_exits_2_with_one_line(case, faithful, tmp_path, capsys):
    ckpt, onnx_path, cfg = faithful
    args = [str(ckpt), "--onnx", str(onnx_path), "--no-trt"]
    if case == "missing-checkpoint":
        args[0] = str(tmp_path / "no-ckpt")
    elif case == "not-onnx":
        (tmp_path / "x.onnx").write_text("this is not a model\n")
        args[2] = str(tmp_path / "x.onnx")
    elif case == "empty-file":
        (tmp_path / "x.onnx").write_bytes(b"")
        args[2] = str(tmp_path / "x.onnx")
    elif case == "no-msar-metadata":
        proto = onnx.load(str(onnx_path))
        del proto.metadata_props[:]
        onnx.save(proto, str(tmp_path / "x.onnx"))
        args[2] = str(tmp_path / "x.onnx")
    elif case == "vocab-mismatch":
        # metadata claims vocab 67 like the checkpoint, but the graph's weights say 61
        args[0] = str(make_checkpoint(tmp_path / "v67", seed=1, vocab_size=67)[0])
        args[2] = str(_edited_graph(onnx_path, tmp_path / "x.onnx", vocab_size=67))
    elif case == "decode-graph":
        proto = onnx.load(str(onnx_path))
        for prop in proto.metadata_props:
            if prop.key == "msar.graph":
                prop.value = "decode"
        onnx.save(proto, str(tmp_path / "x.onnx"))
        args[2] = str(tmp_path / "x.onnx")
    elif case == "missing-engine":
        args = args[:3] + ["--engine", str(tmp_path / "model.plan")]
    elif case == "missing-plugin":
        args += ["--plugins", str(tmp_path / "libmsar.so")]
    elif case == "short-shapes":
        args += ["--shapes", "2x3"]
    elif case == "dtype-an-engine-built-here-cannot-run":  # on every machine, with or without TensorRT
        args = args[:3] + ["--dtype", "float16"]
    rc = main(["check", *args])
    err = capsys.readouterr().err
    assert_one_line_error(rc, err)


def test_engine_without_a_build_record_is_an_error_not_a_skip(faithful, tmp_path, capsys):
    """--engine is verified against its metadata before anything runs, on any machine."""
    ckpt, onnx_path, _ = faithful
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"not really an engine")
    rc = main(["check", str(ckpt), "--onnx", str(onnx_path), "--engine", str(plan)])
    assert_one_line_error(rc, capsys.readouterr().err, "has no build record")
