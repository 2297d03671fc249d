"""Load test: N concurrent clients for a bounded time and request count, mixed
sequence lengths, every response checked (load_references.py: logits against the
eager model in float64 when the checkpoint is given, else against a batch-1 run
of the served file; generated tokens exactly).

Traffic goes to loopback only; every loop stops at the deadline or after
`max_requests` requests, whichever comes first.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ...log import silent
from ...errors import InputError
from ..triton.client import InferError, ServingClient, parse_url
from .references import References



@dataclass
class LoadSettings:
    clients: int = 16
    seconds: float = 30.0
    max_requests: int = 100_000
    models: tuple[str, ...] = ("logits", "generate")
    min_len: int = 8
    max_len: int = 128
    new_tokens: int = 8
    pool: int = 64
    seed: int = 0
    rtol: float | None = None  # same-graph bound; None: verdict.SAME_GRAPH at the served precision
    checkpoint: str | None = None  # judge logits against its eager float64 run instead
    verify: bool = True
    hostile_every: int = 0  # every Nth request is a malformed one (hostile.py) that must be refused

    def check(self) -> None:
        if self.clients < 1 or self.clients > 256:
            raise InputError(f"--clients must be in [1, 256], got {self.clients}")
        if not 0 < self.seconds <= 600:
            raise InputError(f"--seconds must be in (0, 600], got {self.seconds}")
        if self.max_requests < 1:
            raise InputError(f"--max-requests must be >= 1, got {self.max_requests}")
        if not 1 <= self.min_len <= self.max_len:
            raise InputError(f"need 1 <= --min-len <= --max-len, got {self.min_len}, {self.max_len}")
        if self.hostile_every < 0:
            raise InputError(f"--hostile-every must be >= 0, got {self.hostile_every}")
        if self.new_tokens < 1 or self.pool < 1:
            raise InputError("--new-tokens and --pool must be >= 1")
        bad = [m for m in self.models if m not in ("logits", "generate")]
        if bad or not self.models:
            raise InputError(f"--models: use logits and/or generate, got {list(self.models)}")


@dataclass
class Item:
    model: str
    ids: np.ndarray          # [1, T]
    new_tokens: int = 0
    ref: np.ndarray | None = None      # the same graph in ONNX Runtime, batch 1
    eager: np.ndarray | None = None    # with a checkpoint: eager at the served precision
    ref64: np.ndarray | None = None    # with a checkpoint: eager in float64


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu_cores": os.cpu_count(), "cpu": cpu, "gpu": "none",
            "platform": platform.platform(), "python": platform.python_version()}
    try:
        info["load_avg_1m_at_start"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            info["gpu"] = "CUDA available (references ran on CPU)"
    except ImportError:
        pass
    return info


def check_loopback(url: str) -> None:
    import ipaddress

    _, address = parse_url(url)
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: only localhost itself, never a name that merely starts with it
        loopback = host.lower() == "localhost"
    if not loopback:
        raise InputError(f"--url {url}: the load test only targets this machine (127.0.0.1, localhost, [::1])")


def make_pool(s: LoadSettings, vocab: int, max_seq_len: int) -> list[Item]:
    rng = np.random.default_rng(s.seed)
    hi = min(s.max_len, max_seq_len - s.new_tokens)
    lo = min(s.min_len, hi)
    if hi < 1:
        raise InputError(f"--new-tokens {s.new_tokens} leaves no room in max_seq_len={max_seq_len}")
    items = []
    for k in range(s.pool):
        model = s.models[k % len(s.models)]
        T = int(rng.integers(lo, hi + 1))
        ids = rng.integers(0, vocab, size=(1, T), dtype=np.int64)
        n = int(rng.integers(max(1, s.new_tokens // 2), s.new_tokens + 1)) if model == "generate" else 0
        items.append(Item(model, ids, n))
    return items


def percentiles(lat_s: list[float]) -> dict:
    if not lat_s:
        return {}
    a = np.asarray(lat_s) * 1e3
    return {"p50": round(float(np.percentile(a, 50)), 2), "p95": round(float(np.percentile(a, 95)), 2),
            "p99": round(float(np.percentile(a, 99)), 2), "mean": round(float(a.mean()), 2),
            "max": round(float(a.max()), 2)}


def _stat_counts(client: ServingClient, model: str) -> tuple[int, int]:
    try:
        st = client.model_stats(model)["model_stats"][0]
    except Exception:
        return 0, 0
    inf = st.get("inference_count", st.get("inferenceCount", 0))
    exe = st.get("execution_count", st.get("executionCount", 0))
    return int(inf), int(exe)


def run_load(url: str, s: LoadSettings, prefill: str | None = None, decode: str | None = None,
             progress=None) -> dict:
    """Run the load test against a live server; return the report (a JSON-able dict)."""
    s.check()
    check_loopback(url)
    say = progress or silent
    main = ServingClient(url)
    deadline = time.monotonic() + 60
    while not main.ready():
        if time.monotonic() > deadline:
            raise InferError(f"{url}: server not ready")
        time.sleep(0.2)
    configs = {m: main.model_config(m) for m in s.models}
    refs = References(main, s.models, prefill, decode, s.checkpoint, s.rtol) if s.verify else None
    if refs is not None:
        cfg = refs.cfg()
        vocab, max_seq_len = cfg.vocab_size, cfg.max_seq_len
    else:
        p = main.parameters(s.models[0])
        vocab, max_seq_len = int(p["vocab_size"]), int(p["max_seq_len"])
    pool = make_pool(s, vocab, max_seq_len)
    if refs is not None:
        t0 = time.perf_counter()
        for item in pool:
            refs.compute(item)
        say(f"{len(pool)} references ({'; '.join(f'{k}: {v}' for k, v in refs.sources.items())}) "
            f"in {time.perf_counter() - t0:.1f} s")
    # One warm-up request per model (first-run allocations are not part of the measurement).
    for m in s.models:
        it = next(i for i in pool if i.model == m)
        main.send(main.prepare_logits(it.ids) if m == "logits" else main.prepare_generate(it.ids, it.new_tokens))
    before = {m: _stat_counts(main, m) for m in s.models}

    rng = np.random.default_rng(s.seed + 1)
    schedule = rng.integers(0, len(pool), size=max(4 * len(pool), 1024))
    lock = threading.Lock()
    counter = [0]
    records: list[tuple[str, float, str | None]] = []   # (model, latency, problem kind or None)
    errors: dict[str, int] = {}
    mismatches: list[dict] = []
    hostile = {"sent": 0, "refused": 0, "not_refused": []}

    def send_hostile(k: int) -> None:
        from . import hostile as h

        scheme, address = parse_url(url)
        refused, what = h.send_http(f"http://{address}", k) if scheme == "http" else h.send_grpc(address, k)
        with lock:
            hostile["sent"] += 1
            hostile["refused"] += refused
            if not refused and len(hostile["not_refused"]) < 5:
                hostile["not_refused"].append(what)

    def next_index():
        with lock:
            i = counter[0]
            if i >= s.max_requests:
                return None
            counter[0] += 1
            return i

    def worker():
        client = ServingClient(url)
        prepared = {}
        local = []
        try:
            while time.monotonic() < stop_at:
                i = next_index()
                if i is None:
                    break
                if s.hostile_every and i % s.hostile_every == s.hostile_every - 1:
                    send_hostile(i // s.hostile_every)
                    continue
                k = int(schedule[i % len(schedule)])
                item = pool[k]
                req = prepared.get(k)
                if req is None:
                    req = prepared[k] = (client.prepare_logits(item.ids) if item.model == "logits"
                                         else client.prepare_generate(item.ids, item.new_tokens))
                t = time.perf_counter()
                try:
                    out = client.send(req)
                except InferError as e:
                    local.append((item.model, time.perf_counter() - t, "error"))
                    with lock:
                        msg = str(e)[:200]
                        errors[msg] = errors.get(msg, 0) + 1
                    continue
                except Exception as e:  # connection reset, timeout: count it, keep going
                    local.append((item.model, time.perf_counter() - t, "error"))
                    with lock:
                        msg = f"{type(e).__name__}: {str(e)[:160]}"
                        errors[msg] = errors.get(msg, 0) + 1
                    continue
                dt = time.perf_counter() - t
                problem = refs.problem(item, out) if refs is not None else None
                if problem:
                    with lock:
                        mismatches.append({"request": i, "model": item.model, "seq_len": int(item.ids.shape[1]),
                                           "problem": problem})
                local.append((item.model, dt, "mismatch" if problem else None))
        finally:
            client.close()
            with lock:
                records.extend(local)

    say(f"{s.clients} clients, {s.seconds:g} s or {s.max_requests} requests, models {','.join(s.models)}, "
        f"lengths {s.min_len}..{s.max_len}")
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(s.clients)]
    t_start = time.monotonic()
    stop_at = t_start + s.seconds
    for th in threads:
        th.start()
    for th in threads:
        th.join(s.seconds + 180)
    elapsed = time.monotonic() - t_start
    ready_after = main.ready()
    after = {m: _stat_counts(main, m) for m in s.models}
    main.close()

    ok_lat = [dt for _, dt, p in records if p is None]
    per_model = {}
    for m in s.models:
        lat = [dt for mm, dt, p in records if mm == m and p is None]
        inf = after[m][0] - before[m][0]
        exe = after[m][1] - before[m][1]
        per_model[m] = {"requests": sum(1 for mm, _, _ in records if mm == m), "ok": len(lat),
                        "latency_ms": percentiles(lat),
                        "server_avg_batch": round(inf / exe, 2) if exe else None}
    n_err = sum(1 for _, _, p in records if p == "error")
    report = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "url": url,
        "protocol": parse_url(url)[0],
        "settings": {**asdict(s), "models": list(s.models)},
        "server": {m: {"max_batch_size": configs[m].get("max_batch_size"),
                       "dynamic_batching": "dynamic_batching" in configs[m]} for m in s.models},
        "references": refs.sources if refs else None,
        "duration_s": round(elapsed, 2),
        "requests": len(records),
        "ok": len(ok_lat),
        "errors": n_err,
        "mismatches": len(mismatches),
        "hostile": {**hostile, "every": s.hostile_every},
        "server_ready_after": ready_after,
        "throughput_rps": round(len(ok_lat) / elapsed, 2) if elapsed > 0 else 0.0,
        "latency_ms": percentiles(ok_lat),
        "per_model": per_model,
        "error_samples": [{"message": k, "count": v} for k, v in list(errors.items())[:5]],
        "mismatch_samples": mismatches[:5],
    }
    return report


def run_failed(r: dict) -> bool:
    """Errors or wrong answers on good requests, a malformed request not refused, or a server
    that is no longer ready after the run."""
    h = r.get("hostile") or {}
    return bool(r["errors"] or r["mismatches"] or h.get("refused", 0) != h.get("sent", 0)
                or not r.get("server_ready_after", True))


def format_report(r: dict) -> str:
    lat = r["latency_ms"] or {}
    lines = [f"{r['url']} ({r['protocol']}): {r['requests']} requests in {r['duration_s']} s by "
             f"{r['settings']['clients']} clients: {r['throughput_rps']} req/s; latency p50 {lat.get('p50')} ms, "
             f"p95 {lat.get('p95')} ms, p99 {lat.get('p99')} ms; errors {r['errors']}, mismatches {r['mismatches']}"]
    for m, pm in r["per_model"].items():
        pl = pm["latency_ms"] or {}
        lines.append(f"  {m}: {pm['ok']}/{pm['requests']} ok, p50 {pl.get('p50')} ms, p99 {pl.get('p99')} ms, "
                     f"server batch size {pm['server_avg_batch']}")
    h = r.get("hostile") or {}
    if h.get("sent"):
        lines.append(f"  malformed requests: {h['refused']}/{h['sent']} refused; server ready after the run: "
                     f"{r['server_ready_after']}")
    for what in h.get("not_refused", []):
        lines.append(f"  NOT refused: {what}")
    for e in r["error_samples"]:
        lines.append(f"  error x{e['count']}: {e['message']}")
    for m in r["mismatch_samples"]:
        lines.append(f"  mismatch: request {m['request']} ({m['model']}, T={m['seq_len']}): {m['problem']}")
    return "\n".join(lines)


@dataclass
class CompareSettings:
    max_batch: int = 16
    instances: int = 1
    threads: int | None = None  # ORT threads per instance; None: runners.ort_runner.THREADS["serving"]
    queue_delay_us: int = 2000
    protocol: str = "http"
    workdir: str = "runs/serve/compare"
    extra: dict = field(default_factory=dict)


def compare_batching(prefill: str | None, decode: str | None, s: LoadSettings, c: CompareSettings,
                     progress=None) -> dict:
    """The same load against dynamic batching and batch-1 serving, one server at a time."""
    from ..repository.writer import build_serving_repo
    from ..triton.server import TritonServer, free_port

    say = progress or silent
    results = {}
    for mode, batching in (("dynamic_batching", True), ("batch1", False)):
        repo, _ = build_serving_repo(prefill, decode, Path(c.workdir) / f"repo-{mode}", max_batch=c.max_batch,
                                     batching=batching, instances=c.instances, threads=c.threads,
                                     queue_delay_us=c.queue_delay_us)
        server = TritonServer(repo, free_port(), free_port())
        say(f"{mode}: starting tritonserver on {server.http_url} / {server.grpc_url}")
        with server:
            url = server.http_url if c.protocol == "http" else server.grpc_url
            results[mode] = run_load(url, s, prefill, decode, progress=say)
        say(format_report(results[mode]))
    b, one = results["dynamic_batching"], results["batch1"]
    speedup = round(b["throughput_rps"] / one["throughput_rps"], 2) if one["throughput_rps"] else None
    return {"date": b["date"], "machine": b["machine"], "protocol": c.protocol,
            "settings": b["settings"], "serving": asdict(c), "speedup_throughput": speedup,
            "dynamic_batching": b, "batch1": one}


__all__ = ["LoadSettings", "CompareSettings", "run_load", "compare_batching", "format_report", "machine_info"]
