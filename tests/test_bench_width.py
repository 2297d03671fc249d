"""`msar-export bench --width-sweep` (msar_export/bench/width.py): the widened models, the multiply-add
model's fall with width, a tiny sweep end to end (its README block) and its bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msar_export.bench.run import BenchSettings
from msar_export.bench.width import BEGIN, END, run_width_sweep, widened, width_table, write_width_sweep
from msar_export.config import MSARConfig
from msar_export.cli import main

REPO = Path(__file__).resolve().parent.parent


def test_widened_keeps_head_width_kv_group_mlp_ratio_and_depth():
    base = BenchSettings().model  # d 512: 8 heads, 4 kv heads, MLP 1376
    wide = widened(base, 1024)
    assert (wide.d_model, wide.n_heads, wide.n_kv_heads, wide.mlp_hidden) == (1024, 16, 8, 2752)
    assert (wide.n_blocks, wide.stream_kernels, wide.vocab_size) == (base.n_blocks, base.stream_kernels, base.vocab_size)
    assert widened(base, 512) == base
    for bad in (640 + 64, 0, -128):
        with pytest.raises(ValueError, match="positive multiples of 128"):
            widened(base, bad)


def test_predicted_prefill_ratio_falls_with_width():
    """Mixing grows with d, the rest with d^2 (plus attention's T d), so MSAR's predicted share
    roughly halves per doubling of width."""
    from msar_export.bench.depth import mac_model

    base = BenchSettings().model
    extra = [mac_model(widened(base, d), 512)["predicted_ratio_scored"] - 1 for d in (512, 1024, 2048)]
    assert extra[0] > extra[1] > extra[2] > 0
    assert 0.4 < extra[1] / extra[0] < 0.75 and 0.4 < extra[2] / extra[1] < 0.75


def test_tiny_sweep_writes_json_and_the_readme_block(tmp_path):
    base = MSARConfig(d_model=128, n_blocks=1, n_heads=2, n_kv_heads=1, mlp_hidden=352, vocab_size=64,
                      max_seq_len=256)
    res = run_width_sweep((128, 256), base=base, T=16, batches=(1,), repeats=2, process_rounds=0)
    assert [r["d_model"] for r in res["rows"]] == [128, 256]
    for row in res["rows"]:
        assert set(row["pairs"]) == {"prefill", "decode_b1"} and "processes" not in row
        for pair in row["pairs"].values():
            assert pair["pairs"] == 2 and 0 < pair["min"] <= pair["median"] <= pair["max"]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BEGIN}\nold\n{END}\nafter\n")
    write_width_sweep(res, tmp_path / "out", readme)
    assert json.loads((tmp_path / "out" / "width_sweep.json").read_text())["rows"] == res["rows"]
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n") and "old" not in text
    table = width_table(res)
    assert table in text
    lines = table.splitlines()
    assert lines[-2].startswith("| 128 | ") and lines[-1].startswith("| 256 | ")
    assert lines[-1].split(" | ")[2] == "-"  # no one-process rounds: that column says so, not a number


@pytest.mark.parametrize("widths", ["512,abc", "512,200", "0", "-128", "", "512,512"])
def test_bad_widths_exit_2_with_one_line(widths, capsys):
    assert main(["bench", "--width-sweep", widths]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--width-sweep" in err[0]


OTHER_BLOCK = "another mode's block"


@pytest.mark.parametrize("text", [None, "no markers here\n", OTHER_BLOCK])
@pytest.mark.parametrize("mode, module, runner, other", [
    (["--width-sweep", "128"], "width", "run_width_sweep", "depth-sweep"),
    (["--depth-sweep", "2"], "depth", "run_depth_sweep", "width-sweep"),
    (["--quick"], "run", "run_bench", "depth-sweep")])
def test_a_readme_it_cannot_update_is_refused_before_the_run(text, mode, module, runner, other, tmp_path, capsys,
                                                             monkeypatch):
    """Every bench mode that rewrites a README block checks the file and that block's own markers
    before it runs (another mode's markers do not let it through)."""
    import importlib

    if text == OTHER_BLOCK:
        text = f"<!-- {other}:begin -->\n<!-- {other}:end -->\n"
    monkeypatch.setattr(importlib.import_module(f"msar_export.bench.{module}"), runner,
                        lambda *a, **k: pytest.fail("the run started"))
    readme = tmp_path / "README.md"
    if text is not None:
        readme.write_text(text)
    assert main(["bench", *mode, "--update-readme", str(readme)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--update-readme" in err[0]
    assert text is None and not readme.exists() or readme.read_text() == text


def test_width_and_depth_sweeps_together_are_refused_before_either_runs(capsys, monkeypatch):
    import msar_export.bench.depth as depth
    import msar_export.bench.width as width

    monkeypatch.setattr(depth, "run_depth_sweep", lambda *a, **k: pytest.fail("the depth sweep ran"))
    monkeypatch.setattr(width, "run_width_sweep", lambda *a, **k: pytest.fail("the width sweep ran"))
    assert main(["bench", "--width-sweep", "512", "--depth-sweep", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--width-sweep and --depth-sweep" in err[0]


def test_ratios_are_msar_over_standard_and_the_process_times_land_by_side(monkeypatch):
    """Stubbed runs and timers: which graph each pair and process ratio times on which side, and the
    one-process rows' ms taken from the right side of every round."""
    import msar_export.bench.paired as paired
    import msar_export.bench.processes as processes
    import msar_export.bench.steps as steps
    import msar_export.bench.width as width

    monkeypatch.setattr(steps, "ort_prefill_run", lambda path, ids, threads: ("prefill", Path(path).name))
    monkeypatch.setattr(steps, "ort_decode_run", lambda path, batch, vocab, threads: (f"b{batch}", Path(path).name))
    pairs, procs = [], []

    def pair(fn, base, warmup, repeats):
        pairs.append((fn, base))
        return {"median": 1.0, "min": 1.0, "max": 1.0, "pairs": repeats}

    def process(a, b, batch=None, tokens=512, rounds=4, threads=2, vocab=256, log=None):
        procs.append((Path(a).name, Path(b).name, batch))
        return {"median": 1.5, "min": 1.4, "max": 1.6, "pairs": rounds, "times": [[1.0, 4.0], [3.0, 6.0]]}

    monkeypatch.setattr(paired, "paired_ratio", pair)
    monkeypatch.setattr(processes, "process_ratio", process)
    import msar_export.bench.models as models

    monkeypatch.setattr(models, "export_random", lambda cfg, files, folder: {key: Path(folder) / f"{key[0]}.{key[1]}.onnx"
                                                                             for key in files})
    base = MSARConfig(d_model=128, n_blocks=1, n_heads=2, n_kv_heads=1, mlp_hidden=352, vocab_size=64, max_seq_len=256)
    res = run_width_sweep((128,), base=base, T=16, batches=(1, 3), repeats=2, process_rounds=2)
    assert pairs == [(("prefill", "msar.prefill.onnx"), ("prefill", "standard.prefill.onnx")),
                     (("b1", "msar.decode.onnx"), ("b1", "standard.decode.onnx")),
                     (("b3", "msar.decode.onnx"), ("b3", "standard.decode.onnx"))]
    assert procs == [("standard.prefill.onnx", "msar.prefill.onnx", None),
                     ("standard.decode.onnx", "msar.decode.onnx", 1), ("standard.decode.onnx", "msar.decode.onnx", 3)]
    row = res["rows"][0]["processes"]
    assert set(row) == {"prefill", "decode_b1", "decode_b3"}
    assert (row["prefill"]["standard_ms"], row["prefill"]["msar_ms"]) == (2.0, 5.0)  # medians of 1, 3 and 4, 6
    assert "times" not in row["prefill"] and row["prefill"]["pairs"] == 2


def test_readme_width_sweep_table_is_generated_from_the_checked_in_results():
    result = json.loads((REPO / "benchmarks" / "width_sweep.json").read_text())
    block = (REPO / "README.md").read_text().split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == width_table(result).strip()


def test_a_sweep_the_disk_cannot_hold_is_refused_before_any_export(tmp_path):
    from msar_export.bench.width import plan_disk
    from msar_export.errors import InputError

    base = BenchSettings().model
    assert plan_disk([widened(base, 512)], tmp_path) > 4 * 23e6 * 4  # four float32 files of 23 M+ parameters
    with pytest.raises(InputError, match=r"--width-sweep needs [0-9.]+ GiB free in .* set TMPDIR"):
        plan_disk([widened(base, 512), widened(base, 2**16)], tmp_path)  # 2^16 wide: terabytes
