"""`msar-export bench --export-scaling`: export time, peak RSS, node count and
file size per graph kind against depth (and width), each export in its own
child process (`msar-export export ... --no-validate`, as the issue-12 table
was measured: trace + save, validation excluded; `--validate` times it too)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..log import silent
from ..checkpoint import save_checkpoint
from ..config import MSARConfig
from ..fileio import atomic_write_text
from .probe import cli_probe
from .report import replace_block, save_png
from .models import random_model
from .timing import machine_description

KIND_FLAGS = {"default": [], "decomposed": ["--decomposed"], "decode": ["--decode"]}


def node_counts(path: Path) -> dict:
    from ..graph_file import ExportedGraph

    m = ExportedGraph.open(path).proto
    return {"graph_nodes": len(m.graph.node), "function_nodes": sum(len(f.node) for f in m.functions)}


def _reported(stdout: str, key: str, unit: str) -> float:
    try:
        return float(stdout.split(key)[1].split(unit)[0])
    except (IndexError, ValueError):
        return float("nan")


def run_export_scaling(depths=(4, 8, 16, 24, 48), widths=(128,), kinds=tuple(KIND_FLAGS), validate: bool = False,
                       log=None) -> dict:
    log = log or silent
    rows = []
    with tempfile.TemporaryDirectory(prefix="msar-scaling-") as tmp:
        work = Path(tmp)
        for d in widths:
            for nb in depths:
                cfg = MSARConfig(d_model=d, n_blocks=nb, n_heads=max(1, d // 32), n_kv_heads=max(1, d // 64),
                                 mlp_hidden=11 * d // 4, max_seq_len=4096, residual="msar")
                ckpt = work / f"ckpt-{d}-{nb}"
                model = random_model(cfg)
                params = sum(p.numel() for p in model.parameters())
                save_checkpoint(model, ckpt)
                del model
                ckpt_mb = (ckpt / "model.safetensors").stat().st_size / 1e6
                for kind in kinds:
                    out = work / f"{kind}-{d}-{nb}.onnx"
                    args = ["export", str(ckpt), "-o", str(out), *KIND_FLAGS[kind]]
                    r = cli_probe(*args, *([] if validate else ["--no-validate"]))
                    row = {"kind": kind, "d_model": d, "n_blocks": nb, "parameters": params,
                           "checkpoint_mb": round(ckpt_mb, 2), "returncode": r["returncode"],
                           "wall_s": round(r["seconds"], 1),
                           "export_s": _reported(r["stdout"], "export:", "s"),
                           "peak_rss_mb": _reported(r["stdout"], "peak RSS:", "MB")}
                    if validate:
                        row["validation"] = next((ln.strip() for ln in r["stdout"].splitlines()
                                                  if "validation:" in ln), "")[:400]
                    if out.is_file():
                        row.update(node_counts(out))
                        row["file_mb"] = round(sum(p.stat().st_size for p in out.parent.glob(out.name + "*")) / 1e6, 2)
                        out.unlink()
                    else:
                        row["stderr"] = r["stderr"][-400:]
                    rows.append(row)
                    log(f"  d={d} blocks={nb:3d} {kind:10s}: export {row['export_s']:7.1f} s (wall {row['wall_s']:.1f} s)"
                        f"  peak RSS {row['peak_rss_mb']:.0f} MB  nodes {row.get('graph_nodes', '-')}"
                        f"+{row.get('function_nodes', '-')}  file {row.get('file_mb', '-')} MB  rc {r['returncode']}")
                import shutil

                shutil.rmtree(ckpt)
    return {"machine": machine_description(2), "settings": {"depths": list(depths), "widths": list(widths),
                                                           "kinds": list(kinds), "validate": validate},
            "rows": rows}


def plot_scaling(result: dict, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    panels = [("export_s", "export time, s"), ("peak_rss_mb", "peak RSS, MB"),
              ("graph_nodes", "main-graph nodes"), ("file_mb", "file size, MB")]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for ax, (key, label) in zip(axes, panels):
        for kind in result["settings"]["kinds"]:
            for d in result["settings"]["widths"]:
                pts = sorted((r["n_blocks"], r[key]) for r in rows if r["kind"] == kind and r["d_model"] == d and key in r)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{kind} d{d}")
        ax.set_xlabel("n_blocks")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    m = result["machine"]
    fig.suptitle(f"msar-export export vs depth - {m['date']} - {m['cpu']}", fontsize=9)
    save_png(fig, out_png)


def scaling_table(result: dict) -> str:
    m = result["machine"]
    lines = [f"Measured {m['date']} on {m['cpu']} ({m['logical_cores']} cores), torch {m['torch']}; random msar "
             f"checkpoints, kernels [1, 4, 8, 12]; seconds as `msar-export export --no-validate` reports them.", "",
             "| d_model | n_blocks | kind | export s | peak RSS MB | nodes (graph + functions) | file MB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(result["rows"], key=lambda r: (r["d_model"], r["n_blocks"], r["kind"])):
        lines.append(f"| {r['d_model']} | {r['n_blocks']} | {r['kind']} | {r['export_s']:.1f} | {r['peak_rss_mb']:.0f} | "
                     f"{r.get('graph_nodes', '-')} + {r.get('function_nodes', '-')} | {r.get('file_mb', '-')} |")
    return "\n".join(lines)


def write_scaling(result: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "export_scaling.json", json.dumps(result, indent=1) + "\n")
    plot_scaling(result, out_dir / "export_scaling.png")


SCALING_BEGIN, SCALING_END = "<!-- export-scaling:begin -->", "<!-- export-scaling:end -->"


def update_readme_scaling(readme: Path, result: dict) -> None:
    """Replace the block between the export-scaling markers with this result's table."""
    replace_block(readme, SCALING_BEGIN, SCALING_END, scaling_table(result))
