#!/usr/bin/env python3
"""PyTorch baselines for the Kernel Chapters benchmarks.

Times what a PyTorch user would write for each chapter's problem and writes ``DIR/chNN_pytorch.json``
in the Google Benchmark JSON schema that ``tools/kc_results.py`` reads (variant ``pytorch``), so the
results tables show PyTorch next to the course's own kernels.

    python3 tools/pytorch_baselines.py --chapters ch01 --out docs/results/h200 [--repetitions 10]

Timing: CUDA events around a batch of launches (one event pair cannot resolve a kernel of a few
microseconds), the start event queued behind a ~100 µs GPU-side hold (torch.cuda._sleep) as the C++
benchmarks do; inputs rotate over enough independent sets to exceed twice the L2 size (so every
launch reads device memory). Like a repetition of the C++ benchmarks (Google Benchmark's MinTime),
each timed sample runs batches back to back until their GPU time reaches ``MIN_TIME_S`` and gives the
GPU time per launch over all of them: one untimed sample, then ``--repetitions`` timed ones. So
PyTorch is timed in the same steady state as the course's kernels: a GPU running a large GEMM settles
at its power limit and a lower clock within a few tens of milliseconds, and a burst of a few
milliseconds would time it at the higher clock it starts with.
Counters follow the course's convention:
``bytes_per_second`` counts the case's fewest bytes, ``flops`` the useful floating-point operations.
A second pass (``--kernels``, a separate run after the timed one, so that the profiler never runs in
the process that times) calls each case once under ``torch.profiler`` and writes the kernels it
launched, in order and shortened (``short_kernel_name``), into the ``label`` of that case's entries in
the JSON the timed run wrote, so a results page can say what PyTorch ran.

Each chapter is one function registered in ``BASELINES`` with ``@baseline("chNN")``; later chapters
add theirs (softmax + top-k, ``torch._grouped_mm``, matmul) the same way.

Without PyTorch or without a CUDA GPU the script says why and exits 0, writing nothing. The JSON
building (``build_benchmark_json``) is plain Python and is tested without PyTorch.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import re
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kc_results import GRAPH_REPLAY_TIMING, KERNEL_REPEAT, KERNEL_SEPARATOR  # the reader owns these formats

WARMUP_SAMPLES = 1
MIN_TIME_S = 0.2  # GPU seconds per sample: kc::bench::configure's MinTime
DEFAULT_REPETITIONS = 10
MAX_ROTATION_BYTES = 8 << 30  # cap on the memory that rotating input sets may take
TIME_UNIT = "us"
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


# --------------------------------------------------------------------------------------------------
# Pure part: statistics and the Google Benchmark JSON schema (no PyTorch needed)


@dataclass
class CaseResult:
    """The timed samples of one case of one chapter.

    ``times_s`` holds one value per timed sample: the time per launch in seconds. ``min_bytes`` is
    the case's fewest bytes (each input read once, each output written once); ``flop_count`` the
    useful floating-point operations per launch (None where there is no math worth counting).
    ``counters`` are extra constant values to record (e.g. launches per batch). ``kernels`` names
    the kernels one call launched (the --kernels pass writes them as labels: add_kernel_labels).
    """

    chapter: str
    case: str
    times_s: List[float]
    min_bytes: float
    flop_count: Optional[float] = None
    cpu_times_s: Optional[List[float]] = None
    variant: str = "pytorch"
    counters: Dict[str, float] = field(default_factory=dict)
    kernels: List[str] = field(default_factory=list)  # what one call launched, shortened, in order

    @property
    def run_name(self) -> str:
        """The benchmark name, as Google Benchmark would write it for a manual-time benchmark."""
        return "%s/%s/%s/manual_time" % (self.chapter, self.variant, self.case)


def _stddev(values: Sequence[float]) -> float:
    # Sample standard deviation (n - 1), as Google Benchmark computes it; 0 for a single value.
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _cv(values: Sequence[float]) -> float:
    mean = statistics.fmean(values)
    return _stddev(values) / mean if mean else 0.0


STATISTICS: Dict[str, Callable[[Sequence[float]], float]] = {
    "mean": statistics.fmean,
    "median": statistics.median,
    "stddev": _stddev,
    "cv": _cv,
    "min": min,
    "max": max,
}


def build_benchmark_json(context: Dict[str, Any], results: Sequence[CaseResult],
                         time_unit: str = TIME_UNIT) -> Dict[str, Any]:
    """Builds a Google Benchmark JSON document (aggregates only) from timed samples.

    Like ``--benchmark_report_aggregates_only=true`` with the course's ``min``/``max`` statistics,
    each case gets six entries (mean, median, stddev, cv, min, max). Each statistic is computed
    over the samples for the time and, as Google Benchmark does, separately over the per-sample
    rates for ``bytes_per_second`` and ``flops``; the cv entry holds fractions
    (``aggregate_unit`` "percentage"). Raises ValueError for a case without samples or with a
    non-positive time.
    """
    if time_unit not in _UNIT_SECONDS:
        raise ValueError("time_unit must be one of %s" % sorted(_UNIT_SECONDS))
    scale = _UNIT_SECONDS[time_unit]
    benchmarks: List[Dict[str, Any]] = []
    for family, result in enumerate(results):
        times = list(result.times_s)
        if not times:
            raise ValueError("%s has no timed samples" % result.run_name)
        if any(not (t > 0 and math.isfinite(t)) for t in times):
            raise ValueError("%s has a time that is not a positive number" % result.run_name)
        cpu = list(result.cpu_times_s) if result.cpu_times_s else times
        if len(cpu) != len(times):
            raise ValueError("%s: cpu_times_s and times_s differ in length" % result.run_name)
        rates: Dict[str, List[float]] = {"bytes_per_second": [result.min_bytes / t for t in times]}
        if result.flop_count is not None:
            rates["flops"] = [result.flop_count / t for t in times]
        n = len(times)
        for aggregate, statistic in STATISTICS.items():
            is_cv = aggregate == "cv"
            entry: Dict[str, Any] = {
                "name": "%s_%s" % (result.run_name, aggregate),
                "family_index": family,
                "per_family_instance_index": 0,
                "run_name": result.run_name,
                "run_type": "aggregate",
                "repetitions": n,
                "threads": 1,
                "aggregate_name": aggregate,
                "aggregate_unit": "percentage" if is_cv else "time",
                "iterations": n,
                "real_time": statistic(times) if is_cv else statistic(times) / scale,
                "cpu_time": statistic(cpu) if is_cv else statistic(cpu) / scale,
                "time_unit": time_unit,
            }
            for name, values in rates.items():
                entry[name] = statistic(values)
            for name, value in sorted(result.counters.items()):
                constant = [float(value)] * n
                entry[name] = statistic(constant)
            benchmarks.append(entry)
    return {"context": dict(context), "benchmarks": benchmarks}


_LONGEST_NAME = 160
_ANONYMOUS = "(anonymous namespace)"


def _mangled_identifier(name: str, prefix: str) -> Optional[str]:
    """The first source name (<length><identifier>) in the mangled ``name`` that starts with a match
    of the regular expression ``prefix``, read by its length: the digits right before it (a
    substitution or a template literal ends in "_" or "E", so whatever digits precede the identifier
    belong to its length; if they do not fit, a shorter tail of them is tried). None if none does."""
    for match in re.finditer(r"(\d+)(?=%s)" % prefix, name):
        digits = match.group(1)
        for k in range(len(digits)):
            length = int(digits[k:])
            ident = name[match.end():match.end() + length]
            if length > 0 and len(ident) == length and all(c.isalnum() or c == "_" for c in ident):
                return ident
    return None


def _mangled_qualified_name(name: str) -> str:
    """The function's qualified name without template arguments, from a mangled name: the nested
    name's identifiers after "_ZN" (or the one after "_Z") up to the first template or end mark."""
    i = 3 if name.startswith("_ZN") else 2
    parts = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        length = int(name[i:j])
        parts.append(name[j:j + length])
        i = j + length
        if not name.startswith("_ZN"):
            break
    return "::".join(parts) if parts else name


def short_kernel_name(name: str) -> str:
    """A kernel's name as a results page can show it: without template and function arguments,
    and for a CUTLASS kernel (whose name is kilobytes of template arguments) with the two
    arguments that say what it is, its kernel schedule (e.g. ...TmaWarpSpecializedCooperative) and
    its MMA atom (e.g. MMA_64x256x16_F32BF16BF16_SS, a Hopper wgmma). Mangled names (the profiler
    leaves some so) are read without a demangler. At most 160 characters."""
    name = name.strip()
    if name.startswith("_Z"):
        short = _mangled_qualified_name(name)
        if short.startswith("cutlass::"):
            details = [d for d in (_mangled_identifier(name, "Kernel"), _mangled_identifier(name, "MMA_[0-9]")) if d]
            if details:
                short += " (%s)" % ", ".join(details)
    else:
        short = name[len("void "):] if name.startswith("void ") else name
        short = short.replace(_ANONYMOUS, "{anonymous}")
        for mark in ("<", "("):
            if mark in short:
                short = short[:short.index(mark)]
        short = short.strip()
    return short if len(short) <= _LONGEST_NAME else short[:_LONGEST_NAME - 1] + "…"


def collapse_repeats(names: Sequence[str]) -> List[str]:
    """``names`` in order, each run of one name back to back written once with its count
    (``"name × 3"``, KERNEL_REPEAT); a name that comes back after another stays where it is, so the
    list keeps every launch and its order."""
    result: List[str] = []
    run = 0
    for i, n in enumerate(names):
        run += 1
        if i + 1 == len(names) or names[i + 1] != n:
            result.append(n if run == 1 else "%s%s%d" % (n, KERNEL_REPEAT, run))
            run = 0
    return result


def base_context(library: str, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The JSON context: date (local time with offset, as Google Benchmark writes it), host,
    executable, CPU count and the library name (e.g. "pytorch 2.11.0"), plus ``extra``."""
    context: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "host_name": socket.gethostname(),
        "executable": "tools/pytorch_baselines.py",
        "num_cpus": os.cpu_count() or 0,
        "library": library,
    }
    context.update(extra or {})
    return context


def rotation_sets(bytes_per_set: int, l2_bytes: int, max_total_bytes: int = MAX_ROTATION_BYTES) -> int:
    """How many independent input/output sets to rotate so that together they exceed twice the L2
    size; at least 1 and at most what fits in ``max_total_bytes``."""
    if bytes_per_set <= 0:
        return 1
    wanted = (2 * max(0, l2_bytes)) // bytes_per_set + 1
    affordable = max(1, max_total_bytes // bytes_per_set)
    return max(1, min(wanted, affordable))


def launches_per_batch(n: int, budget: int = 1 << 26, most: int = 1024) -> int:
    """Launches between one pair of events (a batch) for a problem of ``n`` elements:
    max(1, min(1024, 2^26 // n)). A sample runs as many batches as its MIN_TIME_S needs."""
    return max(1, min(most, budget // max(1, n)))


# --------------------------------------------------------------------------------------------------
# GPU part (needs PyTorch)


@dataclass
class Env:
    """What a chapter's baseline function gets: the torch module, the device, settings."""

    torch: Any
    device: Any
    l2_bytes: int
    repetitions: int
    warmup: int = WARMUP_SAMPLES
    min_time_s: float = MIN_TIME_S
    seed: int = 1234
    log: Callable[[str], None] = print
    # The raw names of the kernels one call of a launch function starts, in order (profile_kernels on
    # the GPU); set only by the --kernels pass, None when timing.
    kernel_names: Optional[Callable[[Callable[[], Any]], List[str]]] = None
    # The folder of the C++ benchmarks' chNN_bench.json (--out): a baseline may read what they record
    # there (the group sizes of Chapters 8 and 9). None: nothing to read.
    bench_dir: Optional[str] = None


# About 100 µs of GPU clock cycles at the H200's ~2 GHz: torch.cuda._sleep spins for a cycle count.
HOLD_CYCLES = 200_000


def time_samples(env: Env, launches: Sequence[Callable[[], Any]], batch: int) -> Dict[str, List[float]]:
    """Times ``env.warmup`` untimed and then ``env.repetitions`` timed samples. A sample runs batches
    of ``batch`` calls, rotating over ``launches`` (one callable per input set), each batch between
    two CUDA events, until the batches' GPU time reaches ``env.min_time_s`` (at least one batch).
    Returns, per timed sample, the GPU time and the host thread CPU time per launch (seconds): the
    sample's totals over its launch count, as Google Benchmark reports a manual-time repetition;
    and, after the timing, what one more call of ``launches[0]`` launched (``kernels``: short names in
    launch order, back-to-back repeats counted by collapse_repeats; empty without
    ``env.kernel_names``)."""
    count = len(launches)
    index = 0

    def run_batch() -> None:
        nonlocal index
        for _ in range(batch):
            launches[index]()
            index = index + 1 if index + 1 < count else 0

    return _timed_samples(env, launches, batch, run_batch)


def _timed_samples(env: Env, launches: Sequence[Callable[[], Any]], batch: int, run_batch: Callable[[], None],
                   before_hold: Optional[Callable[[], Any]] = None) -> Dict[str, List[float]]:
    """The sampling time_samples and time_graph_samples share: ``env.warmup`` untimed samples, then
    ``env.repetitions`` timed ones, each running passes until their GPU time reaches
    ``env.min_time_s`` (at least one). A pass runs ``before_hold`` (untimed), holds the stream,
    records the start event, enqueues ``batch`` calls with ``run_batch``, records the end event and
    waits for it. Per sample: GPU time and host thread time over the calls; then the kernels of one
    call of ``launches[0]`` where ``env.kernel_names`` lists them."""
    torch = env.torch
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times: List[float] = []
    cpu_times: List[float] = []
    for sample in range(env.warmup + env.repetitions):
        gpu_s = 0.0
        cpu_s = 0.0
        launched = 0
        while launched == 0 or gpu_s < env.min_time_s:
            cpu0 = time.thread_time()
            if before_hold is not None:
                before_hold()
            # As kc::EventTimer does: hold the stream on the GPU for a moment before the start event,
            # so the start fires once the first launches are queued and the GPU never waits on the
            # host's cost of the first launch inside the timed span.
            torch.cuda._sleep(HOLD_CYCLES)
            start.record()
            run_batch()
            end.record()
            end.synchronize()
            cpu_s += time.thread_time() - cpu0
            gpu_s += start.elapsed_time(end) * 1e-3
            launched += batch
        if sample >= env.warmup:
            times.append(gpu_s / launched)
            cpu_times.append(cpu_s / launched)
    kernels = []
    if env.kernel_names is not None:
        kernels = collapse_repeats([short_kernel_name(n) for n in env.kernel_names(launches[0])])
    return {"times": times, "cpu_times": cpu_times, "kernels": kernels}


def time_graph_samples(env: Env, launches: Sequence[Callable[[], Any]], batch: int,
                       evict: Callable[[], Any]) -> Dict[str, List[float]]:
    """Times ``batch`` calls captured once into a CUDA graph, as Chapter 4's C++ benchmark times its
    rows (``time_graph_batches`` in bench/04_moe_gating_bench.cu): call i of the batch runs
    ``launches[i % len(launches)]``, so the calls rotate over the input sets as time_samples does.
    Each pass runs ``evict`` (a read of a buffer twice the L2's size, outside the timed span: every
    call of the replay then reads its inputs from device memory, and no dirty line is written back
    inside the span), holds the stream, and replays the graph between two CUDA events; a sample runs
    passes until their GPU time reaches ``env.min_time_s`` (at least one), one untimed sample first.
    The host enqueues one replay a pass, so the time is the GPU's however long the host takes to
    dispatch each call (PyTorch's Python and dispatcher cost tens of microseconds for a call of
    several operators, longer than their kernels take on a small input).

    Before any timing, the replay is checked against an eager call: the outputs of the last call
    captured must agree with what the same call returns run eagerly (_same_outputs), or
    RuntimeError. Returns what time_samples returns; ``cpu_times`` is the host's thread time of a
    pass (eviction, hold, replay, wait) over its calls."""
    torch = env.torch
    count = len(launches)
    # torch.cuda.graph's rule: run the calls once on a side stream before capturing them, so that
    # whatever they set up on first use (handles, workspaces) is not set up inside the capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(batch, count, 3)):
            launches[i]()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    captured: Any = None
    with torch.cuda.graph(graph):
        for i in range(batch):
            captured = launches[i % count]()
    graph.replay()
    torch.cuda.synchronize()
    eager = launches[(batch - 1) % count]()
    torch.cuda.synchronize()
    if not _same_outputs(torch, captured, eager):
        raise RuntimeError("a replay of the captured calls differs from the same call run eagerly")
    del captured, eager
    timed = _timed_samples(env, launches, batch, graph.replay, before_hold=evict)
    graph.reset()  # frees the graph's memory pool now, not when the garbage collector finds it
    return timed


def _same_outputs(torch: Any, a: Any, b: Any) -> bool:
    """Whether two calls' outputs agree: tensors equal (torch.equal) or, both floating point, within
    1e-2 relative and absolute (a library may pick another GEMM algorithm, and so round otherwise,
    inside a capture: cuBLAS's split-K choice depends on the workspace it is given); tuples and lists
    item by item."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b)
                and all(_same_outputs(torch, x, y) for x, y in zip(a, b)))
    if torch.equal(a, b):
        return True
    return bool(a.is_floating_point() and b.is_floating_point() and a.shape == b.shape
                and torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2))


def l2_evictor(env: Env) -> Callable[[], Any]:
    """A function that empties the L2 by reading a zeroed buffer of twice its size (a sum over it),
    as the C++ benchmark's L2Evictor does: a read, not a memset, so the L2 is left holding clean
    lines (a memset leaves dirty ones, whose write-back would land in the next timed span)."""
    torch = env.torch
    words = torch.zeros(max(1, 2 * env.l2_bytes // 4), device=env.device, dtype=torch.int32)
    return lambda: words.sum()


def graph_and_eager_results(env: Env, chapter: str, case: str, launches: Sequence[Callable[[], Any]], batch: int,
                            evict: Callable[[], Any], **fields: Any) -> List[CaseResult]:
    """The two rows of a case of a graph-timed chapter (CHAPTER_TIMING), each logged: ``pytorch``
    from time_graph_samples (what PyTorch's kernels take) and ``pytorch_eager`` from time_samples
    over the same calls (what a script without graphs gets). ``fields`` are the CaseResult's other
    fields (min_bytes, flop_count, counters). Both rows ran the same call, so the --kernels pass
    lists its kernels once, in the graph timing, and gives them to both."""
    graph = time_graph_samples(env, launches, batch, evict)
    eager = time_samples(dataclasses.replace(env, kernel_names=None), launches, batch)
    results = []
    for variant, timed in (("pytorch", graph), ("pytorch_eager", eager)):
        results.append(CaseResult(chapter=chapter, case=case, variant=variant, times_s=timed["times"],
                                  cpu_times_s=timed["cpu_times"], kernels=graph["kernels"], **fields))
        env.log("%s %s %s: median %.1f us per launch" % (chapter, variant, case, statistics.median(timed["times"]) * 1e6))
    return results


def profile_kernels(torch: Any, launch: Callable[[], Any], log: Callable[[str], None] = print) -> List[str]:
    """The names of the GPU kernels (and copies) one call of ``launch`` starts, in start order, from
    ``torch.profiler``; an empty list, with a log line, if the profiler fails."""
    try:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            launch()
            torch.cuda.synchronize()
        events = [e for e in prof.events() if str(e.device_type).endswith("CUDA")]
        events.sort(key=lambda e: e.time_range.start)
        return [e.name for e in events]
    except Exception as e:  # the names are a note on the results page; the times are what matter
        log("pytorch_baselines: could not list the kernels (%s)" % e)
        return []


BaselineFn = Callable[[Env], List[CaseResult]]
BASELINES: Dict[str, BaselineFn] = {}


def baseline(chapter_id: str) -> Callable[[BaselineFn], BaselineFn]:
    """Registers a chapter's baseline function under ``chapter_id`` (e.g. "ch01")."""

    def register(fn: BaselineFn) -> BaselineFn:
        BASELINES[chapter_id] = fn
        return fn

    return register


CH01_SIZES = [1 << k for k in range(16, 29, 2)]  # 2^16 ... 2^28 floats


@baseline("ch01")
def ch01_vector_add(env: Env) -> List[CaseResult]:
    """c = a + b on float32 vectors with ``torch.add(a, b, out=c)``; min_bytes = 12 n."""
    torch = env.torch
    generator = torch.Generator(device=env.device)
    generator.manual_seed(env.seed)
    results = []
    for n in CH01_SIZES:
        set_bytes = 3 * 4 * n
        sets = rotation_sets(set_bytes, env.l2_bytes)
        batch = launches_per_batch(n)
        tensors = []
        for _ in range(sets):
            # Uniform random in [-1, 1), like the C++ benchmark: never an all-zero input.
            a = torch.empty(n, device=env.device, dtype=torch.float32).uniform_(-1.0, 1.0, generator=generator)
            b = torch.empty(n, device=env.device, dtype=torch.float32).uniform_(-1.0, 1.0, generator=generator)
            c = torch.empty(n, device=env.device, dtype=torch.float32)
            tensors.append((a, b, c))
        launches = [functools.partial(torch.add, a, b, out=c) for a, b, c in tensors]
        # Check once, before any timing, that the operation computes what the chapter computes.
        a, b, c = tensors[0]
        launches[0]()
        if not torch.equal(c, a + b):
            raise RuntimeError("torch.add gave a wrong result for n=%d" % n)
        timed = time_samples(env, launches, batch)
        results.append(CaseResult(chapter="ch01", case="fp32_N%d" % n, times_s=timed["times"],
                                  cpu_times_s=timed["cpu_times"], kernels=timed["kernels"], min_bytes=12.0 * n,
                                  counters={"launches_per_batch": float(batch), "rotating_sets": float(sets)}))
        env.log("ch01 fp32_N%d: median %.2f us per launch (%d sets, %d launches per batch)"
                % (n, statistics.median(timed["times"]) * 1e6, sets, batch))
        del tensors, launches, a, b, c
        torch.cuda.empty_cache()
    return results


# Chapter 2's benchmark shapes (M, N, K): square sizes and the MoE-like shapes.
CH02_SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
               (4096, 4096, 7168), (128, 4096, 7168)]


def ch02_case_label(dtype: str, m: int, n: int, k: int) -> str:
    """The case label of a Chapter 2 shape, e.g. bf16_M4096_N4096_K4096."""
    return "%s_M%d_N%d_K%d" % (dtype, m, n, k)


def ch02_min_bytes(element_bytes: int, m: int, n: int, k: int) -> float:
    """Fewest bytes of a GEMM: read A [M,K] and B/W once, write C [M,N] once."""
    return float(element_bytes * (m * k + k * n + m * n))


@baseline("ch02")
def ch02_tiled_matmul(env: Env) -> List[CaseResult]:
    """fp32: torch.matmul(a, b) with TF32 off (C = A·B, A [M,K], B [K,N]); bf16:
    torch.nn.functional.linear(a, w) (C = A·Wᵀ, W [N,K]), the layout of nn.Linear."""
    torch = env.torch
    torch.backends.cuda.matmul.allow_tf32 = False
    generator = torch.Generator(device=env.device)
    generator.manual_seed(env.seed)
    results = []
    for dtype_name, dtype, element_bytes in (("fp32", torch.float32, 4), ("bf16", torch.bfloat16, 2)):
        for m, n, k in CH02_SHAPES:
            min_bytes = ch02_min_bytes(element_bytes, m, n, k)
            sets = rotation_sets(int(min_bytes), env.l2_bytes)
            batch = max(1, min(64, (1 << 28) // int(min_bytes)))
            operands = []
            for _ in range(sets):
                a = torch.empty(m, k, device=env.device, dtype=dtype).uniform_(-1.0, 1.0, generator=generator)
                if dtype_name == "fp32":
                    b = torch.empty(k, n, device=env.device, dtype=dtype).uniform_(-1.0, 1.0, generator=generator)
                    operands.append(functools.partial(torch.matmul, a, b))
                else:
                    w = torch.empty(n, k, device=env.device, dtype=dtype).uniform_(-1.0, 1.0, generator=generator)
                    operands.append(functools.partial(torch.nn.functional.linear, a, w))
            timed = time_samples(env, operands, batch)
            label = ch02_case_label(dtype_name, m, n, k)
            results.append(CaseResult(chapter="ch02", case=label, times_s=timed["times"],
                                      cpu_times_s=timed["cpu_times"], kernels=timed["kernels"], min_bytes=min_bytes,
                                      flop_count=2.0 * m * n * k,
                                      counters={"launches_per_batch": float(batch), "rotating_sets": float(sets)}))
            env.log("ch02 %s: median %.1f us per launch" % (label, statistics.median(timed["times"]) * 1e6))
            del operands
            torch.cuda.empty_cache()
    return results


# Chapter 3's cases: (M, N, K, epilogue); "swiglu" stacks gate|up into N = 2 x 4096 rows.
CH03_CASES = [(16, 4096, 7168, "bias_gelu_res"), (128, 4096, 7168, "bias_gelu_res"),
              (4096, 4096, 4096, "bias_gelu"), (16, 8192, 7168, "swiglu"), (128, 8192, 7168, "swiglu"),
              (4096, 8192, 4096, "swiglu")]


def ch03_case_label(m: int, n: int, k: int, epilogue: str) -> str:
    """The case label of a Chapter 3 case, e.g. bf16_M128_N4096_K7168_bias_gelu_res."""
    return "bf16_M%d_N%d_K%d_%s" % (m, n, k, epilogue)


def ch03_min_bytes(m: int, n: int, k: int, epilogue: str) -> float:
    """Fewest bytes of the layer in bf16 (kc::ch03::layer_min_bytes): A, W, bias and residual read
    once, the output ([M, N], or [M, N/2] for SwiGLU) written once."""
    out = m * n // 2 if epilogue == "swiglu" else m * n
    elements = m * k + n * k + out
    if epilogue != "swiglu":
        elements += n
    if epilogue.endswith("_res"):
        elements += out
    return 2.0 * elements


@baseline("ch03")
def ch03_fused_epilogue(env: Env) -> List[CaseResult]:
    """As a PyTorch user writes it: gelu(F.linear(x, w, b), approximate="tanh") + residual, and
    SwiGLU as one F.linear on the stacked [gate; up] weights, chunk(2, -1), silu(gate) * up.
    Each case gives two rows (graph_and_eager_results): ``pytorch``, a graph replay (at M <= 128 a
    call's three or four operators cost the host more than their kernels run), and ``pytorch_eager``."""
    torch = env.torch
    functional = torch.nn.functional
    generator = torch.Generator(device=env.device)
    generator.manual_seed(env.seed)
    evict = l2_evictor(env)
    results = []
    for m, n, k, epilogue in CH03_CASES:
        min_bytes = ch03_min_bytes(m, n, k, epilogue)
        sets = rotation_sets(int(min_bytes), env.l2_bytes)
        batch = max(1, min(64, (1 << 28) // int(min_bytes)))
        launches = []
        for _ in range(sets):
            def uniform(*shape: int, scale: float = 1.0) -> Any:
                return torch.empty(*shape, device=env.device, dtype=torch.bfloat16).uniform_(
                    -scale, scale, generator=generator)
            x, w = uniform(m, k), uniform(n, k, scale=0.05)
            if epilogue == "swiglu":
                def swiglu(x: Any = x, w: Any = w) -> Any:
                    gate, up = functional.linear(x, w).chunk(2, dim=-1)
                    return functional.silu(gate) * up
                launches.append(swiglu)
            else:
                b = uniform(n)
                residual = uniform(m, n) if epilogue.endswith("_res") else None

                def layer(x: Any = x, w: Any = w, b: Any = b, residual: Any = residual) -> Any:
                    y = functional.gelu(functional.linear(x, w, b), approximate="tanh")
                    return y + residual if residual is not None else y
                launches.append(layer)
        results += graph_and_eager_results(
            env, "ch03", ch03_case_label(m, n, k, epilogue), launches, batch, evict, min_bytes=min_bytes,
            flop_count=2.0 * m * n * k, counters={"launches_per_batch": float(batch), "rotating_sets": float(sets)})
        del launches
        torch.cuda.empty_cache()
    return results


# Chapter 4's benchmark cases: softmax -> top-k (renormalised) and DeepSeek-V3 routing.
CH04_TOKENS = [1, 16, 256, 4096, 65536]
CH04_SHAPES = [(8, 2), (64, 6), (128, 8), (256, 8), (384, 8)]
CH04_DSV3 = {"experts": 256, "k": 8, "n_group": 8, "topk_group": 4, "scale": 2.5}


def ch04_cases() -> List[Dict[str, Any]]:
    """Every Chapter 4 case: label, T, E, k and whether it is DeepSeek-V3 routing. The labels are the
    C++ benchmark's: fp32_T{T}_E{E}_k{k}, and fp32_dsv3_T{T} (T = 1 written T01, so that no label is a
    prefix of another)."""
    cases = []
    for t in CH04_TOKENS:
        for e, k in CH04_SHAPES:
            cases.append({"label": "fp32_T%d_E%d_k%d" % (t, e, k), "tokens": t, "experts": e, "k": k, "dsv3": False})
        cases.append({"label": "fp32_dsv3_T%s" % ("01" if t == 1 else str(t)), "tokens": t,
                      "experts": CH04_DSV3["experts"], "k": CH04_DSV3["k"], "dsv3": True})
    return cases


def ch04_min_bytes(tokens: int, experts: int, k: int) -> float:
    """Fewest bytes of gating with fp32 logits: read [T, E] logits, write [T, k] fp32 weights and int32
    ids and [E] int32 counts, each once."""
    return 4.0 * tokens * experts + 8.0 * tokens * k + 4.0 * experts


@baseline("ch04")
def ch04_moe_gating(env: Env) -> List[CaseResult]:
    """softmax -> topk -> renormalise -> count, and DeepSeek-V3's gate written as in its reference
    model (sigmoid, biased group top-2 sums, masked_fill of the other groups, topk, gather, scale).
    The counts come from torch.histc with its range given, not torch.bincount: bincount sizes its
    output from the ids' range, which it copies to the host and waits for on every call, so the row
    would hold a host round trip in the middle of the launches; scatter_add_ into zeros waits on
    nothing but its atomics contend. The C++ kernels count on the
    device without waiting, and so does this (a call that waits on the host could not be captured).

    Each case gives two rows (graph_and_eager_results): ``pytorch``, timed as the chapter's C++ rows
    are (a graph replay, the L2 emptied first), and ``pytorch_eager``, as a script runs it."""
    torch = env.torch
    generator = torch.Generator(device=env.device)
    generator.manual_seed(env.seed)
    bias = torch.empty(CH04_DSV3["experts"], device=env.device).uniform_(-0.1, 0.1, generator=generator)

    def count_per_expert(ids, e):
        # Bins of width 1 over [0, e): bin i holds id i (exact in fp32 for these ids).
        return torch.histc(ids.flatten().float(), bins=e, min=0, max=e).int()

    def softmax_topk(logits, k, e):
        weights, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids, count_per_expert(ids, e)

    def dsv3(logits, k, e):
        scores = logits.sigmoid()
        original = scores
        scores = scores + bias
        groups = scores.view(logits.size(0), CH04_DSV3["n_group"], -1)
        group_scores = groups.topk(2, dim=-1)[0].sum(dim=-1)
        keep = group_scores.topk(CH04_DSV3["topk_group"], dim=-1)[1]
        mask = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, keep, False)
        scores = groups.masked_fill(mask.unsqueeze(-1), float("-inf")).flatten(1)
        ids = scores.topk(k, dim=-1)[1]
        weights = original.gather(1, ids)
        weights = weights / weights.sum(dim=-1, keepdim=True) * CH04_DSV3["scale"]
        return weights, ids, count_per_expert(ids, e)

    evict = l2_evictor(env)
    results = []
    for case in ch04_cases():
        t, e, k = case["tokens"], case["experts"], case["k"]
        min_bytes = ch04_min_bytes(t, e, k)
        batch = max(1, min(1024, (1 << 28) // int(min_bytes)))
        # Small cases would want ~10^6 sets to exceed 2 x L2: keep at most one batch's sets per
        # sample, as views into one slab (one allocation, one fill); later batches reuse them.
        sets = min(rotation_sets(int(min_bytes), env.l2_bytes), (env.warmup + env.repetitions) * batch)
        fn = dsv3 if case["dsv3"] else softmax_topk
        slab = torch.empty(sets, t, e, device=env.device, dtype=torch.float32).uniform_(-4.0, 4.0, generator=generator)
        launches = [functools.partial(fn, slab[i], k, e) for i in range(sets)]
        results += graph_and_eager_results(
            env, "ch04", case["label"], launches, batch, evict, min_bytes=min_bytes,
            counters={"launches_per_batch": float(batch), "rotating_sets": float(sets)})
        del launches, slab
        torch.cuda.empty_cache()
    return results


# Chapter 5's cases (bench/05_grouped_gemm_bench.cu): (label, group sizes kind, experts, rows, N, K).
CH05_CASES = [("G8xM4096_N4096_K7168", "uniform", 8, 8 * 4096, 4096, 7168),
              ("G32xM256_N4096_K7168", "uniform", 32, 32 * 256, 4096, 7168),
              ("G256xM128_N4096_K7168", "uniform", 256, 256 * 128, 4096, 7168),
              ("E256_M8192_zipf_N4096_K7168", "zipf", 256, 8192, 4096, 7168),
              ("E256_M8192_hot_N4096_K7168", "one_hot", 256, 8192, 4096, 7168),
              ("E256_M8192_empty25_N4096_K7168", "quarter_empty", 256, 8192, 4096, 7168),
              ("G8xM4096_N7168_K2048", "uniform", 8, 8 * 4096, 7168, 2048),
              ("G8xM4096_N28672_K4096", "uniform", 8, 8 * 4096, 28672, 4096)]


def _share_uniformly(sizes: List[int], takes: List[bool], rows: int) -> None:
    count = sum(1 for t in takes if t)
    if count == 0:
        return
    extra = rows % count
    for e, take in enumerate(takes):
        if take:
            sizes[e] += rows // count + (1 if extra > 0 else 0)
            extra = max(0, extra - 1)


def ch05_group_sizes(kind: str, experts: int, rows: int) -> List[int]:
    """The benchmark's group sizes, exactly as kc::ch05::group_sizes computes them: "uniform",
    "zipf" (floor(rows * (1/(e+1)) / H), H the harmonic sum, the remainder one each from expert 0),
    "one_hot" (half to expert 0, the rest uniformly), "quarter_empty" (experts 0, 4, 8, ... get
    none) and "ragged" (rows // E + (37 e mod 39) - 19, clamped at 0, the difference one each from
    expert 0 on). They sum to ``rows``."""
    if experts < 1:
        raise ValueError("experts must be >= 1")
    sizes = [0] * experts
    if kind == "uniform":
        _share_uniformly(sizes, [True] * experts, rows)
    elif kind == "zipf":
        harmonic = 0.0
        for e in range(experts):
            harmonic += 1.0 / (e + 1)
        for e in range(experts):
            sizes[e] = int(math.floor(rows * (1.0 / (e + 1)) / harmonic))
        e = 0
        while sum(sizes) < rows:
            sizes[e] += 1
            e = (e + 1) % experts
    elif kind == "one_hot":
        sizes[0] = rows if experts == 1 else rows // 2
        _share_uniformly(sizes, [e != 0 for e in range(experts)], rows - sizes[0])
    elif kind == "quarter_empty":
        takes = [e % 4 != 0 for e in range(experts)]
        if experts == 1:
            takes[0] = True
        _share_uniformly(sizes, takes, rows)
    elif kind == "ragged":
        sizes = [max(0, rows // experts + (37 * e) % 39 - 19) for e in range(experts)]
        given, e = sum(sizes), 0
        while given < rows:
            sizes[e] += 1
            given += 1
            e = (e + 1) % experts
        e = 0
        while given > rows:
            if sizes[e] > 0:
                sizes[e] -= 1
                given -= 1
            e = (e + 1) % experts
    else:
        raise ValueError("unknown group sizes kind %r" % kind)
    return sizes


def ch05_min_bytes(sizes: Sequence[int], n: int, k: int) -> float:
    """Fewest bytes of the grouped GEMM in bf16 (kc::ch05::grouped_gemm_min_bytes): A and C rows once,
    the weights of non-empty experts once."""
    rows = sum(sizes)
    nonempty = sum(1 for s in sizes if s > 0)
    return 2.0 * (rows * k + nonempty * n * k + rows * n)


@baseline("ch05")
def ch05_grouped_gemm(env: Env) -> List[CaseResult]:
    """``torch._grouped_mm(a, w.transpose(-2, -1), offs=offsets[1:])``: bf16 A [M_total, K], W
    [E, N, K] seen as [E, K, N], int32 cumulative row ends. Skipped with a reason where this torch
    has no ``_grouped_mm`` or it rejects the case (it needs sm_90 in the releases checked)."""
    return _grouped_mm_baseline(env, "ch05", CH05_CASES)


# Chapter 6's cases (kc::ch06::benchmark_cases): Chapter 5's, plus two poor-last-wave shapes on 132
# SMs (144 and 192 tiles of 128 x 128).
CH06_CASES = CH05_CASES + [("tail_G3xM384_N2048_K7168", "uniform", 3, 3 * 384, 2048, 7168),
                           ("tail_G4xM384_N2048_K7168", "uniform", 4, 4 * 384, 2048, 7168)]


@baseline("ch06")
def ch06_persistent(env: Env) -> List[CaseResult]:
    """Chapter 5's ``torch._grouped_mm`` baseline on Chapter 6's cases."""
    return _grouped_mm_baseline(env, "ch06", CH06_CASES)


# Chapter 7's benchmark shapes (bench/07_hopper_gemm_bench.cu): square 2048-8192 and two MoE-like shapes.
CH07_SHAPES = [(2048, 2048, 2048), (4096, 4096, 4096), (6144, 6144, 6144), (8192, 8192, 8192),
               (4096, 4096, 7168), (8192, 7168, 2048)]


@baseline("ch07")
def ch07_hopper_gemm(env: Env) -> List[CaseResult]:
    """``torch.nn.functional.linear(a, w)`` in bf16 (C = A·Wᵀ, A [M,K], W [N,K]) on Chapter 7's
    shapes, timed as Chapter 2's bf16 baseline is."""
    torch = env.torch
    generator = torch.Generator(device=env.device)
    generator.manual_seed(env.seed)
    results = []
    for m, n, k in CH07_SHAPES:
        min_bytes = ch02_min_bytes(2, m, n, k)
        sets = rotation_sets(int(min_bytes), env.l2_bytes)
        batch = max(1, min(64, (1 << 28) // int(min_bytes)))
        operands = []
        for _ in range(sets):
            a = torch.empty(m, k, device=env.device, dtype=torch.bfloat16).uniform_(-1.0, 1.0, generator=generator)
            w = torch.empty(n, k, device=env.device, dtype=torch.bfloat16).uniform_(-1.0, 1.0, generator=generator)
            operands.append(functools.partial(torch.nn.functional.linear, a, w))
        timed = time_samples(env, operands, batch)
        label = ch02_case_label("bf16", m, n, k)
        results.append(CaseResult(chapter="ch07", case=label, times_s=timed["times"],
                                  cpu_times_s=timed["cpu_times"], kernels=timed["kernels"], min_bytes=min_bytes,
                                  flop_count=2.0 * m * n * k,
                                  counters={"launches_per_batch": float(batch), "rotating_sets": float(sets)}))
        env.log("ch07 %s: median %.1f us per launch" % (label, statistics.median(timed["times"]) * 1e6))
        del operands
        torch.cuda.empty_cache()
    return results


# Chapter 8's cases (bench/08_hopper_grouped_gemm_bench.cu): Chapter 5's, plus DeepSeek-V3 down on 256
# experts and Qwen3-30B-A3B's gate and up (128 experts, N = 2 x 768, K = 2048).
CH08_CASES = CH05_CASES + [("G256xM128_N7168_K2048", "uniform", 256, 256 * 128, 7168, 2048),
                           ("G128xM256_N1536_K2048", "uniform", 128, 128 * 256, 1536, 2048),
                           ("E256_M32768_ragged_N4096_K7168", "ragged", 256, 32768, 4096, 7168)]

# The JSON context key under which a C++ benchmark records a case's group sizes: "group_sizes/<case>".
GROUP_SIZES_KEY = "group_sizes/"


def encode_group_sizes(sizes: Sequence[int]) -> str:
    """Group sizes as bench/08_hopper_grouped_gemm_bench.cu writes them into its JSON context: comma-
    separated, a run of equal sizes as "size*count" ("128*256" for 256 experts of 128 rows)."""
    tokens: List[str] = []
    i = 0
    while i < len(sizes):
        end = i
        while end < len(sizes) and sizes[end] == sizes[i]:
            end += 1
        tokens.append("%d" % sizes[i] if end - i == 1 else "%d*%d" % (sizes[i], end - i))
        i = end
    return ",".join(tokens)


def decode_group_sizes(text: str) -> List[int]:
    """The group sizes that ``encode_group_sizes`` wrote. Raises ValueError for anything else (an
    empty token, a negative size, a count below 1)."""
    sizes: List[int] = []
    for token in text.split(","):
        size_text, star, count_text = token.strip().partition("*")
        size, count = int(size_text), int(count_text) if star else 1
        if size < 0 or count < 1:
            raise ValueError("bad group sizes token %r in %r" % (token, text))
        sizes.extend([size] * count)
    return sizes


def bench_group_sizes(path: str) -> Dict[str, List[int]]:
    """The group sizes a C++ benchmark recorded in the context of its JSON at ``path``: case label ->
    sizes. Empty when the file does not exist (no C++ run before this one)."""
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        context = json.load(f).get("context") or {}
    return {key[len(GROUP_SIZES_KEY):]: decode_group_sizes(value) for key, value in context.items()
            if key.startswith(GROUP_SIZES_KEY) and isinstance(value, str)}


# The group sizes kind of a case whose sizes come from a C++ benchmark's routing of random tokens
# (Chapter 9's decode cases): only its JSON has them, ch05_group_sizes cannot compute them.
ROUTED_KIND = "routed"


def grouped_case_sizes(cases: Sequence[Any], recorded: Dict[str, List[int]],
                       log: Callable[[str], None] = print) -> Dict[str, List[int]]:
    """Each case's group sizes: those the C++ benchmark recorded (``recorded``, from
    bench_group_sizes), else ch05_group_sizes's, which repeat kc::ch05::group_sizes. A recorded size
    list that differs from the computed one is used, with a log line saying so. A routed case
    (ROUTED_KIND) has its recorded sizes (a log line where their experts or rows are not the case's)
    or no entry (routed_case_skip_reason says why)."""
    out = {}
    for label, kind, experts, rows, _, _ in cases:
        sizes = recorded.get(label)
        if kind == ROUTED_KIND:
            if sizes is not None and (len(sizes) != experts or sum(sizes) != rows):
                log("%s: the C++ benchmark's group sizes (%d experts, %d rows) are not the case's %d experts, "
                    "%d rows; timing the benchmark's" % (label, len(sizes), sum(sizes), experts, rows))
            if sizes is not None:
                out[label] = sizes
            continue
        computed = ch05_group_sizes(kind, experts, rows)
        if sizes is not None and sizes != computed:
            log("%s: the C++ benchmark's group sizes (%d experts, %d rows) differ from %s over %d rows; "
                "timing the benchmark's" % (label, len(sizes), sum(sizes), kind, rows))
        out[label] = computed if sizes is None else sizes
    return out


def recorded_group_sizes(env: Env, chapter: str) -> Tuple[Dict[str, List[int]], Optional[str]]:
    """The group sizes ``chapter``'s C++ benchmark recorded in ``chNN_bench.json`` in ``env.bench_dir``
    (bench_group_sizes), with a log line saying whether the cases take them; and, where there was
    nothing to read, why: no folder given, no file, or a file that cannot be read (also logged).
    The reason is None for a file that was read, recorded sizes or not."""
    name = "%s_bench.json" % chapter
    recorded: Dict[str, List[int]] = {}
    unread: Optional[str] = "no folder of C++ benchmark results to read %s from" % name
    if env.bench_dir:
        path = os.path.join(env.bench_dir, name)
        unread = None if os.path.isfile(path) else "%s not found (no C++ benchmark run before this one)" % path
        try:
            recorded = bench_group_sizes(path)
        except (OSError, ValueError) as e:  # e.g. the file of a benchmark run that stopped half-way
            unread = "cannot read the group sizes in %s (%s)" % (path, e)
            env.log("%s: %s" % (chapter, unread))
    env.log("%s: group sizes %s" % (chapter, "from %s" % name if recorded else "computed as kc::ch05::group_sizes"))
    return recorded, unread


@baseline("ch08")
def ch08_hopper_grouped_gemm(env: Env) -> List[CaseResult]:
    """Chapter 5's ``torch._grouped_mm`` baseline on Chapter 8's cases, with the group sizes that
    ``ch08_bench.json`` in ``env.bench_dir`` recorded where it exists."""
    recorded, _ = recorded_group_sizes(env, "ch08")
    return _grouped_mm_baseline(env, "ch08", CH08_CASES, grouped_case_sizes(CH08_CASES, recorded, env.log))


def _time_grouped_case(env: Env, chapter: str, variant: str, label: str, sizes: Sequence[int], n: int, k: int,
                       generator: Any, op: str,
                       launch_of: Callable[[Any, Any], Callable[[], Any]]) -> Optional[CaseResult]:
    """Times one grouped GEMM case as ``chapter``'s ``variant``: bf16 A [rows, K] and W [E, N, K]
    (E = len(sizes), rows = sum(sizes)) uniform in [-1, 1) from ``generator``; ``launch_of(a, w)``
    gives the call to time, ``op`` its name in log lines, whose output seen as [rows, N] holds the
    experts' rows in order. One expert's rows are checked against a plain matmul before any timing
    (RuntimeError if they differ). None, with a log line, where the case needs more than 80 % of the
    free memory or the call raises a RuntimeError on it (e.g. ``torch._grouped_mm`` before sm_90)."""
    torch = env.torch
    name = chapter if variant == "pytorch" else "%s %s" % (chapter, variant)
    experts, rows = len(sizes), sum(sizes)
    free, _ = torch.cuda.mem_get_info()
    need = 2.0 * (experts * n * k + rows * (n + k))
    if need > 0.8 * free:
        env.log("%s %s: needs %.1f GB, %.1f GB free; skipped" % (name, label, need / 1e9, free / 1e9))
        return None
    a = torch.empty(rows, k, device=env.device, dtype=torch.bfloat16).uniform_(-1.0, 1.0, generator=generator)
    w = torch.empty(experts, n, k, device=env.device, dtype=torch.bfloat16).uniform_(-1.0, 1.0, generator=generator)
    launch = launch_of(a, w)
    try:
        out = launch().reshape(rows, n)
        # Check one expert's rows against a plain matmul before any timing.
        e = max(range(experts), key=lambda i: sizes[i])
        r0 = sum(sizes[:e])
        want = a[r0:r0 + sizes[e]].float() @ w[e].float().t()
        err = (out[r0:r0 + sizes[e]].float() - want).norm() / want.norm()
        if not err < 1e-2:
            raise RuntimeError("%s differs from matmul by %.3g for %s" % (op, err, label))
    except RuntimeError as error:
        if "differs" in str(error):
            raise
        env.log("%s %s: %s rejected the case (%s); skipped" % (name, label, op, error))
        del a, w, launch
        torch.cuda.empty_cache()
        return None
    timed = time_samples(env, [launch], 1)
    result = CaseResult(chapter=chapter, case=label, variant=variant, times_s=timed["times"],
                        cpu_times_s=timed["cpu_times"], kernels=timed["kernels"], min_bytes=ch05_min_bytes(sizes, n, k),
                        flop_count=2.0 * rows * n * k, counters={"launches_per_batch": 1.0, "rotating_sets": 1.0})
    env.log("%s %s: median %.1f us per launch" % (name, label, statistics.median(timed["times"]) * 1e6))
    del a, w, launch, out, want, err
    torch.cuda.empty_cache()
    return result


def _grouped_mm_baseline(env: Env, chapter: str, cases: Sequence[Any],
                         sizes_of: Optional[Dict[str, List[int]]] = None) -> List[CaseResult]:
    """Times ``torch._grouped_mm`` on ``cases`` ((label, kind, experts, rows, N, K) tuples) as
    ``chapter``'s pytorch variant, with the group sizes ``sizes_of[label]`` (default
    ch05_group_sizes(kind, experts, rows)); see ch05_grouped_gemm."""
    torch = env.torch
    if not hasattr(torch, "_grouped_mm"):
        env.log("%s: torch %s has no torch._grouped_mm; skipped" % (chapter, torch.__version__))
        return []
    generator = torch.Generator(device=env.device)
    generator.manual_seed(env.seed)
    results = []
    for label, kind, experts, rows, n, k in cases:
        sizes = sizes_of[label] if sizes_of and label in sizes_of else ch05_group_sizes(kind, experts, rows)

        def launch_of(a: Any, w: Any, sizes: Sequence[int] = sizes) -> Callable[[], Any]:
            ends = torch.tensor(sizes, device=env.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            w_kn = w.transpose(-2, -1)
            return lambda: torch._grouped_mm(a, w_kn, offs=ends)
        result = _time_grouped_case(env, chapter, "pytorch", label, sizes, n, k, generator, "torch._grouped_mm",
                                    launch_of)
        if result is not None:
            results.append(result)
    return results


# Chapter 9's cases (bench/09_swap_ab_decode_bench.cu), (label, kind, experts, rows, N, K) as Chapter
# 5's: decode-sized groups of DeepSeek-V3 up (32 experts of 1-256 rows), T decode tokens routed top-8
# over DeepSeek-V3's 256 experts (T · 8 rows; the C++ benchmark's routing gives the sizes), Mixtral's
# gate and up (8 experts, N = 2 x 14336, K = 4096) and Qwen3-30B-A3B's (128 experts, N = 2 x 768).
CH09_CASES = ([("G32xM%d_N4096_K7168" % m, "uniform", 32, 32 * m, 4096, 7168)
               for m in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
              + [("dsv3_decode_T%d_E256_k8_N4096_K7168" % t, ROUTED_KIND, 256, 8 * t, 4096, 7168)
                 for t in (1, 8, 32, 128)]
              + [("G8xM%d_N28672_K4096" % m, "uniform", 8, 8 * m, 28672, 4096) for m in (1, 4, 16, 64)]
              + [("G128xM%d_N1536_K2048" % m, "uniform", 128, 128 * m, 1536, 2048) for m in (1, 4, 16)])


def routed_case_skip_reason(label: str, kind: str, recorded: Dict[str, List[int]], bench_json: str,
                            unread: Optional[str] = None) -> Optional[str]:
    """Why a case cannot be timed, or None: a routed case (ROUTED_KIND), whose group sizes only the
    C++ benchmark's routing gives, without sizes in ``recorded`` (bench_group_sizes of the file named
    ``bench_json``) is skipped, for ``unread`` where that file gave nothing to read
    (recorded_group_sizes), else for the key missing from it. A case of another kind is never
    skipped: ch05_group_sizes computes its sizes where none are recorded."""
    if kind != ROUTED_KIND or label in recorded:
        return None
    return unread or "%s records no %s%s" % (bench_json, GROUP_SIZES_KEY, label)


def equal_groups(sizes: Sequence[int]) -> bool:
    """Whether every group has the same number of rows, more than 0: A is then [E, M, K] and
    ``torch.bmm`` runs the grouped GEMM."""
    return bool(sizes) and sizes[0] > 0 and all(s == sizes[0] for s in sizes)


@baseline("ch09")
def ch09_swap_ab_decode(env: Env) -> List[CaseResult]:
    """Chapter 5's ``torch._grouped_mm`` baseline (variant ``pytorch``) on Chapter 9's decode cases,
    and, where all groups are equal, ``torch.bmm(a.view(E, M, K), w.transpose(-2, -1))`` (variant
    ``pytorch_bmm``, C [E, M, N]), with the group sizes that ``ch09_bench.json`` in ``env.bench_dir``
    recorded where it exists. A routed case without recorded sizes is skipped with a log line."""
    recorded, unread = recorded_group_sizes(env, "ch09")
    cases = []
    for case in CH09_CASES:
        reason = routed_case_skip_reason(case[0], case[1], recorded, "ch09_bench.json", unread)
        if reason is None:
            cases.append(case)
        else:
            env.log("ch09 %s: %s; skipped" % (case[0], reason))
    sizes_of = grouped_case_sizes(cases, recorded, env.log)
    results = _grouped_mm_baseline(env, "ch09", cases, sizes_of)
    return results + _bmm_baseline(env, "ch09", [c for c in cases if equal_groups(sizes_of[c[0]])], sizes_of)


def _bmm_baseline(env: Env, chapter: str, cases: Sequence[Any], sizes_of: Dict[str, List[int]]) -> List[CaseResult]:
    """Times ``torch.bmm`` on ``cases`` ((label, kind, experts, rows, N, K) tuples, equal groups
    ``sizes_of[label]``: equal_groups) as ``chapter``'s pytorch_bmm variant: A [E · M, K] seen as
    [E, M, K] times W [E, N, K] seen as [E, K, N], C [E, M, N]; counted and checked as
    _grouped_mm_baseline's cases are."""
    torch = env.torch
    generator = torch.Generator(device=env.device)
    generator.manual_seed(env.seed)
    results = []
    for label, _, _, _, n, k in cases:
        sizes = sizes_of[label]

        def launch_of(a: Any, w: Any, experts: int = len(sizes), m: int = sizes[0], k: int = k) -> Callable[[], Any]:
            a_emk, w_kn = a.view(experts, m, k), w.transpose(-2, -1)
            return lambda: torch.bmm(a_emk, w_kn)
        result = _time_grouped_case(env, chapter, "pytorch_bmm", label, sizes, n, k, generator, "torch.bmm", launch_of)
        if result is not None:
            results.append(result)
    return results


# Chapter 10's configurations (chapters/10_moe_layer/moe_config.cpp): name -> hidden H, intermediate I,
# experts E, top-k, routing ("softmax" renormalised, or "dsv3": grouped sigmoid routing with n_group,
# topk_group and the scaling factor), shared experts S (each of a routed expert's size; 0: none).
CH10_CONFIGS = {
    "dsv3": {"hidden": 7168, "intermediate": 2048, "experts": 256, "k": 8, "routing": "dsv3", "n_group": 8,
             "topk_group": 4, "scale": 2.5, "shared": 1},
    "mixtral": {"hidden": 4096, "intermediate": 14336, "experts": 8, "k": 2, "routing": "softmax", "shared": 0},
    "qwen3_30b_a3b": {"hidden": 2048, "intermediate": 768, "experts": 128, "k": 8, "routing": "softmax",
                      "shared": 0},
}
CH10_TOKENS = (1, 8, 64, 512, 4096)


def ch10_case_label(model: str, tokens: int) -> str:
    """The C++ benchmark's label: ``<model>_T<T>_bf16``."""
    return "%s_T%d_bf16" % (model, tokens)


def ch10_min_bytes(config: Dict[str, Any], tokens: int, counts: Sequence[int]) -> float:
    """moe_min_bytes: x and y once, the router (and DeepSeek-V3's fp32 correction bias), the shared
    experts and every routed expert with a token, in bf16."""
    h, i, e = config["hidden"], config["intermediate"], config["experts"]
    active = sum(1 for c in counts if c > 0)
    elements = 2 * tokens * h + e * h + (config["shared"] + active) * 3 * i * h
    return 2.0 * elements + (4.0 * e if config["routing"] == "dsv3" else 0.0)


def ch10_flops(config: Dict[str, Any], tokens: int) -> float:
    """moe_flops: the router, T · k rows through the routed MLPs, T · S through the shared ones."""
    h, i = config["hidden"], config["intermediate"]
    return 2.0 * tokens * h * config["experts"] + 2.0 * tokens * (config["k"] + config["shared"]) * 3 * i * h


def _ch10_layer(env: Env, config: Dict[str, Any], tokens: int, generator: Any) -> Dict[str, Any]:
    """The layer's tensors, filled as bench/10_moe_layer_bench.cu fills its own: x uniform in [-1, 1],
    weights uniform and scaled by 1 / sqrt(fan-in), the correction bias in ±0.1. Laid out as the C++
    layer's (moe_layer.hpp): "up" [E + S, 2I, H] and "down" [E + S, H, I], the S shared experts after
    the E routed ones."""
    torch = env.torch
    h, i, e, s = config["hidden"], config["intermediate"], config["experts"], config["shared"]

    def uniform(shape: Tuple[int, ...], bound: float, dtype: Any = torch.bfloat16) -> Any:
        return torch.empty(shape, device=env.device, dtype=dtype).uniform_(-bound, bound, generator=generator)
    return {"x": uniform((tokens, h), 1.0), "router": uniform((e, h), 2.0 / h ** 0.5),
            "up": uniform((e + s, 2 * i, h), 1.0 / h ** 0.5), "down": uniform((e + s, h, i), 1.0 / i ** 0.5),
            "bias": uniform((e,), 0.1, torch.float32)}


def _ch10_route(torch: Any, config: Dict[str, Any], layer: Dict[str, Any]) -> Tuple[Any, Any]:
    """The router as model code writes it: (weights [T, k] fp32, ids [T, k])."""
    return _ch10_routing(torch, config, layer, layer["x"] @ layer["router"].t())


def _ch10_routing(torch: Any, config: Dict[str, Any], layer: Dict[str, Any], logits: Any) -> Tuple[Any, Any]:
    """The routing on the router's bf16 logits: (weights [T, k] fp32, ids [T, k])."""
    logits = logits.float()
    k = config["k"]
    if config["routing"] == "softmax":
        weights, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)
        return weights / weights.sum(dim=-1, keepdim=True), ids
    scores = logits.sigmoid()
    biased = scores + layer["bias"]
    t, g = biased.shape[0], config["n_group"]
    group_scores = biased.view(t, g, -1).topk(2, dim=-1).values.sum(dim=-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(config["topk_group"], dim=-1).indices, 1.0)
    mask = keep.unsqueeze(-1).expand(t, g, biased.shape[1] // g).reshape(t, -1)
    ids = biased.masked_fill(mask == 0, float("-inf")).topk(k, dim=-1).indices
    weights = scores.gather(1, ids)
    return weights / weights.sum(dim=-1, keepdim=True) * config["scale"], ids


def _ch10_shared(torch: Any, config: Dict[str, Any], layer: Dict[str, Any]) -> Any:
    """The shared experts: every token through each one's dense SwiGLU MLP, summed."""
    i, e = config["intermediate"], config["experts"]
    out = None
    for s in range(config["shared"]):
        gate_up = layer["x"] @ layer["up"][e + s].t()
        y = (torch.nn.functional.silu(gate_up[:, :i]) * gate_up[:, i:]) @ layer["down"][e + s].t()
        out = y if out is None else out + y
    return out


# The grouped module's stages, named as the C++ layer's (chapters/10_moe_layer/moe_stages.hpp): each
# reads what the earlier ones left in ``st`` and adds its own results.
def _ch10_stages(torch: Any, config: Dict[str, Any], layer: Dict[str, Any]) -> List[Tuple[str, Callable[[Dict[str, Any]], None]]]:
    """The layer as serving frameworks write it, stage by stage: topk, argsort, index_select,
    torch._grouped_mm, SiLU · up, the routing weight, index_add; no host synchronisation."""
    x, k, i, e = layer["x"], config["k"], config["intermediate"], config["experts"]

    def router(st: Dict[str, Any]) -> None:
        st["logits"] = x @ layer["router"].t()

    def routing(st: Dict[str, Any]) -> None:
        st["weights"], st["ids"] = _ch10_routing(torch, config, layer, st["logits"])

    def permute(st: Dict[str, Any]) -> None:
        flat = st["ids"].reshape(-1)
        st["order"] = flat.argsort(stable=True)
        st["token_of_row"] = st["order"] // k
        # Counts by a scatter, not torch.bincount: bincount sizes its output from the largest id, a
        # host synchronisation that a CUDA graph cannot capture.
        counts = torch.zeros(e, device=flat.device, dtype=torch.int64).index_add_(0, flat, torch.ones_like(flat))
        st["ends"] = counts.cumsum(0).to(torch.int32)
        st["a"] = x.index_select(0, st["token_of_row"])

    def up(st: Dict[str, Any]) -> None:
        st["gate_up"] = torch._grouped_mm(st["a"], layer["up"][:e].transpose(-2, -1), offs=st["ends"])

    def swiglu(st: Dict[str, Any]) -> None:
        st["h"] = torch.nn.functional.silu(st["gate_up"][:, :i]) * st["gate_up"][:, i:]

    def down(st: Dict[str, Any]) -> None:
        st["out"] = torch._grouped_mm(st["h"], layer["down"][:e].transpose(-2, -1), offs=st["ends"])

    def combine(st: Dict[str, Any]) -> None:
        out = st["out"] * st["weights"].reshape(-1)[st["order"]].unsqueeze(1).to(st["out"].dtype)
        st["y"] = torch.zeros_like(x).index_add_(0, st["token_of_row"], out)

    def shared(st: Dict[str, Any]) -> None:
        st["y"] = st["y"] + _ch10_shared(torch, config, layer)

    stages = [("router", router), ("routing", routing), ("permute", permute), ("up", up), ("swiglu", swiglu),
              ("down", down), ("combine", combine)]
    return stages + ([("shared", shared)] if config["shared"] else [])


def _ch10_grouped(torch: Any, config: Dict[str, Any], layer: Dict[str, Any]) -> Any:
    """The grouped module: its stages (_ch10_stages) one after another."""
    st: Dict[str, Any] = {}
    for _, stage in _ch10_stages(torch, config, layer):
        stage(st)
    return st["y"]


def ch10_stage_breakdown(env: Env, config: Dict[str, Any], layer: Dict[str, Any], evict: Callable[[], Any],
                         runs: int = 7) -> Dict[str, float]:
    """Each stage of the grouped module alone, eagerly, after the whole module has run (so its inputs
    exist), after an L2 eviction and a hold of the stream: the median of ``runs`` launches, in microseconds, as the counters
    ``stage_<name>_us`` (the C++ benchmark's names)."""
    torch = env.torch
    stages = _ch10_stages(torch, config, layer)
    st: Dict[str, Any] = {}
    for _, stage in stages:
        stage(st)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    counters = {}
    for name, stage in stages:
        samples = []
        for _ in range(runs):
            evict()
            torch.cuda._sleep(HOLD_CYCLES)  # as in _timed_samples: the host's launch cost stays outside
            start.record()
            stage(st)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        counters["stage_%s_us" % name] = statistics.median(samples)
    return counters


def _ch10_loop(torch: Any, config: Dict[str, Any], layer: Dict[str, Any]) -> Any:
    """The per-expert loop many model ports still use: for each expert, its tokens (found with a host
    synchronisation), two matmuls, SiLU · up, weighted, added into y."""
    weights, ids = _ch10_route(torch, config, layer)
    x, i = layer["x"], config["intermediate"]
    y = torch.zeros_like(x)
    for e in range(config["experts"]):
        token, slot = torch.where(ids == e)
        if token.numel() == 0:
            continue
        gate_up = x[token] @ layer["up"][e].t()
        h = torch.nn.functional.silu(gate_up[:, :i]) * gate_up[:, i:]
        y.index_add_(0, token, (h @ layer["down"][e].t()) * weights[token, slot].unsqueeze(1).to(x.dtype))
    return y + _ch10_shared(torch, config, layer) if config["shared"] else y


@baseline("ch10")
def ch10_moe_layer(env: Env) -> List[CaseResult]:
    """Chapter 10's layer in PyTorch on every configuration and T: ``pytorch`` (the grouped module,
    _ch10_grouped, replayed from a CUDA graph as a serving framework runs it), ``pytorch_eager`` (the
    same calls eagerly) and ``pytorch_loop`` (_ch10_loop, eager: its host synchronisations keep it
    out of a graph). The loop is checked against the grouped module before any timing. Counted with
    this run's own routing (ch10_min_bytes over its expert counts) and ch10_flops."""
    torch = env.torch
    if not hasattr(torch, "_grouped_mm"):
        env.log("ch10: torch %s has no torch._grouped_mm; skipped" % torch.__version__)
        return []
    generator = torch.Generator(device=env.device)
    generator.manual_seed(env.seed)
    evict = l2_evictor(env)
    results = []
    for model, config in CH10_CONFIGS.items():
        for tokens in CH10_TOKENS:
            label = ch10_case_label(model, tokens)
            layer = _ch10_layer(env, config, tokens, generator)
            grouped = _ch10_grouped(torch, config, layer)
            loop = _ch10_loop(torch, config, layer)
            err = ((grouped.float() - loop.float()).norm() / loop.float().norm()).item()
            if not err < 2e-2:
                raise RuntimeError("ch10 %s: the grouped module differs from the loop by %.3g" % (label, err))
            counts = torch.bincount(_ch10_route(torch, config, layer)[1].reshape(-1),
                                    minlength=config["experts"]).tolist()
            fields = {"min_bytes": ch10_min_bytes(config, tokens, counts), "flop_count": ch10_flops(config, tokens),
                      "counters": {"launches_per_batch": 1.0, "rotating_sets": 1.0}}
            grouped_call = functools.partial(_ch10_grouped, torch, config, layer)
            module = graph_and_eager_results(env, "ch10", label, [grouped_call], 1, evict, **fields)
            module[0].counters = dict(module[0].counters, **ch10_stage_breakdown(env, config, layer, evict))
            results += module
            timed = time_samples(env, [functools.partial(_ch10_loop, torch, config, layer)], 1)
            results.append(CaseResult(chapter="ch10", case=label, variant="pytorch_loop", times_s=timed["times"],
                                      cpu_times_s=timed["cpu_times"], kernels=timed["kernels"], **fields))
            env.log("ch10 pytorch_loop %s: median %.1f us per launch"
                    % (label, statistics.median(timed["times"]) * 1e6))
            del layer, grouped, loop
            torch.cuda.empty_cache()
    return results


def add_kernel_labels(doc: Dict[str, Any], results: Sequence[CaseResult]) -> int:
    """Writes each result's kernels into the ``label`` of the entries of ``doc`` (a timed run's
    JSON) that have its run_name; returns how many cases were labelled. A result without kernels,
    or without entries in ``doc``, changes nothing."""
    labelled = 0
    for result in results:
        if not result.kernels:
            continue
        entries = [e for e in doc.get("benchmarks", []) if e.get("run_name") == result.run_name]
        for entry in entries:
            entry["label"] = KERNEL_SEPARATOR.join(result.kernels)
        labelled += 1 if entries else 0
    return labelled


def _gpu_unavailable_reason() -> Optional[str]:
    try:
        import torch  # noqa: F401 (optional dependency)
    except ImportError as e:
        return "PyTorch is not installed (%s)" % e
    try:
        if not torch.cuda.is_available():
            return "PyTorch %s sees no CUDA GPU" % torch.__version__
        torch.cuda.get_device_properties(0)
    except Exception as e:  # a broken driver shows up here in many forms
        return "PyTorch cannot use the GPU (%s)" % e
    return None


def _write_json(doc: Dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


# What the --kernels pass puts in front of the baselines' own log lines: their times there come from
# one batch without warm-up, under the profiler, and are no results.
KERNELS_PASS_LOG_PREFIX = "kernels pass (one untimed batch, not a result): "


def list_kernels(chapters: Sequence[str], out_dir: str, log: Callable[[str], None] = print) -> List[str]:
    """The --kernels pass: runs each case of ``chapters`` once (one batch, no warm-up sample; the
    batch warms the case up, so the call profiled after it is not a first call) with the kernels of
    one call recorded, and adds them as labels to ``out_dir/chNN_pytorch.json``;
    returns the paths updated. A chapter without that file is skipped with a log line. Call only
    when PyTorch and a GPU are available."""
    import torch

    props = torch.cuda.get_device_properties(0)
    # The baselines log a "median ... per launch" line per case; here it is one untimed batch, so say so.
    env = Env(torch=torch, device=torch.device("cuda", 0), l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
              repetitions=1, warmup=0, min_time_s=0.0, log=lambda line: log(KERNELS_PASS_LOG_PREFIX + line),
              kernel_names=lambda launch: profile_kernels(torch, launch, log), bench_dir=out_dir)
    updated = []
    for chapter_id in chapters:
        path = os.path.join(out_dir, "%s_pytorch.json" % chapter_id)
        if not os.path.isfile(path):
            log("pytorch_baselines: %s not found (the timed run writes it first); %s skipped" % (path, chapter_id))
            continue
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        labelled = add_kernel_labels(doc, BASELINES[chapter_id](env))
        _write_json(doc, path)
        log("labelled %d cases in %s" % (labelled, path))
        updated.append(path)
    return updated


# The GPU seconds a sample runs for where a chapter's C++ repetitions differ from MIN_TIME_S, and the
# chapters whose `pytorch` rows replay a CUDA graph of the calls (next to `pytorch_eager` rows), which
# the context's "timing" tells the results page's Baseline line. Chapter 4's C++ rows are graph
# replays for 0.1 s a repetition (bench/04_moe_gating_bench.cu), so its PyTorch rows are timed so too.
# Chapter 3's C++ rows are a stream of launches, each shorter on the host than on the GPU; PyTorch's
# call at M <= 128 is not (three or four operators of Python and dispatch), so its rows replay a graph
# to time the GPU, as the C++ rows do.
CHAPTER_MIN_TIME_S = {"ch04": 0.1}
CHAPTER_TIMING = {"ch03": GRAPH_REPLAY_TIMING, "ch04": GRAPH_REPLAY_TIMING, "ch10": GRAPH_REPLAY_TIMING}


def chapter_context(context: Dict[str, Any], chapter_id: str, min_time_s: float) -> Dict[str, Any]:
    """The JSON context of one chapter's file: ``context`` with the chapter's ``min_time_s`` and,
    where its rows are not timed as a stream of launches, its ``timing`` (CHAPTER_TIMING)."""
    out = dict(context)
    out["min_time_s"] = str(CHAPTER_MIN_TIME_S.get(chapter_id, min_time_s))
    if chapter_id in CHAPTER_TIMING:
        out["timing"] = CHAPTER_TIMING[chapter_id]
    return out


def run(chapters: Sequence[str], out_dir: str, repetitions: int, log: Callable[[str], None] = print) -> List[str]:
    """Runs the baselines of ``chapters`` and writes ``out_dir/chNN_pytorch.json``; returns the
    paths written. Call only when PyTorch and a GPU are available."""
    import torch

    props = torch.cuda.get_device_properties(0)
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
    # No kernel_names here: the profiler runs only in the --kernels pass, never where the timing is.
    env = Env(torch=torch, device=torch.device("cuda", 0), l2_bytes=l2_bytes, repetitions=repetitions, log=log,
              bench_dir=out_dir)
    context = base_context("pytorch %s" % torch.__version__, {
        "gpu": props.name,
        "gpu_arch": "sm_%d%d" % (props.major, props.minor),
        "gpu_sms": str(props.multi_processor_count),
        "gpu_l2_bytes": str(l2_bytes),
        "cuda_runtime": str(torch.version.cuda),
    })
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for chapter_id in chapters:
        chapter_env = dataclasses.replace(env, min_time_s=CHAPTER_MIN_TIME_S.get(chapter_id, env.min_time_s))
        results = BASELINES[chapter_id](chapter_env)
        doc = build_benchmark_json(chapter_context(context, chapter_id, env.min_time_s), results)
        path = os.path.join(out_dir, "%s_pytorch.json" % chapter_id)
        _write_json(doc, path)
        log("wrote %s" % path)
        written.append(path)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point. Exits 0 when PyTorch or a GPU is missing (writing nothing)."""
    parser = argparse.ArgumentParser(prog="pytorch_baselines.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapters", nargs="+", metavar="chNN", default=None,
                        help="chapters to run (default: all with a baseline: %s)" % " ".join(sorted(BASELINES)))
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for chNN_pytorch.json")
    parser.add_argument("--repetitions", type=int, default=DEFAULT_REPETITIONS,
                        help="timed samples per case (default %d)" % DEFAULT_REPETITIONS)
    parser.add_argument("--kernels", action="store_true",
                        help="no timing: run each case once under torch.profiler and add the kernels it "
                             "launched as labels to the chNN_pytorch.json a timed run wrote in --out")
    args = parser.parse_args(argv)
    if args.repetitions < 1:
        parser.error("--repetitions must be >= 1")
    chapters = args.chapters or sorted(BASELINES)
    unknown = [c for c in chapters if c not in BASELINES]
    for chapter_id in unknown:
        print("pytorch_baselines: no PyTorch baseline for %s; skipped" % chapter_id)
    chapters = [c for c in chapters if c in BASELINES]
    if not chapters:
        print("pytorch_baselines: nothing to run")
        return 0
    reason = _gpu_unavailable_reason()
    if reason:
        print("pytorch_baselines: %s; nothing written" % reason)
        return 0
    if args.kernels:
        list_kernels(chapters, args.out)
        return 0
    written = run(chapters, args.out, args.repetitions)
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import kc_results

        kc_results._emit(kc_results.render_summary([kc_results.load_benchmark_file(p) for p in written]))
    except Exception as e:  # the summary is a convenience; the JSON is what matters
        print("pytorch_baselines: could not print the summary (%s)" % e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
