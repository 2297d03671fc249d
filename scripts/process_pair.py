"""Two graphs timed each in a process of its own, the processes alternated: the ratio a deployment
with one model per process sees, where the in-process pairs (prefill_pair.py, decode_pair.py, the
bench's goal rows) let each model's weights evict the other's from the cache between runs.

    python scripts/process_pair.py standard.onnx msar.onnx [--tokens 512]
    python scripts/process_pair.py standard.decode.onnx msar.decode.onnx --batch 8

Each process: one session (2 threads), 3 warm-up runs, then the median of `--runs` runs (a prefill
of 1 x tokens, or 16 decode steps after a 64-token prompt, in ms per step). Prints each round's times
and the median of the per-round ratios B / A. docs/ort_kernels.md has what it measured."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def child(path: str, batch: int | None, tokens: int, runs: int, threads: int, vocab: int) -> float:
    import numpy as np

    if batch is None:
        from msar_export.runners.ort_runner import OrtGraph

        graph = OrtGraph(path, threads=threads)
        ids = np.random.default_rng(0).integers(0, vocab, (1, tokens))

        def run():
            graph.logits(ids)

        per = 1
    else:
        import torch

        from msar_export.bench.run import ort_decode_steps
        from msar_export.runtime import OrtDecoder

        prompt = torch.randint(0, vocab, (batch, 64), generator=torch.Generator().manual_seed(1))
        run = ort_decode_steps(OrtDecoder(path, threads=threads), prompt, 16)
        per = 16
    for _ in range(3):
        run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) / per * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--batch", type=int, default=None, help="decode graphs: the batch (default: prefill graphs)")
    ap.add_argument("--tokens", type=int, default=512, help="prefill length (prefill graphs)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=9, help="timed runs per process")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256, help="token ids are drawn below this")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(child(args.a, args.batch, args.tokens, args.runs, args.threads, args.vocab))
        return
    unit = "ms/step" if args.batch is not None else "ms"
    flags = [f"--tokens={args.tokens}", f"--runs={args.runs}", f"--threads={args.threads}", f"--vocab={args.vocab}"]
    if args.batch is not None:
        flags.append(f"--batch={args.batch}")
    ratios = []
    for r in range(args.rounds):
        order = (args.a, args.b) if r % 2 == 0 else (args.b, args.a)
        got = {}
        for path in order:
            out = subprocess.run([sys.executable, __file__, path, path, "--child", *flags],
                                 check=True, capture_output=True, text=True)
            got[path] = float(out.stdout.split()[-1])
        ratios.append(got[args.b] / got[args.a])
        print(f"round {r + 1}: {args.a} {got[args.a]:.3f} {unit}, {args.b} {got[args.b]:.3f} {unit}, ratio {ratios[-1]:.3f}",
              flush=True)
    print(f"{args.b} / {args.a}: {statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
