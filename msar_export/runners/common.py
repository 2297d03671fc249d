"""The output lists every runner agrees on (names from msar_export.graph_spec)."""

from __future__ import annotations

import contextlib

from ..graph_spec import LOGITS, GraphSpec


def output_names(cfg) -> list[str]:
    """`logits` then `hidden.1` .. `hidden.{L+1}`, the outputs a parity check compares."""
    return [LOGITS, *GraphSpec(cfg, decode=False).hidden_names]


def layer_order(cfg) -> list[str]:
    """The same names in depth order (h_1 first, logits last): the order "first bad layer" follows."""
    return [*GraphSpec(cfg, decode=False).hidden_names, LOGITS]


@contextlib.contextmanager
def quiet_polygraphy(verbose: bool = False):
    """Polygraphy logs every step to stdout; the check prints its own report instead."""
    from polygraphy.logger import G_LOGGER

    if verbose:
        yield
        return
    colors = G_LOGGER.colors
    G_LOGGER.colors = False  # also skips its "colored is not installed" notice
    try:
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL + 1):
            yield
    finally:
        G_LOGGER.colors = colors
