/*
 * Index arithmetic and launch plans of the kernels at shapes far too large to
 * allocate here (B*T*d above 2^31), plus the emulation's alignment fault.
 * Built and run by tests/test_kernel_shapes.py:
 *   the indexTest target of plugins/CMakeLists.txt (CTest)
 * Prints "indexTest: N checks passed" or the first failure (exit 1).
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
    // Prefill at B*T = 64k tokens: the warp kernel (tap loads shared by 4 tokens) moves fewer bytes.
    MixerPlan p = planMixer(2, true, 16, 4096, 4096, 4, 97, 132, kH200Optin, splitRegionBytes(4, 4096));
    CHECK(!p.tile);
    // B*T*d above 2^31 (2^32 elements) is the warp kernel's too; the tile kernel's plan at the same d:
    CHECK(!planMixer(2, true, 64, 8192, 8192, 4, 97, 132, kH200Optin, 0).tile);

    // Decode-sized prefill, bf16, d = 4096: two tokens per block (z is 128 KiB), 4-channel loads,
    // 8 tiles, and the 97 sources split 16 ways.
    p = planMixer(2, true, 1, 16, 4096, 4, 97, 132, kH200Optin, splitRegionBytes(4, 4096));
    CHECK(p.tile && p.ts == 2 && p.vec == 4 && p.threads == 256);
    CHECK(p.tiles == 8 && p.splits == kMaxSplits && p.blocks == 8 * kMaxSplits);
    CHECK(p.smem == tileSmemBytes(2, 4, 4, 4096, 256) && p.smem <= kH200Optin);
    // d = 1024: four tokens per block, 2-channel loads.
    p = planMixer(2, true, 2, 100, 1024, 4, 25, 132, kH200Optin, splitRegionBytes(4, 1024));
    CHECK(p.tile && p.ts == 4 && p.vec == 2 && p.tiles == 50 && p.splits == 5); // 256 four-token slots
    // The tile count stays exact in 64 bits at the largest B*T the tile kernel takes.
    p = planMixer(2, true, 1, kTileTokensPerSm * 132, 8192, 4, 97, 132, kH200Optin, 0);
    CHECK(p.tile && p.ts == 1 && p.tiles == kTileTokensPerSm * 132 && p.splits == 1);

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
    alignmentFault();
    std::printf("indexTest: %d checks passed\n", gChecks);
    return 0;
}
