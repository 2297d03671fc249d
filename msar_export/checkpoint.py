"""Checkpoint directories: `config.json` + `model.safetensors` (MSAR_SPEC.md section 2).

Loading is strict: every expected tensor present with its exact shape, no
extra tensor, every value finite, config consistent.  Pickle files are
refused unless the caller passes `trust_pickle=True`, and even then go only
through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Iterator

import torch

from .config import MSARConfig
from .errors import CheckpointError, ConfigError, OutputError, first_line
from .fileio import atomic_dir
from .untrusted import contained, read_small_file
from .weights import INDEX_FILE, SHARD_SIZE, WEIGHTS_FILE, WeightFiles, plan_shards, write_weights

CONFIG_FILE = "config.json"
PICKLE_FILES = ("model.pt", "model.bin", "pytorch_model.bin")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def iter_expected(cfg: MSARConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor name and shape a checkpoint of `cfg` holds, in file order, lazily."""
    d, V, L, F_, m = cfg.d_model, cfg.vocab_size, cfg.n_sublayers, cfg.mlp_hidden, cfg.n_streams
    qd, kvd = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    yield "embed.weight", (V, d)
    for l in range(1, L + 1):
        yield f"layers.{l}.norm.weight", (d,)
        if l % 2 == 1:
            yield from ((f"layers.{l}.wq.weight", (qd, d)), (f"layers.{l}.wk.weight", (kvd, d)),
                        (f"layers.{l}.wv.weight", (kvd, d)), (f"layers.{l}.wo.weight", (d, qd)))
        else:
            yield from ((f"layers.{l}.w_gate.weight", (F_, d)), (f"layers.{l}.w_up.weight", (F_, d)),
                        (f"layers.{l}.w_down.weight", (d, F_)))
    if cfg.residual in ("attnres", "msar"):
        for j in range(1, L + 2):
            yield f"mixers.{j}.query", (m, d)
            if cfg.residual == "msar":
                yield from ((f"mixers.{j}.gate.weight", (m, m * d)), (f"mixers.{j}.gate.bias", (m,)),
                            (f"mixers.{j}.gate_scale", ()))
    for i in range(L + 1 if cfg.residual == "msar" else 0):
        for r, k in enumerate(cfg.conv_kernels, start=1):
            yield f"sources.{i}.conv.{r}.weight", (d, 1, k)
    yield "final_norm.weight", (d,)
    if not cfg.tie_embeddings:
        yield "lm_head.weight", (V, d)


def expected_shapes(cfg: MSARConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape a checkpoint of `cfg` holds, in file order."""
    return dict(iter_expected(cfg))


def expected_count(cfg: MSARConfig) -> int:
    """len(expected_shapes(cfg)), without building the table (a config can claim 10**8 blocks)."""
    L, mixers = cfg.n_sublayers, cfg.n_sublayers + 1
    n = 1 + L + 4 * ((L + 1) // 2) + 3 * (L // 2) + 1 + (not cfg.tie_embeddings)
    if cfg.residual in ("attnres", "msar"):
        n += mixers * (4 if cfg.residual == "msar" else 1)
    if cfg.residual == "msar":
        n += (L + 1) * len(cfg.conv_kernels)
    return n


def _hint(cfg: MSARConfig) -> str:
    return (f"(config: residual={cfg.residual}, n_blocks={cfg.n_blocks}, stream_kernels={list(cfg.stream_kernels)}, "
            f"tie_embeddings={str(cfg.tie_embeddings).lower()})")


def validate_table(cfg: MSARConfig, table: dict[str, tuple]) -> None:
    """Names, dtypes and shapes (`table`: name -> (dtype, shape)) against the config, before
    any value is read: a header that lies costs nothing.  Raises CheckpointError."""
    n_want = expected_count(cfg)
    if n_want > 2 * len(table) + 64:
        # Named lazily: a config may claim 10**8 blocks; the first missing names come
        # within len(table) + 3 steps, so the work is bounded by what the file holds.
        first = list(itertools.islice((n for n, _ in iter_expected(cfg) if n not in table), 3))
        raise CheckpointError(f"checkpoint is missing {n_want - len(table):,} or more tensor(s), first {first} {_hint(cfg)}")
    want = expected_shapes(cfg)  # at most 2 len(table) + 64 entries
    missing = [n for n in want if n not in table]
    extra = sorted(n for n in table if n not in want)
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensor(s), first {missing[:3]} {_hint(cfg)}")
    if extra:
        raise CheckpointError(f"checkpoint has {len(extra)} unexpected tensor(s), first {extra[:3]} {_hint(cfg)}")
    for name, shape in want.items():
        dtype, got = table[name]
        if dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"tensor {name!r} has dtype {dtype}, expected float32, float16 or bfloat16")
        if tuple(got) != shape:
            raise CheckpointError(
                f"tensor {name!r} has shape {list(got)} but config.json implies {list(shape)}; "
                "config and weights disagree"
            )


def checked_values(name: str, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t`, its values checked finite, converted to `dtype` (and checked again) if given."""
    if not bool(torch.isfinite(t).all()):
        raise CheckpointError(f"tensor {name!r} holds NaN or Inf values; the checkpoint is corrupt")
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"tensor {name!r} has values beyond the range of {dtype}; export in a wider dtype")
    return t


def validate_tensors(cfg: MSARConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> None:
    """Raise CheckpointError naming the first problem; silent when all is well.

    dtype: also convert each tensor in `tensors` to it, right after its values are
    checked, so only one tensor is ever held in both precisions."""
    validate_table(cfg, {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()})
    for name in expected_shapes(cfg):
        tensors[name] = checked_values(name, tensors[name], dtype)


def member(path: Path, name: str) -> Path:
    """A checkpoint file, which must really be inside the checkpoint: a symlink out of it (to
    /etc/shadow, or a hub cache's blob folder) is refused; copy such files in (`cp -L`).
    Hard links are fine here: the file is only read, never copied or linked anywhere."""
    return contained(path, name, f"{path}: checkpoint file", CheckpointError, allow_hard_links=True)


def read_config(path: Path) -> MSARConfig:
    cfg_file = path / CONFIG_FILE
    if not os.path.lexists(cfg_file):
        raise CheckpointError(f"{path}: no {CONFIG_FILE}; a checkpoint is a directory with {CONFIG_FILE} and {WEIGHTS_FILE}")
    text = read_small_file(member(path, CONFIG_FILE), CONFIG_FILE, CheckpointError)
    try:
        return MSARConfig.from_json(text)
    except ConfigError as e:
        raise ConfigError(f"{cfg_file}: {e}") from None


def read_tensors(path: Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor as stored (for the pickle route and tools; loading validates headers first)."""
    files = WeightFiles.open(path)
    if files is not None:
        return {name: files.read(name) for name in files.entries}
    return read_pickle(path, trust_pickle)


def read_pickle(path: Path, trust_pickle: bool) -> dict[str, torch.Tensor]:
    pickles = [path / n for n in PICKLE_FILES if os.path.lexists(path / n)]
    if not pickles:
        raise CheckpointError(f"{path}: no {WEIGHTS_FILE} (nor {INDEX_FILE} with its shards)")
    member(path, pickles[0].name)
    if not trust_pickle:
        raise CheckpointError(
            f"{pickles[0]} is a pickle file, which can run code when loaded; refusing. "
            "Convert it to model.safetensors, or pass --trust-pickle if you trust its origin"
        )
    try:
        obj = torch.load(pickles[0], map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses any non-tensor payload
        raise CheckpointError(f"{pickles[0]}: refused by torch.load(weights_only=True): {first_line(e)}") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise CheckpointError(f"{pickles[0]}: expected a flat dict of name -> tensor")
    return obj


def model_dtype(dtypes) -> torch.dtype:
    """The checkpoint's dtype when it has one, else float32."""
    dtypes = set(dtypes)
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


def check_weight_files(cfg: MSARConfig, files: WeightFiles) -> None:
    validate_table(cfg, {n: (e.dtype, e.shape) for n, e in files.entries.items()})


def open_checkpoint(path: str | os.PathLike) -> tuple[MSARConfig, WeightFiles]:
    """The config and the validated headers of a safetensors checkpoint, no value read:
    for readers that take one tensor at a time (a weightless export)."""
    path = _checkpoint_dir(path)
    cfg = read_config(path)
    files = WeightFiles.open(path)
    if files is None:
        raise CheckpointError(f"{path}: no {WEIGHTS_FILE} (nor {INDEX_FILE} with its shards)")
    check_weight_files(cfg, files)
    return cfg, files


def _checkpoint_dir(path) -> Path:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a checkpoint is a directory with {CONFIG_FILE} and {WEIGHTS_FILE}, not a file")
    return path


def load_checkpoint(path: str | os.PathLike, *, dtype: torch.dtype | None = None, trust_pickle: bool = False):
    """Load a checkpoint directory into an `MSARLM` in eval mode.

    dtype: the model's dtype; default is the checkpoint's (float32 if mixed)."""
    from .model import MSARLM

    path = _checkpoint_dir(path)
    cfg = read_config(path)
    files = WeightFiles.open(path)
    if files is None:
        tensors = read_pickle(path, trust_pickle)
        dtype = dtype or model_dtype(t.dtype for t in tensors.values())
        validate_tensors(cfg, tensors, dtype)  # converts tensor by tensor
    else:
        check_weight_files(cfg, files)  # every header, before a value is read
        dtype = dtype or model_dtype(e.dtype for e in files.entries.values())
        tensors = {name: checked_values(name, files.read(name), dtype) for name in files.entries}
    with torch.device("meta"):  # no random init: the weights come from the file
        model = MSARLM(cfg)
    # assign=True: the loaded tensors become the parameters (no second copy).
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.eval()


def save_checkpoint(model, path: str | os.PathLike, *, dtype: torch.dtype | None = None,
                    extra_files: dict[str, str] | None = None, max_shard_size: int = SHARD_SIZE) -> Path:
    """Write `model` as a checkpoint directory, atomically (the old directory,
    if any, stays whole until the new one is complete): one `model.safetensors`, or
    shards of at most `max_shard_size` bytes with their index when the weights are larger."""
    path = Path(path)
    if path.is_dir() and any(path.iterdir()) and not (path / CONFIG_FILE).is_file():
        # atomic_dir replaces the whole directory: only ever one that holds a checkpoint
        raise OutputError(f"{path}: exists and is not a checkpoint directory (no {CONFIG_FILE}); "
                          "refusing to replace it")
    state = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in model.state_dict().items()}
    validate_tensors(model.cfg, state)
    save_weights(path, model.cfg, iter(state.items()), {n: t.numel() * t.element_size() for n, t in state.items()},
                 max_shard_size, extra_files)
    return path


def save_weights(path: Path, cfg: MSARConfig, tensors, sizes: dict[str, int], max_shard_size: int = SHARD_SIZE,
                 extra_files: dict[str, str] | None = None) -> None:
    """The checkpoint directory of `cfg` from `tensors` ((name, tensor) in `sizes`' order, made
    on demand: a generator holds one shard at a time), atomically."""
    plan = plan_shards(sizes.items(), max_shard_size)
    with atomic_dir(path) as tmp:
        (tmp / CONFIG_FILE).write_text(cfg.to_json(), encoding="utf-8")
        write_weights(tmp, tensors, plan, {"format": "pt", "model_type": "msar_lm"})
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
