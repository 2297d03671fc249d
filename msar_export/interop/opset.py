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
        del new.opset_import[:]
        new.opset_import.extend([helper.make_opsetid("", target)] +
                                [o for o in fn.opset_import if o.domain not in ("", "ai.onnx")])
        converted.functions.append(new)
    return converted
