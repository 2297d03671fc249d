"""The one place lines meant for a person go (docs/architecture.md, "Output").

Library code never prints. A function whose steps a person waits for takes a `progress`
callable (one line per call, silent when not given), so its caller chooses where the lines go
and a test can collect them; a degraded path is a warning on the module's own
`logging.getLogger(__name__)`. Both end in the `msar_export` logger, which a command's process
points at stderr once (`setup`): every line reads `msar-export <command>: ...`, warnings say
so, and stdout keeps the command's result alone. Without `setup` (the library used from
Python) progress is silent and warnings reach Python's last-resort handler on stderr.
"""

from __future__ import annotations

import logging
import sys

ROOT = "msar_export"
_log = logging.getLogger(ROOT)


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a line is emitted (a test's capture, a redirect)."""

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


class _Format(logging.Formatter):
    def __init__(self, command: str | None):
        super().__init__()
        self.prefix = f"msar-export {command}: " if command else "msar-export: "

    def format(self, record) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return self.prefix + level + record.getMessage()


def setup(command: str | None = None, verbose: bool = False) -> None:
    """Point the package's log at stderr for this process: INFO and up (DEBUG with verbose).
    Called again (the next command of one process, a test), it replaces its own handler."""
    for h in [h for h in _log.handlers if isinstance(h, _Stderr)]:
        _log.removeHandler(h)
    handler = _Stderr()
    handler.setFormatter(_Format(command))
    _log.addHandler(handler)
    _log.setLevel(logging.DEBUG if verbose else logging.INFO)
    _log.propagate = False


def say(msg: str) -> None:
    """A progress line from a command (its `progress` callable): INFO on the package's log."""
    _log.info(msg)


def silent(msg: str) -> None:
    """The `progress` of a caller that gave none: library functions run quietly by default."""
