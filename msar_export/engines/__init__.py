"""TensorRT engine building for exported msar models (`msar-export build`): the
builder, the two TensorRT backends (TensorRT, TensorRT-RTX), optimisation profiles
and the metadata file beside each engine.

`build_engine` needs TensorRT (imported lazily: without it the call raises
BackendUnavailable); the metadata check and the shape profiles are plain
Python. The msar plugin library itself lives in plugins/ (C++/CUDA), and
`msar_export.kernels` is a ctypes binding of its kernels.
"""

from .builder import BuildReport, build_engine
from .metadata import EngineMetadata, metadata_path, read_metadata, verify_engine_metadata
from .profiles import DimRange, parse_profile

__all__ = ["BuildReport", "DimRange", "EngineMetadata", "build_engine", "metadata_path", "parse_profile",
           "read_metadata", "verify_engine_metadata"]
