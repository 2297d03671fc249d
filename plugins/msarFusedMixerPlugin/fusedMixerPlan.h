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
 * Channels per thread and load: 16 bytes, but at most 32 / MB so that the
 * views a thread holds (MB * TS * V floats) stay at 32 registers.
 */
constexpr int tileVec(int elemBytes, int mb)
{
    int const v = 16 / elemBytes;
    return v < 32 / mb ? v : 32 / mb;
}

//! Tokens per block: the rest of the 32-register view budget, at most 4, and MB*TS <= 16
//! (sum(v^2) and q.v of every (stream, token) in one 32-value reduction row).
constexpr int tileTokensMax(int mb, int vec)
{
    int ts = 32 / (mb * vec);
    ts = ts > 16 / mb ? 16 / mb : ts;
    return ts < 1 ? 1 : (ts > 4 ? 4 : ts);
}

inline size_t align256(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

inline size_t tapsBytes(int64_t n, int64_t K, int64_t d)
{
    return align256(static_cast<size_t>(n) * static_cast<size_t>(K) * static_cast<size_t>(d) * sizeof(float));
}

//! Floats of one split's partial result: unnormalised z [TS][m][d], then running max and denominator [MB*TS] each.
inline int64_t splitSlotFloats(int ts, int m, int mb, int64_t d)
{
    return static_cast<int64_t>(ts) * m * d + 2 * static_cast<int64_t>(mb) * ts;
}

inline size_t splitRegionBytes(int m, int64_t d)
{
    size_t const want = static_cast<size_t>(kSplitSlots) * static_cast<size_t>(splitSlotFloats(1, m, 8, d)) * sizeof(float);
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
    bool tile;    //!< the block-tile kernel; false: the warp kernel (z of one token does not fit shared memory)
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
    int const v = tileVec(elemBytes, mb);
    pl.vec = aligned && d % v == 0 ? v : 1;
    int64_t const chunks = (d + pl.vec - 1) / pl.vec;
    int64_t const threads = (chunks + 31) / 32 * 32;
    pl.threads = static_cast<int>(threads > kTileThreads ? kTileThreads : threads);
    int const tsMax = tileTokensMax(mb, pl.vec);
    for (int ts : {tsMax, 1})
    {
        if (tileSmemBytes(ts, m, mb, d, pl.threads) <= smemOptin)
        {
            pl.tile = true;
            pl.ts = ts;
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
