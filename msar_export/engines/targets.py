"""Compute capabilities an engine is built for (`--compute-capability`, TensorRT-RTX):
parsed once into trt.ComputeCapability names ("SM86"), checked against the installed
library before any slow step, then set on the builder config."""

from __future__ import annotations

import re

from ..errors import InputError
from .backends import Backend

_NAME = re.compile(r"^SM\d{2,}$")


def parse_compute_capabilities(specs) -> list[str]:
    """["8.6", "12.0"] or "8.6,12.0" or "86" -> ["SM86", "SM120"] (names of trt.ComputeCapability,
    which are accepted as they are, so a parsed list parses to itself)."""
    if not specs:
        return []
    if isinstance(specs, str):
        specs = [specs]
    out = []
    for spec in specs:
        for item in filter(None, (s.strip() for s in str(spec).split(","))):
            if _NAME.match(item):
                major, minor = item[2:-1], item[-1]
            else:
                major, dot, minor = item.partition(".")
                if not dot and item.isdigit() and len(item) >= 2:
                    major, minor = item[:-1], item[-1]
            if not (major.isdigit() and minor.isdigit()):
                raise InputError(f"--compute-capability: bad value {item!r}; use MAJOR.MINOR, e.g. 8.6 or 12.0")
            name = f"SM{int(major)}{int(minor)}"
            if name not in out:
                out.append(name)
    return out


def check_compute_capabilities(backend: Backend, names: list[str]) -> None:
    """InputError unless every name is a target of this install of the backend (before any slow step)."""
    if not names:
        return
    cc = getattr(backend.load(), "ComputeCapability", None)
    if cc is None:
        raise InputError(f"--compute-capability: this {backend.label} has no compute-capability targets")
    known = [n for n in cc.__members__ if n.startswith("SM")]
    bad = [n for n in names if n not in known]
    if bad:
        raise InputError(f"--compute-capability: {', '.join(cc_text(n) for n in bad)} is not a target of this "
                         f"{backend.label}; it supports {', '.join(cc_text(n) for n in known)}")


def apply_compute_capabilities(trt, config, names: list[str]) -> None:
    """Set checked targets (check_compute_capabilities) on a builder config."""
    if not names:
        return
    cc = trt.ComputeCapability
    config.num_compute_capabilities = len(names)
    for i, n in enumerate(names):
        config.set_compute_capability(getattr(cc, n), i)


def cc_text(name: str) -> str:
    """"SM86" -> "8.6"."""
    digits = name[2:]
    return f"{digits[:-1]}.{digits[-1]}"
