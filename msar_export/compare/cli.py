"""`msar-export check`: numerical parity of an exported graph (and engine) with its checkpoint."""

from __future__ import annotations

from ..numbers import POSITIVE, SEED
from ..verdict import MULTIPLE
from ..cli_common import add_dtype, add_ort_ops, add_plugins, add_shapes, add_trust_pickle, say

EPILOG = f"""\
Exit status: 0 every backend within tolerance, 1 a mismatch (the report names the
first bad layer), 2 bad input (missing file, not ONNX, graph from another model).

The metric per output (h_1 .. h_{{L+1}}, logits) is max|backend - ref| / max|ref| over
all batches, ref the eager model in float64; NaN or Inf always fails.  An output passes
within {MULTIPLE:g}x the eager model's own error at the backend's precision plus a floor
(msar_export.verdict; see docs/parity.md).  TensorRT runs when `import tensorrt` works: from --engine,
or built from the graph with every hidden.{{l}} marked as an output.
"""


def register(subparsers) -> None:
    import argparse

    p = subparsers.add_parser(
        "check", help="parity check: eager PyTorch vs ONNX Runtime (vs TensorRT), layer by layer",
        description=__doc__.splitlines()[0], epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint directory the graph was exported from (the reference)")
    p.add_argument("--onnx", required=True, metavar="MODEL.onnx", help="prefill graph from `msar-export export`")
    p.add_argument("--engine", metavar="MODEL.plan", help="serialised TensorRT engine to check as well")
    add_plugins(p, "TensorRT plugin libraries to load")
    p.add_argument("--no-trt", action="store_true", help="do not run TensorRT even if it is installed")
    add_dtype(p, None, "precision the --engine computes in; its bounds come from the eager model at that "
                        "precision. Default and floor: the graph's msar.dtype, which ONNX Runtime and an engine "
                        "check builds (strongly typed) always compute in")
    p.add_argument("--tol", type=POSITIVE, default=None, help="one fixed tolerance for every output instead of the verdict bounds (same metric)")
    add_shapes(p, "1x(kmax+5),2x37,3x64 within max_seq_len")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the token batches")
    p.add_argument("--report", metavar="DIR", help="write parity.json, parity.png, summary.txt and the golden files "
                                                   "inputs.json / golden.json (Polygraphy formats) here")
    add_ort_ops(p, extra=("both",))  # both: the native kernels and the function bodies, side by side
    add_trust_pickle(p)
    p.add_argument("--verbose", action="store_true", help="show Polygraphy's own log")
    p.set_defaults(func=cmd_check)


def cmd_check(a) -> int:
    from .inputs import parse_shapes
    from .parity import CheckOptions, check_parity
    from .report import console_for, print_report, report_targets, write_report

    shapes = parse_shapes(a.shapes) if a.shapes is not None else None
    inputs = [a.checkpoint, a.onnx, a.engine, *a.plugins]
    if a.report:
        report_targets(a.report, inputs)  # the whole output set, before the slow part
    opts = CheckOptions(engine=a.engine, plugins=tuple(a.plugins), dtype=a.dtype, tol=a.tol, shapes=shapes,
                        seed=a.seed, tensorrt=not a.no_trt, trust_pickle=a.trust_pickle, verbose=a.verbose,
                        ort_ops=("native", "function") if a.ort_ops == "both" else (a.ort_ops,))
    # stderr: progress (and --verbose's Polygraphy log); stdout: the report alone.
    result = check_parity(a.checkpoint, a.onnx, opts, progress=say)
    print_report(result, console_for(), write_report(result, a.report, inputs) if a.report else None)
    if a.report:
        print(f"report: {a.report}/ (parity.json, parity.png, summary.txt, inputs.json, golden.json)")
    return result.exit_code
