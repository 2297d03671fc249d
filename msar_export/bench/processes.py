"""Goal ratios with each graph in a process of its own, the processes alternated.

The in-process pairs (bench/paired.py) run two sessions in one process, so each model's weights
are evicted from the cache by the other's between runs. A deployment runs one model per process:
there a model small enough for its weights to stay in the last-level cache (the bench's 100 MB on
a VM with a 480 MB L3) runs its decode steps much faster, and MSAR's fixed cost per step weighs
more (docs/ort_kernels.md, "What a decode step spends beyond the standard model"). Both figures
are reported; neither is the truth for every model size.

`python -m msar_export.bench.processes A B [--batch 8]` (scripts/process_pair.py) runs it alone."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

WARMUP = 3


def child_time(path: str, batch: int | None, tokens: int, runs: int, threads: int, vocab: int) -> float:
    """The median time of `runs` prefills of 1 x tokens (ms), or of 16 decode steps after a
    64-token prompt (ms per step) when `batch` is given, in this process."""
    import numpy as np

    from .steps import DECODE_STEPS, ort_decode_run, ort_prefill_run

    if batch is None:
        run, per = ort_prefill_run(path, np.random.default_rng(0).integers(0, vocab, (1, tokens)), threads), 1
    else:
        run, per = ort_decode_run(path, batch, vocab, threads), DECODE_STEPS
    for _ in range(WARMUP):
        run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) / per * 1e3)
    return statistics.median(times)


def process_ratio(a: str, b: str, batch: int | None = None, tokens: int = 512, rounds: int = 4, runs: int = 9,
                  threads: int = 2, vocab: int = 256, log=None) -> dict:
    """b's time over a's, each timed in a fresh process, the order swapped every round: the
    median of the per-round ratios, their spread and every round's times."""
    flags = [f"--tokens={tokens}", f"--runs={runs}", f"--threads={threads}", f"--vocab={vocab}"]
    if batch is not None:
        flags.append(f"--batch={batch}")
    ratios, times = [], []
    for r in range(rounds):
        got = [0.0, 0.0]  # by side, not by path: a graph may be timed against itself
        for side in ((0, 1) if r % 2 == 0 else (1, 0)):
            path = (a, b)[side]
            out = subprocess.run([sys.executable, "-m", __name__, path, path, "--child", *flags],
                                 check=True, capture_output=True, text=True)
            got[side] = float(out.stdout.split()[-1])
        ratios.append(got[1] / got[0])
        times.append(got)
        if log:
            log(f"    round {r + 1}: {got[0]:.3f} / {got[1]:.3f}, ratio {ratios[-1]:.3f}")
    r = sorted(ratios)
    return {"median": round(statistics.median(r), 3), "min": round(r[0], 3), "max": round(r[-1], 3), "pairs": len(r),
            "times": times}


def goal_ratios(files: dict, tokens: int, batches, rounds: int, threads: int, vocab: int, log, prefill: bool = True) -> dict:
    """msar over standard, one process per graph: the prefill ("prefill", when `prefill`) and the time
    per decode step at each batch ("decode_b{batch}"). files[(kind, graph)]: the path of kind
    standard or msar, graph prefill or decode."""
    jobs = [("prefill", "prefill", None)] if prefill else []
    out = {}
    for name, graph, batch in jobs + [(f"decode_b{b}", "decode", b) for b in batches]:
        log(f"    one process each: {name}")
        out[name] = process_ratio(str(files[("standard", graph)]), str(files[("msar", graph)]), batch=batch,
                                  tokens=tokens, rounds=rounds, threads=threads, vocab=vocab)
    return out


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="b / a with each graph in a process of its own, alternated")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--batch", type=int, default=None, help="decode graphs: the batch (default: prefill graphs)")
    ap.add_argument("--tokens", type=int, default=512, help="prefill length (prefill graphs)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=9, help="timed runs per process")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256, help="token ids are drawn below this")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(child_time(args.a, args.batch, args.tokens, args.runs, args.threads, args.vocab))
        return
    res = process_ratio(args.a, args.b, args.batch, args.tokens, args.rounds, args.runs, args.threads, args.vocab,
                        log=print)
    print(f"{args.b} / {args.a}: {res['median']} (rounds {res['min']}-{res['max']})")


if __name__ == "__main__":
    main()
