"""ctypes binding of the msar CUDA kernels (C ABI of plugins/*/xKernel.h).

One binding drives two builds of the same kernel source (plugins/CMakeLists.txt):
- msar_kernels, the CUDA shared library (scripts/gpu_check.sh), on torch CUDA tensors;
- msar_emulation (plugins/tests/cudaHostEmulation.h) on CPU tensors, which is
  how the tests run the real kernel code on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_float, c_int32, c_int64, c_size_t, c_void_p
from pathlib import Path

import torch

from ..contracts import DEPTH_RETRIEVAL, FUSED_MIXER, OpContract

# plugins/common/msarKernelTypes.h
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
MAX_SOURCES = 256
STATUS_TEXT = {0: "ok", 1: "invalid argument", 2: "unsupported configuration", 3: "workspace too small"}
CUDA_ERROR_BASE = 1000


def status_text(status: int) -> str:
    if status >= CUDA_ERROR_BASE:
        return f"CUDA error {status - CUDA_ERROR_BASE}"
    return STATUS_TEXT.get(status, f"unknown status {status}")


_CTYPES = {"int32_t const*": POINTER(c_int32), "int32_t": c_int32, "float": c_float}


def _attr_fields(contract: OpContract) -> list[tuple[str, type]]:
    """The op's attribute members of its kernel arguments (msarKernelAttrs.h, generated from the same records)."""
    return [(m, _CTYPES[t]) for a in contract.kernel_attributes for t, m in a.kernel_members()]


def _set_attrs(args: ctypes.Structure, contract: OpContract, given: dict) -> list:
    """Fill `args`' attribute members from `given` (defaults from the contract); returns the ctypes
    arrays that must stay alive while the kernel runs."""
    values, keep = contract.attribute_values(**given), []
    for a in contract.kernel_attributes:
        if a.type == "INTS":
            arr = (c_int32 * len(values[a.name]))(*values[a.name])
            keep.append(arr)
            setattr(args, a.name, arr)
            setattr(args, a.count, len(arr))
        else:
            setattr(args, a.name, values[a.name])
    return keep


class FusedMixerArgs(ctypes.Structure):
    """MsarFusedMixerArgs (fusedMixerKernel.h), field for field."""

    _fields_ = [
        ("query", c_void_p),
        ("gate_weight", c_void_p),
        ("gate_bias", c_void_p),
        ("gate_scale", c_void_p),
        ("conv_weight", c_void_p),
        ("sources", POINTER(c_void_p)),
        ("n_sources", c_int32),
        ("batch", c_int64),
        ("seq", c_int64),
        ("d", c_int64),
        ("conv_rows", c_int64),
        *_attr_fields(FUSED_MIXER),
        ("out", c_void_p),
        ("workspace", c_void_p),
        ("workspace_size", c_size_t),
    ]


class DepthRetrievalArgs(ctypes.Structure):
    """MsarDepthRetrievalArgs (depthRetrievalKernel.h), field for field."""

    _fields_ = [
        ("query", c_void_p),
        ("views", POINTER(c_void_p)),
        ("n_sources", c_int32),
        ("batch", c_int64),
        ("seq", c_int64),
        ("n_streams", c_int64),
        ("d", c_int64),
        *_attr_fields(DEPTH_RETRIEVAL),
        ("out", c_void_p),
    ]


def _check_tensors(op: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    first = next(iter(tensors.values()))
    for name, t in tensors.items():
        if t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"{op}: {name} is {t.dtype} on {t.device}, expected {first.dtype} on {first.device}")
        if not t.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous")
    if first.dtype not in DTYPE_CODES:
        raise ValueError(f"{op}: dtype {first.dtype} is not supported (float32, float16, bfloat16)")
    return first


def _stream_handle(t: torch.Tensor):
    return c_void_p(torch.cuda.current_stream(t.device).cuda_stream) if t.is_cuda else c_void_p(0)


class KernelLibrary:
    """The kernels' C ABI, loaded with ctypes from a CUDA or emulation build."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.msarFusedMixerForward.argtypes = [c_int32, POINTER(FusedMixerArgs), c_void_p]
        self.lib.msarFusedMixerForward.restype = c_int32
        self.lib.msarFusedMixerWorkspaceSize.argtypes = [c_int32, c_int64, POINTER(c_int32), c_int32]
        self.lib.msarFusedMixerWorkspaceSize.restype = c_size_t
        self.lib.msarDepthRetrievalForward.argtypes = [c_int32, POINTER(DepthRetrievalArgs), c_void_p]
        self.lib.msarDepthRetrievalForward.restype = c_int32

    def fused_mixer_workspace(self, n_sources: int, d: int, stream_kernels) -> int:
        ks = (c_int32 * len(stream_kernels))(*stream_kernels)
        return int(self.lib.msarFusedMixerWorkspaceSize(n_sources, d, ks, len(stream_kernels)))

    def fused_mixer(self, query, gate_weight, gate_bias, gate_scale, conv_weight, sources, out=None, workspace=None,
                    **attrs) -> torch.Tensor:
        """h (B, T, d) = FusedMixer(...) on the tensors' device (CUDA build) or the CPU (emulation build).
        `attrs`: the op's attributes by contract name (stream_kernels required, the rest default).
        conv_weight [N, K, d] as exported. workspace: split-source scratch (default: the full size; an empty
        tensor runs unsplit). Enqueues on the current CUDA stream and does not synchronise."""
        named = {"query": query, "gate_weight": gate_weight, "gate_bias": gate_bias, "gate_scale": gate_scale,
                 "conv_weight": conv_weight}
        named.update({f"sources_{i}": s for i, s in enumerate(sources)})
        x0 = _check_tensors("fused_mixer", named)
        B, T, d = sources[0].shape
        if out is None:
            out = torch.empty_like(sources[0])
        if workspace is None:
            need = self.fused_mixer_workspace(len(sources), d, attrs["stream_kernels"])
            workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=x0.device)
        ptrs = (c_void_p * len(sources))(*[s.data_ptr() for s in sources])
        args = FusedMixerArgs(
            query=query.data_ptr(), gate_weight=gate_weight.data_ptr(), gate_bias=gate_bias.data_ptr(),
            gate_scale=gate_scale.data_ptr(), conv_weight=conv_weight.data_ptr() if conv_weight.numel() else None,
            sources=ptrs, n_sources=len(sources), batch=B, seq=T, d=d, conv_rows=conv_weight.shape[0],
            out=out.data_ptr(), workspace=workspace.data_ptr() if workspace.numel() else None,
            workspace_size=workspace.numel())
        keep = _set_attrs(args, FUSED_MIXER, attrs)  # noqa: F841 - the arrays the kernel reads
        status = self.lib.msarFusedMixerForward(DTYPE_CODES[x0.dtype], ctypes.byref(args), _stream_handle(x0))
        if status:
            raise RuntimeError(f"msarFusedMixerForward failed: {status_text(status)}")
        return out

    def depth_retrieval(self, query, views, eps: float | None = None, out=None, **attrs) -> torch.Tensor:
        """z (B, T, m, d) = DepthRetrieval(query, views...); `eps` positional for short calls, any
        attribute by contract name in `attrs`."""
        if eps is not None:
            attrs["eps"] = eps
        named = {"query": query, **{f"views_{i}": v for i, v in enumerate(views)}}
        x0 = _check_tensors("depth_retrieval", named)
        B, T, m, d = views[0].shape
        if out is None:
            out = torch.empty_like(views[0])
        ptrs = (c_void_p * len(views))(*[v.data_ptr() for v in views])
        args = DepthRetrievalArgs(query=query.data_ptr(), views=ptrs, n_sources=len(views), batch=B, seq=T,
                                  n_streams=m, d=d, out=out.data_ptr())
        keep = _set_attrs(args, DEPTH_RETRIEVAL, attrs)  # noqa: F841
        status = self.lib.msarDepthRetrievalForward(DTYPE_CODES[x0.dtype], ctypes.byref(args), _stream_handle(x0))
        if status:
            raise RuntimeError(f"msarDepthRetrievalForward failed: {status_text(status)}")
        return out
