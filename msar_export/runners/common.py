"""Names every runner agrees on (MSAR_SPEC.md section 3 and the exporter's `hidden.{l}`)."""

from __future__ import annotations

INPUT_NAME = "input_ids"
LOGITS_NAME = "logits"
# Same pattern as msar_export.export.exporter.HIDDEN_NAME; tests check that they agree.
HIDDEN_PATTERN = "hidden.{}"


def hidden_name(l: int) -> str:
    """Name of the mixer output h_l (l = 1..L+1) in every runner's outputs."""
    return HIDDEN_PATTERN.format(l)


def output_names(cfg) -> list[str]:
    """`logits` then `hidden.1` .. `hidden.{L+1}`, the outputs a parity check compares."""
    return [LOGITS_NAME] + [hidden_name(l) for l in range(1, cfg.n_sublayers + 2)]


def layer_order(cfg) -> list[str]:
    """The same names in depth order (h_1 first, logits last): the order "first bad layer" follows."""
    return [hidden_name(l) for l in range(1, cfg.n_sublayers + 2)] + [LOGITS_NAME]


def layer_index(name: str) -> int | None:
    """`hidden.3` -> 3; `logits` -> None."""
    prefix = HIDDEN_PATTERN.format("")
    return int(name[len(prefix):]) if name.startswith(prefix) else None
