/*
 * Constants and status codes shared by the msar CUDA kernels (C ABI), the
 * TensorRT glue and plugins/tests/logicTest.cpp. Plain C: no CUDA or
 * TensorRT types, so ctypes users can mirror it.
 */
#ifndef MSAR_KERNEL_TYPES_H
#define MSAR_KERNEL_TYPES_H

/* Data type codes of the kernel C ABI. */
#define MSAR_DTYPE_FLOAT32 0
#define MSAR_DTYPE_FLOAT16 1
#define MSAR_DTYPE_BFLOAT16 2

/* Limits of the kernels (sources travel in the kernel parameters). */
#define MSAR_MAX_SOURCES 256
#define MSAR_MAX_STREAMS 8
#define MSAR_MAX_KERNEL 64

/* Launcher status codes; MSAR_STATUS_CUDA_ERROR + e for a CUDA error e. */
#define MSAR_STATUS_OK 0
#define MSAR_STATUS_INVALID_ARGUMENT 1
#define MSAR_STATUS_UNSUPPORTED 2
#define MSAR_STATUS_WORKSPACE_TOO_SMALL 3
#define MSAR_STATUS_CUDA_ERROR 1000

static inline char const* msarStatusString(int status)
{
    switch (status)
    {
    case MSAR_STATUS_OK: return "ok";
    case MSAR_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case MSAR_STATUS_UNSUPPORTED: return "unsupported configuration";
    case MSAR_STATUS_WORKSPACE_TOO_SMALL: return "workspace too small";
    default: return status >= MSAR_STATUS_CUDA_ERROR ? "CUDA error (status - 1000 is the cudaError_t)" : "unknown status";
    }
}

#endif /* MSAR_KERNEL_TYPES_H */
