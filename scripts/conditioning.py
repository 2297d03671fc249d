"""Is a float32 backend's error the backend's or the model's?  For one checkpoint: the float64 model's
spread under weight perturbations of float32's size (msar_export.compare.conditioning), eager
float32's error, and each ONNX file's error in ONNX Runtime (native kernels and function bodies,
graph optimisations all and off), every figure rel_err against the float64 eager logits.

    python scripts/conditioning.py CHECKPOINT [--onnx FILE ...] [--tokens 128] [--batch 1]

docs/ort_kernels.md ("Function bodies: speed and precision") has the figures it gave."""

from __future__ import annotations

import argparse

import numpy as np
import torch

from msar_export.checkpoint import load_checkpoint
from msar_export.compare.conditioning import perturbation_spread
from msar_export.verdict import rel_err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--onnx", nargs="*", default=[], help="prefill graphs of this checkpoint")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--draws", type=int, default=8)
    args = ap.parse_args()

    model64 = load_checkpoint(args.checkpoint, dtype=torch.float64)
    torch.manual_seed(1)
    ids = torch.randint(0, model64.cfg.vocab_size, (args.batch, args.tokens))
    spread = perturbation_spread(model64, ids, draws=args.draws)
    with torch.inference_mode():
        ref = model64(ids).numpy()
        eager = load_checkpoint(args.checkpoint, dtype=torch.float32)(ids).double().numpy()
    print(f"float64 model, weights x (1 + 1e-7 N(0,1)), {args.draws} draws: {min(spread):.2e} - {max(spread):.2e} "
          f"(median {float(np.median(spread)):.2e})")
    print(f"eager float32: {rel_err(eager, ref):.2e}")
    from msar_export.runners.ort_runner import OrtGraph

    for path in args.onnx:
        for ops in ("native", "function"):
            for opt in ("all", "disable"):
                logits = OrtGraph(path, threads=2, optimization=opt, ort_ops=ops).logits(ids.numpy())
                print(f"{path}: ONNX Runtime {ops}, optimisations {opt}: {rel_err(logits, ref):.2e}")


if __name__ == "__main__":
    main()
