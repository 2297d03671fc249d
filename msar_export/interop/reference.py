"""onnx's ReferenceEvaluator on files with overloaded msar functions."""

from __future__ import annotations

from .overloads import msar_functions


def reference_evaluator(model, **kwargs):
    """An `onnx.reference.ReferenceEvaluator` for `model` (ModelProto) whose
    msar nodes run the function body of *their* overload.

    The evaluator keys functions by (domain, name), so on its own it runs one
    body for every arity and stops at the first node of another.  Each msar op
    becomes a `new_ops` class here that picks the body by the node's overload
    and runs it with a nested ReferenceEvaluator, so every standard op, the
    bodies' included, is still computed by onnx's reference implementation."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    bodies = msar_functions(model)
    evaluators: dict = {}

    def body_for(node):
        key = (node.op_type, node.overload)
        if key not in bodies:
            raise RuntimeError(f"msar:{node.op_type} overload {node.overload!r} has no function in the model")
        if key not in evaluators:
            evaluators[key] = ReferenceEvaluator(bodies[key])
        return evaluators[key]

    def _run(self, *inputs, **_):
        attrs = {a.name: helper.get_attribute_value(a) for a in self.onnx_node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        evaluator = body_for(self.onnx_node)
        feeds = dict(zip(evaluator.input_names, inputs, strict=True))
        return tuple(evaluator.run(None, feeds, attributes=attrs))

    domain = next(iter(bodies.values())).domain if bodies else "msar"
    ops = [type(name, (OpRun,), {"op_domain": domain, "_run": _run}) for name in {k[0] for k in bodies}]
    return ReferenceEvaluator(model, new_ops=ops, **kwargs)
