"""The benchmark command runs end to end, and the README table comes from the checked-in results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msar_export.bench.report import BEGIN, END, markdown_table
from msar_export.bench.run import QUICK, BenchSettings, run_bench, write_results

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # the bench stage's default-tier test is the export-scaling smoke run
def test_quick_bench_writes_results_and_chart(tmp_path):
    s = BenchSettings(**{**QUICK, "kinds": ("standard", "msar")})
    result = run_bench(s, log=lambda *_: None)
    write_results(result, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    backends = {(r["kind"], r["backend"]) for r in saved["prefill"]}
    assert {("standard", "eager"), ("standard", "ort"), ("msar", "eager"), ("msar", "ort-native"),
            ("msar", "ort-function"), ("msar", "ort-decomposed"), ("msar", "ort-native-retrieval"),
            ("msar", "ort-function-retrieval"), ("msar", "ort-native-scored"), ("msar", "ort-function-scored")} <= backends
    assert all(r["median_s"] > 0 and r["min_s"] <= r["median_s"] <= r["max_s"] for r in saved["prefill"])
    assert {(r["kind"], r["backend"], r["batch"]) for r in saved["decode"]} == (
        {(k, b, n) for k in ("standard", "msar") for b in ("eager", "ort") for n in s.decode_batches}
        | {("msar", "ort-function", n) for n in s.decode_batches})
    assert "msar/standard (native)" in saved["guard"] and "msar/standard prefill time in ORT (ort-native)" in saved["ratios"]
    assert "tensorrt" in saved["skipped"] and saved["machine"]["threads"] == s.threads
    pair = saved["paired"]["msar/standard prefill time in ORT (ort-native)"]
    assert pair["pairs"] == s.pair_repeats and pair["min"] <= pair["median"] <= pair["max"]
    assert saved["ratios"]["msar/standard prefill time in ORT (ort-native)"] == pair["median"]
    scored = saved["paired"]["msar/standard prefill time in ORT (ort-native-scored)"]
    assert saved["ratios"]["msar/standard prefill time in ORT (ort-native-scored)"] == scored["median"]
    assert "| msar | ort-native-scored |" in markdown_table(saved)
    assert {f"standard/msar decode tokens/s, batch {n} (ort)" for n in s.decode_batches} <= set(saved["paired"])
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scored_rows_get_goal_ratios_and_table_rows():
    """A checked-in result with its msar `ort-native-scored` row replaced (0.39 s against standard's
    0.3 s and msar eager's 0.78 s): ratios() and the README table take it like any ORT row."""
    from msar_export.bench.run import ratios

    result = json.loads((REPO / "benchmarks" / "results.json").read_text())
    B, T = result["settings"]["prefill_shapes"][0]
    result["paired"] = {}  # the round-robin ratio, not a pair's median
    result["prefill"] = [r for r in result["prefill"] if r["backend"] != "ort-native-scored"]  # the bench's own
    for r in result["prefill"]:
        if (r["batch"], r["seq"]) == (B, T) and (r["kind"], r["backend"]) in (("standard", "ort"), ("msar", "eager")):
            r["median_s"] = 0.3 if r["kind"] == "standard" else 0.78
    result["prefill"].append({**result["prefill"][0], "kind": "msar", "backend": "ort-native-scored", "batch": B,
                              "seq": T, "median_s": 0.39, "tokens_per_s": 1313.0})
    got = ratios(result)
    assert got["msar/standard prefill time in ORT (ort-native-scored)"] == 1.3
    assert got["msar prefill speed-up ort-native-scored vs eager"] == 2.0
    result["ratios"] = got
    table = markdown_table(result)
    assert "| msar | ort-native-scored | 390.0 | 1313 |" in table
    assert "| msar/standard prefill time in ORT (ort-native-scored) | 1.3 |" in table
    # Negative control: a row at another shape is neither a table row nor a ratio.
    result["prefill"][-1]["seq"] = T + 1
    assert "ort-native-scored" not in markdown_table({**result, "ratios": ratios(result)})


def test_paired_ratio_reads_a_known_ratio():
    """Two sleeps of known lengths: the pairwise median finds their ratio; equal ones give 1
    (the negative control: a pair must not invent a difference)."""
    import time

    from msar_export.bench.paired import paired_ratio

    def sleeper(s):
        return lambda: time.sleep(s)

    assert 1.6 < paired_ratio(sleeper(0.02), sleeper(0.01), warmup=1, repeats=5)["median"] < 2.4
    assert 0.8 < paired_ratio(sleeper(0.01), sleeper(0.01), warmup=1, repeats=5)["median"] < 1.25


def test_readme_table_is_generated_from_the_checked_in_results():
    result = json.loads((REPO / "benchmarks" / "results.json").read_text())
    readme = (REPO / "README.md").read_text()
    block = readme.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == markdown_table(result).strip()


def test_readme_depth_sweep_table_is_generated_from_the_checked_in_results():
    from msar_export.bench.depth import BEGIN as DB, END as DE, depth_table

    result = json.loads((REPO / "benchmarks" / "depth_sweep.json").read_text())
    block = (REPO / "README.md").read_text().split(DB, 1)[1].split(DE, 1)[0].strip()
    assert block == depth_table(result).strip()


def test_mac_model_counts_issue_21s_figure():
    """d 512, 8 blocks, kernels [1,4,8,12]: mixing about 10% of the rest at 512 tokens (issue 21's count)."""
    import dataclasses

    from msar_export.bench.depth import mac_model

    m = mac_model(dataclasses.replace(BenchSettings().model, residual="msar"), 512)
    assert m["mixing_macs_per_token"] == 153 * 512 * 36 + 17 * 16 * 512
    assert 1.08 < m["predicted_ratio"] < 1.12


def test_mixer_microbenchmark_matches_eager_and_reports_the_floor():
    from msar_export.bench.mixer import run_mixer_bench

    res = run_mixer_bench(sources=(2, 5), widths=(24,), tokens=(19,), repeats=2, log=lambda *_: None)
    assert res["copy_bandwidth_gbs"] > 0
    assert [(r["sources"], r["tokens"]) for r in res["rows"]] == [(2, 19), (5, 19)]
    for r in res["rows"]:
        assert r["ort_vs_eager_rel_err"] <= 1e-5  # the FusedMixer function body computes the eager mixer
        assert r.get("ort_native_vs_eager_rel_err", 0.0) <= 1e-5  # and so does the native kernel, when built
        assert 0 < r["floor_ms"] and r["eager_ms"] > 0 and r["ort_ms"] > 0


def test_export_scaling_smoke_run_writes_json_and_chart(tmp_path):
    from msar_export.bench.scaling import run_export_scaling, scaling_table, write_scaling

    res = run_export_scaling(depths=(1, 3), widths=(16,), kinds=("default",), log=lambda *_: None)
    write_scaling(res, tmp_path)
    rows = json.loads((tmp_path / "export_scaling.json").read_text())["rows"]
    assert [(r["n_blocks"], r["returncode"]) for r in rows] == [(1, 0), (3, 0)]
    for r in rows:
        assert r["export_s"] > 0 and r["peak_rss_mb"] > 0 and r["file_mb"] > 0
        assert r["graph_nodes"] > 0 and r["function_nodes"] > 0
    # Stacked function bodies: one overload per source count, each the same size.
    assert rows[1]["function_nodes"] == 7 * rows[0]["function_nodes"] // 3
    assert (tmp_path / "export_scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 16 | 3 | default |" in scaling_table(res)


def test_readme_export_scaling_table_is_generated_from_the_checked_in_results():
    from msar_export.bench.scaling import SCALING_BEGIN, SCALING_END, scaling_table

    result = json.loads((REPO / "benchmarks" / "export_scaling.json").read_text())
    block = (REPO / "README.md").read_text().split(SCALING_BEGIN, 1)[1].split(SCALING_END, 1)[0].strip()
    assert block == scaling_table(result).strip()


def test_time_fn_and_interleaved_summarise_samples_alike():
    """One summary of sorted samples: the quartiles are statistics.quantiles' exclusive method,
    worked by hand for 1..4 (q1 = 1.25, q3 = 3.75)."""
    from msar_export.bench import timing

    got = timing.Timing.of([4.0, 1.0, 3.0, 2.0])
    assert (got.median_s, got.min_s, got.max_s, got.iqr_s, got.repeats) == (2.5, 1.0, 4.0, 2.5, 4)
    assert timing.Timing.of([4.0, 1.0, 3.0, 2.5]).median_s == 2.75  # negative control: another sample moves it
    calls = []
    one = timing.time_fn(lambda: calls.append("f"), warmup=2, repeats=3)
    assert calls == ["f"] * 5 and one.repeats == 3 and one.min_s <= one.median_s <= one.max_s
    both = timing.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 1, 2)
    assert calls[5:] == ["a", "b", "a", "b", "a", "b"] and [t.repeats for t in both.values()] == [2, 2]


def test_tiny_depth_sweep_times_every_graph_kind():
    """run_depth_sweep end to end on a tiny model: a ratio for each graph it exports (the FusedMixer
    file on native kernels and function bodies, the scored file) at each depth."""
    from msar_export.bench.depth import run_depth_sweep
    from msar_export.bench.models import native_available
    from msar_export.config import MSARConfig

    base = MSARConfig(d_model=64, n_blocks=1, n_heads=2, n_kv_heads=1, mlp_hidden=128, vocab_size=64, max_seq_len=256)
    res = run_depth_sweep((1, 2), base=base, T=16, repeats=2)
    hows = ["native", "scored", "function"] if native_available() else ["function"]
    assert [r["n_blocks"] for r in res["rows"]] == [1, 2]
    for row in res["rows"]:
        for how in hows:
            lo, hi = row[f"ratio_{how}_spread"]
            assert 0 < lo <= row[f"ratio_{how}"] <= hi and row[f"msar_{how}_ms"] > 0
        assert row["standard_ms"] > 0
