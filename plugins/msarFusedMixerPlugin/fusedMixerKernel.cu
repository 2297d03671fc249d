/*
 * msar::FusedMixer prefill: causal conv views computed on the fly from the raw
 * sources, per-stream RMS-normalised softmax retrieval over depth, scalar
 * sigmoid gate per stream, gated sum. float32 arithmetic throughout.
 *
 * Two kernels, chosen per shape by planMixer (fusedMixerPlan.h):
 * - the tile kernel (fusedMixerTileKernel.cuh): a block per token tile, d
 *   split over its threads in 16-byte loads, sources read once, z of the tile
 *   in shared memory; split over source ranges with a log-sum-exp merge when
 *   B*T is too small to fill the GPU;
 * - the warp kernel (fusedMixerWarpKernel.cuh): the previous design, kept for
 *   m*d too large for one token's z in shared memory and for shapes where the
 *   plan's cost model rates it faster.
 * docs/kernels.md has the roofline model of both.
 */
#include "fusedMixerKernel.h"

#include "fusedMixerTileKernel.cuh"
#include "fusedMixerWarpKernel.cuh"

namespace msar
{
namespace kernels
{
namespace
{

template <typename T, int MB, int TS, int V>
int32_t launchTileTs(MixerParams<T> p, SourceTable const& src, MixerPlan const& pl, cudaStream_t stream)
{
    p.tilesPerSeq = (p.seq + TS - 1) / TS;
    p.nTiles = pl.tiles;
    p.nChunks = p.d / V;
    p.splits = pl.splits;
    p.slotFloats = splitSlotFloats(TS, p.m, MB, p.d);
    if (pl.blocks > 0x7fffffffLL)
    {
        return MSAR_STATUS_UNSUPPORTED;
    }
    auto kernel = tileMixerKernel<T, MB, TS, V>;
    int32_t st = allowDynamicShared(kernel, pl.smem);
    if (st != MSAR_STATUS_OK)
    {
        return st;
    }
    MSAR_LAUNCH(kernel, static_cast<unsigned>(pl.blocks), static_cast<unsigned>(pl.threads), pl.smem, stream)(p, src);
    st = launchStatus();
    if (st != MSAR_STATUS_OK || pl.splits == 1)
    {
        return st;
    }
    auto merge = mergeKernel<T, MB, TS, V>;
    st = allowDynamicShared(merge, pl.smem);
    if (st != MSAR_STATUS_OK)
    {
        return st;
    }
    MSAR_LAUNCH(merge, static_cast<unsigned>(pl.tiles), static_cast<unsigned>(pl.threads), pl.smem, stream)(p);
    return launchStatus();
}

template <typename T, int MB, int TS>
int32_t launchTileVec(MixerParams<T> const& p, SourceTable const& src, MixerPlan const& pl, cudaStream_t stream)
{
    constexpr int VEC = tileVec(static_cast<int>(sizeof(T)), MB, TS);
    if (pl.vec == VEC)
    {
        return launchTileTs<T, MB, TS, VEC>(p, src, pl, stream);
    }
    return pl.vec == 1 ? launchTileTs<T, MB, TS, 1>(p, src, pl, stream) : MSAR_STATUS_UNSUPPORTED;
}

template <typename T, int MB>
int32_t launchMixer(MixerParams<T> const& p, SourceTable const& src, MixerPlan const& pl, int64_t batch,
    cudaStream_t stream)
{
    if (!pl.tile)
    {
        return launchWarpMixer<T, MB>(p, src, batch, stream);
    }
    switch (pl.ts)
    {
    case 1: return launchTileVec<T, MB, 1>(p, src, pl, stream);
    case 2: return launchTileVec<T, MB, 2>(p, src, pl, stream);
    case 4:
        if constexpr (tileTokensFit(MB, 4))
        {
            return launchTileVec<T, MB, 4>(p, src, pl, stream);
        }
        return MSAR_STATUS_UNSUPPORTED;
    default: return MSAR_STATUS_UNSUPPORTED;
    }
}

} // namespace

} // namespace kernels

template <typename T>
int32_t fusedMixerForward(MsarFusedMixerArgs const& a, cudaStream_t stream)
{
    using namespace kernels;
    int32_t const n = a.n_sources;
    int32_t const m = a.n_streams;
    if (n < 1 || n > MSAR_MAX_SOURCES || m < 1 || m > MSAR_MAX_STREAMS || a.stream_kernels == nullptr
        || a.sources == nullptr || a.batch < 0 || a.seq < 0 || a.d < 1 || a.conv_rows < n || !(a.eps > 0.F))
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    if (a.stream_kernels[0] != 1)
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    MixerParams<T> p{};
    p.kmax = 1;
    int32_t offset = 0;
    for (int32_t r = 0; r < m; ++r)
    {
        int32_t const k = a.stream_kernels[r];
        if (k < 1 || k > MSAR_MAX_KERNEL)
        {
            return MSAR_STATUS_INVALID_ARGUMENT;
        }
        p.ks[r] = k;
        p.offs[r] = r == 0 ? 0 : offset;
        offset += r == 0 ? 0 : k;
        p.kmax = k > p.kmax ? k : p.kmax;
    }
    p.K = offset;
    if (a.batch == 0 || a.seq == 0)
    {
        return MSAR_STATUS_OK; // empty output
    }
    if (a.query == nullptr || a.gate_weight == nullptr || a.gate_bias == nullptr || a.gate_scale == nullptr
        || a.out == nullptr || (p.K > 0 && a.conv_weight == nullptr))
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    SourceTable src{};
    for (int32_t i = 0; i < n; ++i)
    {
        if (a.sources[i] == nullptr)
        {
            return MSAR_STATUS_INVALID_ARGUMENT;
        }
        src.ptr[i] = a.sources[i];
    }
    if (a.workspace_size > 0
        && (a.workspace == nullptr || a.workspace_size < msarFusedMixerWorkspaceSize(n, a.d, a.stream_kernels, m)))
    {
        return MSAR_STATUS_WORKSPACE_TOO_SMALL;
    }
    p.query = static_cast<T const*>(a.query);
    p.gateW = static_cast<T const*>(a.gate_weight);
    p.gateB = static_cast<T const*>(a.gate_bias);
    p.gateScale = static_cast<T const*>(a.gate_scale);
    p.taps = static_cast<T const*>(a.conv_weight); // [N][K][d]: the first n rows are the kernel's [n][K][d]
    p.out = static_cast<T*>(a.out);
    p.seq = a.seq;
    p.d = a.d;
    p.n = n;
    p.m = m;
    p.eps = a.eps;

    size_t const splitBytes = a.workspace_size;
    p.partial = splitBytes > 0 ? static_cast<float*>(a.workspace) : nullptr;
    // conv_weight (K = 0: nothing to load) aligned for the vector loads, and d a multiple of the vector: then
    // every source row's taps are aligned too.
    void const* vecPtrs[] = {a.query, a.gate_weight, a.out, p.K > 0 ? p.taps : a.out};
    bool const aligned = alignedTo(vecPtrs, 4, 16) && alignedTo(a.sources, n, 16);
    MixerPlan const pl = planMixer(static_cast<int>(sizeof(T)), aligned, a.batch, a.seq, a.d, m, n,
        deviceAttribute(cudaDevAttrMultiProcessorCount, 132),
        static_cast<size_t>(deviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024)), splitBytes);
    if (m <= 2)
    {
        return launchMixer<T, 2>(p, src, pl, a.batch, stream);
    }
    if (m <= 4)
    {
        return launchMixer<T, 4>(p, src, pl, a.batch, stream);
    }
    return launchMixer<T, 8>(p, src, pl, a.batch, stream);
}

template int32_t fusedMixerForward<float>(MsarFusedMixerArgs const&, cudaStream_t);
template int32_t fusedMixerForward<__half>(MsarFusedMixerArgs const&, cudaStream_t);
template int32_t fusedMixerForward<__nv_bfloat16>(MsarFusedMixerArgs const&, cudaStream_t);

} // namespace msar

extern "C" size_t msarFusedMixerWorkspaceSize(
    int32_t n_sources, int64_t d, int32_t const* stream_kernels, int32_t n_streams)
{
    if (n_sources < 1 || d < 1 || stream_kernels == nullptr || n_streams < 1)
    {
        return 0;
    }
    return msar::kernels::splitRegionBytes(n_streams, d);
}

extern "C" int32_t msarFusedMixerForward(int32_t dtype, MsarFusedMixerArgs const* args, cudaStream_t stream)
{
    if (args == nullptr)
    {
        return MSAR_STATUS_INVALID_ARGUMENT;
    }
    switch (dtype)
    {
    case MSAR_DTYPE_FLOAT32: return msar::fusedMixerForward<float>(*args, stream);
    case MSAR_DTYPE_FLOAT16: return msar::fusedMixerForward<__half>(*args, stream);
    case MSAR_DTYPE_BFLOAT16: return msar::fusedMixerForward<__nv_bfloat16>(*args, stream);
    default: return MSAR_STATUS_UNSUPPORTED;
    }
}
