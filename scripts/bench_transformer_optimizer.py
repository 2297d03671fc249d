"""ONNX Runtime's transformer optimizer on our files: fused-operator statistics and ORT
latency before and after (docs/interop.md's table).

    python scripts/bench_transformer_optimizer.py [CKPT] [--repeats 30]

Exports the FusedMixer prefill, decode and --decomposed graphs of CKPT (default: the
committed trained checkpoint) in float32, runs `optimize_model(model_type="bert",
opt_level=0)` on each, and times stock ONNX Runtime (CPU, function bodies, every
optimisation level on, 2 threads) on the file before and after, interleaved so that
machine noise hits both alike."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.transformers.optimizer import optimize_model

from msar_export.bench.timing import interleaved, machine_description
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.interop.run import seeded_feeds
from msar_export.verdict import rel_err

KINDS = {"fused": ExportOptions(), "decode": ExportOptions(decode=True), "decomposed": ExportOptions(decomposed=True)}
SHAPES = {"fused": [(1, 128)], "decode": [(1, 128), (1, 1)], "decomposed": [(1, 128)]}  # (batch, new tokens)


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("checkpoint", nargs="?", default=str(Path(__file__).resolve().parent.parent / "checkpoints/default/msar"))
    p.add_argument("--repeats", type=int, default=30)
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, opts in KINDS.items():
            path = Path(tmp) / f"{kind}.onnx"
            export_checkpoint(a.checkpoint, path, opts, validate=False)
            before = onnx.load(path)
            opt = optimize_model(str(path), model_type="bert", opt_level=0, num_heads=0, hidden_size=0)
            stats = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
            s0, s1 = session(before), session(opt.model)
            for batch, seq in SHAPES[kind]:
                feeds = seeded_feeds(before, batch, seq, seed=0)
                run = {"before": lambda: s0.run(["logits"], feeds), "after": lambda: s1.run(["logits"], feeds)}
                t = interleaved(run, warmup=3, repeats=a.repeats)
                err = rel_err(np.asarray(run["after"]()[0], np.float64), np.asarray(run["before"]()[0], np.float64))
                rows.append({"graph": kind, "shape": f"{batch}x{seq}", "fused": stats,
                             "nodes": [len(before.graph.node), len(opt.model.graph.node)],
                             "before_ms": round(t["before"].median_s * 1e3, 3), "after_ms": round(t["after"].median_s * 1e3, 3),
                             "iqr_ms": [round(t[k].iqr_s * 1e3, 3) for k in ("before", "after")],
                             "after_vs_before_rel_err": float(f"{err:.2e}")})
                print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"machine": machine_description(2)}))


if __name__ == "__main__":
    main()
