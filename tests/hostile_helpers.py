"""Helpers of the hostile-input tests (test_hostile.py, test_hostile_bundles.py): the CLI
in a child process or in this one, its one-line exit-2 contract, a file tree's snapshot,
and a tiny ONNX graph (Y = X + W, W as external data) whose data location each case crafts."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "msar_export.cli"]
W = np.arange(4, dtype=np.float32) + 0.5


def run_cli(*args, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(os.fsdecode, args)], cwd=REPO, capture_output=True, timeout=timeout, **kw)


def run_main(*args, text: bool = False) -> subprocess.CompletedProcess:
    """`msar-export ARGS` through the CLI's main in this process, with run_cli's result: for
    tests of what a command decides, where a child's interpreter and torch import (2-3 s a
    call) buy nothing.  File descriptors 1 and 2 are captured too, so what native code prints
    counts against the one-line rule as in a child.  The process boundary itself (exit
    status, argv bytes, a hang cut by a timeout, a crash) stays with run_cli: each command
    keeps such tests."""
    from msar_export.cli import main
    from msar_export.export.handoff import APART_ENV

    assert APART_ENV not in os.environ, "validation apart execs a new image: use run_cli"
    argv = [os.fsdecode(a) for a in args]
    env = dict(os.environ)  # --ort-ops sets MSAR_ORT_OPS for the rest of the process
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    streams = [open(f.fileno(), "w", encoding="utf-8", errors="backslashreplace", closefd=False) for f in files]
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(files[0].fileno(), 1)
        os.dup2(files[1].fileno(), 2)
        with contextlib.chdir(REPO), contextlib.redirect_stdout(streams[0]), contextlib.redirect_stderr(streams[1]):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        for fd, stream, old in zip((1, 2), streams, saved):
            stream.close()
            os.dup2(old, fd)
            os.close(old)
        os.environ.clear()
        os.environ.update(env)
    out = []
    for f in files:
        f.seek(0)
        data = f.read()
        f.close()
        out.append(data.decode(errors="replace") if text else data)
    return subprocess.CompletedProcess([*CLI, *argv], code, *out)


def one_line_exit_2(r: subprocess.CompletedProcess) -> str:
    out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    assert r.returncode == 2, (r.returncode, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], err
    assert "Traceback" not in out + err
    return lines[0]


def tree(root: Path) -> dict[str, bytes | str]:
    """Every path under root with its content (or link target): to prove nothing changed."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = "dir"
    return out


def tiny_model(folder: Path, location: str, payload: Path | None = None, name: str = "m.onnx") -> Path:
    """`folder/name` computing Y = X + W with W's 16 bytes at `location` (as written in the file);
    the payload file is written at `payload` (default: folder/location) unless it exists."""
    folder.mkdir(parents=True, exist_ok=True)
    w = numpy_helper.from_array(W, "W")
    set_external_data(w, location=location, offset=0, length=W.nbytes)
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    graph = helper.make_graph([helper.make_node("Add", ["X", "W"], ["Y"])], "tiny",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    path = folder / name
    path.write_bytes(model.SerializeToString())
    payload = payload if payload is not None else folder / location
    if not os.path.lexists(payload) and not os.path.isabs(location):
        payload.parent.mkdir(parents=True, exist_ok=True)
        payload.write_bytes(W.tobytes())
    return path


def run_tiny(path: Path) -> np.ndarray:
    import onnxruntime as ort

    x = np.ones((2, 4), np.float32)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0] - x


# -- 1, 2: triton-repo never reads or writes outside the model's folder and the repository ---------
