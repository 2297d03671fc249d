"""The ONNX graph optimisation the exporter runs after torch.onnx.

It is onnxscript's `optimize_ir` (what `torch.onnx.export(optimize=True)`
runs) with one rewrite rule left out: `SlicesSplit` (two Slices of one tensor
that cover it -> one Split).  That rule has two output nodes, and onnxscript's
matcher tries such a pattern by listing every node of the graph again for each
candidate Slice, so its cost is (Slices x nodes) per pass: quadratic in depth
for the decode graph, whose causal convolutions were shifted slices
(profiled: 27 of 59 s at 8 blocks, decode).  Leaving two
Slices where a Split could be changes nothing a runtime cares about.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

# Rules whose matching is super-linear in the graph size (see the module doc).
SKIPPED_RULES = ("SlicesSplit",)


def rewrite_rules() -> list:
    from onnxscript import rewriter

    return [r for r in rewriter._DEFAULT_REWRITE_RULES if getattr(r, "name", "") not in SKIPPED_RULES]


def optimize_model(model: ir.Model, num_iterations: int = 2) -> ir.Model:
    """In place, the passes of `onnxscript.optimizer.optimize_ir` (onnxscript 0.7)
    and `onnx_fusions.fuse`, in the same order and with the same defaults."""
    from onnxscript import rewriter
    from onnxscript.optimizer import _constant_folding
    from onnxscript.rewriter import onnx_fusions

    passes = ir.passes.Sequential(
        common_passes.InlinePass(),
        ir.passes.PassManager(
            [
                _fold_pass_keeping_lazy_weights()(
                    shape_inference=True,
                    input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                    output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
                ),
                rewriter.RewritePass(rewrite_rules()),
                common_passes.RemoveUnusedNodesPass(),
                common_passes.RemoveUnusedFunctionsPass(),
                common_passes.RemoveUnusedOpsetsPass(),
            ],
            steps=num_iterations,
            early_stop=True,
        ),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    )
    passes(model)
    onnx_fusions.fuse(model)
    return model


def _fold_pass_keeping_lazy_weights():
    """onnxscript's FoldConstantsPass, except that a Transpose folded from a lazy weight (a
    weightless export, weightless.py) gives a lazy result.  onnxscript folds a Transpose of
    any size when the weight has no other reader (every Linear weight, an untied lm_head),
    and would hold each result until the file is written: the whole model, transposed.  Here
    the fold still runs once (so everything else the pass decides is unchanged), its result
    is dropped, and the same transpose is recomputed from the weight when it is written."""
    import numpy as np
    from onnxscript.optimizer import _constant_folding

    class FoldKeepingLazyWeights(_constant_folding.FoldConstantsPass):
        def new_initializer(self, node: ir.Node, array):
            value = super().new_initializer(node, array)
            src = node.inputs[0].const_value if node.inputs and node.inputs[0] is not None else None
            if (value is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx")
                    or not isinstance(src, ir.LazyTensor)):
                return value
            perm = node.attributes["perm"].as_ints() if "perm" in node.attributes else None
            done = value.const_value

            def transposed(src=src, perm=perm):
                # contiguous: save.py writes a C-ordered array from its memory, anything else via
                # tobytes(), which would evaluate the lazy tensor a second time
                return ir.tensor(np.ascontiguousarray(np.transpose(src.numpy(), perm)))

            value.const_value = ir.LazyTensor(transposed, dtype=done.dtype, shape=done.shape, name=done.name)
            return value

    return FoldKeepingLazyWeights


def remove_identity_casts(model: ir.Model) -> int:
    """Drop Cast / CastLike nodes whose input already has the target type.

    The function bodies cast to float32 and back so that a float16 node runs
    in float32; inlined into a float32 graph (`--decomposed`) those casts are
    no-ops, and they are not harmless: fp16 converters retype every float
    value to float16 but keep `Cast(to=FLOAT)`, so ONNX Runtime refuses the
    converted file.  Returns how many were removed."""
    removed = 0
    for node in list(model.graph):
        if node.op_type not in ("Cast", "CastLike") or node.domain not in ("", "ai.onnx"):
            continue
        src, out = node.inputs[0], node.outputs[0]
        if node.op_type == "Cast":
            target = ir.DataType(node.attributes["to"].as_int())
        else:
            target = node.inputs[1].dtype
        if src is None or _dtype_of(src) != target or out.is_graph_output():
            continue
        out.replace_all_uses_with(src)
        model.graph.remove(node, safe=True)
        removed += 1
    return removed


# Ops whose output has their first input's element type.
_TYPE_PRESERVING = {"Concat", "Slice", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Expand", "Split",
                    "Gather",  # SourceViews' row of the state
                    # arithmetic: what the inlined SourceViews / DepthRetrieval / StreamGate bodies end in
                    "Add", "Sub", "Mul", "Div", "MatMul", "Conv", "ReduceSum", "ReduceMean", "Sigmoid", "Sqrt",
                    "Softmax"}


def _dtype_of(value: ir.Value, depth: int = 64) -> ir.DataType | None:
    """The element type of `value`, followed back through type-preserving ops:
    values made by inlining carry no type until shape inference runs."""
    while value.dtype is None and depth > 0:
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Cast":  # a body's float32 island: the cast's own target
            return ir.DataType(node.attributes["to"].as_int())
        if node.op_type == "CastLike":
            value, depth = node.inputs[1], depth - 1
            continue
        if node.op_type not in _TYPE_PRESERVING:
            return None
        value, depth = node.inputs[0], depth - 1
    return value.dtype


def separate_consumed_outputs(model: ir.Model) -> int:
    """Give every graph output that other nodes also read its own Identity.

    `present.*` caches are both outputs and inputs of the attention; fp16
    converters called with keep_io_types=True cast an output back to float32
    under its old name and leave its readers reading the float32 copy, which
    ONNX Runtime then refuses.  After this pass an output is read by nobody."""
    added = 0
    for i, out in enumerate(list(model.graph.outputs)):
        if not out.uses() or out.producer() is None:
            continue
        name = out.name
        out.name = f"{name}.inner"
        ident = ir.Node("", "Identity", [out], name=f"{name}.output")
        model.graph.insert_after(out.producer(), ident)
        ident.outputs[0].name = name
        ident.outputs[0].dtype, ident.outputs[0].shape = out.dtype, out.shape
        model.graph.outputs[i] = ident.outputs[0]
        added += 1
    return added
