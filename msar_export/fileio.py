"""Atomic writes: a killed run leaves the old file or the new one, never half."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


def _plain_mode(bits: int) -> int:
    """The mode open()/mkdir() would give under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return bits & ~umask


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `target`; rename it onto `target` on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _plain_mode(0o666))  # mkstemp makes it 0600
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp directory beside `target`; swap it in on success.

    An existing `target` is moved aside first and removed only after the new
    directory is in place, so an interruption never leaves a mixed directory.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    old = None
    try:
        yield tmp
        os.chmod(tmp, _plain_mode(0o777))  # mkdtemp makes it 0700
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            os.rmdir(old)
            os.replace(target, old)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "atomic_dir", "file_sha256"]
