/* Generated from msar_export/contracts.py by msar_export/export/contract_headers.py; do not edit. */
#ifndef MSAR_KERNEL_ATTRS_H
#define MSAR_KERNEL_ATTRS_H

#include <stdint.h>

/* FusedMixer's attributes as kernel arguments, in contract order. */
#define MSAR_FUSEDMIXER_ATTR_ARGS \
    int32_t const* stream_kernels; \
    int32_t n_streams; \
    float eps;

/* DepthRetrieval's attributes as kernel arguments, in contract order. */
#define MSAR_DEPTHRETRIEVAL_ATTR_ARGS \
    float eps;

#endif /* MSAR_KERNEL_ATTRS_H */
