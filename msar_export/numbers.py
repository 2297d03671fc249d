"""Bounded numbers: one converter per kind, so no option or field can forget a bound.

Every number a user types (CLI options, `--profile` ranges, URL ports) or a file carries
(`msar.config` read leniently by `build`) goes through `integer` or `real` with the bounds
of its kind.  Values that overflow on conversion (1e400, 2**64 seeds, inf, nan), negatives
and zero where they mean nothing, and thread counts beyond the machine end as one
`InputError` line instead of a traceback or a hang far downstream.

`Kind` objects are argparse `type=` callables (their failures become argparse's one-line
usage error, exit 2); `kind.check(value, what)` applies the same bound to a value that is
already a number.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass

from .errors import InputError

INT32_MAX = 2**31 - 1


def machine_threads() -> int:
    """CPUs this process may run on (its affinity, not the host's count): more threads than
    that only contend, and a million of them reserved gigabytes of stacks (issue 22)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def integer(value, lo: int, hi: int, what: str) -> int:
    """`value` (text or a number) as an int in [lo, hi]; InputError otherwise."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, float):  # JSON's 1e30 or 1e400 (= inf): an integer only if whole and finite
        if not math.isfinite(value) or value != int(value):
            raise InputError(f"{what} must be an integer in [{lo:,}, {hi:,}], got {value!r}")
        value = int(value)
    if isinstance(value, str):
        text = value.strip()
        # int() would take 4,300 digits before refusing and "1_0" as 10: plain decimal only.
        if not text.lstrip("+-").isdigit() or len(text) > 40:
            raise InputError(f"{what} must be an integer in [{lo:,}, {hi:,}], got {value!r}")
        value = int(text)
    if not isinstance(value, int):
        raise InputError(f"{what} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise InputError(f"{what} must be an integer in [{lo:,}, {hi:,}], got {value:,}")
    return value


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def real(value, lo: float, hi: float, what: str, lo_open: bool = False) -> float:
    """`value` as a finite float in [lo, hi] (or (lo, hi] with lo_open); InputError otherwise."""
    try:
        if isinstance(value, str) and "_" in value:  # float() takes "1_0" as 10
            raise ValueError(value)
        x = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{what} must be a number, got {value!r}") from None
    low = "(" if lo_open else "["
    if isinstance(value, bool) or not math.isfinite(x) or x < lo or (lo_open and x == lo) or x > hi:
        raise InputError(f"{what} must be a finite number in {low}{_num(lo)}, {_num(hi)}], got {value!r}")
    return x


@dataclass(frozen=True)
class Kind:
    """One kind of number: its bounds and its type.  Calling it converts CLI text."""

    name: str
    lo: float
    hi: float | None  # None: machine_threads() at the time of parsing
    is_int: bool = True
    lo_open: bool = False

    @property
    def upper(self):
        return machine_threads() if self.hi is None else self.hi

    def check(self, value, what: str):
        if self.is_int:
            return integer(value, int(self.lo), int(self.upper), what)
        return real(value, self.lo, self.upper, what, self.lo_open)

    def __call__(self, text: str):
        try:
            return self.check(text, self.name)
        except InputError as e:  # argparse prefixes "argument --opt: " and exits 2 with one line
            raise argparse.ArgumentTypeError(str(e).removeprefix(self.name + " ")) from None


COUNT = Kind("a count", 1, INT32_MAX)                 # steps, clients, requests, instances, repeats
SIZE = Kind("a size", 0, INT32_MAX)                   # may be zero: max-new-tokens, hostile-every
SEED = Kind("a seed", 0, 2**32 - 1)                   # numpy's RandomState takes [0, 2**32)
THREADS = Kind("a thread count", 1, None)             # 1 .. this machine's CPUs
PORT = Kind("a port", 1, 65535)
CLIENTS = Kind("a client count", 1, 4096)            # each is a thread and a connection
INSTANCES = Kind("an instance count", 1, 256)        # each is a process
BATCH = Kind("a batch size", 1, 1 << 16)
OPSET = Kind("an opset", 1, 1000)
MICROSECONDS = Kind("a delay in microseconds", 0, 60_000_000)
SECONDS = Kind("seconds", 0, 7 * 24 * 3600, is_int=False, lo_open=True)
GIB = Kind("a size in GiB", 0, 1 << 20, is_int=False, lo_open=True)
MIB = Kind("a size in MiB", 0, 1 << 30, is_int=False, lo_open=True)
TOKEN_ID = Kind("a token id", 0, INT32_MAX)  # checked against the vocabulary where it is used
POSITIVE = Kind("a positive number", 0, 1e6, is_int=False, lo_open=True)  # --tol, --rtol, --temperature
MPARAMS = Kind("millions of parameters", 0, 1e5, is_int=False)

__all__ = ["BATCH", "CLIENTS", "COUNT", "INSTANCES", "GIB", "INT32_MAX", "Kind", "MICROSECONDS", "MPARAMS", "OPSET", "PORT", "POSITIVE", "SECONDS",
           "SEED", "SIZE", "THREADS", "integer", "machine_threads", "real"]
