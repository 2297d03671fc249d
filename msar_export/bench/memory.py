"""`msar-export bench --export-memory`: whole-process peak RSS of `msar-export
export` (validation included) against the checkpoint's bytes, per graph kind,
each export in its own child process.  The issue-12 goal: peak <= 1.5 x the
checkpoint + the interpreter's baseline (python importing msar_export and torch)."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

from ..config import MSARConfig
from ..errors import InputError
from ..fileio import atomic_write_text
from .probe import cli_probe, python_probe
from .report import replace_block, save_png
from .models import random_checkpoint
from .scaling import KIND_FLAGS, _reported
from .timing import machine_description

GOAL = 1.5
# (label, export flags): every graph kind, then the options that change what is held.
VARIANTS = tuple((kind, flags) for kind, flags in KIND_FLAGS.items()) + (
    ("default --external-data", ["--external-data"]), ("default --dtype float16", ["--dtype", "float16"]))
# The larger-than-memory row (issue 26): weights never resident, so validation (which loads
# the model for its float64 reference) is left out and the weights go to external data.
LARGE_VARIANTS = (("default --external-data --no-validate", ["--external-data", "--no-validate"]),)
BASELINE_CODE = ("import torch, msar_export.checkpoint, msar_export.model\n"  # what `import msar_export` loaded before it went lazy

                 "print(int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) / 1024)")


def memory_config(n_blocks: int = 24, d_model: int = 1024, vocab: int = 32000) -> MSARConfig:
    return MSARConfig(vocab_size=vocab, d_model=d_model, n_blocks=n_blocks, n_heads=d_model // 64,
                      n_kv_heads=d_model // 128, mlp_hidden=11 * d_model // 4, max_seq_len=4096, residual="msar")


def baseline_mb() -> float:
    return float(python_probe(BASELINE_CODE)["stdout"].split()[-1])


def checkpoint_bytes(cfg: MSARConfig) -> int:
    from ..checkpoint import iter_expected

    return sum(4 * math.prod(shape) for _, shape in iter_expected(cfg))


def largest_tensor_bytes(cfg: MSARConfig) -> int:
    from ..checkpoint import iter_expected

    return max(4 * math.prod(shape) for _, shape in iter_expected(cfg))


def export_bound_mib(base_mib: float, cfg: MSARConfig) -> float:
    """Issue 26's bound on the export's peak (validation excluded): the interpreter's
    baseline + 1 GiB + the largest single tensor (float32), whatever the checkpoint's size."""
    return base_mib + 1024 + largest_tensor_bytes(cfg) / 2**20


def plan_disk(cfg: MSARConfig, work: Path | None) -> int:
    """Refuse, before writing anything, a run the disk cannot hold: the float32 checkpoint,
    one export's file (at most as large: its weights in float32) and 1 GiB.  Returns the need."""
    need = 2 * checkpoint_bytes(cfg) + 2**30
    folder = Path(work) if work is not None else Path(tempfile.gettempdir())
    free = shutil.disk_usage(folder).free
    if free < need:
        raise InputError(f"--export-memory needs {need / 2**30:.1f} GiB free in {folder} (checkpoint + export + "
                         f"1 GiB), {free / 2**30:.1f} GiB are; give another folder with --memory-work")
    return need


def run_export_memory(cfg: MSARConfig, variants=VARIANTS, work: Path | None = None, log=print,
                      max_shard_size: int | None = None) -> dict:
    """max_shard_size: write the checkpoint in shards of at most this many bytes."""
    rows = []
    plan_disk(cfg, work)
    base = baseline_mb()
    with tempfile.TemporaryDirectory(prefix="msar-memory-", dir=work) as tmp:
        ckpt = random_checkpoint(cfg, Path(tmp) / "ckpt", max_shard_size=max_shard_size)
        params = checkpoint_bytes(cfg) // 4
        shards = len(list(ckpt.glob("*.safetensors")))
        ckpt_mb = sum(p.stat().st_size for p in ckpt.glob("*.safetensors")) / 2**20
        log(f"  {params / 1e6:.0f} M parameters, checkpoint {ckpt_mb:.0f} MiB in {shards} file(s), "
            f"baseline {base:.0f} MiB")
        for label, flags in variants:
            out = Path(tmp) / "m.onnx"
            r = cli_probe("export", str(ckpt), "-o", str(out), *flags)
            reported = _reported(r["stdout"], "MB (", "MB with validation")
            # The run's peak: the RSS sum over its process tree sampled every 25 ms, or the
            # process's own peak (rusage spans the exec into the validating image), or what
            # it reported, whichever is highest.
            total = max(r["tree_peak_rss_mb"], r["peak_rss_mb"], 0.0 if reported != reported else reported)
            row = {"variant": label, "parameters": params, "checkpoint_mib": round(ckpt_mb, 1),
                   "baseline_mib": round(base, 1), "returncode": r["returncode"], "wall_s": round(r["seconds"], 1),
                   "export_s": _reported(r["stdout"], "export:", "s"),
                   "peak_export_mib": _reported(r["stdout"], "peak RSS:", "MB"), "peak_mib": round(total, 1),
                   "reported_peak_mib": reported, "tree_peak_mib": r["tree_peak_rss_mb"],
                   "rusage_peak_mib": round(r["peak_rss_mb"], 1),
                   "over_checkpoint": round((total - base) / ckpt_mb, 2), "goal": GOAL,
                   "export_bound_mib": round(export_bound_mib(base, cfg), 1),
                   "validation": next((ln.strip() for ln in r["stdout"].splitlines() if "validation:" in ln), "")[:300],
                   "file_mib": round(sum(p.stat().st_size for p in out.parent.glob(out.name + "*")) / 2**20, 1)}
            if r["returncode"] != 0:
                row["stderr"] = r["stderr"][-400:]
            for p in out.parent.glob(out.name + "*"):
                p.unlink()
            rows.append(row)
            log(f"  {label:26s}: peak {total:.0f} MiB = baseline + {row['over_checkpoint']}x checkpoint "
                f"(export alone {row['peak_export_mib']:.0f}), {row['wall_s']} s, rc {r['returncode']}")
        shutil.rmtree(ckpt)
    return {"machine": machine_description(2), "settings": {"config": json.loads(cfg.to_json()), "shards": shards},
            "rows": rows}


def memory_table(result: dict) -> str:
    m, c = result["machine"], result["settings"]["config"]
    r0 = result["rows"][0]
    lines = [f"Measured {m['date']} on {m['cpu']} ({m['logical_cores']} cores, shared with other work), torch "
             f"{m['torch']}; random msar checkpoint, {c['n_blocks']} blocks, d_model {c['d_model']}, vocab "
             f"{c['vocab_size']}: {r0['parameters'] / 1e6:.0f} M parameters, {r0['checkpoint_mib']:.0f} MiB; "
             f"baseline (python importing msar_export and torch) {r0['baseline_mib']:.0f} MiB. Peak RSS of the "
             f"whole `msar-export export` run, validation included (MiB: the highest of the RSS summed over its process "
             f"tree sampled every 25 ms, its rusage peak and the VmHWM it reports).", "",
             "| variant | peak MiB | (peak - baseline) / checkpoint | goal | export alone MiB | "
             "(export alone - baseline) / checkpoint | wall s | validation |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        verdict = r["validation"].split(" - ")[0].replace("validation: ", "") or f"rc {r['returncode']}"
        alone = (r["peak_export_mib"] - r["baseline_mib"]) / r["checkpoint_mib"]
        lines.append(f"| {r['variant']} | {r['peak_mib']:.0f} | {r['over_checkpoint']} | <= {r['goal']} | "
                     f"{r['peak_export_mib']:.0f} | {alone:.2f} | {r['wall_s']} | {verdict} |")
    return "\n".join(lines)


def plot_memory(result: dict, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.bar(range(len(rows)), [r["over_checkpoint"] for r in rows])
    ax.axhline(GOAL, color="red", linestyle="--", label=f"goal {GOAL}x")
    ax.set_xticks(range(len(rows)), [r["variant"] for r in rows], rotation=15, fontsize=8)
    ax.set_ylabel("(peak RSS - baseline) / checkpoint")
    ax.legend()
    m = result["machine"]
    fig.suptitle(f"msar-export export peak memory - {rows[0]['parameters'] / 1e6:.0f} M params - {m['date']}",
                 fontsize=9)
    save_png(fig, out_png)


def write_memory(result: dict, out_dir: Path, name: str = "export_memory") -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / f"{name}.json", json.dumps(result, indent=1) + "\n")
    plot_memory(result, out_dir / f"{name}.png")


MEMORY_BEGIN, MEMORY_END = "<!-- export-memory:begin -->", "<!-- export-memory:end -->"


def update_readme_memory(readme: Path, results: list[dict]) -> None:
    """The README's export-memory block: one table per result (the ~320 M model, the >2 GB one)."""
    replace_block(readme, MEMORY_BEGIN, MEMORY_END, "\n\n".join(memory_table(r) for r in results))
