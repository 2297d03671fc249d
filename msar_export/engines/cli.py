"""`msar-export build`: the command-line face of msar_export.engines.build_engine.

Registered through msar_export.cli.REGISTRARS; imports nothing heavy here."""

from __future__ import annotations

from ..cli_common import add_dtype, add_plugins, say
from ..numbers import GIB
from .backends import BACKENDS, TENSORRT

DESCRIPTION = """Build a TensorRT engine from an ONNX file made by `msar-export export`.
The network is strongly typed, so the precision is the ONNX file's (export with
--dtype); msar custom nodes need the plugin library (--plugins); --profile sets
the optimisation profile. Writes the plan
atomically and a metadata file PLAN.json (TensorRT version, ONNX and plugin
sha256, profile, backend, TF32) that later runs check. --backend tensorrt needs
TensorRT; --backend tensorrt-rtx (pip install -e '.[rtx]') builds without a GPU,
and its engines run on RTX-class GPUs. TF32 is off unless --tf32."""


def cmd_build(a) -> int:
    from .builder import build_engine
    from .profiles import parse_profile
    from .targets import parse_compute_capabilities

    # The list options, parsed once into the typed values the builder takes.
    report = build_engine(a.onnx, a.output, dtype=a.dtype, shapes=parse_profile(a.profile), plugin_libs=a.plugins,
                          timing_cache=a.timing_cache, workspace_gb=a.workspace_gb, verbose=a.verbose,
                          progress=say, backend=BACKENDS[a.backend],
                          compute_capabilities=parse_compute_capabilities(a.compute_capability), tf32=a.tf32)
    print(report.summary())
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("build", help="build a TensorRT engine from an exported ONNX file (needs TensorRT)",
                              description=DESCRIPTION)
    p.add_argument("onnx", help="ONNX file from `msar-export export`")
    p.add_argument("-o", "--output", required=True, help="engine path (.plan); metadata goes to OUTPUT.json")
    add_dtype(p, None, "check that the ONNX file has this precision (default: take the file's)")
    p.add_argument("--profile", action="append", default=[], metavar="DIM=MIN/OPT/MAX[,...]",
                   help="optimisation profile for the dynamic dims batch, seq, past, e.g. "
                        "batch=1/4/8,seq=1/128/512 (repeatable; defaults: batch=1/1/8, seq up to max_seq_len)")
    add_plugins(p, "plugin libraries to load (required when the file has msar custom nodes)")
    p.add_argument("--backend", choices=tuple(BACKENDS), default=TENSORRT.name,
                   help="which TensorRT builds the engine (default tensorrt; tensorrt-rtx builds with no GPU)")
    p.add_argument("--compute-capability", action="append", default=[], metavar="X.Y[,X.Y]",
                   help="TensorRT-RTX target GPUs, e.g. 8.6,12.0 (repeatable; default: the library's default)")
    p.add_argument("--tf32", action="store_true",
                   help="allow TF32 in float32 matmuls (off by default: float32 engines compute in float32)")
    p.add_argument("--timing-cache", metavar="FILE", help="TensorRT timing cache: read if present, then updated")
    p.add_argument("--workspace-gb", type=GIB, default=None, help="builder workspace limit in GiB")
    p.add_argument("--verbose", action="store_true", help="print TensorRT's info and verbose log")
    p.set_defaults(func=cmd_build)
