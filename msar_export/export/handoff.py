"""Validation of a large export in a separate, torch-free process image.

After trace + save the exporting process still holds ~550 MiB that no del can
give back at 318 M parameters (the onnx / onnxruntime / onnxscript / torch.onnx
modules, and what torch.export leaves behind), and ONNX Runtime then needed about
1.5x the weights to load and run the file (1.2x without constant folding): 1.72-1.78x
of the checkpoint for the whole run, over issue 12's 1.5x.  So an export of a
checkpoint over APART_ABOVE computes the eager reference before tracing
(export/reference.py, streamed from the checkpoint), saves it with the report
(`write_state`, a few MB), and ONNX Runtime runs in a fresh image that imports
neither torch nor the exporter (`validate_state`).  Its session (low_memory) reads
external data from the mapped file: at 128 M parameters (a 512 MB data file) 67 MiB
of anonymous memory after the run, the weights only as file pages, which the kernel
can drop (measured 2026-12-02).

`exporter.export_checkpoint` decides, for every caller.  The image is a child it
waits for (`validate_in_child`: the library, `serve`), or, for the CLI, whose
process exists for this one export, the process itself replaced
(`exec_validation`: same process id, same stdout/stderr, one image at any time, so
its RSS is the run's).  Small checkpoints validate in-process: the exec'd
interpreter cost ~3 s more on a 2-block model (11.4 vs 7.6 s), which the test
suite's many small exports should not pay.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import MsarError
from ..memory import MMAP_THRESHOLD
from ..untrusted import loads_json
from .report import ExportOptions, ExportReport, peak_rss_mb, rss_mb

# Checkpoint bytes above which the ORT run happens apart; the environment variable
# lets a test take this path with a tiny model.
APART_ABOVE = 256 * 2**20
APART_ENV = "MSAR_EXPORT_VALIDATE_APART_ABOVE"


def validates_apart(checkpoint: str | os.PathLike) -> bool:
    limit = int(os.environ.get(APART_ENV, APART_ABOVE))
    p = Path(checkpoint)
    try:
        files = [p] if p.is_file() else [f for f in p.iterdir() if f.is_file()]
        return sum(f.stat().st_size for f in files) > limit
    except OSError:
        return False  # the loader reports an unreadable checkpoint, as one line


def validation_env() -> dict:
    """glibc serves buffers of 1 MiB and more with their own mappings, returned when
    freed: ONNX Runtime loading a float16 file converts its weights to float32 and
    drops the float16 ones, and with glibc's default (a threshold that rises to 32 MB)
    the freed heap stayed resident: peak 1870-2180 MiB over runs for the 318 M model's
    float16 file, 1782 MiB every run with this.  The caller's own setting wins."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), **os.environ}


def write_state(report: ExportReport) -> Path:
    """The report and its reference, in a folder the validating process removes."""
    tmp = Path(tempfile.mkdtemp(prefix="msar-validate-"))
    state = dataclasses.asdict(dataclasses.replace(report, validation=None, reference=None))
    state.update(path=str(report.path), options=dataclasses.asdict(report.options),
                 peak_rss_validated_mb=report.peak_rss_mb, reference=None)
    if report.reference is not None:
        report.reference.save(tmp / "reference.npz")
        state["reference"] = str(tmp / "reference.npz")
    (tmp / "state.json").write_text(json.dumps(state))
    return tmp / "state.json"


def validate_state(state_path: Path) -> ExportReport:
    """The validating image's job: the report written by `write_state`, validated; its
    folder removed."""
    from .validate import Reference, validate_file

    try:
        state = loads_json(Path(state_path).read_text(), f"{state_path}")
        ref = None if state["reference"] is None else Reference.load(Path(state["reference"]))
    finally:
        shutil.rmtree(Path(state_path).parent, ignore_errors=True)
    state.update(path=Path(state["path"]), options=ExportOptions(**state["options"]))
    report = ExportReport(**state)
    report.validation = validate_file(report.path, ref, report.options.decode, report.options.dtype)
    # This image's peak, or the exporting image's (its peak before the handoff, carried in the state).
    report.peak_rss_validated_mb = max(report.peak_rss_validated_mb, peak_rss_mb())
    return report


def exec_validation(report: ExportReport, module: str) -> None:
    """Replace this process by `python -m module STATE`, which validates (`validate_state`)
    and reports; does not return."""
    state = write_state(report)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, str(state)], validation_env())


def validate_in_child(report: ExportReport) -> ExportReport:
    """`report` validated by a child image this process waits for; the run's peak is this
    process's RSS now plus the child's peak, when that is over this process's own peak."""
    from .validate import ValidationResult
    from ..verdict import Verdict

    fd, result = tempfile.mkstemp(prefix="msar-validated-", suffix=".json")
    os.close(fd)
    try:
        here = rss_mb()
        done = subprocess.run([sys.executable, "-m", __name__, str(write_state(report)), result],
                              env=validation_env())
        text = Path(result).read_text()
    finally:
        Path(result).unlink(missing_ok=True)
    if done.returncode != 0 or not text:
        raise RuntimeError(f"the process validating {report.path} failed (exit status {done.returncode})")
    out = loads_json(text, "the validating process's result")
    if "error" in out:
        raise MsarError(out["error"])
    v = out["validation"]
    verdict = v.pop("verdict")
    report.validation = ValidationResult(**v, verdict=None if verdict is None else Verdict(
        float(verdict["error"]), float(verdict["eager_error"]), verdict["precision"]))
    report.peak_rss_validated_mb = max(report.peak_rss_mb, here + out["peak_rss_mb"])
    return report


def _child(state: Path, result: Path) -> None:
    """Validate `state`; write the validation (floats as text: NaN and Inf are not JSON) or
    the one-line error to `result`."""
    try:
        validation = dataclasses.asdict(validate_state(state).validation)
    except MsarError as e:
        result.write_text(json.dumps({"error": str(e)}))
        return
    if validation["verdict"] is not None:
        validation["verdict"] = {k: repr(v) if isinstance(v, float) else v for k, v in validation["verdict"].items()}
    result.write_text(json.dumps({"validation": validation, "peak_rss_mb": peak_rss_mb()}))


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]))
