"""The benchmark command runs end to end, and the README table comes from the checked-in results."""

from __future__ import annotations

import json
from pathlib import Path

from msar_export.bench.report import BEGIN, END, markdown_table
from msar_export.bench.run import QUICK, BenchSettings, run_bench, write_results

REPO = Path(__file__).resolve().parent.parent


def test_quick_bench_writes_results_and_chart(tmp_path):
    s = BenchSettings(**{**QUICK, "kinds": ("standard", "msar")})
    result = run_bench(s, log=lambda *_: None)
    write_results(result, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    backends = {(r["kind"], r["backend"]) for r in saved["prefill"]}
    assert {("standard", "eager"), ("standard", "ort"), ("msar", "eager"), ("msar", "ort-custom"),
            ("msar", "ort-decomposed"), ("msar", "ort-custom-retrieval")} <= backends
    assert all(r["median_s"] > 0 and r["min_s"] <= r["median_s"] <= r["max_s"] for r in saved["prefill"])
    assert {(r["kind"], r["backend"]) for r in saved["decode"]} == {(k, b) for k in ("standard", "msar")
                                                                     for b in ("eager", "ort")}
    assert "tensorrt" in saved["skipped"] and saved["machine"]["threads"] == s.threads
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_table_is_generated_from_the_checked_in_results():
    result = json.loads((REPO / "benchmarks" / "results.json").read_text())
    readme = (REPO / "README.md").read_text()
    block = readme.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == markdown_table(result).strip()
