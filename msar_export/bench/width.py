"""`msar-export bench --width-sweep 512,1024`: issue 21's goal ratios against width, at the bench's
depth. Each width's random standard and msar models are exported as the goal rows use them (the
standard graph decomposed, msar's prefill with `--mixer-op scored`, both decode graphs), then timed
in ONNX Runtime as msar / standard: prefill 1 x T and time per decode step at each batch.

Both protocols of the bench: the in-process pairs of its goal rows (bench/paired.py: the two
sessions alternated, the median of the per-round ratios) and, with `process_rounds`, one process
per graph (bench/processes.py). Beside them the multiply-add model of the scored graph
(depth.mac_model): MSAR's mixing grows with d, the rest of the model with d squared, so the
predicted ratio falls as the model widens; the measured one shows how far the kernels follow."""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

from ..config import MSARConfig
from ..log import silent
from .depth import mac_model
from .report import write_sweep

BEGIN, END = "<!-- width-sweep:begin -->", "<!-- width-sweep:end -->"
HEAD_DIM, KV_GROUP = 64, 2  # the bench model's head width and query heads per key/value head


def widened(base: MSARConfig, d: int) -> MSARConfig:
    """The bench model at width d: heads of HEAD_DIM channels, the base's MLP ratio and depth."""
    if d <= 0 or d % (HEAD_DIM * KV_GROUP):
        raise ValueError(f"widths must be positive multiples of {HEAD_DIM * KV_GROUP}, got {d}")
    return dataclasses.replace(base, d_model=d, n_heads=d // HEAD_DIM, n_kv_heads=d // (HEAD_DIM * KV_GROUP),
                               mlp_hidden=round(base.mlp_hidden * d / base.d_model))


def plan_disk(cfgs: list[MSARConfig], folder: Path) -> int:
    """Refuse, before writing anything, a sweep the disk cannot hold: one width's four float32 files
    (two graphs of each model, each about its checkpoint's size) at a time, and 1 GiB."""
    from .bounds import checkpoint_bytes
    from .memory import require_free

    need = max(2 * sum(checkpoint_bytes(dataclasses.replace(c, residual=k)) for k in ("standard", "msar"))
               for c in cfgs) + 2**30
    return require_free(folder, need, "--width-sweep", "for its exports", "set TMPDIR to a folder with more room")


def _in_process(paths: dict, cfg: MSARConfig, T: int, batches, threads: int, repeats: int, log) -> dict:
    """msar over standard (paired_ratio's fn over its base) for the prefill and each decode batch."""
    from . import steps
    from .paired import paired_ratio

    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, T))
    log("    pair: prefill")
    out = {"prefill": paired_ratio(*(steps.ort_prefill_run(paths[(k, "prefill")], ids, threads)
                                     for k in ("msar", "standard")), 1, repeats)}
    for batch in batches:
        log(f"    pair: decode batch {batch}")
        out[f"decode_b{batch}"] = paired_ratio(*(steps.ort_decode_run(paths[(k, "decode")], batch, cfg.vocab_size, threads)
                                                 for k in ("msar", "standard")), 1, repeats)
    return out


def _processes(paths: dict, cfg: MSARConfig, T: int, batches, threads: int, rounds: int, log) -> dict:
    from . import processes

    out = processes.goal_ratios(paths, T, batches, rounds, threads, cfg.vocab_size, log)
    for name, res in out.items():
        times = res.pop("times")
        # ms per prefill or per decode step, the rounds' medians: how the step itself grows with width
        res["standard_ms"], res["msar_ms"] = (round(statistics.median(t[i] for t in times), 2) for i in (0, 1))
    return out


def run_width_sweep(widths=(512, 1024), base: MSARConfig | None = None, T: int = 512, batches=(1, 8),
                    threads: int = 2, repeats: int = 7, process_rounds: int | None = None, log=None) -> dict:
    """process_rounds: rounds of one process per graph (None: the bench's, BenchSettings; 0: none)."""
    from ..runners.ort_runner import resolve_ort_ops
    from .memory import terminated_as_exit
    from .run import BenchSettings
    from .timing import machine_description

    log = log or silent
    base = base or BenchSettings().model
    process_rounds = BenchSettings().process_rounds if process_rounds is None else process_rounds
    cfgs = [widened(base, d) for d in widths]  # every width checked before the first export
    plan_disk(cfgs, Path(tempfile.gettempdir()))
    native = resolve_ort_ops(None) is not None  # what every session here registers (MSAR_ORT_OPS too)
    rows = []
    with terminated_as_exit():  # a terminated sweep still removes its exports
        for cfg in cfgs:
            rows.append(_width_row(cfg, T, batches, threads, repeats, process_rounds, log))
    return {"machine": machine_description(threads), "n_blocks": base.n_blocks, "tokens": T, "batches": list(batches),
            "stream_kernels": list(base.stream_kernels), "native": native, "repeats": repeats,
            "process_rounds": process_rounds, "rows": rows}


def _width_row(cfg: MSARConfig, T: int, batches, threads: int, repeats: int, process_rounds: int, log) -> dict:
    """One width: the goal rows' graphs exported (msar's prefill scored), then timed both ways."""
    from ..export import ExportOptions
    from .models import export_random

    log(f"  d_model {cfg.d_model}: exporting")
    with tempfile.TemporaryDirectory(prefix="msar-width-") as tmp:
        paths = export_random(cfg, {("standard", "prefill"): ExportOptions(decomposed=True),
                                    ("standard", "decode"): ExportOptions(decomposed=True, decode=True),
                                    ("msar", "prefill"): ExportOptions(mixer_op="scored"),
                                    ("msar", "decode"): ExportOptions(decode=True)}, tmp)
        row = {"d_model": cfg.d_model, "predicted_prefill": mac_model(cfg, T)["predicted_ratio_scored"],
               "pairs": _in_process(paths, cfg, T, batches, threads, repeats, log)}
        if process_rounds:
            row["processes"] = _processes(paths, cfg, T, batches, threads, process_rounds, log)
    log(f"  d_model {cfg.d_model}: " + json.dumps(row))
    return row


def _ratio(r: dict | None) -> str:
    return "-" if r is None else f"{r['median']} ({r['min']}-{r['max']})"


def width_table(res: dict) -> str:
    m = res["machine"]
    keys = ["prefill", *(f"decode_b{b}" for b in res["batches"])]
    names = [f"prefill 1x{res['tokens']} (scored)", *(f"decode batch {b}" for b in res["batches"])]
    lines = [f"Measured {m['date']} on {m['cpu']} ({m['threads']} threads), onnxruntime {m['onnxruntime']}; random "
             f"models, {res['n_blocks']} blocks, kernels {res['stream_kernels']}, msar "
             + ("native kernels" if res["native"] else "function bodies (no native kernels)")
             + f"; msar / standard time. Pairs: the two sessions alternated in one process, the median of "
             f"{res['repeats']} per-round ratios (their spread); one process each: every graph in a process of its "
             f"own, {res['process_rounds']} round{'' if res['process_rounds'] == 1 else 's'}. Predicted: the scored prefill's multiply-add model.", "",
             "| d_model | " + " | ".join(f"{n}: pairs | {n}: one process each" for n in names)
             + " | predicted prefill | standard ms: prefill / per step (one process each) |",
             "| --- | " + " | ".join("--- | ---" for _ in names) + " | --- | --- |"]
    for r in res["rows"]:
        procs = r.get("processes", {})
        cells = " | ".join(f"{_ratio(r['pairs'].get(k))} | {_ratio(procs.get(k))}" for k in keys)
        ms = " / ".join(str(procs[k]["standard_ms"]) for k in keys) if procs else "-"
        lines.append(f"| {r['d_model']} | {cells} | {r['predicted_prefill']} | {ms} |")
    return "\n".join(lines)


def write_width_sweep(res: dict, out: Path, readme: Path | None = None) -> None:
    write_sweep(res, out / "width_sweep.json", readme, BEGIN, END, width_table(res))
