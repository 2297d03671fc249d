/*
 * msar::DepthRetrieval CUDA kernel: C ABI launcher (no TensorRT types).
 *
 * For every token and stream r, over the given views v_0 .. v_{n-1}:
 *   s_i = q^(r) . v_i^(r) / sqrt(mean_c(v_i^(r)^2) + eps)
 *   z^(r) = sum_i softmax_i(s)_i v_i^(r)
 * float32 arithmetic whatever the storage type.
 */
#ifndef MSAR_DEPTH_RETRIEVAL_KERNEL_H
#define MSAR_DEPTH_RETRIEVAL_KERNEL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/msarKernelAttrs.h"
#include "../common/msarKernelTypes.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct MsarDepthRetrievalArgs
{
    void const* query;          /* [m, d] */
    void const* const* views;   /* HOST array of n_sources device pointers, each [B, T, m, d] */
    int32_t n_sources;          /* n, 1..MSAR_MAX_SOURCES */
    int64_t batch;              /* B */
    int64_t seq;                /* T */
    int64_t n_streams;          /* m */
    int64_t d;                  /* channels */
    MSAR_DEPTHRETRIEVAL_ATTR_ARGS /* generated (msarKernelAttrs.h): eps, the key RMSNorm epsilon */
    void* out;                  /* [B, T, m, d] */
} MsarDepthRetrievalArgs;

/* Enqueue the kernel on `stream`; returns MSAR_STATUS_* (no synchronisation). */
int32_t msarDepthRetrievalForward(int32_t dtype, MsarDepthRetrievalArgs const* args, cudaStream_t stream);

#ifdef __cplusplus
} /* extern "C" */

namespace msar
{
//! Templated launcher: T is float, __half or __nv_bfloat16 (explicitly instantiated).
template <typename T>
int32_t depthRetrievalForward(MsarDepthRetrievalArgs const& args, cudaStream_t stream);
} // namespace msar
#endif

#endif /* MSAR_DEPTH_RETRIEVAL_KERNEL_H */
