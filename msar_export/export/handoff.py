"""Validation of a large export in a fresh process image, after the exporting one is gone.

After trace + save the exporting process still holds ~550 MiB that no del can
give back at 318 M parameters (the onnx / onnxruntime / onnxscript / torch.onnx
modules, and what torch.export leaves behind), and ONNX Runtime then needed about
1.5x the weights to load and run the file (1.2x without constant folding): 1.72-1.78x
of the checkpoint for the whole run, over issue 12's 1.5x.  So `msar-export export` on a large checkpoint
computes the eager reference before tracing (export/reference.py, streamed from the
checkpoint), saves it (a few MB), and replaces itself (exec: same process id, same
stdout/stderr, one process at any time, so its RSS is the run's) with `python -m
msar_export.export.handoff STATE`, which imports neither torch nor the exporter,
runs validate.validate_file, prints the report and exits as the CLI would.  Its ORT
session (low_memory) reads external data from the mapped file: at 128 M parameters
(a 512 MB data file) 67 MiB of anonymous memory after the run, the weights only as
file pages, which the kernel can drop (measured 2026-12-02).
Small checkpoints validate in-process: the exec'd interpreter cost ~3 s more on
a 2-block model (11.4 vs 7.6 s), which the test suite's many small exports
should not pay.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..memory import MMAP_THRESHOLD
from .report import ExportOptions, ExportReport, peak_rss_mb

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


def exec_validation(report: ExportReport) -> None:
    """Replace this process by the validating one; does not return."""
    state = write_state(report)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, validation_command(state), validation_env())


def validation_env() -> dict:
    """glibc serves buffers of 1 MiB and more with their own mappings, returned when
    freed: ONNX Runtime loading a float16 file converts its weights to float32 and
    drops the float16 ones, and with glibc's default (a threshold that rises to 32 MB)
    the freed heap stayed resident: peak 1870-2180 MiB over runs for the 318 M model's
    float16 file, 1782 MiB every run with this.  The caller's own setting wins."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), **os.environ}


def validation_command(state: Path) -> list[str]:
    return [sys.executable, "-m", "msar_export.export.handoff", str(state)]


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


def _validate(state_path: Path) -> int:
    from .validate import Reference, validate_file

    try:
        state = json.loads(state_path.read_text())
        ref = None if state["reference"] is None else Reference.load(Path(state["reference"]))
    finally:
        shutil.rmtree(state_path.parent, ignore_errors=True)
    state.update(path=Path(state["path"]), options=ExportOptions(**state["options"]))
    report = ExportReport(**state)
    report.validation = validate_file(report.path, ref, report.options.decode, report.options.dtype)
    # This image's peak, or the exporting image's (its peak before exec, carried in the state).
    report.peak_rss_validated_mb = max(report.peak_rss_validated_mb, peak_rss_mb())
    return print_report(report)


def print_report(report: ExportReport) -> int:
    """`msar-export export`'s output and exit status: 1, with one line, when validation failed."""
    print(report.summary())
    if report.validation is not None and not report.validation.passed:
        print(f"msar-export export: validation failed ({'; '.join(report.validation.failures)}); "
              f"{report.path} was written and kept", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import argparse

    from ..cli_common import run_command

    sys.exit(run_command(argparse.Namespace(command="export", func=lambda a: _validate(Path(sys.argv[1])))))
