"""Polygraphy's `surgeon sanitize` for files with msar functions."""

from __future__ import annotations

from .model_fields import copy_model_fields
from .overloads import missing_functions, restore_overloads


def sanitize(model, fold_constants: bool = True):
    """What `polygraphy surgeon sanitize [--fold-constants]` does (onnx-graphsurgeon
    cleanup and topological sort, Polygraphy's constant folding), then what
    graphsurgeon loses put back, so ONNX Runtime and TensorRT still find every
    body.  ModelProto in, new ModelProto out, with the input's model fields
    (metadata_props, doc_string, ...).

    graphsurgeon writes nodes and functions back without their overload, and
    its cleanup keeps one function per name as "used"; the bodies are
    therefore taken from the input model."""
    import onnx
    import onnx_graphsurgeon as gs
    from polygraphy.backend.onnx import fold_constants as polygraphy_fold

    bodies = [onnx.FunctionProto.FromString(f.SerializeToString()) for f in model.functions]

    def repaired(m):
        restore_overloads(m)
        if missing_functions(m):
            del m.functions[:]
            m.functions.extend(bodies)
        return m

    graph = gs.import_onnx(model)
    graph.cleanup().toposort()
    out = repaired(gs.export_onnx(graph))
    if fold_constants:
        # Folded without the functions (an msar node is never constant): with them,
        # the folder's own graphsurgeon pass makes duplicates that its ONNX Runtime
        # refuses, and it then folds nothing.
        del out.functions[:]
        out = repaired(polygraphy_fold(out))
    return copy_model_fields(model, out)  # graphsurgeon writes a new model without them
