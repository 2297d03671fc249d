"""What every subcommand shares: usage errors and user errors as one line and exit 2
(`Parser`, `run_command`), and the options several take, defined once with one
spelling, one grammar and one meaning:

--plugins LIB [LIB ...]   TensorRT plugin libraries; repeatable, and each use may name several
--dtype P                 the precision the model computes in: export writes it, build checks
                          the file has it, check judges TensorRT at it (verdict.PRECISIONS)
--shapes BxT[,BxT...]     token batch shapes to run (engine optimisation profiles are
                          `build --profile`)
--trust-pickle            allow model.pt / pytorch_model.bin checkpoints (weights_only=True)
--ort-ops WHICH           how ONNX Runtime runs the msar nodes: auto (the native kernels when
                          built, else the function bodies), native, function; set for the whole
                          process and its children (MSAR_ORT_OPS), so every session agrees
"""

from __future__ import annotations

import argparse
import os
import sys

from . import log
from .errors import MsarError
from .log import say  # noqa: F401  (the commands' progress callable, msar_export.log's convention)
from .verdict import PRECISIONS

PLUGIN_EXAMPLE = "build/plugins/libmsar_plugins.so"


def add_plugins(p, what: str) -> None:
    p.add_argument("--plugins", nargs="+", action="extend", default=[], metavar="LIB.so",
                   help=f"{what}, e.g. {PLUGIN_EXAMPLE} (repeatable)")


def add_dtype(p, default: str | None, what: str) -> None:
    p.add_argument("--dtype", choices=PRECISIONS, default=default, help=what)


def add_shapes(p, default_text: str) -> None:
    p.add_argument("--shapes", default=None, metavar="BxT,...", help=f"token batch shapes (default: {default_text})")


def add_trust_pickle(p) -> None:
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow model.pt / pytorch_model.bin checkpoints (loaded with weights_only=True)")


class Parser(argparse.ArgumentParser):
    """Usage errors are bad input too: one line on stderr, exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# The runner's names, copied: importing it here would load onnxruntime for every command
# (tests/test_ort_kernels.py checks the copy).
ORT_OPS_ENV = "MSAR_ORT_OPS"
ORT_OPS_CHOICES = ("auto", "native", "function")


def add_ort_ops(p, extra: tuple[str, ...] = ()) -> None:
    p.add_argument("--ort-ops", choices=ORT_OPS_CHOICES + extra, default=None,
                   help="msar nodes in ONNX Runtime: the native kernels (plugins/msarOrtOps, built by "
                        "scripts/setup_env.sh), their function bodies, or auto (native when built; default, "
                        f"or ${ORT_OPS_ENV})" + (f"; {', '.join(extra)}: see the command" if extra else ""))


def run_command(args) -> int:
    """Run a parsed subcommand: progress and warnings on stderr (msar_export.log), user errors
    one line + exit 2, bugs a traceback + exit 1."""
    log.setup(args.command, verbose=getattr(args, "verbose", False))
    if getattr(args, "ort_ops", None) in ORT_OPS_CHOICES:
        os.environ[ORT_OPS_ENV] = args.ort_ops  # every session, and the validating process export execs
    try:
        return args.func(args)
    except MsarError as e:
        print(f"msar-export {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"msar-export {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception:
        import traceback

        traceback.print_exc()
        print(f"msar-export {args.command}: internal error (a bug in msar-export, not your input); please report it",
              file=sys.stderr)
        return 1
