"""Decode steps of two or more decode graphs side by side, interleaved in one process:
each graph's ms per step (after a 64-token prompt, 16 steps per run, median of 7 runs) and
its ratio to the first graph (the median of the pairwise ratios).

    python scripts/decode_pair.py --batch 8 standard.decode.onnx msar.decode.onnx [--threads 1 --cpu-time]

--cpu-time with --threads 1 measures process CPU time instead of wall time: a ratio that
holds on a machine shared with other work (docs/ort_kernels.md used it while helpers ran).
--ort-ops, one per graph (a library path, native or function), runs each graph on its own msar
kernels: the same graph twice on two builds of the library is an A/B of a kernel change."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from msar_export.bench.steps import ort_decode_steps
from msar_export.bench.timing import interleaved_samples
from msar_export.runtime import OrtDecoder


def main() -> None:
    args, clock = parse_pair_args(__doc__, "--batch", 1)
    torch.manual_seed(0)
    prompt = torch.randint(0, 256, (args.batch, 64))
    runs = [ort_decode_steps(OrtDecoder(p, threads=args.threads, ort_ops=o), prompt, 16)
            for p, o in zip(args.graphs, args.ort_ops)]
    samples = interleaved_samples(dict(enumerate(runs)), warmup=1, repeats=args.repeats, clock=clock)
    times = [[t / 16 * 1e3 for t in samples[i]] for i in range(len(runs))]
    report(args.graphs, times, f"batch {args.batch}, {args.threads} thread(s){' CPU time' if args.cpu_time else ''}",
           "ms/step")


def parse_pair_args(doc: str, size_flag: str, size_default: int):
    """The pair scripts' command line (graphs, a size, --threads, --cpu-time) and their clock."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument(size_flag, type=int, default=size_default)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-time", action="store_true")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved runs per graph (default 7)")
    ap.add_argument("--ort-ops", nargs="+", default=None, metavar="LIBRARY",
                    help="one per graph: a library path, native or function (default: $MSAR_ORT_OPS for all)")
    args = ap.parse_args()
    if args.ort_ops is None:
        args.ort_ops = [None] * len(args.graphs)
    elif len(args.ort_ops) != len(args.graphs):
        ap.error(f"--ort-ops takes one entry per graph ({len(args.graphs)}), got {len(args.ort_ops)}")
    return args, time.process_time if args.cpu_time else time.perf_counter


def report(paths, times, label: str, unit: str) -> None:
    """Each graph's median and its ratio to the first (the median of the pairwise ratios)."""
    base = np.array(times[0])
    for path, t in zip(paths, times):
        t = np.array(t)
        print(f"{label}: {path}: {np.median(t):.2f} {unit}, ratio to the first {np.median(t / base):.3f}")


if __name__ == "__main__":
    main()
