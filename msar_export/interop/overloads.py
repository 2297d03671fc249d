"""Overload identity of msar functions and nodes, recovered from arity."""

from __future__ import annotations

from ..contracts import CONTRACTS, DOMAIN
from ..errors import OnnxModelError
from ..graph_file import all_nodes


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
    for node in all_nodes(model.graph):
        if node.domain == DOMAIN and node.op_type in CONTRACTS:
            want = arity_overload(node.op_type, len(node.input))
            if node.overload != want:
                node.overload = want
                fixed += 1
    return fixed


def msar_functions(model) -> dict:
    """{(name, overload): FunctionProto} of the model's msar functions."""
    return {(f.name, f.overload): f for f in model.functions if f.domain == DOMAIN}


def missing_functions(model) -> list[str]:
    """'Name/overload' of each msar node whose function the model lacks."""
    have = msar_functions(model)
    missing = {f"{n.op_type}/{n.overload}" for n in all_nodes(model.graph)
               if n.domain == DOMAIN and (n.op_type, n.overload) not in have}
    return sorted(missing)


def rebuild_functions(model) -> int:
    """Add the body of every msar node's overload the model lacks, written again from the
    file's own msar.config and default-domain opset, exactly as the exporter writes them
    (export/functions.py).  Run restore_overloads first.  Returns how many were added."""
    import onnx_ir as ir

    from ..export.functions import function_body
    from ..graph_file import ExportedGraph

    missing = missing_functions(model)
    if not missing:
        return 0
    cfg = ExportedGraph.from_proto(model).config
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for key in missing:
        op_type, overload = key.split("/")
        contract = CONTRACTS.get(op_type)
        if contract is None or not overload[1:].isdigit():
            raise OnnxModelError(f"msar:{op_type} (overload {overload!r}) is not an op this msar-export writes; "
                                 "its body cannot be rebuilt: give --functions-from ORIGINAL.onnx")
        body = function_body(contract, int(overload[1:]), cfg, opset)
        model.functions.append(ir.serde.serialize_function(body))
    return len(missing)
