/*
 * Index arithmetic and launch plans of the kernels at shapes far too large to
 * allocate here (B*T*d above 2^31), the plan's modelled time across the old
 * tile/warp crossover, plus the emulation's alignment fault.
 * Built and run by tests/test_kernel_shapes.py:
 *   the indexTest target of plugins/CMakeLists.txt (CTest)
 * Prints one "crossover ..." line per sweep, then "indexTest: N checks passed" or
 * the first failure (exit 1).
 */
#include "cudaHostEmulation.h"

#include "../common/msarKernelCommon.cuh"
#include "../msarFusedMixerPlugin/fusedMixerPlan.h"

#include <cstdio>
#include <cstdlib>

using namespace msar::kernels;

namespace
{
int gChecks = 0;

void check(bool ok, char const* what, int line)
{
    ++gChecks;
    if (!ok)
    {
        std::printf("indexTest: FAILED line %d: %s\n", line, what);
        std::exit(1);
    }
}
#define CHECK(x) check((x), #x, __LINE__)

constexpr size_t kH200Optin = 227 * 1024;

void offsets()
{
    // Last element of a [64, 8192, 8192] tensor: 2^32 - 1, beyond int32.
    int64_t const last = tokenOffset(63, 8191, 8192, 8192) + 8191;
    CHECK(last == (int64_t{1} << 32) - 1);
    // [B, T, m, d] views seen as rows of d: row (b*T + t)*m + r.
    CHECK(tokenOffset(7, 100000, 131072, 4 * 4096) == (int64_t{7} * 131072 + 100000) * 16384);
    CHECK(tokenOffset(0, 0, 1, 1) == 0);
}

void plans()
{
    // Prefill at B*T = 64k tokens and at B*T*d above 2^31 (2^32 elements): the tile kernel, which the cost model
    // rates faster wherever it fits (8 warps at 0.5 issue per 320 instructions against 12 warps at 0.75 per 550).
    MixerPlan p = planMixer(2, true, 16, 4096, 4096, 4, 97, 132, kH200Optin, splitRegionBytes(4, 4096));
    CHECK(p.tile && p.ts == 2 && p.tiles == 16 * 2048 && p.splits == 1);
    p = planMixer(2, true, 64, 8192, 8192, 4, 97, 132, kH200Optin, 0);
    CHECK(p.tile && p.ts == 1 && p.tiles == 64 * 8192);
    CHECK(modelMixerClocks(p, 64, 8192, 8192, 4, 97, 132, kH200Optin)
        < modelMixerClocks(MixerPlan{}, 64, 8192, 8192, 4, 97, 132, kH200Optin));

    // Decode-sized prefill, bf16, d = 4096: two tokens per block (z is 128 KiB), 4-channel loads,
    // 8 tiles, and the 97 sources split 16 ways.
    p = planMixer(2, true, 1, 16, 4096, 4, 97, 132, kH200Optin, splitRegionBytes(4, 4096));
    CHECK(p.tile && p.ts == 2 && p.vec == 4 && p.threads == 256);
    CHECK(p.tiles == 8 && p.splits == kMaxSplits && p.blocks == 8 * kMaxSplits);
    CHECK(p.smem == tileSmemBytes(2, 4, 4, 4096, 256) && p.smem <= kH200Optin);
    // d = 1024: four tokens per block, 2-channel loads.
    p = planMixer(2, true, 2, 100, 1024, 4, 25, 132, kH200Optin, splitRegionBytes(4, 1024));
    CHECK(p.tile && p.ts == 4 && p.vec == 2 && p.tiles == 50 && p.splits == 5); // 256 four-token slots
    // The tile count stays exact in 64 bits up to a grid's x limit (2^31 - 1 one-token tiles); one more token
    // and the tile kernel's grid is over it: the warp kernel (a quarter of the blocks) takes the shape.
    int64_t const maxGrid = (int64_t{1} << 31) - 1;
    p = planMixer(2, true, 1, maxGrid, 8192, 4, 97, 132, kH200Optin, 0);
    CHECK(p.tile && p.ts == 1 && p.tiles == maxGrid && p.blocks == maxGrid && p.splits == 1);
    CHECK(!planMixer(2, true, 1, maxGrid + 1, 8192, 4, 97, 132, kH200Optin, 0).tile);

    // No workspace for the partials: no split, still correct.
    p = planMixer(2, true, 1, 16, 4096, 4, 97, 132, kH200Optin, 0);
    CHECK(p.splits == 1);
    // Three sources: never split into ranges of one source.
    p = planMixer(2, true, 1, 1, 4096, 4, 3, 132, kH200Optin, splitRegionBytes(4, 4096));
    CHECK(p.splits == 1);

    // Misaligned or odd d: scalar loads.
    CHECK(planMixer(2, false, 1, 8, 4096, 4, 5, 132, kH200Optin, 0).vec == 1);
    CHECK(planMixer(4, true, 1, 8, 4097, 4, 5, 132, kH200Optin, 0).vec == 1);
    CHECK(planMixer(4, true, 1, 8, 256, 2, 5, 132, kH200Optin, 0).vec == 4);

    // z of one token for 8 streams at d = 8192 is 256 KiB: the warp kernel takes it.
    CHECK(!planMixer(4, true, 1, 8, 8192, 8, 5, 132, kH200Optin, 0).tile);
    // fp32, 4 streams, d = 8192: two tokens would need 256 KiB, one fits.
    p = planMixer(4, true, 1, 8, 8192, 4, 5, 132, kH200Optin, 0);
    CHECK(p.tile && p.ts == 1 && p.vec == 4);
    // A 48 KiB GPU (no opt-in) falls back to the warp kernel earlier.
    CHECK(!planMixer(2, true, 1, 8, 4096, 4, 5, 132, 48 * 1024, 0).tile);

    // Register budget of the views: MB * TS * V <= 32 for every bucket and tile.
    for (int mb : {2, 4, 8})
    {
        for (int elem : {2, 4})
        {
            for (int ts : kTileTokenChoices)
            {
                CHECK(!tileTokensFit(mb, ts) || mb * ts * tileVec(elem, mb, ts) <= 32);
            }
        }
    }
}

//! The plan of issue 23 until defect 6: the warp kernel above 8 tokens per SM. The negative control of crossover().
MixerPlan oldPlan(int elemBytes, int64_t batch, int64_t seq, int64_t d, int m, int n, size_t splitBytes)
{
    return batch * seq > 8 * 132 ? MixerPlan{}
                                 : planTile(elemBytes, true, batch, seq, d, m, n, 132, kH200Optin, splitBytes);
}

/*!
 * Largest relative change of the modelled time from T to T+1 over [t0, t1] at 132 SMs (an H200), for the plan
 * or (old) the rule it replaced; *at is the T where it happens.
 */
double maxStep(bool old, int elemBytes, int64_t batch, int64_t t0, int64_t t1, int64_t d, int m, int n, int64_t* at)
{
    size_t const split = splitRegionBytes(m, d);
    double worst = 0;
    double prev = 0;
    for (int64_t t = t0; t <= t1; ++t)
    {
        MixerPlan const pl = old ? oldPlan(elemBytes, batch, t, d, m, n, split)
                                 : planMixer(elemBytes, true, batch, t, d, m, n, 132, kH200Optin, split);
        double const clocks = modelMixerClocks(pl, batch, t, d, m, n, 132, kH200Optin);
        double const step = t > t0 ? (clocks > prev ? clocks / prev : prev / clocks) - 1.0 : 0.0;
        if (step > worst)
        {
            worst = step;
            *at = t - 1;
        }
        prev = clocks;
    }
    return worst;
}

/*!
 * Issue 23 defect 6: the old rule switched to the warp kernel above 8 tokens per SM (1,056 tokens on an H200),
 * ~7x slower by the same model. The plan must change kernel only where the two modelled costs meet: no step
 * over 1% from T to T+1 across the old crossover (one more 2-token tile of ~500 is 0.2%); the old rule, on
 * the same model and sweep, must show its step (the check can fail).
 */
void crossover()
{
    struct Sweep
    {
        char const* name;
        int elemBytes;
        int64_t batch, t0, t1, d;
        int m, n;
    } const sweeps[] = {
        {"bf16 B=1 T=1000..1100 d=4096 m=4 n=97", 2, 1, 1000, 1100, 4096, 4, 97},
        {"bf16 B=4 T=250..290 d=4096 m=4 n=97", 2, 4, 250, 290, 4096, 4, 97},
        {"fp32 B=1 T=1000..1100 d=4096 m=4 n=97", 4, 1, 1000, 1100, 4096, 4, 97},
        {"bf16 B=1 T=1000..1100 d=2048 m=8 n=25", 2, 1, 1000, 1100, 2048, 8, 25},
    };
    for (Sweep const& s : sweeps)
    {
        int64_t atNew = 0;
        int64_t atOld = 0;
        double const stepNew = maxStep(false, s.elemBytes, s.batch, s.t0, s.t1, s.d, s.m, s.n, &atNew);
        double const stepOld = maxStep(true, s.elemBytes, s.batch, s.t0, s.t1, s.d, s.m, s.n, &atOld);
        std::printf("crossover %s: plan max step %.2f%% at T=%lld, old rule %.1f%% at T=%lld\n", s.name,
            100 * stepNew, static_cast<long long>(atNew), 100 * stepOld, static_cast<long long>(atOld));
        CHECK(stepNew <= 0.01);
        CHECK(stepOld > 0.01 && atOld * s.batch == 8 * 132); // the negative control: the old step, where it was
    }
}

//! Negative control of the emulation itself: a misaligned vector load must be reported.
void alignmentFault()
{
    alignas(16) float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float out[4];
    loadVec<float, 4>(buf, out);
    CHECK(launchStatus() == MSAR_STATUS_OK && out[3] == 4.F);
    loadVec<float, 4>(buf + 1, out);
    CHECK(launchStatus() == MSAR_STATUS_CUDA_ERROR + static_cast<int32_t>(cudaErrorMisalignedAddress));
    CHECK(launchStatus() == MSAR_STATUS_OK); // reported once
}

} // namespace

int main()
{
    offsets();
    plans();
    crossover();
    alignmentFault();
    std::printf("indexTest: %d checks passed\n", gChecks);
    return 0;
}
