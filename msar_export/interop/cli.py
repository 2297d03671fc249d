"""`msar-export onnx ...`: the ecosystem jobs that stock tools get wrong on
files with overloaded msar functions (see msar_export/interop/__init__.py).

Registered through msar_export.cli.REGISTRARS; imports nothing heavy here."""

from __future__ import annotations

from ..numbers import BATCH, COUNT, OPSET, SEED, TOKEN_ID

DESCRIPTION = """Run standard ONNX tools on an msar-export file without losing its msar
functions. convert-opset: onnx.version_converter for the graph and every
function body (the converter alone drops them). sanitize: polygraphy surgeon
sanitize (cleanup, toposort, constant folding) with the function overloads
that onnx-graphsurgeon drops put back. repair: put those overloads back in a
file another tool already rewrote. reference: run onnx's ReferenceEvaluator
(which keys functions by name alone) with each node's own overload, and
compare with ONNX Runtime."""


def _rewrite(a, transform, check_functions: bool = True):
    """Load a.onnx with its weights, transform it, and write the result to a.output
    (only if ONNX Runtime loads it; external data kept external), with the input's model
    fields (metadata_props, producer, doc_string, ...: model_fields.py).  Returns (input, output)."""
    from .files import check_rewrite_outputs, load_whole, save_whole
    from .model_fields import copy_model_fields

    check_rewrite_outputs(a.onnx, a.output, getattr(a, "functions_from", None))
    model, external = load_whole(a.onnx, check_functions)
    n_in = len(model.graph.node)
    fields = copy_model_fields(model, type(model)())  # taken before a transform that works in place
    out = copy_model_fields(fields, transform(model))
    _check(out, a.output)
    save_whole(out, a.output, external)
    return n_in, out


def cmd_convert_opset(a) -> int:
    from .opset import convert_opset

    _, out = _rewrite(a, lambda m: convert_opset(m, a.opset))
    print(f"{a.output}: opset {a.opset}, {len(out.functions)} functions kept")
    return 0


def cmd_sanitize(a) -> int:
    from .surgeon import sanitize

    n_in, out = _rewrite(a, lambda m: sanitize(m, fold_constants=not a.no_fold_constants))
    print(f"{a.output}: {len(out.graph.node)} nodes (was {n_in}), {len(out.functions)} functions kept")
    return 0


def cmd_repair(a) -> int:
    from .files import load_whole
    from .overloads import missing_functions, rebuild_functions, restore_overloads

    fixed = rebuilt = 0

    def repair(model):
        nonlocal fixed, rebuilt
        fixed = restore_overloads(model)
        if missing_functions(model) and a.functions_from:
            source, _ = load_whole(a.functions_from)
            have = {(f.domain, f.name, f.overload) for f in model.functions}
            model.functions.extend(f for f in source.functions if (f.domain, f.name, f.overload) not in have)
        # Bodies a tool deleted (onnxslim keeps one per name) and --functions-from did not
        # supply are written again from the file's msar.config.
        rebuilt = rebuild_functions(model)
        return model

    _, out = _rewrite(a, repair, check_functions=False)
    print(f"{a.output}: {fixed} overloads restored, {rebuilt} function bodies rebuilt, {len(out.functions)} functions")
    return 0


def cmd_reference(a) -> int:
    import numpy as np

    from ..errors import InputError
    from ..verdict import rel_err
    from ..fileio import check_outputs
    from .files import inputs_of, load_whole
    from .reference import reference_evaluator
    from .run import seeded_feeds

    if not (1 <= a.batch <= 64 and 1 <= a.seq <= 4096):
        raise InputError("--batch must be 1..64 and --seq 1..4096")
    inputs = inputs_of(a.onnx)
    check_outputs([a.save], inputs)  # --save onto the model once replaced it with a .npy
    model, _ = load_whole(a.onnx)
    feeds = seeded_feeds(model, a.batch, a.seq, a.seed)
    with np.errstate(over="ignore"):  # the reference Sigmoid overflows exp() on large logits, correctly
        ref = reference_evaluator(model).run(["logits"], feeds)[0].astype(np.float64)
    ort_out = _ort_logits(a.onnx, feeds)
    err = rel_err(ort_out, ref)
    print(f"{a.onnx}: logits {list(ref.shape)} by onnx.reference.ReferenceEvaluator; "
          f"ONNX Runtime on the same file differs by max|diff|/max|ref| = {err:.2e}")
    if a.save:
        from ..fileio import atomic_path

        with atomic_path(a.save, inputs) as tmp, open(tmp, "wb") as f:
            np.save(f, ref.astype(np.float32))
    return 0 if np.isfinite(ref).all() else 1


def _ort_logits(path, feeds):
    import numpy as np

    from ..runtime import open_session

    session = open_session(path, providers=["cpu"])
    return session.run(["logits"], feeds)[0].astype(np.float64)


def _check(model, target) -> None:
    """The written file must load in ONNX Runtime: a tool's output that does not is refused, not saved."""
    from ..errors import OnnxModelError
    from ..runners.ort_runner import open_session

    if model.ByteSize() >= 2**31:
        return  # ORT cannot take it from memory; it is checked when loaded from the file
    try:
        open_session(model.SerializeToString(), providers=["cpu"])
    except OnnxModelError as e:
        raise OnnxModelError(f"{target}: the converted model does not load in ONNX Runtime "
                             f"({e.cause[:300]}); nothing written") from None


def cmd_genai(a) -> int:
    from .genai import write_genai_folder

    summary = write_genai_folder(a.checkpoint, a.output, dtype=a.dtype, opset=a.opset, trust_pickle=a.trust_pickle,
                                 validate=not a.no_validate, eos_token_id=a.eos_token_id)
    print(f"{a.output}: ONNX Runtime GenAI folder ({summary['dtype']} decode graph, tokenizer: {summary['tokenizer']}, "
          f"end token {summary['eos_token_id']}, native msar kernels: {'yes' if summary['native_kernels'] else 'no'}); "
          f"load it with onnxruntime_genai.Model({str(a.output)!r})")
    return 0


def register_genai(subparsers) -> None:
    from ..cli_common import add_dtype, add_ort_ops, add_trust_pickle

    g = subparsers.add_parser("genai", help="a folder ONNX Runtime GenAI loads (og.Model(DIR)): decode graph, "
                                            "genai_config.json, tokenizer, native kernels")
    g.add_argument("checkpoint")
    g.add_argument("-o", "--output", required=True, help="output folder (new, or one msar-export genai wrote)")
    add_dtype(g, "float32", "weight dtype of the decode graph")
    g.add_argument("--opset", type=OPSET, default=18)
    g.add_argument("--eos-token-id", type=TOKEN_ID, default=None,
                   help="end token (also the pad token) GenAI stops on; default 0 (NUL) for byte-level models")
    g.add_argument("--no-validate", action="store_true", help="skip the ONNX Runtime vs eager check of the decode graph")
    add_ort_ops(g)
    add_trust_pickle(g)
    g.set_defaults(func=cmd_genai)


def register(subparsers) -> None:
    register_genai(subparsers)
    p = subparsers.add_parser("onnx", help="standard ONNX tools on msar-export files, functions kept",
                              description=DESCRIPTION)
    sub = p.add_subparsers(dest="onnx_command", required=True, metavar="ACTION")
    c = sub.add_parser("convert-opset", help="onnx.version_converter, function bodies converted and kept")
    c.add_argument("onnx")
    c.add_argument("-o", "--output", required=True)
    c.add_argument("--opset", type=OPSET, required=True, help="target default-domain opset (upgrades: 18 -> 19..23)")
    c.set_defaults(func=cmd_convert_opset)
    s = sub.add_parser("sanitize", help="polygraphy surgeon sanitize, function overloads kept")
    s.add_argument("onnx")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--no-fold-constants", action="store_true", help="cleanup and toposort only")
    s.set_defaults(func=cmd_sanitize)
    r = sub.add_parser("repair", help="restore the overloads another tool dropped (and functions, from the original)")
    r.add_argument("onnx")
    r.add_argument("-o", "--output", required=True)
    r.add_argument("--functions-from", metavar="ORIGINAL", help="the file msar-export wrote, for bodies a tool deleted")
    r.set_defaults(func=cmd_repair)
    e = sub.add_parser("reference", help="run onnx's ReferenceEvaluator with each node's own overload")
    e.add_argument("onnx")
    e.add_argument("--batch", type=BATCH, default=2)
    e.add_argument("--seq", type=COUNT, default=7)
    e.add_argument("--seed", type=SEED, default=0)
    e.add_argument("--save", metavar="NPY", help="write the logits (float32 .npy)")
    e.set_defaults(func=cmd_reference)
