/*
 * Launch plan of msar::FusedMixer: which kernel, vector width, token tile,
 * threads, source splits and shared memory for a shape. Plain host C++ (no
 * CUDA), so plugins/tests/indexTest.cpp checks the plan at shapes far too big
 * to allocate here (B*T*d above 2^31).
 */
#ifndef MSAR_FUSED_MIXER_PLAN_H
#define MSAR_FUSED_MIXER_PLAN_H

#include <stddef.h>
#include <stdint.h>

namespace msar
{
namespace kernels
{

constexpr int kTileThreads = 256;
//! Source splits merged by log-sum-exp; more would make the merge outweigh the work at n = 97.
constexpr int kMaxSplits = 16;
//! Split-source scratch inside the workspace: at most this many bytes (TensorRT shares it across layers).
constexpr size_t kSplitBudgetBytes = size_t{32} << 20;
constexpr int64_t kSplitSlots = 256;

inline int streamBucket(int m)
{
    return m <= 2 ? 2 : (m <= 4 ? 4 : 8);
}

/*!
 * Channels per thread and load for TS tokens per block: 16 bytes, but at most
 * 32 / (MB * TS) so that the views a thread holds (MB * TS * V floats) stay at
 * 32 registers. More tokens per block beat wider loads: every tap loaded is
 * used for TS tokens, and tap traffic is the tile kernel's binding limit
 * (docs/kernels.md).
 */
constexpr int tileVec(int elemBytes, int mb, int ts)
{
    int const v = 16 / elemBytes;
    int const cap = 32 / (mb * ts);
    return v < cap ? v : (cap < 1 ? 1 : cap);
}

//! Token tiles tried, most first: MB * TS <= 16 keeps sum(v^2) and q.v of every (stream, token) in one
//! 32-value reduction row.
constexpr int kTileTokenChoices[] = {4, 2, 1};

constexpr bool tileTokensFit(int mb, int ts)
{
    return mb * ts <= 16;
}

/*
 * The plan's cost model: instruction issue, the limit that depends on which kernel runs and how many warps it
 * keeps on an SM (docs/kernels.md; scripts/kernel_model.py reads these constants, tests/test_kernel_shapes.py
 * checks that it reads the same). An SM issues 4 warp-instructions per clock and needs about 16 resident
 * warps to do so (8 warps, the tile kernel's one block per SM at d = 4096, give about half: issue 23). The
 * model is a throughput model: an SM's share of a launch is fractional, the idle SMs of a last partial wave
 * are not counted (docs/kernels.md says what that leaves out).
 */
//! SASS instructions per element-token: the tile kernel's delta loops (bf16, 2 tokens x 4 channels) and
//! the warp kernel's (bf16, 4 tokens x 1 channel, both passes); docs/kernels.md has the counts.
constexpr double kTileInstrPerElementToken = 320;
constexpr double kWarpInstrPerElementToken = 550;
constexpr double kWarpsForFullIssue = 16;
constexpr double kIssuePerSmClock = 4;
constexpr int kSmMaxThreads = 2048;

//! Tokens per warp of the warp kernel by stream bucket: its per-lane partial sums (MB*(MB+2)*TS floats)
//! stay at <= 96 registers. A struct, not a function: the kernel reads it (no host call in device code).
template <int MB>
struct WarpTile
{
    static constexpr int TS = MB <= 2 ? 8 : (MB <= 4 ? 4 : 1);
};

constexpr int warpTokens(int mb)
{
    return mb <= 2 ? WarpTile<2>::TS : (mb <= 4 ? WarpTile<4>::TS : WarpTile<8>::TS);
}

//! Warps of the warp kernel one SM holds: 65,536 registers over 128 (2 streams) or 168 (4, 8) per lane
//! (ptxas -v, sm_90), in blocks of 4 warps.
constexpr int warpResidentWarps(int mb)
{
    return mb <= 2 ? 16 : 12;
}

//! Fraction of an SM's issue rate a launch of `launchedWarps` gets, `residentWarps` fitting on one SM.
inline double issueFraction(double residentWarps, double launchedWarps, int smCount)
{
    double active = launchedWarps / smCount;
    active = active < residentWarps ? active : residentWarps;
    double const f = active / kWarpsForFullIssue;
    return f < 1.0 ? f : 1.0;
}

inline size_t align256(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

//! Floats of one split's partial result: unnormalised z [TS][m][d], then running max and denominator [MB*TS] each.
inline int64_t splitSlotFloats(int ts, int m, int mb, int64_t d)
{
    return static_cast<int64_t>(ts) * m * d + 2 * static_cast<int64_t>(mb) * ts;
}

inline size_t splitRegionBytes(int m, int64_t d)
{
    size_t const want = static_cast<size_t>(kSplitSlots) * static_cast<size_t>(splitSlotFloats(4, m, 8, d)) * sizeof(float);
    return align256(want < kSplitBudgetBytes ? want : kSplitBudgetBytes);
}

//! Shared memory of the tile kernel: z [TS][m][d], one reduction row per warp, softmax state, split weights.
inline size_t tileSmemBytes(int ts, int m, int mb, int64_t d, int threads)
{
    int64_t const floats = static_cast<int64_t>(ts) * m * d + (threads / 32) * 32 + 5 * mb * ts + kMaxSplits * mb * ts;
    return static_cast<size_t>(floats) * sizeof(float);
}

struct MixerPlan
{
    bool tile;    //!< the block-tile kernel; false: the warp kernel (z of one token too big, or modelled faster)
    int vec;      //!< channels per load (1: scalar, d or a pointer not aligned)
    int ts;       //!< tokens per block
    int threads;  //!< per block
    int splits;   //!< source ranges per tile, merged by log-sum-exp when > 1
    int64_t tiles;
    int64_t blocks;
    size_t smem;  //!< dynamic shared memory per block, bytes
};

/*!
 * Modelled time of a plan in SM clocks (issue only; 0 for an empty launch). Work is counted over whole tiles
 * (a tile's padding tokens cost what real ones do); the tile kernel's split merge is left out.
 */
inline double modelMixerClocks(MixerPlan const& pl, int64_t batch, int64_t seq, int64_t d, int m, int n,
    int smCount, size_t smemOptin)
{
    int const mb = streamBucket(m);
    int const ts = pl.tile ? pl.ts : warpTokens(mb);
    double const tiles = static_cast<double>(batch) * static_cast<double>((seq + ts - 1) / ts);
    double const elementTokens = static_cast<double>(n) * tiles * ts * static_cast<double>(d);
    double instr = kWarpInstrPerElementToken;
    double f = issueFraction(warpResidentWarps(mb), tiles, smCount);
    if (pl.tile)
    {
        double const warpsPerBlock = pl.threads / 32;
        size_t bySmem = pl.smem > 0 ? smemOptin / pl.smem : 1;
        size_t const byThreads = static_cast<size_t>(kSmMaxThreads / pl.threads);
        bySmem = bySmem < byThreads ? bySmem : byThreads;
        double const blocksPerSm = bySmem > 0 ? static_cast<double>(bySmem) : 1.0;
        instr = kTileInstrPerElementToken;
        f = issueFraction(blocksPerSm * warpsPerBlock, static_cast<double>(pl.blocks) * warpsPerBlock, smCount);
    }
    return f > 0 ? elementTokens * instr / 32.0 / (kIssuePerSmClock * smCount * f) : 0.0;
}

//! The tile kernel's plan for a shape, or tile = false where it cannot run (one token's z over shared memory).
inline MixerPlan planTile(int elemBytes, bool aligned, int64_t batch, int64_t seq, int64_t d, int m, int n,
    int smCount, size_t smemOptin, size_t splitBytes)
{
    MixerPlan pl{};
    int const mb = streamBucket(m);
    for (int ts : kTileTokenChoices)
    {
        int const v = tileVec(elemBytes, mb, ts);
        int const vec = aligned && d % v == 0 ? v : 1;
        int64_t const chunks = (d + vec - 1) / vec;
        int64_t const threads = (chunks + 31) / 32 * 32;
        int const nt = static_cast<int>(threads > kTileThreads ? kTileThreads : threads);
        if (tileTokensFit(mb, ts) && tileSmemBytes(ts, m, mb, d, nt) <= smemOptin)
        {
            pl.tile = true;
            pl.ts = ts;
            pl.vec = vec;
            pl.threads = nt;
            break;
        }
    }
    if (!pl.tile)
    {
        return pl;
    }
    pl.smem = tileSmemBytes(pl.ts, m, mb, d, pl.threads);
    pl.tiles = batch * ((seq + pl.ts - 1) / pl.ts);
    pl.splits = 1;
    int64_t const target = 2 * static_cast<int64_t>(smCount);
    if (pl.tiles > 0 && pl.tiles < target)
    {
        int64_t s = (target + pl.tiles - 1) / pl.tiles;
        s = s > kMaxSplits ? kMaxSplits : s;
        s = s > n / 2 ? n / 2 : s; // at least two sources per split
        int64_t const slots
            = static_cast<int64_t>(splitBytes / (static_cast<size_t>(splitSlotFloats(pl.ts, m, mb, d)) * sizeof(float)));
        s = s > slots / pl.tiles ? slots / pl.tiles : s;
        pl.splits = s >= 2 ? static_cast<int>(s) : 1;
    }
    pl.blocks = pl.tiles * pl.splits;
    if (pl.blocks > 0x7fffffffLL)
    {
        return MixerPlan{}; // over a grid's x limit; the warp kernel's grid (4 warps per block) is a quarter of it
    }
    return pl;
}

/*!
 * aligned: every pointer the kernel loads vectors from is 16-byte aligned.
 * splitBytes: the workspace left for split partials (0: never split).
 * The tile or the warp kernel, whichever modelMixerClocks says is faster: as the shape grows the choice can
 * only change where the two modelled costs are equal, so changing kernel adds no step (issue 23, defect 6).
 */
inline MixerPlan planMixer(int elemBytes, bool aligned, int64_t batch, int64_t seq, int64_t d, int m, int n,
    int smCount, size_t smemOptin, size_t splitBytes)
{
    MixerPlan const tile = planTile(elemBytes, aligned, batch, seq, d, m, n, smCount, smemOptin, splitBytes);
    MixerPlan const warp{};
    if (!tile.tile)
    {
        return warp;
    }
    double const tileClocks = modelMixerClocks(tile, batch, seq, d, m, n, smCount, smemOptin);
    return tileClocks <= modelMixerClocks(warp, batch, seq, d, m, n, smCount, smemOptin) ? tile : warp;
}

} // namespace kernels
} // namespace msar

#endif // MSAR_FUSED_MIXER_PLAN_H
