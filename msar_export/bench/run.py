"""`msar-export bench`: what each backend costs and what MSAR costs.

All timings of one run are taken in one process, round-robin across backends
and residual kinds, so machine noise hits every row alike; ratios are the
numbers to trust.  Memory is measured per backend in a child process."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..log import silent
from ..checkpoint import save_checkpoint
from ..config import MSARConfig
from ..fileio import atomic_write_text
from .models import native_available, random_model
from .paired import paired_ratios
from .steps import eager_decode_steps, ort_decode_steps
from .probe import cli_probe, python_probe
from .timing import interleaved, machine_description

KINDS = ("standard", "attnres", "msar")


@dataclass
class BenchSettings:
    # The model benchmarked; its residual kind is replaced by each of `kinds` in turn.
    model: MSARConfig = field(default_factory=lambda: MSARConfig(d_model=512, n_blocks=8, n_heads=8, n_kv_heads=4,
                                                                 mlp_hidden=1376, vocab_size=256, max_seq_len=4096))
    prefill_shapes: tuple[tuple[int, int], ...] = ((1, 512), (1, 128), (4, 256))
    decode_prompt: int = 64
    decode_steps: int = 32
    decode_batches: tuple[int, ...] = (1, 8)
    threads: int = 2
    warmup: int = 1
    repeats: int = 5
    pair_repeats: int = 7  # rounds of each goal ratio's pair (bench/paired.py)
    process_rounds: int = 4  # rounds of msar's goal ratios with one process per graph (bench/processes.py); 0: none
    compile: bool = True
    memory: bool = True
    export_probe_params: int = 0  # > 0: also export a checkpoint of about this many parameters
    kinds: tuple[str, ...] = KINDS

    def config(self, kind: str) -> MSARConfig:
        return dataclasses.replace(self.model, residual=kind)


QUICK = dict(model=MSARConfig(d_model=64, n_blocks=2, n_heads=4, n_kv_heads=2, mlp_hidden=128, vocab_size=256,
                              max_seq_len=4096), prefill_shapes=((1, 32),),
             decode_prompt=8, decode_steps=4, decode_batches=(1, 2), repeats=2, pair_repeats=2, process_rounds=0,
             compile=False, memory=False)


@dataclass
class Backend:
    """One way to run a model's prefill: prefill(ids), and the file it runs (ORT rows)."""

    name: str
    prefill: object
    onnx: str | None = None


def ort_backends(model, kind: str, workdir: Path, threads: int, log) -> tuple[list[Backend], dict, dict]:
    """The ONNX Runtime rows of one kind: (prefill backends, export figures, decoders by name).
    A file with msar nodes runs twice, on the native kernels (ort-native*) and on its function
    bodies (ort-function*); the native rows are left out when the library is not built."""
    from ..export import ExportOptions, export_model
    from ..runtime import OrtDecoder, OrtModel

    native = native_available()
    files = {"custom": ExportOptions(), "decomposed": ExportOptions(decomposed=True)}
    if kind == "msar":  # the other prefill forms (rows ort-native-retrieval, ort-function-scored, ...)
        files["retrieval"] = ExportOptions(mixer_op="retrieval")
        files["scored"] = ExportOptions(mixer_op="scored")
    if kind == "standard":
        files = {"decomposed": ExportOptions(decomposed=True)}
    backends, exports = [], {}
    for file, opts in files.items():
        path = workdir / f"{kind}-{file}.onnx"
        t0 = time.perf_counter()
        export_model(model, path, opts, validate=False)
        exports[file] = {"seconds": round(time.perf_counter() - t0, 2), "mb": round(path.stat().st_size / 1e6, 2)}
        log(f"  exported {kind}/{file} in {exports[file]['seconds']} s")
        suffix = "" if file == "custom" else f"-{file}"
        if kind == "standard":
            runs = {"ort": None}
        elif file == "decomposed":
            runs = {"ort-decomposed": None}
        else:
            runs = {f"ort-native{suffix}": "native", f"ort-function{suffix}": "function"} if native else \
                {f"ort-function{suffix}": "function"}
        for name, ort_ops in runs.items():
            ort = OrtModel(path, threads=threads, ort_ops=ort_ops).ort
            backends.append(Backend(name, lambda ids, g=ort: g.logits(ids.numpy()), onnx=str(path)))
    dec_path = workdir / f"{kind}-decode.onnx"
    export_model(model, dec_path, ExportOptions(decode=True, decomposed=kind == "standard"), validate=False)
    decoders = {"ort": OrtDecoder(dec_path, threads=threads)}  # native kernels when built
    if kind != "standard":
        decoders["ort-function"] = OrtDecoder(dec_path, threads=threads, ort_ops="function")
    return backends, exports, decoders


def try_compile(model, ids, log):
    try:
        compiled = torch.compile(model, dynamic=False)
        t0 = time.perf_counter()
        with torch.inference_mode():
            compiled(ids)
        log(f"  torch.compile warm-up {time.perf_counter() - t0:.0f} s")
        return compiled, None
    except Exception as e:  # compile needs a working C++ toolchain and inductor support
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def memory_probe(backend: str, path: str, shape) -> dict:
    B, T = shape
    if backend == "eager":
        code = (f"import torch; from msar_export import load_checkpoint; torch.set_num_threads(2); "
                f"m=load_checkpoint({path!r});\nwith torch.inference_mode(): m(torch.zeros({B},{T},dtype=torch.long))")
    else:
        code = (f"import numpy as np; from msar_export.runtime import OrtModel; "
                f"OrtModel({path!r}, threads=2).ort.logits(np.zeros(({B},{T}), np.int64))")
    # The child reports its own VmHWM: wait4's ru_maxrss keeps the forking parent's peak.
    code += "\nfrom msar_export.export.exporter import peak_rss_mb; print('PEAK', peak_rss_mb())"
    r = python_probe(code)
    if r["returncode"] != 0:
        return {"error": r["stderr"][-300:]}
    return {"peak_rss_mb": round(float(r["stdout"].split("PEAK")[-1]), 1)}


def export_probe(n_params: int, workdir: Path, log) -> dict:
    """Export a checkpoint of about n_params parameters in a child process:
    wall time and peak RSS against the checkpoint's size on disk."""
    d = 1024 if n_params >= 50e6 else 512
    per_block = 4 * d * d + 3 * d * (8 * d // 3)  # attention + SwiGLU MLP weights
    n_blocks = max(1, round((n_params - 256 * d) / per_block))
    cfg = MSARConfig(vocab_size=256, d_model=d, n_blocks=n_blocks, n_heads=d // 64, n_kv_heads=d // 128,
                     mlp_hidden=8 * d // 3, max_seq_len=4096, residual="msar")
    model = random_model(cfg)
    params = sum(p.numel() for p in model.parameters())
    ckpt = workdir / "probe-ckpt"
    save_checkpoint(model, ckpt)
    del model
    size_mb = (ckpt / "model.safetensors").stat().st_size / 1e6
    log(f"  export probe: {params / 1e6:.1f} M parameters, checkpoint {size_mb:.0f} MB")
    r = cli_probe("export", str(ckpt), "-o", str(workdir / "probe.onnx"), "--no-validate")
    # The export reports its own peak (VmHWM); wait4's ru_maxrss keeps the forking parent's peak.
    peak = float(r["stdout"].split("peak RSS:")[1].split("MB")[0]) if r["returncode"] == 0 else float("nan")
    return {"parameters": params, "checkpoint_mb": round(size_mb, 1), "seconds": round(r["seconds"], 1),
            "peak_rss_mb": round(peak, 1), "rss_over_checkpoint": round(peak / size_mb, 2),
            "returncode": r["returncode"]}


def run_bench(settings: BenchSettings, log=None) -> dict:
    log = log or silent
    torch.set_num_threads(settings.threads)
    result = {"machine": machine_description(settings.threads), "settings": asdict(settings), "prefill": [],
              "decode": [], "exports": {}, "memory": {}, "skipped": {}}
    try:
        import tensorrt  # noqa: F401

        result["skipped"]["tensorrt"] = "benchmarking engines is not wired in yet; use trtexec on the built plan"
    except Exception as e:
        result["skipped"]["tensorrt"] = f"import tensorrt failed ({type(e).__name__}); no TensorRT on this machine"
    with tempfile.TemporaryDirectory(prefix="msar-bench-") as tmp:
        workdir = Path(tmp)
        prefill_fns, decode_fns, ckpts = {}, {}, {}
        for kind in settings.kinds:
            log(f"== {kind}")
            model = random_model(settings.config(kind))
            ckpts[kind] = save_checkpoint(model, workdir / f"ckpt-{kind}")
            backends, exports, decoders = ort_backends(model, kind, workdir, settings.threads, log)
            result["exports"][kind] = exports
            compiled, why = (try_compile(model, torch.zeros(settings.prefill_shapes[0], dtype=torch.long), log)
                             if settings.compile else (None, "disabled (--no-compile)"))
            if why:
                result["skipped"][f"torch.compile/{kind}"] = why
            for shape in settings.prefill_shapes:
                ids = torch.randint(0, settings.model.vocab_size, shape, generator=torch.Generator().manual_seed(0))

                def eager(ids=ids, m=model):
                    with torch.inference_mode():
                        m(ids)

                prefill_fns[(kind, "eager", shape)] = eager
                if compiled is not None:
                    def comp(ids=ids, m=compiled):
                        with torch.inference_mode():
                            m(ids)

                    prefill_fns[(kind, "torch.compile", shape)] = comp
                for b in backends:
                    prefill_fns[(kind, b.name, shape)] = lambda ids=ids, f=b.prefill: f(ids)
                if settings.memory and shape == settings.prefill_shapes[0]:
                    result["memory"][kind] = {"eager": memory_probe("eager", str(ckpts[kind]), shape)}
                    for b in backends:
                        result["memory"][kind][b.name] = memory_probe("ort", b.onnx, shape)
            for batch in settings.decode_batches:
                prompt = torch.randint(0, settings.model.vocab_size, (batch, settings.decode_prompt),
                                       generator=torch.Generator().manual_seed(1))
                decode_fns[(kind, "eager", batch)] = eager_decode_steps(model, prompt, settings.decode_steps)
                for name, decoder in decoders.items():
                    decode_fns[(kind, name, batch)] = ort_decode_steps(decoder, prompt, settings.decode_steps)
        log("== timing prefill (round-robin over every backend and kind)")
        timings = interleaved({k: f for k, f in prefill_fns.items()}, settings.warmup, settings.repeats)
        for (kind, backend, shape), t in timings.items():
            tokens = shape[0] * shape[1]
            result["prefill"].append({"kind": kind, "backend": backend, "batch": shape[0], "seq": shape[1],
                                      **t.as_dict(), "tokens_per_s": round(tokens / t.median_s, 1)})
        log("== timing decode steps")
        dt = interleaved(decode_fns, settings.warmup, settings.repeats)
        for (kind, backend, batch), t in dt.items():
            result["decode"].append({"kind": kind, "backend": backend, "batch": batch, "prompt": settings.decode_prompt,
                                     "steps": settings.decode_steps, **t.as_dict(),
                                     "tokens_per_s": round(batch * settings.decode_steps / t.median_s, 1)})
        log("== goal ratios as pairs (each row alternated with the standard model's alone)")
        result["paired"] = paired_ratios(prefill_fns, decode_fns, settings.prefill_shapes[0], settings.decode_batches,
                                         settings.warmup, settings.pair_repeats, log)
        if not native_available():
            result["skipped"]["ort-native"] = "the native msar kernels are not built (scripts/setup_env.sh)"
        elif settings.process_rounds and {"msar", "standard"} <= set(settings.kinds):
            log("== msar's goal ratios with each graph in a process of its own (bench/processes.py)")
            result["paired"].update(process_pairs(workdir, settings, log))
        from .guard import guard_ratios

        log("== guard model (tests/test_bench_guard.py compares against these)")
        result["guard"] = guard_ratios()
        if settings.export_probe_params:
            result["export_probe"] = export_probe(settings.export_probe_params, workdir, log)
    result["ratios"] = ratios(result)
    return result


def process_pairs(workdir: Path, settings: BenchSettings, log) -> dict:
    """msar's native goal rows (the scored prefill file, the decode file) against the standard
    model's, each graph in a process of its own (bench/processes.py), keyed as the in-process
    pairs with ", one process each" added."""
    from .processes import goal_ratios

    B, T = settings.prefill_shapes[0]
    files = {("standard", "prefill"): workdir / "standard-decomposed.onnx", ("msar", "prefill"): workdir / "msar-scored.onnx",
             ("standard", "decode"): workdir / "standard-decode.onnx", ("msar", "decode"): workdir / "msar-decode.onnx"}
    res = goal_ratios(files, T, settings.decode_batches, settings.process_rounds, settings.threads,
                      settings.model.vocab_size, log, prefill=B == 1)
    out = {}
    if "prefill" in res:
        out["msar/standard prefill time in ORT (ort-native-scored), one process each"] = res["prefill"]
    for batch in settings.decode_batches:
        out[f"standard/msar decode tokens/s, batch {batch} (ort), one process each"] = res[f"decode_b{batch}"]
    return out


def _median(result, kind, backend, batch, seq):
    for r in result["prefill"]:
        if (r["kind"], r["backend"], r["batch"], r["seq"]) == (kind, backend, batch, seq):
            return r["median_s"]
    return None


def ratios(result: dict) -> dict:
    """The goal ratios (issues 6 and 21): the pairs' medians where the run measured pairs
    (bench/paired.py), else the ratio of the round-robin medians."""
    B, T = result["settings"]["prefill_shapes"][0]
    out = {"shape": f"{B}x{T}"}
    std = _median(result, "standard", "ort", B, T)
    for kind in ("msar", "attnres"):
        eager = _median(result, kind, "eager", B, T)
        for b in sorted({r["backend"] for r in result["prefill"] if r["kind"] == kind and r["backend"].startswith("ort")}):
            t = _median(result, kind, b, B, T)
            if t and std:
                out[f"{kind}/standard prefill time in ORT ({b})"] = round(t / std, 2)
            if t and eager:
                out[f"{kind} prefill speed-up {b} vs eager"] = round(eager / t, 2)
    dec = {(r["kind"], r["backend"], r.get("batch", 1)): r["tokens_per_s"] for r in result["decode"]}
    for (kind, backend, batch), tps in sorted(dec.items()):
        if kind != "standard" and backend.startswith("ort") and ("standard", "ort", batch) in dec:
            out[f"standard/{kind} decode tokens/s, batch {batch} ({backend})"] = round(dec[("standard", "ort", batch)] / tps, 2)
        if kind == "msar" and backend.startswith("ort") and (kind, "eager", batch) in dec:
            out[f"msar decode tokens/s {backend} vs eager, batch {batch}"] = round(tps / dec[(kind, "eager", batch)], 2)
    for key, pair in result.get("paired", {}).items():
        out[key] = pair["median"]
    return out


def write_results(result: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "results.json", json.dumps(result, indent=1) + "\n")
    from .report import plot_results

    plot_results(result, out_dir / "chart.png")
