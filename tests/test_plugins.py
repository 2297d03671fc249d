"""The TensorRT plugins (plugins/): sources compile, host logic, docs vs contract,
and the real kernel code run on the CPU (cudaHostEmulation.h) against the
eager mixer. No GPU and no TensorRT library needed; the glue tests need the
TensorRT headers (TENSORRT_INCLUDE_DIR) and skip without them.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from plugin_build import PLUGINS, cmake_build, emulation, run_cpp_test, trt_headers

from msar_export import kernels as K
from msar_export.export.contract_headers import render_headers
from msar_export.contracts import DEPTH_RETRIEVAL, FUSED_MIXER, PLUGIN_CONTRACTS, PLUGIN_NAMESPACE, PLUGIN_VERSION

REPO = PLUGINS.parent
README = {"FusedMixer": PLUGINS / "msarFusedMixerPlugin" / "README.md",
          "DepthRetrieval": PLUGINS / "msarDepthRetrievalPlugin" / "README.md"}
NO_HEADERS = "skipped: the plugin glue, its libraries and glueTest (no TensorRT headers: set TENSORRT_INCLUDE_DIR"


def run_compile_check(env_updates: dict, build_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TENSORRT_INCLUDE_DIR", "MSAR_BUILD_DIR")}
    if build_dir is not None:  # kept between runs: an unchanged tree is not compiled again
        env["MSAR_BUILD_DIR"] = str(build_dir)
    env.update(env_updates)
    return subprocess.run([str(PLUGINS / "compile_check.sh")], capture_output=True, text=True, env=env, timeout=600)


def compile_check_dir(tag: str) -> Path:
    return cmake_build().dir.with_name(cmake_build().dir.name + f"-compile-check-{tag}")


# ---------------------------------------------------------------------------
# Compilation (plugins/compile_check.sh over the CMake project)


def need_nvcc() -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found: the CUDA kernels cannot be compiled here")


@pytest.fixture(scope="module")
def compile_check_without_headers():
    """The kernels compiled for sm_80 alone: the lowest architecture the build ships for, so device code
    that needs a newer one fails here too (no source branches on __CUDA_ARCH__), at half of nvcc's work.
    Both shipped architectures: test_kernels_compile_with_nvcc_for_sm80_and_sm90 (slow tier)."""
    need_nvcc()
    return run_compile_check({"MSAR_CUDA_ARCHS": "80"}, compile_check_dir("kernels-sm80"))


def test_kernels_compile_with_nvcc_for_sm80(compile_check_without_headers):
    r = compile_check_without_headers
    assert r.returncode == 0, r.stdout + r.stderr
    assert "compiled: msar_kernel_objects (sm_80)" in r.stdout.splitlines(), r.stdout


@pytest.mark.slow  # the default tier compiles for sm_80 only (test_kernels_compile_with_nvcc_for_sm80)
def test_kernels_compile_with_nvcc_for_sm80_and_sm90():
    need_nvcc()
    r = run_compile_check({}, compile_check_dir("kernels"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "compiled: msar_kernel_objects (sm_80 sm_90)" in r.stdout.splitlines(), r.stdout


def test_compile_check_skips_glue_without_headers(compile_check_without_headers):
    lines = compile_check_without_headers.stdout.splitlines()
    assert any(line.startswith(NO_HEADERS) for line in lines), lines
    assert not any(line.startswith("FAILED") for line in lines)


def test_compile_check_reports_a_compile_error():
    """Negative control: a CUDA compiler that fails must make the script fail, not skip the kernels."""
    r = run_compile_check({"NVCC": "/bin/false", "MSAR_CUDA_ARCHS": "80"})
    assert r.returncode != 0
    assert "FAILED: configure" in r.stdout.splitlines()


def test_glue_compiles_against_tensorrt_headers():
    inc = trt_headers()
    if inc is None:
        pytest.skip("set TENSORRT_INCLUDE_DIR to the TensorRT include/ folder to compile the plugin glue")
    r = run_compile_check({"TENSORRT_INCLUDE_DIR": inc, "MSAR_CUDA_ARCHS": "none"}, compile_check_dir("glue"))
    assert r.returncode == 0, r.stdout
    assert "compiled: msar_glue_objects (TensorRT headers)" in r.stdout.splitlines()


# ---------------------------------------------------------------------------
# The C++ tests (CTest targets of plugins/CMakeLists.txt)


def test_cpp_tests_are_registered_with_ctest():
    build = cmake_build(with_tensorrt=trt_headers() is not None)
    build.configure()
    r = subprocess.run(["ctest", "--test-dir", str(build.dir), "-N"], capture_output=True, text=True, timeout=60)
    names = set(re.findall(r"Test +#\d+: (\w+)", r.stdout))
    want = {t for t in ("logicTest", "nodeRules", "indexTest", "glueTest", "pluginHarness") if build.has_target(t)}
    assert {"logicTest", "nodeRules"} <= want and names == want, r.stdout


def test_plugin_sources_are_named_explicitly(monkeypatch, tmp_path):
    """No lookup relative to the installed package: an argument or MSAR_PLUGIN_SOURCES, else a clear error."""
    monkeypatch.delenv(K.cmake.SOURCES_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match="MSAR_PLUGIN_SOURCES"):
        K.plugin_sources()
    with pytest.raises(FileNotFoundError, match="no CMakeLists.txt"):
        K.plugin_sources(tmp_path)
    monkeypatch.setenv(K.cmake.SOURCES_ENV, str(PLUGINS))
    assert K.plugin_sources() == PLUGINS.resolve()


def test_host_logic():
    r = run_cpp_test("logicTest", timeout=60)
    assert r.returncode == 0, r.stdout
    assert re.fullmatch(r"logicTest: \d+ checks passed\n", r.stdout)


def test_glue_drives_plugins_on_emulated_kernels():
    """IPluginV3 calls as TensorRT makes them, enqueue on the CPU build of the kernels."""
    if trt_headers() is None:
        pytest.skip("set TENSORRT_INCLUDE_DIR to the TensorRT include/ folder to test the plugin glue")
    r = run_cpp_test("glueTest", with_tensorrt=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.fullmatch(r"glueTest: \d+ checks passed\n", r.stdout)


# ---------------------------------------------------------------------------
# One contract: READMEs and the C++ constants agree with contracts.py


def readme_tables(path: Path) -> dict[str, list[list[str]]]:
    """{section: rows} for the first table under each `## ` heading; cells stripped of backticks."""
    tables, section, rows = {}, None, None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            section, rows = line[3:].strip(), None
        elif line.startswith("|") and section is not None and section not in tables:
            cells = [c.strip().replace("`", "") for c in line.strip().strip("|").split("|")]
            if rows is None:
                rows = []  # header row
            elif not all(set(c) <= {"-", " ", ":"} for c in cells):
                rows.append(cells)
        elif rows is not None and section not in tables:
            tables[section] = rows
    if rows is not None and section not in tables:
        tables[section] = rows
    return tables


@pytest.mark.parametrize("op", sorted(PLUGIN_CONTRACTS))
def test_readme_tables_match_contract(op):
    contract, tables = PLUGIN_CONTRACTS[op], readme_tables(README[op])
    assert tables["Inputs"] == [[p.name, p.shape, p.dtype, "yes" if p.variadic else "no", p.doc]
                                for p in contract.inputs]
    assert tables["Outputs"] == [[p.name, p.shape, p.dtype, p.doc] for p in contract.outputs]
    attrs = tables["Attributes"]
    assert [r[:2] + [r[3]] for r in attrs] == [[a.name, a.type, a.doc] for a in contract.attributes]
    for row, a in zip(attrs, contract.attributes):
        assert (row[2] == "required") if a.default is None else (ast.literal_eval(row[2]) == a.default), row
    header = README[op].read_text()
    assert f"| `{op}` | `{PLUGIN_VERSION}` | `\"{PLUGIN_NAMESPACE}\"` |" in header
    assert "## Changelog" in header


def test_readme_parser_sees_a_drift(tmp_path):
    """Negative control for the table parser: an edited shape is a different table."""
    text = README["FusedMixer"].read_text().replace("| `gate_bias` | `[m]` |", "| `gate_bias` | `[m, 1]` |")
    (tmp_path / "README.md").write_text(text)
    rows = readme_tables(tmp_path / "README.md")["Inputs"]
    assert ["gate_bias", "[m, 1]"] == rows[2][:2]


@pytest.mark.parametrize("rel", sorted(render_headers()))
def test_generated_headers_are_current(rel):
    """plugins/common/msarOpContracts.h and msarKernelAttrs.h are contracts.py rendered, byte for byte."""
    assert (PLUGINS / rel).read_bytes() == render_headers()[rel].encode(), (
        f"regenerate: python -m msar_export.export.contract_headers plugins  ({rel})")


def test_readme_attribute_tables_are_current():
    """Each plugin README's attribute table is the contract rendered (a new attribute: regenerate)."""
    from msar_export.export.contract_headers import render_readmes

    for rel, text in render_readmes(PLUGINS).items():
        assert (PLUGINS / rel).read_text() == text, f"regenerate: python -m msar_export.export.contract_headers plugins ({rel})"


def test_generated_headers_follow_the_contract():
    """The field table and the kernel-argument members name every attribute, in contract order."""
    src = render_headers()["common/msarOpContracts.h"]
    kinds = {"INTS": "kINT32", "INT": "kINT32", "FLOAT": "kFLOAT32", "STRING": "kCHAR"}
    for contract in (FUSED_MIXER, DEPTH_RETRIEVAL):
        body = re.search(f"k{contract.name}Fields" + r"\[\] = \{(.*?)\n\};", src, re.S).group(1)
        assert re.findall(r'\{"(\w+)", FieldKind::(\w+)\}', body) == [(a.name, kinds[a.type]) for a in contract.attributes]
        assert f"k{contract.name}FixedInputs = {contract.n_fixed_inputs};" in src
    assert f'kPluginVersion = "{PLUGIN_VERSION}";' in src and f'kPluginNamespace = "{PLUGIN_NAMESPACE}";' in src
    args = [name for name, _ in K.FusedMixerArgs._fields_]
    members = [m for a in FUSED_MIXER.kernel_attributes for _, m in a.kernel_members()]
    assert args[args.index("conv_rows") + 1:args.index("out")] == members
    assert members[:3] == ["stream_kernels", "n_streams", "eps"]


def test_common_does_not_include_the_plugin_folders():
    for path in (PLUGINS / "common").iterdir():
        assert not re.search(r'#include "\.\./msar\w+Plugin/', path.read_text()), path.name


# ---------------------------------------------------------------------------
# The kernel source, run on the CPU


@pytest.fixture(scope="module")
def emulated():
    return emulation()


FUSED_CASES = [  # (n, stream_kernels, B, T, d): every stream bucket (2/4/8), odd d, n = 1, T < tile
    (1, [1], 2, 5, 32),
    (2, [1, 2], 1, 11, 33),
    (3, [1, 3, 5], 2, 9, 40),
    (4, [1, 4, 8, 12], 1, 19, 64),
    (2, [1, 2, 3, 4, 5, 6], 1, 6, 40),
]


@pytest.mark.parametrize("n,ks,B,T,d", FUSED_CASES, ids=[f"n{c[0]}-k{'-'.join(map(str, c[1]))}" for c in FUSED_CASES])
def test_emulated_fused_mixer_matches_eager_mixer(emulated, n, ks, B, T, d):
    inp = K.random_fused_mixer_inputs(n, B, T, d, ks, seed=n + d)
    got = emulated.fused_mixer(**inp)
    eager = K.eager_fused_mixer(**inp)
    assert K.rel_err(got, eager) <= 1e-5
    assert K.rel_err(got, K.reference_fused_mixer64(**inp)) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_emulated_fused_mixer_half_types(emulated, dtype):
    inp = K.random_fused_mixer_inputs(3, 2, 7, 40, [1, 3, 5], dtype=dtype, seed=1)
    got = emulated.fused_mixer(**inp)
    assert got.dtype == dtype
    eager = K.eager_fused_mixer(**inp).to(dtype)  # float32 inside, rounded once at the end
    assert K.rel_err(got, eager) <= (2e-3 if dtype == torch.float16 else 1.6e-2)


def test_emulated_fused_mixer_is_causal(emulated):
    inp = K.random_fused_mixer_inputs(3, 1, 20, 32, [1, 4, 8, 12], seed=2)
    a = emulated.fused_mixer(**inp)
    inp["sources"] = [torch.cat([s[:, :12], s[:, 12:] + 1.0], dim=1) for s in inp["sources"]]
    b = emulated.fused_mixer(**inp)
    assert torch.equal(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_emulated_fused_mixer_catches_a_wrong_tap(emulated):
    """Negative control: one tap off by 2% in the reference must show."""
    inp = K.random_fused_mixer_inputs(2, 1, 9, 32, [1, 3, 5], seed=4)
    got = emulated.fused_mixer(**inp)
    wrong = dict(inp, conv_weight=inp["conv_weight"].clone())
    wrong["conv_weight"][1, 0, :] *= 1.02
    assert K.rel_err(got, K.reference_fused_mixer64(**wrong)) > 1e-4


def test_emulated_fused_mixer_reads_the_conv_bank_as_exported(emulated):
    """conv_weight [N, K, d] is read in place (nothing prepared, no workspace needed): rows past the n
    sources are never read, a changed tap of a used row changes the answer, and with no workspace
    (unsplit) the result is the same bits every call."""
    inp = K.random_fused_mixer_inputs(3, 2, 9, 40, [1, 3, 5], seed=7, extra_rows=2)
    none = torch.empty(0, dtype=torch.uint8)
    want = emulated.fused_mixer(**inp, workspace=none)
    assert K.rel_err(want, K.reference_fused_mixer64(**inp)) <= 1e-5
    spare = dict(inp, conv_weight=inp["conv_weight"].clone())
    spare["conv_weight"][3:] = float("nan")
    assert torch.equal(emulated.fused_mixer(**spare, workspace=none), want)
    used = dict(inp, conv_weight=inp["conv_weight"].clone())
    used["conv_weight"][2, 0, :] += 0.5
    assert not torch.allclose(emulated.fused_mixer(**used, workspace=none), want)


def test_emulated_depth_retrieval_matches_eager(emulated):
    g = torch.Generator().manual_seed(0)
    q = 0.3 * torch.randn(4, 40, generator=g)
    views = [torch.randn(2, 3, 4, 40, generator=g) for _ in range(3)]
    got = emulated.depth_retrieval(q, views, 1e-6)
    assert K.rel_err(got, K.eager_depth_retrieval(q, views, 1e-6)) <= 1e-5
    assert K.rel_err(got, K.reference_depth_retrieval64(q, views, 1e-6)) <= 1e-5


def test_emulated_kernel_refuses_bad_arguments(emulated):
    inp = K.random_fused_mixer_inputs(2, 1, 4, 32, [1, 3], seed=0)
    with pytest.raises(RuntimeError, match="invalid argument"):
        emulated.fused_mixer(**dict(inp, stream_kernels=[2, 3]))
    with pytest.raises(RuntimeError, match="workspace too small"):
        emulated.fused_mixer(**inp, workspace=torch.empty(8, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="invalid argument"):  # N < n
        emulated.fused_mixer(**dict(inp, conv_weight=inp["conv_weight"][:1].contiguous()))


# ---------------------------------------------------------------------------
# scripts/gpu_check.sh and its helper


@pytest.mark.slow  # gpu_check.py's correctness run in the default tier: test_gpu_check.py::test_dry_run_passes_end_to_end
def test_gpu_check_helper_runs_on_the_emulated_kernels(emulated, tmp_path):
    out = tmp_path / "results.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--emulation", str(emulated.path),
                        "--out", str(out)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})  # this checkout's msar_export
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(out.read_text())
    assert results["failed"] == 0 and len(results["results"]) >= 10
    assert {row["op"] for row in results["results"]} == {"FusedMixer", "DepthRetrieval"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the real check would run")
def test_gpu_check_skips_without_a_gpu(tmp_path):
    r = subprocess.run([str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHON": sys.executable, "MSAR_GPU_CHECK_DIR": str(tmp_path / "g")})
    assert r.returncode == 0
    assert r.stdout.strip() == "skipped: no CUDA device"
    assert not (tmp_path / "g").exists()
