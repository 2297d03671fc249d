"""One load-test run as data.  `msar-export loadtest` builds it and runs it here, or,
when this environment lacks tritonclient, in .venv-triton as
`python -m msar_export.serving.load.job JOB.json` (the job travels as JSON, not as
command-line flags rebuilt from parsed ones)."""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ...untrusted import loads_json
from .loadtest import CompareSettings, LoadSettings, compare_batching, format_report, run_failed, run_load
from .perf_analyzer import PerfSettings


@dataclass
class LoadJob:
    urls: list[str]
    settings: LoadSettings
    compare: CompareSettings | None = None  # start servers on prefill/decode instead of using urls
    prefill: str | None = None  # the graphs served (compare) or the reference files (default: the server's)
    decode: str | None = None
    json_out: str | None = None
    perf: PerfSettings | None = None  # run Triton's perf_analyzer beside the load test at each concurrency

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LoadJob:
        d = loads_json(text, "the load job")
        s = d.pop("settings")
        c = d.pop("compare")
        p = d.pop("perf", None)
        return cls(settings=LoadSettings(**{**s, "models": tuple(s["models"])}),
                   compare=CompareSettings(**c) if c else None,
                   perf=PerfSettings(**{**p, "concurrency": tuple(p["concurrency"])}) if p else None, **d)


def run_job(job: LoadJob, say=print) -> int:
    """Run it, print the reports, write the JSON report; 1 if anything failed."""
    if job.perf is not None:
        from . import perf_analyzer as pa

        result = pa.compare(job.urls, job.settings, job.perf, job.prefill, job.decode, say=lambda m: print(m, flush=True))
        print(pa.format_table(result))
        failed = pa.failed(result)
    elif job.compare is not None:
        result = compare_batching(job.prefill, job.decode, job.settings, job.compare, progress=say)
        print(f"dynamic batching vs batch-1 at {job.settings.clients} clients: "
              f"throughput x{result['speedup_throughput']}")
        print(format_report(result["dynamic_batching"]))
        print(format_report(result["batch1"]))
        failed = any(run_failed(r) for r in (result["dynamic_batching"], result["batch1"]))
    else:
        runs = []
        for url in job.urls:
            r = run_load(url, job.settings, job.prefill, job.decode, progress=say)
            print(format_report(r), flush=True)
            runs.append(r)
        result = runs[0] if len(runs) == 1 else {"runs": runs}
        failed = any(run_failed(r) for r in runs)
    if job.json_out:
        from ...fileio import atomic_write_text

        atomic_write_text(job.json_out, json.dumps(result, indent=2) + "\n")
        print(f"report: {job.json_out}")
    return 1 if failed else 0


def run_in_triton_venv(job: LoadJob) -> int:
    from ..triton.env import run_in_triton_env

    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="msar-loadtest-") as f:
        f.write(job.to_json())
        f.flush()
        return run_in_triton_env("msar_export.serving.load.job", [f.name])


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ...cli_common import run_command, say

    def cmd(a) -> int:
        return run_job(LoadJob.from_json(Path(a.job).read_text()), say)

    p = argparse.ArgumentParser(prog="msar-export loadtest")
    p.add_argument("job", help="a LoadJob as JSON")
    a = p.parse_args(argv)
    a.command, a.func = "loadtest", cmd
    return run_command(a)


if __name__ == "__main__":
    sys.exit(main())
