"""`msar-export export`'s command and its output, and the image a large export's CLI
process becomes to validate it (`python -m msar_export.cli_export STATE`, exec'd by
export/handoff.py): torch-free, so that image stays light."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli_common import run_command


def cmd_export(a) -> int:
    from .export.exporter import ExportOptions, export_checkpoint

    opts = ExportOptions(decode=a.decode, decomposed=a.decomposed, dtype=a.dtype, opset=a.opset, mixer_op=a.mixer_op,
                         external_data=a.external_data)
    # This process exists for this export: validating apart, it becomes this module's image.
    report = export_checkpoint(a.checkpoint, a.output, opts, trust_pickle=a.trust_pickle, validate=not a.no_validate,
                               exec_module=__name__)
    return print_report(report)


def print_report(report) -> int:
    """`msar-export export`'s output and exit status: 1, with one line, when validation failed."""
    print(report.summary())
    if report.validation is not None and not report.validation.passed:
        print(f"msar-export export: validation failed ({'; '.join(report.validation.failures)}); "
              f"{report.path} was written and kept", file=sys.stderr)
        return 1
    return 0


def _validated(a) -> int:
    from .export.handoff import validate_state

    return print_report(validate_state(Path(a.state)))


if __name__ == "__main__":
    sys.exit(run_command(argparse.Namespace(command="export", state=sys.argv[1], func=_validated)))
