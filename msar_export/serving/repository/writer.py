"""Triton model repositories, written atomically (temp dir, validate, rename).

- `build_stock_repo`: one model for Triton's stock backends: `onnxruntime` for
  an ONNX file, `tensorrt` for a serialised engine (plugin libraries copied in).
- `build_serving_repo`: the `logits` and `generate` models that `msar-export
  serve` runs on the Python backend (triton_model.py over ONNX Runtime).

Every repository carries `manifest.json` (sha256 of each file) so a restart can
check that nothing it serves was lost or changed (`verify_repo`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

from ...errors import EngineError, InputError, MsarError, OnnxModelError, OutputError, first_line
from ...fileio import atomic_dir, check_input_file, check_output_dir, file_sha256
from ...graph_file import ExportedGraph
from ...graph_spec import INPUT_IDS, LOGITS
from ...untrusted import contained, loads_json
from .modelconfig import Enum, GraphIO, io_entry, parameters, read_onnx_io, render, validate_repository
from .readme import readme_serving, readme_stock

MANIFEST = "manifest.json"
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
TRT_EXTS = (".plan", ".engine", ".trt")


GENERATORS = ("msar-export triton-repo", "msar-export serve")


def _copy(src: Path, dst: Path) -> None:
    """Copy, never hard-link: a second link to the user's file makes onnx refuse it
    ('potential hardlink attack') and lets the repository change the original."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def copy_onnx_bundle(model: Path, files: dict[str, Path], dst: Path) -> None:
    """MODEL.onnx -> `dst`, and each checked data file to the same relative location beside it."""
    _copy(model, dst)
    for loc, real in files.items():
        _copy(real, dst.parent / loc)


def check_runs(model: Path) -> None:
    """ONNX Runtime loads the graph as the repository holds it: no repository for a graph that
    cannot run (the server would only fail later, at load time)."""
    from ...runners.ort_runner import THREADS, open_session

    open_session(model, threads=THREADS["probe"], optimization="disable", label=str(model))


def _our_manifest(out: Path) -> dict | None:
    try:
        manifest = loads_json((out / MANIFEST).read_text(), str(out / MANIFEST))
    except (OSError, ValueError, MsarError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("generator") in GENERATORS else None


def foreign_files(out: Path, manifest: dict) -> list[str]:
    """Files in a repository we wrote that its manifest does not list: a model a user added."""
    ours = set(manifest.get("files") or {}) | {MANIFEST}
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if (p.is_file() or p.is_symlink()) and str(p.relative_to(out)) not in ours)


def check_repo_target(out: Path, sources: list[Path], force: bool = False, keep_added: bool = True) -> None:
    """`-o` may be absent or a repository msar-export wrote (its manifest.json says so);
    anything else is refused unless --force, and never a folder that holds a source."""
    real = out.resolve()
    for src in sources:
        src_real = src.resolve()
        if src_real == real or real in src_real.parents:
            raise OutputError(f"{out}: holds {src}, which this repository is made from; give another directory")
    check_output_dir(out)  # what atomic_dir will check again at the swap, refused before any work
    if not out.exists():
        return
    manifest = _our_manifest(out)
    if not force and any(out.iterdir()) and manifest is None:
        raise OutputError(f"{out}: exists and is not a repository msar-export wrote (no {MANIFEST} from it); "
                          "it would be replaced: give a new directory, or pass --force to replace it")
    # Ours, but a user added a model since: replacing the folder would delete it.
    # (`serve`'s own repository, where Triton's Python backend writes __pycache__, skips this.)
    added = [] if force or manifest is None or not keep_added else foreign_files(out, manifest)
    if added:
        raise OutputError(f"{out}: holds {len(added)} file(s) msar-export did not write (first: {added[0]}); "
                          "they would be deleted: move them out, or pass --force to replace the repository")


def _dir_mode(path: Path) -> None:
    """mkdtemp makes 0700 directories; a repository must be readable by the server's user."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)


def write_manifest(root: Path, extra: dict) -> dict:
    files = {str(p.relative_to(root)): file_sha256(p) for p in sorted(root.rglob("*"))
             if p.is_file() and p.name != MANIFEST}
    manifest = {**extra, "files": files}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _dir_mode(root)
    return manifest


def verify_repo(repo: str | os.PathLike) -> list[str]:
    """Problems with a repository against its manifest ([] when every file is there, unchanged)."""
    repo = Path(repo)
    try:
        manifest = loads_json((repo / MANIFEST).read_text(), str(repo / MANIFEST))
    except (OSError, ValueError, MsarError) as e:
        return [f"{repo / MANIFEST}: unreadable ({type(e).__name__})"]
    problems = []
    files = manifest.get("files", {}) if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return [f"{repo / MANIFEST}: no file table"]
    for rel, sha in files.items():
        try:
            p = contained(repo, rel, "manifest entry", InputError)
        except InputError as e:
            problems.append(f"{rel}: {first_line(e)}")
            continue
        if file_sha256(p) != sha:
            problems.append(f"{rel}: changed")
    return problems


def _model_name(name: str | None, path: Path) -> str:
    name = name or re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem) or "model"
    if not NAME_RE.match(name):
        raise InputError(f"--name {name!r}: use letters, digits, '_', '.', '-' (a directory name Triton accepts)")
    return name


def _engine_io(path: Path, plugins: list[Path]) -> GraphIO:
    """Engine I/O through TensorRT itself (needs tensorrt and a GPU to deserialise)."""
    import ctypes

    import tensorrt as trt

    for p in plugins:
        ctypes.CDLL(str(p), mode=ctypes.RTLD_GLOBAL)
    logger = trt.Logger(trt.Logger.ERROR)
    trt.init_libnvinfer_plugins(logger, "")
    engine = trt.Runtime(logger).deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise EngineError(f"{path}: TensorRT cannot deserialise this engine (wrong TensorRT version or missing plugins?)")
    names = {trt.float32: "TYPE_FP32", trt.float16: "TYPE_FP16", trt.int32: "TYPE_INT32", trt.int8: "TYPE_INT8",
             trt.bool: "TYPE_BOOL"}
    for attr, t in (("int64", "TYPE_INT64"), ("bfloat16", "TYPE_BF16"), ("uint8", "TYPE_UINT8")):
        if hasattr(trt, attr):
            names[getattr(trt, attr)] = t
    from .modelconfig import TensorSpec

    ins, outs = [], []
    for i in range(engine.num_io_tensors):
        n = engine.get_tensor_name(i)
        shape = tuple(d if d >= 0 else "batch" if k == 0 else "?" for k, d in enumerate(engine.get_tensor_shape(n)))
        spec = TensorSpec(n, names[engine.get_tensor_dtype(n)], shape)
        (ins if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT else outs).append(spec)
    return GraphIO(tuple(ins), tuple(outs), {})


def native_ops() -> Path | None:
    """The native msar kernel library ONNX Runtime sessions of this process load (None: the
    function bodies run): a repository carries it so the served graph runs the same way."""
    from ...runners.ort_runner import resolve_ort_ops

    return resolve_ort_ops()


def stock_config(name: str, backend: str, io: GraphIO, max_batch: int, kind: str, instances: int,
                 queue_delay_us: int, batching: bool, op_library: Path | None = None) -> tuple[str, bool]:
    """config.pbtxt text for a stock backend, and whether Triton may batch this graph."""
    batched = io.batch_symbol() is not None and max_batch > 0
    cfg = {
        "name": name,
        "backend": backend,
        "max_batch_size": max_batch if batched else 0,
        "input": [io_entry(t, batched) for t in io.inputs],
        "output": [io_entry(t, batched) for t in io.outputs],
        "dynamic_batching": ({"max_queue_delay_microseconds": queue_delay_us} if batched and batching else None),
        "instance_group": [{"count": instances, "kind": Enum(f"KIND_{kind.upper()}")}],
        # Triton's onnxruntime backend registers these with the session (an absolute path: it is
        # not resolved against the model folder).
        "model_operations": {"op_library_filename": [str(op_library)]} if op_library else None,
    }
    return render(cfg), batched


def build_stock_repo(model: str | os.PathLike, out: str | os.PathLike, name: str | None = None,
                     max_batch: int = 8, kind: str | None = None, instances: int = 1, queue_delay_us: int = 500,
                     batching: bool = True, plugins=(), onnx_for_engine: str | os.PathLike | None = None,
                     validate: bool = True, force: bool = False) -> Path:
    """MODEL.onnx -> onnxruntime model, MODEL.plan -> tensorrt model, in repository `out`."""
    model, out = Path(model), Path(out)
    if not model.is_file():
        raise InputError(f"{model}: no such file")
    if max_batch < 0 or instances < 1:
        raise InputError("--max-batch must be >= 0 and --instances >= 1")
    name = _model_name(name, model)
    plugins = [Path(p) for p in plugins]
    for p in plugins:
        check_input_file(p, "--plugins: plugin library")
    if model.suffix.lower() == ".onnx":
        if plugins:
            raise InputError("--plugins is for TensorRT engines; an ONNX model runs on stock ONNX Runtime")
        backend, io = "onnxruntime", read_onnx_io(model)  # its external-data files checked, in io.files
    elif model.suffix.lower() in TRT_EXTS:
        backend = "tensorrt"
        if model.stat().st_size == 0:
            raise EngineError(f"{model}: the file is empty")
        if onnx_for_engine is not None:
            io = read_onnx_io(onnx_for_engine)
        else:
            try:
                io = _engine_io(model, plugins)
            except ImportError:
                raise EngineError(f"{model}: cannot read the engine's inputs and outputs without TensorRT here; "
                                  "pass --onnx MODEL.onnx (the graph the engine was built from)") from None
            except EngineError:
                raise
            except Exception as e:  # no GPU, wrong TensorRT version, ...
                raise EngineError(f"{model}: TensorRT cannot load this engine here ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:200] if str(e) else ''}); pass --onnx MODEL.onnx") from None
    else:
        raise InputError(f"{model}: expected an ONNX model (.onnx) or a TensorRT engine ({', '.join(TRT_EXTS)})")
    check_repo_target(out, [model, *plugins], force)
    kind = kind or ("gpu" if backend == "tensorrt" else "cpu")
    library = native_ops() if backend == "onnxruntime" else None
    final_library = out.resolve() / name / library.name if library else None
    text, batched = stock_config(name, backend, io, max_batch, kind, instances, queue_delay_us, batching, final_library)
    with atomic_dir(out) as tmp:
        mdir = tmp / name
        (mdir / "1").mkdir(parents=True)
        (mdir / "config.pbtxt").write_text(text)
        if backend == "onnxruntime":
            if library is not None:
                shutil.copy2(library, mdir / library.name)
            copy_onnx_bundle(model, io.files, mdir / "1" / "model.onnx")
            check_runs(mdir / "1" / "model.onnx")
        else:
            _copy(model, mdir / "1" / "model.plan")
            if plugins:
                (mdir / "plugins").mkdir()
            for p in plugins:
                shutil.copy2(p, mdir / "plugins" / p.name)
        (tmp / "README.md").write_text(readme_stock(name, backend, io, batched, [p.name for p in plugins], model))
        if validate:
            validate_repository(tmp)
        write_manifest(tmp, {"generator": "msar-export triton-repo", "backend": backend, "model": name,
                             "source": str(model.resolve())})
    return out


# -- the repository `msar-export serve` runs -----------------------------------

TRITON_MODEL_PY = Path(__file__).with_name("triton_model.py")
# The one ONNX Runtime runner, copied beside model.py (Triton's Python environment has no msar_export).
ORT_RUNNER_PY = Path(importlib.util.find_spec("msar_export.runners.ort_runner").origin)  # found, not imported


def serving_configs(prefill_io: GraphIO | None, decode_io: GraphIO | None, repo_abs: Path, max_batch: int,
                    batching: bool, instances: int, threads: int, queue_delay_us: int, merge_tokens: int,
                    max_new_tokens_limit: int) -> dict[str, str]:
    """{model name: config.pbtxt} for the Python-backend logits / generate models."""
    logits_io = prefill_io or decode_io
    vocab_out = next(t for t in logits_io.outputs if t.name == LOGITS)
    cfg_json = logits_io.graph.config.to_dict()
    common = {
        "backend": "python",
        "max_batch_size": max_batch,
        "dynamic_batching": {"max_queue_delay_microseconds": queue_delay_us} if batching else None,
        "instance_group": [{"count": instances, "kind": Enum("KIND_CPU")}],
    }
    ids_in = {"name": "input_ids", "data_type": Enum("TYPE_INT64"), "dims": [-1], "allow_ragged_batch": True}
    meta = {"threads": threads, "merge_tokens": merge_tokens, "vocab_size": cfg_json.get("vocab_size", ""),
            "max_seq_len": cfg_json.get("max_seq_len", "")}
    out = {}
    graph = "model.onnx"
    out["logits"] = render({
        "name": "logits", **{k: common[k] for k in ("backend", "max_batch_size")},
        "input": [ids_in],
        "output": [{"name": "logits", "data_type": Enum(vocab_out.dtype), "dims": [-1, vocab_out.shape[-1]]}],
        **{k: common[k] for k in ("dynamic_batching", "instance_group")},
        "parameters": parameters({"msar_model": "logits", "onnx_file": graph, **meta,
                                  "reference_onnx": str(repo_abs / "logits" / "1" / graph),
                                  "graph": "prefill" if prefill_io else "decode"}),
    })
    if decode_io is not None:
        out["generate"] = render({
            "name": "generate", **{k: common[k] for k in ("backend", "max_batch_size")},
            "input": [ids_in, {"name": "max_new_tokens", "data_type": Enum("TYPE_INT32"), "dims": [1]}],
            "output": [{"name": "tokens", "data_type": Enum("TYPE_INT64"), "dims": [-1]}],
            **{k: common[k] for k in ("dynamic_batching", "instance_group")},
            "parameters": parameters({"msar_model": "generate", "onnx_file": graph, **meta,
                                      "max_new_tokens_limit": max_new_tokens_limit,
                                      "reference_onnx": str(repo_abs / "generate" / "1" / graph), "graph": "decode"}),
        })
    return out


def _key(prefill: Path | None, decode: Path | None, configs: dict[str, str], library: Path | None) -> str:
    h = hashlib.sha256()
    for p in (prefill, decode, library):
        h.update((file_sha256(p) if p else "-").encode())
    h.update(TRITON_MODEL_PY.read_bytes())
    h.update(ORT_RUNNER_PY.read_bytes())
    for name in sorted(configs):
        h.update(name.encode() + configs[name].encode())
    return h.hexdigest()


def build_serving_repo(prefill: ExportedGraph | str | os.PathLike | None,
                       decode: ExportedGraph | str | os.PathLike | None,
                       out: str | os.PathLike, max_batch: int = 16, batching: bool = True, instances: int = 1,
                       threads: int | None = None, queue_delay_us: int = 2000, merge_tokens: int = 8,
                       max_new_tokens_limit: int = 256, validate: bool = True,
                       force: bool = False) -> tuple[Path, bool]:
    """Write (or reuse, when identical and intact) the serving repository; return (path, rebuilt)."""
    out = Path(out).resolve()
    if not prefill and not decode:
        raise InputError("nothing to serve: give a checkpoint, a prefill graph or a decode graph")
    if threads is None:
        from ...runners.ort_runner import THREADS

        threads = THREADS["serving"]
    if max_batch < 1 or instances < 1 or threads < 1:
        raise InputError("--max-batch, --instances and --threads must be >= 1")
    prefill_io = read_onnx_io(prefill) if prefill else None  # an ExportedGraph handed in is not read again
    decode_io = read_onnx_io(decode) if decode else None
    prefill = prefill_io.graph.path if prefill_io else None
    decode = decode_io.graph.path if decode_io else None
    for path, io, want in ((prefill, prefill_io, "prefill"), (decode, decode_io, "decode")):
        if io is None:
            continue
        io.graph.config  # OnnxModelError: no msar.config metadata, or an unreadable one
        got = io.kind
        if got != want:
            raise OnnxModelError(f"{path}: a {got} graph where a {want} graph was expected")
        for t in io.inputs + io.outputs:
            if t.name in (INPUT_IDS, LOGITS) and t.shape[0] != "batch":
                raise OnnxModelError(f"{path}: '{t.name}' has no dynamic batch dimension; re-export it")
    if prefill_io and decode_io and prefill_io.graph.config != decode_io.graph.config:
        raise OnnxModelError(f"{prefill} and {decode} come from different model configurations")
    configs = serving_configs(prefill_io, decode_io, out, max_batch, batching, instances, threads, queue_delay_us,
                              merge_tokens, max_new_tokens_limit)
    library = native_ops()  # copied beside the runner, which loads what lies beside it
    key = _key(prefill, decode, configs, library)
    if (out / MANIFEST).is_file():
        try:
            old = loads_json((out / MANIFEST).read_text(), str(out / MANIFEST))
        except (ValueError, MsarError):
            old = {}
        if isinstance(old, dict) and old.get("key") == key and not verify_repo(out):
            return out, False
    sources = {"logits": (prefill or decode).resolve()}
    if decode_io is not None:
        sources["generate"] = decode.resolve()
    check_repo_target(out, list(sources.values()), force, keep_added=False)
    bundles = {"logits": (prefill_io or decode_io).files, "generate": decode_io.files if decode_io else {}}
    with atomic_dir(out) as tmp:
        for name, text in configs.items():
            (tmp / name / "1").mkdir(parents=True)
            (tmp / name / "config.pbtxt").write_text(text)
            shutil.copy2(TRITON_MODEL_PY, tmp / name / "1" / "model.py")
            shutil.copy2(ORT_RUNNER_PY, tmp / name / "1" / ORT_RUNNER_PY.name)
            if library is not None:
                shutil.copy2(library, tmp / name / "1" / library.name)
            copy_onnx_bundle(sources[name], bundles[name], tmp / name / "1" / "model.onnx")
            check_runs(tmp / name / "1" / "model.onnx")
        (tmp / "README.md").write_text(readme_serving(sources, batching, max_batch))
        if validate:
            validate_repository(tmp)
        write_manifest(tmp, {"generator": "msar-export serve", "key": key,
                             "sources": {k: str(v) for k, v in sources.items()},
                             "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
    return out, True
