/*
 * msar::FusedMixer CUDA kernel: C ABI launcher (no TensorRT types).
 *
 *   views    x_i^(r) = causal depthwise conv of source i (r >= 1), x_i (r = 0)
 *   scores   s_i^(r) = q^(r) . x_i^(r) / sqrt(mean_c(x_i^(r)^2) + eps)
 *   weights  alpha_i^(r) = softmax over sources i of s_i^(r)
 *   streams  z^(r) = sum_i alpha_i^(r) x_i^(r)
 *   gates    g = sigmoid(a * (flat(Z) W^T) + b)      (m scalars per token)
 *   output   h = sum_r g^(r) z^(r)
 *
 * All arithmetic is float32 whatever the storage type. See fusedMixerKernel.cu
 * for the work decomposition.
 */
#ifndef MSAR_FUSED_MIXER_KERNEL_H
#define MSAR_FUSED_MIXER_KERNEL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/msarKernelAttrs.h"
#include "../common/msarKernelTypes.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct MsarFusedMixerArgs
{
    void const* query;             /* [m, d] */
    void const* gate_weight;       /* [m, m*d], nn.Linear layout */
    void const* gate_bias;         /* [m] */
    void const* gate_scale;        /* [] */
    void const* conv_weight;       /* [N, K, d], read as is: conv_weight[i][o_r + j][c] = tap j of stream r,
                                      channel c, source i (contract: msar_export/contracts.py) */
    void const* const* sources;    /* HOST array of n_sources device pointers, each [B, T, d] */
    int32_t n_sources;             /* n, 1..MSAR_MAX_SOURCES */
    int64_t batch;                 /* B */
    int64_t seq;                   /* T */
    int64_t d;                     /* channels */
    int64_t conv_rows;             /* N >= n */
    /* the attributes (msarKernelAttrs.h, generated): stream_kernels (HOST array of n_streams kernel sizes,
       first is 1), n_streams (m, 1..MSAR_MAX_STREAMS), eps (key RMSNorm epsilon) */
    MSAR_FUSEDMIXER_ATTR_ARGS
    void* out;                     /* [B, T, d] */
    void* workspace;               /* device scratch for split-source partials: msarFusedMixerWorkspaceSize bytes,
                                      or workspace_size 0 (then one block walks every source: no split) */
    size_t workspace_size;
} MsarFusedMixerArgs;

/* Scratch bytes the launcher can use: room for split-source partial results (at most 32 MiB; used when B*T is
   small). Nothing else: the taps are read from conv_weight as exported, so a launch allocates and prepares
   nothing. A workspace_size between 1 and this is refused (MSAR_STATUS_WORKSPACE_TOO_SMALL): a caller that
   passes scratch passes all of it. */
size_t msarFusedMixerWorkspaceSize(int32_t n_sources, int64_t d, int32_t const* stream_kernels, int32_t n_streams);

/* Enqueue the kernel on `stream`; returns MSAR_STATUS_* (no synchronisation). */
int32_t msarFusedMixerForward(int32_t dtype, MsarFusedMixerArgs const* args, cudaStream_t stream);

#ifdef __cplusplus
} /* extern "C" */

namespace msar
{
//! Templated launcher: T is float, __half or __nv_bfloat16 (explicitly instantiated).
template <typename T>
int32_t fusedMixerForward(MsarFusedMixerArgs const& args, cudaStream_t stream);
} // namespace msar
#endif

#endif /* MSAR_FUSED_MIXER_KERNEL_H */
