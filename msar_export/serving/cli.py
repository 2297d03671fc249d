"""`msar-export triton-repo`, `serve` and `loadtest` (registered through msar_export.cli.REGISTRARS)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from ..cli_common import add_ort_ops, add_plugins, add_trust_pickle, say
from ..errors import InputError
from ..untrusted import loads_json
from ..numbers import BATCH, CLIENTS, COUNT, INSTANCES, MICROSECONDS, PORT, POSITIVE, SECONDS, SEED, SIZE, THREADS
from .sources import is_checkpoint, resolve_sources

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

--perf-analyzer: at each --concurrency level, over each --url's protocol and for each
of --models, Triton's perf_analyzer (installed in .venv-triton by
scripts/setup_triton_env.sh) measures in windows of --max-requests/3 requests until
three agree within --stability percent, then this load test sends --max-requests
(default 1000 here) with as many clients; both use the same prompts.  perf_analyzer's
figures are read from its CSV report.
Give the server's HTTP URL among the --url (the front's refusal counters are read there).
Exit 1 also when the front refused any of its requests, or Triton did not answer each.
"""


def register(subparsers) -> None:
    import argparse

    r = subparsers.add_parser("triton-repo", help="Triton model repository (onnxruntime / tensorrt backend) for a graph or engine",
                              description="Write a Triton model repository for a stock backend: onnxruntime for "
                                          "MODEL.onnx, tensorrt for MODEL.plan. config.pbtxt is validated with Triton's "
                                          "ModelConfig schema; the repository is written atomically.")
    r.add_argument("model", metavar="MODEL.onnx|MODEL.plan")
    r.add_argument("-o", "--output", required=True, metavar="REPO", help="repository directory (replaced atomically)")
    r.add_argument("--name", help="model name (default: the file's stem)")
    r.add_argument("--max-batch", type=BATCH, default=8, help="max_batch_size when the graph has a leading batch dim")
    r.add_argument("--no-batching", action="store_true", help="no dynamic_batching block")
    r.add_argument("--queue-delay-us", type=MICROSECONDS, default=500, help="dynamic batcher max_queue_delay_microseconds")
    r.add_argument("--instances", type=INSTANCES, default=1, help="instance_group count")
    r.add_argument("--kind", choices=("cpu", "gpu"), help="instance kind (default: gpu for engines, cpu for ONNX)")
    add_plugins(r, "TensorRT plugin libraries to copy in")
    r.add_argument("--onnx", metavar="MODEL.onnx", help="for an engine: the ONNX graph it was built from (its I/O)")
    r.add_argument("--no-validate", action="store_true", help="skip the ModelConfig schema check")
    r.add_argument("--force", action="store_true",
                   help="replace REPO even if it is not a repository msar-export wrote")
    add_ort_ops(r)  # auto/native: the library goes into the model folder (model_operations)
    r.set_defaults(func=cmd_triton_repo)

    s = subparsers.add_parser("serve", help="serve logits / generate on a real Triton server (127.0.0.1)",
                              description=__doc__.splitlines()[0], epilog=SERVE_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("src", nargs="+", metavar="CKPT|MODEL.onnx", help="checkpoint directory, or prefill and/or decode graph")
    s.add_argument("--workdir", help="exports, model repository and server log (default: runs/serve/<name>)")
    s.add_argument("--port-http", type=PORT, default=8000)
    s.add_argument("--port-grpc", type=PORT, default=8001)
    _serving_options(s)
    s.add_argument("--ready-timeout", type=SECONDS, default=180.0, help="seconds to wait for the server to be ready")
    add_ort_ops(s)  # the served model.py sessions inherit MSAR_ORT_OPS through tritonserver
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
    t.add_argument("--clients", type=CLIENTS, default=16)
    t.add_argument("--seconds", type=SECONDS, default=30.0)
    t.add_argument("--max-requests", type=COUNT, default=None,
                   help="per run (default 100000; with --perf-analyzer: 1000 per tool and concurrency level)")
    t.add_argument("--models", default="logits,generate", help="comma-separated: logits, generate")
    t.add_argument("--min-len", type=COUNT, default=8)
    t.add_argument("--max-len", type=COUNT, default=128)
    t.add_argument("--new-tokens", type=COUNT, default=8, help="generate: up to this many (each prompt draws n/2..n)")
    t.add_argument("--pool", type=COUNT, default=64, help="distinct prompts (each checked against its reference)")
    t.add_argument("--seed", type=SEED, default=0)
    t.add_argument("--checkpoint", metavar="CKPT",
                   help="judge logits against this checkpoint's eager model in float64, as `check` does "
                        "(msar_export.verdict; default with --compare-batching CKPT)")
    t.add_argument("--rtol", type=POSITIVE, default=None,
                   help="without --checkpoint: max|served - ref| / max|ref| against the same graph at batch 1 "
                        "(default: msar_export.verdict.SAME_GRAPH at the served precision)")
    t.add_argument("--no-verify", action="store_true", help="do not compare with ONNX Runtime")
    t.add_argument("--hostile-every", type=SIZE, default=0, metavar="N",
                   help="make every Nth request a malformed one (overflowing shapes, lying sizes, out-of-range "
                        "integers) that must be refused; 0: none")
    t.add_argument("--onnx", help="reference prefill graph (default: the file the server loaded)")
    t.add_argument("--decode-onnx", help="reference decode graph (default: the file the server loaded)")
    t.add_argument("--json", metavar="OUT.json", help="write the report here (atomically)")
    t.add_argument("--perf-analyzer", action="store_true",
                   help="also run Triton's perf_analyzer at each --concurrency level, figures side by side")
    t.add_argument("--concurrency", type=CLIENTS, nargs="+", default=None, metavar="N",
                   help="with --perf-analyzer: concurrency levels (default 1 4 16)")
    t.add_argument("--stability", type=POSITIVE, default=None, metavar="PERCENT",
                   help="with --perf-analyzer: the spread it accepts between its last three measurement "
                        "windows (its -s; default 25)")
    t.set_defaults(func=cmd_loadtest)


def _serving_options(p) -> None:
    p.add_argument("--max-batch", type=BATCH, default=16, help="max_batch_size of the served models")
    p.add_argument("--no-batching", action="store_true", help="no dynamic batcher: one request per execution")
    p.add_argument("--instances", type=INSTANCES, default=1, help="model instances (stub processes) per model")
    p.add_argument("--threads", type=THREADS, default=None,
                   help="ONNX Runtime intra-op threads per instance (default: runners.ort_runner.THREADS['serving'])")
    p.add_argument("--queue-delay-us", type=MICROSECONDS, default=2000, help="dynamic batcher max_queue_delay_microseconds")


# -- triton-repo ------------------------------------------------------------------------

def cmd_triton_repo(a) -> int:
    from .repository.writer import build_stock_repo

    out = build_stock_repo(a.model, a.output, name=a.name, max_batch=a.max_batch, kind=a.kind,
                           instances=a.instances, queue_delay_us=a.queue_delay_us, batching=not a.no_batching,
                           plugins=a.plugins, onnx_for_engine=a.onnx, validate=not a.no_validate, force=a.force)
    manifest = loads_json((out / "manifest.json").read_text(), str(out / "manifest.json"))
    name = manifest["model"]
    text = (out / name / "config.pbtxt").read_text()
    mb = next((ln.split(":")[1].strip() for ln in text.splitlines() if ln.startswith("max_batch_size")), "0")
    checked = "not validated (--no-validate)" if a.no_validate else "validated with Triton's ModelConfig schema"
    print(f"wrote {out}: model '{name}' ({manifest['backend']} backend), max_batch_size {mb}, dynamic batching "
          f"{'on' if 'dynamic_batching' in text else 'off'}; config.pbtxt {checked}; see {out / 'README.md'}")
    return 0


# -- serve ------------------------------------------------------------------------------

class _Stop(Exception):
    pass


def cmd_serve(a) -> int:
    from .repository.writer import build_serving_repo
    from .triton.server import TritonServer

    from .triton.server import HOST, ServerError, port_in_use

    if a.port_http == a.port_grpc:
        raise InputError("--port-http and --port-grpc must differ")
    for port in (a.port_http, a.port_grpc):
        if port_in_use(port):
            raise ServerError(f"port {port} on {HOST} is already in use; pick another with --port-http/--port-grpc")
    prefill, decode, workdir = resolve_sources(a.src, Path(a.workdir) if a.workdir else None, a.trust_pickle)
    repo, rebuilt = build_serving_repo(prefill, decode, workdir / "model_repository", max_batch=a.max_batch,
                                       batching=not a.no_batching, instances=a.instances, threads=a.threads,
                                       queue_delay_us=a.queue_delay_us)
    say(f"model repository {repo} ({'written' if rebuilt else 'unchanged, reused'}; configs validated)")
    cfg = (prefill or decode).config  # the graph resolve_sources opened, its config parsed by the writer
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
        say(server.exit_reason())
        return 1
    except (KeyboardInterrupt, _Stop):
        rc = server.stop()
        say(f"stopped (tritonserver exit status {rc})")
        return 0
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
        signal.signal(signal.SIGTERM, old)


# -- loadtest -----------------------------------------------------------------------------

def cmd_loadtest(a) -> int:
    from .triton.env import have_tritonclient
    from .load.job import LoadJob, run_in_triton_venv, run_job
    from .load.loadtest import CompareSettings, LoadSettings

    if bool(a.url) == bool(a.compare_batching):
        raise InputError("give --url URL (a running server) or --compare-batching CKPT|MODEL.onnx, not both")
    if a.perf_analyzer and a.compare_batching:
        raise InputError("--perf-analyzer runs against a running server: give --url, not --compare-batching")
    if not a.perf_analyzer and (a.concurrency or a.stability):
        raise InputError("--concurrency and --stability go with --perf-analyzer")
    if a.max_requests is None:
        a.max_requests = 1000 if a.perf_analyzer else 100_000
    settings = LoadSettings(clients=a.clients, seconds=a.seconds, max_requests=a.max_requests,
                            models=tuple(m.strip() for m in a.models.split(",") if m.strip()), min_len=a.min_len,
                            max_len=a.max_len, new_tokens=a.new_tokens, pool=a.pool, seed=a.seed, rtol=a.rtol,
                            verify=not a.no_verify, hostile_every=a.hostile_every)
    if a.compare_batching and a.checkpoint is None and len(a.compare_batching) == 1 \
            and is_checkpoint(Path(a.compare_batching[0])):
        a.checkpoint = a.compare_batching[0]
    if a.checkpoint is not None:
        if not is_checkpoint(Path(a.checkpoint)):
            raise InputError(f"--checkpoint {a.checkpoint}: not a checkpoint directory")
        settings.checkpoint = str(Path(a.checkpoint).resolve())
    settings.check()
    from .load.loadtest import check_loopback

    for u in a.url:
        check_loopback(u)
    prefill = decode = None
    if a.compare_batching:
        *opened, wd = resolve_sources(a.compare_batching, Path(a.workdir) if a.workdir else None)
        prefill, decode = (str(g.path) if g else None for g in opened)  # the load-test job names files
        a.workdir = str(wd.resolve())   # exports (for a checkpoint) and the two repositories go here
        if decode is None and "generate" in settings.models:
            raise InputError("--compare-batching: the generate model needs a decode graph (give a checkpoint or "
                             "a --decode export), or pass --models logits")
    job = LoadJob(urls=list(a.url), settings=settings, json_out=str(Path(a.json).absolute()) if a.json else None,
                  prefill=_absolute(prefill or a.onnx), decode=_absolute(decode or a.decode_onnx))
    if a.perf_analyzer:
        from .load.perf_analyzer import PerfSettings, find_perf_analyzer, http_url_of

        http_url_of(a.url)
        find_perf_analyzer()  # not installed: one line and exit 2, here, before anything runs
        job.perf = PerfSettings(requests=a.max_requests)
        if a.concurrency:
            job.perf.concurrency = tuple(dict.fromkeys(a.concurrency))
        if a.stability:
            job.perf.stability = a.stability
    if a.compare_batching:
        job.compare = CompareSettings(max_batch=a.max_batch, instances=a.instances, threads=a.threads,
                                      queue_delay_us=a.queue_delay_us, protocol=a.protocol, workdir=a.workdir)
    return run_job(job, say) if have_tritonclient() else run_in_triton_venv(job)


def _absolute(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def main(argv: list[str] | None = None) -> int:
    """`python -m msar_export.serving.cli COMMAND ...`: these commands alone, as in `msar-export`
    (the entry .venv-triton runs: it does not need the export toolchain of other commands)."""
    from ..cli_common import Parser, run_command

    p = Parser(prog="msar-export")
    register(p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser))
    return run_command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
