"""Shared options have one grammar in every subcommand (msar_export/cli_common.py)."""

from __future__ import annotations

import pytest

from msar_export.cli import build_parser
from msar_export.verdict import PRECISIONS

REQUIRED = {"build": ["m.onnx", "-o", "m.plan"], "check": ["ck", "--onnx", "m.onnx"], "generate": ["ck"],
            "triton-repo": ["m.onnx", "-o", "repo"], "export": ["ck", "-o", "m.onnx"], "serve": ["ck"],
            "genai": ["ck", "-o", "dir"]}


def subcommands_with(option: str) -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(name for name, p in sub.choices.items() if any(option in a.option_strings for a in p._actions))


def test_plugins_everywhere_take_several_and_repeat():
    names = subcommands_with("--plugins")
    assert set(names) >= {"build", "check", "generate", "triton-repo"}, names
    for name in names:
        a = build_parser().parse_args([name, *REQUIRED[name], "--plugins", "a.so", "b.so", "--plugins", "c.so"])
        assert a.plugins == ["a.so", "b.so", "c.so"], name


def test_dtype_is_one_choice_set_and_shapes_one_grammar():
    names = subcommands_with("--dtype")
    assert set(names) >= {"build", "check", "export"}, names
    for name in names:
        assert build_parser().parse_args([name, *REQUIRED[name], "--dtype", "bfloat16"]).dtype == "bfloat16"
        with pytest.raises(SystemExit):
            build_parser().parse_args([name, *REQUIRED[name], "--dtype", "fp16"])
    assert set(PRECISIONS) == {"float32", "float16", "bfloat16"}
    # token shapes are BxT wherever --shapes exists; engine profiles are build --profile
    assert subcommands_with("--shapes") == ["check"]
    assert build_parser().parse_args(["build", *REQUIRED["build"], "--profile", "batch=1/2/4"]).profile == ["batch=1/2/4"]


def test_one_log_convention_progress_and_library_warnings_on_stderr(capsys):
    """A command's progress (`say`) and a library module's warning reach stderr as
    `msar-export <command>: ...`; DEBUG only with --verbose; stdout stays empty."""
    import logging

    from msar_export import log
    from msar_export.cli_common import say

    library = logging.getLogger("msar_export.runners.ort_runner")
    log.setup("check")
    say("step one")
    library.warning("native msar kernels not built")
    library.debug("detail")
    assert capsys.readouterr() == ("", "msar-export check: step one\n"
                                       "msar-export check: warning: native msar kernels not built\n")
    log.setup("build", verbose=True)  # replaces the handler: one line per record, not two
    library.debug("detail")
    logging.getLogger("elsewhere").warning("not ours")  # negative control: not the package's log, not its lines
    assert capsys.readouterr() == ("", "msar-export build: debug: detail\n")
    log.setup()  # leave the package's log as a command without --verbose sets it
