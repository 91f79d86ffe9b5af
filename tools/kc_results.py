#!/usr/bin/env python3
"""Benchmark results of the Kernel Chapters course: tables, plots, checks and the README chapter map.

Reads the JSON that Google Benchmark (1.7, 1.8 and later) writes for the chapters' benchmark programs,
and the same schema written by ``tools/pytorch_baselines.py``. Benchmarks are named
``chNN/<variant>/<case>``; Google Benchmark may append ``/manual_time``, ``/real_time``,
``/iterations:N``, ``/repeats:N``, ``/min_time:X``, ``/threads:N``, which are ignored.

Subcommands (see ``--help`` of each, and tools/README.md):

* ``generate --results-dir DIR [--chapters ch01 ...]``: write ``chNN.md`` (and ``chNN.png`` when
  matplotlib is installed) for every ``chNN_bench.json`` in DIR.
* ``check --results-dir DIR [--readme README.md]``: regenerate in memory, diff with the files on
  disk, exit 1 when they differ.
* ``chapter-map --results-dir DIR --readme README.md [--check]``: rewrite (or compare) the block
  between ``<!-- chapter-map:begin -->`` and ``<!-- chapter-map:end -->`` in the README, and the
  lessons' generated parts.
* ``summary JSON_FILE...``: print a plain-text table of any benchmark JSON files.

``generate`` and ``check`` (its pages) work on the one folder DIR. The README and the lessons are
generated from one folder too, except that a chapter with ``"results_gpu": "h100"`` in
tools/chapters.json is read from the sibling folder of that name (``DIR/../h100``): its row, its lesson
block, its inline figures and any other lesson's figures of it, each naming that GPU where it differs.

Standard library only; matplotlib is imported lazily for the plots. Output is deterministic: the
same inputs always give the same bytes, because CI regenerates the tables and diffs them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CHAPTERS_JSON = os.path.join(TOOLS_DIR, "chapters.json")

MAP_BEGIN = "<!-- chapter-map:begin -->"
MAP_END = "<!-- chapter-map:end -->"

UNKNOWN = "unknown"
DASH = "—"

# Seconds per Google Benchmark time unit.
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}

# Path components Google Benchmark appends to a benchmark's name.
_SUFFIX_RE = re.compile(
    r"^(?:manual_time|real_time|process_time|cpu_time"
    r"|iterations:\d+|repeats:\d+|threads:\d+"
    r"|min_time:[0-9.eE+-]+[sx]?|min_warmup_time:[0-9.eE+-]+[sx]?)$"
)
_CHAPTER_RE = re.compile(r"^ch\d+$")
_STEP_RE = re.compile(r"^step(\d+)(?:_|$)")
_BENCH_FILE_RE = re.compile(r"^(ch\d+)_bench\.json$")
_FOLDER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_AGGREGATES = ("mean", "median", "stddev", "cv", "min", "max")


class ResultsError(Exception):
    """An input file is missing, unreadable or not of the expected form."""


# --------------------------------------------------------------------------------------------------
# Names and ordering


def strip_run_suffixes(name: str) -> str:
    """Returns ``name`` without the components Google Benchmark appends (``/manual_time``,
    ``/real_time``, ``/iterations:N``, ``/repeats:N``, ``/min_time:X``, ``/threads:N``, ...)."""
    parts = name.split("/")
    while len(parts) > 1 and _SUFFIX_RE.match(parts[-1]):
        parts.pop()
    return "/".join(parts)


def parse_run_name(name: str) -> Optional[Tuple[str, str, str]]:
    """Splits ``chNN/<variant>/<case>[/suffixes]`` into ``(chapter, variant, case)``.

    Returns None for a name that does not follow the course's convention. A case may itself
    contain ``/`` (for example arguments that Google Benchmark appended); it is kept whole.
    """
    parts = strip_run_suffixes(name).split("/")
    if len(parts) < 3 or not _CHAPTER_RE.match(parts[0]) or not parts[1] or not all(parts[2:]):
        return None
    return parts[0], parts[1], "/".join(parts[2:])


def natural_key(text: str) -> Tuple[Any, ...]:
    """Sort key that compares the numbers inside a label as numbers: N65536 < N268435456."""
    pieces = re.split(r"(\d+)", text)
    # Text and numbers alternate (text at even positions), so equal positions hold equal types.
    return tuple(int(p) if i % 2 else p for i, p in enumerate(pieces))


def variant_key(variant: str) -> Tuple[int, int, Tuple[Any, ...]]:
    """Sort key for variants: before, stepN_* (by N), after, other names alphabetically,
    vendor and vendor_*, pytorch and pytorch_*, limit."""
    if variant == "before":
        return (0, 0, ())
    step = _STEP_RE.match(variant)
    if step:
        return (1, int(step.group(1)), natural_key(variant))
    if variant == "after":
        return (2, 0, ())
    if variant == "vendor" or variant.startswith("vendor_"):
        return (4, 0, natural_key(variant))
    if variant == "pytorch" or variant.startswith("pytorch_"):
        return (5, 0, natural_key(variant))
    if variant == "limit":
        return (6, 0, ())
    return (3, 0, natural_key(variant))


# --------------------------------------------------------------------------------------------------
# Reading Google Benchmark JSON


@dataclass
class Measurement:
    """One benchmark (one run_name) reduced to what the tables show. Times are in seconds."""

    name: str  # run_name without Google Benchmark's suffixes
    chapter: Optional[str]
    variant: Optional[str]
    case: Optional[str]
    source: str  # file name the measurement came from
    time_s: Optional[float] = None  # median over repetitions
    mean_s: Optional[float] = None
    min_s: Optional[float] = None
    max_s: Optional[float] = None
    cv: Optional[float] = None  # coefficient of variation, a fraction (0.012 = 1.2 %)
    repetitions: Optional[int] = None
    bytes_per_second: Optional[float] = None  # median over repetitions
    flops: Optional[float] = None  # FLOP/s, median over repetitions
    error: Optional[str] = None  # set when the benchmark reported an error or was skipped
    # The benchmark's other user counters (median aggregate, or the first repetition), e.g. Chapter
    # 6's "waves" and "last_wave_utilisation": facts of the run, not rates.
    counters: Dict[str, float] = field(default_factory=dict)
    # Google Benchmark's label; tools/pytorch_baselines.py writes there the kernels one call launched,
    # joined by KERNEL_SEPARATOR.
    label: Optional[str] = None

    @property
    def measured(self) -> bool:
        """True when the benchmark produced a time."""
        return self.error is None and self.time_s is not None


@dataclass
class BenchFile:
    """The parsed content of one benchmark JSON file."""

    source: str
    context: Dict[str, Any]
    measurements: List[Measurement] = field(default_factory=list)

    @property
    def library_version(self) -> Optional[str]:
        """Google Benchmark's version when the file records it (1.9+ does; 1.7 and 1.8 do not)."""
        for key in ("library_version", "google_benchmark"):
            value = _clean(self.context.get(key))
            if value is not None:
                return value
        return None


def _to_float(value: Any) -> Optional[float]:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.replace(",", ""))
        except ValueError:
            return None
    else:
        return None
    return result if math.isfinite(result) else None


def _seconds(entry: Dict[str, Any], key: str = "real_time") -> Optional[float]:
    value = _to_float(entry.get(key))
    if value is None:
        return None
    unit = entry.get("time_unit", "ns")
    if unit not in TIME_UNITS:
        raise ResultsError("unknown time_unit %r in benchmark %r" % (unit, entry.get("name")))
    return value * TIME_UNITS[unit]


_median = statistics.median


def _sample_cv(values: Sequence[float]) -> Optional[float]:
    """Sample standard deviation over the mean (n - 1, as Google Benchmark's cv)."""
    if len(values) < 2:
        return 0.0 if values else None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def _base_run_name(entry: Dict[str, Any]) -> str:
    run_name = entry.get("run_name")
    if isinstance(run_name, str) and run_name:
        return run_name
    name = str(entry.get("name", ""))
    aggregate = entry.get("aggregate_name")
    if entry.get("run_type") == "aggregate" and aggregate and name.endswith("_" + aggregate):
        return name[: -len(aggregate) - 1]
    return name


# Keys of a Google Benchmark entry that are not user counters.
_NOT_COUNTERS = {"name", "family_index", "per_family_instance_index", "run_name", "run_type", "repetitions",
                 "repetition_index", "threads", "iterations", "real_time", "cpu_time", "time_unit",
                 "aggregate_name", "aggregate_unit", "bytes_per_second", "items_per_second", "flops",
                 "error_occurred", "error_message", "skipped", "skip_message", "label"}


def _user_counters(entry: Dict[str, Any]) -> Dict[str, float]:
    """The numeric user counters of one benchmark entry."""
    found = {}
    for key, value in entry.items():
        if key in _NOT_COUNTERS or isinstance(value, bool):
            continue
        number = _to_float(value)
        if number is not None:
            found[key] = number
    return found


def _measurement_from(run_name: str, source: str, aggregates: Dict[str, Dict[str, Any]],
                      iterations: List[Dict[str, Any]], errors: List[str]) -> Measurement:
    parsed = parse_run_name(run_name)
    chapter, variant, case = parsed if parsed else (None, None, None)
    m = Measurement(name=strip_run_suffixes(run_name), chapter=chapter, variant=variant, case=case,
                    source=source)
    central = aggregates.get("median") or aggregates.get("mean")
    if central is not None:
        m.time_s = _seconds(central)
        m.mean_s = _seconds(aggregates["mean"]) if "mean" in aggregates else None
        m.min_s = _seconds(aggregates["min"]) if "min" in aggregates else None
        m.max_s = _seconds(aggregates["max"]) if "max" in aggregates else None
        if "cv" in aggregates:
            # Google Benchmark writes the cv aggregate as a fraction (aggregate_unit "percentage").
            m.cv = _to_float(aggregates["cv"].get("real_time"))
        elif "stddev" in aggregates and m.mean_s:
            stddev = _seconds(aggregates["stddev"])
            m.cv = stddev / m.mean_s if stddev is not None else None
        reps = central.get("repetitions")
        m.repetitions = int(reps) if isinstance(reps, (int, float)) and not isinstance(reps, bool) else None
        m.bytes_per_second = _to_float(central.get("bytes_per_second"))
        m.flops = _to_float(central.get("flops"))
        m.counters = _user_counters(central)
        m.label = _clean(central.get("label")) or None
    elif iterations:
        times = [t for t in (_seconds(e) for e in iterations) if t is not None]
        if times:
            m.time_s = _median(times)
            m.mean_s = sum(times) / len(times)
            m.min_s, m.max_s = min(times), max(times)
            m.cv = _sample_cv(times)
            m.repetitions = len(times)
        for key in ("bytes_per_second", "flops"):
            values = [v for v in (_to_float(e.get(key)) for e in iterations) if v is not None]
            if values:
                setattr(m, key, _median(values))
        m.counters = _user_counters(iterations[0])
        m.label = _clean(iterations[0].get("label")) or None
    if not m.measured:
        m.time_s = None
        m.error = errors[0] if errors else "no time reported"
    return m


def parse_benchmark_json(doc: Dict[str, Any], source: str = "<json>") -> BenchFile:
    """Reduces a Google Benchmark JSON document to one Measurement per benchmark (run_name).

    Uses the aggregates (median, mean, min, max, cv) when the run has them, else the individual
    repetitions. A benchmark that reported an error or was skipped becomes a Measurement with
    ``error`` set. Rates (``bytes_per_second``, ``flops``) are taken from the median aggregate:
    Google Benchmark 1.7 and 1.8 divide them by the manual time for benchmarks that use it.
    """
    if not isinstance(doc, dict):
        raise ResultsError("%s: not a Google Benchmark JSON object" % source)
    context = doc.get("context") if isinstance(doc.get("context"), dict) else {}
    entries = doc.get("benchmarks", [])
    if not isinstance(entries, list):
        raise ResultsError("%s: 'benchmarks' is not a list" % source)
    order: List[str] = []
    aggregates: Dict[str, Dict[str, Dict[str, Any]]] = {}
    iterations: Dict[str, List[Dict[str, Any]]] = {}
    errors: Dict[str, List[str]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        run_name = _base_run_name(entry)
        if run_name not in aggregates:
            order.append(run_name)
            aggregates[run_name], iterations[run_name], errors[run_name] = {}, [], []
        if entry.get("error_occurred") or entry.get("skipped"):
            message = entry.get("error_message") or entry.get("skip_message") or "skipped"
            if message not in errors[run_name]:
                errors[run_name].append(str(message))
        elif entry.get("run_type") == "aggregate":
            aggregates[run_name][str(entry.get("aggregate_name"))] = entry
        else:
            iterations[run_name].append(entry)
    result = BenchFile(source=source, context=context)
    for run_name in order:
        result.measurements.append(
            _measurement_from(run_name, source, aggregates[run_name], iterations[run_name], errors[run_name]))
    return result


def load_benchmark_file(path: str) -> BenchFile:
    """Reads and parses one benchmark JSON file (see parse_benchmark_json)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ResultsError("cannot read %s: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise ResultsError("%s is not valid JSON: %s" % (path, e))
    return parse_benchmark_json(doc, os.path.basename(path))


# --------------------------------------------------------------------------------------------------
# Chapters, metadata


@dataclass
class Chapter:
    """One entry of tools/chapters.json."""

    id: str
    dir: str
    title: str
    headline_case: Optional[str] = None
    headline_variant: str = "after"
    headline_reference: str = "limit"
    metric: str = "bandwidth"  # "bandwidth" or "flops"
    reference_label: Optional[str] = None
    baseline: str = "before"  # the variant the speed-up column divides by (Chapter 2: step1_naive)
    # The results folder this chapter is read from, a sibling of the one the README and lessons are
    # generated from (Chapter 8: "h100", measured only there); None: that folder itself.
    results_gpu: Optional[str] = None
    # The cases the lesson's results block shows (the chapter's page in the results folder shows them
    # all); None: every case.
    lesson_cases: Optional[Tuple[str, ...]] = None
    # A sweep over one size (Chapter 9: tokens per expert): plotted as time against that size in
    # chNN_sweep.png; None: no such plot.
    sweep: Optional["Sweep"] = None
    # Where the time goes (Chapter 10: the layer's stages): one panel per case, a stacked bar per
    # variant from its stage_<name>_us counters, in chNN_stages.png; None: no such plot.
    stages: Optional["StageBreakdown"] = None


@dataclass
class StageBreakdown:
    """chapters.json "stages": the cases and variants whose stage_<name>_us counters are stacked, the
    stages in order, and the reference variant drawn as a line across each panel."""

    cases: Tuple[str, ...]
    variants: Tuple[str, ...]
    stages: Tuple[str, ...]
    reference: Optional[str] = None


def _load_stages(path: str, chapter_id: str, item: Any) -> Optional[StageBreakdown]:
    """Parses a chapter's "stages" object (see StageBreakdown); None when absent."""
    if item is None:
        return None
    problem = "%s: %s stages must be {cases: [labels], variants: [names], stages: [names][, reference: name]}" \
              % (path, chapter_id)
    if not isinstance(item, dict):
        raise ResultsError(problem)
    lists = [item.get(key) for key in ("cases", "variants", "stages")]
    reference = item.get("reference")
    if (not all(isinstance(v, list) and v and all(isinstance(x, str) and x for x in v) for v in lists)
            or (reference is not None and (not isinstance(reference, str) or not reference))):
        raise ResultsError(problem)
    return StageBreakdown(tuple(lists[0]), tuple(lists[1]), tuple(lists[2]), reference)


@dataclass
class Sweep:
    """chapters.json "sweep": the cases of a one-size sweep, the size of each (the x axis), its name
    and the variants plotted."""

    cases: Tuple[str, ...]
    x: Tuple[float, ...]
    x_label: str
    variants: Tuple[str, ...]


def _load_sweep(path: str, chapter_id: str, item: Any) -> Optional[Sweep]:
    """Parses a chapter's "sweep" object (see Sweep); None when absent."""
    if item is None:
        return None
    problem = "%s: %s sweep must be {cases: [labels], x: [numbers, one per case], x_label: text, " \
              "variants: [names]}" % (path, chapter_id)
    if not isinstance(item, dict):
        raise ResultsError(problem)
    cases, xs, label, variants = item.get("cases"), item.get("x"), item.get("x_label"), item.get("variants")
    if (not isinstance(cases, list) or not cases or not all(isinstance(c, str) and c for c in cases)
            or not isinstance(xs, list) or len(xs) != len(cases)
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in xs)
            or not isinstance(label, str) or not label
            or not isinstance(variants, list) or not variants
            or not all(isinstance(v, str) and v for v in variants)):
        raise ResultsError(problem)
    return Sweep(tuple(cases), tuple(float(x) for x in xs), label, tuple(variants))


def load_chapters(path: str = DEFAULT_CHAPTERS_JSON) -> List[Chapter]:
    """Reads the chapter list (tools/chapters.json): a JSON list of objects with id, dir, title,
    headline {case, variant, reference, metric[, reference_label]} and optional baseline and
    results_gpu (see chapter_results_dir)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ResultsError("cannot read %s: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise ResultsError("%s is not valid JSON: %s" % (path, e))
    if not isinstance(doc, list):
        raise ResultsError("%s: expected a JSON list of chapters" % path)
    chapters = []
    for i, item in enumerate(doc):
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("id", "dir", "title")):
            raise ResultsError("%s: chapter %d needs string fields id, dir and title" % (path, i))
        if not _CHAPTER_RE.match(item["id"]):
            raise ResultsError("%s: chapter id %r must look like ch01" % (path, item["id"]))
        headline = item.get("headline") or {}
        metric = headline.get("metric", "bandwidth")
        if metric not in ("bandwidth", "flops"):
            raise ResultsError("%s: %s headline metric %r must be 'bandwidth' or 'flops'" % (path, item["id"], metric))
        results_gpu = item.get("results_gpu")
        if results_gpu is not None and (not isinstance(results_gpu, str) or not _FOLDER_RE.match(results_gpu)
                                        or results_gpu in (".", "..")):
            raise ResultsError("%s: %s results_gpu %r must be the name of a folder beside the results folder, "
                               "e.g. \"h100\"" % (path, item["id"], results_gpu))
        lesson_cases = item.get("lesson_cases")
        if lesson_cases is not None and (not isinstance(lesson_cases, list) or not lesson_cases
                                         or not all(isinstance(c, str) and c for c in lesson_cases)):
            raise ResultsError("%s: %s lesson_cases must be a non-empty list of case labels" % (path, item["id"]))
        chapters.append(Chapter(
            id=item["id"], dir=item["dir"], title=item["title"],
            headline_case=headline.get("case"),
            headline_variant=headline.get("variant", "after"),
            headline_reference=headline.get("reference", "limit"),
            metric=metric,
            reference_label=headline.get("reference_label"),
            baseline=item.get("baseline", "before"),
            results_gpu=results_gpu,
            lesson_cases=tuple(lesson_cases) if lesson_cases is not None else None,
            sweep=_load_sweep(path, item["id"], item.get("sweep")),
            stages=_load_stages(path, item["id"], item.get("stages")),
        ))
    return chapters


def load_metadata(results_dir: str, chapter_id: Optional[str] = None) -> Dict[str, Any]:
    """Reads the run metadata of a results folder: ``chNN_metadata.json`` (the run that measured
    that chapter, written by tools/import_gpu_run.sh) when ``chapter_id`` is given and it exists,
    else ``metadata.json`` (the latest run); a missing file gives an empty dict."""
    path = os.path.join(results_dir, "metadata.json")
    if chapter_id is not None and os.path.isfile(os.path.join(results_dir, "%s_metadata.json" % chapter_id)):
        path = os.path.join(results_dir, "%s_metadata.json" % chapter_id)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ResultsError("cannot read %s: %s" % (path, e))
    if not isinstance(doc, dict):
        raise ResultsError("%s: expected a JSON object" % path)
    return doc


def _clean(value: Any) -> Optional[str]:
    """A metadata or context value as display text; None when absent, empty or 'unknown'."""
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else "%g" % value
    text = str(value).strip()
    if not text or text.lower() in ("unknown", "n/a", "none", "null"):
        return None
    return text


# Display field -> (keys in a benchmark's context, keys in metadata.json[, context keys used only
# after metadata.json]). The chapter's own JSON context wins (it was recorded with those very
# numbers); metadata.json of the run fills the gaps. The memory clock that nvidia-smi reads during
# the run (metadata) is preferred over the device's maximum that the benchmark records.
_FIELDS: List[Tuple[str, ...]] = [
    ("date", ("date",), ("date",)),
    ("commit", ("commit", "git_commit"), ("commit",)),
    ("gpu", ("gpu", "gpu_name"), ("gpu",)),
    ("gpu_arch", ("gpu_arch",), ("gpu_arch",)),
    ("gpu_sms", ("gpu_sms", "sm_count"), ("gpu_sms",)),
    ("gpu_l2_bytes", ("gpu_l2_bytes", "l2_bytes"), ("gpu_l2_bytes",)),
    ("driver", ("driver", "driver_version"), ("driver",)),
    ("cuda", ("cuda", "cuda_runtime"), ("cuda",)),
    ("sm_clock_mhz_under_load", ("sm_clock_mhz_under_load",), ("sm_clock_mhz_under_load",)),
    ("sm_clock_max_mhz", ("sm_clock_max_mhz", "gpu_sm_clock_max_mhz"), ("sm_clock_max_mhz",)),
    ("mem_clock_mhz", ("mem_clock_mhz",), ("mem_clock_mhz",), ("gpu_mem_clock_max_mhz",)),
    ("power_limit_w", ("power_limit_w",), ("power_limit_w",)),
    ("google_benchmark", ("library_version", "google_benchmark"), ("google_benchmark",)),
    ("notes", (), ("notes",)),
]


def merge_metadata(metadata: Optional[Dict[str, Any]], contexts: Iterable[Dict[str, Any]]) -> Dict[str, str]:
    """Merges a run's metadata.json with benchmark JSON contexts into display strings.

    For each field the first context that has a usable value wins, then metadata.json; a field
    found nowhere is "unknown". Values "", "unknown", "n/a" count as absent. Returns a dict with the
    keys date, commit, gpu, gpu_arch, gpu_sms, gpu_l2_bytes, driver, cuda, sm_clock_mhz_under_load,
    sm_clock_max_mhz, mem_clock_mhz, power_limit_w, google_benchmark and notes.
    """
    metadata = metadata or {}
    contexts = [c for c in contexts if isinstance(c, dict)]
    def from_contexts(keys: Sequence[str]) -> Optional[str]:
        for context in contexts:
            for key in keys:
                value = _clean(context.get(key))
                if value is not None:
                    return value
        return None

    merged: Dict[str, str] = {}
    for entry in _FIELDS:
        name, context_keys, metadata_keys = entry[0], entry[1], entry[2]
        late_keys = entry[3] if len(entry) > 3 else ()
        value = from_contexts(context_keys)
        if value is None:
            value = next((v for v in (_clean(metadata.get(k)) for k in metadata_keys) if v is not None), None)
        if value is None:
            value = from_contexts(late_keys)
        merged[name] = value if value is not None else UNKNOWN
    return merged


# --------------------------------------------------------------------------------------------------
# Number formatting (fixed, so the output is byte-for-byte reproducible)


def format_sig(value: float) -> str:
    """At least three significant digits, no exponent: 0.0123, 1.23, 12.3, 123, 4214."""
    a = abs(value)
    if a == 0:
        return "0"
    if a >= 99.95:
        return "%.0f" % value
    if a >= 9.995:
        return "%.1f" % value
    if a >= 0.9995:
        return "%.2f" % value
    if a >= 0.09995:
        return "%.3f" % value
    return "%.3g" % value


def time_unit_for(seconds: float) -> Tuple[str, float]:
    """The display unit for a time: ns below 1 µs, µs below 1 ms, ms below 1 s, else s."""
    if seconds < 0.9995e-6:
        return "ns", 1e-9
    if seconds < 0.9995e-3:
        return "µs", 1e-6
    if seconds < 0.9995:
        return "ms", 1e-3
    return "s", 1.0


def format_time(seconds: Optional[float]) -> str:
    """A time with an automatic unit: '6.44 µs', '103 µs', '1.25 ms'."""
    if seconds is None:
        return DASH
    unit, scale = time_unit_for(seconds)
    return "%s %s" % (format_sig(seconds / scale), unit)


def format_spread(m: Measurement) -> str:
    """'min–max unit, cv x.x%' in the unit of the median."""
    if m.time_s is None:
        return DASH
    unit, scale = time_unit_for(m.time_s)
    parts = []
    if m.min_s is not None and m.max_s is not None:
        parts.append("%s–%s %s" % (format_sig(m.min_s / scale), format_sig(m.max_s / scale), unit))
    if m.cv is not None:
        parts.append("cv %.1f%%" % (m.cv * 100.0))
    return ", ".join(parts) if parts else DASH


def format_bandwidth(bytes_per_second: Optional[float]) -> str:
    """Bytes per second with an automatic unit: '4.21 TB/s', '812 GB/s', '3.10 MB/s' (SI units)."""
    if bytes_per_second is None:
        return DASH
    for scale, unit in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s")):
        if bytes_per_second >= 0.9995 * scale:
            return "%s %s" % (format_sig(bytes_per_second / scale), unit)
    return "%s kB/s" % format_sig(bytes_per_second / 1e3)


def format_flops(flops: Optional[float]) -> str:
    """FLOP/s with an automatic unit: '745 TFLOP/s', '51.2 TFLOP/s', '812 GFLOP/s'."""
    if flops is None:
        return DASH
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s")):
        if flops >= 0.9995 * scale:
            return "%s %s" % (format_sig(flops / scale), unit)
    return "%s MFLOP/s" % format_sig(flops / 1e6)


def _format_bytes(value: str) -> str:
    number = _to_float(value)
    if number is None:
        return value
    scale, unit = next(((s, u) for s, u in ((2 ** 30, "GiB"), (2 ** 20, "MiB")) if number >= s), (2 ** 10, "KiB"))
    value = number / scale
    return "%s %s" % ("%d" % value if value.is_integer() else format_sig(value), unit)


def _throughput(m: Measurement, metric: str) -> Optional[float]:
    return m.flops if metric == "flops" else m.bytes_per_second


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


# --------------------------------------------------------------------------------------------------
# One chapter's results


@dataclass
class ChapterResults:
    """Everything read for one chapter from a results folder."""

    chapter_id: str
    files: List[BenchFile]
    metadata: Dict[str, Any]
    has_metadata_file: bool
    #: chNN_profile.txt, parsed (parse_profile_text): benchmark name -> metric label -> value text
    profile: Dict[str, Dict[str, str]] = field(default_factory=dict)

    @property
    def measurements(self) -> List[Measurement]:
        """Measurements of this chapter from all its files; the first file wins on duplicates."""
        seen = set()
        result = []
        for bench_file in self.files:
            for m in bench_file.measurements:
                if m.chapter != self.chapter_id:
                    continue
                key = (m.variant, m.case)
                if key in seen:
                    continue
                seen.add(key)
                result.append(m)
        return result

    def find(self, case: Optional[str], variant: str) -> Optional[Measurement]:
        """The measured result of ``variant`` for ``case``, or None."""
        for m in self.measurements:
            if m.case == case and m.variant == variant and m.measured:
                return m
        return None

    def info(self) -> Dict[str, str]:
        """Run information (see merge_metadata) for this chapter."""
        return merge_metadata(self.metadata, [f.context for f in self.files])


def chapter_files(results_dir: str, chapter_id: str) -> List[str]:
    """The input files of a chapter that exist in ``results_dir``: chNN_bench.json, then
    chNN_pytorch.json."""
    names = ["%s_bench.json" % chapter_id, "%s_pytorch.json" % chapter_id]
    return [os.path.join(results_dir, n) for n in names if os.path.isfile(os.path.join(results_dir, n))]


def measured_chapter_ids(results_dir: str) -> List[str]:
    """Chapter ids that have a chNN_bench.json in ``results_dir``, in natural order."""
    if not os.path.isdir(results_dir):
        return []
    ids = [m.group(1) for m in (_BENCH_FILE_RE.match(n) for n in os.listdir(results_dir)) if m]
    return sorted(ids, key=natural_key)


def load_chapter_results(results_dir: str, chapter_id: str,
                         metadata: Optional[Dict[str, Any]] = None) -> Optional[ChapterResults]:
    """Reads a chapter's files from ``results_dir``; None when it has no chNN_bench.json."""
    paths = chapter_files(results_dir, chapter_id)
    if not paths or not paths[0].endswith("_bench.json"):
        return None
    own = os.path.isfile(os.path.join(results_dir, "%s_metadata.json" % chapter_id))
    if metadata is None or own:  # the chapter's own run wins over the folder's latest
        metadata = load_metadata(results_dir, chapter_id)
    has_metadata = own or os.path.isfile(os.path.join(results_dir, "metadata.json"))
    profile = parse_profile_text(read_text(os.path.join(results_dir, chapter_id + "_profile.txt")) or "")
    return ChapterResults(chapter_id, [load_benchmark_file(p) for p in paths], metadata, has_metadata, profile)


def parse_profile_text(text: str) -> Dict[str, Dict[str, str]]:
    """The metrics of a chNN_profile.txt (tools/kc_profile.py's output, one ``## chNN/variant/case``
    section per case): benchmark name -> metric label ("DRAM read") -> its text ("16.2 GB"). Where a
    section lists several kernels, the first kernel's value of a label is kept."""
    profile: Dict[str, Dict[str, str]] = {}
    section: Optional[Dict[str, str]] = None
    for line in text.splitlines():
        if line.startswith("## "):
            section = profile.setdefault(line[3:].strip(), {})
            continue
        mt = re.match(r"^  (\S.*?)\s{2,}(\S.*)$", line)
        if section is not None and mt:
            section.setdefault(mt.group(1), mt.group(2).strip())
    return profile


def chapter_results_dir(results_dir: str, chapter: Optional[Chapter]) -> str:
    """The folder a chapter's results are read from when the README and the lessons are generated
    from ``results_dir``: ``results_dir`` itself, or for a chapter with ``results_gpu`` the sibling
    folder of that name (``docs/results/h200`` and "h100" give ``docs/results/h100``)."""
    if chapter is None or not chapter.results_gpu:
        return results_dir
    return os.path.join(os.path.dirname(os.path.normpath(results_dir)), chapter.results_gpu)


def same_folder(a: str, b: str) -> bool:
    """Whether two paths name the same folder."""
    return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def quoted_results(results_dir: str, chapter: Chapter,
                   metadata: Optional[Dict[str, Any]] = None) -> Optional[ChapterResults]:
    """A chapter's results as the README and the lessons quote them, read from
    chapter_results_dir(); ``metadata`` (``results_dir``'s metadata.json) applies only to a chapter
    read from ``results_dir`` itself."""
    folder = chapter_results_dir(results_dir, chapter)
    return load_chapter_results(folder, chapter.id, metadata if same_folder(folder, results_dir) else None)


def folder_gpu(folder: str, results: Optional[ChapterResults] = None) -> str:
    """The GPU a folder's figures come from, as generated text names it: the GPU that ``results``
    (a chapter of that folder) recorded, else the folder's metadata.json's, else the folder's name in
    capitals ("H100")."""
    gpu = _clean(results.info()["gpu"]) if results is not None else None
    if gpu is None:
        gpu = _clean(load_metadata(folder).get("gpu"))
    return gpu or os.path.basename(os.path.normpath(folder)).upper()


def table_metric(chapter: Optional[Chapter], results: ChapterResults) -> str:
    """'bandwidth' or 'flops': the chapter's headline metric, else 'flops' when any result has a
    flops counter."""
    if chapter is not None:
        return chapter.metric
    return "flops" if any(m.flops is not None for m in results.measurements) else "bandwidth"


def _run_lines(results: ChapterResults) -> List[str]:
    info = results.info()
    gpu = info["gpu"]
    details = []
    if info["gpu_arch"] != UNKNOWN:
        details.append(info["gpu_arch"])
    if info["gpu_sms"] != UNKNOWN:
        details.append("%s SMs" % info["gpu_sms"])
    if info["gpu_l2_bytes"] != UNKNOWN:
        details.append("%s L2" % _format_bytes(info["gpu_l2_bytes"]))
    if details:
        gpu += " (%s)" % ", ".join(details)
    reps = sorted({m.repetitions for m in results.measurements if m.measured and m.repetitions})
    if not reps:
        repetitions = UNKNOWN
    elif len(reps) == 1:
        repetitions = str(reps[0])
    else:
        repetitions = "%d–%d" % (reps[0], reps[-1])

    def mhz(value: str) -> str:
        return value if value == UNKNOWN else value + " MHz"

    power = info["power_limit_w"] if info["power_limit_w"] == UNKNOWN else info["power_limit_w"] + " W"
    gbench = info["google_benchmark"]
    if gbench == UNKNOWN:
        gbench = "version not recorded"
    lines = [
        "- **GPU:** %s; driver %s; CUDA %s" % (gpu, info["driver"], info["cuda"]),
        "- **Clocks:** SM %s (nvidia-smi's median over the benchmark run, max %s; a heavy kernel's own clock "
        "is in the chapter's profile), memory %s; power limit %s"
        % (mhz(info["sm_clock_mhz_under_load"]), mhz(info["sm_clock_max_mhz"]), mhz(info["mem_clock_mhz"]), power),
        "- **Run:** %s, commit %s" % (info["date"], info["commit"]),
        "- **Method:** median of %s repetitions (Google Benchmark, %s); time from CUDA events"
        % (repetitions, gbench),
    ]
    for bench_file in results.files[1:]:
        library = _clean(bench_file.context.get("library"))
        if library:
            lines.append("- **Baseline:** %s (from %s); %s" % (library, bench_file.source,
                                                              _baseline_timing(bench_file.context)))
    if info["notes"] != UNKNOWN:
        lines.append("- **Notes:** %s" % info["notes"])
    return lines


# A baseline file's context "timing" when its `pytorch` rows replay a CUDA graph of the calls and its
# `pytorch_eager` rows launch them one by one.
GRAPH_REPLAY_TIMING = "graph_replay"


def _baseline_timing(context: Dict[str, Any]) -> str:
    """How a baseline file's samples were timed, from its context: pytorch_baselines.py records
    ``min_time_s`` since it times each sample for that long, and ``timing`` (GRAPH_REPLAY_TIMING)
    where its rows replay a CUDA graph; files without ``min_time_s`` were timed in short bursts,
    which read fast wherever the GPU is power-bound (tools/README.md)."""
    min_time = _clean(context.get("min_time_s"))
    if min_time and _clean(context.get("timing")) == GRAPH_REPLAY_TIMING:
        return ("`pytorch`: each sample at least %s s of GPU time in replays of a CUDA graph of the calls, the L2 "
                "emptied before each replay (the GPU's time, without the host's dispatch); `pytorch_eager`: the "
                "same calls launched one by one from Python, each sample as long" % min_time)
    if min_time:
        return "each sample at least %s s of GPU time, as the C++ repetitions" % min_time
    return "timed in bursts of a few milliseconds (the older method: fast where the GPU is power-bound)"


# How a baseline entry's label joins the kernels of one call (tools/pytorch_baselines.py writes it).
KERNEL_SEPARATOR = " → "
# How a label marks one kernel launched several times back to back: "name × 2" (two launches).
KERNEL_REPEAT = " × "


def _split_repeat(item: str) -> Tuple[str, Optional[str]]:
    """One kernel of a label as its name and its repeat count ("name × 2" → ("name", "2")); the
    count is None for a kernel launched once."""
    name, mark, count = item.rpartition(KERNEL_REPEAT)
    return (name, count) if mark and count.isdigit() else (item, None)


# How torch.profiler prefixes a kernel in an anonymous namespace ("{anonymous}::softmax_warp_forward").
ANONYMOUS_SCOPE = "{anonymous}::"


def _kernel_cell(item: str) -> str:
    """One kernel of a label as the results page shows it: its name in code type, and a repeat
    count after it, outside the code type. A kernel in an anonymous namespace shows without its
    "{anonymous}::" prefix: it names no scope a reader can use, and Doxygen reads "}::name" as a
    link request it cannot resolve."""
    name, count = _split_repeat(item)
    name = name.replace(ANONYMOUS_SCOPE, "")
    return "`%s`" % name if count is None else "`%s`%s%s" % (name, KERNEL_REPEAT, count)


def _baseline_kernel_lines(results: ChapterResults, shown: Optional[Sequence[str]] = None) -> List[str]:
    """What the baseline rows ran: for each baseline file (chNN_pytorch.json) whose entries carry
    the kernels one call launched (their label), a table of the distinct kernel sequences (a kernel
    launched n times in a row shown once with "× n") and the cases that ran each, then a line naming
    the cases whose call copies to the host (a round trip in their rows). Nothing for files without
    labels (those written before the labels were)."""
    lines: List[str] = []
    for bench_file in results.files[1:]:
        runs: Dict[str, List[str]] = {}
        variants = set()
        for m in bench_file.measurements:
            if m.chapter != results.chapter_id or not m.measured or not m.label or m.case is None:
                continue
            if shown is not None and m.case not in shown:
                continue
            cases = runs.setdefault(m.label, [])
            if m.case not in cases:  # two variants of one case (pytorch, pytorch_eager) ran the same call
                cases.append(m.case)
            variants.add(m.variant)
        if not runs:
            continue
        names = ", ".join("`%s`" % v for v in sorted(v for v in variants if v))
        # Labels written before repeats were counted (each name once) read as they always did.
        repeats = any(_split_repeat(k)[1] for label in runs for k in label.split(KERNEL_SEPARATOR))
        lines += ["", "What the %s rows ran: the kernels of one call of each case, in launch order%s, as "
                  "`torch.profiler` named them (shortened: no template arguments; a CUTLASS kernel by its "
                  "schedule and its MMA instruction)."
                  % (names, " (× n: n launches of that kernel in a row)" if repeats else ""), "",
                  "| Kernels | Cases |", "|---|---|"]
        for label, cases in sorted(runs.items(), key=lambda item: natural_key(min(item[1], key=natural_key))):
            kernels = KERNEL_SEPARATOR.join(_kernel_cell(k) for k in label.split(KERNEL_SEPARATOR))
            lines.append("| %s | %s |" % (kernels, ", ".join("`%s`" % c for c in sorted(cases, key=natural_key))))
        waiting = sorted((c for label, cases in runs.items() if _waits_on_the_host(label) for c in cases),
                         key=natural_key)
        if waiting:
            every = len(waiting) == sum(len(cases) for cases in runs.values())
            lines += ["", "%s copies from the device to the host (`%s`), so the host waits for the GPU "
                      "mid-call and the GPU then waits for the host's next launches: %s that round trip."
                      % ("Every case's call" if every else "The call of %s" % ", ".join("`%s`" % c for c in waiting),
                         DEVICE_TO_HOST_COPY, "every row includes" if every else "their rows include")]
    return lines


# How torch.profiler names a copy from the device to the host; in a call, it means the host waits.
DEVICE_TO_HOST_COPY = "Memcpy DtoH"


def _waits_on_the_host(label: str) -> bool:
    """Whether a baseline's kernel label has a device-to-host copy among its kernels."""
    return any(k.startswith(DEVICE_TO_HOST_COPY) for k in label.split(KERNEL_SEPARATOR))


def render_chapter_markdown(results: ChapterResults, chapter: Optional[Chapter] = None,
                            shown: Optional[Sequence[str]] = None) -> str:
    """The generated Markdown page of one chapter: a provenance comment, a heading, the run
    context, one table (rows grouped by case, in natural order; variants in course order), what the
    baseline rows ran where their files say, and what was not measured. ``shown``: only these cases
    (a lesson's lesson_cases); None: all."""
    metric = table_metric(chapter, results)
    sources = [f.source for f in results.files]
    if results.has_metadata_file:
        sources.append("metadata.json")
    title = "%s · %s" % (results.chapter_id, chapter.title) if chapter else results.chapter_id
    info = results.info()
    lines = [
        "<!-- Generated by tools/kc_results.py from %s in this folder. Do not edit by hand: "
        "regenerate with `python3 tools/kc_results.py generate --results-dir <this folder>`. -->"
        % ", ".join(sources),
        "",
        "# %s: measured results%s" % (title, "" if info["gpu"] == UNKNOWN else " on " + info["gpu"]),
        "",
    ]
    lines += _run_lines(results)
    lines.append("")

    measured = [m for m in results.measurements if m.measured and (shown is None or m.case in shown)]
    if metric == "flops":
        unit_header = "TFLOP/s"
        explain = ("TFLOP/s counts the case's useful floating-point operations. \"× limit\" is that over "
                   "the `limit` variant's (the measured hardware ceiling the chapter names, same run).")
    else:
        unit_header = "GB/s"
        explain = ("GB/s counts the case's fewest bytes (each input read once, each output written once), "
                   "the same for every variant, so the column compares across variants; only `limit` counts "
                   "the bytes it really moves. \"× limit\" is the variant's GB/s over `limit`'s (same case, "
                   "same run).")
    baseline = chapter.baseline if chapter else "before"
    has_vendor = any(m.variant == "vendor" for m in measured)
    if has_vendor:
        explain += " \"× vendor\" is the variant's %s over the `vendor` variant's (same case, same run)." % unit_header
    lines += [
        "Median time over the repetitions; spread is the fastest and slowest repetition and the "
        "coefficient of variation. " + explain + " Speed-up is `%s`'s median time over the variant's." % baseline,
        "",
    ]
    if not measured:
        lines.append("No variant of this chapter produced a time.")
    else:
        vendor_header = " × vendor |" if has_vendor else ""
        vendor_rule = "---:|" if has_vendor else ""
        lines += [
            "| Case | Variant | Median time | Spread (min–max, cv) | %s | × limit |%s Speed-up vs %s |"
            % (unit_header, vendor_header, baseline),
            "|---|---|---:|---|---:|---:|%s---:|" % vendor_rule,
        ]
        cases = sorted({m.case for m in measured}, key=natural_key)
        for case in cases:
            rows = sorted((m for m in measured if m.case == case), key=lambda m: variant_key(m.variant))
            limit = results.find(case, "limit")
            vendor = results.find(case, "vendor")
            before = results.find(case, baseline)
            for i, m in enumerate(rows):
                value = _throughput(m, metric)
                if value is None:
                    throughput = DASH
                else:
                    throughput = format_sig(value / (1e12 if metric == "flops" else 1e9))
                fraction = _ratio(value, _throughput(limit, metric) if limit else None)
                of_vendor = _ratio(value, _throughput(vendor, metric) if vendor else None)
                speedup = _ratio(before.time_s, m.time_s) if before else None
                vendor_cell = (" %s |" % (DASH if of_vendor is None else "%.2f" % of_vendor)) if has_vendor else ""
                lines.append("| %s | %s | %s | %s | %s | %s |%s %s |" % (
                    "`%s`" % case if i == 0 else "",
                    "`%s`" % m.variant,
                    format_time(m.time_s),
                    format_spread(m),
                    throughput,
                    DASH if fraction is None else "%.2f" % fraction,
                    vendor_cell,
                    DASH if speedup is None else "%.2f×" % speedup,
                ))
    lines += _baseline_kernel_lines(results, shown)
    failed = [m for m in results.measurements if not m.measured and (shown is None or m.case in shown)]
    if failed:
        lines += ["", "Not measured:", ""]
        for m in sorted(failed, key=lambda m: (natural_key(m.case or ""), variant_key(m.variant or ""))):
            lines.append("- `%s` at `%s`: %s" % (m.variant, m.case, m.error))
    return "\n".join(lines) + "\n"


def plotted_cases(results: ChapterResults, metric: str) -> List[str]:
    """The cases the plot shows, in natural order: those with a throughput (GB/s or TFLOP/s) for at
    least one variant. Cases measured in other units (Chapter 4's warp-primitive costs, which have
    only cycle counters) stay in the table and out of the plot."""
    measured = [m for m in results.measurements if m.measured and _throughput(m, metric) is not None]
    return sorted({m.case for m in measured}, key=natural_key)


def render_plot(results: ChapterResults, chapter: Optional[Chapter], path: str) -> bool:
    """Writes a PNG of throughput per case, one line per variant. Returns False (writing nothing)
    when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: WPS433 (optional dependency, imported lazily)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    metric = table_metric(chapter, results)
    measured = [m for m in results.measurements if m.measured]
    cases = plotted_cases(results, metric)
    variants = sorted({m.variant for m in measured}, key=variant_key)
    scale, unit = (1e12, "TFLOP/s") if metric == "flops" else (1e9, "GB/s")
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(cases) + 3.5), 4.5))
    for variant in variants:
        xs, ys = [], []
        for x, case in enumerate(cases):
            m = results.find(case, variant)
            value = _throughput(m, metric) if m else None
            if value is not None:
                xs.append(x)
                ys.append(value / scale)
        if xs:
            style = {"linestyle": "--", "color": "black"} if variant == "limit" else {}
            ax.plot(xs, ys, marker="o", label=variant, **style)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(unit + (" (fewest bytes)" if metric == "bandwidth" else ""))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    info = results.info()
    title = "%s · %s" % (results.chapter_id, chapter.title) if chapter else results.chapter_id
    ax.set_title(title + ("" if info["gpu"] == UNKNOWN else " on " + info["gpu"]))
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return True


def render_sweep_plot(results: ChapterResults, chapter: Chapter, path: str) -> bool:
    """Writes chapter.sweep's plot: median time against the swept size (log 2 axis), one line per
    variant, `limit` dashed. Returns False (writing nothing) when matplotlib is not installed, the
    chapter has no sweep, or none of its cases is measured."""
    sweep = chapter.sweep
    if sweep is None:
        return False
    lines = []
    for variant in sweep.variants:
        points = [(x, results.find(case, variant)) for case, x in zip(sweep.cases, sweep.x)]
        points = [(x, m.time_s * 1e6) for x, m in points if m is not None and m.measured]
        if points:
            lines.append((variant, points))
    if not lines:
        return False
    try:
        import matplotlib  # noqa: WPS433 (optional dependency, imported lazily)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for variant, points in lines:
        style = {"linestyle": "--", "color": "black"} if variant == "limit" else {}
        ax.plot([x for x, _ in points], [t for _, t in points], marker="o", label=variant, **style)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(sweep.x)))
    ax.set_xticklabels(["%g" % x for x in sorted(set(sweep.x))])
    ax.set_xlabel(sweep.x_label)
    ax.set_ylabel("median time (µs)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    info = results.info()
    ax.set_title("%s · time against %s%s" % (results.chapter_id, sweep.x_label.split(" (")[0],
                                               "" if info["gpu"] == UNKNOWN else " on " + info["gpu"]))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return True


STAGE_COUNTER = "stage_%s_us"


def stage_times(m: Measurement, stages: Sequence[str]) -> List[Tuple[str, float]]:
    """The (stage, µs) pairs of ``m``'s stage_<name>_us counters, in ``stages``' order; stages the
    variant does not run (no counter) are left out."""
    return [(name, m.counters[STAGE_COUNTER % name]) for name in stages if STAGE_COUNTER % name in m.counters]


def render_stage_plot(results: ChapterResults, chapter: Chapter, path: str) -> bool:
    """Writes chapter.stages' plot: a panel per case, in it a bar per variant stacking its stages'
    times (each stage timed alone), the variant's measured time as a black tick and the reference
    (limit) as a dashed line. Returns False (writing nothing) when matplotlib is not installed, the
    chapter has no stage breakdown, or no case has one."""
    spec = chapter.stages
    if spec is None:
        return False
    panels = []
    for case in spec.cases:
        bars = []
        for variant in spec.variants:
            m = results.find(case, variant)
            if m is not None and stage_times(m, spec.stages):
                bars.append((variant, stage_times(m, spec.stages), m.time_s * 1e6))
        if bars:
            ref = results.find(case, spec.reference) if spec.reference else None
            panels.append((case, bars, ref.time_s * 1e6 if ref is not None else None))
    if not panels:
        return False
    try:
        import matplotlib  # noqa: WPS433 (optional dependency, imported lazily)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cols = min(5, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows + 0.8), squeeze=False)
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(spec.stages)}
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (case, bars, ref_us) in zip(axes.flat, panels):
        for i, (variant, times, total_us) in enumerate(bars):
            bottom = 0.0
            for name, us in times:
                ax.bar(i, us, bottom=bottom, color=colours[name], width=0.7)
                bottom += us
            ax.plot([i - 0.35, i + 0.35], [total_us, total_us], color="black", linewidth=1.5)
        if ref_us is not None:
            ax.axhline(ref_us, color="black", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([v for v, _, _ in bars], fontsize=7, rotation=20)
        ax.set_title(case, fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylim(bottom=0)
    axes.flat[0].set_ylabel("µs")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in spec.stages]
    labels = list(spec.stages)
    handles.append(plt.Line2D([0], [0], color="black", linewidth=1.5))
    labels.append("whole layer, measured")
    if spec.reference:
        handles.append(plt.Line2D([0], [0], color="black", linestyle="--", linewidth=1))
        labels.append(spec.reference)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    info = results.info()
    fig.suptitle("%s · where the time goes, each stage timed alone%s" % (
        results.chapter_id, "" if info["gpu"] == UNKNOWN else " on " + info["gpu"]), fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------------------
# generate / check


def _chapter_index(chapters: Sequence[Chapter]) -> Dict[str, Chapter]:
    return {c.id: c for c in chapters}


def expected_pages(results_dir: str, chapters: Sequence[Chapter],
                   only: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """Maps ``chNN.md`` file names to the content ``generate`` would write for ``results_dir``."""
    index = _chapter_index(chapters)
    metadata = load_metadata(results_dir)
    pages = {}
    for chapter_id in measured_chapter_ids(results_dir):
        if only and chapter_id not in only:
            continue
        results = load_chapter_results(results_dir, chapter_id, metadata)
        if results is not None:
            pages["%s.md" % chapter_id] = render_chapter_markdown(results, index.get(chapter_id))
    return pages


def write_text(path: str, text: str) -> None:
    """Writes UTF-8 text with '\\n' line ends (the same bytes on every platform)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def read_text(path: str) -> Optional[str]:
    """Reads a UTF-8 text file, or None when it does not exist."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def generate(results_dir: str, chapters: Sequence[Chapter], only: Optional[Sequence[str]] = None,
             plots: bool = True, out=None) -> List[str]:
    """Writes chNN.md (and chNN.png, chNN_sweep.png for a chapter with a sweep and chNN_stages.png
    for one with a stage breakdown, when matplotlib exists) for each chapter with results in ``results_dir``, reporting on ``out`` (default
    stdout). Returns the paths written."""
    out = out or sys.stdout
    written = []
    index = _chapter_index(chapters)
    pages = expected_pages(results_dir, chapters, only)
    plot_note_printed = False
    for name in sorted(pages, key=natural_key):
        path = os.path.join(results_dir, name)
        write_text(path, pages[name])
        written.append(path)
        print("wrote %s" % path, file=out)
        if plots:
            chapter_id = name[:-3]
            png = os.path.join(results_dir, chapter_id + ".png")
            results = load_chapter_results(results_dir, chapter_id)
            if results is not None and render_plot(results, index.get(chapter_id), png):
                written.append(png)
                print("wrote %s" % png, file=out)
                chapter = index.get(chapter_id)
                sweep_png = os.path.join(results_dir, chapter_id + "_sweep.png")
                if chapter is not None and render_sweep_plot(results, chapter, sweep_png):
                    written.append(sweep_png)
                    print("wrote %s" % sweep_png, file=out)
                stages_png = os.path.join(results_dir, chapter_id + "_stages.png")
                if chapter is not None and render_stage_plot(results, chapter, stages_png):
                    written.append(stages_png)
                    print("wrote %s" % stages_png, file=out)
            elif not plot_note_printed:
                print("matplotlib is not installed: skipping plots", file=out)
                plot_note_printed = True
    for chapter_id in only or []:
        if "%s.md" % chapter_id not in pages:
            print("%s: no %s_bench.json in %s" % (chapter_id, chapter_id, results_dir), file=out)
    if not pages and not only:
        print("no chNN_bench.json in %s: nothing to generate" % results_dir, file=out)
    return written


def _diff(old: Optional[str], new: Optional[str], path: str) -> str:
    old_lines = (old or "").splitlines(keepends=True)
    new_lines = (new or "").splitlines(keepends=True)
    label_old = path if old is not None else "/dev/null"
    label_new = (path + " (regenerated)") if new is not None else "/dev/null"
    text = "".join(difflib.unified_diff(old_lines, new_lines, label_old, label_new))
    if text and not text.endswith("\n"):
        text += "\n"
    return text


def check_pages(results_dir: str, chapters: Sequence[Chapter],
                only: Optional[Sequence[str]] = None) -> List[str]:
    """Compares the chNN.md files on disk with what generate would write. Returns one unified diff
    (or message) per mismatching file; an empty list means all match. A chNN.md whose
    chNN_bench.json is gone counts as a mismatch."""
    problems = []
    pages = expected_pages(results_dir, chapters, only)
    for name in sorted(pages, key=natural_key):
        path = os.path.join(results_dir, name)
        on_disk = read_text(path)
        if on_disk != pages[name]:
            problems.append(_diff(on_disk, pages[name], path))
    if os.path.isdir(results_dir):
        for name in sorted(os.listdir(results_dir), key=natural_key):
            match = re.match(r"^(ch\d+)\.md$", name)
            if match and name not in pages and (not only or match.group(1) in only):
                problems.append("%s has no %s_bench.json next to it (stale table?)\n"
                                % (os.path.join(results_dir, name), match.group(1)))
    return problems


# --------------------------------------------------------------------------------------------------
# README chapter map


def _reference_label(chapter: Chapter) -> str:
    if chapter.reference_label:
        return chapter.reference_label
    if chapter.headline_reference == "limit":
        return "copy limit" if chapter.metric == "bandwidth" else "dense GEMM limit"
    if chapter.headline_reference == "pytorch":
        return "PyTorch"
    return chapter.headline_reference


def headline_text(chapter: Chapter, results: Optional[ChapterResults]) -> Optional[str]:
    """'after 4.21 TB/s = 0.99 × copy limit, at fp32_N268435456', or None when not measured."""
    if results is None or not chapter.headline_case:
        return None
    m = results.find(chapter.headline_case, chapter.headline_variant)
    value = _throughput(m, chapter.metric) if m else None
    if value is None:
        return None
    shown = format_flops(value) if chapter.metric == "flops" else format_bandwidth(value)
    text = "%s %s" % (chapter.headline_variant, shown)
    reference = results.find(chapter.headline_case, chapter.headline_reference)
    fraction = _ratio(value, _throughput(reference, chapter.metric) if reference else None)
    if fraction is not None:
        text += " = %.2f × %s" % (fraction, _reference_label(chapter))
    return text + ", at " + chapter.headline_case


def _posix_relpath(path: str, start: str) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


def render_chapter_map(results_dir: str, readme_path: str, chapters: Sequence[Chapter]) -> str:
    """The lines between the chapter-map markers (without the markers): a table with one row per
    chapter of tools/chapters.json, its headline figure from ``results_dir`` (or "not yet
    measured") and links to the chapter folder and its results table. A chapter with
    ``results_gpu`` is read from that sibling folder (chapter_results_dir), and its figure names the
    GPU: "after <N> TFLOP/s = <R> × roofline limit, at CASE, on NVIDIA H100 80GB HBM3", or "not yet
    measured on H100"."""
    readme_dir = os.path.dirname(os.path.abspath(readme_path))
    results_rel = _posix_relpath(os.path.abspath(results_dir), readme_dir)
    metadata = load_metadata(results_dir)
    rows = []
    elsewhere = []
    gpu = _clean(metadata.get("gpu"))
    for chapter in chapters:
        folder = chapter_results_dir(results_dir, chapter)
        own_folder = same_folder(folder, results_dir)
        results = quoted_results(results_dir, chapter, metadata)
        if results is not None and gpu is None and own_folder:
            gpu = _clean(results.info()["gpu"])
        number = chapter.id[2:]
        link = "[%s · %s](chapters/%s/)" % (number, chapter.title, chapter.dir)
        figure = headline_text(chapter, results)
        folder_rel = _posix_relpath(os.path.abspath(folder), readme_dir)
        if not own_folder:
            elsewhere.append("%s from %s" % (chapter.id, folder_rel))
            measured_on = folder_gpu(folder, results)
            figure = "%s, on %s" % (figure, measured_on) if figure else "not yet measured on %s" % measured_on
        figure = figure or "not yet measured"
        table = "[%s.md](%s/%s.md)" % (chapter.id, folder_rel, chapter.id) if results is not None else DASH
        rows.append("| %s | %s | %s |" % (link, figure, table))
    where = gpu or os.path.basename(os.path.normpath(results_dir))
    lines = [
        "<!-- Generated by tools/kc_results.py chapter-map from tools/chapters.json and %s%s; "
        "do not edit by hand. -->" % (results_rel, " (%s)" % ", ".join(elsewhere) if elsewhere else ""),
        "| Chapter | Measured on %s | Results |" % where,
        "|---|---|---|",
    ] + rows
    return "\n".join(lines) + "\n"


def replace_marked_block(text: str, block: str, begin_marker: str = MAP_BEGIN,
                         end_marker: str = MAP_END) -> str:
    """Returns ``text`` with the lines between ``begin_marker`` and the first ``end_marker`` after
    it replaced by ``block``. Raises ResultsError when the markers are missing, repeated or out of
    order."""
    if text.count(begin_marker) != 1:
        raise ResultsError("expected exactly one %s" % begin_marker)
    begin = text.index(begin_marker)
    end = text.find(end_marker, begin)
    if end < 0 or (end_marker == MAP_END and text.count(MAP_END) != 1):
        raise ResultsError("expected one %s after %s" % (end_marker, begin_marker))
    head = text[: begin + len(begin_marker)]
    tail = text[end:]
    return head + "\n" + block + tail


def check_chapter_map(results_dir: str, readme_path: str, chapters: Sequence[Chapter]) -> Optional[str]:
    """None when the README's chapter map is up to date, else a diff or message saying why not."""
    current = read_text(readme_path)
    if current is None:
        return "%s does not exist\n" % readme_path
    try:
        expected = replace_marked_block(current, render_chapter_map(results_dir, readme_path, chapters))
    except ResultsError as e:
        return "%s: %s\n" % (readme_path, e)
    if expected == current:
        return None
    return _diff(current, expected, readme_path)


# --------------------------------------------------------------------------------------------------
# lesson blocks: each chapter's README carries its generated results between
# <!-- kc:results chNN --> and <!-- kc:end -->, so the lesson quotes only generated figures.

LESSON_END = "<!-- kc:end -->"


def lesson_begin_marker(chapter_id: str) -> str:
    """The marker that opens a chapter's results block in its README."""
    return "<!-- kc:results %s -->" % chapter_id


def lesson_path(readme_path: str, chapter: Chapter) -> str:
    """chapters/<dir>/README.md next to the top-level README."""
    return os.path.join(os.path.dirname(os.path.abspath(readme_path)), "chapters", chapter.dir, "README.md")


def render_lesson_block(results_dir: str, lesson: str, chapter: Chapter) -> str:
    """The lines of a chapter README's results block: the chapter's generated table (as in
    chNN.md, without its title), the plot when chNN.png exists, and the Nsight Compute profile when
    chNN_profile.txt exists. A chapter with ``results_gpu`` is read from that sibling folder
    (chapter_results_dir), and the block opens with a line naming its GPU and the other chapters'."""
    folder = chapter_results_dir(results_dir, chapter)
    rel = _posix_relpath(os.path.abspath(folder), os.path.dirname(os.path.abspath(lesson)))
    results = load_chapter_results(folder, chapter.id)
    elsewhere = not same_folder(folder, results_dir)
    if results is None and elsewhere:
        return ("Not yet measured. This chapter is measured on %s (its results go to `%s/`), not on the %s of "
                "the other chapters' results: run `tools/gpu_suite.sh %s` on that GPU and import its archive "
                "(`tools/import_gpu_run.sh ARCHIVE %s`).\n"
                % (folder_gpu(folder), rel, folder_gpu(results_dir), chapter.id, chapter.results_gpu))
    if results is None:
        return ("Not yet measured: run `tools/gpu_suite.sh %s` on a GPU machine and import its archive "
                "(`tools/import_gpu_run.sh`).\n" % chapter.id)
    shown = chapter.lesson_cases
    if shown is not None:
        known = {m.case for m in results.measurements}
        missing = [c for c in shown if c not in known]
        if missing:
            raise ResultsError("%s lesson_cases: %s not in %s/%s_bench.json"
                               % (chapter.id, ", ".join(missing), folder, chapter.id))
    page = render_chapter_markdown(results, chapter, shown).splitlines()
    body = [line for line in page if not line.startswith("<!-- Generated") and not line.startswith("# ")]
    while body and not body[0].strip():
        body.pop(0)
    lines = ["<!-- Generated by tools/kc_results.py from %s/%s_bench.json (and the files beside it); "
             "do not edit by hand. -->" % (rel, chapter.id), ""]
    if elsewhere:
        lines += ["Measured on %s (`%s/`), not on the %s of the other chapters' results: compare ratios within "
                  "this run (a variant against `before`, the vendor or `limit` of the same case), not times "
                  "across GPUs." % (folder_gpu(folder, results), rel, folder_gpu(results_dir)), ""]
    lines += body
    if shown is not None:
        lines += ["", "This table shows %d of the run's %d cases; [%s.md](%s/%s.md) has every case."
                  % (len(shown), len({m.case for m in results.measurements}), chapter.id, rel, chapter.id)]
    if os.path.isfile(os.path.join(folder, chapter.id + ".png")):
        lines += ["", "![%s results](%s/%s.png)" % (chapter.id, rel, chapter.id)]
    profile = read_text(os.path.join(folder, chapter.id + "_profile.txt"))
    if profile and profile.strip():
        lines += ["", "Nsight Compute, one launch per case (`tools/kc_profile.py`, from `%s/%s_profile.txt`):"
                  % (rel, chapter.id), "", "```text", profile.strip("\n"), "```"]
    return "\n".join(lines).rstrip("\n") + "\n"


# An inline figure in a lesson: <!-- kc:fig ch01/after/fp32_N268435456 -->...<!-- /kc:fig -->.
_FIGURE_RE = re.compile(r"(<!-- kc:fig (\S+) -->)(.*?)(<!-- /kc:fig -->)")


def figure_text(results: Optional[ChapterResults], chapter: Chapter, name: str) -> str:
    """The text of an inline figure: median time, throughput and fraction of the case's limit for
    the benchmark ``chNN/variant/case``, e.g. "766 µs, 4206 GB/s, 1.00 × limit"."""
    parsed = parse_run_name(name)
    if parsed is None:
        raise ResultsError("kc:fig %s: expected chNN/variant/case" % name)
    _, variant, case = parsed
    m = results.find(case, variant) if results is not None else None
    if m is None:
        return "not yet measured"
    metric = chapter.metric
    value = _throughput(m, metric)
    shown = format_flops(value) if metric == "flops" else format_bandwidth(value)
    parts = [format_time(m.time_s), shown]
    limit = results.find(case, "limit")
    ratio = _ratio(value, _throughput(limit, metric)) if limit is not None else None
    if ratio is not None and variant != "limit":
        parts.append("%.2f × limit" % ratio)
    return ", ".join(parts)


# A goal ratio in a lesson: the median time of one variant over another's on one case, with the
# range the repetitions allow (slowest over fastest, fastest over slowest):
#   <!-- kc:ratio ch03/bf16_M16_N4096_K7168_bias_gelu_res/before/after -->...<!-- /kc:ratio -->
# reads "before / after"; "1.13 × (1.10–1.16)" means after is 1.13 times as fast as before.
# A goal may follow the name, ``>=1.2``, ``<=1.05``, ``>1`` or ``<1``; the text then ends with the
# verdict, taken from the unrounded median, and the median gets as many decimals (up to four) as it
# takes not to print the threshold itself: "1.197 × (1.17–1.24), goal ≥ 1.2: missed", never
# "1.20 ×" for that.
# ``~>=1`` is the "no slower beyond the run-to-run spread" kind of goal: met when the range reaches
# the threshold, whatever the median.
_RATIO_RE = re.compile(r"(<!-- kc:ratio (\S+)(?: (~>=|>=|<=|>|<)(\d+(?:\.\d+)?))? -->)(.*?)(<!-- /kc:ratio -->)")
# The share of the extra time a fused variant removes: (t_before - t_after) / (t_before - t_base),
#   <!-- kc:removed ch03/case/before/after/step0_gemm_only -->...<!-- /kc:removed -->
# reads "76 % ± 12" (one standard deviation from the repetitions): 100 % means after takes no
# longer than base.
_REMOVED_RE = re.compile(r"(<!-- kc:removed (\S+) -->)(.*?)(<!-- /kc:removed -->)")


# A user counter of one benchmark, as the run recorded it (Chapter 6's wave arithmetic for the GPU
# it ran on):  <!-- kc:counter ch06/after/tail_G4xM384_N2048_K7168/waves -->...<!-- /kc:counter -->.
# Whole numbers print as such; counters named *utilisation or *efficiency (fractions) as percent.
_COUNTER_RE = re.compile(r"(<!-- kc:counter (\S+) -->)(.*?)(<!-- /kc:counter -->)")


def counter_text(results: Optional[ChapterResults], name: str) -> str:
    """The text of a kc:counter marker (see _COUNTER_RE)."""
    fields = name.split("/")
    if len(fields) != 4 or not re.fullmatch(r"ch\d\d", fields[0]) or not all(fields):
        raise ResultsError("kc:counter %s: expected chNN/variant/case/counter" % name)
    _, variant, case, counter = fields
    m = results.find(case, variant) if results is not None else None
    if m is None or not m.measured or counter not in m.counters:
        return "not yet measured"
    value = m.counters[counter]
    if counter.endswith("utilisation") or counter.endswith("efficiency"):
        return "%.0f %%" % (100 * value)
    if value == int(value) or abs(value) >= 1000:
        return "%d" % round(value)
    return "%.3g" % value


# A metric of the chapter's Nsight Compute profile (chNN_profile.txt), its label with underscores for
# spaces:  <!-- kc:profile ch08/after/G256xM128_N4096_K7168/DRAM_read -->...<!-- /kc:profile -->.
_PROFILE_RE = re.compile(r"(<!-- kc:profile (\S+) -->)(.*?)(<!-- /kc:profile -->)")


def profile_text(results: Optional[ChapterResults], name: str) -> str:
    """The text of a kc:profile marker (see _PROFILE_RE): the value as the profile prints it."""
    fields = name.split("/")
    if len(fields) != 4 or not re.fullmatch(r"ch\d\d", fields[0]) or not all(fields):
        raise ResultsError("kc:profile %s: expected chNN/variant/case/metric_label" % name)
    section = results.profile.get("/".join(fields[:3])) if results is not None else None
    label = fields[3].replace("_", " ").lower()
    for key, value in (section or {}).items():
        if key.lower() == label:
            return value
    return "not yet measured"


def _split_derived(name: str, parts: int, marker: str) -> Tuple[str, str, List[str]]:
    """Splits ``chNN/case/variant...`` into chapter, case and ``parts`` variants."""
    fields = name.split("/")
    if len(fields) != 2 + parts or not re.fullmatch(r"ch\d\d", fields[0]) or not all(fields):
        raise ResultsError("kc:%s %s: expected chNN/case/%s" % (marker, name, "/".join(["variant"] * parts)))
    return fields[0], fields[1], fields[2:]


def _measured_times(results: Optional[ChapterResults], case: str,
                    variants: Sequence[str]) -> Optional[List[Measurement]]:
    found = [results.find(case, v) if results is not None else None for v in variants]
    if any(m is None or not m.measured for m in found):
        return None
    return found  # type: ignore[return-value]


def goal_decimals(value: float, threshold: float) -> int:
    """Decimals (2 to 4) for a median next to its goal: the fewest that do not round it onto the
    threshold, so 1.1974 against 1.2 prints 1.197, not 1.20."""
    for decimals in (2, 3):
        if value == threshold or round(value, decimals) != round(threshold, decimals):
            return decimals
    return 4


def ratio_text(results: Optional[ChapterResults], name: str, relation: Optional[str] = None,
               threshold: Optional[float] = None) -> str:
    """The text of a kc:ratio marker (see _RATIO_RE). With a goal (``relation`` ">=", "<=", ">" or
    "<", and ``threshold``), the verdict from the unrounded median follows the range; with "~>=",
    the verdict from the range (no slower than the threshold beyond the spread)."""
    _, case, (top, bottom) = _split_derived(name, 2, "ratio")
    if (relation is None) != (threshold is None) or relation not in (None, "~>=", ">=", "<=", ">", "<"):
        raise ResultsError("kc:ratio %s: a goal is >=X, <=X, >X, <X or ~>=X" % name)
    found = _measured_times(results, case, [top, bottom])
    if found is None:
        return "not yet measured"
    a, b = found
    value = a.time_s / b.time_s
    low = (a.min_s or a.time_s) / (b.max_s or b.time_s)
    high = (a.max_s or a.time_s) / (b.min_s or b.time_s)
    if relation is None or threshold is None:
        return "%.2f × (%.2f–%.2f)" % (value, low, high)
    if relation == "~>=":  # judged on the range, so the median needs no extra decimals
        return "%.2f × (%.2f–%.2f), goal not below %g beyond the spread: %s" % (
            value, low, high, threshold, "met" if high >= threshold else "missed")
    met = {">=": value >= threshold, "<=": value <= threshold, ">": value > threshold, "<": value < threshold}[relation]
    symbol = {">=": "≥", "<=": "≤", ">": ">", "<": "<"}[relation]
    return "%.*f × (%.2f–%.2f), goal %s %g: %s" % (goal_decimals(value, threshold), value, low, high, symbol,
                                                   threshold, "met" if met else "missed")


def removed_text(results: Optional[ChapterResults], name: str) -> str:
    """The text of a kc:removed marker (see _REMOVED_RE): the share at the medians, ± one standard
    deviation propagated from each variant's coefficient of variation. When the extra time is
    small next to the run-to-run noise the ± says so (it can exceed the share itself)."""
    _, case, variants = _split_derived(name, 3, "removed")
    found = _measured_times(results, case, variants)
    if found is None:
        return "not yet measured"
    before, after, base = found
    extra = before.time_s - base.time_s
    if extra <= 0:
        return "no extra time to remove (before is not slower than %s)" % variants[2]
    share = (before.time_s - after.time_s) / extra
    sigma = [(m.cv or 0.0) * m.time_s for m in (before, after, base)]
    # d share / d before, d after, d base
    slopes = [(after.time_s - base.time_s) / extra ** 2, -1.0 / extra, (before.time_s - after.time_s) / extra ** 2]
    spread = math.sqrt(sum((d * s) ** 2 for d, s in zip(slopes, sigma)))
    return "%.0f %% ± %.0f" % (100 * share, 100 * spread)


def fill_figures(text: str, results: Optional[ChapterResults], chapter: Chapter,
                 others: Optional[Callable[[str], Tuple[Optional[ChapterResults], Optional[Chapter]]]] = None) -> str:
    """Replaces the content of every inline figure, ratio, counter, profile and removed-share marker in ``text``. A
    marker names its chapter (``chNN/...``): figures of ``chapter`` come from ``results``, figures
    of another chapter (a lesson quoting an earlier one) from ``others(chapter_id)`` when given."""
    def replace(mt: "re.Match[str]") -> str:
        name = mt.group(2)
        figure_chapter = name.split("/", 1)[0]
        if figure_chapter == chapter.id or others is None:
            return mt.group(1) + figure_text(results, chapter, name) + mt.group(4)
        other_results, other_chapter = others(figure_chapter)
        if other_chapter is None:
            raise ResultsError("kc:fig %s: %s is not in tools/chapters.json" % (name, figure_chapter))
        return mt.group(1) + figure_text(other_results, other_chapter, name) + mt.group(4)

    def results_of(marker_chapter: str, name: str, marker: str) -> Optional[ChapterResults]:
        if marker_chapter == chapter.id or others is None:
            return results
        other_results, other_chapter = others(marker_chapter)
        if other_chapter is None:
            raise ResultsError("kc:%s %s: %s is not in tools/chapters.json" % (marker, name, marker_chapter))
        return other_results

    def replace_ratio(mt: "re.Match[str]") -> str:
        name, relation, threshold = mt.group(2), mt.group(3), mt.group(4)
        text = ratio_text(results_of(name.split("/", 1)[0], name, "ratio"), name, relation,
                          float(threshold) if threshold is not None else None)
        return mt.group(1) + text + mt.group(6)

    def replace_removed(mt: "re.Match[str]") -> str:
        name = mt.group(2)
        return mt.group(1) + removed_text(results_of(name.split("/", 1)[0], name, "removed"), name) + mt.group(4)

    def replace_counter(mt: "re.Match[str]") -> str:
        name = mt.group(2)
        return mt.group(1) + counter_text(results_of(name.split("/", 1)[0], name, "counter"), name) + mt.group(4)

    def replace_profile(mt: "re.Match[str]") -> str:
        name = mt.group(2)
        return mt.group(1) + profile_text(results_of(name.split("/", 1)[0], name, "profile"), name) + mt.group(4)

    for opening in re.findall(r"<!-- kc:ratio .*? -->", text):
        if not _RATIO_RE.match(opening + "<!-- /kc:ratio -->"):
            raise ResultsError("%s: expected <!-- kc:ratio chNN/case/variant/variant --> with an optional goal "
                               "(>=X, <=X, >X, <X or ~>=X) after one space" % opening)
    text = _FIGURE_RE.sub(replace, text)
    text = _RATIO_RE.sub(replace_ratio, text)
    text = _COUNTER_RE.sub(replace_counter, text)
    text = _PROFILE_RE.sub(replace_profile, text)
    return _REMOVED_RE.sub(replace_removed, text)


def lesson_updates(results_dir: str, readme_path: str, chapters: Sequence[Chapter]) -> Dict[str, Tuple[str, str]]:
    """For each chapter README that has a results block or inline figures: path -> (current text,
    expected text). Each chapter's figures, in its own lesson or quoted in another, come from
    chapter_results_dir(results_dir, chapter)."""
    updates = {}
    for chapter in chapters:
        path = lesson_path(readme_path, chapter)
        current = read_text(path)
        if current is None:
            continue
        expected = current
        if lesson_begin_marker(chapter.id) in current:
            block = render_lesson_block(results_dir, path, chapter)
            expected = replace_marked_block(expected, block, lesson_begin_marker(chapter.id), LESSON_END)
        if any(r.search(expected) for r in (_FIGURE_RE, _RATIO_RE, _REMOVED_RE, _COUNTER_RE)):
            index = _chapter_index(chapters)

            def others(chapter_id: str) -> Tuple[Optional[ChapterResults], Optional[Chapter]]:
                other = index.get(chapter_id)
                if other is None:
                    return None, None
                return quoted_results(results_dir, other), other

            expected = fill_figures(expected, quoted_results(results_dir, chapter), chapter, others)
        if expected != current or lesson_begin_marker(chapter.id) in current:
            updates[path] = (current, expected)
    return updates


def check_lessons(results_dir: str, readme_path: str, chapters: Sequence[Chapter]) -> List[str]:
    """Diffs for chapter READMEs whose results block differs from what the results give."""
    return [_diff(old, new, path) for path, (old, new) in lesson_updates(results_dir, readme_path, chapters).items()
            if old != new]


# --------------------------------------------------------------------------------------------------
# summary


def _sort_key(m: Measurement) -> Tuple[Any, ...]:
    if m.chapter is None:
        return (1, natural_key(m.name), (), ())
    return (0, natural_key(m.chapter), natural_key(m.case or ""), variant_key(m.variant or ""))


def _plain_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> List[str]:
    widths = [max(len(str(r[i])) for r in [header] + list(rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            out.append(cell.rjust(widths[i]) if right[i] else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def render_summary(bench_files: Sequence[BenchFile]) -> str:
    """A compact plain-text table of the benchmarks in ``bench_files`` (one block per file)."""
    blocks = []
    for bench_file in bench_files:
        if not bench_file.measurements:
            continue
        context = bench_file.context
        about = [v for v in (_clean(context.get("gpu")), _clean(context.get("library")),
                             _clean(context.get("date"))) if v]
        title = "== %s" % bench_file.source + (" (%s)" % ", ".join(about) if about else "")
        rows = []
        failed = []
        has_flops = any(m.flops is not None for m in bench_file.measurements)
        for m in sorted(bench_file.measurements, key=_sort_key):
            if not m.measured:
                failed.append("not measured: %s: %s" % (m.name, m.error))
                continue
            spread = DASH
            if m.min_s is not None and m.max_s is not None:
                spread = "%s–%s" % (format_time(m.min_s), format_time(m.max_s))
            row = [
                m.name,
                format_time(m.time_s),
                spread,
                DASH if m.cv is None else "%.1f%%" % (m.cv * 100),
                DASH if m.repetitions is None else str(m.repetitions),
                DASH if m.bytes_per_second is None else format_sig(m.bytes_per_second / 1e9),
            ]
            if has_flops:
                row.append(DASH if m.flops is None else format_sig(m.flops / 1e12))
            rows.append(row)
        header = ["benchmark", "median", "min–max", "cv", "reps", "GB/s"] + (["TFLOP/s"] if has_flops else [])
        right = [False, True, True, True, True, True] + ([True] if has_flops else [])
        table = _plain_table(header, rows, right) if rows else ["(no benchmark produced a time)"]
        blocks.append("\n".join([title] + table + failed))
    if not blocks:
        return "no benchmark results in %s\n" % ", ".join(f.source for f in bench_files)
    return "\n\n".join(blocks) + "\n"


# --------------------------------------------------------------------------------------------------
# Command line


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kc_results.py",
        description="Tables, plots and checks for the Kernel Chapters benchmark results.")
    parser.add_argument("--chapters-json", default=DEFAULT_CHAPTERS_JSON,
                        help="chapter list (default: tools/chapters.json next to this script)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("generate", help="write chNN.md (and chNN.png) from chNN_bench.json files")
    p.add_argument("--results-dir", required=True, help="e.g. docs/results/h200")
    p.add_argument("--chapters", nargs="+", metavar="chNN", help="only these chapters")
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")

    p = sub.add_parser(
        "check", help="exit 1 when the generated files differ from the JSON",
        description="Checks the chNN.md of every chNN_bench.json in --results-dir (that folder only: check each "
                    "folder on its own). With --readme, also checks the README's chapter map and the lessons' "
                    "generated parts against what `chapter-map` with the same --results-dir writes: chapters "
                    "with results_gpu in tools/chapters.json read from that sibling folder, the others from "
                    "--results-dir. So pass --readme with the folder the README is generated from "
                    "(docs/results/h200); check the other folders without it.")
    p.add_argument("--results-dir", required=True, help="e.g. docs/results/h200 or docs/results/h100")
    p.add_argument("--chapters", nargs="+", metavar="chNN", help="only these chapters' pages")
    p.add_argument("--readme", help="also check this README's chapter map and the lessons' generated parts")

    p = sub.add_parser(
        "chapter-map", help="rewrite the chapter map in the README and the lessons' generated parts",
        description="Writes the README's chapter map and each lesson's results block and inline figures from "
                    "--results-dir; a chapter with results_gpu in tools/chapters.json (e.g. \"h100\") is read "
                    "from the sibling folder of that name instead, and its row and block name that GPU.")
    p.add_argument("--results-dir", required=True, help="the folder the README quotes: docs/results/h200")
    p.add_argument("--readme", required=True)
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when out of date")

    p = sub.add_parser("summary", help="print a plain-text table of benchmark JSON files")
    p.add_argument("files", nargs="+", metavar="JSON_FILE")
    return parser


def _emit(text: str, stream=None) -> None:
    """Writes text to stdout, replacing characters the terminal's encoding cannot show."""
    stream = stream or sys.stdout
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(encoding, "replace").decode(encoding))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 1 out of date, 2 bad input)."""
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "summary":
            _emit(render_summary([load_benchmark_file(p) for p in args.files]))
            return 0
        chapters = load_chapters(args.chapters_json)
        if args.command == "generate":
            generate(args.results_dir, chapters, args.chapters, plots=not args.no_plots)
            return 0
        if args.command == "check":
            problems = check_pages(args.results_dir, chapters, args.chapters)
            if args.readme:
                readme_problem = check_chapter_map(args.results_dir, args.readme, chapters)
                if readme_problem:
                    problems.append(readme_problem)
                problems.extend(check_lessons(args.results_dir, args.readme, chapters))
            for problem in problems:
                _emit(problem)
            if problems:
                print("out of date: run `python3 tools/kc_results.py generate --results-dir %s`%s"
                      % (args.results_dir,
                         " and `chapter-map --results-dir %s --readme %s`" % (args.results_dir, args.readme)
                         if args.readme else ""))
                return 1
            print("results in %s are up to date" % args.results_dir)
            return 0
        if args.command == "chapter-map":
            if args.check:
                problems = check_lessons(args.results_dir, args.readme, chapters)
                problem = check_chapter_map(args.results_dir, args.readme, chapters)
                if problem:
                    problems.insert(0, problem)
                for text in problems:
                    _emit(text)
                if problems:
                    return 1
                print("chapter map in %s is up to date" % args.readme)
                return 0
            current = read_text(args.readme)
            if current is None:
                raise ResultsError("%s does not exist" % args.readme)
            updated = replace_marked_block(current, render_chapter_map(args.results_dir, args.readme, chapters))
            if updated != current:
                write_text(args.readme, updated)
                print("updated the chapter map in %s" % args.readme)
            else:
                print("chapter map in %s is already up to date" % args.readme)
            for path, (old, new) in lesson_updates(args.results_dir, args.readme, chapters).items():
                if old != new:
                    write_text(path, new)
                    print("updated the results block in %s" % path)
            return 0
    except ResultsError as e:
        print("kc_results.py: error: %s" % e, file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
