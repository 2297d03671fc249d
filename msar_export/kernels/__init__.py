"""The msar kernels outside TensorRT: a ctypes binding of their C ABI, the
CMake build that makes the CUDA or CPU-emulation library it loads, and the
references they are checked against (tests/test_plugins.py,
tests/test_kernel_shapes.py, scripts/gpu_check.py)."""

from .binding import (CUDA_ERROR_BASE, DTYPE_CODES, MAX_SOURCES, STATUS_TEXT, DepthRetrievalArgs, FusedMixerArgs,
                      KernelLibrary, status_text)
from .cases import random_fused_mixer_inputs, rel_err
from .cmake import BuildError, CMakeBuild, plugin_sources, tools_unavailable
from .eager import eager_depth_retrieval, eager_fused_mixer
from .reference64 import (reference_conv_state64, reference_depth_retrieval64, reference_fused_mixer64,
                          reference_scored_mixer64, reference_source_scores64, reference_source_views64,
                          reference_stream_gate64, split_conv_weight)

__all__ = ["BuildError", "CMakeBuild", "CUDA_ERROR_BASE", "DTYPE_CODES", "DepthRetrievalArgs", "FusedMixerArgs",
           "KernelLibrary", "MAX_SOURCES", "STATUS_TEXT", "eager_depth_retrieval", "eager_fused_mixer",
           "emulation_unavailable", "load_emulation", "plugin_sources", "random_fused_mixer_inputs", "rel_err",
           "reference_conv_state64", "reference_depth_retrieval64", "reference_fused_mixer64",
           "reference_scored_mixer64", "reference_source_scores64", "reference_source_views64",
           "reference_stream_gate64", "split_conv_weight", "status_text", "tools_unavailable"]
