"""`msar-export triton-repo`, `serve` and `loadtest` (registered through msar_export.cli.REGISTRARS)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from ..cli_options import add_plugins, add_trust_pickle
from ..errors import InputError
from ..graph_spec import META_CONFIG, META_GRAPH

SERVE_EPILOG = """\
SRC is a checkpoint directory (both graphs are exported first, into --workdir, and
reused while the checkpoint is unchanged) or one or two exported ONNX files (a
prefill graph serves `logits`; a decode graph serves `generate`, and `logits` too
when no prefill graph is given).  The server is Triton's own `tritonserver` with its
Python backend, from .venv-triton (scripts/setup_triton_env.sh); it listens on
127.0.0.1 only.  Ctrl-C (or SIGTERM) stops it: in-flight requests finish first.
"""

LOADTEST_EPILOG = """\
Exit status: 0 all requests answered correctly: logits within msar_export.verdict's
bound of the eager float64 run (--checkpoint) or within --rtol of the served graph
at batch 1, generated tokens equal to greedy ONNX Runtime decoding; 1 errors or
mismatches; 2 bad usage.
Runs in .venv-triton (tritonclient) when this environment lacks tritonclient.
"""


def _say(msg: str) -> None:
    print(f"msar-export: {msg}", file=sys.stderr, flush=True)


def register(subparsers) -> None:
    import argparse

    r = subparsers.add_parser("triton-repo", help="Triton model repository (onnxruntime / tensorrt backend) for a graph or engine",
                              description="Write a Triton model repository for a stock backend: onnxruntime for "
                                          "MODEL.onnx, tensorrt for MODEL.plan. config.pbtxt is validated with Triton's "
                                          "ModelConfig schema; the repository is written atomically.")
    r.add_argument("model", metavar="MODEL.onnx|MODEL.plan")
    r.add_argument("-o", "--output", required=True, metavar="REPO", help="repository directory (replaced atomically)")
    r.add_argument("--name", help="model name (default: the file's stem)")
    r.add_argument("--max-batch", type=int, default=8, help="max_batch_size when the graph has a leading batch dim")
    r.add_argument("--no-batching", action="store_true", help="no dynamic_batching block")
    r.add_argument("--queue-delay-us", type=int, default=500, help="dynamic batcher max_queue_delay_microseconds")
    r.add_argument("--instances", type=int, default=1, help="instance_group count")
    r.add_argument("--kind", choices=("cpu", "gpu"), help="instance kind (default: gpu for engines, cpu for ONNX)")
    add_plugins(r, "TensorRT plugin libraries to copy in")
    r.add_argument("--onnx", metavar="MODEL.onnx", help="for an engine: the ONNX graph it was built from (its I/O)")
    r.add_argument("--no-validate", action="store_true", help="skip the ModelConfig schema check")
    r.add_argument("--force", action="store_true",
                   help="replace REPO even if it is not a repository msar-export wrote")
    r.set_defaults(func=cmd_triton_repo)

    s = subparsers.add_parser("serve", help="serve logits / generate on a real Triton server (127.0.0.1)",
                              description=__doc__.splitlines()[0], epilog=SERVE_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("src", nargs="+", metavar="CKPT|MODEL.onnx", help="checkpoint directory, or prefill and/or decode graph")
    s.add_argument("--workdir", help="exports, model repository and server log (default: runs/serve/<name>)")
    s.add_argument("--port-http", type=int, default=8000)
    s.add_argument("--port-grpc", type=int, default=8001)
    _serving_options(s)
    s.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for the server to be ready")
    add_trust_pickle(s)
    s.add_argument("--verbose", action="store_true", help="verbose server log")
    s.set_defaults(func=cmd_serve)

    t = subparsers.add_parser("loadtest", help="concurrent clients against a served model, every answer checked",
                              description="Load test on loopback: N clients for a bounded time and request count, "
                                          "mixed sequence lengths; reports requests/s, p50/p95/p99 latency, errors, "
                                          "and mismatches against a batch-1 ONNX Runtime run of the same input.",
                              epilog=LOADTEST_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--url", action="append", default=[], help="http://127.0.0.1:8000 or grpc://127.0.0.1:8001 (repeatable)")
    t.add_argument("--compare-batching", nargs="+", metavar="CKPT|MODEL.onnx",
                   help="start the server twice on these (dynamic batching, then batch-1) and run the same load")
    t.add_argument("--protocol", choices=("http", "grpc"), default="http", help="with --compare-batching")
    t.add_argument("--workdir", default=None, help="with --compare-batching (default: runs/serve/<name>)")
    _serving_options(t)
    t.add_argument("--clients", type=int, default=16)
    t.add_argument("--seconds", type=float, default=30.0)
    t.add_argument("--max-requests", type=int, default=100_000)
    t.add_argument("--models", default="logits,generate", help="comma-separated: logits, generate")
    t.add_argument("--min-len", type=int, default=8)
    t.add_argument("--max-len", type=int, default=128)
    t.add_argument("--new-tokens", type=int, default=8, help="generate: up to this many (each prompt draws n/2..n)")
    t.add_argument("--pool", type=int, default=64, help="distinct prompts (each checked against its reference)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--checkpoint", metavar="CKPT",
                   help="judge logits against this checkpoint's eager model in float64, as `check` does "
                        "(msar_export.verdict; default with --compare-batching CKPT)")
    t.add_argument("--rtol", type=float, default=None,
                   help="without --checkpoint: max|served - ref| / max|ref| against the same graph at batch 1 "
                        "(default: msar_export.verdict.SAME_GRAPH at the served precision)")
    t.add_argument("--no-verify", action="store_true", help="do not compare with ONNX Runtime")
    t.add_argument("--hostile-every", type=int, default=0, metavar="N",
                   help="make every Nth request a malformed one (overflowing shapes, lying sizes, out-of-range "
                        "integers) that must be refused; 0: none")
    t.add_argument("--onnx", help="reference prefill graph (default: the file the server loaded)")
    t.add_argument("--decode-onnx", help="reference decode graph (default: the file the server loaded)")
    t.add_argument("--json", metavar="OUT.json", help="write the report here (atomically)")
    t.set_defaults(func=cmd_loadtest)


def _serving_options(p) -> None:
    p.add_argument("--max-batch", type=int, default=16, help="max_batch_size of the served models")
    p.add_argument("--no-batching", action="store_true", help="no dynamic batcher: one request per execution")
    p.add_argument("--instances", type=int, default=1, help="model instances (stub processes) per model")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads per instance")
    p.add_argument("--queue-delay-us", type=int, default=2000, help="dynamic batcher max_queue_delay_microseconds")


# -- triton-repo ------------------------------------------------------------------------

def cmd_triton_repo(a) -> int:
    from .repo import build_stock_repo

    out = build_stock_repo(a.model, a.output, name=a.name, max_batch=a.max_batch, kind=a.kind,
                           instances=a.instances, queue_delay_us=a.queue_delay_us, batching=not a.no_batching,
                           plugins=a.plugins, onnx_for_engine=a.onnx, validate=not a.no_validate, force=a.force)
    manifest = json.loads((out / "manifest.json").read_text())
    name = manifest["model"]
    text = (out / name / "config.pbtxt").read_text()
    mb = next((ln.split(":")[1].strip() for ln in text.splitlines() if ln.startswith("max_batch_size")), "0")
    checked = "not validated (--no-validate)" if a.no_validate else "validated with Triton's ModelConfig schema"
    print(f"wrote {out}: model '{name}' ({manifest['backend']} backend), max_batch_size {mb}, dynamic batching "
          f"{'on' if 'dynamic_batching' in text else 'off'}; config.pbtxt {checked}; see {out / 'README.md'}")
    return 0


# -- serve ------------------------------------------------------------------------------

def _is_checkpoint(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file()


def resolve_sources(srcs: list[str], workdir: Path | None, trust_pickle: bool = False,
                    progress=_say) -> tuple[str | None, str | None, Path]:
    """CKPT -> (prefill, decode) exported into workdir (cached); ONNX files -> classified."""
    paths = [Path(s) for s in srcs]
    if len(paths) == 1 and _is_checkpoint(paths[0]):
        ckpt = paths[0]
        workdir = workdir or Path("runs") / "serve" / (ckpt.resolve().name or "model")
        return (*export_for_serving(ckpt, workdir, trust_pickle, progress), workdir)
    if len(paths) > 2 or any(p.is_dir() for p in paths):
        raise InputError("give one checkpoint directory, or one or two ONNX files (prefill and/or decode graph)")
    from .modelconfig import read_onnx_io

    prefill = decode = None
    for p in paths:
        io = read_onnx_io(p)
        graph = io.metadata.get(META_GRAPH) or ("decode" if any(t.name == "attention_mask" for t in io.inputs)
                                                  else "prefill")
        if graph == "decode":
            if decode:
                raise InputError(f"two decode graphs given ({decode}, {p}); give at most one of each kind")
            decode = str(p)
        else:
            if prefill:
                raise InputError(f"two prefill graphs given ({prefill}, {p}); give at most one of each kind")
            prefill = str(p)
    workdir = workdir or Path("runs") / "serve" / Path(decode or prefill).stem
    return prefill, decode, workdir


def export_for_serving(ckpt: Path, workdir: Path, trust_pickle: bool, progress=_say) -> tuple[str, str]:
    """Export both graphs once per checkpoint content (export.json records what they came from)."""
    from .. import __version__
    from ..fileio import atomic_write_text, file_sha256

    files = {p.name: file_sha256(p) for p in sorted(ckpt.iterdir()) if p.is_file() and p.suffix in
             (".json", ".safetensors", ".pt", ".bin") and p.name != "train_history.json"}
    import hashlib

    code = hashlib.sha256()   # the exporter's own source: a changed exporter re-exports
    pkg = Path(__file__).resolve().parents[1]
    for src in sorted([*(pkg / "export").glob("*.py"), *(pkg / "model").glob("*.py")]):
        code.update(src.name.encode() + src.read_bytes())
    stamp = {"checkpoint": str(ckpt.resolve()), "files": files, "msar_export": __version__,
             "exporter_sha256": code.hexdigest()}
    prefill, decode, stamp_path = workdir / "prefill.onnx", workdir / "decode.onnx", workdir / "export.json"
    try:
        if json.loads(stamp_path.read_text()) == stamp and prefill.is_file() and decode.is_file():
            progress(f"reusing {prefill} and {decode} (exported from this checkpoint before)")
            return str(prefill), str(decode)
    except (OSError, ValueError):
        pass
    from ..export import ExportOptions, export_checkpoint

    workdir.mkdir(parents=True, exist_ok=True)
    stamp_path.unlink(missing_ok=True)
    for path, opts in ((prefill, ExportOptions()), (decode, ExportOptions(decode=True))):
        progress(f"exporting {ckpt} -> {path} ...")
        report = export_checkpoint(ckpt, path, opts, trust_pickle=trust_pickle, validate=True)
        progress(report.summary().splitlines()[0] + (f"; {report.validation.summary()}" if report.validation else ""))
        if report.validation is not None and not getattr(report.validation, "passed", True):
            raise InputError(f"{path}: the export does not match the checkpoint ({report.validation.summary()})")
    atomic_write_text(stamp_path, json.dumps(stamp, indent=2) + "\n")
    return str(prefill), str(decode)


class _Stop(Exception):
    pass


def cmd_serve(a) -> int:
    from .repo import build_serving_repo
    from .server import TritonServer

    from .server import HOST, ServerError, port_in_use

    if a.port_http == a.port_grpc:
        raise InputError("--port-http and --port-grpc must differ")
    for port in (a.port_http, a.port_grpc):
        if port_in_use(port):
            raise ServerError(f"port {port} on {HOST} is already in use; pick another with --port-http/--port-grpc")
    prefill, decode, workdir = resolve_sources(a.src, Path(a.workdir) if a.workdir else None, a.trust_pickle)
    repo, rebuilt = build_serving_repo(prefill, decode, workdir / "model_repository", max_batch=a.max_batch,
                                       batching=not a.no_batching, instances=a.instances, threads=a.threads,
                                       queue_delay_us=a.queue_delay_us)
    _say(f"model repository {repo} ({'written' if rebuilt else 'unchanged, reused'}; configs validated)")
    from ..config import MSARConfig
    from .modelconfig import read_onnx_io

    cfg = MSARConfig.from_json(read_onnx_io(prefill or decode).metadata[META_CONFIG], "msar.config metadata")
    # The largest input a request may carry: input_ids of max_batch rows of max_seq_len tokens.
    server = TritonServer(repo, a.port_http, a.port_grpc, log_path=workdir / "tritonserver.log", verbose=a.verbose,
                          max_elements=a.max_batch * cfg.max_seq_len)

    def on_term(signum, frame):
        raise _Stop()

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        server.start(timeout=a.ready_timeout)
        models = "logits" + (", generate" if decode else "")
        mode = "batch-1 (no dynamic batching)" if a.no_batching else f"dynamic batching, max batch {a.max_batch}"
        print(f"serving {models} on {server.http_url} (HTTP) and {server.grpc_url} (gRPC): {mode}; "
              f"log {server.log_path}; Ctrl-C stops", flush=True)
        server.wait()
        _say(server.exit_reason())
        return 1
    except (KeyboardInterrupt, _Stop):
        rc = server.stop()
        _say(f"stopped (tritonserver exit status {rc})")
        return 0
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
        signal.signal(signal.SIGTERM, old)


# -- loadtest -----------------------------------------------------------------------------

def _loadtest_argv(a, compare_sources: list[str] | None) -> list[str]:
    argv = ["loadtest"]
    for u in a.url:
        argv += ["--url", u]
    if compare_sources:
        argv += ["--compare-batching", *compare_sources, "--protocol", a.protocol]
        if a.workdir:
            argv += ["--workdir", a.workdir]
    argv += ["--max-batch", str(a.max_batch), "--instances", str(a.instances), "--threads", str(a.threads),
             "--queue-delay-us", str(a.queue_delay_us), "--clients", str(a.clients), "--seconds", str(a.seconds),
             "--max-requests", str(a.max_requests), "--models", a.models, "--min-len", str(a.min_len),
             "--max-len", str(a.max_len), "--new-tokens", str(a.new_tokens), "--pool", str(a.pool),
             "--seed", str(a.seed), "--hostile-every", str(a.hostile_every)]
    if a.rtol is not None:
        argv += ["--rtol", repr(a.rtol)]
    for flag, val in (("--no-batching", a.no_batching), ("--no-verify", a.no_verify)):
        if val:
            argv.append(flag)
    for flag, val in (("--onnx", a.onnx), ("--decode-onnx", a.decode_onnx), ("--checkpoint", a.checkpoint),
                      ("--json", a.json)):
        if val:
            argv += [flag, str(Path(val).resolve()) if flag != "--json" else str(Path(val).absolute())]
    return argv


def cmd_loadtest(a) -> int:
    from .env import have_tritonclient, run_in_triton_env
    from .loadtest import CompareSettings, LoadSettings, compare_batching, format_report, run_failed, run_load

    if bool(a.url) == bool(a.compare_batching):
        raise InputError("give --url URL (a running server) or --compare-batching CKPT|MODEL.onnx, not both")
    settings = LoadSettings(clients=a.clients, seconds=a.seconds, max_requests=a.max_requests,
                            models=tuple(m.strip() for m in a.models.split(",") if m.strip()), min_len=a.min_len,
                            max_len=a.max_len, new_tokens=a.new_tokens, pool=a.pool, seed=a.seed, rtol=a.rtol,
                            verify=not a.no_verify, hostile_every=a.hostile_every)
    if a.compare_batching and a.checkpoint is None and len(a.compare_batching) == 1 \
            and _is_checkpoint(Path(a.compare_batching[0])):
        a.checkpoint = a.compare_batching[0]
    if a.checkpoint is not None:
        if not _is_checkpoint(Path(a.checkpoint)):
            raise InputError(f"--checkpoint {a.checkpoint}: not a checkpoint directory")
        settings.checkpoint = a.checkpoint
    settings.check()
    from .loadtest import check_loopback

    for u in a.url:
        check_loopback(u)
    prefill = decode = None
    if a.compare_batching:
        prefill, decode, wd = resolve_sources(a.compare_batching, Path(a.workdir) if a.workdir else None)
        a.workdir = str(wd.resolve())   # exports (for a checkpoint) and the two repositories go here
        if decode is None and "generate" in settings.models:
            raise InputError("--compare-batching: the generate model needs a decode graph (give a checkpoint or "
                             "a --decode export), or pass --models logits")
    if not have_tritonclient():
        srcs = None
        if a.compare_batching:
            srcs = [str(Path(p).resolve()) for p in (prefill, decode) if p]
        return run_in_triton_env(_loadtest_argv(a, srcs))

    if a.compare_batching:
        c = CompareSettings(max_batch=a.max_batch, instances=a.instances, threads=a.threads,
                            queue_delay_us=a.queue_delay_us, protocol=a.protocol, workdir=a.workdir)
        result = compare_batching(prefill, decode, settings, c, progress=_say)
        print(f"dynamic batching vs batch-1 at {settings.clients} clients: throughput x{result['speedup_throughput']}")
        print(format_report(result["dynamic_batching"]))
        print(format_report(result["batch1"]))
        failed = any(run_failed(r) for r in (result["dynamic_batching"], result["batch1"]))
    else:
        runs = []
        for url in a.url:
            r = run_load(url, settings, a.onnx, a.decode_onnx, progress=_say)
            print(format_report(r), flush=True)
            runs.append(r)
        result = runs[0] if len(runs) == 1 else {"runs": runs}
        failed = any(run_failed(r) for r in runs)
    if a.json:
        from ..fileio import atomic_write_text

        atomic_write_text(a.json, json.dumps(result, indent=2) + "\n")
        print(f"report: {a.json}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """`python -m msar_export.serving.cli COMMAND ...`: these commands alone, as in `msar-export`
    (the entry .venv-triton runs: it does not need the export toolchain of other commands)."""
    from ..cli import Parser, run_command

    p = Parser(prog="msar-export")
    register(p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser))
    return run_command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
