"""Optimisation profiles: ranges for the named dynamic dims (batch, seq, past)
and the per-input min/opt/max shapes they give for an exported graph.

The exported graphs name their dynamic dims `batch`, `seq`, `past` and the
mask length `past + seq` (MSAR_SPEC section 3); any dim expression built from
those names with + - * // and integers is evaluated here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..config import LIMITS
from ..errors import InputError, OnnxModelError
from ..numbers import integer

DIM_NAMES = ("batch", "seq", "past")
MAX_DIM = LIMITS["max_seq_len"]  # no named dim of an msar graph can need more


@dataclass(frozen=True)
class DimRange:
    min: int
    opt: int
    max: int

    def __post_init__(self):
        if not 0 <= self.min <= self.opt <= self.max:
            raise InputError(f"a shape range needs 0 <= min <= opt <= max, got {self.min}/{self.opt}/{self.max}")

    def as_list(self) -> list[int]:
        return [self.min, self.opt, self.max]


def default_ranges(graph: str, max_seq_len: int) -> dict[str, DimRange]:
    """Defaults: batch 1/1/8; prefill seq 1/min(128,L)/L; decode seq 1/1/L and past 0/L/2/L."""
    L = max(1, int(max_seq_len))
    ranges = {"batch": DimRange(1, 1, 8)}
    if graph == "decode":
        ranges["seq"] = DimRange(1, 1, L)
        ranges["past"] = DimRange(0, L // 2, L)
    else:
        ranges["seq"] = DimRange(1, min(128, L), L)
        ranges["past"] = DimRange(0, 0, 0)
    return ranges


def parse_profile(specs: str | list[str] | None) -> dict[str, DimRange]:
    """`["batch=1/4/8,seq=1/128/512", "past=0/0/512"]` -> {name: DimRange}."""
    if specs is None:
        return {}
    if isinstance(specs, str):
        specs = [specs]
    out: dict[str, DimRange] = {}
    for spec in specs:
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, sep, rng = item.partition("=")
            name = name.strip()
            if not sep or name not in DIM_NAMES:
                raise InputError(f"--profile: bad item {item!r}; use DIM=MIN/OPT/MAX with DIM in {', '.join(DIM_NAMES)}, "
                                 f"e.g. batch=1/4/8,seq=1/128/512")
            parts = rng.split("/")
            if len(parts) != 3:
                raise InputError(f"--profile: {item!r} needs three integers MIN/OPT/MAX, e.g. {name}=1/4/8")
            # batch and seq of 0 build an engine that takes no input; past may be empty.
            # Bounded so products of dims stay within TensorRT's int64 volumes (1e12 overflowed).
            lo = 0 if name == "past" else 1
            values = [integer(p, lo, MAX_DIM, f"--profile {name}") for p in parts]
            out[name] = DimRange(*values)
    return out


_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.FloorDiv: lambda a, b: a // b}


def eval_dim(expr: str, values: dict[str, int]) -> int:
    """Value of a symbolic ONNX dim ("batch", "past + seq") for given dim values."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise OnnxModelError(f"cannot read the dynamic dimension {expr!r}; known names: {', '.join(DIM_NAMES)}") from None

    def ev(node) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        raise OnnxModelError(f"the ONNX input dimension {expr!r} uses something other than "
                             f"{', '.join(DIM_NAMES)}, integers and + - * //; cannot build a profile for it")

    return ev(tree)


def input_profiles(inputs: list[tuple[str, list]], ranges: dict[str, DimRange]) -> dict[str, dict[str, list[int]]]:
    """inputs: (name, dims) with each dim an int or a symbolic name -> {name: {min, opt, max}}."""
    profiles = {}
    for name, dims in inputs:
        shape = {}
        for which in ("min", "opt", "max"):
            values = {k: getattr(r, which) for k, r in ranges.items()}
            shape[which] = [d if isinstance(d, int) else eval_dim(d, values) for d in dims]
        for a, b in zip(shape["min"], shape["max"]):
            if a > b or a < 0:
                raise InputError(f"input {name!r}: the shape ranges give min {shape['min']} / max {shape['max']}; "
                                 "check --profile")
        profiles[name] = shape
    return profiles
