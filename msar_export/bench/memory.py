"""`msar-export bench --export-memory`: whole-process peak RSS of `msar-export
export` (validation included) against the checkpoint's bytes, per graph kind,
each export in its own child process.  The issue-12 goal: peak <= 1.5 x the
checkpoint + the interpreter's baseline (python importing msar_export and torch)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

from ..log import silent
from ..config import MSARConfig
from ..errors import InputError
from ..fileio import atomic_write_text
from .bounds import checkpoint_bytes, row_bounds, within
from .probe import cli_probe, python_probe
from .report import replace_block, save_png
from .models import random_checkpoint
from .scaling import KIND_FLAGS, _reported
from .timing import machine_description

GOAL = 1.5
# (label, export flags): every graph kind, then the options that change what is held.
VARIANTS = tuple((kind, flags) for kind, flags in KIND_FLAGS.items()) + (
    ("default --external-data", ["--external-data"]), ("default --dtype float16", ["--dtype", "float16"]))
# The larger-than-memory row (issue 26) is "default --external-data" (validated: the reference
# streams, ORT maps the data file); this one is its export phase alone.
LARGE_VARIANTS = (("default --external-data --no-validate", ["--external-data", "--no-validate"]),)
# A run is killed (its whole process tree) when the system's MemAvailable falls below this: the
# row fails instead of the OOM killer choosing among the other work on the machine.
MIN_AVAILABLE_MIB = 2048
BASELINE_CODE = ("import torch, msar_export.checkpoint, msar_export.model\n"  # what `import msar_export` loaded before it went lazy

                 "print(int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) / 1024)")


def memory_config(n_blocks: int = 24, d_model: int = 1024, vocab: int = 32000) -> MSARConfig:
    return MSARConfig(vocab_size=vocab, d_model=d_model, n_blocks=n_blocks, n_heads=d_model // 64,
                      n_kv_heads=d_model // 128, mlp_hidden=11 * d_model // 4, max_seq_len=4096, residual="msar")


def baseline_mb() -> float:
    return float(python_probe(BASELINE_CODE)["stdout"].split()[-1])


def plan_disk(cfg: MSARConfig, work: Path | None) -> int:
    """Refuse, before writing anything, a run the disk cannot hold: the float32 checkpoint,
    one export's file (at most as large: its weights in float32) and 1 GiB.  Returns the need."""
    return require_free(Path(work) if work is not None else Path(tempfile.gettempdir()),
                        2 * checkpoint_bytes(cfg) + 2**30, "--export-memory", "(checkpoint + export + 1 GiB)",
                        "give another folder with --memory-work")


def require_free(folder: Path, need: int, flag: str, what: str, remedy: str) -> int:
    """`need` bytes free in `folder`, or an InputError naming the flag, what the bytes are for and the
    remedy, before anything is written. Returns the need."""
    free = shutil.disk_usage(folder).free
    if free < need:
        raise InputError(f"{flag} needs {need / 2**30:.1f} GiB free in {folder} {what}, {free / 2**30:.1f} GiB are; "
                         f"{remedy}")
    return need


@contextlib.contextmanager
def terminated_as_exit():
    """SIGTERM raises SystemExit here (Python's default ends the process at once), so a
    terminated bench still runs its finally blocks: the child's tree killed, its files removed."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    try:
        old = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave the handler alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def measure_variant(ckpt: Path, out: Path, label: str, flags: list[str], cfg: MSARConfig, base: float,
                    min_available_mib: float | None = MIN_AVAILABLE_MIB) -> dict:
    """One `msar-export export` of `ckpt` in a child process (its temporary files under
    out's folder), measured; its files removed after."""
    params, ckpt_mb = checkpoint_bytes(cfg) // 4, _mib(ckpt.glob("*.safetensors"))
    env = {**os.environ, "TMPDIR": str(out.parent)}  # the handoff's state goes with the rest
    try:
        r = cli_probe("export", str(ckpt), "-o", str(out), *flags, env=env, min_available_mib=min_available_mib)
        made = sorted(out.parent.glob(out.name + "*"))
        file_mb, external = _mib(made), any(p.name.endswith(".data") for p in made)
    finally:
        for p in out.parent.glob(out.name + "*"):
            p.unlink()
    reported = _reported(r["stdout"], "MB (", "MB with validation")
    # The run's peak: the RSS sum over its process tree sampled every 25 ms, or the
    # process's own peak (rusage spans the exec into the validating image), or what
    # it reported, whichever is highest.
    total = max(r["tree_peak_rss_mb"], r["peak_rss_mb"], 0.0 if reported != reported else reported)
    verdict = next((ln.strip() for ln in r["stdout"].splitlines() if "validation:" in ln), "")[:300]
    row = {"variant": label, "parameters": params, "checkpoint_mib": round(ckpt_mb, 1),
           "baseline_mib": round(base, 1), "returncode": r["returncode"], "wall_s": round(r["seconds"], 1),
           "export_s": _reported(r["stdout"], "export:", "s"),
           "peak_export_mib": _reported(r["stdout"], "peak RSS:", "MB"), "peak_mib": round(total, 1),
           "reported_peak_mib": reported, "tree_peak_mib": r["tree_peak_rss_mb"],
           "tree_peak_anon_mib": r["tree_peak_anon_mb"], "rusage_peak_mib": round(r["peak_rss_mb"], 1),
           "min_available_mib": r["min_available_mb"], "over_checkpoint": round((total - base) / ckpt_mb, 2),
           "goal": GOAL,
           "validation": r["aborted"] or verdict, "file_mib": round(file_mb, 1), "external_data": external}
    row.update(row_bounds(row, cfg))
    row["within_bound"] = within(row)
    if r["returncode"] != 0:
        row["stderr"] = r["stderr"][-400:]
    return row


def _mib(paths) -> float:
    return sum(p.stat().st_size for p in paths) / 2**20


def run_export_memory(cfg: MSARConfig, variants=VARIANTS, work: Path | None = None, log=None,
                      max_shard_size: int | None = None, min_available_mib: float | None = MIN_AVAILABLE_MIB) -> dict:
    """max_shard_size: write the checkpoint in shards of at most this many bytes.  Whatever
    it made is removed, also when a run fails, is killed or the bench is interrupted."""
    log = log or silent
    rows = []
    plan_disk(cfg, work)
    base = baseline_mb()
    with terminated_as_exit(), tempfile.TemporaryDirectory(prefix="msar-memory-", dir=work) as tmp:
        ckpt = random_checkpoint(cfg, Path(tmp) / "ckpt", max_shard_size=max_shard_size)
        shards = len(list(ckpt.glob("*.safetensors")))
        log(f"  {checkpoint_bytes(cfg) / 4e6:.0f} M parameters, checkpoint {_mib(ckpt.glob('*.safetensors')):.0f} "
            f"MiB in {shards} file(s), baseline {base:.0f} MiB")
        for label, flags in variants:
            row = measure_variant(ckpt, Path(tmp) / "m.onnx", label, flags, cfg, base, min_available_mib)
            rows.append(row)
            log(f"  {label:26s}: peak {row['peak_mib']:.0f} MiB (anonymous {row['tree_peak_anon_mib']:.0f}), bound "
                f"{row['bound_mib']:.0f} / {row['anon_bound_mib']:.0f}, export alone {row['peak_export_mib']:.0f}, "
                f"{row['wall_s']} s, rc {row['returncode']} {row['validation'][:60]}")
    return {"machine": machine_description(2), "settings": {"config": json.loads(cfg.to_json()), "shards": shards,
                                                            "min_available_mib": min_available_mib},
            "rows": rows}


def memory_table(result: dict) -> str:
    m, c = result["machine"], result["settings"]["config"]
    r0 = result["rows"][0]
    lines = [f"Measured {m['date']} on {m['cpu']} ({m['logical_cores']} cores, shared with other work), torch "
             f"{m['torch']}; random msar checkpoint, {c['n_blocks']} blocks, d_model {c['d_model']}, vocab "
             f"{c['vocab_size']}: {r0['parameters'] / 1e6:.0f} M parameters, {r0['checkpoint_mib']:.0f} MiB in "
             f"{result['settings'].get('shards', 1)} file(s); baseline (python importing msar_export and torch) "
             f"{r0['baseline_mib']:.0f} MiB. Peak RSS of the whole `msar-export export` run, validation included "
             f"(MiB: the highest of the RSS summed over its process tree sampled every 25 ms, its rusage peak and "
             f"the VmHWM it reports; anonymous: the tree's RssAnon, sampled; before validation: the VmHWM it "
             f"reports for the reference, trace and save), against the bounds of the formula above.", "",
             "| variant | peak MiB | bound MiB | anonymous MiB | bound MiB | within | (peak - baseline) / checkpoint "
             "| before validation MiB | bound MiB | file MiB | wall s | validation |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    cfg = MSARConfig.from_dict(c)
    for r in result["rows"]:
        r = {**r, **row_bounds(r, cfg)}  # also rows measured before the bounds were recorded
        r["within_bound"] = within(r)
        verdict = r["validation"].split(" - ")[0].replace("validation: ", "") or f"rc {r['returncode']}"
        anon = r.get("tree_peak_anon_mib")
        lines.append(f"| {r['variant']} | {r['peak_mib']:.0f} | {r['bound_mib']:.0f} | "
                     f"{'-' if anon is None else f'{anon:.0f}'} | {r['anon_bound_mib']:.0f} | "
                     f"{'yes' if r['within_bound'] else 'NO'} | {r['over_checkpoint']} | {r['peak_export_mib']:.0f} | "
                     f"{r['pre_validation_bound_mib']:.0f} | {r['file_mib']:.0f} | {r['wall_s']} | {verdict} |")
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
# The README's tables, in this order: the ~320 M model, the >2 GB one, the sharded ~3 GB one,
# the one larger than this machine's memory.
README_STEMS = ("export_memory", "export_memory_2gb", "export_memory_medium", "export_memory_large")


def saved_results(folder: Path) -> list[dict]:
    """Every result in `folder` the README shows."""
    return [json.loads((folder / f"{s}.json").read_text()) for s in README_STEMS if (folder / f"{s}.json").is_file()]


def update_readme_memory(readme: Path, results: list[dict]) -> None:
    """The README's export-memory block: one table per result."""
    replace_block(readme, MEMORY_BEGIN, MEMORY_END, "\n\n".join(memory_table(r) for r in results))
