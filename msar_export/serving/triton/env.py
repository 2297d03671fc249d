"""Where the Triton server and its client library live.

`nvidia-pytriton` ships the `tritonserver` binary, the Python backend and one
backend stub per Python version; it pins numpy<2, and `tritonclient[grpc]`
pins protobuf<7.  The main .venv has numpy 2 and protobuf 7, so they live in a
second venv: $MSAR_TRITON_VENV, else `.venv-triton` in the working directory
(scripts/setup_triton_env.sh makes it at the checkout's root, where the tests and
the demo run).  Processes started there import *this* msar_export through a
folder holding only a link to it (`package_path`), never this venv's site-packages.

Nothing here imports pytriton or tritonclient: the install is found by asking
the interpreter that has it for a few paths (stdlib only, no torch import).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ...errors import BackendUnavailable

ENV_VAR = "MSAR_TRITON_VENV"
SETUP_HINT = (f"run scripts/setup_triton_env.sh (creates .venv-triton), or set {ENV_VAR} to a venv with "
              "nvidia-pytriton, tritonclient[grpc] and msar-export")

_PROBE = r"""
import importlib.util, json, sys, sysconfig
spec = importlib.util.find_spec("pytriton")
print(json.dumps({
    "version": "%d.%d" % sys.version_info[:2],
    "prefix": sys.prefix,
    "libdir": sysconfig.get_config_var("LIBDIR") or "",
    "soname": sysconfig.get_config_var("INSTSONAME") or "",
    "pytriton": list(spec.submodule_search_locations)[0] if spec else None,
    "tritonclient": importlib.util.find_spec("tritonclient") is not None,
}))
"""


def triton_venv() -> Path:
    """The venv that holds the server: $MSAR_TRITON_VENV, else ./.venv-triton."""
    return Path(os.environ.get(ENV_VAR) or Path.cwd() / ".venv-triton").absolute()


def package_path() -> str:
    """A PYTHONPATH entry that makes exactly this msar_export importable in the other
    venv (an editable checkout or an installed wheel alike; the folder above the package
    may be this venv's site-packages, whose numpy 2 must not leak into .venv-triton)."""
    import hashlib

    import msar_export

    pkg = Path(msar_export.__file__).resolve().parent
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "msar-export"
    folder = cache / f"path-{hashlib.sha256(str(pkg).encode()).hexdigest()[:12]}"
    link = folder / "msar_export"
    if not (link.is_symlink() and link.resolve() == pkg):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".link-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(pkg, target_is_directory=True)
        os.replace(tmp, link)
    return str(folder)


def with_package_path(env: dict) -> dict:
    env = dict(env)
    env.pop("PYTHONHOME", None)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (package_path(), env.get("PYTHONPATH")) if x)
    return env


def have_tritonclient() -> bool:
    return importlib.util.find_spec("tritonclient") is not None and importlib.util.find_spec("google.protobuf") is not None


def triton_python(required: bool = True) -> str | None:
    """An interpreter that can import tritonclient: this one if it can, else .venv-triton's."""
    if have_tritonclient():
        return sys.executable
    py = triton_venv() / "bin" / "python"
    if py.is_file():
        return str(py)
    if required:
        raise BackendUnavailable(f"tritonclient is not installed in this environment and {triton_venv()} does not "
                                 f"exist; {SETUP_HINT}")
    return None


@dataclass(frozen=True)
class TritonInstall:
    python: Path          # interpreter of the venv the Python backend stub runs in
    version: str          # its "X.Y"
    pytriton: Path        # the pytriton package directory
    libdir: str           # where its libpython lives (the stub links libpythonX.Y.so)
    soname: str

    @property
    def dist(self) -> Path:
        return self.pytriton / "tritonserver"

    @property
    def binary(self) -> Path:
        return self.dist / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        return self.dist / "python_backend_stubs" / self.version / "triton_python_backend_stub"

    @property
    def libs(self) -> Path:
        """Bundled shared libraries of the wheel (auditwheel's <pkg>.libs directory)."""
        return self.pytriton.parent / "nvidia_pytriton.libs"

    def backend_dir(self) -> Path:
        """A backends/ directory whose python/ holds the backend library and the stub for
        this Python version (Triton looks for the stub next to libtriton_python.so)."""
        root = self.pytriton.parent.parent.parent.parent / "share" / "msar-triton" / f"backends-py{self.version}"
        py = root / "python"
        src = self.dist / "backends" / "python"
        wanted = [(src / "libtriton_python.so", py / "libtriton_python.so"),
                  (src / "triton_python_backend_utils.py", py / "triton_python_backend_utils.py"),
                  (self.stub, py / "triton_python_backend_stub")]
        for s, d in wanted:
            if not s.is_file():
                raise BackendUnavailable(f"{s}: missing from the nvidia-pytriton install; {SETUP_HINT}")
            if not d.is_file() or d.stat().st_size != s.stat().st_size:
                py.mkdir(parents=True, exist_ok=True)
                tmp = d.with_name(f"{d.name}.{os.getpid()}.tmp")  # two servers starting at once each copy
                shutil.copy2(s, tmp)
                os.replace(tmp, d)
        return root

    def server_env(self, base: dict | None = None) -> dict:
        """Environment for tritonserver: the stub must load the libpython of *this* venv's
        interpreter (not another 3.x build the system may have) and find the venv first on
        PATH, which is how it picks the venv's site-packages (numpy, onnxruntime)."""
        env = dict(os.environ if base is None else base)
        libpaths = [str(self.libs)]
        if self.libdir and self.soname and (Path(self.libdir) / self.soname).is_file():
            libpaths.insert(0, self.libdir)
        if env.get("LD_LIBRARY_PATH"):
            libpaths.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = ":".join(libpaths)
        env["PATH"] = f"{self.python.parent}:{env.get('PATH', '')}"
        env.pop("PYTHONHOME", None)
        env.pop("PYTHONPATH", None)
        env.setdefault("OMP_NUM_THREADS", "1")
        return env


def find_triton(python: str | os.PathLike | None = None) -> TritonInstall:
    """Locate tritonserver through `python` (default: this interpreter if it has pytriton,
    else .venv-triton's).  Raises BackendUnavailable with the setup command otherwise."""
    if python is None:
        python = sys.executable if importlib.util.find_spec("pytriton") else triton_venv() / "bin" / "python"
    python = Path(python)
    if not python.is_file():
        raise BackendUnavailable(f"no Triton server environment at {python.parent.parent}; {SETUP_HINT}")
    try:
        out = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True)
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as e:
        raise BackendUnavailable(f"{python}: cannot query the Triton environment ({type(e).__name__}); {SETUP_HINT}") from None
    if not info["pytriton"]:
        raise BackendUnavailable(f"{python}: nvidia-pytriton is not installed there; {SETUP_HINT}")
    # The venv's own bin/python (not the base interpreter it resolves to): the stub finds
    # the venv through PATH.
    inst = TritonInstall(python=python, version=info["version"], pytriton=Path(info["pytriton"]),
                         libdir=info["libdir"], soname=info["soname"])
    if not inst.binary.is_file():
        raise BackendUnavailable(f"{inst.binary}: no tritonserver binary in the nvidia-pytriton install; {SETUP_HINT}")
    if not inst.stub.is_file():
        raise BackendUnavailable(f"nvidia-pytriton has no Python backend stub for Python {inst.version}; "
                                 "recreate .venv-triton with Python 3.8-3.13 (PYTHON=python3.11 scripts/setup_triton_env.sh)")
    return inst


def run_in_triton_env(module: str, argv: list[str]) -> int:
    """Run `python -m MODULE ARGV` in the Triton venv (this process lacks tritonclient)."""
    return subprocess.call([triton_python(), "-m", module, *argv], env=with_package_path(os.environ))
