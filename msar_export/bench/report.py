"""Chart and README table from a benchmark results file."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..fileio import atomic_path, atomic_write_text

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def plot_results(result: dict, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    B, T = result["settings"]["prefill_shapes"][0]
    rows = [r for r in result["prefill"] if (r["batch"], r["seq"]) == (B, T)]
    backends = sorted({r["backend"] for r in rows})
    kinds = [k for k in ("standard", "attnres", "msar") if any(r["kind"] == k for r in rows)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(backends))
    for j, b in enumerate(backends):
        xs, ys = [], []
        for i, k in enumerate(kinds):
            r = next((r for r in rows if r["kind"] == k and r["backend"] == b), None)
            if r:
                xs.append(i + j * width)
                ys.append(r["median_s"] * 1e3)
        ax1.bar(xs, ys, width, label=b)
    ax1.set_xticks([i + 0.4 - width / 2 for i in range(len(kinds))], kinds)
    ax1.set_ylabel(f"prefill latency, ms (batch {B}, seq {T})")
    ax1.legend(fontsize=8)
    dec = [r for r in result["decode"] if r.get("batch", 1) == 1]
    dbackends = sorted({r["backend"] for r in dec})
    dwidth = 0.8 / max(1, len(dbackends))
    for j, b in enumerate(dbackends):
        xs = [i + j * dwidth for i, k in enumerate(kinds)]
        ys = [next((r["tokens_per_s"] for r in dec if r["kind"] == k and r["backend"] == b), 0) for k in kinds]
        ax2.bar(xs, ys, dwidth, label=b)
    ax2.set_xticks([i + 0.4 - dwidth / 2 for i in range(len(kinds))], kinds)
    ax2.set_ylabel("decode tokens/s (batch 1)")
    ax2.legend(fontsize=8)
    m = result["machine"]
    fig.suptitle(f"{m['date']} - {m['cpu']} - {m['threads']} threads", fontsize=9)
    save_png(fig, out_png)


def save_png(fig, out_png) -> None:
    """Lay out, write atomically, and free the figure (pyplot keeps every open figure)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def markdown_table(result: dict) -> str:
    m, s = result["machine"], result["settings"]
    cfg = s.get("model", s)  # results written before BenchSettings held an MSARConfig have the fields flat
    B, T = s["prefill_shapes"][0]
    lines = [f"Measured {m['date']} on {m['cpu']} ({m['logical_cores']} cores, {m['threads']} threads), "
             f"torch {m['torch']}, onnxruntime {m['onnxruntime']}; d_model {cfg['d_model']}, {cfg['n_blocks']} blocks, "
             f"stream kernels {list(cfg['stream_kernels'])}, random weights. Median of {s['repeats']} round-robin runs"
             + (f"; the goal ratios are the median of {s.get('pair_repeats')} pairwise ratios, each row alternated "
                "with the standard model's alone (bench/paired.py)." if result.get("paired") else "."),
             "", f"| kind | backend | prefill {B}x{T} ms | tokens/s |", "| --- | --- | --- | --- |"]
    for r in sorted(result["prefill"], key=lambda r: (r["kind"], r["backend"])):
        if (r["batch"], r["seq"]) == (B, T):
            lines.append(f"| {r['kind']} | {r['backend']} | {r['median_s'] * 1e3:.1f} | {r['tokens_per_s']:.0f} |")
    lines += ["", f"| kind | decode backend | batch | tokens/s (after a {s['decode_prompt']}-token prompt) |",
              "| --- | --- | --- | --- |"]
    for r in sorted(result["decode"], key=lambda r: (r["kind"], r["backend"], r.get("batch", 1))):
        lines.append(f"| {r['kind']} | {r['backend']} | {r.get('batch', 1)} | {r['tokens_per_s']:.1f} |")
    paired = result.get("paired", {})
    lines += ["", "| ratio | value |", "| --- | --- |"]
    lines += [f"| {k} | {v}" + (f" (pairs: {paired[k]['min']}-{paired[k]['max']}, {paired[k]['pairs']} rounds)" if k in paired else "")
              + " |" for k, v in result["ratios"].items() if k != "shape"]
    if "guard" in result:
        g = result["guard"]
        lines += ["", f"Guard model ({g['model']}, prefill {g['shape'][0]}x{g['shape'][1]}, {g['threads']} thread(s), "
                  "tests/test_bench_guard.py): "
                  + ", ".join(f"{k} {v}" for k, v in g.items() if k.startswith("msar/standard")) + "."]
    if "export_probe" in result:
        e = result["export_probe"]
        lines += ["", f"Export of a {e['parameters'] / 1e6:.0f} M-parameter checkpoint ({e['checkpoint_mb']:.0f} MB): "
                  f"{e['seconds']} s, peak RSS {e['peak_rss_mb']:.0f} MB = {e['rss_over_checkpoint']}x the checkpoint."]
    for k, why in result["skipped"].items():
        lines.append(f"\n{k}: skipped ({why})")
    return "\n".join(lines)


def update_readme(readme: Path, result: dict) -> bool:
    """Replace the text between the bench markers; returns whether it changed."""
    return replace_block(readme, BEGIN, END, markdown_table(result))


def readme_with_block(readme: Path, begin: str, end: str) -> Path:
    """`readme`, checked before a long run writes into it: a readable file holding the block's markers."""
    from ..errors import InputError

    try:
        text = readme.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--update-readme {readme}: cannot read it ({e.strerror or e})") from None
    if begin not in text or end not in text:
        raise InputError(f"--update-readme {readme}: no {begin} ... {end} block to replace")
    return readme


def replace_block(readme: Path, begin: str, end: str, body: str) -> bool:
    """Replace the text between two marker lines; returns whether it changed."""
    text = readme.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{readme} has no {begin} ... {end} block")
    new = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{body}\n{end}", text, flags=re.S)
    if new != text:
        with atomic_path(readme) as tmp:
            tmp.write_text(new)
    return new != text


def write_sweep(result: dict, json_path: Path, readme: Path | None, begin: str, end: str, table: str) -> None:
    """A sweep's results as JSON and, given a README, its table between the sweep's markers."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json_path, json.dumps(result, indent=1) + "\n")
    if readme is not None:
        replace_block(readme, begin, end, table)
