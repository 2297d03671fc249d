"""What an exported graph is, written once (MSAR_SPEC.md section 3).

Every stage that feeds, reads or names a graph's values asks this module:
the exporter (names, metadata), the runners and runtimes (caches, the
present -> past hand-over), the parity check (hidden states), serving.
Renaming a decode input is a change here and nowhere else.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .config import MSARConfig

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
# Mixer output h_l (l = 1..L+1) as the exporter names it and every runner reports it.
HIDDEN = "hidden.{}"
PAST_KEY, PAST_VALUE = "past_key_values.{}.key", "past_key_values.{}.value"
PRESENT_KEY, PRESENT_VALUE = "present.{}.key", "present.{}.value"
PAST_CONV, PRESENT_CONV = "past_conv_state", "present_conv_state"

# Metadata keys the exporter writes and every reader of an exported file uses.
META_CONFIG = "msar.config"
META_GRAPH = "msar.graph"  # "prefill" | "decode"
META_DECOMPOSED = "msar.decomposed"  # "true" | "false"
META_DTYPE = "msar.dtype"
META_MIXER_OP = "msar.mixer_op"
META_CHECKPOINT = "msar.checkpoint"


def hidden_name(l: int) -> str:
    return HIDDEN.format(l)


def hidden_index(name: str) -> int | None:
    """`hidden.3` -> 3; anything else -> None."""
    prefix = HIDDEN.format("")
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    return int(rest) if rest.isdigit() else None


@dataclass(frozen=True)
class Port:
    name: str
    axes: tuple  # ints for fixed sizes, names for dynamic axes
    kind: str  # "ids" (int64 tokens or positions), "mask" (int64 0/1), "cache", "float"


@dataclass(frozen=True)
class GraphSpec:
    cfg: MSARConfig
    decode: bool

    @property
    def kv_axes(self) -> tuple:
        return ("batch", self.cfg.n_kv_heads, "past", self.cfg.head_dim)

    @property
    def conv_axes(self) -> tuple:
        return (self.cfg.n_sublayers + 1, "batch", self.cfg.kmax - 1, self.cfg.d_model)

    @property
    def inputs(self) -> list[Port]:
        ports = [Port(INPUT_IDS, ("batch", "seq"), "ids")]
        if self.decode:
            ports += [Port(ATTENTION_MASK, ("batch", "past + seq"), "mask"), Port(POSITION_IDS, ("batch", "seq"), "ids")]
            ports += self.cache_inputs
        return ports

    @property
    def cache_inputs(self) -> list[Port]:
        if not self.decode:
            return []
        ports = []
        for k in range(self.cfg.n_blocks):
            ports += [Port(PAST_KEY.format(k), self.kv_axes, "cache"), Port(PAST_VALUE.format(k), self.kv_axes, "cache")]
        if self.cfg.residual == "msar":
            ports.append(Port(PAST_CONV, self.conv_axes, "cache"))
        return ports

    @property
    def outputs(self) -> list[Port]:
        ports = [Port(LOGITS, ("batch", "seq", self.cfg.vocab_size), "float")]
        if self.decode:
            for k in range(self.cfg.n_blocks):
                ports += [Port(PRESENT_KEY.format(k), self.kv_axes, "cache"),
                          Port(PRESENT_VALUE.format(k), self.kv_axes, "cache")]
            if self.cfg.residual == "msar":
                ports.append(Port(PRESENT_CONV, self.conv_axes, "cache"))
        return ports

    @property
    def input_names(self) -> list[str]:
        return [p.name for p in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [p.name for p in self.outputs]

    @property
    def hidden_names(self) -> list[str]:
        return [hidden_name(l) for l in range(1, self.cfg.n_sublayers + 2)]

    def feeds(self, input_ids, attention_mask=None, position_ids=None, cache=None) -> dict[str, np.ndarray]:
        """The graph's inputs in port order (a prefill graph takes input_ids alone)."""
        out = {INPUT_IDS: np.asarray(input_ids, np.int64)}
        if self.decode:
            out[ATTENTION_MASK] = np.asarray(attention_mask, np.int64)
            out[POSITION_IDS] = np.asarray(position_ids, np.int64)
            out.update((p.name, cache[p.name]) for p in self.cache_inputs)
        return out

    def fresh_feeds(self, input_ids, cache_dtype) -> dict[str, np.ndarray]:
        """A whole prompt with nothing before it: full mask, positions 0.., empty caches."""
        ids = np.asarray(input_ids, np.int64)
        if not self.decode:
            return self.feeds(ids)
        batch, seq = ids.shape
        return self.feeds(ids, np.ones((batch, seq), np.int64), np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),
                          self.empty_cache(batch, cache_dtype))

    def torch_dynamic_shapes(self) -> tuple:
        """torch.export's dynamic_shapes for the traced graph modules (export/graphs.py),
        positional in port order (the caches as one group: the forward takes them as
        *past), so the forward's parameter names need not match the port names.  The
        mask length (past + seq) is left to torch.export (AUTO), which derives it."""
        from torch.export import Dim

        dims = {"batch": Dim("batch"), "seq": Dim("seq"), "past": Dim("past"), "past + seq": Dim.AUTO}

        def axes(port: Port) -> dict:
            return {i: dims[a] for i, a in enumerate(port.axes) if isinstance(a, str)}

        plain = tuple(axes(p) for p in self.inputs if p.kind != "cache")
        return plain + (tuple(axes(p) for p in self.cache_inputs),) if self.decode else plain

    def empty_cache(self, batch: int, dtype) -> dict[str, np.ndarray]:
        """The past inputs for `batch` rows and no past tokens (every backend's start)."""
        return {p.name: np.zeros([batch if a == "batch" else 0 if a == "past" else a for a in p.axes], dtype)
                for p in self.cache_inputs}

    @functools.cached_property  # read on every decode step
    def past_of_present(self) -> dict[str, str]:
        return {o.name: i.name for o, i in zip(self.outputs[1:], self.cache_inputs)}

    def next_cache(self, outputs: dict) -> dict:
        """A step's present outputs renamed to the next step's past inputs."""
        past = self.past_of_present
        return {past[name]: value for name, value in outputs.items() if name in past}
