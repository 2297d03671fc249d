"""scripts/gpu_check.sh before a GPU ever runs it: `--dry-run` runs every host-side step
(build, plugin harness, correctness, the timing and report code, the ncu report parser) on
the CPU emulation, so the script's own bugs are found here and not in a device's minutes.
Negative controls put known defects back and must make the dry run fail."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from plugin_build import cmake_build, emulation, trt_headers

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))
import ncu_summary  # noqa: E402


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    emulation()  # the emulation library built (and the harness, with headers) in the shared build folder
    build = cmake_build(with_tensorrt=trt_headers() is not None)
    if build.has_target("pluginHarness"):
        build.build("pluginHarness", "msar_emulation")
    out = tmp_path_factory.mktemp("gpu_check")
    device_out = tmp_path_factory.mktemp("device_out")  # the device tool's $OUT
    env = {**os.environ, "PYTHON": sys.executable, "MSAR_GPU_CHECK_DIR": str(out), "MSAR_GPU_CHECK_BUILD": str(build.dir),
           "OUT": str(device_out)}
    r = subprocess.run([str(SCRIPTS / "gpu_check.sh"), "--dry-run"], capture_output=True, text=True, env=env,
                       timeout=600)
    return r, out, device_out


def test_dry_run_passes_end_to_end(dry_run):
    r, out, _ = dry_run
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (out / "summary.txt").read_text().splitlines()
    assert "ok: build" in " ".join(summary) and any(line.startswith("ok: check") for line in summary), summary
    assert not any(line.startswith("FAILED") for line in summary), summary
    harness = [line for line in summary if "harness" in line]
    assert harness and harness[0].startswith("ok: harness" if trt_headers() else "skipped: harness"), summary
    results = json.loads((out / "results.json").read_text())
    assert results["failed"] == 0
    checked = [row for row in results["results"] if row["op"] in ("FusedMixer", "DepthRetrieval")]
    assert len(checked) >= 10 and all(row["ok"] for row in checked), checked  # the correctness run came first
    ops = {row["op"] for row in results["results"]}
    assert ops == {"FusedMixer", "DepthRetrieval", "copy bandwidth", "prefill paths", "decode retrieval"}, ops
    for row in results["results"]:
        if row["op"] == "prefill paths":
            assert row["timer"] == "host, dry run" and "cached_ms" in row
            assert {"fused_bytes", "fused_gbs", "fused_copy_fraction", "fused_vs_model", "retrieval_vs_model"} <= set(row)
        if row["op"] == "decode retrieval":
            assert row["dtype"] == "bfloat16" and row["retrieval_model_us"] > 0  # the decode export's views



def test_device_folder_gets_two_files_with_every_result(dry_run):
    """The device tool brings back at most 8 files from $OUT: the run leaves its summary and one
    archive of every log and result there, and never the build folder."""
    _, out, device_out = dry_run
    assert sorted(p.name for p in device_out.iterdir()) == ["gpu_check.tgz", "summary.txt"]
    assert (device_out / "summary.txt").read_text() == (out / "summary.txt").read_text()
    with tarfile.open(device_out / "gpu_check.tgz") as tar:
        names = {n.lstrip("./") for n in tar.getnames()} - {""}
    assert {"summary.txt", "results.json", "check.log", "build.log"} <= names, names
    assert names == {p.name for p in out.iterdir()} - {"cmake"}, names

def test_dry_run_catches_the_dtype_mix_put_back(tmp_path):
    """Negative control for issue 23 defect 1: the cached path's gate fusion given a bfloat16 z with the
    float32 weights stream_fusion makes ('expected m1 and m2 to have the same dtype') fails the dry run."""
    lib = emulation()
    for name in ("gpu_check.py", "gpu_timing.py", "kernel_model.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    timing = (tmp_path / "gpu_timing.py").read_text()
    assert "stream_fusion(z.float()," in timing
    (tmp_path / "gpu_timing.py").write_text(timing.replace("stream_fusion(z.float(),", "stream_fusion(z,"))
    r = subprocess.run([sys.executable, str(tmp_path / "gpu_check.py"), "--emulation", str(lib.path), "--dry-run",
                        "--out", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode != 0
    assert "same dtype" in r.stderr, r.stderr[-2000:]


def test_ncu_report_parser(tmp_path):
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    rows = [head, ["0"] * 4 + ["tileMixerKernel<bf16>", "1", "7", "(256,1,1)", "(128,1,1)", "0", "9.0",
                               "GPU Speed Of Light", "Duration", "us", "12.5"],
            ["0"] * 4 + ["tileMixerKernel<bf16>", "1", "7", "(256,1,1)", "(128,1,1)", "0", "9.0", "x", "Other", "", "1"]]
    (tmp_path / "r.csv").write_text("\n".join(",".join(f'"{c}"' for c in r) for r in rows) + "\n")
    lines = ncu_summary.summary_lines(str(tmp_path / "r.csv"))
    assert len(lines) == 1 and "Duration" in lines[0] and lines[0].endswith("12.5 us")
    (tmp_path / "empty.csv").write_text("")
    assert ncu_summary.summary_lines(str(tmp_path / "empty.csv")) == []


@pytest.mark.slow
def test_device_build_compiles_the_harness(tmp_path):
    """`gpu_check.sh --build-only`: what a GPU run builds first (the CUDA kernels and, with TensorRT headers from a
    folder outside the checkout, the plugin harness on them), compiled here by nvcc for sm_90, nothing run. A few
    minutes of nvcc: the device's minutes are not spent on a compile error."""
    if shutil.which(os.environ.get("NVCC", "nvcc")) is None or trt_headers() is None:
        pytest.skip("needs nvcc and TENSORRT_INCLUDE_DIR (TensorRT's include/ folder)")
    env = {**os.environ, "PYTHON": sys.executable, "MSAR_GPU_CHECK_DIR": str(tmp_path / "out"),
           "MSAR_GPU_CHECK_BUILD": str(tmp_path / "build")}
    r = subprocess.run([str(SCRIPTS / "gpu_check.sh"), "--build-only"], capture_output=True, text=True, env=env,
                       timeout=1800)
    assert r.returncode == 0, r.stdout + (tmp_path / "out" / "build.log").read_text()[-4000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "ok: build" in summary and "ok: device harness built" in summary, summary
    assert "registers" in (tmp_path / "out" / "ptxas.txt").read_text()  # ptxas ran: device code was compiled


def test_headers_inside_the_checkout_are_refused(tmp_path):
    """TensorRT's headers are never committed here: a TENSORRT_INCLUDE_DIR inside the checkout that git would track
    is a usage error (exit 2) before anything else; with a folder outside, the same call gets past that check to
    the next one (an unknown option here, so nothing runs)."""
    def call(include: Path):
        return subprocess.run([str(SCRIPTS / "gpu_check.sh"), "--no-such-mode"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "TENSORRT_INCLUDE_DIR": str(include)})

    inside, outside = call(REPO / "plugins"), call(tmp_path)
    assert inside.returncode == 2 and "inside this checkout and not ignored" in inside.stderr, inside.stderr
    assert outside.returncode == 2 and "usage" in outside.stderr and "inside" not in outside.stderr, outside.stderr
