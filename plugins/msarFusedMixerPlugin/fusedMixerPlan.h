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

/*!
 * Above this many tokens per SM the warp kernel (4 tokens per tap load, no z
 * in shared memory) moves fewer bytes than the tile kernel, whose parallelism
 * only pays while B*T is too small to fill the GPU with warps. From the model
 * in docs/kernels.md; a GPU measurement (scripts/gpu_check.sh) should move it.
 */
constexpr int64_t kTileTokensPerSm = 8;

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
    bool tile;    //!< the block-tile kernel; false: the warp kernel (many tokens, or z of one token too big)
    int vec;      //!< channels per load (1: scalar, d or a pointer not aligned)
    int ts;       //!< tokens per block
    int threads;  //!< per block
    int splits;   //!< source ranges per tile, merged by log-sum-exp when > 1
    int64_t tiles;
    int64_t blocks;
    size_t smem;  //!< dynamic shared memory per block, bytes
};

/*!
 * aligned: every pointer the kernel loads vectors from is 16-byte aligned.
 * splitBytes: the workspace left for split partials (0: never split).
 */
inline MixerPlan planMixer(int elemBytes, bool aligned, int64_t batch, int64_t seq, int64_t d, int m, int n,
    int smCount, size_t smemOptin, size_t splitBytes)
{
    MixerPlan pl{};
    int const mb = streamBucket(m);
    if (batch * seq > kTileTokensPerSm * smCount)
    {
        return pl; // enough tokens for the warp kernel
    }
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
    return pl;
}

} // namespace kernels
} // namespace msar

#endif // MSAR_FUSED_MIXER_PLAN_H
