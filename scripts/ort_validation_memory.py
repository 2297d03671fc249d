"""What ONNX Runtime holds while validating an export, phase by phase, against the ORT term of
the export-memory formula (msar_export/bench/bounds.py; README, "Export memory").

Each file is validated as the validating image does it (export/validate.validate_file, with a
Reference of the validation shapes, random values, loaded from an .npz as the handoff does), in
its own child process with the validating image's environment (bench.probe.run_probe: the
process's RSS and RssAnon sampled every 25 ms).  The child reads VmRSS / VmHWM at the end of
each phase: the Reference loaded, the session made, the run; the session is dropped before the
verdict.  Per file:

    image      RSS after the session is made - the file - the references (12 B x tokens x V);
               its term: ORT_IMAGE + ORT_GRAPH x sublayers [+ the tensors under 1 MiB, inline]
    in flight  VmHWM - RSS after the session is made (inline: the initializer being moved)
    run        RSS after the run - RSS after the session is made (activations, output; external
               data: RssAnon, the data file's pages aside)

    python scripts/ort_validation_memory.py OUT.json MODEL.onnx[:SEQ[:OPTIONS]] ...
    python scripts/ort_validation_memory.py --table OUT.json      (the README's table)

SEQ: 19 by default (3 rows of SEQ tokens).  OPTIONS, comma-separated, change validation's
session (runners/ort_runner.py, low_memory) to see what each setting holds: noarena
(enable_cpu_mem_arena off), nopattern (enable_mem_pattern off), prepack (pre-packing back on),
folding (constant folding back on).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

VMS = ("VmHWM", "VmRSS", "RssAnon")


def _status() -> dict:
    fields = dict(ln.split(":", 1) for ln in open("/proc/self/status") if ":" in ln)
    return {k: int(fields[k].split()[0]) / 1024 for k in VMS}


def _change_session(options: set[str]) -> None:
    import onnxruntime as ort

    from msar_export.runners import ort_runner

    made, session = ort_runner._options, ort.InferenceSession

    def options_then_change(*a, **k):
        opts = made(*a, **k)
        opts.enable_cpu_mem_arena = "noarena" not in options
        opts.enable_mem_pattern = "nopattern" not in options
        if "prepack" in options:
            opts.add_session_config_entry("session.disable_prepacking", "0")
        return opts

    def session_with_folding(*a, disabled_optimizers=None, **k):
        return session(*a, **k)

    ort_runner._options = options_then_change
    if "folding" in options:
        ort.InferenceSession = session_with_folding


def child(model: str, seq: int, vocab: int, options: set[str]) -> None:
    import numpy as np

    from msar_export.export import validate
    from msar_export.runners import ort_runner

    _change_session(options)
    out = {"import": _status()}
    rng = np.random.default_rng(0)
    ref = validate.Reference(rng.integers(0, vocab, (3, seq)), rng.standard_normal((3, seq, vocab)),
                             rng.standard_normal((3, seq, vocab)).astype(np.float32))
    with tempfile.TemporaryDirectory() as tmp:  # through an .npz, as the handoff passes it
        ref.save(Path(tmp) / "r.npz")
        del ref
        ref = validate.Reference.load(Path(tmp) / "r.npz")
    out["reference"] = _status()
    init, logits = ort_runner.OrtGraph.__init__, ort_runner.OrtGraph.logits

    def init_then_read(self, *a, **k):
        init(self, *a, **k)
        out["session"] = _status()

    def logits_then_read(self, *a, **k):
        got = logits(self, *a, **k)
        out["run"] = _status()
        return got

    ort_runner.OrtGraph.__init__, ort_runner.OrtGraph.logits = init_then_read, logits_then_read
    validate.validate_file(Path(model), ref, False, "float32")
    out["end"] = _status()
    print(json.dumps(out))


def _model(model: Path) -> dict:
    """What the terms need to know of an exported file: its config, graph kind and bytes."""
    from msar_export.onnx_wire import load_without_weights

    meta = {p.key: p.value for p in load_without_weights(model).metadata_props}
    data = model.with_name(model.name + ".data")
    file_bytes = model.stat().st_size + (data.stat().st_size if data.is_file() else 0)
    return {"config": json.loads(meta["msar.config"]), "decomposed": meta["msar.decomposed"] == "true",
            "external_data": data.is_file(), "file_mib": file_bytes / 2**20}


def measure(model: Path, seq: int, options: str = "") -> dict:
    """The raw figures of one validation (the parts and terms are derived from them by `parts`)."""
    from msar_export.bench.probe import run_probe
    from msar_export.export.handoff import validation_env

    described = _model(model)
    r = run_probe([sys.executable, __file__, "--child", str(model), str(seq), str(described["config"]["vocab_size"]), options],
                  env=validation_env())
    if r["returncode"] != 0:
        raise SystemExit(f"{model}: {r['stderr'][-400:]}")
    return {"model": str(model), **described, "seq": seq, "options": options, "phases": json.loads(r["stdout"].strip().splitlines()[-1]),
            "tree_peak_mib": r["tree_peak_rss_mb"], "anon_peak_mib": r["tree_peak_anon_mb"]}


def parts(raw: dict) -> dict:
    """Each measured part beside its term in bench/bounds.py (MiB)."""
    from msar_export.bench.bounds import (ORT_GRAPH_MIB, ORT_IMAGE_MIB, heap_kept_bytes, largest_tensor_bytes,
                                          ort_activations_mib, ort_bound_mib)

    from msar_export.config import MSARConfig

    cfg, decomposed, external, file_mib = (MSARConfig.from_dict(raw["config"]), raw["decomposed"], raw["external_data"],
                                           raw["file_mib"])
    ph, tokens = raw["phases"], 3 * raw["seq"]
    session, run = ph["session"], ph["run"]
    references = 12 * tokens * cfg.vocab_size / 2**20
    weights_in_session = 0.0 if external else file_mib  # external data is mapped when the run reads it
    # the formula's terms are for the validation input (3 x 19); scaled here to this one's tokens
    bound_tokens = tokens / (3 * max(19, cfg.kmax + 7))
    return {"sublayers": cfg.n_sublayers, "d_model": cfg.d_model, "vocab": cfg.vocab_size, "decomposed": decomposed,
            "external_data": external, "tokens": tokens, "options": raw["options"], "file_mib": round(file_mib, 1),
            "image_mib": round(session["VmRSS"] - weights_in_session - references, 1),
            # inline, the image also keeps the small tensors' parsed copies (in its heap)
            "image_term_mib": round(ORT_IMAGE_MIB + ORT_GRAPH_MIB * cfg.n_sublayers
                                    + (0.0 if external else heap_kept_bytes(cfg) / 2**20), 1),
            "in_flight_mib": round(session["VmHWM"] - session["VmRSS"], 1),
            "in_flight_term_mib": 0.0 if external else round(largest_tensor_bytes(cfg) / 2**20, 1),
            # external data: the anonymous part (the run also maps the data file's pages)
            "run_mib": round(run["RssAnon"] - session["RssAnon"] if external else run["VmRSS"] - session["VmRSS"], 1),
            "run_term_mib": round(bound_tokens * ort_activations_mib(cfg, decomposed), 1),
            "peak_mib": round(max(ph["end"]["VmHWM"], raw["tree_peak_mib"]), 1), "anon_peak_mib": raw["anon_peak_mib"],
            "ort_bound_mib": round(ort_bound_mib(file_mib, cfg, False, False, external, decomposed), 1)
            if bound_tokens == 1 else None}


def table(raws: list[dict]) -> str:
    """The README's table: each measured part beside its term (MiB)."""
    lines = ["| sublayers, d, V | graph | weights MiB | tokens | session | image (term) | in flight (term) "
             "| run (term) | peak (ORT bound) | anonymous |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in map(parts, raws):
        bound = "" if r["ort_bound_mib"] is None else f" ({r['ort_bound_mib']:.0f})"
        lines.append(f"| {r['sublayers']}, {r['d_model']}, {r['vocab']} | {'decomposed' if r['decomposed'] else 'fused'} "
                     f"| {'external' if r['external_data'] else 'inline'} {r['file_mib']:.0f} | {r['tokens']} "
                     f"| {r['options'] or 'validation'} | {r['image_mib']:.0f} ({r['image_term_mib']:.0f}) "
                     f"| {r['in_flight_mib']:.0f} ({r['in_flight_term_mib']:.0f}) | {r['run_mib']:.0f} ({r['run_term_mib']:.0f}) "
                     f"| {r['peak_mib']:.0f}{bound} | {r['anon_peak_mib']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[0] == "--table":
        return print(table(json.loads(Path(argv[1]).read_text())))
    if argv[0] == "--child":
        return child(argv[1], int(argv[2]), int(argv[3]), set(filter(None, argv[4].split(","))))
    raws = []
    for spec in argv[1:]:
        path, seq, options = (spec.split(":") + ["", ""])[:3]
        raws.append(measure(Path(path), int(seq or 19), options))
        print(table(raws).splitlines()[-1], flush=True)
    Path(argv[0]).write_text(json.dumps(raws, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
