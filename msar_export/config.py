"""`config.json` of an `msar_lm` checkpoint (MSAR_SPEC.md section 2)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

MODEL_TYPE = "msar_lm"
FORMAT_VERSION = 1
RESIDUAL_KINDS = ("standard", "attnres", "msar")

# Far above any model one would ship (48 blocks, d 8192, 256k vocabulary), far below
# what would make a table built from a hostile config cost memory or minutes.
LIMITS = {"vocab_size": 1 << 22, "d_model": 1 << 16, "n_blocks": 1 << 12, "n_heads": 1 << 12,
          "n_kv_heads": 1 << 12, "mlp_hidden": 1 << 18, "max_seq_len": 1 << 24}
MAX_STREAMS, MAX_KERNEL = 64, 1 << 12


@dataclass(frozen=True)
class MSARConfig:
    vocab_size: int = 256
    d_model: int = 128
    n_blocks: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    mlp_hidden: int = 352
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    residual: str = "msar"
    stream_kernels: tuple[int, ...] = (1, 4, 8, 12)
    mixer_eps: float = 1e-6
    tie_embeddings: bool = True
    model_type: str = field(default=MODEL_TYPE)
    format_version: int = field(default=FORMAT_VERSION)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stream_kernels", tuple(self.stream_kernels))
        self.validate()

    # -- derived sizes -------------------------------------------------------
    @property
    def n_sublayers(self) -> int:
        return 2 * self.n_blocks

    @property
    def n_streams(self) -> int:
        """Streams the mixers retrieve over: 1 for attnres, len(kernels) for msar."""
        return {"standard": 0, "attnres": 1, "msar": len(self.stream_kernels)}[self.residual]

    @property
    def conv_kernels(self) -> tuple[int, ...]:
        """Kernel sizes of the convolution streams r = 1..m-1 (msar only)."""
        return self.stream_kernels[1:] if self.residual == "msar" else ()

    @property
    def kmax(self) -> int:
        return max(self.stream_kernels) if self.residual == "msar" else 1

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    # -- validation ------------------------------------------------------------
    def validate(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"config.json: {msg}")

        if self.model_type != MODEL_TYPE:
            raise ConfigError(f"config.json: model_type is {self.model_type!r}, expected {MODEL_TYPE!r}")
        self.check_version(self.format_version)
        for name, limit in LIMITS.items():
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v > 0, f"{name} must be a positive integer, got {v!r}")
            need(v <= limit, f"{name}={v} is over this msar-export's limit of {limit:,}")
        for name in ("rope_theta", "norm_eps", "mixer_eps"):
            v = getattr(self, name)
            need(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
                f"{name} must be a positive finite number, got {v!r}",
            )
        need(isinstance(self.tie_embeddings, bool), f"tie_embeddings must be true or false, got {self.tie_embeddings!r}")
        need(self.residual in RESIDUAL_KINDS, f"residual must be one of {list(RESIDUAL_KINDS)}, got {self.residual!r}")
        k = self.stream_kernels
        need(
            len(k) >= 1 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in k),
            f"stream_kernels must be a non-empty list of positive integers, got {list(k)!r}",
        )
        need(len(k) <= MAX_STREAMS and max(k) <= MAX_KERNEL,
             f"stream_kernels: at most {MAX_STREAMS} streams of kernel size at most {MAX_KERNEL}, got "
             f"{len(k)} streams, largest {max(k)}")
        need(k[0] == 1, f"stream_kernels must start with 1 (stream 0 is the identity), got {list(k)!r}")
        need(self.d_model % self.n_heads == 0, f"n_heads={self.n_heads} does not divide d_model={self.d_model}")
        need(self.n_heads % self.n_kv_heads == 0, f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
        need(self.head_dim % 2 == 0, f"head_dim={self.head_dim} (d_model/n_heads) must be even for rotary embeddings")
        # Each value above can be legal alone and still overflow what is derived from them:
        # rope_theta 5e-324 makes inv_freq = theta^(-2j/head_dim) infinite, every logit NaN.
        try:
            fastest = self.rope_theta ** (-(self.head_dim - 2) / self.head_dim)
            largest_angle = fastest * (self.max_seq_len - 1)
        except OverflowError:  # Python floats raise where numpy would give inf
            fastest = largest_angle = math.inf
        need(math.isfinite(largest_angle) and fastest > 0,
             f"rope_theta={self.rope_theta!r} gives rotary frequencies that overflow (theta^(-2j/head_dim) with "
             f"head_dim={self.head_dim} must stay finite over {self.max_seq_len:,} positions)")

    # -- (de)serialisation -----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stream_kernels"] = list(self.stream_kernels)
        order = ["model_type", "format_version"] + [f.name for f in dataclasses.fields(self)][:-2]
        return {name: d[name] for name in order}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def replace(self, **changes: Any) -> "MSARConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: Any) -> "MSARConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"config.json must hold a JSON object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(names - d.keys())
        extra = sorted(d.keys() - names)
        if extra:
            raise ConfigError(f"config.json: unknown keys {extra}; is this an msar_lm checkpoint?")
        if missing:
            raise ConfigError(f"config.json: missing keys {missing}")
        # Checked first so a newer format is reported as such, not as a type error.
        cls.check_version(d["format_version"])
        sk = d["stream_kernels"]
        if not isinstance(sk, list) or len(sk) > MAX_STREAMS:
            raise ConfigError(f"config.json: stream_kernels must be a list of integers, got {sk!r}")
        return cls(**{**d, "stream_kernels": tuple(sk)})

    @staticmethod
    def check_version(v: Any) -> None:
        """`true` and `1.0` equal 1 in Python but are not format version 1."""
        if not isinstance(v, int) or isinstance(v, bool) or v != FORMAT_VERSION:
            raise ConfigError(
                f"config.json: format_version {v!r} is not supported (this msar-export reads version "
                f"{FORMAT_VERSION}); upgrade msar-export or re-save the checkpoint"
            )

    @classmethod
    def from_json(cls, text: str, what: str = "config.json") -> "MSARConfig":
        """Parse untrusted JSON: duplicate keys, NaN, deep nesting and huge integers are refused."""
        from .untrusted import MAX_CONFIG_BYTES, loads_json

        if len(text) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{what} is {len(text):,} characters, over the {MAX_CONFIG_BYTES:,} limit")
        try:
            return cls.from_dict(loads_json(text, what, ConfigError))
        except TypeError as e:  # a value of the wrong JSON type reaching a comparison
            raise ConfigError(f"{what}: a value has the wrong type ({e})") from None
