"""The kernels' every launch path at the edge shapes, on the CPU emulation
(plugins/tests/cudaHostEmulation.h), against the float64 references:
fp32 within 1e-5, fp16/bf16 within 1e-2.

Paths (plugins/msarFusedMixerPlugin/fusedMixerPlan.h): the tile kernel with
vector or scalar loads and 1, 2 or 4 tokens per block, split over source
ranges with a log-sum-exp merge when B*T is small (not without a workspace), and the warp kernel where m*d is too
large for shared memory (or the plan's cost model rates it faster). The emulated GPU has 132 SMs and 227 KiB of
shared memory per block unless MSAR_EMU_SM_COUNT / MSAR_EMU_SMEM_OPTIN say otherwise.
Index arithmetic beyond 2^31 elements: plugins/tests/indexTest.cpp.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from plugin_build import PLUGINS, emulation, run_cpp_test

from msar_export import kernels as K

MAIN = [1, 4, 8, 12]
BOUND = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


@pytest.fixture(scope="module")
def emulated():
    return emulation()


def unsplit(lib, inp) -> torch.Tensor:
    """The mixer with no workspace: no room for split partials, one block walks every source."""
    return lib.fused_mixer(**inp, workspace=torch.empty(0, dtype=torch.uint8))


def mixer_error(lib, inp, split: bool = True) -> float:
    got = lib.fused_mixer(**inp) if split else unsplit(lib, inp)
    return K.rel_err(got, K.reference_fused_mixer64(**inp))


@pytest.fixture(scope="module")
def index_test():
    return run_cpp_test("indexTest", timeout=60)


def assert_catches_a_wrong_tap(lib, inp, source: int):
    """The mixer passes the 1e-5 bar against its float64 reference, and fails it against a reference whose
    current-token tap of stream 1 (index 3) is 2% off in one source: the comparison can fail."""
    got = lib.fused_mixer(**inp)
    assert K.rel_err(got, K.reference_fused_mixer64(**inp)) <= 1e-5
    wrong = dict(inp, conv_weight=inp["conv_weight"].clone())
    wrong["conv_weight"][source, 3, :] *= 1.02
    assert K.rel_err(got, K.reference_fused_mixer64(**wrong)) > 1e-5


def test_index_math_and_plans_beyond_2_31(index_test):
    assert index_test.returncode == 0, index_test.stdout
    assert re.search(r"\nindexTest: \d+ checks passed\n\Z", index_test.stdout), index_test.stdout


def test_plan_has_no_step_at_the_old_crossover(index_test):
    """Issue 23 defect 6, on the plan's own cost model (fusedMixerPlan.h modelMixerClocks), H200-sized (132 SMs):
    from T to T+1 across the old tile/warp crossover (8 tokens per SM: 1,056 tokens) the modelled time moves by
    at most 1%. Negative control in the same sweeps: the old rule (warp kernel above 8 tokens per SM) jumps
    there. indexTest checks both and prints the figures this test reads."""
    lines = re.findall(r"crossover (.+): plan max step ([\d.]+)% at T=(\d+), old rule ([\d.]+)% at T=(\d+)",
                       index_test.stdout)
    assert len(lines) == 4 and any(name.startswith("bf16 B=1 T=1000..1100 d=4096") for name, *_ in lines), lines
    for name, new, _, old, old_at in lines:
        assert float(new) <= 1.0, name
        assert float(old) > 1.0 and int(old_at) * (4 if "B=4" in name else 1) == 1056, name


def test_cost_model_constants_are_the_plans():
    """scripts/kernel_model.py (docs/kernels.md's rows, gpu_check's 'x model' ratios) and the plan's cost model
    must price the kernels alike: the same instruction counts and issue model, read from the header."""
    header = (Path(__file__).resolve().parent.parent / "plugins/msarFusedMixerPlugin/fusedMixerPlan.h").read_text()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import kernel_model

    def const(name):
        return float(re.search(rf"constexpr \w+ {name} = ([\d.]+);", header).group(1))

    assert kernel_model.TILE_INSTR == const("kTileInstrPerElementToken")
    assert kernel_model.WARP_INSTR == const("kWarpInstrPerElementToken")
    assert kernel_model.WARPS_FULL_ISSUE == const("kWarpsForFullIssue")
    # Its mirror of planTile's tile choice, at the plans indexTest checks: bf16 d 4096 two tokens (z 128 KiB),
    # d 1024 four, fp32 d 8192 one, 8 streams at fp32 d 8192 none (the warp kernel).
    assert kernel_model.tile_plan(2, 4, 4096)[:2] == (2, 256)
    assert kernel_model.tile_plan(2, 4, 1024)[0] == 4
    assert kernel_model.tile_plan(4, 4, 8192)[0] == 1
    assert kernel_model.tile_plan(4, 8, 8192) is None


TILE_CASES = [  # (n, stream_kernels, B, T, d), unsplit
    (3, [1, 3, 5], 2, 9, 64),         # 4-stream bucket, 4 tokens per block, T not a multiple
    (2, [1, 2], 1, 7, 48),            # 2-stream bucket
    (2, [1, 2, 3, 4, 5, 6], 1, 3, 32),  # 8-stream bucket, 1 token
    (3, MAIN, 1, 6, 33),              # odd d: scalar loads
    (3, MAIN, 2, 1, 32),              # one token, every kernel longer than T
    (2, [1, 12], 1, 5, 64),           # kernel longer than T
    (1, [1], 2, 4, 64),               # one source, identity stream only
]


@pytest.mark.parametrize("n,ks,B,T,d", TILE_CASES, ids=[f"n{c[0]}-m{len(c[1])}-T{c[3]}-d{c[4]}" for c in TILE_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tile_kernel(emulated, n, ks, B, T, d, dtype):
    inp = K.random_fused_mixer_inputs(n, B, T, d, ks, dtype=dtype, seed=T + d)
    assert mixer_error(emulated, inp, split=False) <= BOUND[dtype]


AROUND_CROSSOVER = [(2, 16), (2, 17), (1, 8), (1, 9)]  # (emulated SMs, T): 8 tokens per SM and one more


@pytest.mark.parametrize("sms,T", AROUND_CROSSOVER, ids=[f"sm{c[0]}-T{c[1]}" for c in AROUND_CROSSOVER])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_around_the_old_crossover(emulated, monkeypatch, sms, T, dtype):
    """Issue 23 defect 6: where the old plan switched to the warp kernel (8 tokens per SM; a few emulated SMs put
    it at a shape the emulation runs), the kernel the plan now picks, against float64."""
    monkeypatch.setenv("MSAR_EMU_SM_COUNT", str(sms))
    inp = K.random_fused_mixer_inputs(5, 1, T, 64, MAIN, dtype=dtype, seed=T)
    assert mixer_error(emulated, inp) <= BOUND[dtype]


def test_around_the_old_crossover_catches_a_wrong_tap(emulated, monkeypatch):
    """Negative control of the comparison above: one tap of one source 2% off in the reference fails 1e-5."""
    monkeypatch.setenv("MSAR_EMU_SM_COUNT", "1")
    assert_catches_a_wrong_tap(emulated, K.random_fused_mixer_inputs(5, 1, 9, 64, MAIN, seed=9), source=2)


@pytest.mark.parametrize("ks", [[1, 3, 5], [1, 2, 3, 4, 5, 6, 7, 8]], ids=["m3", "m8"])
def test_warp_kernel(emulated, monkeypatch, ks):
    """The warp kernel, which runs where one token's z does not fit shared memory: a 512-byte emulated opt-in limit
    puts a small shape there (8 streams at d = 8192 on an H200 is the slow tier's). Another kernel than the
    tile kernel's ran: the two sum in other orders, so float32 results differ in the last bits. One emulated SM:
    at this size on 132 SMs the cost model rates the warp kernel faster for 8 streams (18 warps in flight
    against 10), on one SM the tile kernel."""
    monkeypatch.setenv("MSAR_EMU_SM_COUNT", "1")
    inp = K.random_fused_mixer_inputs(3, 2, 9, 40, ks, seed=21)
    tile = emulated.fused_mixer(**inp)
    monkeypatch.setenv("MSAR_EMU_SMEM_OPTIN", "512")
    warp = emulated.fused_mixer(**inp)
    assert K.rel_err(warp, K.reference_fused_mixer64(**inp)) <= 1e-5
    assert not torch.equal(warp, tile)


SPLIT_CASES = [(97, MAIN, 1, 1, 64), (5, MAIN, 1, 3, 40), (8, [1, 2], 2, 2, 32)]


@pytest.mark.parametrize("n,ks,B,T,d", SPLIT_CASES, ids=[f"n{c[0]}-T{c[3]}" for c in SPLIT_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.float16, marks=pytest.mark.slow)])
def test_split_sources_merge_to_the_same_mixer(emulated, n, ks, B, T, d, dtype):
    """132 emulated SMs and a handful of tokens: source ranges in separate blocks, merged by log-sum-exp;
    the same answer as one block walking every source."""
    inp = K.random_fused_mixer_inputs(n, B, T, d, ks, dtype=dtype, seed=n)
    split = emulated.fused_mixer(**inp)
    assert K.rel_err(split, K.reference_fused_mixer64(**inp)) <= BOUND[dtype]
    whole = unsplit(emulated, inp)
    if dtype == torch.float32:
        assert not torch.equal(split, whole)  # another order of summation: the split really ran
    assert K.rel_err(split, whole) <= (2e-6 if dtype == torch.float32 else 2e-3)


def test_split_path_catches_a_wrong_tap(emulated):
    """Negative control on the split path: the current-token tap of stream 1 (index 3) 2% off in one
    source's reference must fail the 1e-5 bar. (With T = 2 the taps of tokens before the start do not count.)"""
    assert_catches_a_wrong_tap(emulated, K.random_fused_mixer_inputs(97, 1, 2, 32, MAIN, seed=3), source=40)


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values one element past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out


def test_misaligned_sources_take_scalar_loads(emulated):
    inp = K.random_fused_mixer_inputs(3, 1, 5, 64, MAIN, seed=9)
    inp["sources"] = [misaligned(s) for s in inp["sources"]]
    assert inp["sources"][0].data_ptr() % 16 != 0
    # A vector load here would report cudaErrorMisalignedAddress (indexTest checks the emulation sees it).
    assert mixer_error(emulated, inp, split=False) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_d_8192_tile_kernel(emulated, dtype):
    inp = K.random_fused_mixer_inputs(3, 1, 2, 8192, MAIN, dtype=dtype, seed=11)
    assert mixer_error(emulated, inp) <= BOUND[dtype]


@pytest.mark.slow
def test_d_8192_eight_streams_takes_the_warp_kernel(emulated):
    """z of one token (8 x 8192 floats) is over the 227 KiB of shared memory: the warp kernel."""
    inp = K.random_fused_mixer_inputs(2, 1, 2, 8192, [1, 2, 3, 4, 5, 6, 7, 8], seed=12)
    assert mixer_error(emulated, inp) <= 1e-5


@pytest.mark.slow
def test_256_sources(emulated):
    inp = K.random_fused_mixer_inputs(256, 1, 3, 32, MAIN, seed=13)
    assert mixer_error(emulated, inp) <= 1e-5


# ---------------------------------------------------------------------------
# DepthRetrieval


def retrieval_inputs(n, B, T, m, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (2.0 / d**0.5 * torch.randn(m, d, generator=g)).to(dtype)
    return q, [torch.randn(B, T, m, d, generator=g).to(dtype) for _ in range(n)]


RETRIEVAL_CASES = [  # (n, B, T, m, d)
    pytest.param(97, 1, 1, 4, 4096, marks=pytest.mark.slow, id="decode-n97-d4096"),  # 4 rows, in channel slices
    pytest.param(97, 1, 1, 4, 512, id="decode-n97-d512"),
    pytest.param(3, 2, 5, 3, 40, id="prefill-n3-d40"),  # many rows, 16-byte loads
    pytest.param(1, 1, 2, 2, 41, id="n1-odd-d"),  # scalar loads
    pytest.param(2, 1, 1, 1, 12800, marks=pytest.mark.slow, id="d12800-query-unstaged"),  # d floats over 48 KiB
]


@pytest.mark.parametrize("n,B,T,m,d", RETRIEVAL_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_depth_retrieval(emulated, n, B, T, m, d, dtype):
    q, views = retrieval_inputs(n, B, T, m, d, dtype, seed=n + d)
    got = emulated.depth_retrieval(q, views, 1e-6)
    assert K.rel_err(got, K.reference_depth_retrieval64(q, views, 1e-6)) <= BOUND[dtype]


def test_depth_retrieval_catches_a_wrong_view(emulated):
    """Negative control: one view 2% off in the reference must fail the 1e-5 bar."""
    q, views = retrieval_inputs(9, 1, 1, 4, 256, torch.float32, seed=1)
    got = emulated.depth_retrieval(q, views, 1e-6)
    views[4] = views[4] * 1.02
    assert K.rel_err(got, K.reference_depth_retrieval64(q, views, 1e-6)) > 1e-5


def test_depth_retrieval_misaligned_views(emulated):
    q, views = retrieval_inputs(4, 1, 1, 4, 256, torch.float32, seed=2)
    views = [misaligned(v) for v in views]
    got = emulated.depth_retrieval(q, views, 1e-6)
    assert K.rel_err(got, K.reference_depth_retrieval64(q, views, 1e-6)) <= 1e-5


def opt_in_counts(library: Path) -> list[int]:
    """cudaFuncSetAttribute calls (counted by the emulation) before and after each of three launches of a mixer
    whose token z needs 64 KiB of shared memory, in a fresh process: no earlier test has opted this kernel in."""
    code = f"""
import ctypes, torch
from msar_export import kernels as K
lib = K.KernelLibrary({str(library)!r})
calls = lib.lib.msarEmuFuncAttributeCalls
calls.restype = ctypes.c_int
inp = K.random_fused_mixer_inputs(3, 1, 1, 4096, [1, 4, 8, 12], seed=5)  # z of a token: 64 KiB of shared memory
counts = [calls()]
for _ in range(3):
    lib.fused_mixer(**inp)
    counts.append(calls())
print(counts)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert r.returncode == 0, r.stderr
    return eval(r.stdout.strip())  # noqa: S307 - our own subprocess's list of ints


def opted_in_once(counts: list[int]) -> bool:
    # The first launch must be seen (the counter works); a per-launch opt-in adds as much again on every launch.
    return counts[0] == 0 and counts[1] >= 1 and counts[1] == counts[2] == counts[3]


def test_shared_memory_opt_in_once_per_kernel_and_device(emulated):
    """Issue 23 defect 4: cudaFuncSetAttribute once per kernel and device, not per launch: process-wide and not
    stream-ordered, per-launch calls let threads with different d race."""
    counts = opt_in_counts(emulated.path)
    assert opted_in_once(counts), counts


PER_LAUNCH_OPT_IN = """    static std::mutex lock;"""


@pytest.mark.slow
def test_opt_in_per_launch_put_back_fails(tmp_path):
    """Negative control for defect 4: plugins/ copied with allowDynamicShared as it was (cudaFuncSetAttribute to the
    launch's size on every launch, no lock, no memory of what was done), its emulation built (~1-3 min of g++):
    the check above must fail on it."""
    src = tmp_path / "plugins"
    shutil.copytree(PLUGINS, src)
    common = src / "common" / "msarKernelCommon.cuh"
    text = common.read_text()
    start = text.index(PER_LAUNCH_OPT_IN)
    end = text.index("    return st;\n}", start) + len("    return st;\n}")
    common.write_text(text[:start] + "    return setMaxDynamicShared(kernel, static_cast<int>(bytes));\n}"
                      + text[end:])
    build = K.CMakeBuild(src, defines={"MSAR_CUDA": "OFF"}, build_dir=tmp_path / "build")
    if not build.has_target("msar_emulation"):
        pytest.skip(f"msar_emulation is not built here: {build.configure()}")
    counts = opt_in_counts(build.built("msar_emulation"))
    assert not opted_in_once(counts), counts
    assert counts[3] - counts[1] == 2 * (counts[1] - counts[0]), counts  # one opt-in per kernel per launch
