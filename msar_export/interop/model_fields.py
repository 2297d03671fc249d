"""The model-level fields a rewrite of a user's ONNX file must carry over from its input."""

from __future__ import annotations

# ModelProto's own fields besides the graph, opsets and functions: who made the file and what
# the user (and msar-export: msar.config, msar.graph, ...) wrote about it.
SCALAR_FIELDS = ("producer_name", "producer_version", "doc_string", "model_version", "domain")


def copy_model_fields(source, target):
    """Give `target` (a ModelProto, in place) `source`'s metadata_props and SCALAR_FIELDS, exactly:
    a field `source` leaves empty is cleared in `target`.  Tools rebuild the model around the graph
    (onnx-graphsurgeon writes a new ModelProto) and drop them.  `source` may be `target`.
    Returns `target`."""
    props = [(p.key, p.value) for p in source.metadata_props]
    values = {name: getattr(source, name) for name in SCALAR_FIELDS}
    del target.metadata_props[:]
    for key, value in props:
        target.metadata_props.add(key=key, value=value)
    for name, value in values.items():
        setattr(target, name, value)
    return target
