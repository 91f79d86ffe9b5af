#!/usr/bin/env python3
"""What clock a benchmark case really ran at, and why: `nvidia-smi` sampled while the case runs.

An H200 holds its SM clock below the maximum whenever a kernel would draw more than the power limit
(700 W): the driver lowers the clock until it fits and reports "software power cap" as the active
clock-event reason. Back-to-back launches of a heavy GEMM run there, so their time is set by energy
per launch, not by the 1980 MHz in the data sheet; Nsight Compute's single launch does not show it.
This tool runs one benchmark filter at a time (`run`, on the GPU machine), sampling the SM clock,
power, temperature and clock-event reasons every few tens of milliseconds, and reads the samples
back (`summary`, anywhere): per filter, the median SM clock and power over the busy samples, the
reasons decoded, and the benchmark's medians from its JSON.

    python3 lab/tools/power_probe.py run --bench BENCH --filter REGEX [--filter REGEX ...] --out DIR \\
        [--repetitions 5] [--interval-ms 50]
    python3 lab/tools/power_probe.py summary DIR [--busy-watts W]

"Busy" samples are those drawing at least --busy-watts (default: half the highest power sampled in
that file), which drops the idle time before and after the benchmark's launches.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field

# The learner tools these probes build on live in tools/ at the top of the repository.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import kc_results  # noqa: E402  (the benchmark JSON parser the results tables use)

# clocks_throttle_reasons is the older name of clocks_event_reasons; driver 580 takes it and heads the
# column with the new name.
QUERY = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"

# NVML's clock-event reasons (nvmlClocksEventReasons*), the bits of clocks_event_reasons.active.
REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}


@dataclass
class Sample:
    """One line of nvidia-smi's CSV."""

    sm_mhz: float
    mem_mhz: float
    watts: float
    celsius: float
    reasons: int


@dataclass
class Summary:
    """The busy samples of one file, reduced."""

    name: str
    samples: int
    busy: int
    busy_watts: float
    sm_mhz_median: float | None = None
    sm_mhz_min: float | None = None
    watts_median: float | None = None
    watts_max: float | None = None
    celsius_max: float | None = None
    reasons: list[str] = field(default_factory=list)
    medians_us: dict[str, float] = field(default_factory=dict)  # benchmark run name -> median time


def decode_reasons(mask: int) -> list[str]:
    """The names of the set bits of a clock-event reason mask, low bit first; unknown bits as hex."""
    names = [name for bit, name in sorted(REASONS.items()) if mask & bit]
    unknown = mask & ~sum(REASONS)
    if unknown:
        names.append(hex(unknown))
    return names


def _number(text: str) -> float:
    """'1470 MHz' -> 1470.0, '680.28 W' -> 680.28, '37' -> 37.0; '[N/A]' and the like -> nan."""
    match = re.match(r"\s*([-+0-9.]+)", text)
    return float(match.group(1)) if match else float("nan")


def read_samples(text: str) -> list[Sample]:
    """nvidia-smi's CSV (with its header) as samples. Columns are found by name, so either of
    clocks.sm / clocks.current.sm and clocks_event_reasons / clocks_throttle_reasons works."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    if not rows:
        return []
    header = [h.strip().lower() for h in rows[0]]

    def column(*names: str) -> int:
        for i, h in enumerate(header):
            if any(h.startswith(n) for n in names):
                return i
        raise ValueError(f"column {names[0]!r} missing from nvidia-smi's CSV header {rows[0]!r}")

    sm = column("clocks.current.sm", "clocks.sm")
    mem = column("clocks.current.memory", "clocks.mem")
    power = column("power.draw")
    temp = column("temperature.gpu")
    reasons = column("clocks_event_reasons.active", "clocks_throttle_reasons.active")
    samples = []
    for r in rows[1:]:
        if len(r) < len(header):
            continue  # a line cut short when sampling stopped
        try:
            mask = int(r[reasons].strip(), 16)
        except ValueError:
            mask = 0
        samples.append(Sample(_number(r[sm]), _number(r[mem]), _number(r[power]), _number(r[temp]), mask))
    return samples


def benchmark_medians(doc: dict) -> dict[str, float]:
    """Median times in microseconds of a Google Benchmark JSON, by run name without Google
    Benchmark's suffixes, read by the results tables' parser (kc_results.parse_benchmark_json)."""
    parsed = kc_results.parse_benchmark_json(doc, "power_probe")
    return {m.name: m.time_s * 1e6 for m in parsed.measurements if m.measured}


def summarize(name: str, samples: list[Sample], busy_watts: float | None = None,
              medians_us: dict[str, float] | None = None) -> Summary:
    """Reduces one file's samples: the busy ones are those at or above busy_watts (default: half the
    highest power sampled)."""
    powers = [s.watts for s in samples if s.watts == s.watts]
    threshold = busy_watts if busy_watts is not None else (max(powers) / 2 if powers else 0.0)
    busy = [s for s in samples if s.watts >= threshold]
    out = Summary(name=name, samples=len(samples), busy=len(busy), busy_watts=threshold,
                  medians_us=dict(medians_us or {}))
    if busy:
        out.sm_mhz_median = statistics.median(s.sm_mhz for s in busy)
        out.sm_mhz_min = min(s.sm_mhz for s in busy)
        out.watts_median = statistics.median(s.watts for s in busy)
        out.watts_max = max(s.watts for s in busy)
        out.celsius_max = max(s.celsius for s in busy)
        mask = 0
        for s in busy:
            mask |= s.reasons
        out.reasons = decode_reasons(mask)
    return out


def format_summary(s: Summary) -> str:
    """A few lines for one filter."""
    lines = [f"## {s.name}"]
    if not s.busy:
        lines.append(f"  no sample at or above {s.busy_watts:.0f} W ({s.samples} samples)")
    else:
        lines += [
            f"  busy samples        {s.busy} of {s.samples} (at or above {s.busy_watts:.0f} W)",
            f"  SM clock            median {s.sm_mhz_median:.0f} MHz, lowest {s.sm_mhz_min:.0f} MHz",
            f"  power               median {s.watts_median:.0f} W, highest {s.watts_max:.0f} W",
            f"  temperature         highest {s.celsius_max:.0f} C",
            f"  clock-event reasons {', '.join(s.reasons) if s.reasons else 'none'}",
        ]
    for run, us in sorted(s.medians_us.items()):
        lines.append(f"  median time         {us:.2f} us  {run}")
    return "\n".join(lines)


def slug(pattern: str) -> str:
    """A file name for a benchmark filter: runs of other characters become one underscore."""
    return re.sub(r"[^A-Za-z0-9]+", "_", pattern).strip("_") or "all"


def smi_command(path: str, interval_ms: int) -> list[str]:
    """The nvidia-smi sampling command for one filter's CSV."""
    return ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv", f"--loop-ms={interval_ms}", f"--filename={path}"]


def summarize_dir(directory: str, busy_watts: float | None) -> list[Summary]:
    """Summaries of every <slug>.csv in a folder, with <slug>.json's medians where it exists."""
    out = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".csv"):
            continue
        stem = name[:-4]
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            samples = read_samples(f.read())
        medians = {}
        json_path = os.path.join(directory, stem + ".json")
        if os.path.exists(json_path):
            with open(json_path, encoding="utf-8") as f:
                medians = benchmark_medians(json.load(f))
        out.append(summarize(stem, samples, busy_watts, medians))
    return out


def run(args: argparse.Namespace) -> int:
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found: this command runs on the GPU machine", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    for pattern in args.filter:
        stem = os.path.join(args.out, slug(pattern))
        sampler = subprocess.Popen(smi_command(stem + ".csv", args.interval_ms), stdout=subprocess.DEVNULL)
        try:
            subprocess.run([args.bench, f"--benchmark_filter={pattern}",
                            f"--benchmark_repetitions={args.repetitions}", "--benchmark_report_aggregates_only=true",
                            f"--benchmark_out={stem}.json", "--benchmark_out_format=json"],
                           check=True, stdout=subprocess.DEVNULL)
        finally:
            sampler.terminate()
            sampler.wait()
    for s in summarize_dir(args.out, None):
        print(format_summary(s))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run benchmark filters one at a time, sampling nvidia-smi (GPU machine)")
    p_run.add_argument("--bench", required=True)
    p_run.add_argument("--filter", required=True, action="append", help="a --benchmark_filter; repeatable")
    p_run.add_argument("--out", required=True, help="folder for <slug>.csv and <slug>.json per filter")
    p_run.add_argument("--repetitions", type=int, default=5)
    p_run.add_argument("--interval-ms", type=int, default=50)
    p_sum = sub.add_parser("summary", help="summarise a folder written by run")
    p_sum.add_argument("dir")
    p_sum.add_argument("--busy-watts", type=float, default=None)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    if not os.path.isdir(args.dir):
        print(f"{args.dir}: not a folder", file=sys.stderr)
        return 2
    for s in summarize_dir(args.dir, args.busy_watts):
        print(format_summary(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
