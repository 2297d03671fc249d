"""The parity report: a terminal table, JSON, a PNG of error per layer, and golden
files in Polygraphy's own formats with the `polygraphy run` command that
re-checks the ONNX graph by hand.  Every file is written atomically."""

from __future__ import annotations

import io
import json
import math
import os
import shlex
from pathlib import Path

from ..fileio import atomic_paths, check_outputs
from ..graph_spec import LOGITS
from ..graph_spec import hidden_index
from ..runners.common import quiet_polygraphy
from .result import REFERENCE, ParityResult, reference_scales, suspect

JSON_NAME = "parity.json"
PLOT_NAME = "parity.png"
INPUTS_NAME = "inputs.json"
GOLDEN_NAME = "golden.json"
SUMMARY_NAME = "summary.txt"
FORMAT_VERSION = 2  # 2: per layer "max_elementwise_rel" (was "max_rel")
# Width of the report anywhere but a terminal (a log file, a pipe, `| tee`): wide enough
# that rich never cuts a number to "5.63e-…" (a table is as wide as its widest row).
UNCUT = 10_000
NUMBER_WIDTH = len("1.23e-05")  # every number in the table is >= 0


def label(name: str) -> str:
    return LOGITS if name == LOGITS else f"h_{hidden_index(name)}"


def _e(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def _num(x):
    return None if x is None or not math.isfinite(x) else x


# -- terminal ----------------------------------------------------------------------------

def render_table(result: ParityResult):
    from rich.table import Table

    t = Table(title=f"parity vs {REFERENCE}: error = max|diff| / max|reference| per output; "
                    "tolerance = verdict bound from the eager model's own error at the backend's precision")
    # parity.json also has each output's max elementwise relative error (information only).
    for col, just in [("backend", "left"), ("layer", "left"), ("max abs", "right"), ("error", "right"),
                      ("eager error", "right"), ("tolerance", "right"), ("verdict", "left")]:
        # Numbers are never cut: they keep their width on an 80-column terminal (the text
        # columns wrap), and console_for prints anywhere else at the table's full width.
        numeric = just == "right"
        t.add_column(col, justify=just, overflow="fold", min_width=NUMBER_WIDTH if numeric else None)
    for b in result.backends:
        if not b.layers:
            t.add_row(b.name, "-", "-", "-", "-", "-", b.status.upper() + " (see below)")
            t.add_section()
            continue
        first = b.first_bad
        for lr in b.layers:
            verdict = {"pass": "ok", "fail": "FAIL", "missing": "not compared"}[lr.status]
            if lr is first:
                verdict += " <- first"
            if lr.status == "fail" and not lr.finite:
                verdict += " (NaN/Inf)"
            t.add_row(b.name, label(lr.name), _e(lr.max_abs), _e(lr.error), _e(lr.eager_error),
                      _e(lr.tolerance), verdict)
        t.add_section()
    return t


def summary_lines(result: ParityResult) -> list[str]:
    lines = [f"checkpoint {result.checkpoint}  vs  onnx {result.onnx}"
             + (f"  and engine {result.engine}" if result.engine else ""),
             f"inputs: {len(result.shapes)} token batches {['%dx%d' % s for s in result.shapes]}, seed {result.seed}"]
    for b in result.backends:
        head = "TensorRT" if b.name == "tensorrt" else b.name
        if b.status == "skipped":
            lines.append(f"{head}: skipped ({b.reason})")
            continue
        tol = (f"{b.precision}, tolerance up to {max(b.tolerance.hidden, b.tolerance.logits):.2e} "
               f"({b.tolerance.source})") if b.tolerance else ""
        if b.status == "error":
            lines.append(f"{head}: FAIL ({tol}): the backend did not run: {b.reason}")
            continue
        if b.passed:
            lines.append(f"{head}: PASS ({tol})" + (f"; {b.reason}" if b.reason else ""))
            continue
        bad = b.first_bad
        if bad is None:
            lines.append(f"{head}: FAIL ({tol}): {b.reason}")
            continue
        lines.append(f"{head}: FAIL ({tol}): first bad layer {label(bad.name)} ({bad.name}): {bad.reason}")
        lines.append(f"  suspect {suspect(bad.name)}")
    lines.append("RESULT: " + ("PASS" if result.passed else "FAIL") + f" (exit {result.exit_code})")
    return lines


def console_for(file=None):
    """The rich Console the report prints on: a terminal's own width; anywhere else wide
    enough that every number is whole (UNCUT). file: default stdout."""
    from rich.console import Console

    console = Console(file=file)
    if not console.is_terminal:
        console = Console(file=file, width=UNCUT)
    return console


def print_report(result: ParityResult, console, polygraphy_cmd: str | None = None) -> None:
    """The table and the verdicts, on `console` (console_for()); `polygraphy_cmd`:
    write_report's reproduction command."""
    console.print(render_table(result))
    for line in summary_lines(result):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if polygraphy_cmd:
        console.print("Reproduce the ONNX check by hand:", highlight=False, markup=False)
        console.print("  " + polygraphy_cmd, highlight=False, markup=False, soft_wrap=True)
    else:
        console.print("(pass --report DIR to save golden files and a `polygraphy run` command that reproduces "
                      "the ONNX check)", highlight=False, markup=False, soft_wrap=True)


# -- JSON --------------------------------------------------------------------------------

def to_json_dict(result: ParityResult, polygraphy_cmd: str | None = None) -> dict:
    def layer(lr):
        return {"name": lr.name, "layer": lr.layer, "status": lr.status, "max_abs": _num(lr.max_abs),
                "max_elementwise_rel": _num(lr.max_elementwise_rel), "error": _num(lr.error), "eager_error": _num(lr.eager_error),
                "tolerance": lr.tolerance,
                "reference_max_abs": _num(lr.ref_max_abs), "finite": lr.finite, "reason": lr.reason}

    def backend(b):
        bad = b.first_bad
        return {"name": b.name, "status": b.status, "precision": b.precision,
                "tolerance": b.tolerance.to_dict() if b.tolerance else None, "reason": b.reason,
                "seconds": round(b.seconds, 3),
                "first_bad_layer": None if bad is None else {"name": bad.name, "layer": bad.layer},
                "layers": [layer(lr) for lr in b.layers]}

    return {
        "format_version": FORMAT_VERSION,
        "passed": result.passed,
        "exit_code": result.exit_code,
        "checkpoint": result.checkpoint,
        "onnx": result.onnx,
        "engine": result.engine,
        "reference": {"runner": REFERENCE, "precision": "float64"},
        "metric": "max |backend - reference| / max |reference| per output over all batches; NaN/Inf fail",
        "inputs": {"shapes": [list(s) for s in result.shapes], "seed": result.seed, "file": INPUTS_NAME},
        "golden": GOLDEN_NAME,
        "layers": result.layer_names,
        "backends": [backend(b) for b in result.backends],
        "polygraphy_command": polygraphy_cmd,
        "summary": summary_lines(result),
    }


# -- plot --------------------------------------------------------------------------------

def write_plot(result: ParityResult, path: str | os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(result.layer_names)))
    floor = 1e-12
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(xs) + 2), 4.0))
    drawn = False
    for i, b in enumerate(result.backends):
        if not b.layers:
            continue
        color = f"C{i}"
        ys = [max(lr.error, floor) if lr.error is not None else float("nan") for lr in b.layers]
        ax.plot(xs, ys, marker="o", color=color, label=f"{b.name} ({b.precision})")
        bad = [(x, lr) for x, lr in zip(xs, b.layers) if lr.status == "fail"]
        if bad:
            top = max([y for y in ys if y == y] + [b.tolerance.hidden * 10])
            ax.scatter([x for x, _ in bad], [max(lr.error, floor) if lr.error is not None else top for _, lr in bad],
                       marker="x", s=90, color="red", zorder=5)
        if b.tolerance:  # the bound of each output (the verdict model's), as a step line
            ax.step(xs, [lr.tolerance for lr in b.layers], where="mid", color=color, linestyle="--", linewidth=1,
                    label=f"{b.name} tolerance")
        drawn = True
    ax.set_xticks(xs, [label(n) for n in result.layer_names])
    ax.set_yscale("log")
    ax.set_xlabel("layer (mixer output h_l, then logits)")
    ax.set_ylabel("max|diff| / max|reference|")
    firsts = [f"{b.name} {label(b.first_bad.name)}" for b in result.backends if b.first_bad is not None]
    verdict = "PASS" if result.passed else "FAIL" + (f", first bad layer: {', '.join(firsts)}" if firsts else "")
    ax.set_title(f"parity vs {REFERENCE}: {verdict}", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)  # the caller's temp file (write_report)
    plt.close(fig)


# -- golden files and the hand command ---------------------------------------------------

def polygraphy_command(result: ParityResult, inputs_path, golden_path) -> str:
    """`polygraphy run` on the ONNX graph against the golden outputs, with the same
    per-output atol (= tolerance * max|reference|), rtol 0 and the max statistic."""
    onnxrt = next(b for b in result.backends if b.name.startswith("onnxrt"))  # --ort-ops both: onnxrt-native
    ref_iters = list(result.golden[REFERENCE])
    scales = reference_scales(ref_iters, result.layer_names)
    tol = onnxrt.tolerance
    atols = [f"{n}:{tol.for_output(n) * scales[n]!r}" for n in result.layer_names]
    q = lambda p: shlex.quote(os.path.abspath(p))  # noqa: E731
    return " ".join(["polygraphy", "run", q(result.onnx), "--onnxrt", "--onnx-outputs", *result.layer_names,
                     "--load-inputs", q(inputs_path), "--load-outputs", q(golden_path),
                     "--check-error-stat", "max", "--rtol", "0", "--atol", *atols])


def report_targets(report_dir, inputs=()) -> list[Path]:
    """The report's five files, checked as one output set (fileio.check_outputs): the folder
    must be a real directory (a symlink to another folder is refused) and no file may be an
    input of the check."""
    out = Path(report_dir)
    targets = [out / n for n in (INPUTS_NAME, GOLDEN_NAME, JSON_NAME, PLOT_NAME, SUMMARY_NAME)]
    check_outputs(targets, inputs, directories=[out])
    return targets


def write_report(result: ParityResult, report_dir: str | os.PathLike, inputs=()) -> str:
    """inputs.json + golden.json (Polygraphy formats), parity.json, parity.png, summary.txt,
    written to temporaries and renamed into place together (a failure leaves the old report
    whole); returns the `polygraphy run` command that reproduces the ONNX check from them."""
    from polygraphy.json import save_json

    targets = report_targets(report_dir, inputs)
    inputs_path, golden_path = targets[0], targets[1]
    with atomic_paths(targets, inputs) as (t_inputs, t_golden, t_json, t_plot, t_summary):
        with quiet_polygraphy():
            save_json(list(result.feeds), str(t_inputs), description="parity-check input feeds")
            save_json(result.golden, str(t_golden), description=f"{REFERENCE} golden outputs")
        command = polygraphy_command(result, inputs_path, golden_path)
        t_json.write_text(json.dumps(to_json_dict(result, command), indent=2) + "\n", encoding="utf-8")
        write_plot(result, t_plot)
        buf = io.StringIO()
        print_report(result, console_for(buf), command)
        t_summary.write_text(buf.getvalue(), encoding="utf-8")
    return command
