"""`msar-export` command line: a thin layer over the library API.

User errors (`MsarError`) print one line on stderr and exit 2.  Any other
exception is a bug in msar-export: its traceback is kept and the exit code is 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli_export import cmd_export
from .cli_common import Parser, add_dtype, add_ort_ops, add_plugins, add_trust_pickle, run_command, say  # noqa: F401  (run_command, Parser: also used through msar_export.cli)
from .errors import InputError
from .export.report import MIXER_OPS
from .numbers import COUNT, OPSET, POSITIVE, SEED, SIZE, THREADS, machine_threads


# Modules that add their own subcommands: each has `register(subparsers)`,
# imports nothing heavy at module level and sets `func` on its parser.
REGISTRARS: tuple[str, ...] = (
    "msar_export.compare.cli",
    "msar_export.bench.cli",
    "msar_export.engines.cli",
    "msar_export.serving.cli",
    "msar_export.interop.cli",
)


def cmd_train(a) -> int:
    from .train import DEFAULT_CONFIG, TrainSettings, train_all

    settings = TrainSettings(seed=a.seed, threads=a.threads)
    if a.steps is not None:
        settings.steps = a.steps
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in ("msar", "standard", "attnres")]
    if bad:
        raise InputError(f"--kinds: unknown residual kind(s) {bad}; use msar, standard, attnres")
    summary = train_all(Path(a.out), kinds, DEFAULT_CONFIG, settings, progress=say)
    print(f"eval losses: {summary['eval_loss']} -> {Path(a.out) / 'eval_losses.json'}, {Path(a.out) / 'loss_curve.png'}")
    return 0


def _encode_prompt(text: str):
    import torch

    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # argv bytes that are not UTF-8 arrive as lone surrogates
        raise InputError("--prompt is not valid UTF-8 text") from None
    if not data:
        raise InputError("--prompt is empty; give at least one character")
    return torch.tensor([list(data)], dtype=torch.long)


def cmd_generate(a) -> int:
    from .checkpoint import load_checkpoint
    from .model import generate

    ids = _encode_prompt(a.prompt)
    if a.engine and not a.onnx:
        raise InputError("--engine needs --onnx: the decode graph the engine was built from (its build record is checked)")
    if a.engine:
        from .runners.trt import TrtDecoder

        out = TrtDecoder(a.engine, a.onnx, a.plugins).generate(ids, max_new_tokens=a.max_new_tokens,
                                                               do_sample=a.sample, temperature=a.temperature,
                                                               top_k=a.top_k, seed=a.seed)
    elif a.onnx:
        from .runners.ort_runner import THREADS
        from .runtime import OrtDecoder

        out = OrtDecoder(a.onnx, threads=a.threads or THREADS["generate"]).generate(ids, max_new_tokens=a.max_new_tokens, do_sample=a.sample,
                                                             temperature=a.temperature, top_k=a.top_k, seed=a.seed)
    else:
        model = load_checkpoint(a.checkpoint, trust_pickle=a.trust_pickle)
        if model.cfg.vocab_size < 256:
            raise InputError(f"this checkpoint's vocabulary has {model.cfg.vocab_size} tokens; byte prompts need 256")
        out = generate(model, ids, max_new_tokens=a.max_new_tokens, do_sample=a.sample,
                       temperature=a.temperature, top_k=a.top_k, seed=a.seed)
    print(bytes(out[0].tolist()).decode("utf-8", errors="replace"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="msar-export", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    t = sub.add_parser("train", help="train the default byte-level models (msar, standard, attnres) on stdlib sources")
    t.add_argument("-o", "--out", default="runs/default", help="output directory (one checkpoint per kind)")
    t.add_argument("--steps", type=COUNT, default=None, help="optimizer steps (default: TrainSettings.steps, 300)")
    t.add_argument("--seed", type=SEED, default=1234)
    t.add_argument("--threads", type=THREADS, default=min(2, machine_threads()))
    t.add_argument("--kinds", default="msar,standard,attnres", help="comma-separated residual kinds")
    t.set_defaults(func=cmd_train)

    g = sub.add_parser("generate", help="generate text from a checkpoint (eager) or a decode ONNX graph")
    g.add_argument("checkpoint", nargs="?", help="checkpoint directory")
    g.add_argument("--onnx", help="decode graph from `export --decode` (runs in ONNX Runtime instead of PyTorch)")
    g.add_argument("--engine", metavar="MODEL.plan", help="TensorRT engine of the --onnx decode graph (runs it instead)")
    add_plugins(g, "plugin libraries the engine needs")
    g.add_argument("--prompt", default="def ")
    g.add_argument("--max-new-tokens", type=SIZE, default=64)
    g.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    g.add_argument("--temperature", type=POSITIVE, default=1.0)
    g.add_argument("--top-k", type=COUNT, default=None)
    g.add_argument("--seed", type=SEED, default=0)
    g.add_argument("--threads", type=THREADS, default=None,
                   help="ONNX Runtime threads (default: runners.ort_runner.THREADS['generate'])")
    add_ort_ops(g)
    add_trust_pickle(g)
    g.set_defaults(func=cmd_generate)

    e = sub.add_parser("export", help="export a checkpoint to ONNX (msar custom ops with function bodies)")
    e.add_argument("checkpoint")
    e.add_argument("-o", "--output", required=True, help="output .onnx path")
    e.add_argument("--decode", action="store_true", help="incremental-decoding graph with KV cache and conv state")
    e.add_argument("--decomposed", action="store_true", help="standard ONNX ops only, no msar custom nodes")
    add_dtype(e, "float32", "weight dtype; a float32 checkpoint is converted tensor by tensor as it is read")
    e.add_argument("--external-data", action="store_true",
                   help="weights in OUTPUT.data beside the .onnx file (always so over protobuf's 2 GB limit)")
    e.add_argument("--opset", type=OPSET, default=18)
    e.add_argument("--mixer-op", choices=MIXER_OPS, default="fused",
                   help="msar prefill: FusedMixer nodes (TensorRT plugin path), shared views + DepthRetrieval "
                        "nodes, or scored: each source's scores made once (SourceScores) + ScoredMixer nodes "
                        "(ONNX Runtime only; TensorRT takes fused). Decode graphs and attnres/standard ignore it")
    e.add_argument("--no-validate", action="store_true", help="skip the ONNX Runtime vs eager check after export")
    add_ort_ops(e)
    add_trust_pickle(e)
    e.set_defaults(func=cmd_export)

    import importlib

    for mod in REGISTRARS:
        importlib.import_module(mod).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate" and not (args.checkpoint or args.onnx):
        print("msar-export generate: error: give a checkpoint directory or --onnx MODEL", file=sys.stderr)
        return 2
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
