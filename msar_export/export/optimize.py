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
                _constant_folding.FoldConstantsPass(
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
