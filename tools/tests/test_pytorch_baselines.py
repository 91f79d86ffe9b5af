"""Tests of tools/pytorch_baselines.py that need neither PyTorch nor a GPU: the JSON it writes,
the sizing rules, the chapter registry, the no-GPU exit and the timing loop (on a fake GPU)."""

import contextlib
import io
import json
import math
import os
import sys
import tempfile
import unittest
from unittest import mock

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
TOOLS_DIR = os.path.dirname(TESTS_DIR)
if TOOLS_DIR not in sys.path:
    sys.path.insert(0, TOOLS_DIR)

import kc_results as kr  # noqa: E402
import pytorch_baselines as pb  # noqa: E402

CONTEXT = {"date": "2026-11-30T05:30:00+00:00", "host_name": "h", "library": "pytorch 2.11.0"}


def aggregates(doc, run_name):
    return {b["aggregate_name"]: b for b in doc["benchmarks"] if b["run_name"] == run_name}


class BuildJsonTest(unittest.TestCase):
    def setUp(self):
        self.result = pb.CaseResult(chapter="ch01", case="fp32_N1024", times_s=[1e-6, 2e-6, 3e-6, 4e-6],
                                    min_bytes=12.0 * 1024, flop_count=1024.0, counters={"launches_per_batch": 64.0})
        self.doc = pb.build_benchmark_json(CONTEXT, [self.result])

    def test_schema(self):
        self.assertEqual(self.doc["context"], CONTEXT)
        entries = aggregates(self.doc, "ch01/pytorch/fp32_N1024/manual_time")
        self.assertEqual(sorted(entries), ["cv", "max", "mean", "median", "min", "stddev"])
        for name, entry in entries.items():
            self.assertEqual(entry["name"], "ch01/pytorch/fp32_N1024/manual_time_" + name)
            self.assertEqual(entry["run_type"], "aggregate")
            self.assertEqual(entry["repetitions"], 4)
            self.assertEqual(entry["time_unit"], "us")
            self.assertEqual(entry["aggregate_unit"], "percentage" if name == "cv" else "time")

    def test_statistics_like_google_benchmark(self):
        entries = aggregates(self.doc, "ch01/pytorch/fp32_N1024/manual_time")
        self.assertAlmostEqual(entries["median"]["real_time"], 2.5)
        self.assertAlmostEqual(entries["mean"]["real_time"], 2.5)
        self.assertAlmostEqual(entries["min"]["real_time"], 1.0)
        self.assertAlmostEqual(entries["max"]["real_time"], 4.0)
        sample_stddev = math.sqrt(5.0 / 3.0)  # n - 1 in the denominator
        self.assertAlmostEqual(entries["stddev"]["real_time"], sample_stddev)
        self.assertAlmostEqual(entries["cv"]["real_time"], sample_stddev / 2.5)
        # Rates are statistics of the per-sample rates: the min rate comes from the slowest sample.
        self.assertAlmostEqual(entries["min"]["bytes_per_second"], 12.0 * 1024 / 4e-6)
        self.assertAlmostEqual(entries["max"]["bytes_per_second"], 12.0 * 1024 / 1e-6)
        self.assertAlmostEqual(entries["median"]["flops"], (1024 / 2e-6 + 1024 / 3e-6) / 2)
        self.assertEqual(entries["median"]["launches_per_batch"], 64.0)
        self.assertEqual(entries["stddev"]["launches_per_batch"], 0.0)

    def test_round_trip_through_kc_results(self):
        parsed = kr.parse_benchmark_json(self.doc, "ch01_pytorch.json")
        m = parsed.measurements[0]
        self.assertEqual((m.chapter, m.variant, m.case), ("ch01", "pytorch", "fp32_N1024"))
        self.assertAlmostEqual(m.time_s, 2.5e-6)
        self.assertAlmostEqual(m.min_s, 1e-6)
        self.assertAlmostEqual(m.max_s, 4e-6)
        self.assertEqual(m.repetitions, 4)
        self.assertAlmostEqual(m.bytes_per_second, (12.0 * 1024 / 2e-6 + 12.0 * 1024 / 3e-6) / 2)

    def test_odd_sample_count_gives_consistent_rate(self):
        result = pb.CaseResult(chapter="ch01", case="fp32_N4", times_s=[3e-6, 1e-6, 2e-6], min_bytes=48.0)
        m = kr.parse_benchmark_json(pb.build_benchmark_json(CONTEXT, [result])).measurements[0]
        self.assertAlmostEqual(m.bytes_per_second * m.time_s, 48.0)

    def test_bad_samples(self):
        for times in ([], [1e-6, 0.0], [float("nan")]):
            with self.assertRaises(ValueError):
                pb.build_benchmark_json(CONTEXT, [pb.CaseResult("ch01", "x", times, 1.0)])

    def test_base_context(self):
        context = pb.base_context("pytorch 9.9", {"gpu": "G"})
        self.assertEqual(context["library"], "pytorch 9.9")
        self.assertEqual(context["gpu"], "G")
        for key in ("date", "host_name", "executable", "num_cpus"):
            self.assertIn(key, context)
        self.assertRegex(context["date"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d$")


class RealOutputTest(unittest.TestCase):
    """data/pytorch_h200_ch01.json: written by this script on an H200 (PyTorch 2.11, 10 repetitions)."""

    def test_parses_like_a_benchmark_file(self):
        parsed = kr.load_benchmark_file(os.path.join(TESTS_DIR, "data", "pytorch_h200_ch01.json"))
        self.assertTrue(parsed.context["library"].startswith("pytorch "))
        self.assertEqual([m.case for m in parsed.measurements], ["fp32_N%d" % n for n in pb.CH01_SIZES])
        for m in parsed.measurements:
            n = int(m.case.split("_N")[1])
            self.assertEqual((m.chapter, m.variant, m.repetitions), ("ch01", "pytorch", 10))
            self.assertLessEqual(m.min_s, m.time_s)
            self.assertLessEqual(m.time_s, m.max_s)
            # With an even number of samples the median rate and the rate of the median time
            # differ slightly; both count 12 n bytes.
            self.assertAlmostEqual(m.bytes_per_second * m.time_s / (12.0 * n), 1.0, delta=0.05)


class SizingTest(unittest.TestCase):
    def test_launches_per_batch(self):
        self.assertEqual(pb.launches_per_batch(1 << 16), 1024)
        self.assertEqual(pb.launches_per_batch(1 << 20), 64)
        self.assertEqual(pb.launches_per_batch(1 << 22), 16)
        self.assertEqual(pb.launches_per_batch(1 << 26), 1)
        self.assertEqual(pb.launches_per_batch(1 << 28), 1)

    def test_rotation_sets_exceed_twice_the_l2(self):
        l2 = 60 * 2 ** 20
        for n in pb.CH01_SIZES:
            set_bytes = 12 * n
            sets = pb.rotation_sets(set_bytes, l2)
            self.assertGreaterEqual(sets, 1)
            if set_bytes * sets <= pb.MAX_ROTATION_BYTES and set_bytes <= 2 * l2:
                self.assertGreater(sets * set_bytes, 2 * l2, n)
            self.assertLessEqual(sets * set_bytes, max(set_bytes, pb.MAX_ROTATION_BYTES))
        self.assertEqual(pb.rotation_sets(12 << 28, l2), 1)

    def test_rotation_sets_respect_the_memory_cap(self):
        self.assertEqual(pb.rotation_sets(1 << 20, 1 << 40, max_total_bytes=8 << 20), 8)
        self.assertEqual(pb.rotation_sets(0, 1 << 20), 1)


class RegistryTest(unittest.TestCase):
    def test_ch01_is_registered(self):
        self.assertIn("ch01", pb.BASELINES)
        self.assertEqual(pb.CH01_SIZES, [2 ** k for k in (16, 18, 20, 22, 24, 26, 28)])

    def test_registering_a_chapter(self):
        @pb.baseline("ch99")
        def fake(env):
            return []

        try:
            self.assertIs(pb.BASELINES["ch99"], fake)
        finally:
            del pb.BASELINES["ch99"]


class NoGpuTest(unittest.TestCase):
    def run_main(self, argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = pb.main(argv)
        return status, out.getvalue()

    def test_exits_0_and_writes_nothing_without_gpu(self):
        with tempfile.TemporaryDirectory() as tmp:
            out_dir = os.path.join(tmp, "out")
            with mock.patch.object(pb, "_gpu_unavailable_reason", return_value="PyTorch is not installed (test)"):
                status, out = self.run_main(["--chapters", "ch01", "--out", out_dir])
            self.assertEqual(status, 0)
            self.assertIn("PyTorch is not installed (test); nothing written", out)
            self.assertFalse(os.path.exists(out_dir))

    def test_real_environment_without_torch(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            reason = pb._gpu_unavailable_reason()
            self.assertIn("PyTorch is not installed", reason)
        else:
            self.skipTest("PyTorch is installed here")

    def test_unknown_chapter(self):
        with tempfile.TemporaryDirectory() as tmp:
            status, out = self.run_main(["--chapters", "ch42", "--out", tmp])
            self.assertEqual(status, 0)
            self.assertIn("no PyTorch baseline for ch42", out)
            self.assertEqual(os.listdir(tmp), [])


class Ch10NumbersTest(unittest.TestCase):
    """Chapter 10's labels and two numbers, as the C++ benchmark (bench/10_moe_layer_bench.cu) and
    chapters/10_moe_layer/moe_config.cpp count them."""

    def test_labels_match_the_cpp_cases(self):
        labels = [pb.ch10_case_label(m, t) for m in pb.CH10_CONFIGS for t in pb.CH10_TOKENS]
        self.assertEqual(len(labels), 15)
        self.assertIn("dsv3_T4096_bf16", labels)
        self.assertIn("qwen3_30b_a3b_T1_bf16", labels)
        for a in labels:
            for b in labels:
                self.assertFalse(a != b and b.startswith(a), (a, b))

    def test_bytes_and_flops_worked_by_hand(self):
        tiny = {"hidden": 64, "intermediate": 32, "experts": 8, "k": 2, "routing": "softmax", "shared": 1}
        counts = [4, 0, 0, 0, 0, 2, 0, 0]
        elements = 2 * 3 * 64 + 8 * 64 + 3 * (3 * 32 * 64)  # x, y, router, 2 routed + 1 shared expert
        self.assertEqual(pb.ch10_min_bytes(tiny, 3, counts), 2.0 * elements)
        self.assertEqual(pb.ch10_flops(tiny, 3), 2.0 * 3 * 64 * 8 + 2.0 * 3 * 2 * 3 * 32 * 64 + 2.0 * 3 * 3 * 32 * 64)
        dsv3 = pb.CH10_CONFIGS["dsv3"]
        self.assertAlmostEqual(pb.ch10_min_bytes(dsv3, 4096, [1] * 256) / 1e9, 22.7, delta=0.1)


if __name__ == "__main__":
    unittest.main()


class Ch02ShapesTest(unittest.TestCase):
    def test_labels_and_bytes(self):
        self.assertEqual(pb.ch02_case_label("bf16", 4096, 4096, 7168), "bf16_M4096_N4096_K7168")
        self.assertEqual(pb.ch02_min_bytes(2, 128, 4096, 7168), 2.0 * (128 * 7168 + 7168 * 4096 + 128 * 4096))
        self.assertIn((4096, 4096, 4096), pb.CH02_SHAPES)
        self.assertIn("ch02", pb.BASELINES)


class Ch03HelpersTest(unittest.TestCase):
    def test_labels_and_bytes(self):
        self.assertEqual(pb.ch03_case_label(128, 4096, 7168, "bias_gelu_res"), "bf16_M128_N4096_K7168_bias_gelu_res")
        # Same as kc::ch03::layer_min_bytes (tests/03_fused_epilogue_test.cu): A, W, bias, residual, C.
        self.assertEqual(pb.ch03_min_bytes(128, 4096, 7168, "bias_gelu_res"),
                         2.0 * (128 * 7168 + 4096 * 7168 + 4096 + 2 * 128 * 4096))
        self.assertEqual(pb.ch03_min_bytes(4096, 4096, 4096, "bias_gelu"), 2.0 * (3 * 4096 * 4096 + 4096))
        self.assertEqual(pb.ch03_min_bytes(16, 8192, 7168, "swiglu"), 2.0 * (16 * 7168 + 8192 * 7168 + 16 * 4096))
        labels = [pb.ch03_case_label(*c) for c in pb.CH03_CASES]
        for a in labels:
            for b in labels:
                self.assertTrue(a == b or not b.startswith(a), "%s is a prefix of %s" % (a, b))
        self.assertIn("ch03", pb.BASELINES)


class Ch04HelpersTest(unittest.TestCase):
    def test_labels_are_unique_and_never_a_prefix(self):
        labels = [c["label"] for c in pb.ch04_cases()]
        self.assertEqual(len(labels), 30)
        self.assertIn("fp32_T65536_E256_k8", labels)
        self.assertIn("fp32_dsv3_T4096", labels)
        for a in labels:
            for b in labels:
                if a != b:
                    self.assertFalse(b.startswith(a), "%s is a prefix of %s" % (a, b))

    def test_min_bytes(self):
        self.assertEqual(pb.ch04_min_bytes(65536, 256, 8), 4.0 * 65536 * 256 + 8.0 * 65536 * 8 + 4.0 * 256)
        self.assertIn("ch04", pb.BASELINES)


class Ch05HelpersTest(unittest.TestCase):
    def test_group_sizes_match_the_cpp_benchmark(self):
        # The same values as tests/05_grouped_gemm_test.cu, GroupedReference.BenchmarkGroupSizes.
        zipf = pb.ch05_group_sizes("zipf", 256, 8192)
        self.assertEqual((zipf[0], zipf[1], zipf[255]), (1338, 669, 5))
        hot = pb.ch05_group_sizes("one_hot", 256, 8192)
        self.assertEqual((hot[0], hot[1], hot[17]), (4096, 17, 16))
        holes = pb.ch05_group_sizes("quarter_empty", 256, 8192)
        self.assertEqual((holes[0], holes[4], holes[1], holes[255]), (0, 0, 43, 42))
        self.assertEqual(holes.count(0), 64)
        ragged = pb.ch05_group_sizes("ragged", 256, 32768)
        self.assertEqual((ragged[0], ragged[1], ragged[255]), (108, 145, 145))
        self.assertEqual(sum(1 for s in ragged if s > 128), 125)
        for kind in ("uniform", "zipf", "one_hot", "quarter_empty", "ragged"):
            for experts in (1, 3, 8, 256):
                for rows in (0, 1, 100, 8192):
                    sizes = pb.ch05_group_sizes(kind, experts, rows)
                    self.assertEqual(len(sizes), experts)
                    self.assertEqual(sum(sizes), rows)
                    self.assertTrue(all(s >= 0 for s in sizes))
        with self.assertRaises(ValueError):
            pb.ch05_group_sizes("pareto", 8, 10)

    def test_labels_and_bytes(self):
        labels = [c[0] for c in pb.CH05_CASES]
        self.assertIn("G256xM128_N4096_K7168", labels)
        self.assertIn("G8xM4096_N28672_K4096", labels)
        for a in labels:
            for b in labels:
                self.assertTrue(a == b or not b.startswith(a), "%s is a prefix of %s" % (a, b))
        # Same as kc::ch05::grouped_gemm_min_bytes with 25 % empty experts (tests/05_grouped_gemm_test.cu).
        sizes = [0 if e % 4 == 0 else 43 for e in range(256)]
        self.assertEqual(pb.ch05_min_bytes(sizes, 4096, 7168),
                         2.0 * (8256 * 7168 + 192 * 4096 * 7168 + 8256 * 4096))
        self.assertIn("ch05", pb.BASELINES)


class Ch06HelpersTest(unittest.TestCase):
    def test_cases_match_the_cpp_benchmark(self):
        # kc::ch06::benchmark_cases (tests/06_persistent_test.cu, PersistentWaves.BenchmarkCasesOn132Slots).
        labels = [c[0] for c in pb.CH06_CASES]
        self.assertEqual(labels[:len(pb.CH05_CASES)], [c[0] for c in pb.CH05_CASES])
        self.assertEqual(labels[-2:], ["tail_G3xM384_N2048_K7168", "tail_G4xM384_N2048_K7168"])
        for a in labels:
            for b in labels:
                self.assertTrue(a == b or not b.startswith(a), "%s is a prefix of %s" % (a, b))
        # The tail cases' tiles: sum of ceil(rows / 128) over experts, times ceil(N / 128).
        tiles = {label: sum((s + 127) // 128 for s in pb.ch05_group_sizes(kind, e, rows)) * ((n + 127) // 128)
                 for label, kind, e, rows, n, _ in pb.CH06_CASES}
        self.assertEqual(tiles["tail_G3xM384_N2048_K7168"], 144)
        self.assertEqual(tiles["tail_G4xM384_N2048_K7168"], 192)
        self.assertEqual(tiles["G256xM128_N4096_K7168"], 8192)
        self.assertIn("ch06", pb.BASELINES)


class Ch08HelpersTest(unittest.TestCase):
    # bench/08_hopper_grouped_gemm_bench.cu's cases.
    CPP_LABELS = ["G8xM4096_N4096_K7168", "G32xM256_N4096_K7168", "G256xM128_N4096_K7168", "G8xM4096_N7168_K2048",
                  "G256xM128_N7168_K2048", "G8xM4096_N28672_K4096", "G128xM256_N1536_K2048",
                  "E256_M8192_zipf_N4096_K7168", "E256_M8192_hot_N4096_K7168", "E256_M8192_empty25_N4096_K7168",
                  "E256_M32768_ragged_N4096_K7168"]

    def test_cases_match_the_cpp_benchmark(self):
        labels = [c[0] for c in pb.CH08_CASES]
        self.assertEqual(sorted(labels), sorted(self.CPP_LABELS))
        for a in labels:
            for b in labels:
                self.assertTrue(a == b or not b.startswith(a), "%s is a prefix of %s" % (a, b))
        for label, kind, experts, rows, n, k in pb.CH08_CASES:
            # The label says the shape: G{E}xM{rows per expert}_N_K or E{E}_M{rows}_{kind}_N_K.
            self.assertTrue(label.endswith("_N%d_K%d" % (n, k)), label)
            prefix = "G%dxM%d_" % (experts, rows // experts) if kind == "uniform" else "E%d_M%d_" % (experts, rows)
            self.assertTrue(label.startswith(prefix), label)
        self.assertIn("ch08", pb.BASELINES)

    def test_group_sizes_encoding(self):
        self.assertEqual(pb.encode_group_sizes(pb.ch05_group_sizes("uniform", 256, 256 * 128)), "128*256")
        holes = pb.encode_group_sizes(pb.ch05_group_sizes("quarter_empty", 256, 8192))
        self.assertTrue(holes.startswith("0,43*3,0,43*3,"), holes)
        self.assertEqual(pb.encode_group_sizes([5, 7, 7, 0]), "5,7*2,0")
        self.assertEqual(pb.encode_group_sizes([]), "")
        for label, kind, experts, rows, _, _ in pb.CH08_CASES:
            sizes = pb.ch05_group_sizes(kind, experts, rows)
            self.assertEqual(pb.decode_group_sizes(pb.encode_group_sizes(sizes)), sizes, label)
        for bad in ("", "1,,2", "3*0", "-1", "4*", "x*2"):
            with self.assertRaises(ValueError, msg=bad):
                pb.decode_group_sizes(bad)

    def test_sizes_come_from_the_benchmark_json_where_it_recorded_them(self):
        hot = pb.ch05_group_sizes("one_hot", 256, 8192)
        context = {"gpu": "G", "group_sizes/E256_M8192_hot_N4096_K7168": pb.encode_group_sizes(hot),
                   "group_sizes/G8xM4096_N4096_K7168": "4000*8"}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ch08_bench.json")
            self.assertEqual(pb.bench_group_sizes(path), {})  # no C++ run: nothing recorded
            with open(path, "w") as f:
                json.dump({"context": context, "benchmarks": []}, f)
            recorded = pb.bench_group_sizes(path)
        self.assertEqual(recorded, {"E256_M8192_hot_N4096_K7168": hot, "G8xM4096_N4096_K7168": [4000] * 8})
        lines = []
        sizes = pb.grouped_case_sizes(pb.CH08_CASES, recorded, lines.append)
        self.assertEqual(sizes["E256_M8192_hot_N4096_K7168"], hot)
        self.assertEqual(sizes["G8xM4096_N4096_K7168"], [4000] * 8)  # the benchmark's, with a word on it
        self.assertEqual(sizes["G128xM256_N1536_K2048"], [256] * 128)  # not recorded: computed
        self.assertEqual(len(lines), 1)
        self.assertIn("G8xM4096_N4096_K7168: the C++ benchmark's group sizes", lines[0])

    def test_the_baseline_reads_the_benchmark_json_next_to_its_output(self):
        class NoGroupedMm:  # a torch without _grouped_mm: the baseline logs and times nothing
            __version__ = "0.0-fake"

        recorded = json.dumps({"context": {"group_sizes/G8xM4096_N4096_K7168": "4096*8"}})
        for content, expected in ((None, "computed as kc::ch05::group_sizes"),
                                  (recorded, "from ch08_bench.json"),
                                  ('{"context": {', "cannot read the group sizes")):  # a run that stopped
            with tempfile.TemporaryDirectory() as tmp:
                if content is not None:
                    with open(os.path.join(tmp, "ch08_bench.json"), "w") as f:
                        f.write(content)
                lines = []
                env = pb.Env(torch=NoGroupedMm, device=None, l2_bytes=0, repetitions=1, log=lines.append,
                             bench_dir=tmp)
                self.assertEqual(pb.BASELINES["ch08"](env), [])
                self.assertTrue(any(expected in line for line in lines), lines)
                self.assertIn("ch08: torch 0.0-fake has no torch._grouped_mm; skipped", lines)


class _NoGroupedMmNoMemoryTorch:
    """A torch without _grouped_mm and with no free GPU memory: Chapter 9's baseline logs why it skips
    each case and times nothing."""

    __version__ = "0.0-fake"

    class Generator:
        def __init__(self, device=None):
            pass

        def manual_seed(self, seed):
            pass

    class cuda:
        @staticmethod
        def mem_get_info():
            return 0, 80 << 30


class Ch09HelpersTest(unittest.TestCase):
    ROUTED = ["dsv3_decode_T%d_E256_k8_N4096_K7168" % t for t in (1, 8, 32, 128)]

    def test_cases(self):
        labels = [c[0] for c in pb.CH09_CASES]
        self.assertEqual(len(labels), 20)
        self.assertEqual(len(set(labels)), len(labels))
        for a in labels:
            for b in labels:
                self.assertTrue(a == b or not b.startswith(a), "%s is a prefix of %s" % (a, b))
        for m in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            self.assertIn(("G32xM%d_N4096_K7168" % m, "uniform", 32, 32 * m, 4096, 7168), pb.CH09_CASES)
        for m in (1, 4, 16, 64):
            self.assertIn(("G8xM%d_N28672_K4096" % m, "uniform", 8, 8 * m, 28672, 4096), pb.CH09_CASES)
        for m in (1, 4, 16):
            self.assertIn(("G128xM%d_N1536_K2048" % m, "uniform", 128, 128 * m, 1536, 2048), pb.CH09_CASES)
        routed = [c for c in pb.CH09_CASES if c[1] == pb.ROUTED_KIND]
        self.assertEqual([c[0] for c in routed], self.ROUTED)
        for label, _, experts, rows, n, k in routed:
            tokens = int(label.split("_T")[1].split("_")[0])
            self.assertEqual((experts, rows, n, k), (256, 8 * tokens, 4096, 7168), label)
        for label, kind, experts, rows, n, k in pb.CH09_CASES:
            self.assertTrue(label.endswith("_N%d_K%d" % (n, k)), label)
            if kind == "uniform":
                self.assertTrue(label.startswith("G%dxM%d_" % (experts, rows // experts)), label)
        self.assertIn("ch09", pb.BASELINES)

    def test_equal_groups(self):
        self.assertTrue(pb.equal_groups([4] * 32))
        self.assertTrue(pb.equal_groups([1]))
        self.assertFalse(pb.equal_groups([]))
        self.assertFalse(pb.equal_groups([0] * 8))  # no rows: nothing for torch.bmm to multiply
        self.assertFalse(pb.equal_groups([4, 4, 3, 5]))
        self.assertFalse(pb.equal_groups([1] * 8 + [0] * 248))  # a routing's sizes
        for label, kind, experts, rows, _, _ in pb.CH09_CASES:
            if kind == "uniform":
                self.assertTrue(pb.equal_groups(pb.ch05_group_sizes(kind, experts, rows)), label)

    def test_routed_case_skip_reason(self):
        routed, uniform = self.ROUTED[0], "G32xM1_N4096_K7168"
        recorded = {self.ROUTED[1]: [1] * 64 + [0] * 192}
        reason = pb.routed_case_skip_reason
        self.assertIsNone(reason(uniform, "uniform", {}, "ch09_bench.json", "no file"))  # computed
        self.assertIsNone(reason(self.ROUTED[1], pb.ROUTED_KIND, recorded, "ch09_bench.json"))
        self.assertEqual(reason(routed, pb.ROUTED_KIND, recorded, "ch09_bench.json"),
                         "ch09_bench.json records no group_sizes/" + routed)
        self.assertEqual(reason(routed, pb.ROUTED_KIND, {}, "ch09_bench.json", "x not found"), "x not found")

    def test_routed_sizes_are_the_recorded_ones(self):
        cases = [c for c in pb.CH09_CASES if c[0] in (self.ROUTED[0], self.ROUTED[1], "G8xM4_N28672_K4096")]
        lines = []
        recorded = {self.ROUTED[0]: [1] * 8 + [0] * 248, self.ROUTED[1]: [1] * 60 + [0] * 196}
        sizes = pb.grouped_case_sizes(cases, recorded, lines.append)
        self.assertEqual(sizes, {self.ROUTED[0]: recorded[self.ROUTED[0]], self.ROUTED[1]: recorded[self.ROUTED[1]],
                                 "G8xM4_N28672_K4096": [4] * 8})
        self.assertEqual(len(lines), 1)  # T8's sizes sum to 60 rows, not 8 x 8
        self.assertIn(self.ROUTED[1] + ": the C++ benchmark's group sizes (256 experts, 60 rows)", lines[0])
        self.assertNotIn(self.ROUTED[2], pb.grouped_case_sizes(pb.CH09_CASES, {}, lines.append))

    def test_the_baseline_skips_routed_cases_without_recorded_sizes(self):
        uniform = [c[0] for c in pb.CH09_CASES if c[1] == "uniform"]
        recorded = json.dumps({"context": {"group_sizes/" + self.ROUTED[0]: "0*248,1*8",
                                           "group_sizes/" + self.ROUTED[2]: "1*256",
                                           "group_sizes/G8xM4_N28672_K4096": "5,3,4*6"}})
        for content, why in ((None, "ch09_bench.json not found"), (recorded, "ch09_bench.json records no "),
                             ('{"context": {', "cannot read the group sizes")):  # a run that stopped
            with tempfile.TemporaryDirectory() as tmp:
                if content is not None:
                    with open(os.path.join(tmp, "ch09_bench.json"), "w") as f:
                        f.write(content)
                lines = []
                env = pb.Env(torch=_NoGroupedMmNoMemoryTorch, device=None, l2_bytes=0, repetitions=1,
                             log=lines.append, bench_dir=tmp)
                self.assertEqual(pb.BASELINES["ch09"](env), [])
            self.assertIn("ch09: torch 0.0-fake has no torch._grouped_mm; skipped", lines)
            skipped = [line for line in lines if line.endswith("; skipped") and why in line]
            timed_routed = [self.ROUTED[0], self.ROUTED[2]] if content == recorded else []
            self.assertEqual(sorted(line.split(":")[0] for line in skipped),
                             sorted("ch09 " + r for r in self.ROUTED if r not in timed_routed), lines)
            # torch.bmm tries (and here skips for memory) the cases of equal groups only: the uniform ones
            # but where recorded otherwise, and a routed one whose recorded groups are all equal.
            equal = uniform + [self.ROUTED[2]] if content == recorded else uniform
            bmm = [line.split(":")[0][len("ch09 pytorch_bmm "):] for line in lines
                   if line.startswith("ch09 pytorch_bmm ") and "GB free; skipped" in line]
            self.assertEqual(bmm, [c[0] for c in pb.CH09_CASES if c[0] in equal
                                   and (content != recorded or c[0] != "G8xM4_N28672_K4096")], lines)


class _FakeEvent:
    """A CUDA event of the fake torch below: elapsed_time gives the fake GPU's time between two
    records, in milliseconds, as torch.cuda.Event does."""

    def __init__(self, gpu, enable_timing=False):
        self.gpu = gpu
        self.at_ms = None

    def record(self):
        self.at_ms = self.gpu.now_ms

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.at_ms - self.at_ms


class _FakeGpu:
    """Enough of torch for time_samples: launches advance a clock by a per-launch time; the hold
    (torch.cuda._sleep) advances it too but lies before the start event."""

    def __init__(self, launch_ms):
        self.now_ms = 0.0
        self.launch_ms = launch_ms
        self.calls = []
        gpu = self

        class Cuda:
            @staticmethod
            def Event(enable_timing=False):
                return _FakeEvent(gpu, enable_timing)

            @staticmethod
            def _sleep(cycles):
                gpu.now_ms += 0.1

        class Torch:
            cuda = Cuda

        self.torch = Torch

    def launch(self, which):
        def run():
            self.calls.append(which)
            self.now_ms += self.launch_ms

        return run


class TimeSamplesTest(unittest.TestCase):
    def env(self, gpu, repetitions, warmup=1, min_time_s=0.2):
        return pb.Env(torch=gpu.torch, device=None, l2_bytes=0, repetitions=repetitions, warmup=warmup,
                      min_time_s=min_time_s, log=lambda _: None)

    def test_each_sample_runs_until_its_gpu_time_reaches_min_time(self):
        gpu = _FakeGpu(launch_ms=0.5)  # 0.5 ms a launch, batches of 4: 2 ms a batch
        timed = pb.time_samples(self.env(gpu, repetitions=3), [gpu.launch(0), gpu.launch(1)], batch=4)
        # 0.2 s per sample = 100 batches = 400 launches; one untimed sample first.
        self.assertEqual(len(gpu.calls), 4 * 400)
        self.assertEqual(len(timed["times"]), 3)
        self.assertEqual(len(timed["cpu_times"]), 3)
        for t in timed["times"]:
            self.assertAlmostEqual(t, 0.5e-3)  # per launch; the 0.1 ms holds are not timed
        self.assertEqual(gpu.calls[:4], [0, 1, 0, 1])  # the inputs rotate

    def test_a_launch_longer_than_min_time_still_runs_once_a_sample(self):
        gpu = _FakeGpu(launch_ms=300.0)
        timed = pb.time_samples(self.env(gpu, repetitions=2, warmup=0), [gpu.launch(0)], batch=1)
        self.assertEqual(len(gpu.calls), 2)
        self.assertEqual([round(t, 6) for t in timed["times"]], [0.3, 0.3])

    def test_the_warm_up_sample_is_not_reported(self):
        gpu = _FakeGpu(launch_ms=1.0)
        original = gpu.launch(0)

        def slower_later():
            original()
            gpu.launch_ms = 2.0  # every launch after the first takes 2 ms

        timed = pb.time_samples(self.env(gpu, repetitions=1, min_time_s=0.01), [slower_later], batch=1)
        self.assertEqual(len(timed["times"]), 1)
        self.assertAlmostEqual(timed["times"][0], 2.0e-3)


class _FakeGraphGpu(_FakeGpu):
    """_FakeGpu with CUDA graphs: a launch made while a graph captures is recorded in it and runs
    nothing; a replay runs the recorded launches. A launch returns an output that equals another
    call's of the same ``which`` or, with ``replay_differs``, differs between a replayed and an
    eager call. The L2 eviction is a launch of its own ("evict", 0.05 ms), outside the events."""

    def __init__(self, launch_ms, replay_differs=False):
        super().__init__(launch_ms)
        self.capturing = None
        self.graphs = []
        gpu = self

        class Graph:
            def __init__(self):
                self.nodes = []
                self.replays = 0
                gpu.graphs.append(self)

            def replay(self):
                self.replays += 1
                for which in self.nodes:
                    gpu.calls.append(which)
                    gpu.now_ms += gpu.launch_ms

            def reset(self):
                self.nodes = None

        class Capture:
            def __init__(self, graph):
                self.graph = graph

            def __enter__(self):
                gpu.capturing = self.graph

            def __exit__(self, *exc):
                gpu.capturing = None

        class Stream:
            def wait_stream(self, other):
                pass

        class Cuda(self.torch.cuda):
            CUDAGraph = Graph

            @staticmethod
            def graph(g):
                return Capture(g)

            @staticmethod
            def Stream():  # noqa: N802 (torch.cuda.Stream)
                return Stream()

            @staticmethod
            def stream(s):
                return contextlib.nullcontext()

            @staticmethod
            def current_stream():
                return Stream()

            @staticmethod
            def synchronize():
                pass

        class Torch:
            cuda = Cuda

            @staticmethod
            def equal(a, b):
                return a.which == b.which and not (replay_differs and a.captured != b.captured)

        self.torch = Torch

    def launch(self, which):
        def run():
            if self.capturing is not None:
                self.capturing.nodes.append(which)
                return mock.Mock(which=which, captured=True, is_floating_point=lambda: False)
            self.calls.append(which)
            self.now_ms += self.launch_ms
            return mock.Mock(which=which, captured=False, is_floating_point=lambda: False)

        return run

    def evict(self):
        self.calls.append("evict")
        self.now_ms += 0.05


class TimeGraphSamplesTest(unittest.TestCase):
    def env(self, gpu, repetitions, warmup=1, min_time_s=0.2):
        return pb.Env(torch=gpu.torch, device=None, l2_bytes=0, repetitions=repetitions, warmup=warmup,
                      min_time_s=min_time_s, log=lambda _: None)

    def test_one_capture_of_the_batch_then_replays_each_after_an_eviction(self):
        gpu = _FakeGraphGpu(launch_ms=0.5)  # batches of 4: 2 ms a replay
        timed = pb.time_graph_samples(self.env(gpu, repetitions=3), [gpu.launch(0), gpu.launch(1), gpu.launch(2)],
                                      batch=4, evict=gpu.evict)
        self.assertEqual(len(gpu.graphs), 1)  # captured once
        self.assertIsNone(gpu.graphs[0].nodes)  # reset after the timing: its memory freed
        self.assertEqual(gpu.graphs[0].replays, 1 + 4 * 100)  # the check's replay, then 100 a sample
        self.assertEqual(len(timed["times"]), 3)
        for t in timed["times"]:
            self.assertAlmostEqual(t, 0.5e-3)  # per call: neither the eviction nor the hold is timed
        # Each pass evicts, then replays; the calls rotate over the sets within the batch, as the C++
        # benchmark's capture does.
        replays = gpu.calls[gpu.calls.index("evict"):]
        self.assertEqual(replays[:10], ["evict", 0, 1, 2, 0, "evict", 0, 1, 2, 0])
        self.assertEqual(timed["kernels"], [])

    def test_the_warm_up_before_capture_and_the_eager_check(self):
        gpu = _FakeGraphGpu(launch_ms=1.0)
        pb.time_graph_samples(self.env(gpu, repetitions=1, warmup=0, min_time_s=0.0),
                              [gpu.launch(0), gpu.launch(1)], batch=3, evict=gpu.evict)
        # Eager warm-up of the first calls (no more than the batch, at most 3), the check's replay
        # (0, 1, 0), the same last call eagerly (0), then one timed pass.
        self.assertEqual(gpu.calls, [0, 1, 0, 1, 0, 0, "evict", 0, 1, 0])

    def test_a_replay_that_differs_from_the_eager_call_is_an_error(self):
        gpu = _FakeGraphGpu(launch_ms=1.0, replay_differs=True)
        with self.assertRaisesRegex(RuntimeError, "differs from the same call run eagerly"):
            pb.time_graph_samples(self.env(gpu, repetitions=1), [gpu.launch(0)], batch=2, evict=gpu.evict)
        self.assertNotIn("evict", gpu.calls)  # nothing timed

    def test_same_outputs(self):
        class Tensor:
            def __init__(self, value, floating=False, shape=(1,)):
                self.value, self.floating, self.shape = value, floating, shape

            def is_floating_point(self):
                return self.floating

            def float(self):
                return self

        class Torch:
            @staticmethod
            def equal(a, b):
                return a.value == b.value

            @staticmethod
            def allclose(a, b, rtol, atol):
                return abs(a.value - b.value) <= atol + rtol * abs(b.value)

        def t(*values, **kw):
            return [Tensor(v, **kw) for v in values]

        self.assertTrue(pb._same_outputs(Torch, (t(1)[0], t(2, 3)), (t(1)[0], t(2, 3))))
        self.assertFalse(pb._same_outputs(Torch, (t(1)[0], t(2, 3)), (t(1)[0], t(2, 4))))
        self.assertFalse(pb._same_outputs(Torch, tuple(t(1, 2)), tuple(t(1, 2, 3))))
        self.assertFalse(pb._same_outputs(Torch, tuple(t(1)), t(1)[0]))
        # Floating point: another rounding passes, another result does not; integers must be equal.
        self.assertTrue(pb._same_outputs(Torch, Tensor(1.0, True), Tensor(1.005, True)))
        self.assertFalse(pb._same_outputs(Torch, Tensor(1.0, True), Tensor(1.5, True)))
        self.assertFalse(pb._same_outputs(Torch, Tensor(1.0, True), Tensor(1.005, True, shape=(2,))))
        self.assertFalse(pb._same_outputs(Torch, Tensor(1), Tensor(2)))


class GraphAndEagerResultsTest(unittest.TestCase):
    def test_two_rows_of_one_case_and_one_kernel_listing(self):
        gpu = _FakeGraphGpu(launch_ms=1.0)
        listed = []

        def names_of(launch):
            listed.append(launch)
            return ["void softmax<4>(float*)", "void topk<8>(float*)"]

        env = pb.Env(torch=gpu.torch, device=None, l2_bytes=0, repetitions=2, warmup=0, min_time_s=0.0,
                     log=lambda _: None, kernel_names=names_of)
        launches = [gpu.launch(0), gpu.launch(1)]
        rows = pb.graph_and_eager_results(env, "ch04", "T16", launches, 2, gpu.evict, min_bytes=8.0,
                                          counters={"launches_per_batch": 2.0})
        self.assertEqual([(r.chapter, r.case, r.variant) for r in rows],
                         [("ch04", "T16", "pytorch"), ("ch04", "T16", "pytorch_eager")])
        self.assertEqual(listed, [launches[0]])  # one profiled call for both rows
        for row in rows:
            self.assertEqual(row.kernels, ["softmax", "topk"])
            self.assertEqual((row.min_bytes, row.counters), (8.0, {"launches_per_batch": 2.0}))
            self.assertEqual([round(t, 9) for t in row.times_s], [1e-3, 1e-3])
        # The graph row's passes evict first; the eager row's do not.
        graph_part, eager_part = gpu.calls[:gpu.calls.index("evict") + 6], gpu.calls[gpu.calls.index("evict") + 6:]
        self.assertEqual(graph_part[-6:], ["evict", 0, 1, "evict", 0, 1])
        self.assertEqual(eager_part, [0, 1, 0, 1])


class ChapterTimingTest(unittest.TestCase):
    def test_chapter_4_follows_its_cpp_rows_and_the_others_the_default(self):
        ch04 = pb.chapter_context(CONTEXT, "ch04", pb.MIN_TIME_S)
        self.assertEqual(ch04["min_time_s"], "0.1")  # bench/04's MinTime(0.1)
        self.assertEqual(ch04["timing"], kr.GRAPH_REPLAY_TIMING)
        ch01 = pb.chapter_context(CONTEXT, "ch01", pb.MIN_TIME_S)
        self.assertEqual(ch01["min_time_s"], str(pb.MIN_TIME_S))
        self.assertNotIn("timing", ch01)
        self.assertNotIn("timing", CONTEXT)  # the shared context is not changed

    def test_the_baseline_line_of_a_graph_timed_file(self):
        line = kr._baseline_timing(pb.chapter_context(CONTEXT, "ch04", pb.MIN_TIME_S))
        self.assertTrue(line.startswith("`pytorch`: each sample at least 0.1 s of GPU time in replays of a CUDA graph"),
                        line)
        self.assertIn("`pytorch_eager`: the same calls launched one by one", line)
        ch03 = pb.chapter_context(CONTEXT, "ch03", pb.MIN_TIME_S)  # graph-timed, the default sample time
        self.assertEqual((ch03["min_time_s"], ch03["timing"]), (str(pb.MIN_TIME_S), kr.GRAPH_REPLAY_TIMING))

    def test_run_gives_chapter_4_its_own_sample_time(self):
        seen = {}

        def fake_baseline(env):
            seen["min_time_s"] = env.min_time_s
            return [pb.CaseResult(chapter="ch04", case="A", times_s=[1e-3], min_bytes=1.0)]

        with _fake_torch_and_baseline("ch04", fake_baseline) as out:
            pb.run(["ch04"], out, repetitions=1, log=lambda _: None)
            with open(os.path.join(out, "ch04_pytorch.json"), encoding="utf-8") as f:
                context = json.load(f)["context"]
        self.assertEqual(seen["min_time_s"], 0.1)
        self.assertEqual((context["min_time_s"], context["timing"]), ("0.1", kr.GRAPH_REPLAY_TIMING))

    def test_both_rows_of_a_case_share_one_line_of_the_kernels_table(self):
        results = [pb.CaseResult(chapter="ch04", case=case, times_s=[1e-4], min_bytes=1.0, variant=variant,
                                 kernels=["softmax", "topk"])
                   for case in ("T16", "T1") for variant in ("pytorch", "pytorch_eager")]
        doc = pb.build_benchmark_json(CONTEXT, results)
        pb.add_kernel_labels(doc, results)
        bench = kr.parse_benchmark_json(pb.build_benchmark_json(CONTEXT, []), "ch04_bench.json")
        page = kr.render_chapter_markdown(kr.ChapterResults("ch04", [bench, kr.parse_benchmark_json(
            doc, "ch04_pytorch.json")], {}, False))
        self.assertIn("What the `pytorch`, `pytorch_eager` rows ran", page)
        self.assertIn("| `softmax` → `topk` | `T1`, `T16` |", page)


# The shape of the mangled name torch.profiler gives a CUTLASS 3 grouped GEMM (shortened: the real
# ones, in data/torch_profiler_cutlass_names.txt, run to 1,270 characters of template arguments).
CUTLASS_MANGLED = ("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13Gemm"
                   "UniversalINS5_17GroupProblemShapeIN4cute5tupleIJiiiEEEEENS5_10collective13CollectiveMmaINS5_39Main"
                   "loopSm90ArrayTmaGmmaWarpSpecializedILi4ENSA_IJNS9_1CILi2EEENSG_ILi1EEESI_EEENS5_43KernelPtrArray"
                   "TmaWarpSpecializedCooperativeEEENS9_8TiledMMAINS9_8MMA_AtomIJNS9_4SM904GMMA28MMA_64x256x16_F32BF16"
                   "BF16_SSILNSX_5MajorE0EEEEEEEEEEEvNT_6ParamsE")


class KernelNamesTest(unittest.TestCase):
    def test_cutlass_kernel_by_its_schedule_and_mma(self):
        self.assertEqual(pb.short_kernel_name(CUTLASS_MANGLED),
                         "cutlass::device_kernel (KernelPtrArrayTmaWarpSpecializedCooperative, "
                         "MMA_64x256x16_F32BF16BF16_SS)")

    def test_real_profiler_names(self):
        # data/torch_profiler_cutlass_names.txt: the two kernels torch._grouped_mm ran on an H200 (PyTorch
        # 2.11), as torch.profiler named them.
        with open(os.path.join(TESTS_DIR, "data", "torch_profiler_cutlass_names.txt"), encoding="utf-8") as f:
            names = f.read().split()
        self.assertTrue(names)
        shorts = {pb.short_kernel_name(n) for n in names}
        self.assertEqual(shorts, {
            "cutlass::device_kernel (KernelPtrArrayTmaWarpSpecializedCooperative, MMA_64x256x16_F32BF16BF16_SS)",
            "cutlass::device_kernel (KernelPtrArrayTmaWarpSpecializedPingpong, MMA_64x128x16_F32BF16BF16_SS)"})

    def test_other_names(self):
        cases = {
            "void at::cuda::detail::prepare_grouped_gemm_data<cutlass::bfloat16_t>(cutlass::bfloat16_t*, int)":
                "at::cuda::detail::prepare_grouped_gemm_data",
            "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT": "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT",
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*, int)":
                "at::native::{anonymous}::cunn_SoftMaxForward",
            "Memcpy DtoD (Device -> Device)": "Memcpy DtoD",
            "_Z10add_kernelPKfS0_Pfi": "add_kernel",
            "_ZN2kc4ch0410copy_bytesEPKhPhm": "kc::ch04::copy_bytes",
            "_ZN7cutlass13device_kernelIiEEvv": "cutlass::device_kernel",  # no schedule, no MMA: the name alone
        }
        for raw, short in cases.items():
            self.assertEqual(pb.short_kernel_name(raw), short, raw)

    def test_long_names_are_cut(self):
        short = pb.short_kernel_name("k" * 400)
        self.assertEqual(len(short), 160)
        self.assertTrue(short.endswith("…"))

    def test_collapse_repeats_counts_runs_and_keeps_every_launch(self):
        self.assertEqual(pb.collapse_repeats([]), [])
        self.assertEqual(pb.collapse_repeats(["a"]), ["a"])
        self.assertEqual(pb.collapse_repeats(["a", "a"]), ["a × 2"])
        # A name that comes back after another is listed again, in its place.
        self.assertEqual(pb.collapse_repeats(["b", "a", "a", "a", "b", "c", "c"]), ["b", "a × 3", "b", "c × 2"])

    def test_time_samples_lists_what_one_call_launched(self):
        gpu = _FakeGpu(launch_ms=1.0)
        seen = []

        def names_of(launch):
            before = len(gpu.calls)
            launch()
            seen.append(len(gpu.calls) - before)
            return ["void my_kernel<4>(float*)", "void my_kernel<8>(float*)", "_Z10add_kernelPKfS0_Pfi",
                    "void my_kernel<4>(float*)"]

        env = pb.Env(torch=gpu.torch, device=None, l2_bytes=0, repetitions=1, warmup=0, min_time_s=0.001,
                     log=lambda _: None, kernel_names=names_of)
        timed = pb.time_samples(env, [gpu.launch(0), gpu.launch(1)], batch=1)
        # Short names, every launch in order: the two back-to-back launches of my_kernel counted.
        self.assertEqual(timed["kernels"], ["my_kernel × 2", "add_kernel", "my_kernel"])
        self.assertEqual(seen, [1])  # one call, after the timed samples
        timing = pb.Env(torch=gpu.torch, device=None, l2_bytes=0, repetitions=1, warmup=0, min_time_s=0.001,
                        log=lambda _: None)  # no kernel_names: what the timed pass has
        self.assertEqual(pb.time_samples(timing, [gpu.launch(0)], batch=1)["kernels"], [])

    def test_labels_and_their_table_on_the_results_page(self):
        results = [pb.CaseResult(chapter="ch05", case="G8", times_s=[1e-3], min_bytes=1.0, variant="pytorch",
                                 kernels=["prep", "cutlass::device_kernel (KernelX, MMA_64x256x16_F32BF16BF16_SS)"]),
                   pb.CaseResult(chapter="ch05", case="G256", times_s=[2e-3], min_bytes=1.0, variant="pytorch",
                                 kernels=["prep", "cutlass::device_kernel (KernelY, MMA_64x128x16_F32BF16BF16_SS)"]),
                   pb.CaseResult(chapter="ch05", case="G32", times_s=[2e-3], min_bytes=1.0, variant="pytorch",
                                 kernels=["prep", "cutlass::device_kernel (KernelX, MMA_64x256x16_F32BF16BF16_SS)"]),
                   pb.CaseResult(chapter="ch05", case="G4", times_s=[2e-3], min_bytes=1.0, variant="pytorch"),
                   pb.CaseResult(chapter="ch05", case="G16", times_s=[2e-3], min_bytes=1.0, variant="pytorch",
                                 kernels=pb.collapse_repeats(["prep", "elementwise", "elementwise"]))]
        doc = pb.build_benchmark_json(CONTEXT, results)
        self.assertFalse(any("label" in e for e in doc["benchmarks"]))  # the timed pass writes none
        self.assertEqual(pb.add_kernel_labels(doc, results), 4)
        median = aggregates(doc, "ch05/pytorch/G8/manual_time")["median"]
        self.assertEqual(median["label"], "prep → cutlass::device_kernel (KernelX, MMA_64x256x16_F32BF16BF16_SS)")
        self.assertNotIn("label", aggregates(doc, "ch05/pytorch/G4/manual_time")["median"])
        parsed = kr.parse_benchmark_json(doc, "ch05_pytorch.json")
        self.assertEqual(parsed.measurements[0].label, median["label"])
        self.assertEqual(parsed.measurements[0].counters, {})  # the label is not a counter
        bench = kr.parse_benchmark_json(pb.build_benchmark_json(CONTEXT, []), "ch05_bench.json")
        page = kr.render_chapter_markdown(kr.ChapterResults("ch05", [bench, parsed], {}, False))
        self.assertIn("What the `pytorch` rows ran", page)
        self.assertIn("| `prep` → `cutlass::device_kernel (KernelX, MMA_64x256x16_F32BF16BF16_SS)` | `G8`, `G32` |",
                      page)
        self.assertIn("| `prep` → `cutlass::device_kernel (KernelY, MMA_64x128x16_F32BF16BF16_SS)` | `G256` |", page)
        self.assertIn("| `prep` → `elementwise` × 2 | `G16` |", page)  # the count outside the code type
        self.assertIn("(× n: n launches of that kernel in a row)", page)
        self.assertNotIn("`G4`", page.split("What the")[1])  # no kernels listed, no row
        # Without labels (files written before them) the page has no such section.
        unlabelled = kr.parse_benchmark_json(pb.build_benchmark_json(CONTEXT, results[3:4]), "ch05_pytorch.json")
        page = kr.render_chapter_markdown(kr.ChapterResults("ch05", [bench, unlabelled], {}, False))
        self.assertNotIn("What the", page)
        # Labels without a repeat (all of them before repeats were counted) need no word on "× n".
        for entry in doc["benchmarks"]:
            if entry["run_name"].startswith("ch05/pytorch/G16/"):
                entry.pop("label")
        once = kr.parse_benchmark_json(doc, "ch05_pytorch.json")
        page = kr.render_chapter_markdown(kr.ChapterResults("ch05", [bench, once], {}, False))
        self.assertIn("What the `pytorch` rows ran: the kernels of one call of each case, in launch order, as", page)
        self.assertNotIn("× n", page)


class KernelLabelPassTest(unittest.TestCase):
    def test_add_kernel_labels(self):
        timed = [pb.CaseResult(chapter="ch05", case=c, times_s=[1e-3], min_bytes=1.0) for c in ("A", "B", "C")]
        doc = pb.build_benchmark_json(CONTEXT, timed)
        listed = [pb.CaseResult(chapter="ch05", case="A", times_s=[1e-3], min_bytes=1.0, kernels=["k1", "k2"]),
                  pb.CaseResult(chapter="ch05", case="B", times_s=[1e-3], min_bytes=1.0),  # nothing listed
                  pb.CaseResult(chapter="ch05", case="Z", times_s=[1e-3], min_bytes=1.0, kernels=["k3"])]  # not timed
        self.assertEqual(pb.add_kernel_labels(doc, listed), 1)
        for entry in doc["benchmarks"]:
            if entry["run_name"] == "ch05/pytorch/A/manual_time":
                self.assertEqual(entry["label"], "k1 → k2")
            else:
                self.assertNotIn("label", entry)
        self.assertEqual(len(doc["benchmarks"]), 3 * 6)  # no entry added

    def test_kernels_pass_exits_0_and_writes_nothing_without_gpu(self):
        with tempfile.TemporaryDirectory() as out, \
                mock.patch.object(pb, "_gpu_unavailable_reason", return_value="no GPU here"), \
                contextlib.redirect_stdout(io.StringIO()) as printed:
            self.assertEqual(pb.main(["--kernels", "--chapters", "ch01", "--out", out]), 0)
            self.assertEqual(os.listdir(out), [])
        self.assertIn("no GPU here", printed.getvalue())


class _FakeTorchModule:
    """Enough of the torch module for run() and list_kernels() to set up their Env."""

    __version__ = "0.0-fake"

    class version:  # noqa: N801 (torch.version)
        cuda = "13.0"

    class cuda:  # noqa: N801 (torch.cuda)
        @staticmethod
        def get_device_properties(index):
            props = mock.Mock(major=9, minor=0, multi_processor_count=132, L2_cache_size=1 << 20)
            props.name = "Fake GPU"  # Mock's own name argument means something else
            return props

    @staticmethod
    def device(kind, index):
        return (kind, index)


@contextlib.contextmanager
def _fake_torch_and_baseline(chapter_id, fn):
    """A temporary output folder, with the fake torch module in place and ``fn`` registered as
    ``chapter_id``'s baseline, for run() and list_kernels()."""
    with tempfile.TemporaryDirectory() as out, \
            mock.patch.dict(sys.modules, {"torch": _FakeTorchModule}), \
            mock.patch.dict(pb.BASELINES, {chapter_id: fn}):
        yield out


class ProfilerOnlyInTheKernelsPassTest(unittest.TestCase):
    def test_the_timed_pass_never_lists_kernels_and_the_kernels_pass_does(self):
        seen = {}

        def fake_baseline(env):
            seen["kernel_names"] = env.kernel_names
            seen["min_time_s"] = env.min_time_s
            return [pb.CaseResult(chapter="ch99", case="A", times_s=[1e-3], min_bytes=1.0)]

        with _fake_torch_and_baseline("ch99", fake_baseline) as out:
            pb.run(["ch99"], out, repetitions=1, log=lambda _: None)
            self.assertIsNone(seen["kernel_names"])
            self.assertEqual(seen["min_time_s"], pb.MIN_TIME_S)
            self.assertEqual(pb.list_kernels(["ch99"], out, log=lambda _: None),
                             [os.path.join(out, "ch99_pytorch.json")])
            self.assertIsNotNone(seen["kernel_names"])
            self.assertEqual(seen["min_time_s"], 0.0)


class KernelsPassLogTest(unittest.TestCase):
    def test_a_baselines_log_line_says_when_it_comes_from_the_untimed_kernels_pass(self):
        def fake_baseline(env):
            env.log("ch99 A: median 1.0 us per launch")
            return [pb.CaseResult(chapter="ch99", case="A", times_s=[1e-3], min_bytes=1.0)]

        timed_lines, kernels_lines = [], []
        with _fake_torch_and_baseline("ch99", fake_baseline) as out:
            pb.run(["ch99"], out, repetitions=1, log=timed_lines.append)
            pb.list_kernels(["ch99"], out, log=kernels_lines.append)
        self.assertIn("ch99 A: median 1.0 us per launch", timed_lines)
        self.assertIn(pb.KERNELS_PASS_LOG_PREFIX + "ch99 A: median 1.0 us per launch", kernels_lines)
        self.assertNotIn("ch99 A: median 1.0 us per launch", kernels_lines)
        # The pass's own summary line is not prefixed.
        self.assertTrue(any(line.startswith("labelled ") for line in kernels_lines))


class HostWaitNoteTest(unittest.TestCase):
    def page(self, kernels_by_case):
        results = [pb.CaseResult(chapter="ch04", case=case, times_s=[1e-4], min_bytes=1.0, variant="pytorch",
                                 kernels=kernels) for case, kernels in kernels_by_case.items()]
        doc = pb.build_benchmark_json(CONTEXT, results)
        pb.add_kernel_labels(doc, results)
        bench = kr.parse_benchmark_json(pb.build_benchmark_json(CONTEXT, []), "ch04_bench.json")
        parsed = kr.parse_benchmark_json(doc, "ch04_pytorch.json")
        return kr.render_chapter_markdown(kr.ChapterResults("ch04", [bench, parsed], {}, False))

    def test_cases_that_copy_to_the_host_mid_call_are_named(self):
        page = self.page({"T16": ["topk", "Memcpy DtoH (Device -> Pageable)", "histogram"],
                          "T1": ["topk", "Memcpy DtoH (Device -> Pinned)", "histogram"],
                          "T4096": ["topk", "Memcpy DtoD (Device -> Device)", "histogram"]})
        note = [line for line in page.splitlines() if "copies from the device to the host" in line]
        self.assertEqual(len(note), 1)
        self.assertTrue(note[0].startswith("The call of `T1`, `T16` copies"), note[0])  # natural order, no T4096
        self.assertTrue(note[0].endswith("their rows include that round trip."), note[0])

    def test_when_every_case_copies_to_the_host_the_note_says_so_without_the_list(self):
        page = self.page({"T16": ["topk", "Memcpy DtoH", "histogram"], "T1": ["Memcpy DtoH"]})
        note = [line for line in page.splitlines() if "copies from the device to the host" in line]
        self.assertEqual(len(note), 1)
        self.assertTrue(note[0].startswith("Every case's call copies"), note[0])
        self.assertNotIn("`T1`", note[0])

    def test_no_note_when_no_case_copies_to_the_host(self):
        page = self.page({"T16": ["topk", "histogram"], "T4096": ["topk", "Memset (Device)", "histogram"]})
        self.assertIn("What the `pytorch` rows ran", page)
        self.assertNotIn("copies from the device to the host", page)
