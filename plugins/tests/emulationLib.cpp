/*
 * The msar kernels built for the CPU through cudaHostEmulation.h: a shared
 * library with the same C ABI as the CUDA build (msarFusedMixerForward,
 * msarDepthRetrievalForward, msarFusedMixerWorkspaceSize), where every
 * "device pointer" is a host pointer. tests/test_plugins.py drives it with
 * ctypes against the eager PyTorch mixer.
 */
#include "cudaHostEmulation.h"

#include "../msarDepthRetrievalPlugin/depthRetrievalKernel.cu"
#include "../msarFusedMixerPlugin/fusedMixerKernel.cu"
