"""The one ONNX Runtime runner: every session msar-export opens is made here.

Session options (threads, providers, optimization level, low-memory mode,
spinning, where external data is read from) are decided in `session_options`
and `resolve_providers`, nowhere else: check, runtime generation, serving,
bench and export validation all open their sessions through `open_session`.

- `OrtGraph`: one session over an exported graph, with the prefill `logits()`
  and the decode `step()` (caches handed from each step's present outputs to
  the next step's past inputs) that the runtimes and the server build on.
- `OrtRunner`: the same graph behind Polygraphy's runner contract
  (`BaseRunner`: activate / infer / deactivate, get_input_metadata), for the
  parity check's Comparator.

Standalone on purpose: numpy and onnxruntime only (Polygraphy when installed),
no torch, no msar_export import at module level, so `msar-export serve` copies
this file next to the Triton model.py, whose Python environment has neither.
The port order it relies on - input_ids, attention_mask, position_ids, then the
caches; logits, then their next values in the same order - is GraphSpec's
(msar_export/graph_spec.py), and tests check that the two agree.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

try:
    from polygraphy.backend.base import BaseRunner as _RunnerBase
except ImportError:  # Triton's Python environment: the same contract, without Polygraphy
    class _RunnerBase:
        def __init__(self, name=None, prefix=None):
            self.name, self.inference_time, self.is_active = name or prefix or "runner", None, False

        def __enter__(self):
            self.activate()
            return self

        def __exit__(self, exc_type, exc_value, traceback):
            self.deactivate()

        def activate(self):
            if not self.is_active:
                self.activate_impl()
                self.is_active = True

        def deactivate(self):
            if self.is_active:
                self.deactivate_impl()
                self.is_active = False

        def get_input_metadata(self, use_numpy_dtypes=None):
            return self.get_input_metadata_impl()

        def infer(self, feed_dict, check_inputs=True):
            return self.infer_impl(feed_dict)

        def last_inference_time(self):
            return self.inference_time

try:  # inside the msar_export package: its one-line user error
    from ..errors import OnnxModelError as LoadError
except ImportError:  # the standalone copy
    class LoadError(ValueError):
        """ONNX Runtime cannot load the graph."""

OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")
PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
                  "tensorrt": "TensorrtExecutionProvider"}
ORT_TO_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
             "tensor(bfloat16)": None}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def resolve_providers(providers=None) -> list[str]:
    """Execution providers: the given ones ('cpu', 'cuda' or ORT's own names), else
    whatever is installed, CUDA first when onnxruntime-gpu is present, CPU otherwise."""
    import onnxruntime as ort

    if providers:
        return [PROVIDER_NAMES.get(p.lower(), p) for p in providers]
    available = ort.get_available_providers()
    preferred = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return [p for p in preferred if p in available] or available


# ONNX Runtime intra-op threads per kind of session: the one place to change them.
# validation: the export's own check (2 cores here); reference: the load test's
# batch-1 references, beside a server that has the cores; serving: per Triton model
# instance (`serve --threads` overrides); generate: `msar-export generate` (--threads).
THREADS = {"validation": 2, "reference": 1, "serving": 1, "generate": 2, "probe": 1}


# The native msar kernels (plugins/msarOrtOps, built by scripts/setup_env.sh into this folder;
# `msar-export serve` copies them beside this file).  MSAR_ORT_OPS chooses for every session of
# the process and its children: auto (the library when it is there, else the function bodies,
# with one line on stderr), native (the library or an error), function, or a library's path.
ORT_OPS_ENV = "MSAR_ORT_OPS"
ORT_OPS_CHOICES = ("auto", "native", "function")
NATIVE_LIBRARY = "libmsar_ort_ops.so"
_told_missing = False


def native_library() -> Path | None:
    """The native msar kernel library this process would load, or None."""
    choice = os.environ.get(ORT_OPS_ENV, "auto")
    if choice not in ORT_OPS_CHOICES:
        return Path(choice) if Path(choice).is_file() else None
    here = Path(__file__).with_name(NATIVE_LIBRARY)
    return here if here.is_file() else None


def resolve_ort_ops(ort_ops: str | None = None) -> Path | None:
    """The library to register for `ort_ops` (None: MSAR_ORT_OPS, default auto), or None for the
    function bodies.  `native` (or a path) without a loadable library is a LoadError."""
    global _told_missing
    choice = ort_ops or os.environ.get(ORT_OPS_ENV, "auto")
    if choice == "function":
        return None
    if choice not in ORT_OPS_CHOICES:  # a path
        if not Path(choice).is_file():
            raise LoadError(f"{ORT_OPS_ENV}={choice}: no such library; build it with scripts/setup_env.sh")
        return Path(choice)
    lib = native_library()
    if lib is None and choice == "native":
        raise LoadError(f"native msar kernels requested but {NATIVE_LIBRARY} is not built; scripts/setup_env.sh "
                        "builds it (needs cmake, ninja, g++ and the ONNX Runtime headers it fetches)")
    if lib is None and not _told_missing:
        _told_missing = True
        logging.getLogger(__name__).warning(
            f"native msar kernels not built ({NATIVE_LIBRARY}; scripts/setup_env.sh builds them): "
            "ONNX Runtime runs the msar function bodies")
    return lib


def session_options(threads: int | None = None, optimization: str = "all", low_memory: bool = False,
                    spinning: bool = True, external_folder: str | os.PathLike | None = None,
                    ort_ops: str | None = None):
    """The SessionOptions of every session msar-export opens: _options(...) with the native msar
    kernels registered when `ort_ops` resolves to them (resolve_ort_ops)."""
    library = resolve_ort_ops(ort_ops)
    return _options(threads, optimization, low_memory, spinning, external_folder, library)


def _options(threads, optimization, low_memory, spinning, external_folder, library: Path | None):
    """threads: intra-op threads (None: ORT's default, one per core), one inter-op thread.
    low_memory: no pre-packed copy of each MatMul weight (ORT's CPU default: a second
    copy of most weights), so weights in external data are used straight from the mapped file.
    spinning=False: idle threads sleep (several Triton stubs share few cores).
    external_folder: where a model given as bytes has its external data (the model's folder).
    library: the native msar kernels to register (None: the function bodies run); registered
    kernels take the msar nodes and their function bodies are then not inlined."""
    import onnxruntime as ort

    if optimization not in OPTIMIZATION_LEVELS:
        raise ValueError(f"optimization must be one of {OPTIMIZATION_LEVELS}, got {optimization!r}")
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = max(1, int(threads))
        opts.inter_op_num_threads = 1
    if low_memory:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if not spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if external_folder is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(external_folder))
    opts.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    opts.log_severity_level = 4  # fatal only: a failing run raises its message; ORT printing it too made two lines
    if library is not None:
        opts.register_custom_ops_library(str(library))
    return opts


def open_session(model, providers=None, threads: int | None = None, optimization: str = "all",
                 low_memory: bool = False, spinning: bool = True, external_folder=None, label=None,
                 what: str = "file", ort_ops: str | None = None):
    """An InferenceSession over `model` (a path, or the bytes of a model).  A graph ONNX
    Runtime cannot load is a LoadError naming `label` (the file), one line.  The session's
    `msar_native` says whether the native msar kernels were registered."""
    import onnxruntime as ort

    library = resolve_ort_ops(ort_ops)  # once: what is registered and what msar_native reports
    opts = _options(threads, optimization, low_memory, spinning, external_folder, library)
    source = model if isinstance(model, (bytes, bytearray)) else str(model)
    try:
        # low_memory also drops constant folding, whose folded copies stayed beside the weights
        # (a transposed tied embedding; float32 Casts of float16 weights): 1863 -> 1450 MiB for
        # a 318 M-parameter float32 file, 2348 -> ~1900 MiB for its float16 export, logits
        # bit-identical in both (2026-12-01; tests/test_export_memory.py compares them).
        session = ort.InferenceSession(source, opts, providers=resolve_providers(providers),
                                       disabled_optimizers=["ConstantFolding"] if low_memory else None)
        session.msar_native = library is not None
        return session
    except Exception as e:  # ORT raises its own Fail/InvalidGraph/... types for unreadable files
        name = label if label is not None else ("the model" if source is model else source)
        err = LoadError(f"{name}: ONNX Runtime cannot load this {what} ({_first_line(e)[:300]})")
        err.cause = _first_line(e)
        raise err from None


class OrtGraph:
    """One session over an exported prefill or decode graph."""

    def __init__(self, model, **session):
        self.session = open_session(model, **session)
        ins = self.session.get_inputs()
        self.inputs = {i.name: i for i in ins}
        self.input_names = [i.name for i in ins]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.is_decode = len(ins) > 1
        past = self.input_names[3:] if self.is_decode else []
        self.next_cache_names = dict(zip(self.output_names[1:], past))
        self.cache_specs = [(n, self.inputs[n].shape, ORT_TO_NP.get(self.inputs[n].type)) for n in past]

    @property
    def cache_dtype(self):
        """The numpy dtype the caches are fed in (None: one numpy cannot feed, e.g. bfloat16)."""
        return self.cache_specs[0][2] if self.cache_specs else None

    def run(self, feeds: dict, outputs=None) -> OrderedDict:
        names = list(outputs) if outputs is not None else self.output_names
        return OrderedDict(zip(names, self.session.run(names, feeds)))

    def logits(self, input_ids: np.ndarray) -> np.ndarray:
        """Prefill: input_ids [b, T] -> logits [b, T, vocab] (a decode graph: with an empty cache)."""
        ids = np.asarray(input_ids, np.int64)
        if not self.is_decode:
            return self.session.run([self.output_names[0]], {self.input_names[0]: ids})[0]
        mask = np.ones_like(ids)
        positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape).copy()
        return self.step(ids, mask, positions, self.empty_cache(ids.shape[0]))[0]

    def empty_cache(self, batch: int) -> dict:
        """The past inputs for `batch` rows and no past tokens: the symbolic dim 'batch' is
        `batch`, the other symbolic one (the past) 0, fixed dims stay."""
        return {name: np.zeros([batch if d == "batch" else (d if isinstance(d, int) else 0) for d in shape], dtype)
                for name, shape, dtype in self.cache_specs}

    def step(self, input_ids, attention_mask, position_ids, cache: dict):
        """One decode step -> (logits, the next step's cache)."""
        ids, mask, pos = self.input_names[:3]
        feeds = {ids: np.asarray(input_ids, np.int64), mask: np.asarray(attention_mask, np.int64),
                 pos: np.asarray(position_ids, np.int64), **cache}
        outs = self.run(feeds)
        nxt = self.next_cache_names
        return outs[self.output_names[0]], {nxt[n]: v for n, v in outs.items() if n in nxt}


class OrtRunner(_RunnerBase):
    """An OrtGraph behind Polygraphy's runner contract: the session is opened on
    activate() (a LoadError then, when ONNX Runtime cannot load the graph) and
    dropped on deactivate(); infer() returns every graph output by name."""

    def __init__(self, model, name: str | None = None, outputs=None, **session):
        """model: a path, model bytes, or a callable giving either (called on activate).
        outputs: the outputs infer() returns (default: all)."""
        super().__init__(name=name, prefix="msar-onnxrt-runner")
        self.model, self.outputs, self.session_settings, self.graph = model, outputs, session, None

    def activate_impl(self):
        self.graph = OrtGraph(self.model() if callable(self.model) else self.model, **self.session_settings)

    def get_input_metadata_impl(self):
        try:
            from polygraphy.common import TensorMetadata
            from polygraphy.datatype import DataType
        except ImportError:
            return {i.name: (i.type, i.shape) for i in self.graph.inputs.values()}
        meta = TensorMetadata()
        for i in self.graph.inputs.values():
            meta.add(i.name, dtype=DataType.from_dtype(i.type, "onnxruntime"), shape=i.shape)
        return meta

    def infer_impl(self, feed_dict):
        feeds = {k: np.asarray(v.cpu() if hasattr(v, "cpu") else v) for k, v in feed_dict.items()}
        start = time.perf_counter()
        out = self.graph.run(feeds, self.outputs)
        self.inference_time = time.perf_counter() - start
        return out

    def deactivate_impl(self):
        self.graph = None


__all__ = ["OrtGraph", "OrtRunner", "LoadError", "open_session", "session_options", "resolve_providers",
           "resolve_ort_ops", "native_library", "ORT_OPS_ENV", "ORT_OPS_CHOICES", "NATIVE_LIBRARY"]
