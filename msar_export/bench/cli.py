"""`msar-export bench` subcommand."""

from __future__ import annotations

from pathlib import Path

from ..cli_common import say
from ..numbers import MIB, MPARAMS, SIZE, THREADS, machine_threads


def readme_block(a) -> tuple[str, str] | None:
    """The markers of the README block this run of `bench` rewrites (None: the mode writes none),
    in the order cmd_bench picks its mode."""
    if a.export_scaling:
        from .scaling import SCALING_BEGIN, SCALING_END

        return SCALING_BEGIN, SCALING_END
    if a.export_memory:
        from .memory import MEMORY_BEGIN, MEMORY_END

        return MEMORY_BEGIN, MEMORY_END
    if a.depth_sweep:
        from .depth import BEGIN, END

        return BEGIN, END
    if a.width_sweep is not None:
        from .width import BEGIN, END

        return BEGIN, END
    if a.mixer:
        return None
    from .report import BEGIN, END

    return BEGIN, END


def cmd_bench(a) -> int:
    import json

    from ..errors import InputError
    from .report import markdown_table, readme_with_block, update_readme
    from .run import QUICK, BenchSettings, run_bench, write_results

    if a.width_sweep is not None and a.depth_sweep:
        raise InputError("--width-sweep and --depth-sweep are separate runs: give one")
    block = readme_block(a)
    if a.update_readme and block is not None:
        readme_with_block(Path(a.update_readme), *block)  # before any run: a late failure would lose its results
    if a.export_scaling:
        from .scaling import KIND_FLAGS, run_export_scaling, scaling_table, write_scaling

        try:
            depths = tuple(int(x) for x in a.depths.split(","))
            widths = tuple(int(x) for x in a.widths.split(","))
        except ValueError:
            raise InputError(f"--depths/--widths take comma-separated integers, got {a.depths!r} / {a.widths!r}")
        kinds = tuple(k.strip() for k in a.kinds.split(","))
        if not set(kinds) <= set(KIND_FLAGS) or min(depths + widths) < 1:
            raise InputError(f"--kinds must be from {list(KIND_FLAGS)} and depths/widths positive")
        res = run_export_scaling(depths, widths, kinds, validate=a.validate, log=say)
        write_scaling(res, Path(a.out))
        print(scaling_table(res))
        if a.update_readme:
            from .scaling import update_readme_scaling

            update_readme_scaling(Path(a.update_readme), res)
        print(f"wrote {Path(a.out) / 'export_scaling.json'} and {Path(a.out) / 'export_scaling.png'}")
        return 0 if all(r["returncode"] == 0 for r in res["rows"]) else 1
    if a.export_memory:
        from .memory import (LARGE_VARIANTS, MIN_AVAILABLE_MIB, VARIANTS, memory_config, memory_table,
                             run_export_memory, write_memory)

        known = dict(VARIANTS + LARGE_VARIANTS)
        wanted = [v.strip() for v in a.variants.split(",")]
        variants = VARIANTS if a.variants == "all" else [(v, known[v]) for v in dict.fromkeys(wanted) if v in known]
        if not variants:
            raise InputError(f"--variants: none of {a.variants!r} is one of {list(known)}")
        try:
            nb, d, vocab = (int(x) for x in a.memory_shape.split(","))
        except ValueError:
            raise InputError(f"--memory-shape takes n_blocks,d_model,vocab, got {a.memory_shape!r}") from None
        shard = None if a.shard_mb is None else int(a.shard_mb * 2**20)
        res = run_export_memory(memory_config(nb, d, vocab), variants, a.memory_work, max_shard_size=shard,
                                min_available_mib=a.min_available_mib or MIN_AVAILABLE_MIB, log=say)
        write_memory(res, Path(a.out), a.memory_name)
        print(memory_table(res))
        if a.update_readme:
            from .memory import saved_results, update_readme_memory

            update_readme_memory(Path(a.update_readme), saved_results(Path(a.out)))
        return 0 if all(r["returncode"] == 0 for r in res["rows"]) else 1
    if a.depth_sweep:
        from .depth import depth_table, run_depth_sweep, write_depth_sweep

        try:
            depths = tuple(int(x) for x in a.depth_sweep.split(","))
        except ValueError:
            raise InputError(f"--depth-sweep takes comma-separated block counts, got {a.depth_sweep!r}") from None
        if min(depths) < 1:
            raise InputError("--depth-sweep: block counts must be positive")
        res = run_depth_sweep(depths, threads=a.threads, repeats=a.repeats or 5, log=say)
        write_depth_sweep(res, Path(a.out), Path(a.update_readme) if a.update_readme else None)
        print(depth_table(res))
        return 0
    if a.width_sweep is not None:
        from .width import run_width_sweep, widened, width_table, write_width_sweep

        try:
            widths = tuple(int(x) for x in a.width_sweep.split(","))
            for d in widths:
                widened(BenchSettings().model, d)
        except ValueError as e:
            raise InputError(f"--width-sweep takes comma-separated widths ({e})") from None
        if len(set(widths)) != len(widths):
            raise InputError(f"--width-sweep: each width once, got {a.width_sweep!r}")
        res = run_width_sweep(widths, threads=a.threads, repeats=a.repeats or 7, log=say)
        write_width_sweep(res, Path(a.out), Path(a.update_readme) if a.update_readme else None)
        print(width_table(res))
        return 0
    if a.mixer:
        from ..fileio import atomic_write_text
        from .mixer import run_mixer_bench

        small = dict(sources=(3,), widths=(64,), tokens=(64,), repeats=2) if a.quick else {}
        res = run_mixer_bench(threads=a.threads, log=say, **small)
        Path(a.out).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(a.out) / "mixer.json", json.dumps(res, indent=1) + "\n")
        print(f"copy bandwidth {res['copy_bandwidth_gbs']} GB/s; wrote {Path(a.out) / 'mixer.json'}")
        return 0
    s = BenchSettings(**QUICK) if a.quick else BenchSettings()
    s.threads, s.repeats = a.threads, a.repeats or s.repeats
    s.compile = s.compile and not a.no_compile
    s.export_probe_params = int(a.export_probe * 1e6)
    result = run_bench(s, log=say)
    out = Path(a.out)
    write_results(result, out)
    print(markdown_table(result))
    print(json.dumps(result["ratios"], indent=1))
    if a.update_readme:
        update_readme(Path(a.update_readme), result)
    print(f"wrote {out / 'results.json'} and {out / 'chart.png'}")
    return 0


def register(sub) -> None:
    b = sub.add_parser("bench", help="benchmark eager / torch.compile / ONNX Runtime (/ TensorRT) for all residual kinds")
    b.add_argument("-o", "--out", default="runs/bench", help="directory for results.json and chart.png")
    b.add_argument("--threads", type=THREADS, default=min(2, machine_threads()))
    b.add_argument("--repeats", type=SIZE, default=0,
                   help="timed runs per backend (default 5); --width-sweep: rounds of each pair (default 7)")
    b.add_argument("--quick", action="store_true", help="tiny model and shapes (a smoke run)")
    b.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    b.add_argument("--export-probe", type=MPARAMS, default=0, metavar="MPARAMS",
                   help="also export a checkpoint of about this many million parameters (time, peak RSS)")
    b.add_argument("--update-readme", metavar="README", help="rewrite the README's bench table from this run")
    b.add_argument("--mixer", action="store_true",
                   help="only the mixer microbenchmark (eager vs the FusedMixer node in ORT, bytes-moved floor)")
    b.add_argument("--width-sweep", metavar="WIDTHS", default=None,
                   help="only the goal ratios (msar/standard in ORT: scored prefill, decode batch 1 and 8) against "
                        "width at the bench's depth, e.g. 512,1024, in-process pairs and one process per graph "
                        "(width_sweep.json)")
    b.add_argument("--depth-sweep", metavar="BLOCKS", default=None,
                   help="only msar/standard prefill time in ORT against depth, e.g. 8,16,32 (native kernels and "
                        "function bodies, with the multiply-add model; depth_sweep.json)")
    b.add_argument("--export-scaling", action="store_true",
                   help="only export time, peak RSS, node count and file size per graph kind vs depth (JSON + PNG)")
    b.add_argument("--depths", default="4,8,16,24,48", help="--export-scaling: n_blocks values")
    b.add_argument("--widths", default="128", help="--export-scaling: d_model values")
    b.add_argument("--kinds", default="default,decomposed,decode", help="--export-scaling: graph kinds")
    b.add_argument("--validate", action="store_true", help="--export-scaling: include export validation")
    b.add_argument("--export-memory", action="store_true",
                   help="only the whole-process peak RSS of `export` (validation included) per graph kind against "
                        "the checkpoint's bytes (JSON + PNG)")
    b.add_argument("--memory-shape", default="24,1024,32000", metavar="BLOCKS,D_MODEL,VOCAB",
                   help="--export-memory: the random checkpoint's shape (default about 320 M parameters)")
    b.add_argument("--variants", default="all", help="--export-memory: comma-separated variant labels, or all")
    b.add_argument("--memory-name", default="export_memory", help="--export-memory: JSON/PNG file name stem")
    b.add_argument("--shard-mb", type=MIB, default=None, metavar="MIB",
                   help="--export-memory: write the checkpoint in shards of at most this size (default: one file "
                        "up to 5 GB). The larger-than-memory row: --memory-shape 34,4096,32000 --shard-mb 5000 "
                        "--variants 'default --external-data' --memory-name export_memory_large")
    b.add_argument("--memory-work", type=Path, default=None, metavar="DIR",
                   help="--export-memory: where the checkpoint and exports are made (removed after)")
    b.add_argument("--min-available-mib", type=MIB, default=None, metavar="MIB",
                   help="--export-memory: kill a run (its whole process tree; the row fails) when the system's "
                        "MemAvailable falls below this (default 2 GiB)")
    b.set_defaults(func=cmd_bench)
