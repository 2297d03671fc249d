"""What the decode graph's conv state rewrite costs, one process per graph (timing only): the msar
decode file as exported, and a copy without its ConvState node and `present_conv_state` output whose
state input is fed the prefill's state unchanged every step (what a caller-kept state would cost,
apart from writing the new rows), each against the standard decode file.

    python scripts/state_cost.py standard.decode.onnx msar.decode.onnx --batch 8 [--rounds 4]

Every graph is stepped by the same loop (`session.run`, numpy caches, 16 steps after a 64-token prompt,
the median of 9 runs after 3 warm-ups) in a process of its own; the processes alternate, the order
swapped every round. docs/ort_kernels.md ("What a decode step spends beyond the standard model") has
what it measured."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def without_state(src: str, dst: str) -> None:
    import onnx

    model = onnx.load(src)
    g = model.graph
    node = next(n for n in g.node if "present_conv_state" in n.output)
    g.node.remove(node)
    g.output.remove(next(o for o in g.output if o.name == "present_conv_state"))
    onnx.save(model, dst)


def child(path: str, batch: int, state_from: str | None) -> float:
    from msar_export.runners.ort_runner import OrtGraph

    g = OrtGraph(path, threads=2)
    prompt = np.random.default_rng(1).integers(0, 256, (batch, 64))
    pre = OrtGraph(state_from, threads=2) if state_from else g  # the stateless copy cannot prefill its state
    logits, cache = pre.step(prompt, np.ones((batch, 64), np.int64), np.tile(np.arange(64), (batch, 1)),
                             pre.empty_cache(batch))
    del pre
    tok, names = logits[:, -1:].argmax(-1), g.input_names

    def run():
        c, t = dict(cache), tok
        for s in range(16):
            outs = g.session.run(None, {names[0]: t, names[1]: np.ones((batch, 65 + s), np.int64),
                                        names[2]: np.full((batch, 1), 64 + s), **c})
            for name, value in zip(g.output_names[1:], outs[1:]):
                c[g.next_cache_names[name]] = value
            t = outs[0][:, -1:].argmax(-1)

    for _ in range(3):
        run()
    times = []
    for _ in range(9):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) / 16 * 1e3)
    return statistics.median(times)


def timed(path: str, batch: int, state_from: str | None = None) -> float:
    args = [sys.executable, __file__, "--child", path, str(batch)] + ([state_from] if state_from else [])
    return float(subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(child(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("standard")
    ap.add_argument("msar")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stateless = str(Path(tmp) / "msar.stateless.onnx")
        without_state(args.msar, stateless)
        variants = {"as exported": (args.msar, None), "without the state rewrite": (stateless, args.msar)}
        for label, (path, state_from) in variants.items():
            ratios = []
            for r in range(args.rounds):
                if r % 2 == 0:
                    a = timed(args.standard, args.batch)
                    b = timed(path, args.batch, state_from)
                else:
                    b = timed(path, args.batch, state_from)
                    a = timed(args.standard, args.batch)
                ratios.append(b / a)
            print(f"batch {args.batch}, msar {label} / standard: {statistics.median(ratios):.3f} "
                  f"(rounds {min(ratios):.3f}-{max(ratios):.3f})", flush=True)


if __name__ == "__main__":
    main()
