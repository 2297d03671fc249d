"""The lines of an `ncu --csv --page details` report that docs/kernels.md's model is checked
against (duration, DRAM and SM throughput, registers, occupancy, launch shape), one per kernel
and metric, for scripts/gpu_check.sh's summary.txt. An empty report (ncu skipped) prints nothing."""

from __future__ import annotations

import csv
import sys

KEEP = {"Duration", "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput", "Registers Per Thread",
        "Achieved Occupancy", "Grid Size", "Block Size"}


def summary_lines(path: str) -> list[str]:
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 14]
    if not rows or "Kernel Name" not in rows[0]:
        return []
    h = rows[0]
    k, name, unit, value = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Unit"), h.index("Metric Value")
    return [f"ncu {r[k][:60]:<60} {r[name]:<26} {r[value]} {r[unit]}" for r in rows[1:] if r[name] in KEEP]


if __name__ == "__main__":
    lines = summary_lines(sys.argv[1])
    print("\n".join(lines) if lines else f"# ncu: no kernel rows in {sys.argv[1]}")
