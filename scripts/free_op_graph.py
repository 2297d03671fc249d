"""A copy of an exported graph in which the msar ops named are replaced by free stand-ins, for timing
only (its outputs are wrong): what each op costs a run unprofiled, as the difference to the original
file in a pair script.

    python scripts/free_op_graph.py msar.decode.onnx free.onnx --ops DepthRetrieval StreamGate
    python scripts/decode_pair.py --batch 8 standard.decode.onnx msar.decode.onnx free.onnx

Stand-ins: DepthRetrieval -> an Identity of its last view (z has a view's shape); StreamGate -> stream 0
of z (a Slice and a Squeeze); SourceViews -> the source repeated as every view (an Unsqueeze and an
Expand); ConvState -> an Identity of the past state. docs/ort_kernels.md ("Measured, not kept", "What a
decode step spends beyond the standard model") used it on decode graphs.

ScoredMixer (the `--mixer-op scored` prefill graph) is a bound, not a stand-in: every mixer with an even
number of sources keeps only its newest source, that source's row of the scores and its conv taps (two
Slices). That is what one node per mixer pair (1, 2), (3, 4), ... would leave the pair's second mixer,
with nothing added for the first mixer's second set of sums or the partial sums handed between them:
the most such a node could save ("Measured, not kept (2026-12-04 morning)")."""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import helper, numpy_helper

STAND_INS = ("DepthRetrieval", "StreamGate", "SourceViews", "ConvState", "ScoredMixer")
SCORED_FIXED = 5  # ScoredMixer: gate weight, bias, scale, conv bank, scores; then the sources


def stand_in(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    if node.op_type == "ScoredMixer":
        n = len(node.input) - SCORED_FIXED
        if n % 2:
            return [node]
        # the newest source's score row and its conv taps (bank row n-1: row 0, which every mixer
        # reads, would more likely be in cache and flatter the bound)
        picks = [helper.make_node("Slice", [node.input[port], f"free_row_{n - 1}", f"free_row_{n}", "free_zero"],
                                  [f"{node.output[0]}_newest_{port}"]) for port in (SCORED_FIXED - 2, SCORED_FIXED - 1)]
        pair = onnx.NodeProto()
        pair.CopyFrom(node)
        pair.name = f"{node.name}_pair_bound"
        pair.overload = "n1"  # the function body of one source (export/functions.py names overloads n{count})
        del pair.input[:]
        pair.input.extend([*node.input[:SCORED_FIXED - 2], *(p.output[0] for p in picks), node.input[-1]])
        return [*picks, pair]
    if node.op_type == "DepthRetrieval":
        return [helper.make_node("Identity", [node.input[-1]], list(node.output), name=f"{node.name}_free")]
    if node.op_type == "ConvState":
        return [helper.make_node("Identity", [node.input[0]], list(node.output), name=f"{node.name}_free")]
    if node.op_type == "SourceViews":  # inputs: taps, past state, index, source, mask
        m = len(next(a for a in node.attribute if a.name == "stream_kernels").ints)
        row = f"{node.output[0]}_row"
        return [helper.make_node("Unsqueeze", [node.input[3], "free_axis"], [row]),
                helper.make_node("Expand", [row, f"free_streams_{m}"], list(node.output))]
    picked = f"{node.output[0]}_stream0"
    return [helper.make_node("Slice", [node.input[-1], "free_zero", "free_one", "free_axis"], [picked]),
            helper.make_node("Squeeze", [picked, "free_axis"], list(node.output))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graph")
    ap.add_argument("output")
    ap.add_argument("--ops", nargs="+", choices=STAND_INS, required=True)
    args = ap.parse_args()
    model = onnx.load(args.graph)
    g = model.graph
    g.initializer.extend(numpy_helper.from_array(np.array([v], np.int64), name)
                         for name, v in (("free_zero", 0), ("free_one", 1), ("free_axis", 2)))
    streams = {len(a.ints) for n in g.node if n.op_type == "SourceViews" for a in n.attribute if a.name == "stream_kernels"}
    g.initializer.extend(numpy_helper.from_array(np.array([1, 1, m, 1], np.int64), f"free_streams_{m}") for m in streams)
    rows = {len(n.input) - SCORED_FIXED for n in g.node if n.op_type == "ScoredMixer"}
    g.initializer.extend(numpy_helper.from_array(np.array([r], np.int64), f"free_row_{r}")
                         for r in sorted(rows | {r - 1 for r in rows}))
    nodes, replaced = [], 0
    for n in g.node:
        if n.domain == "msar" and n.op_type in args.ops:
            new = stand_in(n)
            nodes += new
            replaced += new != [n]
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    onnx.save(model, args.output)
    print(f"{args.output}: {replaced} nodes replaced ({', '.join(args.ops)})")


if __name__ == "__main__":
    main()
