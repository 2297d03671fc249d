"""Overload identity of msar functions and nodes, recovered from arity."""

from __future__ import annotations

from ..export.contracts import CONTRACTS, DOMAIN


def arity_overload(op_type: str, n_inputs: int) -> str:
    contract = CONTRACTS[op_type]
    return contract.overload(n_inputs - contract.n_fixed_inputs)


def restore_overloads(model) -> int:
    """Give every msar function and node (onnx.ModelProto, in place) the
    overload its number of inputs implies; drop functions that then repeat.

    Tools that rewrite a model by function name (onnx-graphsurgeon, so
    `polygraphy surgeon`) drop the overload field, which leaves n functions
    called `msar:FusedMixer` that ONNX Runtime refuses as duplicates.  The
    arity identifies each body uniquely, so nothing else is needed.  Returns
    how many overloads were set."""
    fixed = 0
    kept, seen = [], set()
    for fn in model.functions:
        if fn.domain == DOMAIN and fn.name in CONTRACTS:
            want = arity_overload(fn.name, len(fn.input))
            if fn.overload != want:
                fn.overload = want
                fixed += 1
        key = (fn.domain, fn.name, fn.overload)
        if key not in seen:
            seen.add(key)
            kept.append(fn)
    if len(kept) != len(model.functions):
        copies = [type(f)() for f in kept]
        for c, f in zip(copies, kept):
            c.CopyFrom(f)
        del model.functions[:]
        model.functions.extend(copies)
    for node in _all_nodes(model.graph):
        if node.domain == DOMAIN and node.op_type in CONTRACTS:
            want = arity_overload(node.op_type, len(node.input))
            if node.overload != want:
                node.overload = want
                fixed += 1
    return fixed


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g.node:
                yield from _all_nodes(attr.g)
            for g in attr.graphs:
                yield from _all_nodes(g)


def msar_functions(model) -> dict:
    """{(name, overload): FunctionProto} of the model's msar functions."""
    return {(f.name, f.overload): f for f in model.functions if f.domain == DOMAIN}


def missing_functions(model) -> list[str]:
    """'Name/overload' of each msar node whose function the model lacks."""
    have = msar_functions(model)
    missing = {f"{n.op_type}/{n.overload}" for n in _all_nodes(model.graph)
               if n.domain == DOMAIN and (n.op_type, n.overload) not in have}
    return sorted(missing)
