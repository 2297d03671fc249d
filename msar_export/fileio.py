"""Atomic writes: a killed run leaves the old file or the new one, never half.

The rule for every command (`check_outputs`, before any work starts): its whole set of
outputs is checked at once - each absent or a regular file (a directory target of
`atomic_dir` must be a directory; a device, FIFO, socket or symlinked directory is never
replaced), no two the same, none the same file as any input (`export CKPT -o
CKPT/model.safetensors` once destroyed the checkpoint), its folder writable, its name
within the file system's limit.  Outputs are then written to temporaries and renamed
into place together (`atomic_paths`).  OS failures (unwritable, disk full, /proc)
become one-line `OutputError`s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import OutputError


def _plain_mode(bits: int) -> int:
    """The mode open()/mkdir() would give under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return bits & ~umask


def _check_parent(target: Path) -> None:
    """The nearest existing ancestor must be a directory (else mkdir fails in a confusing way)."""
    for parent in target.absolute().parents:
        if os.path.lexists(parent):
            if not parent.is_dir():
                raise OutputError(f"{target}: {parent} is not a directory")
            return


def _temp_prefix(name: str) -> str:
    """A temp name's prefix: short enough that a legal 250-byte target still gets a legal
    temp name (".NAME.XXXXXXXX.tmp" is 14 bytes longer than NAME)."""
    return f".{name[:160]}."


def _name_max(folder: Path) -> int:
    for d in (folder, *folder.parents):
        if d.is_dir():
            try:
                return os.pathconf(d, "PC_NAME_MAX")
            except (OSError, ValueError):
                break
    return 255


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)  # samefile: hard links too
    except OSError:
        return False


def _input_files(inputs) -> list[Path]:
    """The inputs, a directory standing for itself and the files directly in it (a checkpoint)."""
    out = []
    for p in inputs:
        if p is None:
            continue
        p = Path(p)
        out.append(p)
        if p.is_dir():
            with contextlib.suppress(OSError):
                out.extend(q for q in p.iterdir() if q.is_file())
    return out


def check_outputs(outputs, inputs=(), directories=()) -> list[Path]:
    """Check a command's whole output set before any work (see the module docstring).

    outputs: file targets (None entries skipped); directories: directory targets;
    inputs: every file or directory the command reads.  Returns the file targets as Paths."""
    files = [Path(o) for o in outputs if o is not None]
    dirs = [Path(d) for d in directories if d is not None]
    ins = _input_files(inputs)
    seen: list[Path] = []
    for target in files + dirs:
        check_output_dir(target) if target in dirs else check_output_file(target)
        if len(os.fsencode(target.name)) > _name_max(target.parent):
            raise OutputError(f"{target}: the name is {len(os.fsencode(target.name))} bytes, over this file "
                              f"system's {_name_max(target.parent)}-byte limit")
        for other in seen:
            if target.absolute() == other.absolute() or _same_file(target, other):
                raise OutputError(f"{target}: given for two outputs of this command ({other}); give each its own path")
        for src in ins:
            if _same_file(target, src):
                raise OutputError(f"{target}: is {src}, an input of this command; writing it would destroy the "
                                  "input: choose another path")
        parent = next((d for d in target.absolute().parents if d.exists()), None)
        if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"{target}: cannot write in {parent} (permission denied)")
        seen.append(target)
    return files


def replace_together(pairs) -> None:
    """Rename each finished (temp, target) into place; the targets are checked again first,
    and should a rename fail, the targets already replaced get their old files back."""
    pairs = [(Path(t), Path(g)) for t, g in pairs]
    for _, target in pairs:
        check_output_file(target)  # nothing swapped in under us while we worked
    done, backups = [], []
    try:
        for tmp, target in pairs:
            backup = None
            if target.exists():
                backup = target.with_name(f"{_temp_prefix(target.name)}{os.getpid()}.old")
                os.link(target, backup)  # the old file stays reachable until every rename is done
            backups.append(backup)
            os.chmod(tmp, _plain_mode(0o666))  # mkstemp makes it 0600
            os.replace(tmp, target)
            done.append(target)
    except OSError:
        for target, backup in zip(done, backups):
            if backup is not None:
                os.replace(backup, target)
            else:
                target.unlink(missing_ok=True)
        raise
    finally:
        for backup in backups:
            if backup is not None:
                backup.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_paths(targets, inputs=()) -> Iterator[list[Path]]:
    """Temp paths beside each target, renamed into place together on success (one output set)."""
    targets = check_outputs(targets, inputs)
    first = targets[0] if targets else Path(".")
    with os_errors_as_output_errors(first):
        tmps = []
        try:
            for target in targets:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target.name), suffix=".tmp", dir=target.parent)
                os.close(fd)
                tmps.append(Path(tmp))
            yield tmps
            replace_together(zip(tmps, targets))
        finally:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)


def check_output_file(target: str | os.PathLike) -> Path:
    """Refuse, before any work, an output file path that is not absent or a regular file."""
    target = Path(target)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"{target}: cannot write here ({e.strerror})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{target}: is a directory; give a file path")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{target}: exists and is not a regular file (a device, FIFO or socket); "
                              "refusing to replace it")
    _check_parent(target)
    return target


def check_input_file(path: str | os.PathLike, what: str, error=None) -> Path:
    """A file the user named as input: say what it is when it is not a readable regular file
    (a directory or /dev/null used to be reported as "does not exist")."""
    from .errors import InputError

    error = error or InputError
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what} {path}: no such file") from None
    except OSError as e:
        raise error(f"{what} {path}: cannot read it ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {path}: is a directory; give the file itself")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {path}: is not a regular file (a device, FIFO or socket)")
    if st.st_size == 0:
        raise error(f"{what} {path}: is empty")
    if not os.access(path, os.R_OK):
        raise error(f"{what} {path}: cannot read it (permission denied)")
    return path


@contextlib.contextmanager
def os_errors_as_output_errors(target: Path) -> Iterator[None]:
    """Unwritable, disk full, read-only file system: the user's problem, one line."""
    try:
        yield
    except OSError as e:
        raise OutputError(f"{target}: cannot write ({e.strerror or type(e).__name__}"
                          f"{': ' + e.filename if e.filename and str(e.filename) != str(target) else ''})") from None


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, inputs=()) -> Iterator[Path]:
    """Yield a temp path beside `target`; rename it onto `target` on success."""
    with atomic_paths([target], inputs) as (tmp,):
        yield tmp


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
    target = check_output_dir(target)
    with os_errors_as_output_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(target.name), suffix=".tmp", dir=target.parent))
        old = None
        try:
            yield tmp
            os.chmod(tmp, _plain_mode(0o777))  # mkdtemp makes it 0700
            check_output_dir(target)
            if target.exists():
                old = Path(tempfile.mkdtemp(prefix=_temp_prefix(target.name), suffix=".old", dir=target.parent))
                os.rmdir(old)
                os.replace(target, old)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)


def check_output_dir(target: str | os.PathLike) -> Path:
    """Refuse an output directory path that exists as anything but a directory."""
    target = Path(target)
    if target.is_symlink():
        raise OutputError(f"{target}: is a symbolic link; give the real directory")
    if os.path.lexists(target) and not target.is_dir():
        raise OutputError(f"{target}: exists and is not a directory; refusing to replace it")
    _check_parent(target)
    return target


@contextlib.contextmanager
def scratch_dir_beside(target: Path) -> Iterator[Path]:
    """A temp directory next to `target` (same file system, so os.replace is atomic), always removed."""
    with os_errors_as_output_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(target.name), suffix=".tmp", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


__all__ = ["check_input_file", "check_outputs", "atomic_paths", "replace_together", "atomic_path", "atomic_write_bytes", "atomic_write_text", "atomic_dir", "file_sha256", "check_output_file",
           "check_output_dir", "scratch_dir_beside", "os_errors_as_output_errors"]
