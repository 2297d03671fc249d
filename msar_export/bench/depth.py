"""`msar-export bench --depth-sweep`: how MSAR's cost over a standard model in ONNX Runtime grows
with depth, next to the multiply-add model of issue 21 (each mixer recomputes its sources'
views: 36 multiply-adds per channel, source and token; the gate m*m*d per token and mixer), and
of the `--mixer-op scored` graph; native kernels (FusedMixer and scored files) and function
bodies, one process, each alternated with the standard graph alone (bench/paired.py: four graphs
in one round-robin put the function bodies' run before the scored one and moved its ratio by 0.15)."""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path

import numpy as np

from ..log import silent
from ..config import MSARConfig
from .report import write_sweep

BEGIN, END = "<!-- depth-sweep:begin -->", "<!-- depth-sweep:end -->"
MACS_PER_PAIR_CHANNEL = 36  # sum of the conv kernels (4+8+12) + per stream q.v, v.v and the z sum (3 x 4)


def mac_model(cfg: MSARConfig, T: int) -> dict:
    """Multiply-adds per token: the mixing of an msar model and everything else (as ORT runs it:
    attention over all T keys, no causal skipping)."""
    d, L, m = cfg.d_model, cfg.n_sublayers, len(cfg.stream_kernels)
    hd = d // cfg.n_heads
    pairs = sum(range(1, L + 2))  # mixer l reads l sources, l = 1..L+1
    mixing = pairs * d * (sum(cfg.stream_kernels[1:]) + 3 * m) + (L + 1) * m * m * d
    attention = d * cfg.n_heads * hd * 2 + d * cfg.n_kv_heads * hd * 2 + 2 * T * cfg.n_heads * hd
    rest = cfg.n_blocks * (attention + 3 * d * cfg.mlp_hidden) + cfg.vocab_size * d
    # --mixer-op scored: each source's views, norms and scores once (SourceScores), each mixer the
    # views again for the weighted sum only (ScoredMixer), and the gate
    sources = L + 1
    scored = (sources * d * (sum(cfg.stream_kernels[1:]) + m) + pairs * m * d
              + pairs * d * (sum(cfg.stream_kernels[1:]) + m) + sources * m * m * d)
    return {"mixing_macs_per_token": mixing, "rest_macs_per_token": rest, "predicted_ratio": round(1 + mixing / rest, 3),
            "scored_mixing_macs_per_token": scored, "predicted_ratio_scored": round(1 + scored / rest, 3)}


def run_depth_sweep(depths=(8, 16, 32), base: MSARConfig | None = None, T: int = 512, threads: int = 2,
                    repeats: int = 5, log=None) -> dict:
    log = log or silent
    from ..export import ExportOptions
    from ..runtime import OrtModel
    from .models import export_random, native_available
    from .timing import interleaved_samples, machine_description

    from .run import BenchSettings

    base = base or BenchSettings().model
    hows = ["native", "scored", "function"] if native_available() else ["function"]
    rows = []
    for n_blocks in depths:
        cfg = dataclasses.replace(base, n_blocks=n_blocks)
        runs = {}
        with tempfile.TemporaryDirectory(prefix="msar-depth-") as tmp:
            files = {("standard", "prefill"): ExportOptions(decomposed=True), ("msar", "fused"): ExportOptions()}
            if "scored" in hows:
                files[("msar", "scored")] = ExportOptions(mixer_op="scored")
            paths = export_random(cfg, files, tmp)
            graph_of = {"ort": ("standard", "prefill"), "native": ("msar", "fused"), "function": ("msar", "fused"),
                        "scored": ("msar", "scored")}
            for how in ["ort", *hows]:
                ort_ops = {"ort": None, "scored": "native"}.get(how, how)
                runs[how] = OrtModel(paths[graph_of[how]], threads=threads, ort_ops=ort_ops).ort
            ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, T))
            std, row = [], {"n_blocks": n_blocks}
            for how in hows:
                s = interleaved_samples({"msar": lambda g=runs[how]: g.logits(ids),
                                         "ort": lambda g=runs["ort"]: g.logits(ids)}, 1, repeats)
                std += s["ort"]
                ratios = sorted(a / b for a, b in zip(s["msar"], s["ort"]))
                row[f"msar_{how}_ms"] = round(statistics.median(s["msar"]) * 1e3, 1)
                row[f"ratio_{how}"] = round(statistics.median(ratios), 3)
                row[f"ratio_{how}_spread"] = [round(ratios[0], 3), round(ratios[-1], 3)]
        row = {"n_blocks": n_blocks, "standard_ms": round(statistics.median(std) * 1e3, 1), **mac_model(cfg, T),
               **{k: v for k, v in row.items() if k != "n_blocks"}}
        log(f"  {n_blocks} blocks: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "n_blocks"))
        rows.append(row)
    return {"machine": machine_description(threads), "d_model": base.d_model, "tokens": T,
            "stream_kernels": list(base.stream_kernels), "repeats": repeats, "rows": rows}


def spread(row: dict, how: str) -> str:
    lo_hi = row.get(f"ratio_{how}_spread")
    return f" ({lo_hi[0]}-{lo_hi[1]})" if lo_hi else ""


def depth_table(res: dict) -> str:
    m = res["machine"]
    hows = [h for h in ("native", "scored", "function") if f"ratio_{h}" in res["rows"][0]]
    scored = "predicted_ratio_scored" in res["rows"][0]
    lines = [f"Measured {m['date']} on {m['cpu']} ({m['threads']} threads), onnxruntime {m['onnxruntime']}; random "
             f"models, d_model {res['d_model']}, kernels {res['stream_kernels']}, prefill 1x{res['tokens']}; "
             + ("each msar graph alternated with the standard one alone, the median of the per-round ratios "
                f"(their spread) over {res['repeats']} rounds" if any(k.endswith("_spread") for k in res["rows"][0])
                else f"median of {res['repeats']} interleaved runs")
             + ". Predicted: 1 + mixing / rest multiply-adds (each mixer "
             "recomputing its views" + ("; scored: `--mixer-op scored`, each source's views and scores made once)."
                                        if scored else ")."), "",
             "| n_blocks | standard ms | " + " | ".join(f"msar {h} ms | msar/standard {h}" for h in hows)
             + " | predicted | " + ("predicted scored | " if scored else "") + "mixing / rest MACs per token |",
             "| --- | --- | " + " | ".join("--- | ---" for _ in hows) + " | --- |" + (" --- |" if scored else "")
             + " --- |"]
    for r in res["rows"]:
        cells = " | ".join(f"{r[f'msar_{h}_ms']} | {r[f'ratio_{h}']}" + spread(r, h) for h in hows)
        pred = f"{r['predicted_ratio']} | " + (f"{r['predicted_ratio_scored']} | " if scored else "")
        lines.append(f"| {r['n_blocks']} | {r['standard_ms']} | {cells} | {pred}"
                     f"{r['mixing_macs_per_token'] / 1e6:.2f} M / {r['rest_macs_per_token'] / 1e6:.1f} M |")
    return "\n".join(lines)


def write_depth_sweep(res: dict, out: Path, readme: Path | None = None) -> None:
    write_sweep(res, out / "depth_sweep.json", readme, BEGIN, END, depth_table(res))
