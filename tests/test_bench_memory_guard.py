"""`bench --export-memory`'s guards and bounds, without exporting anything: the low-memory
abort takes the child's whole process tree down, anonymous memory is told from mapped file
pages, SIGTERM still removes what the bench made, and a row is judged against the formula."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from msar_export.bench import memory
from msar_export.bench.bounds import reference_bound_mib, row_bounds, within
from msar_export.bench.memory import memory_config, memory_table
from msar_export.bench.probe import run_probe

REPO = Path(__file__).resolve().parent.parent


def _state(pid: int) -> str:
    """'gone', or the process's state letter (Z: dead, not yet reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_low_memory_guard_kills_the_whole_tree(tmp_path, monkeypatch):
    from msar_export.bench import probe

    pidfile = tmp_path / "grandchild"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    # Memory "runs low" once the grandchild is there: the kill must reach it too.
    monkeypatch.setattr(probe, "mem_available_mib", lambda: 1000.0 if pidfile.exists() else 9000.0)
    t0 = time.perf_counter()
    r = run_probe([sys.executable, "-c", code], min_available_mib=2048)
    assert time.perf_counter() - t0 < 30 and r["returncode"] == -signal.SIGKILL
    assert r["aborted"].startswith("killed: MemAvailable 1000 MiB < 2048 MiB") and r["min_available_mb"] == 1000
    gpid = int(pidfile.read_text())
    for _ in range(100):
        if _state(gpid) in ("gone", "Z"):
            break
        time.sleep(0.05)
    assert _state(gpid) in ("gone", "Z")
    # Control: with memory to spare the same kind of child finishes.
    monkeypatch.setattr(probe, "mem_available_mib", lambda: 9000.0)
    r = run_probe([sys.executable, "-c", "import time; time.sleep(0.3)"], min_available_mib=2048)
    assert r["returncode"] == 0 and r["aborted"] is None and r["min_available_mb"] == 9000


def test_tree_sample_tells_anonymous_memory_from_mapped_file_pages(tmp_path):
    mib = 64
    data = tmp_path / "pages"
    data.write_bytes(b"\1" * (mib * 2**20))
    touch = "sum(m[i] for i in range(0, len(m), 4096)); time.sleep(1.0)"  # held while sampled every 25 ms
    mapped = run_probe([sys.executable, "-c", f"import mmap, time; f = open({str(data)!r}, 'rb'); "
                        f"m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); {touch}"])
    anon = run_probe([sys.executable, "-c", f"import time; m = bytearray({mib * 2**20}); "
                      f"m[::4096] = b'x' * len(m[::4096]); {touch}"])
    assert mapped["returncode"] == anon["returncode"] == 0, (mapped["stderr"], anon["stderr"])
    assert mapped["tree_peak_rss_mb"] > mib and anon["tree_peak_rss_mb"] > mib
    assert mapped["tree_peak_anon_mb"] < mib / 2 < mib < anon["tree_peak_anon_mb"]


def _peak_and_rss_mib() -> tuple[float, float]:
    status = Path("/proc/self/status").read_text()
    return tuple(int(status.split(f"{k}:")[1].split()[0]) / 1024 for k in ("VmHWM", "VmRSS"))


def test_a_childs_rusage_peak_is_its_own_not_the_benchs(monkeypatch):
    # the bench makes the checkpoint itself: its peak must not become every child's
    from msar_export.bench import probe

    def raise_own_peak(mib=256):
        block = bytearray(mib * 2**20)
        block[::4096] = b"x" * len(block[::4096])
        del block
        return _peak_and_rss_mib()

    peak, rss = raise_own_peak()
    assert peak > rss + 200
    child = run_probe([sys.executable, "-c", "pass"])["peak_rss_mb"]
    assert child < rss + 100
    # negative control: without the reset the child reports this process's peak
    monkeypatch.setattr(probe, "_reset_own_peak", lambda: None)
    peak, rss = raise_own_peak()
    assert run_probe([sys.executable, "-c", "pass"])["peak_rss_mb"] >= peak - 1 > rss + 200


def test_sigterm_runs_the_cleanup():
    seen = []
    with pytest.raises(SystemExit) as info:
        with memory.terminated_as_exit():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # not reached: the handler raises in this thread
            finally:
                seen.append("finally")
    assert info.value.code == 128 + signal.SIGTERM and seen == ["finally"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_reference_bound_is_the_readmes_worked_figure():
    # README: 128 M parameters (8 blocks, d 1024, vocab 32,000), baseline 219:
    # 219 + 250 (embedding in float64) + 250 (its largest tensor) + 44 (activations) + 3 (mixers) = 766
    assert reference_bound_mib(219, memory_config(8, 1024, 32000)) == pytest.approx(766, abs=1)
    # the largest unit is an MLP sublayer once 3 d mlp_hidden > V d
    wide = memory_config(2, 4096, 32000)
    assert reference_bound_mib(0, wide) > 8 * 3 * 4096 * wide.mlp_hidden / 2**20


def _fake_probe(peak: float, anon: float, rc: int = 0, aborted=None):
    def probe(*args, env=None, min_available_mib=None):
        out = Path(args[args.index("-o") + 1])
        out.write_bytes(b"x" * 2**20)
        out.with_name(out.name + ".data").write_bytes(b"x" * 2**20)
        stdout = "" if aborted else f"export: 9.0 s   peak RSS: {peak:.0f} MB ({peak:.0f} MB with validation)\n" \
                                    "validation: PASS - made up"
        return {"seconds": 1.0, "peak_rss_mb": peak, "tree_peak_rss_mb": peak, "tree_peak_anon_mb": anon,
                "min_available_mb": 9000.0, "aborted": aborted, "returncode": rc, "stdout": stdout, "stderr": ""}
    return probe


@pytest.mark.parametrize("peak, anon, rc, aborted, ok", [
    (900.0, 700.0, 0, None, True),
    (900.0, 1400.0, 0, None, False),  # anonymous over the bound: the weights were copied
    (5000.0, 700.0, 0, None, False),  # the whole peak over it
    (300.0, 200.0, -9, "killed: MemAvailable 1900 MiB < 2048 MiB", False),
])
def test_row_is_judged_against_the_formula_and_its_files_removed(tmp_path, monkeypatch, peak, anon, rc, aborted, ok):
    cfg = memory_config(1, 128, 256)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"x" * 2**20)
    monkeypatch.setattr(memory, "cli_probe", _fake_probe(peak, anon, rc, aborted))
    row = memory.measure_variant(tmp_path / "ckpt", tmp_path / "m.onnx", "default --external-data",
                                 ["--external-data"], cfg, 200.0)
    assert row["external_data"]
    assert row["within_bound"] is ok and within(row) is ok
    assert row["validation"] == (aborted or "validation: PASS - made up")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    table = memory_table({"machine": {"date": "d", "cpu": "c", "logical_cores": 2, "torch": "t"},
                          "settings": {"config": json.loads(cfg.to_json()), "shards": 1}, "rows": [row]})
    assert f"| {'yes' if ok else 'NO'} |" in table


def test_no_validate_row_is_bounded_by_the_export_phase_alone():
    cfg = memory_config(2, 256, 1000)
    row = {"variant": "default --external-data --no-validate", "baseline_mib": 200.0, "file_mib": 10.0,
           "parameters": 1}
    assert row_bounds(row, cfg)["bound_mib"] == pytest.approx(200 + 1024 + 4 * 1000 * 256 / 2**20, abs=0.1)


def test_readme_export_memory_tables_are_generated_from_the_checked_in_json():
    results = memory.saved_results(REPO / "benchmarks")
    assert len(results) >= 2
    block = (REPO / "README.md").read_text().split(memory.MEMORY_BEGIN, 1)[1].split(memory.MEMORY_END, 1)[0]
    assert block.strip() == "\n\n".join(memory_table(r) for r in results).strip()
