"""ctypes binding of the msar CUDA kernels (C ABI of plugins/*/xKernel.h) and
the references they are checked against.

One binding drives two builds of the same kernel source:
- the CUDA shared library (scripts/gpu_check.sh) on torch CUDA tensors;
- the CPU emulation library (plugins/tests/cudaHostEmulation.h, built with
  g++) on CPU tensors, which is how the tests run the real kernel code on a
  machine without a GPU.

References: `eager_*` use the model's own mixing code (msar_export.model.mixing,
float32 inside, like the kernels); `reference_*64` are independent float64
implementations of MSAR_SPEC 1.1-1.3.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from ctypes import POINTER, c_float, c_int32, c_int64, c_size_t, c_void_p
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import verdict

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
KERNEL_SOURCES = (
    PLUGINS / "msarFusedMixerPlugin" / "fusedMixerKernel.cu",
    PLUGINS / "msarDepthRetrievalPlugin" / "depthRetrievalKernel.cu",
)
EMULATION_SOURCE = PLUGINS / "tests" / "emulationLib.cpp"

# plugins/common/msarKernelTypes.h
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
MAX_SOURCES = 256
STATUS_TEXT = {0: "ok", 1: "invalid argument", 2: "unsupported configuration", 3: "workspace too small"}
CUDA_ERROR_BASE = 1000


def status_text(status: int) -> str:
    if status >= CUDA_ERROR_BASE:
        return f"CUDA error {status - CUDA_ERROR_BASE}"
    return STATUS_TEXT.get(status, f"unknown status {status}")


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
        ("stream_kernels", POINTER(c_int32)),
        ("n_streams", c_int32),
        ("eps", c_float),
        ("out", c_void_p),
        ("workspace", c_void_p),
        ("workspace_size", c_size_t),
        ("prepared_taps", c_void_p),
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
        ("eps", c_float),
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
        self.lib.msarFusedMixerTapsSize.argtypes = [c_int32, c_int64, POINTER(c_int32), c_int32]
        self.lib.msarFusedMixerTapsSize.restype = c_size_t
        self.lib.msarFusedMixerPrepareTaps.argtypes = [c_int32, c_void_p, c_int32, c_int64, POINTER(c_int32), c_int32,
                                                       c_void_p, c_size_t, c_void_p]
        self.lib.msarFusedMixerPrepareTaps.restype = c_int32
        self.lib.msarDepthRetrievalForward.argtypes = [c_int32, POINTER(DepthRetrievalArgs), c_void_p]
        self.lib.msarDepthRetrievalForward.restype = c_int32

    def fused_mixer_workspace(self, n_sources: int, d: int, stream_kernels) -> int:
        ks = (c_int32 * len(stream_kernels))(*stream_kernels)
        return int(self.lib.msarFusedMixerWorkspaceSize(n_sources, d, ks, len(stream_kernels)))

    def fused_mixer_taps_size(self, n_sources: int, d: int, stream_kernels) -> int:
        ks = (c_int32 * len(stream_kernels))(*stream_kernels)
        return int(self.lib.msarFusedMixerTapsSize(n_sources, d, ks, len(stream_kernels)))

    def prepare_taps(self, conv_weight: torch.Tensor, n_sources: int, stream_kernels) -> torch.Tensor:
        """conv_weight [N, d, K] -> the kernel's taps [n][K][d] in its dtype (msarFusedMixerPrepareTaps), made once
        and passed to fused_mixer(prepared_taps=...) so no call transposes them again."""
        d = conv_weight.shape[1]
        need = self.fused_mixer_taps_size(n_sources, d, stream_kernels)
        taps = torch.empty(max(need, 1), dtype=torch.uint8, device=conv_weight.device)
        ks = (c_int32 * len(stream_kernels))(*[int(k) for k in stream_kernels])
        status = self.lib.msarFusedMixerPrepareTaps(DTYPE_CODES[conv_weight.dtype], conv_weight.data_ptr(), n_sources,
                                                    d, ks, len(stream_kernels), taps.data_ptr(), taps.numel(),
                                                    _stream_handle(conv_weight))
        if status:
            raise RuntimeError(f"msarFusedMixerPrepareTaps failed: {status_text(status)}")
        return taps

    def fused_mixer(self, query, gate_weight, gate_bias, gate_scale, conv_weight, sources, stream_kernels,
                    eps: float, out=None, workspace=None, prepared_taps=None) -> torch.Tensor:
        """h (B, T, d) = FusedMixer(...) on the tensors' device (CUDA build) or the CPU (emulation build).
        Enqueues on the current CUDA stream and does not synchronise. prepared_taps: from prepare_taps
        (then the taps are not transposed again and no workspace is used)."""
        named = {"query": query, "gate_weight": gate_weight, "gate_bias": gate_bias, "gate_scale": gate_scale,
                 "conv_weight": conv_weight}
        named.update({f"sources_{i}": s for i, s in enumerate(sources)})
        x0 = _check_tensors("fused_mixer", named)
        B, T, d = sources[0].shape
        if out is None:
            out = torch.empty_like(sources[0])
        ks = (c_int32 * len(stream_kernels))(*[int(k) for k in stream_kernels])
        need = self.fused_mixer_workspace(len(sources), d, stream_kernels)
        if workspace is None:
            workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=x0.device)
        ptrs = (c_void_p * len(sources))(*[s.data_ptr() for s in sources])
        args = FusedMixerArgs(
            query.data_ptr(), gate_weight.data_ptr(), gate_bias.data_ptr(), gate_scale.data_ptr(),
            conv_weight.data_ptr() if conv_weight.numel() else None, ptrs, len(sources), B, T, d,
            conv_weight.shape[0], ks, len(stream_kernels), float(eps), out.data_ptr(), workspace.data_ptr(),
            workspace.numel(), None if prepared_taps is None else prepared_taps.data_ptr())
        status = self.lib.msarFusedMixerForward(DTYPE_CODES[x0.dtype], ctypes.byref(args), _stream_handle(x0))
        if status:
            raise RuntimeError(f"msarFusedMixerForward failed: {status_text(status)}")
        return out

    def depth_retrieval(self, query, views, eps: float, out=None) -> torch.Tensor:
        """z (B, T, m, d) = DepthRetrieval(query, views...)."""
        named = {"query": query, **{f"views_{i}": v for i, v in enumerate(views)}}
        x0 = _check_tensors("depth_retrieval", named)
        B, T, m, d = views[0].shape
        if out is None:
            out = torch.empty_like(views[0])
        ptrs = (c_void_p * len(views))(*[v.data_ptr() for v in views])
        args = DepthRetrievalArgs(query.data_ptr(), ptrs, len(views), B, T, m, d, float(eps), out.data_ptr())
        status = self.lib.msarDepthRetrievalForward(DTYPE_CODES[x0.dtype], ctypes.byref(args), _stream_handle(x0))
        if status:
            raise RuntimeError(f"msarDepthRetrievalForward failed: {status_text(status)}")
        return out


# ---------------------------------------------------------------------------
# Building the libraries.

def cuda_include_dir() -> Path | None:
    """The CUDA toolkit's include folder (cuda_runtime.h), or None."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    for c in candidates:
        if c and (Path(c) / "include" / "cuda_runtime.h").is_file():
            return Path(c) / "include"
    return None


def emulation_unavailable(compiler: str = "g++") -> str | None:
    """Why the CPU emulation cannot be built here (needs g++ >= 11 for std::barrier and the CUDA headers), or None."""
    gxx = shutil.which(compiler)
    if gxx is None:
        return f"{compiler} not found"
    version = subprocess.run([gxx, "-dumpversion"], capture_output=True, text=True).stdout.strip()
    if not version or int(version.split(".")[0]) < 11:
        return f"{compiler} {version or '?'} is older than 11 (std::barrier)"
    return None if cuda_include_dir() is not None else "CUDA headers (cuda_runtime.h) not found; set CUDA_HOME"


def compile_emulation_library(out: str | os.PathLike, compiler: str = "g++") -> Path:
    """Build the CPU emulation of the kernels (needs g++ >= 11 and the CUDA headers, no GPU)."""
    inc = cuda_include_dir()
    if inc is None:
        raise FileNotFoundError("CUDA headers (cuda_runtime.h) not found; set CUDA_HOME")
    out = Path(out)
    cmd = [compiler, "-std=c++20", "-O2", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra", "-Wno-unknown-pragmas",
           f"-I{inc}", str(EMULATION_SOURCE), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


# ---------------------------------------------------------------------------
# References.

def split_conv_weight(conv_weight: torch.Tensor, i: int, stream_kernels) -> list[torch.Tensor]:
    """Row i of conv_weight [N, d, K] -> Conv1d weights [d, 1, k] for streams 1..m-1."""
    out, off = [], 0
    for k in stream_kernels[1:]:
        out.append(conv_weight[i, :, off:off + k].unsqueeze(1))
        off += k
    return out


def eager_fused_mixer(query, gate_weight, gate_bias, gate_scale, conv_weight, sources, stream_kernels, eps):
    """The model's own mixer code (float32 inside) on the op's inputs -> h float32."""
    from ..model.layers import rms_normalize
    from ..model.mixing import causal_conv, depth_retrieval, stream_fusion

    views = []
    for i, x in enumerate(sources):
        xf = x.float()
        streams = [xf]
        for w in split_conv_weight(conv_weight, i, stream_kernels):
            k = w.shape[-1]
            streams.append(causal_conv(F.pad(xf, (0, 0, k - 1, 0)), w.float()))
        views.append(torch.stack(streams, dim=2))
    keys = [rms_normalize(v, eps) for v in views]
    z = depth_retrieval(query, torch.stack(views), torch.stack(keys))
    return stream_fusion(z, gate_weight, gate_bias, gate_scale)


def reference_fused_mixer64(query, gate_weight, gate_bias, gate_scale, conv_weight, sources, stream_kernels, eps):
    """MSAR_SPEC 1.1-1.3 written out in float64 -> h float64."""
    T = sources[0].shape[1]
    views = []
    for i, x in enumerate(sources):
        x = x.double()
        streams = [x]
        for w in split_conv_weight(conv_weight.double(), i, stream_kernels):
            k = w.shape[-1]
            xp = F.pad(x, (0, 0, k - 1, 0))  # zeros before the sequence start
            streams.append(sum(xp[:, j:j + T] * w[:, 0, j] for j in range(k)))  # tap j: token t-(k-1-j)
        views.append(torch.stack(streams, dim=2))
    V = torch.stack(views)  # (n, B, T, m, d)
    keys = V / torch.sqrt((V * V).mean(-1, keepdim=True) + eps)
    alpha = torch.softmax((keys * query.double()).sum(-1), dim=0)  # (n, B, T, m)
    z = (alpha.unsqueeze(-1) * V).sum(0)  # (B, T, m, d)
    logits = z.flatten(-2) @ gate_weight.double().T  # (B, T, m)
    g = torch.sigmoid(gate_scale.double() * logits + gate_bias.double())
    return (g.unsqueeze(-1) * z).sum(-2)


def eager_depth_retrieval(query, views, eps):
    from ..model.layers import rms_normalize
    from ..model.mixing import depth_retrieval

    V = torch.stack([v.float() for v in views])
    return depth_retrieval(query, V, rms_normalize(V, eps))


def reference_depth_retrieval64(query, views, eps):
    V = torch.stack([v.double() for v in views])
    keys = V / torch.sqrt((V * V).mean(-1, keepdim=True) + eps)
    alpha = torch.softmax((keys * query.double()).sum(-1), dim=0)
    return (alpha.unsqueeze(-1) * V).sum(0)


def random_fused_mixer_inputs(n: int, B: int, T: int, d: int, stream_kernels, dtype=torch.float32, device="cpu",
                              seed: int = 0, extra_rows: int = 1) -> dict:
    """Inputs with every parameter non-trivial; scores of order one (query ~ 2/sqrt(d))."""
    g = torch.Generator().manual_seed(seed)
    m, K = len(stream_kernels), sum(stream_kernels[1:])

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(dtype=dtype, device=device).contiguous()

    return dict(
        query=rnd(m, d, scale=2.0 / d**0.5),
        gate_weight=rnd(m, m * d, scale=1.0 / (m * d) ** 0.5),
        gate_bias=rnd(m, scale=0.5),
        gate_scale=(1.0 + torch.rand((), generator=g)).to(dtype=dtype, device=device),
        conv_weight=rnd(n + extra_rows, d, K, scale=0.5),
        sources=[rnd(B, T, d) for _ in range(n)],
        stream_kernels=list(stream_kernels),
        eps=1e-6,
    )


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The project's one metric (msar_export.verdict.rel_err) on torch tensors of any dtype."""
    return verdict.rel_err(got.detach().double().cpu().numpy(), ref.detach().double().cpu().numpy())
