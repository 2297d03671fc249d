"""Prefill of two or more graphs side by side, interleaved in one process: each graph's median
time for one 1 x T prompt (7 runs) and its ratio to the first (the median of the pairwise ratios).

    python scripts/prefill_pair.py standard.onnx msar.onnx [--threads 1 --cpu-time] [--tokens 512]
    python scripts/prefill_pair.py msar.onnx msar.onnx --ort-ops old/libmsar_ort_ops.so new/libmsar_ort_ops.so

Two sessions alone: `msar-export bench` holds about 20 in one process and its ratios swing
from run to run (README, "Reading the numbers")."""

from __future__ import annotations

import numpy as np

from decode_pair import parse_pair_args, report  # this folder is on sys.path when run as a script
from msar_export.bench.timing import interleaved_samples
from msar_export.runners.ort_runner import open_session


def main() -> None:
    args, clock = parse_pair_args(__doc__, "--tokens", 512)
    sessions = [open_session(p, threads=args.threads, ort_ops=o) for p, o in zip(args.graphs, args.ort_ops)]
    feeds = {"input_ids": np.random.default_rng(0).integers(0, 256, (1, args.tokens)).astype(np.int64)}
    samples = interleaved_samples({i: lambda s=s: s.run(None, feeds) for i, s in enumerate(sessions)},
                                  warmup=1, repeats=args.repeats, clock=clock)
    times = [[t * 1e3 for t in samples[i]] for i in range(len(sessions))]
    report(args.graphs, times, f"1x{args.tokens}, {args.threads} thread(s){' CPU time' if args.cpu_time else ''}", "ms")

if __name__ == "__main__":
    main()
