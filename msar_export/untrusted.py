"""Reading files we did not write: bounded sizes, regular files only, paths kept
inside the folder they belong to, JSON without surprises.

Every path taken from a file (an ONNX external-data `location`, a checkpoint
member) goes through `contained`; every small text file (config.json, metadata)
through `read_small_file` and `loads_json`.  A failure is the caller's
`MsarError` subclass with one line that names the file.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from .errors import MsarError

# config.json and msar.* metadata are a few hundred bytes; a megabyte is generous.
MAX_CONFIG_BYTES = 1 << 20


def contained(base: str | os.PathLike, location: str, what: str, error: type[MsarError] = MsarError,
              allow_hard_links: bool = False) -> Path:
    """The real path of `base / location`, for a relative `location` read from an untrusted file.

    Refused: absolute or drive paths, NUL bytes, '..' components, anything whose real
    path (symlinks resolved) leaves `base`, and targets that are missing, not regular
    files, or have other hard links (onnx refuses those too: a hard link can reach any
    file).  `location` itself is then a safe relative path to recreate elsewhere."""
    if not isinstance(location, str) or not location or "\x00" in location:
        raise error(f"{what} {location!r} is not a relative file name")
    if (PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute()
            or PureWindowsPath(location).drive):
        raise error(f"{what} {location!r} is an absolute path; it must be relative to {base}")
    if ".." in PurePosixPath(location.replace("\\", "/")).parts:
        raise error(f"{what} {location!r} climbs out with '..'; it must name a file inside {base}")
    base_real = Path(base).resolve()
    target = Path(base) / location
    real = target.resolve()
    if real != base_real and base_real not in real.parents:
        raise error(f"{what} {location!r} leads outside {base} (to {real}); refusing to follow it")
    try:
        st = os.stat(real)
    except OSError:
        raise error(f"{what} {location!r} is missing; keep it next to the model") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {location!r} is not a regular file")
    if st.st_nlink > 1 and not allow_hard_links:
        raise error(f"{what} {location!r} has {st.st_nlink} hard links (onnx refuses such files as a potential "
                    "hardlink attack); replace it with a plain copy")
    return real


def read_small_file(path: str | os.PathLike, what: str, error: type[MsarError] = MsarError,
                    limit: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of a small regular file; devices, FIFOs and oversized files are refused
    before a byte is read (O_NONBLOCK: a FIFO swapped in after the check cannot block us)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: {what} is not a regular file")
        if st.st_size > limit:
            raise error(f"{path}: {what} is {st.st_size:,} bytes, over the {limit:,}-byte limit; "
                        "it should be a small JSON file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise error(f"{path}: {what} is over the {limit:,}-byte limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: {what} is not UTF-8 text (byte {e.start})") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k!r}")
        d[k] = v
    return d


def loads_json(text: str, what: str, error: type[MsarError] = MsarError) -> Any:
    """json.loads that refuses duplicate keys and turns every parser failure (deep nesting,
    a 5,000-digit integer, NaN) into one line."""
    def no_constant(name: str):
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise error(f"{what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise error(f"{what} is nested too deeply to be a configuration") from None
    except ValueError as e:  # duplicate key, NaN/Infinity, an integer over Python's digit limit
        raise error(f"{what} is not valid JSON ({str(e).splitlines()[0][:120]})") from None


__all__ = ["MAX_CONFIG_BYTES", "contained", "read_small_file", "loads_json"]
