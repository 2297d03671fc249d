"""Options several subcommands share, defined once: one spelling, one grammar, one meaning.

--plugins LIB [LIB ...]   TensorRT plugin libraries; repeatable, and each use may name several
--dtype P                 the precision the model computes in: export writes it, build checks
                          the file has it, check judges TensorRT at it (verdict.PRECISIONS)
--shapes BxT[,BxT...]     token batch shapes to run (engine optimisation profiles are
                          `build --profile`)
--trust-pickle            allow model.pt / pytorch_model.bin checkpoints (weights_only=True)
"""

from __future__ import annotations

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
