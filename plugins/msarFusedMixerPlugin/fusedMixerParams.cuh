/*
 * Parameters shared by the FusedMixer kernels (the tile kernel and the warp
 * kernel). Included by fusedMixerKernel.cu only.
 */
#ifndef MSAR_FUSED_MIXER_PARAMS_CUH
#define MSAR_FUSED_MIXER_PARAMS_CUH

#include "../common/msarKernelCommon.cuh"
#include "fusedMixerPlan.h"

#include <math.h>

namespace msar
{
namespace kernels
{

struct SourceTable
{
    void const* ptr[MSAR_MAX_SOURCES];
};

template <typename T>
struct MixerParams
{
    T const* query;     // [m, d]
    T const* gateW;     // [m, m*d]
    T const* gateB;     // [m]
    T const* gateScale; // []
    T const* taps;      // conv_weight [N][K][d] as exported (its first n rows)
    T* out;             // [B, T, d]
    int64_t seq;
    int64_t d;
    int64_t tilesPerSeq;
    int64_t nTiles;
    int64_t nChunks;    // tile kernel: d / vec
    float* partial;     // tile kernel with splits > 1: [tiles * splits][slotFloats], workspace
    int64_t slotFloats; // splitSlotFloats (fusedMixerPlan.h)
    int32_t n;
    int32_t m;
    int32_t K;
    int32_t kmax;
    int32_t smemPerWarp; // warp kernel: floats
    int32_t splits;      // tile kernel: source ranges per tile
    float eps;
    int32_t ks[MSAR_MAX_STREAMS];   // kernel size per stream, ks[0] = 1
    int32_t offs[MSAR_MAX_STREAMS]; // first tap of stream r (r >= 1) within K
};

} // namespace kernels
} // namespace msar

#endif // MSAR_FUSED_MIXER_PARAMS_CUH
