#!/usr/bin/env python3
"""Profile one benchmark case under Nsight Compute and print the few metrics the lessons use.

    python3 tools/kc_profile.py --bench build/bin/ch01_vector_add_bench \\
        --case 'ch01/after/fp32_N268435456' [--kernel REGEX] [--launch-skip N] [--launch-count N] [--out CSV]

Runs ``ncu --clock-control none --print-units base --csv --page raw --metrics <list>
[-k regex:REGEX] --launch-skip N --launch-count N <bench> --benchmark_filter=^<case>(/|$)
--benchmark_repetitions=1`` (ncu from $NCU, else from PATH), parses the CSV and prints, per profiled
kernel: duration, DRAM bytes read and written, DRAM throughput (GB/s and % of peak), L2 hit rate,
global load and store sectors per request, achieved occupancy and tensor-pipe utilisation. A metric
that ncu did not report shows as "n/a".

``--from-csv FILE`` parses a CSV saved earlier (with ``--out``) instead of running ncu.

Clocks are left alone (``--clock-control none``) so the profiled kernel runs at the clocks the
benchmarks see. The metric names were checked with ``ncu --query-metrics --chip gh100`` (Nsight
Compute 2025.3.1) and on an H200, where the hmma tensor-pipe metric also counts Hopper's wgmma work
(94.9 % for cuBLAS's bf16 4096^3 kernel). Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

# The metrics the lessons use (Nsight Compute 2023+ names; Volta and newer, Hopper included).
METRICS: Dict[str, str] = {
    "duration": "gpu__time_duration.sum",
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit": "lts__t_sector_hit_rate.pct",
    "ld_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "ld_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "st_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "st_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "tensor_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    # The SM clock while the kernel ran: heavy kernels run below the clock nvidia-smi reports as
    # the maximum (power), and a rate compared with a peak measured at another clock misleads.
    "sm_clock": "sm__cycles_elapsed.avg.per_second",
}

NA = "n/a"

# Unit prefixes that ncu may print (with --print-units base it prints none; kept for saved CSVs).
_TIME_UNITS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
               "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
               "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
               "Kibyte": 2.0 ** 10, "Mibyte": 2.0 ** 20, "Gibyte": 2.0 ** 30, "Tibyte": 2.0 ** 40}
_COUNT_UNITS = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9}
_RATE_UNITS = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "cycle/second": 1.0, "cycle/usecond": 1e6,
               "cycle/nsecond": 1e9, "cycle/ns": 1e9, "1/second": 1.0, "/second": 1.0}


class ProfileError(Exception):
    """ncu is missing, failed, or its output is not the expected CSV."""


@dataclass
class KernelRow:
    """One profiled kernel launch: identification columns and metric values in base units
    (seconds, bytes, percent, counts). Missing metrics are absent from ``values``."""

    id: str
    name: str
    grid: str = ""
    block: str = ""
    values: Dict[str, float] = field(default_factory=dict)


def parse_number(text: str) -> Optional[float]:
    """Parses an ncu value: '1,234,567' -> 1234567.0, '12.5' -> 12.5; None for '', 'n/a', '-'."""
    cleaned = text.strip().replace(",", "")
    if cleaned in ("", "n/a", "N/A", "-", "--"):
        return None
    try:
        return float(cleaned)
    except ValueError:
        return None


def _unit_scale(metric: str, unit: str) -> Optional[float]:
    unit = unit.strip()
    if metric.startswith("gpu__time_duration"):
        return _TIME_UNITS.get(unit, 1e-9 if unit == "" else None)
    if "bytes" in metric:
        return _BYTE_UNITS.get(unit, 1.0 if unit == "" else None)
    if metric.endswith(".pct") or "pct_of_peak" in metric:
        return 1.0  # "%"
    if metric.endswith(".per_second"):  # a rate: to per second
        return _RATE_UNITS.get(unit.lower(), 1.0 if unit == "" else None)
    for suffix in ("sector", "request", ""):
        for prefix, scale in _COUNT_UNITS.items():
            if unit == prefix + suffix:
                return scale
    return 1.0


def extract_csv(output: str) -> str:
    """Returns the CSV part of ncu's output: from the header line (the one naming 'Kernel Name')
    to the last row. ncu's '==PROF==' lines and the program's own output are dropped."""
    lines = output.splitlines()
    start = None
    for i, line in enumerate(lines):
        if line.startswith('"') and '"Kernel Name"' in line:
            start = i
    if start is None:
        raise ProfileError("no CSV header with a 'Kernel Name' column in ncu's output")
    end = start + 1
    while end < len(lines) and lines[end].startswith('"'):
        end += 1
    return "\n".join(lines[start:end]) + "\n"


def parse_ncu_csv(text: str) -> List[KernelRow]:
    """Parses ``ncu --csv --page raw`` output: a header row with the metric names, a units row
    (empty identification cells), then one row per profiled kernel. Values may carry thousands
    separators. Metric values are converted to base units (s, bytes, %, counts)."""
    rows = list(csv.reader(io.StringIO(extract_csv(text))))
    header = rows[0]
    column = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in column:
        raise ProfileError("the CSV has no 'Kernel Name' column")
    body = rows[1:]
    units: Dict[str, str] = {}
    if body and body[0] and body[0][0].strip() == "":
        units = {name: (body[0][i] if i < len(body[0]) else "") for name, i in column.items()}
        body = body[1:]

    def cell(row: List[str], name: str) -> str:
        i = column.get(name)
        return row[i] if i is not None and i < len(row) else ""

    kernels = []
    for row in body:
        if not row or not any(c.strip() for c in row):
            continue
        kernel = KernelRow(id=cell(row, "ID"), name=cell(row, "Kernel Name"),
                           grid=cell(row, "Grid Size"), block=cell(row, "Block Size"))
        for key, metric in METRICS.items():
            if metric not in column:
                continue
            value = parse_number(cell(row, metric))
            scale = _unit_scale(metric, units.get(metric, ""))
            if value is not None and scale is not None:
                kernel.values[key] = value * scale
        kernels.append(kernel)
    return kernels


def _ratio(values: Dict[str, float], a: str, b: str) -> Optional[float]:
    if a in values and b in values and values[b] > 0:
        return values[a] / values[b]
    return None


def _sig(value: float) -> str:
    a = abs(value)
    if a >= 99.95:
        return "%.0f" % value
    if a >= 9.995:
        return "%.1f" % value
    return "%.2f" % value


def _scaled(value: float, units: Sequence[Tuple[float, str]]) -> str:
    for scale, unit in units:
        if value >= 0.9995 * scale:
            return "%s %s" % (_sig(value / scale), unit)
    scale, unit = units[-1]
    return "%s %s" % (_sig(value / scale), unit)


def summarize(kernel: KernelRow) -> List[Tuple[str, str]]:
    """The lines printed for one kernel, as (label, value) pairs."""
    v = kernel.values
    lines: List[Tuple[str, str]] = []

    def pct(key: str) -> str:
        return "%.1f%%" % v[key] if key in v else NA

    duration = v.get("duration")
    lines.append(("duration", _scaled(duration, [(1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")])
                  if duration is not None else NA))
    byte_units = [(1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B")]
    lines.append(("DRAM read", _scaled(v["dram_read"], byte_units) if "dram_read" in v else NA))
    lines.append(("DRAM written", _scaled(v["dram_write"], byte_units) if "dram_write" in v else NA))
    if duration and "dram_read" in v and "dram_write" in v:
        rate = _scaled((v["dram_read"] + v["dram_write"]) / duration, [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s")])
    else:
        rate = NA
    lines.append(("DRAM throughput", "%s, %s of peak" % (rate, pct("dram_pct"))))
    lines.append(("L2 hit rate", pct("l2_hit")))
    ld = _ratio(v, "ld_sectors", "ld_requests")
    st = _ratio(v, "st_sectors", "st_requests")
    lines.append(("global load sectors/request", "%.2f" % ld if ld is not None else NA))
    lines.append(("global store sectors/request", "%.2f" % st if st is not None else NA))
    lines.append(("achieved occupancy", pct("occupancy")))
    lines.append(("tensor pipe utilisation", pct("tensor_pct")))
    lines.append(("SM clock", "%.2f GHz" % (v["sm_clock"] / 1e9) if "sm_clock" in v else NA))
    return lines


def render_report(kernels: Sequence[KernelRow]) -> str:
    """Plain-text report of the profiled kernels."""
    if not kernels:
        return "ncu profiled no kernel (check --case, --kernel and --launch-skip)\n"
    out = []
    for kernel in kernels:
        where = []
        if kernel.grid:
            where.append("grid %s" % kernel.grid)
        if kernel.block:
            where.append("block %s" % kernel.block)
        out.append("kernel %s: %s%s" % (kernel.id, kernel.name, ("  [%s]" % ", ".join(where)) if where else ""))
        pairs = summarize(kernel)
        width = max(len(label) for label, _ in pairs)
        out += ["  %s  %s" % (label.ljust(width), value) for label, value in pairs]
        out.append("")
    return "\n".join(out)


_REGEX_SPECIAL = re.compile(r"([.^$*+?()\[\]{}|\\])")


def benchmark_filter(case: str) -> str:
    """The --benchmark_filter value that selects exactly one case: ^<case>(/|$)."""
    return "^%s(/|$)" % _REGEX_SPECIAL.sub(r"\\\1", case)


def build_command(ncu: str, bench: str, case: str, kernel: Optional[str] = None,
                  launch_skip: int = 3, launch_count: int = 1) -> List[str]:
    """The ncu command line (a list, run without a shell)."""
    command = [ncu, "--clock-control", "none", "--print-units", "base", "--csv", "--page", "raw",
               "--metrics", ",".join(METRICS.values())]
    if kernel:
        command += ["-k", "regex:%s" % kernel]
    command += ["--launch-skip", str(launch_skip), "--launch-count", str(launch_count),
                bench, "--benchmark_filter=%s" % benchmark_filter(case), "--benchmark_repetitions=1"]
    return command


def find_ncu() -> Optional[str]:
    """ncu from $NCU, else from PATH, else from the usual CUDA install folder; None if absent."""
    explicit = os.environ.get("NCU")
    if explicit:
        return explicit
    found = shutil.which("ncu")
    if found:
        return found
    fallback = "/usr/local/cuda/bin/ncu"
    return fallback if os.path.exists(fallback) else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point: 0 on success, 1 when ncu fails or profiles nothing, 2 on bad use."""
    parser = argparse.ArgumentParser(prog="kc_profile.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", help="benchmark program, e.g. build/bin/ch01_vector_add_bench")
    parser.add_argument("--case", help="full benchmark name, e.g. ch01/after/fp32_N268435456")
    parser.add_argument("--kernel", help="only kernels whose name matches this regex (ncu -k regex:...)")
    parser.add_argument("--launch-skip", type=int, default=3,
                        help="kernel launches to skip before profiling (default 3: past warm-up)")
    parser.add_argument("--launch-count", type=int, default=1, help="kernel launches to profile (default 1)")
    parser.add_argument("--out", metavar="CSV", help="also save ncu's CSV here")
    parser.add_argument("--from-csv", metavar="CSV", help="parse this saved CSV instead of running ncu")
    args = parser.parse_args(argv)

    if args.from_csv:
        try:
            with open(args.from_csv, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            print("kc_profile.py: cannot read %s: %s" % (args.from_csv, e), file=sys.stderr)
            return 2
    else:
        if not args.bench or not args.case:
            parser.error("--bench and --case are required (or give --from-csv)")
        ncu = find_ncu()
        if ncu is None:
            print("kc_profile.py: Nsight Compute (ncu) not found: set NCU or put ncu on PATH", file=sys.stderr)
            return 1
        command = build_command(ncu, args.bench, args.case, args.kernel, args.launch_skip, args.launch_count)
        print("$ " + " ".join(command), file=sys.stderr)
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, errors="replace")
        text = proc.stdout
        if proc.returncode != 0:
            sys.stderr.write(text[-4000:])
            print("kc_profile.py: ncu exited with status %d" % proc.returncode, file=sys.stderr)
            return 1
    try:
        csv_text = extract_csv(text)
        kernels = parse_ncu_csv(csv_text)
    except ProfileError as e:
        sys.stderr.write(text[-4000:])
        print("kc_profile.py: %s" % e, file=sys.stderr)
        return 1
    if args.out:
        with open(args.out, "w", encoding="utf-8", newline="\n") as f:
            f.write(csv_text)
    report = render_report(kernels)
    try:
        sys.stdout.write(report)
    except UnicodeEncodeError:
        sys.stdout.write(report.replace("µ", "u"))
    return 0 if kernels else 1


if __name__ == "__main__":
    sys.exit(main())
