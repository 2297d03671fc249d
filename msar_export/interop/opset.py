"""Opset conversion that keeps the msar functions."""

from __future__ import annotations

from ..errors import InputError


def convert_opset(model, target: int):
    """`onnx.version_converter.convert_version` for the graph and for every
    function body (ModelProto in, new ModelProto out).

    The converter itself drops all functions, leaving msar nodes that no
    runtime can resolve.  Each body is converted as a model of its own (its
    nodes between untyped inputs and outputs) and re-attached with its opset
    import set to `target`, equal to the model's, as the exporter writes them."""
    import onnx
    from onnx import helper, version_converter

    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if current is None:
        raise InputError("the model imports no standard ONNX opset; nothing to convert")
    try:
        converted = version_converter.convert_version(model, target)
    except Exception as e:  # the converter raises bare RuntimeErrors / ConvertErrors per adapter
        raise InputError(f"ONNX version converter: cannot convert opset {current} -> {target}: {str(e)[:200]}") from None
    del converted.functions[:]
    for fn in model.functions:
        body_opset = next((o.version for o in fn.opset_import if o.domain in ("", "ai.onnx")), current)
        graph = helper.make_graph(list(fn.node), f"{fn.name}_{fn.overload}",
                                  [helper.make_value_info(n, onnx.TypeProto()) for n in fn.input],
                                  [helper.make_value_info(n, onnx.TypeProto()) for n in fn.output])
        wrapper = helper.make_model(graph, opset_imports=[helper.make_opsetid("", body_opset)])
        wrapper.ir_version = model.ir_version
        try:
            body = version_converter.convert_version(wrapper, target)
        except Exception as e:
            raise InputError(f"ONNX version converter: cannot convert the body of {fn.domain}:{fn.name} "
                             f"({fn.overload}) to opset {target}: {str(e)[:200]}") from None
        new = onnx.FunctionProto()
        new.CopyFrom(fn)
        del new.node[:]
        new.node.extend(body.graph.node)
        restore_attribute_refs(fn, new)
        del new.opset_import[:]
        new.opset_import.extend([helper.make_opsetid("", target)] +
                                [o for o in fn.opset_import if o.domain not in ("", "ai.onnx")])
        converted.functions.append(new)
    return converted


def restore_attribute_refs(original, converted) -> int:
    """Put back, in `converted` (a FunctionProto, in place), every attribute reference
    (`ref_attr_name`, e.g. a Constant's value_float = @eps) that `original` holds.

    The converter reads a body as a graph, where a reference means nothing: it writes
    the attribute back as its plain value (0.0), so the body would compute with eps = 0.
    A node is found again by its op type and outputs, which the converter keeps; a
    reference whose node it replaced cannot be put back and is refused (InputError).
    Returns how many references were restored."""
    import onnx

    by_outputs = {(n.op_type, tuple(n.output)): n for n in converted.node}
    restored = 0
    for node in original.node:
        refs = [a for a in node.attribute if a.ref_attr_name]
        if not refs:
            continue
        target = by_outputs.get((node.op_type, tuple(node.output)))
        if target is None:
            raise InputError(f"ONNX version converter: it rewrote the {node.op_type} node that reads attribute "
                             f"@{refs[0].ref_attr_name} in the body of {original.domain}:{original.name} "
                             f"({original.overload}); the reference cannot be restored, nothing written")
        wanted = {a.name: a for a in refs}
        attrs = [wanted.pop(a.name, a) for a in target.attribute] + list(wanted.values())
        copies = [onnx.AttributeProto.FromString(a.SerializeToString()) for a in attrs]
        del target.attribute[:]
        target.attribute.extend(copies)
        restored += len(refs)
    return restored
