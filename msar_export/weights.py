"""The weight files of a checkpoint: one `model.safetensors`, or the Hugging Face sharded
layout (`model-0000K-of-0000N.safetensors` + `model.safetensors.index.json`).

`WeightFiles.open` reads headers only: where each tensor lives, its dtype and shape.  The
index is untrusted input: every shard it names must be a regular file inside the
checkpoint folder, every tensor must be in exactly one shard (the one the index names),
every `*.safetensors` in the folder must be named by the index, and its `total_size`, if
given, must be the sum of the tensors' bytes.  safetensors' own header check (offsets
contiguous, inside the file, matching dtype x shape) runs when each shard is opened, so
nothing is read from a shard whose header lies.  Tensors are then read one at a time from
the memory-mapped file (`read`), never through pickle.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from .errors import CheckpointError, first_line
from .untrusted import contained, loads_json, read_small_file

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Hugging Face's default `max_shard_size` ("5GB", decimal).
SHARD_SIZE = 5 * 10**9
# An index lists one short line per tensor; 64 MiB is ~10**6 tensors.
MAX_INDEX_BYTES = 64 << 20
SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}
_READ_ERRORS = (OSError, ValueError, RuntimeError)


def shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


@dataclass(frozen=True)
class Entry:
    file: Path  # real path, checked to be inside the checkpoint
    dtype: torch.dtype | str  # a str when safetensors names a dtype torch has no match for here
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * (self.dtype.itemsize if isinstance(self.dtype, torch.dtype) else 1)


class WeightFiles:
    """Name -> Entry for every tensor of a safetensors checkpoint, from the headers alone."""

    def __init__(self, folder: Path, entries: dict[str, Entry], files: list[Path]):
        self.folder, self.entries, self.files = folder, entries, files

    @classmethod
    def open(cls, folder: Path) -> "WeightFiles | None":
        """None when the folder has neither `model.safetensors` nor an index (a pickle checkpoint)."""
        single, index = os.path.lexists(folder / WEIGHTS_FILE), os.path.lexists(folder / INDEX_FILE)
        if single and index:
            raise CheckpointError(f"{folder}: holds both {WEIGHTS_FILE} and {INDEX_FILE}; which weights are meant "
                                  "is ambiguous: remove one")
        if single:
            shards = {WEIGHTS_FILE: None}
        elif index:
            shards, claimed = _read_index(folder)
        else:
            return None
        if index:  # one model.safetensors is the whole of the weights, whatever else the folder holds
            _no_stray_shards(folder, shards)
        entries: dict[str, Entry] = {}
        files = []
        for location, names in shards.items():
            real = _member(folder, location)
            files.append(real)
            for name, entry in _read_header(real, folder / location).items():
                if names is not None and name not in names:
                    owner = _owner(shards, name)
                    where = f"the index puts it in {owner}" if owner else "the index does not list it"
                    raise CheckpointError(f"{folder / location}: holds tensor {name!r}, but {where}; "
                                          "every tensor must be in exactly the one shard the index names")
                entries[name] = entry
            for name in sorted(names or ()):
                if name not in entries or entries[name].file != real:
                    raise CheckpointError(f"{folder / INDEX_FILE}: puts tensor {name!r} in {location}, which does "
                                          "not hold it; the index and its shards disagree")
        if index and claimed is not None and claimed != sum(e.nbytes for e in entries.values()):
            raise CheckpointError(f"{folder / INDEX_FILE}: metadata.total_size is {claimed:,} bytes but its shards "
                                  f"hold {sum(e.nbytes for e in entries.values()):,}; the index does not describe them")
        return cls(folder, entries, files)

    def read(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """One tensor, read from its memory-mapped shard, converted to `dtype` if given.
        A handle per tensor: one shared mapping would keep every page of the file resident
        until the last tensor goes."""
        from safetensors import SafetensorError, safe_open

        entry = self.entries[name]
        try:
            with safe_open(entry.file, "pt") as f:
                t = f.get_tensor(name)
        except (SafetensorError, *_READ_ERRORS) as e:
            raise CheckpointError(f"{entry.file}: tensor {name!r} is unreadable ({first_line(e)}); "
                                  "the file is truncated or corrupt") from None
        return t if dtype is None or t.dtype == dtype else t.to(dtype)

    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())


def _member(folder: Path, location: str) -> Path:
    return contained(folder, location, f"{folder}: checkpoint file", CheckpointError, allow_hard_links=True)


def _owner(shards: dict[str, set[str] | None], name: str) -> str | None:
    return next((loc for loc, names in shards.items() if names and name in names), None)


def _read_index(folder: Path) -> tuple[dict[str, set[str]], int | None]:
    """(shard location -> the tensor names the index puts there, the claimed total_size);
    checked for form here, against the shards by the caller."""
    what = f"{folder / INDEX_FILE}"
    member = _member(folder, INDEX_FILE)
    doc = loads_json(read_small_file(member, INDEX_FILE, CheckpointError, limit=MAX_INDEX_BYTES), what,
                     CheckpointError)
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise CheckpointError(f"{what}: expected a JSON object with a \"weight_map\" object (tensor name -> shard file)")
    meta = doc.get("metadata", {})
    if not isinstance(meta, dict):
        raise CheckpointError(f"{what}: \"metadata\" must be an object")
    if "total_size" in meta and (type(meta["total_size"]) is not int or meta["total_size"] < 0):
        raise CheckpointError(f"{what}: \"metadata.total_size\" must be a non-negative integer, got {meta['total_size']!r}")
    shards: dict[str, set[str]] = {}
    for name, location in doc["weight_map"].items():
        if not isinstance(location, str):
            raise CheckpointError(f"{what}: tensor {name!r} maps to {location!r}, not a shard file name")
        shards.setdefault(location, set()).add(name)
    if not shards:
        raise CheckpointError(f"{what}: \"weight_map\" is empty")
    for location in shards:
        _member(folder, location)  # absolute, '..', escaping links, missing, not a regular file
        if "/" in location or "\\" in location or not location.endswith(".safetensors"):
            raise CheckpointError(f"{what}: shard {location!r} must be a *.safetensors file directly in {folder}")
        if location in (WEIGHTS_FILE, INDEX_FILE):
            raise CheckpointError(f"{what}: shard {location!r} is a reserved name")
    return shards, meta.get("total_size")


def _no_stray_shards(folder: Path, shards: dict) -> None:
    """A shard the index forgot would be silently ignored: refuse it instead."""
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".safetensors"))
    except OSError as e:
        raise CheckpointError(f"{folder}: cannot list the checkpoint folder ({e.strerror})") from None
    stray = [n for n in names if n not in shards]
    if stray:
        raise CheckpointError(f"{folder}: {stray[0]} is not named by {INDEX_FILE}"
                              f"{f' (and {len(stray) - 1} more)' if len(stray) > 1 else ''}; remove it or fix the index")


def _read_header(real: Path, shown: Path) -> dict[str, Entry]:
    from safetensors import SafetensorError, safe_open

    try:
        out = {}
        with safe_open(real, "pt") as f:
            for name in f.keys():
                s = f.get_slice(name)
                code = s.get_dtype()
                out[name] = Entry(real, SAFETENSORS_DTYPES.get(code, code), tuple(int(d) for d in s.get_shape()))
        return out
    except (SafetensorError, *_READ_ERRORS) as e:
        raise CheckpointError(f"{shown}: not a readable safetensors file ({first_line(e)}); "
                              "the file is truncated or corrupt") from None


def plan_shards(sizes: Iterable[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """Names grouped in order into shards of at most `max_shard_size` bytes (a bigger tensor
    gets a shard of its own), as Hugging Face's `save_pretrained` splits them."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, n in sizes:
        if shards[-1] and used + n > max_shard_size:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += n
    return shards


def write_weights(folder: Path, tensors: Iterator[tuple[str, torch.Tensor]], plan: list[list[str]],
                  metadata: dict[str, str]) -> list[str]:
    """Write `tensors` (in plan order) into `folder` as one `model.safetensors` or, when the
    plan has several shards, the sharded layout with its index.  Holds one shard's tensors
    at a time.  Returns the files written."""
    import json

    from safetensors.torch import save_file

    n = len(plan)
    names = [WEIGHTS_FILE] if n == 1 else [shard_name(k, n) for k in range(1, n + 1)]
    weight_map, total = {}, 0
    for file, wanted in zip(names, plan):
        shard = {}
        for expected in wanted:
            name, t = next(tensors)
            if name != expected:
                raise ValueError(f"tensor {name!r} given where the plan has {expected!r}")
            shard[name] = t
            weight_map[name] = file
            total += t.numel() * t.element_size()
        save_file(shard, str(folder / file), metadata=metadata)
        del shard
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        names.append(INDEX_FILE)
    return names


__all__ = ["WEIGHTS_FILE", "INDEX_FILE", "SHARD_SIZE", "Entry", "WeightFiles", "plan_shards", "write_weights", "shard_name"]
