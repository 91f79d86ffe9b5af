#!/usr/bin/env python3
"""Where in the SASS a kernel's warps spend their time: Nsight Compute's source page, split in two.

`ncu --section SourceCounters --page source --print-source sass --csv` gives one row per SASS
instruction: how often it ran and how many warp-stall samples landed on it, by reason. This tool
runs that for one benchmark case (`run`, on the GPU machine) and reads the result back (`summary`,
anywhere). The summary splits the kernel at a marker instruction: by default the last HMMA, so
"through the main loop" and "after it" (the epilogue) come out separately, each with its warp
instructions executed per warp, its share of the stall samples, the stall reasons and the opcodes.

    python3 lab/tools/ncu_source.py run --bench BENCH --case CASE [--kernel REGEX] --out source.csv
    python3 lab/tools/ncu_source.py summary source.csv [--split-after REGEX]
    python3 lab/tools/ncu_source.py compact source.csv --out compact.csv   # the columns worth keeping

Warps per launch are read from the kernel's first instruction, which every warp executes once.
Clocks are left as they are (--clock-control none), as for every profile in this repository.
"""
from __future__ import annotations

import argparse
import collections
import csv
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

# The learner tools these probes build on live in tools/ at the top of the repository.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import kc_profile  # noqa: E402  (where ncu is, and the filter that selects one case)

EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"
SOURCE = "Source"


@dataclass
class Region:
    """One stretch of the kernel's SASS and what ran in it."""

    name: str
    instructions: int = 0  # SASS instructions in the stretch
    executed: int = 0  # warp instructions executed
    samples: float = 0.0  # warp-stall samples (all)
    reasons: collections.Counter = field(default_factory=collections.Counter)
    opcodes: collections.Counter = field(default_factory=collections.Counter)


def read_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and the instruction rows of ncu's source-page CSV (anything before the header,
    such as the benchmark's own output, is skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"') or line.startswith('"index"')
                  or line.startswith("index,")), None)
    if start is None:
        raise ValueError("no source-page header (a line starting with \"Address\") in the CSV")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    for column in (SOURCE, EXECUTED, SAMPLES):
        if column not in header:
            raise ValueError(f"column {column!r} missing from the source-page CSV")
    return header, [r for r in rows[1:] if len(r) == len(header)]


def opcode(source: str) -> str:
    """The opcode of one SASS line without its predicate and modifiers: '@!P0 BRA 0x10' -> 'BRA'."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def number(value: str) -> float:
    return float(value) if value.strip() else 0.0


def summarize(header: list[str], rows: list[list[str]], split_after: str = r"\bHMMA\b") -> tuple[int, list[Region]]:
    """Warps per launch and the two regions: up to and including the last instruction matching
    @p split_after, and everything after it. Raises ValueError when nothing matches."""
    s, e, m = header.index(SOURCE), header.index(EXECUTED), header.index(SAMPLES)
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(header) if h.startswith("stall_") and "(" not in h]
    marker = re.compile(split_after)
    last = max((i for i, r in enumerate(rows) if marker.search(r[s])), default=None)
    if last is None:
        raise ValueError(f"no instruction matches {split_after!r}")
    warps = int(number(rows[0][e])) if rows else 0
    regions = [Region("through the last " + split_after.replace("\\b", "")), Region("after it")]
    for i, row in enumerate(rows):
        region = regions[0] if i <= last else regions[1]
        executed = int(number(row[e]))
        region.instructions += 1
        region.executed += executed
        region.samples += number(row[m])
        for column, reason in reasons:
            if number(row[column]):
                region.reasons[reason] += number(row[column])
        if executed:
            region.opcodes[opcode(row[s])] += executed
    return warps, regions


def format_summary(warps: int, regions: list[Region], top: int = 8) -> str:
    total = sum(r.samples for r in regions) or 1.0
    out = [f"warps per launch (the first instruction's count): {warps}"]
    for r in regions:
        per_warp = r.executed / warps if warps else 0.0
        out.append(f"\n## {r.name}: {r.instructions} SASS instructions, {per_warp:.1f} executed per warp, "
                   f"{r.samples:.0f} stall samples ({100.0 * r.samples / total:.1f} %)")
        out.append("stall reasons: " + ", ".join(f"{k} {v:.0f}" for k, v in r.reasons.most_common(top)))
        out.append("opcodes per warp: " + ", ".join(
            f"{k} {v / warps:.1f}" if warps else f"{k} {v}" for k, v in r.opcodes.most_common(top)))
    return "\n".join(out)


def compact(header: list[str], rows: list[list[str]]) -> str:
    """The instruction rows with only the source, the executions, the samples and the stall reasons."""
    keep = [SOURCE, EXECUTED, SAMPLES] + [h for h in header if h.startswith("stall_") and "(" not in h]
    columns = [header.index(k) for k in keep]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["index"] + keep)
    for n, row in enumerate(rows):
        writer.writerow([n] + [row[c] for c in columns])
    return buffer.getvalue()


def run(bench: str, case: str, kernel: str | None, out: str) -> int:
    ncu = kc_profile.find_ncu()
    if ncu is None:
        print("ncu_source.py: Nsight Compute (ncu) not found: set NCU or put ncu on PATH", file=sys.stderr)
        return 2
    command = [ncu, "--clock-control", "none", "--launch-count", "1", "--section", "SourceCounters",
               "--page", "source", "--print-source", "sass", "--csv"]
    if kernel:
        command += ["--kernel-name", f"regex:{kernel}"]
    command += [bench, f"--benchmark_filter={kc_profile.benchmark_filter(case)}", "--benchmark_repetitions=1"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    with open(out, "w", encoding="utf-8") as f:
        f.write(result.stdout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-4000:])
    return result.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="profile one benchmark case (needs a GPU and ncu)")
    p_run.add_argument("--bench", required=True)
    p_run.add_argument("--case", required=True, help="the benchmark's case name, without /min_time")
    p_run.add_argument("--kernel", help="regex of the kernel to profile (the first launch that matches)")
    p_run.add_argument("--out", required=True)
    p_sum = sub.add_parser("summary", help="split a saved CSV at a marker instruction and summarise")
    p_sum.add_argument("csv")
    p_sum.add_argument("--split-after", default=r"\bHMMA\b", help="regex of the marker (last match splits)")
    p_cmp = sub.add_parser("compact", help="keep only the columns worth committing")
    p_cmp.add_argument("csv")
    p_cmp.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.bench, args.case, args.kernel, args.out)
    with open(args.csv, encoding="utf-8") as f:
        header, rows = read_rows(f.read())
    if args.command == "summary":
        warps, regions = summarize(header, rows, args.split_after)
        print(format_summary(warps, regions))
    else:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(compact(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
