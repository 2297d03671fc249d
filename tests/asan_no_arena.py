"""pytest plugin for the AddressSanitizer run of tests/test_native_memory.py: every ONNX Runtime
session allocates each tensor on its own (no CPU arena), so a kernel that writes past its output
writes past an allocation the sanitizer knows the bounds of, not into the arena's next block."""

import onnxruntime as ort

_init = ort.InferenceSession.__init__


def _without_arena(self, path_or_bytes, sess_options=None, *args, **kwargs):
    if sess_options is None:
        sess_options = ort.SessionOptions()
    sess_options.enable_cpu_mem_arena = False
    _init(self, path_or_bytes, sess_options, *args, **kwargs)


ort.InferenceSession.__init__ = _without_arena
