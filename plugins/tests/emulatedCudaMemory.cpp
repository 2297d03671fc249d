/*
 * cudaMalloc, cudaMallocAsync, cudaFree and cudaFreeAsync for the CPU emulation (part of msar_emulation): host
 * memory, every call counted. The plugin harness checks the count stays 0 across enqueue (issue 23 defect 3):
 * an IGpuAllocator call is seen by its counting allocator, a direct CUDA allocation is seen here. Without
 * these, such a call in the glue would only break the emulation's link, with no message saying why.
 * Nothing else of the CUDA runtime is emulated; the kernels themselves allocate nothing.
 */
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>

namespace
{
std::atomic<int> gAllocations{0};
std::atomic<int> gFrees{0};

cudaError_t allocate(void** p, size_t size)
{
    ++gAllocations;
    if (p == nullptr)
    {
        return cudaErrorInvalidValue;
    }
    *p = std::malloc(size > 0 ? size : 1);
    return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t release(void* p)
{
    ++gFrees;
    std::free(p);
    return cudaSuccess;
}
} // namespace

#define MSAR_EXPORT __attribute__((visibility("default")))

extern "C"
{
MSAR_EXPORT cudaError_t CUDARTAPI cudaMalloc(void** p, size_t size)
{
    return allocate(p, size);
}

MSAR_EXPORT cudaError_t CUDARTAPI cudaMallocAsync(void** p, size_t size, cudaStream_t)
{
    return allocate(p, size);
}

MSAR_EXPORT cudaError_t CUDARTAPI cudaFree(void* p)
{
    return release(p);
}

MSAR_EXPORT cudaError_t CUDARTAPI cudaFreeAsync(void* p, cudaStream_t)
{
    return release(p);
}

//! For the harness: cudaMalloc/cudaMallocAsync and cudaFree/cudaFreeAsync calls so far in this process.
MSAR_EXPORT int msarEmuCudaAllocations()
{
    return gAllocations.load();
}

MSAR_EXPORT int msarEmuCudaFrees()
{
    return gFrees.load();
}
}
