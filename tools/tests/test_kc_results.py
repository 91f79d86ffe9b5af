"""Tests of tools/kc_results.py on real Google Benchmark 1.7 and 1.8 JSON (no GPU, no matplotlib).

The fixtures gbench_1.7.json and gbench_1.8.json were written by the program in
data/gbench_fixture.cc, built once against Google Benchmark 1.7.1 and once against 1.8.3. It spins
the CPU for 20 µs per iteration but reports a different manual time, so the tests can tell whether
a rate was divided by the manual time (it was, in both versions) or by the CPU time.

Set KC_UPDATE_GOLDEN=1 to rewrite data/expected_ch01.md after an intended change of the layout.
"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(TESTS_DIR, "data")
TOOLS_DIR = os.path.dirname(TESTS_DIR)
if TOOLS_DIR not in sys.path:
    sys.path.insert(0, TOOLS_DIR)

import kc_results as kr  # noqa: E402
import pytorch_baselines as pb  # noqa: E402

CASES = ["fp32_N65536", "fp32_N1048576"]
VARIANTS = ["before", "step1_coalesced", "after", "vendor", "limit"]


def data(name):
    return os.path.join(DATA_DIR, name)


def pytorch_fixture():
    """A deterministic chNN_pytorch.json document for the fixture cases."""
    context = {"date": "2026-11-30T05:30:00+00:00", "host_name": "gpu-host",
               "executable": "tools/pytorch_baselines.py", "num_cpus": 16,
               "library": "pytorch 2.11.0+cu130", "gpu": "NVIDIA H200"}
    results = [
        pb.CaseResult(chapter="ch01", case="fp32_N65536", times_s=[9.1e-6, 8.9e-6, 9.0e-6, 9.4e-6],
                      min_bytes=12.0 * 65536),
        pb.CaseResult(chapter="ch01", case="fp32_N1048576", times_s=[110e-6, 108e-6, 111e-6, 109e-6],
                      min_bytes=12.0 * 1048576),
    ]
    return pb.build_benchmark_json(context, results)


def make_results_dir(root, with_pytorch=True, with_metadata=True):
    """A results folder like docs/results/h200 built from the fixtures."""
    os.makedirs(root, exist_ok=True)
    shutil.copy(data("gbench_1.8.json"), os.path.join(root, "ch01_bench.json"))
    if with_pytorch:
        with open(os.path.join(root, "ch01_pytorch.json"), "w", encoding="utf-8") as f:
            json.dump(pytorch_fixture(), f, indent=2)
    if with_metadata:
        shutil.copy(data("metadata_h200.json"), os.path.join(root, "metadata.json"))
    return root


def fixture_chapters(case="fp32_N1048576"):
    return [kr.Chapter(id="ch01", dir="01_vector_add", title="Vector add", headline_case=case,
                       headline_variant="after", headline_reference="limit", metric="bandwidth")]


def table_rows(text):
    """(case, variant, cells) for each row of a generated table; the case carries down its group."""
    rows = []
    case = None
    for line in text.splitlines():
        if not line.startswith("| ") or "`" not in line:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        case = cells[0].strip("`") or case
        rows.append((case, cells[1].strip("`"), cells))
    return rows


def run_main(argv):
    out = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = kr.main(argv)
    return status, out.getvalue(), err.getvalue()


def load_chapter_spec(test, key, chapter_id, good, bad_ones):
    """Writes a chapters.json whose one chapter has @p key set to each of @p bad_ones (each must be
    refused with "<chapter_id> <key> must be"), then to @p good; returns the chapter loaded from it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "chapters.json")

        def write(spec):
            with open(path, "w", encoding="utf-8") as f:
                json.dump([{"id": chapter_id, "dir": chapter_id[2:] + "_x", "title": "X", key: spec}], f)

        for bad in bad_ones:
            write(bad)
            with test.assertRaisesRegex(kr.ResultsError, f"{chapter_id} {key} must be"):
                kr.load_chapters(path)
        write(good)
        return kr.load_chapters(path)[0]


def expect_plot_drawn(test, render, results, chapter, png):
    """@p render draws @p png where matplotlib is installed, and reports that it drew nothing where not."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        test.assertFalse(render(results, chapter, png))
    else:
        test.assertTrue(render(results, chapter, png))
        test.assertGreater(os.path.getsize(png), 0)


class NamesTest(unittest.TestCase):
    def test_suffixes_are_stripped(self):
        for name in ["ch01/after/fp32_N1024/manual_time",
                     "ch01/after/fp32_N1024/real_time",
                     "ch01/after/fp32_N1024/iterations:10/repeats:3/manual_time/threads:1",
                     "ch01/after/fp32_N1024/min_time:0.100/min_warmup_time:0.500/real_time",
                     "ch01/after/fp32_N1024/min_time:0.1s/process_time/real_time",
                     "ch01/after/fp32_N1024"]:
            self.assertEqual(kr.parse_run_name(name), ("ch01", "after", "fp32_N1024"), name)

    def test_names_outside_the_convention(self):
        self.assertIsNone(kr.parse_run_name("BM_memcpy/1024/manual_time"))
        self.assertIsNone(kr.parse_run_name("ch01/after/manual_time"))
        self.assertIsNone(kr.parse_run_name("chapter1/after/x"))

    def test_case_with_slashes_is_kept_whole(self):
        self.assertEqual(kr.parse_run_name("ch05/after/G8/1024/manual_time"), ("ch05", "after", "G8/1024"))

    def test_natural_order_of_cases(self):
        cases = ["fp32_N268435456", "fp32_N65536", "fp32_N1048576", "bf16_N65536", "fp32_N262144"]
        self.assertEqual(sorted(cases, key=kr.natural_key),
                         ["bf16_N65536", "fp32_N65536", "fp32_N262144", "fp32_N1048576", "fp32_N268435456"])
        shapes = ["bf16_M4096_N4096_K4096", "bf16_M128_N4096_K7168", "bf16_M16_N4096_K7168"]
        self.assertEqual(sorted(shapes, key=kr.natural_key),
                         ["bf16_M16_N4096_K7168", "bf16_M128_N4096_K7168", "bf16_M4096_N4096_K4096"])

    def test_variant_order(self):
        shuffled = ["limit", "vendor_cublaslt", "pytorch_eager", "pytorch", "after", "uncoalesced",
                    "step10_persistent", "before", "vendor", "step2_tiled", "fused_naive"]
        self.assertEqual(sorted(shuffled, key=kr.variant_key),
                         ["before", "step2_tiled", "step10_persistent", "after", "fused_naive", "uncoalesced",
                          "vendor", "vendor_cublaslt", "pytorch", "pytorch_eager", "limit"])


class ParseTest(unittest.TestCase):
    def check_fixture(self, path):
        parsed = kr.load_benchmark_file(path)
        measured = {(m.variant, m.case): m for m in parsed.measurements if m.measured}
        self.assertEqual(set(measured), {(v, c) for v in VARIANTS for c in CASES})
        for (variant, case), m in measured.items():
            n = int(case.split("_N")[1])
            min_bytes = (16 if variant == "limit" else 12) * n
            self.assertEqual(m.chapter, "ch01")
            self.assertEqual(m.repetitions, 5)
            self.assertLessEqual(m.min_s, m.time_s)
            self.assertLessEqual(m.time_s, m.max_s)
            self.assertGreater(m.cv, 0.0)
            self.assertLess(m.cv, 0.1)
            # The fixture's manual times are 6-27 µs (N65536) and 95-432 µs (N1048576), whatever
            # unit (ns, ms) each benchmark was reported in.
            self.assertTrue(5e-6 < m.time_s < 5e-4, (variant, case, m.time_s))
            # The finding behind the whole tool: bytes_per_second and flops are divided by the
            # manual time, not the CPU time (20 µs per iteration in the fixture program).
            self.assertAlmostEqual(m.bytes_per_second * m.time_s / min_bytes, 1.0, places=9)
            self.assertAlmostEqual(m.flops * m.time_s / n, 1.0, places=9)
        errors = [m for m in parsed.measurements if not m.measured]
        self.assertEqual(len(errors), 1)
        self.assertEqual((errors[0].variant, errors[0].case), ("vendor_cub", "fp32_N65536"))
        self.assertEqual(errors[0].error, "needs a GPU of sm_90 or newer")
        self.assertEqual(parsed.context.get("gpu"), "fake GPU (fixture)")
        return parsed

    def test_google_benchmark_1_7(self):
        self.check_fixture(data("gbench_1.7.json"))

    def test_google_benchmark_1_8(self):
        self.check_fixture(data("gbench_1.8.json"))

    def test_cpu_time_differs_from_manual_time_in_fixtures(self):
        # Guards the test above: if the fixture's CPU time equalled its manual time, the rate test
        # could not tell them apart.
        with open(data("gbench_1.8.json"), encoding="utf-8") as f:
            doc = json.load(f)
        entry = next(b for b in doc["benchmarks"]
                     if b["run_name"].startswith("ch01/after/fp32_N1048576") and b["aggregate_name"] == "median")
        self.assertGreater(entry["real_time"] / entry["cpu_time"], 2.0)

    def test_iterations_without_aggregates(self):
        doc = {"context": {}, "benchmarks": [
            {"name": "ch02/after/bf16_M8/manual_time", "run_name": "ch02/after/bf16_M8/manual_time",
             "run_type": "iteration", "repetitions": 3, "repetition_index": i, "iterations": 100,
             "real_time": t, "cpu_time": 1.0, "time_unit": "us", "flops": 8e12 / t}
            for i, t in enumerate([10.0, 12.0, 11.0])]}
        m = kr.parse_benchmark_json(doc).measurements[0]
        self.assertAlmostEqual(m.time_s, 11e-6)
        self.assertAlmostEqual(m.min_s, 10e-6)
        self.assertAlmostEqual(m.max_s, 12e-6)
        self.assertEqual(m.repetitions, 3)
        self.assertAlmostEqual(m.flops, 8e12 / 11.0)
        self.assertAlmostEqual(m.cv, 1.0 / 11.0)
        self.assertIsNone(m.bytes_per_second)

    def test_skipped_with_message(self):
        doc = {"benchmarks": [{"name": "ch07/after/x/manual_time", "run_name": "ch07/after/x/manual_time",
                               "run_type": "iteration", "skipped": True, "skip_message": "needs sm_90a",
                               "iterations": 0, "real_time": 0, "cpu_time": 0, "time_unit": "ns"}]}
        m = kr.parse_benchmark_json(doc).measurements[0]
        self.assertFalse(m.measured)
        self.assertEqual(m.error, "needs sm_90a")

    def test_unknown_time_unit_is_an_error(self):
        doc = {"benchmarks": [{"name": "ch01/after/x", "run_type": "iteration", "real_time": 1,
                               "time_unit": "fortnights"}]}
        with self.assertRaises(kr.ResultsError):
            kr.parse_benchmark_json(doc)

    def test_bad_files(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "broken.json")
            with open(path, "w") as f:
                f.write("{not json")
            with self.assertRaises(kr.ResultsError):
                kr.load_benchmark_file(path)
            with self.assertRaises(kr.ResultsError):
                kr.load_benchmark_file(os.path.join(tmp, "missing.json"))


class FormatTest(unittest.TestCase):
    def test_times(self):
        self.assertEqual(kr.format_time(6.5e-6), "6.50 µs")
        self.assertEqual(kr.format_time(103.4e-6), "103 µs")
        self.assertEqual(kr.format_time(999.9e-6), "1.00 ms")
        self.assertEqual(kr.format_time(812e-9), "812 ns")
        self.assertEqual(kr.format_time(2.5), "2.50 s")
        self.assertEqual(kr.format_time(None), "—")

    def test_rates(self):
        self.assertEqual(kr.format_bandwidth(4.2137e12), "4.21 TB/s")
        self.assertEqual(kr.format_bandwidth(812.4e9), "812 GB/s")
        self.assertEqual(kr.format_flops(745.2e12), "745 TFLOP/s")
        self.assertEqual(kr.format_flops(51.23e12), "51.2 TFLOP/s")
        self.assertEqual(kr.format_sig(0.01234), "0.0123")
        self.assertEqual(kr.format_sig(4214.4), "4214")

    def test_spread(self):
        m = kr.Measurement(name="x", chapter="ch01", variant="after", case="c", source="s",
                           time_s=103e-6, min_s=100e-6, max_s=106e-6, cv=0.0261)
        self.assertEqual(kr.format_spread(m), "100–106 µs, cv 2.6%")


class MetadataTest(unittest.TestCase):
    def test_missing_metadata_is_unknown(self):
        merged = kr.merge_metadata(None, [])
        self.assertEqual(set(merged.values()), {"unknown"})
        self.assertIn("sm_clock_mhz_under_load", merged)
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(kr.load_metadata(tmp), {})

    def test_context_first_then_metadata(self):
        metadata = {"gpu": "NVIDIA H200", "commit": "meta", "driver": "580.159.04",
                    "sm_clock_mhz_under_load": 1980, "power_limit_w": 700.0, "mem_clock_mhz": 3201.5}
        context = {"gpu": "NVIDIA H200 (from context)", "commit": "unknown", "cuda_runtime": "13.0",
                   "gpu_sm_clock_max_mhz": "1980"}
        merged = kr.merge_metadata(metadata, [context])
        self.assertEqual(merged["gpu"], "NVIDIA H200 (from context)")
        self.assertEqual(merged["commit"], "meta")  # "unknown" in the context does not count
        self.assertEqual(merged["cuda"], "13.0")
        self.assertEqual(merged["driver"], "580.159.04")
        self.assertEqual(merged["sm_clock_mhz_under_load"], "1980")
        self.assertEqual(merged["sm_clock_max_mhz"], "1980")
        self.assertEqual(merged["power_limit_w"], "700")
        self.assertEqual(merged["mem_clock_mhz"], "3201.5")
        self.assertEqual(merged["notes"], "unknown")
        # The device's maximum memory clock (context) only fills in when metadata has no reading.
        context["gpu_mem_clock_max_mhz"] = "3201"
        self.assertEqual(kr.merge_metadata(metadata, [context])["mem_clock_mhz"], "3201.5")
        self.assertEqual(kr.merge_metadata({}, [context])["mem_clock_mhz"], "3201")

    def test_chapter_metadata_wins_over_the_latest_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "metadata.json"), "w") as f:
                json.dump({"commit": "latest"}, f)
            with open(os.path.join(tmp, "ch01_metadata.json"), "w") as f:
                json.dump({"commit": "ch01run"}, f)
            self.assertEqual(kr.load_metadata(tmp)["commit"], "latest")
            self.assertEqual(kr.load_metadata(tmp, "ch01")["commit"], "ch01run")
            self.assertEqual(kr.load_metadata(tmp, "ch02")["commit"], "latest")

    def test_invalid_metadata_is_an_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "metadata.json"), "w") as f:
                f.write("[1, 2]")
            with self.assertRaises(kr.ResultsError):
                kr.load_metadata(tmp)


class GenerateTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.results = make_results_dir(os.path.join(self.tmp, "h200"))
        self.chapters_json = os.path.join(self.tmp, "chapters.json")
        with open(self.chapters_json, "w") as f:
            json.dump([{"id": "ch01", "dir": "01_vector_add", "title": "Vector add",
                        "headline": {"case": "fp32_N1048576", "variant": "after", "reference": "limit",
                                     "metric": "bandwidth"}}], f)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def generate(self):
        return run_main(["--chapters-json", self.chapters_json, "generate", "--results-dir", self.results,
                         "--no-plots"])

    def page(self):
        with open(os.path.join(self.results, "ch01.md"), encoding="utf-8") as f:
            return f.read()

    def test_golden_page(self):
        status, out, _ = self.generate()
        self.assertEqual(status, 0)
        self.assertIn("ch01.md", out)
        text = self.page()
        golden = data("expected_ch01.md")
        if os.environ.get("KC_UPDATE_GOLDEN"):
            kr.write_text(golden, text)
        with open(golden, encoding="utf-8", newline="") as f:
            self.assertEqual(text, f.read())

    def test_baseline_line_says_how_the_samples_were_timed(self):
        steady = kr._baseline_timing({"library": "pytorch 2.11.0", "min_time_s": "0.2"})
        self.assertEqual(steady, "each sample at least 0.2 s of GPU time, as the C++ repetitions")
        burst = kr._baseline_timing({"library": "pytorch 2.11.0"})
        self.assertIn("bursts", burst)
        self.assertIn("power-bound", burst)

    def test_page_content(self):
        self.generate()
        text = self.page()
        lines = text.splitlines()
        self.assertTrue(lines[0].startswith("<!-- Generated by tools/kc_results.py from ch01_bench.json, "
                                            "ch01_pytorch.json, metadata.json"))
        self.assertTrue(lines[2].startswith("# ch01 · Vector add"))
        # The chapter's own JSON context wins (its gpu is "fake GPU (fixture)"); metadata.json fills
        # in what the context lacks.
        for expected in ["on fake GPU (fixture)", "580.159.04", "CUDA 13.0", "fixture for the tools tests", "1980 MHz", "3201 MHz", "700 W", "commit 0123abc",
                         "median of 4–5 repetitions", "pytorch 2.11.0+cu130"]:
            self.assertIn(expected, text)
        rows = table_rows(text)
        self.assertEqual([v for _, v, _ in rows],
                         ["before", "step1_coalesced", "after", "vendor", "pytorch", "limit"] * 2)
        # Natural order: 65536 before 1048576; the case is written on the first row of its group.
        self.assertEqual([c for c, _, _ in rows], ["fp32_N65536"] * 6 + ["fp32_N1048576"] * 6)
        self.assertEqual(rows[1][2][0], "")
        self.assertEqual(rows[5][2][5], "1.00")  # limit over itself
        self.assertEqual(rows[3][2][6], "1.00")  # vendor over itself (the × vendor column)
        self.assertEqual(rows[0][2][7], "1.00×")  # before over itself
        self.assertIn("`vendor_cub` at `fp32_N65536`: needs a GPU of sm_90 or newer", text)

    def test_fraction_and_speedup_values(self):
        self.generate()
        results = kr.load_chapter_results(self.results, "ch01")
        after = results.find("fp32_N1048576", "after")
        limit = results.find("fp32_N1048576", "limit")
        before = results.find("fp32_N1048576", "before")
        row = next(cells for case, variant, cells in table_rows(self.page())
                   if case == "fp32_N1048576" and variant == "after")
        self.assertEqual(row[2], kr.format_time(after.time_s))
        self.assertEqual(row[4], kr.format_sig(after.bytes_per_second / 1e9))
        self.assertEqual(row[5], "%.2f" % (after.bytes_per_second / limit.bytes_per_second))
        vendor = results.find("fp32_N1048576", "vendor")
        self.assertEqual(row[6], "%.2f" % (after.bytes_per_second / vendor.bytes_per_second))
        self.assertEqual(row[7], "%.2f×" % (before.time_s / after.time_s))

    def test_speedup_baseline_from_the_chapter_list(self):
        self.generate()
        chapter = kr.Chapter(id="ch01", dir="01_vector_add", title="Vector add", baseline="step1_coalesced")
        page = kr.render_chapter_markdown(kr.load_chapter_results(self.results, "ch01"), chapter)
        self.assertIn("Speed-up vs step1_coalesced |", page)
        row = next(cells for case, variant, cells in table_rows(page)
                   if case == "fp32_N1048576" and variant == "step1_coalesced")
        self.assertEqual(row[7], "1.00×")

    def test_deterministic_and_check(self):
        self.generate()
        first = self.page()
        self.generate()
        self.assertEqual(first, self.page())
        status, out, _ = run_main(["--chapters-json", self.chapters_json, "check", "--results-dir", self.results])
        self.assertEqual(status, 0, out)

    def test_check_reports_a_changed_table(self):
        self.generate()
        path = os.path.join(self.results, "ch01.md")
        kr.write_text(path, self.page().replace("Median time", "Mean time"))
        status, out, _ = run_main(["--chapters-json", self.chapters_json, "check", "--results-dir", self.results])
        self.assertEqual(status, 1)
        self.assertIn("-| Case | Variant | Mean time", out)
        self.assertIn("+| Case | Variant | Median time", out)

    def test_check_reports_missing_and_stale_tables(self):
        status, out, _ = run_main(["--chapters-json", self.chapters_json, "check", "--results-dir", self.results])
        self.assertEqual(status, 1)
        self.assertIn("ch01.md", out)
        self.generate()
        kr.write_text(os.path.join(self.results, "ch02.md"), "old\n")
        status, out, _ = run_main(["--chapters-json", self.chapters_json, "check", "--results-dir", self.results])
        self.assertEqual(status, 1)
        self.assertIn("ch02.md has no ch02_bench.json", out)

    def test_without_metadata_or_pytorch(self):
        bare = make_results_dir(os.path.join(self.tmp, "bare"), with_pytorch=False, with_metadata=False)
        pages = kr.expected_pages(bare, kr.load_chapters(self.chapters_json))
        text = pages["ch01.md"]
        self.assertIn("from ch01_bench.json in this folder", text)
        self.assertIn("driver unknown", text)
        self.assertNotIn("pytorch", text)

    def test_empty_or_missing_results_dir(self):
        status, out, _ = run_main(["--chapters-json", self.chapters_json, "check", "--results-dir",
                                   os.path.join(self.tmp, "nothing-here")])
        self.assertEqual(status, 0, out)

    def test_plots_follow_matplotlib(self):
        status, out, _ = run_main(["--chapters-json", self.chapters_json, "generate", "--results-dir", self.results])
        self.assertEqual(status, 0)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.assertIn("matplotlib is not installed: skipping plots", out)
            self.assertFalse(os.path.exists(os.path.join(self.results, "ch01.png")))
        else:
            self.assertTrue(os.path.exists(os.path.join(self.results, "ch01.png")))

    def test_flops_metric_table(self):
        chapters = [kr.Chapter(id="ch01", dir="d", title="t", headline_case="fp32_N65536", metric="flops")]
        text = kr.expected_pages(self.results, chapters)["ch01.md"]
        self.assertIn("| TFLOP/s |", text)


class ChapterMapTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.results = make_results_dir(os.path.join(self.tmp, "docs", "results", "h200"))
        self.readme = os.path.join(self.tmp, "README.md")
        shutil.copy(data("readme_with_map.md"), self.readme)
        self.chapters_json = os.path.join(self.tmp, "chapters.json")
        with open(self.chapters_json, "w") as f:
            json.dump([
                {"id": "ch01", "dir": "01_vector_add", "title": "Vector add",
                 "headline": {"case": "fp32_N1048576", "variant": "after", "reference": "limit",
                              "metric": "bandwidth"}},
                {"id": "ch02", "dir": "02_tiled_matmul", "title": "Tiled matmul",
                 "headline": {"case": "fp32_M4096_N4096_K4096", "variant": "after", "reference": "vendor",
                              "metric": "flops"}},
            ], f)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def readme_text(self):
        with open(self.readme, encoding="utf-8") as f:
            return f.read()

    def test_rewrite_and_check(self):
        args = ["--chapters-json", self.chapters_json, "chapter-map", "--results-dir", self.results,
                "--readme", self.readme]
        status, _, _ = run_main(args + ["--check"])
        self.assertEqual(status, 1)
        status, out, _ = run_main(args)
        self.assertEqual(status, 0, out)
        text = self.readme_text()
        self.assertNotIn("stale content", text)
        self.assertTrue(text.startswith("# Kernel Chapters (test fixture)\n\nSome text before the map.\n"))
        self.assertTrue(text.endswith("<!-- chapter-map:end -->\n\nSome text after the map.\n"))
        results = kr.load_chapter_results(self.results, "ch01")
        after = results.find("fp32_N1048576", "after")
        limit = results.find("fp32_N1048576", "limit")
        expected = "after %s = %.2f × copy limit, at fp32_N1048576" % (
            kr.format_bandwidth(after.bytes_per_second), after.bytes_per_second / limit.bytes_per_second)
        self.assertIn("| [01 · Vector add](chapters/01_vector_add/) | %s | [ch01.md](docs/results/h200/ch01.md) |"
                      % expected, text)
        self.assertIn("| [02 · Tiled matmul](chapters/02_tiled_matmul/) | not yet measured | — |", text)
        self.assertIn("Measured on NVIDIA H200", text)
        status, out, _ = run_main(args + ["--check"])
        self.assertEqual(status, 0, out)
        status, out, _ = run_main(args)
        self.assertEqual(status, 0)
        self.assertIn("already up to date", out)

    def test_check_subcommand_with_readme(self):
        run_main(["--chapters-json", self.chapters_json, "generate", "--results-dir", self.results, "--no-plots"])
        args = ["--chapters-json", self.chapters_json, "check", "--results-dir", self.results, "--readme", self.readme]
        status, out, _ = run_main(args)
        self.assertEqual(status, 1)
        self.assertIn("stale content", out)
        run_main(["--chapters-json", self.chapters_json, "chapter-map", "--results-dir", self.results,
                  "--readme", self.readme])
        status, out, _ = run_main(args)
        self.assertEqual(status, 0, out)

    def test_missing_markers(self):
        kr.write_text(self.readme, "# no map here\n")
        args = ["--chapters-json", self.chapters_json, "chapter-map", "--results-dir", self.results,
                "--readme", self.readme]
        status, _, err = run_main(args)
        self.assertEqual(status, 2)
        self.assertIn("chapter-map:begin", err)
        status, out, _ = run_main(args + ["--check"])
        self.assertEqual(status, 1)

    def test_headline_without_results(self):
        chapter = kr.load_chapters(self.chapters_json)[0]
        self.assertIsNone(kr.headline_text(chapter, None))

    def test_lesson_results_block(self):
        lesson = os.path.join(self.tmp, "chapters", "01_vector_add", "README.md")
        os.makedirs(os.path.dirname(lesson))
        kr.write_text(lesson, "# Lesson\n\nBefore: <!-- kc:fig ch01/before/fp32_N1048576 -->typed<!-- /kc:fig -->; "
                              "absent: <!-- kc:fig ch01/after/fp32_N7 -->x<!-- /kc:fig -->.\n\n"
                              "<!-- kc:results ch01 -->\nold numbers\n<!-- kc:end -->\n\nPitfalls.\n"
                              "<!-- kc:end -->\n")
        kr.write_text(os.path.join(self.results, "ch01_profile.txt"), "## ch01/after/x\n  duration 1 us\n")
        args = ["--chapters-json", self.chapters_json, "check", "--results-dir", self.results, "--readme", self.readme]
        run_main(["--chapters-json", self.chapters_json, "generate", "--results-dir", self.results, "--no-plots"])
        run_main(["--chapters-json", self.chapters_json, "chapter-map", "--results-dir", self.results,
                  "--readme", self.readme])
        with open(lesson, encoding="utf-8") as f:
            text = f.read()
        self.assertNotIn("old numbers", text)
        results = kr.load_chapter_results(self.results, "ch01")
        before = results.find("fp32_N1048576", "before")
        limit = results.find("fp32_N1048576", "limit")
        self.assertIn("Before: <!-- kc:fig ch01/before/fp32_N1048576 -->%s, %s, %.2f × limit<!-- /kc:fig -->"
                      % (kr.format_time(before.time_s), kr.format_bandwidth(before.bytes_per_second),
                         before.bytes_per_second / limit.bytes_per_second), text)
        self.assertIn("absent: <!-- kc:fig ch01/after/fp32_N7 -->not yet measured<!-- /kc:fig -->", text)
        self.assertIn("| `fp32_N1048576` |", text)
        self.assertIn("../../docs/results/h200/ch01_bench.json", text)
        self.assertIn("duration 1 us", text)
        self.assertTrue(text.endswith("<!-- kc:end -->\n\nPitfalls.\n<!-- kc:end -->\n"), text[-80:])
        status, out, _ = run_main(args)
        self.assertEqual(status, 0, out)
        kr.write_text(lesson, text.replace("| `fp32_N1048576` |", "| `typed by hand` |", 1))
        status, out, _ = run_main(args)
        self.assertEqual(status, 1)
        self.assertIn("typed by hand", out)


class CrossChapterFigureTest(unittest.TestCase):
    def test_a_lesson_quotes_an_earlier_chapter(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        shutil.copy(os.path.join(DATA_DIR, "gbench_1.8.json"), os.path.join(tmp, "ch01_bench.json"))
        ch01 = kr.Chapter(id="ch01", dir="01_vector_add", title="Vector add")
        ch05 = kr.Chapter(id="ch05", dir="05_grouped_gemm", title="Grouped GEMM", metric="flops")
        ch01_results = kr.load_chapter_results(tmp, "ch01")
        before = ch01_results.find("fp32_N1048576", "before")
        text = ("own: <!-- kc:fig ch05/after/G8xM128_N64_K64 -->x<!-- /kc:fig -->; "
                "quoted: <!-- kc:fig ch01/before/fp32_N1048576 -->x<!-- /kc:fig -->")
        filled = kr.fill_figures(text, None, ch05, lambda cid: (kr.load_chapter_results(tmp, cid), ch01))
        self.assertIn("own: <!-- kc:fig ch05/after/G8xM128_N64_K64 -->not yet measured<!-- /kc:fig -->", filled)
        self.assertIn("quoted: <!-- kc:fig ch01/before/fp32_N1048576 -->%s, %s"
                      % (kr.format_time(before.time_s), kr.format_bandwidth(before.bytes_per_second)), filled)
        with self.assertRaises(kr.ResultsError):
            kr.fill_figures(text, None, ch05, lambda cid: (None, None))


class ResultsGpuTest(unittest.TestCase):
    """A chapter with "results_gpu" (Chapter 8: "h100") is read from the sibling folder of that name:
    its README row, its lesson block, its inline figures and other lessons' figures of it."""

    H100 = "NVIDIA H100 80GB HBM3"

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)
        root = os.path.join(self.tmp, "docs", "results")
        # The reference folder measured ch01 too (another GPU, other times): the tool must not read it.
        self.h200 = make_results_dir(os.path.join(root, "h200"), with_pytorch=False)
        self.h100 = os.path.join(root, "h100")
        self.readme = os.path.join(self.tmp, "README.md")
        shutil.copy(data("readme_with_map.md"), self.readme)
        self.chapters_json = os.path.join(self.tmp, "chapters.json")
        with open(self.chapters_json, "w") as f:
            json.dump([
                {"id": "ch01", "dir": "01_vector_add", "title": "Vector add", "results_gpu": "h100",
                 "headline": {"case": "fp32_N1048576", "variant": "after", "reference": "limit",
                              "metric": "bandwidth"}},
                {"id": "ch02", "dir": "02_tiled_matmul", "title": "Tiled matmul",
                 "headline": {"case": "fp32_M4096_N4096_K4096", "variant": "after", "reference": "vendor",
                              "metric": "flops"}},
            ], f)
        self.lessons = {}
        for chapter_dir, text in (
                ("01_vector_add", "# Lesson 1\n\nBefore: <!-- kc:fig ch01/before/fp32_N1048576 -->x<!-- /kc:fig -->; "
                                  "<!-- kc:ratio ch01/fp32_N1048576/before/after -->x<!-- /kc:ratio -->.\n\n"
                                  "<!-- kc:results ch01 -->\n<!-- kc:end -->\n"),
                ("02_tiled_matmul", "# Lesson 2\n\nChapter 1's before: "
                                    "<!-- kc:fig ch01/before/fp32_N1048576 -->x<!-- /kc:fig -->.\n\n"
                                    "<!-- kc:results ch02 -->\n<!-- kc:end -->\n")):
            path = os.path.join(self.tmp, "chapters", chapter_dir, "README.md")
            os.makedirs(os.path.dirname(path))
            kr.write_text(path, text)
            self.lessons[chapter_dir] = path

    def make_h100(self):
        """docs/results/h100 with ch01 measured on an H100, twice as slow as the H200 fixture."""
        os.makedirs(self.h100)
        with open(data("gbench_1.8.json"), encoding="utf-8") as f:
            doc = json.load(f)
        doc["context"]["gpu"] = self.H100
        for entry in doc["benchmarks"]:
            for key in ("real_time", "cpu_time"):
                if isinstance(entry.get(key), (int, float)) and entry.get("aggregate_name") != "cv":
                    entry[key] *= 2
            for key in ("bytes_per_second", "flops"):
                if isinstance(entry.get(key), (int, float)) and entry.get("aggregate_name") != "cv":
                    entry[key] /= 2
        with open(os.path.join(self.h100, "ch01_bench.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)

    def run_tool(self, *args):
        return run_main(["--chapters-json", self.chapters_json] + list(args))

    def read(self, path):
        with open(path, encoding="utf-8") as f:
            return f.read()

    def test_the_folder_of_a_chapter(self):
        chapters = kr.load_chapters(self.chapters_json)
        self.assertEqual([c.results_gpu for c in chapters], ["h100", None])
        self.assertEqual(kr.chapter_results_dir(self.h200 + os.sep, chapters[0]), self.h100)
        self.assertEqual(kr.chapter_results_dir(self.h200, chapters[1]), self.h200)
        self.assertTrue(kr.same_folder(kr.chapter_results_dir(self.h100, chapters[0]), self.h100))

    def test_a_chapter_reads_its_figures_and_block_from_the_sibling_folder(self):
        self.make_h100()
        kr.write_text(os.path.join(self.h100, "ch01_profile.txt"), "## ch01/after/x\n  duration 7 us\n")
        kr.write_text(os.path.join(self.h100, "ch01.png"), "not a real plot\n")
        kr.write_text(os.path.join(self.h200, "ch01_profile.txt"), "## ch01/after/x\n  duration 3 us\n")
        self.assertEqual(self.run_tool("generate", "--results-dir", self.h100, "--no-plots")[0], 0)
        self.assertEqual(self.run_tool("generate", "--results-dir", self.h200, "--no-plots")[0], 0)
        status, out, err = self.run_tool("chapter-map", "--results-dir", self.h200, "--readme", self.readme)
        self.assertEqual(status, 0, out + err)
        h100 = kr.load_chapter_results(self.h100, "ch01")
        h200 = kr.load_chapter_results(self.h200, "ch01")
        after, limit = h100.find("fp32_N1048576", "after"), h100.find("fp32_N1048576", "limit")
        before = h100.find("fp32_N1048576", "before")
        self.assertNotEqual(before.time_s, h200.find("fp32_N1048576", "before").time_s)

        readme = self.read(self.readme)
        self.assertIn("Measured on NVIDIA H200", readme)  # the column: the reference folder's GPU
        self.assertIn("and docs/results/h200 (ch01 from docs/results/h100);", readme)
        self.assertIn("| [01 · Vector add](chapters/01_vector_add/) | after %s = %.2f × copy limit, at fp32_N1048576, "
                      "on %s | [ch01.md](docs/results/h100/ch01.md) |"
                      % (kr.format_bandwidth(after.bytes_per_second),
                         after.bytes_per_second / limit.bytes_per_second, self.H100), readme)
        self.assertIn("| [02 · Tiled matmul](chapters/02_tiled_matmul/) | not yet measured | — |", readme)

        figure = "%s, %s, %.2f × limit" % (kr.format_time(before.time_s), kr.format_bandwidth(before.bytes_per_second),
                                          before.bytes_per_second / limit.bytes_per_second)
        lesson1 = self.read(self.lessons["01_vector_add"])
        self.assertIn("Before: <!-- kc:fig ch01/before/fp32_N1048576 -->%s<!-- /kc:fig -->" % figure, lesson1)
        self.assertIn(kr.ratio_text(h100, "ch01/fp32_N1048576/before/after"), lesson1)
        self.assertIn("../../docs/results/h100/ch01_bench.json", lesson1)
        self.assertNotIn("docs/results/h200", lesson1.replace("not on the NVIDIA H200", ""))
        self.assertIn("Measured on %s (`../../docs/results/h100/`), not on the NVIDIA H200 of the other chapters' "
                      "results" % self.H100, lesson1)
        self.assertIn("- **GPU:** %s; " % self.H100, lesson1)
        self.assertIn("![ch01 results](../../docs/results/h100/ch01.png)", lesson1)
        self.assertIn("from `../../docs/results/h100/ch01_profile.txt`", lesson1)
        self.assertIn("duration 7 us", lesson1)
        self.assertNotIn("duration 3 us", lesson1)
        self.assertIn("| `fp32_N1048576` | `before` | %s |" % kr.format_time(before.time_s), lesson1)
        lesson2 = self.read(self.lessons["02_tiled_matmul"])
        self.assertIn("Chapter 1's before: <!-- kc:fig ch01/before/fp32_N1048576 -->%s<!-- /kc:fig -->" % figure,
                      lesson2)

        # The rule for check: its pages are the one folder's; --readme checks what chapter-map writes
        # from that folder, so it passes with the folder the README came from and fails with another.
        status, out, _ = self.run_tool("check", "--results-dir", self.h200, "--readme", self.readme)
        self.assertEqual(status, 0, out)
        status, out, _ = self.run_tool("check", "--results-dir", self.h100)
        self.assertEqual(status, 0, out)
        status, out, _ = self.run_tool("check", "--results-dir", self.h100, "--readme", self.readme)
        self.assertEqual(status, 1)
        # A stale page in the sibling folder is that folder's check's business, not the reference's.
        kr.write_text(os.path.join(self.h100, "ch01.md"), "typed by hand\n")
        status, out, _ = self.run_tool("check", "--results-dir", self.h200, "--readme", self.readme)
        self.assertEqual(status, 0, out)
        status, out, _ = self.run_tool("check", "--results-dir", self.h100)
        self.assertEqual(status, 1)
        self.assertIn("typed by hand", out)

    def test_a_missing_sibling_folder_reads_not_yet_measured(self):
        self.assertFalse(os.path.exists(self.h100))
        self.run_tool("generate", "--results-dir", self.h200, "--no-plots")
        status, out, err = self.run_tool("chapter-map", "--results-dir", self.h200, "--readme", self.readme)
        self.assertEqual(status, 0, out + err)
        readme = self.read(self.readme)
        self.assertIn("| [01 · Vector add](chapters/01_vector_add/) | not yet measured on H100 | — |", readme)
        lesson1 = self.read(self.lessons["01_vector_add"])
        self.assertIn("<!-- kc:fig ch01/before/fp32_N1048576 -->not yet measured<!-- /kc:fig -->", lesson1)
        self.assertIn("<!-- kc:ratio ch01/fp32_N1048576/before/after -->not yet measured<!-- /kc:ratio -->", lesson1)
        self.assertIn("<!-- kc:results ch01 -->\nNot yet measured. This chapter is measured on H100 (its results go "
                      "to `../../docs/results/h100/`), not on the NVIDIA H200 of the other chapters' results", lesson1)
        self.assertIn("`tools/import_gpu_run.sh ARCHIVE h100`", lesson1)
        lesson2 = self.read(self.lessons["02_tiled_matmul"])
        self.assertIn("<!-- kc:fig ch01/before/fp32_N1048576 -->not yet measured<!-- /kc:fig -->", lesson2)
        self.assertIn("<!-- kc:results ch02 -->\nNot yet measured: run `tools/gpu_suite.sh ch02`", lesson2)
        status, out, _ = self.run_tool("check", "--results-dir", self.h200, "--readme", self.readme)
        self.assertEqual(status, 0, out)
        status, out, _ = self.run_tool("check", "--results-dir", self.h100)
        self.assertEqual(status, 0, out)

    def test_an_invalid_results_gpu_is_refused(self):
        path = os.path.join(self.tmp, "bad.json")
        for value in ('"../h100"', '"a/b"', '""', '".."', '5'):
            kr.write_text(path, '[{"id": "ch01", "dir": "x", "title": "t", "results_gpu": %s}]' % value)
            with self.assertRaises(kr.ResultsError, msg=value):
                kr.load_chapters(path)


class DerivedMarkerTest(unittest.TestCase):
    """kc:ratio and kc:removed: goal ratios and shares computed from the results, never typed."""

    @staticmethod
    def results(times):
        """A ChapterResults of ch03 with one case and {variant: (median, min, max)} times."""
        measurements = [kr.Measurement(name="ch03/%s/caseA" % v, chapter="ch03", variant=v, case="caseA",
                                       source="x.json", time_s=t, min_s=lo, max_s=hi)
                        for v, (t, lo, hi) in times.items()]
        return kr.ChapterResults("ch03", [kr.BenchFile("x.json", {}, measurements)], {}, True)

    def test_ratio_and_its_range(self):
        r = self.results({"before": (30.0, 29.0, 31.0), "after": (25.0, 24.0, 26.0)})
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/before/after"), "1.20 × (1.12–1.29)")
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/before/vendor"), "not yet measured")
        self.assertEqual(kr.ratio_text(None, "ch03/caseA/before/after"), "not yet measured")
        with self.assertRaises(kr.ResultsError):
            kr.ratio_text(r, "ch03/caseA/before")

    def test_ratio_with_a_goal_gives_the_verdict_from_the_unrounded_median(self):
        r = self.results({"before": (157.22, 156.0, 161.0), "after": (131.30, 130.0, 134.0),
                          "vendor": (157.9, 157.9, 157.9), "fast": (100.0, 100.0, 100.0)})
        # 1.1974: two decimals would print the threshold, so three, and the goal is missed.
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/before/after", ">=", 1.2),
                         "1.197 × (1.16–1.24), goal ≥ 1.2: missed")
        # 1.2026 would print as 1.20 too: three decimals, met.
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/vendor/after", ">=", 1.2),
                         "1.203 × (1.18–1.21), goal ≥ 1.2: met")
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/before/fast", ">=", 1.2),
                         "1.57 × (1.56–1.61), goal ≥ 1.2: met")
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/after/before", "<=", 0.85),
                         "0.84 × (0.81–0.86), goal ≤ 0.85: met")
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/after/before", "<", 0.8), "0.84 × (0.81–0.86), goal < 0.8: missed")
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/before/fast", ">", 1), "1.57 × (1.56–1.61), goal > 1: met")
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/before/missing", ">=", 1.2), "not yet measured")
        with self.assertRaises(kr.ResultsError):
            kr.ratio_text(r, "ch03/caseA/before/after", "==", 1.2)
        with self.assertRaises(kr.ResultsError):
            kr.ratio_text(r, "ch03/caseA/before/after", ">=", None)

    def test_a_no_slower_beyond_the_spread_goal_is_judged_on_the_range(self):
        r = self.results({"before": (100.0, 99.0, 104.0), "after": (102.0, 100.0, 103.0),
                          "slow": (110.0, 109.0, 111.0)})
        # The median is 0.98, but the range (0.96–1.04) reaches 1: met.
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/before/after", "~>=", 1),
                         "0.98 × (0.96–1.04), goal not below 1 beyond the spread: met")
        self.assertEqual(kr.ratio_text(r, "ch03/caseA/before/slow", "~>=", 1),
                         "0.91 × (0.89–0.95), goal not below 1 beyond the spread: missed")

    def test_goal_decimals_stop_short_of_the_threshold(self):
        self.assertEqual(kr.goal_decimals(1.1974, 1.2), 3)
        self.assertEqual(kr.goal_decimals(1.2155, 1.2), 2)
        self.assertEqual(kr.goal_decimals(1.2004, 1.2), 4)
        self.assertEqual(kr.goal_decimals(1.2, 1.2), 2)

    def test_a_goal_marker_is_filled_and_a_malformed_one_is_refused(self):
        r = self.results({"before": (30.0, 29.0, 31.0), "after": (25.0, 24.0, 26.0)})
        ch03 = kr.Chapter(id="ch03", dir="03_fused_epilogue", title="Fused", metric="bandwidth")
        text = "x <!-- kc:ratio ch03/caseA/before/after >=1.15 -->typed<!-- /kc:ratio --> y"
        self.assertEqual(kr.fill_figures(text, r, ch03),
                         "x <!-- kc:ratio ch03/caseA/before/after >=1.15 -->1.20 × (1.12–1.29), goal ≥ 1.15: met"
                         "<!-- /kc:ratio --> y")
        for bad in (">= 1.15", "≥1.15", ">=x", "=>1.15", "~<=1"):
            with self.assertRaises(kr.ResultsError):
                kr.fill_figures("<!-- kc:ratio ch03/caseA/before/after %s -->t<!-- /kc:ratio -->" % bad, r, ch03)

    def test_removed_share_and_its_spread(self):
        r = self.results({"before": (40.0, 40.0, 40.0), "after": (32.0, 31.0, 33.0), "base": (30.0, 30.0, 30.0)})
        self.assertEqual(kr.removed_text(r, "ch03/caseA/before/after/base"), "80 % ± 0")
        for m in r.files[0].measurements:
            m.cv = {"before": 0.0, "after": 0.05, "base": 0.0}[m.variant]  # after: 1.6 of 32
        # d share / d after = -1 / 10: 1.6 µs of noise is 16 points of share.
        self.assertEqual(kr.removed_text(r, "ch03/caseA/before/after/base"), "80 % ± 16")
        flat = self.results({"before": (30.0, 30.0, 30.0), "after": (30.0, 30.0, 30.0), "base": (31.0, 31.0, 31.0)})
        self.assertIn("no extra time", kr.removed_text(flat, "ch03/caseA/before/after/base"))
        with self.assertRaises(kr.ResultsError):
            kr.removed_text(r, "ch03/caseA/before/after")

    def test_lesson_markers_are_filled(self):
        r = self.results({"before": (30.0, 29.0, 31.0), "after": (25.0, 24.0, 26.0)})
        ch03 = kr.Chapter(id="ch03", dir="03_fused_epilogue", title="Fused", metric="bandwidth")
        text = "x <!-- kc:ratio ch03/caseA/before/after -->typed<!-- /kc:ratio --> y"
        self.assertEqual(kr.fill_figures(text, r, ch03),
                         "x <!-- kc:ratio ch03/caseA/before/after -->1.20 × (1.12–1.29)<!-- /kc:ratio --> y")


class CounterMarkerTest(unittest.TestCase):
    """kc:counter: a user counter of the run (Chapter 6's waves), read from the results JSON."""

    def test_counters_are_read_and_shown(self):
        doc = {"context": {}, "benchmarks": [
            {"name": "ch06/after/caseA/manual_time_median", "run_name": "ch06/after/caseA/manual_time",
             "run_type": "aggregate", "aggregate_name": "median", "repetitions": 3, "real_time": 100.0,
             "time_unit": "us", "flops": 1e12, "waves": 2.0, "last_wave_utilisation": 0.4545, "slots": 132.0},
        ]}
        bench = kr.parse_benchmark_json(doc, "ch06_bench.json")
        m = bench.measurements[0]
        self.assertEqual(m.counters, {"waves": 2.0, "last_wave_utilisation": 0.4545, "slots": 132.0})
        r = kr.ChapterResults("ch06", [bench], {}, True)
        self.assertEqual(kr.counter_text(r, "ch06/after/caseA/waves"), "2")
        self.assertEqual(kr.counter_text(r, "ch06/after/caseA/last_wave_utilisation"), "45 %")
        self.assertEqual(kr.counter_text(r, "ch06/after/caseA/tiles"), "not yet measured")
        m.counters["stage_up_us"] = 6168.5
        m.counters["stage_router_us"] = 87.66
        self.assertEqual(kr.counter_text(r, "ch06/after/caseA/stage_up_us"), "6168")
        self.assertEqual(kr.counter_text(r, "ch06/after/caseA/stage_router_us"), "87.7")
        self.assertEqual(kr.counter_text(r, "ch06/before/caseA/waves"), "not yet measured")
        with self.assertRaises(kr.ResultsError):
            kr.counter_text(r, "ch06/after/caseA")
        ch06 = kr.Chapter(id="ch06", dir="06_persistent", title="Persistent", metric="flops")
        text = "w <!-- kc:counter ch06/after/caseA/waves -->typed<!-- /kc:counter --> z"
        self.assertEqual(kr.fill_figures(text, r, ch06),
                         "w <!-- kc:counter ch06/after/caseA/waves -->2<!-- /kc:counter --> z")


class LessonCasesTest(unittest.TestCase):
    """lesson_cases: a lesson's results block shows only the chosen cases and points to the full page."""

    def test_block_keeps_the_chosen_cases(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = make_results_dir(os.path.join(tmp, "results"))
            lesson = os.path.join(tmp, "chapters", "01_vector_add", "README.md")
            chapter = fixture_chapters()[0]
            full = kr.render_lesson_block(root, lesson, chapter)
            all_cases = {case for case, _, _ in table_rows(full)}
            self.assertGreater(len(all_cases), 1)
            chapter.lesson_cases = ("fp32_N1048576",)
            block = kr.render_lesson_block(root, lesson, chapter)
            self.assertEqual({case for case, _, _ in table_rows(block) if case.startswith("fp32")}, {"fp32_N1048576"})
            self.assertIn("This table shows 1 of the run's %d cases; [ch01.md](" % len(all_cases), block)
            self.assertLess(len(block.splitlines()), len(full.splitlines()))
            chapter.lesson_cases = ("fp32_N1048576", "fp32_N7")
            with self.assertRaisesRegex(kr.ResultsError, "ch01 lesson_cases: fp32_N7 not in"):
                kr.render_lesson_block(root, lesson, chapter)

    def test_chapters_json_rule(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "chapters.json")
            for bad in ([], "fp32_N1", [""], [3]):
                with open(path, "w", encoding="utf-8") as f:
                    json.dump([{"id": "ch01", "dir": "01_x", "title": "X", "lesson_cases": bad}], f)
                with self.assertRaisesRegex(kr.ResultsError, "lesson_cases must be a non-empty list"):
                    kr.load_chapters(path)
            with open(path, "w", encoding="utf-8") as f:
                json.dump([{"id": "ch01", "dir": "01_x", "title": "X", "lesson_cases": ["a", "b"]}], f)
            self.assertEqual(kr.load_chapters(path)[0].lesson_cases, ("a", "b"))


class SweepTest(unittest.TestCase):
    """chapters.json "sweep": a one-size sweep plotted as time against the size (chNN_sweep.png)."""

    def test_chapters_json_rule(self):
        good = {"cases": ["a", "b"], "x": [1, 2], "x_label": "tokens", "variants": ["before", "after"]}
        bad_ones = [[], {**good, "x": [1]}, {**good, "x": [1, 0]}, {**good, "x": [1, True]},
                    {**good, "cases": []}, {**good, "x_label": ""}, {**good, "variants": "after"}]
        sweep = load_chapter_spec(self, "sweep", "ch09", good, bad_ones).sweep
        self.assertEqual((sweep.cases, sweep.x, sweep.variants), (("a", "b"), (1.0, 2.0), ("before", "after")))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "chapters.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump([{"id": "ch09", "dir": "09_x", "title": "X"}], f)
            self.assertIsNone(kr.load_chapters(path)[0].sweep)

    def test_plot_needs_a_measured_case(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = make_results_dir(os.path.join(tmp, "results"))
            results = kr.load_chapter_results(root, "ch01")
            chapter = fixture_chapters()[0]
            png = os.path.join(tmp, "ch01_sweep.png")
            self.assertFalse(kr.render_sweep_plot(results, chapter, png))  # no sweep
            chapter.sweep = kr.Sweep(("no_such_case",), (1.0,), "size", ("after",))
            self.assertFalse(kr.render_sweep_plot(results, chapter, png))  # nothing measured
            self.assertFalse(os.path.exists(png))
            chapter.sweep = kr.Sweep(("fp32_N1048576", "fp32_N7"), (1.0, 2.0), "size", ("after", "limit"))
            expect_plot_drawn(self, kr.render_sweep_plot, results, chapter, png)


class StageBreakdownTest(unittest.TestCase):
    """chapters.json "stages": stacked stage_<name>_us counters per case and variant (chNN_stages.png)."""

    def test_chapters_json_rule(self):
        good = {"cases": ["a"], "variants": ["before", "after"], "stages": ["up", "down"], "reference": "limit"}
        bad_ones = [[], {**good, "cases": []}, {**good, "stages": "up"}, {**good, "variants": [""]},
                    {**good, "reference": 3}]
        spec = load_chapter_spec(self, "stages", "ch10", good, bad_ones).stages
        self.assertEqual((spec.cases, spec.stages, spec.reference), (("a",), ("up", "down"), "limit"))

    def test_stage_times_keep_the_order_and_skip_missing_stages(self):
        m = kr.Measurement(name="ch10/after/a", chapter="ch10", variant="after", case="a", source="x",
                           time_s=1e-3, counters={"stage_down_us": 2.0, "stage_up_us": 5.0, "other": 1.0})
        self.assertEqual(kr.stage_times(m, ["router", "up", "swiglu", "down"]), [("up", 5.0), ("down", 2.0)])

    def test_plot_needs_a_breakdown(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = make_results_dir(os.path.join(tmp, "results"))
            results = kr.load_chapter_results(root, "ch01")
            chapter = fixture_chapters()[0]
            png = os.path.join(tmp, "ch01_stages.png")
            self.assertFalse(kr.render_stage_plot(results, chapter, png))  # no stage breakdown
            chapter.stages = kr.StageBreakdown(("fp32_N1048576",), ("after",), ("up", "down"), "limit")
            self.assertFalse(kr.render_stage_plot(results, chapter, png))  # no stage counters
            self.assertFalse(os.path.exists(png))
            m = results.find("fp32_N1048576", "after")
            m.counters.update({"stage_up_us": 1.0, "stage_down_us": 2.0})
            expect_plot_drawn(self, kr.render_stage_plot, results, chapter, png)


class ProfileMarkerTest(unittest.TestCase):
    """kc:profile: a metric of the chapter's Nsight Compute profile, read from chNN_profile.txt."""

    PROFILE = ("## ch08/after/caseA\n"
               "kernel 0: void k<3, 0>(...)  [grid (132, 1, 1), block (384, 1, 1)]\n"
               "  duration                      5.35 ms\n"
               "  DRAM read                     16.2 GB\n"
               "kernel 1: void other(...)\n"
               "  DRAM read                     1.00 GB\n"
               "## ch08/before/caseA\n"
               "  SM clock                      1.83 GHz\n")

    def test_sections_and_labels_are_parsed(self):
        profile = kr.parse_profile_text(self.PROFILE)
        self.assertEqual(profile["ch08/after/caseA"], {"duration": "5.35 ms", "DRAM read": "16.2 GB"})
        self.assertEqual(profile["ch08/before/caseA"], {"SM clock": "1.83 GHz"})
        self.assertEqual(kr.parse_profile_text(""), {})

    def test_marker_is_filled_from_the_profile(self):
        r = kr.ChapterResults("ch08", [], {}, True, kr.parse_profile_text(self.PROFILE))
        self.assertEqual(kr.profile_text(r, "ch08/after/caseA/DRAM_read"), "16.2 GB")
        self.assertEqual(kr.profile_text(r, "ch08/after/caseA/dram_read"), "16.2 GB")
        self.assertEqual(kr.profile_text(r, "ch08/after/caseA/L2_hit_rate"), "not yet measured")
        self.assertEqual(kr.profile_text(r, "ch08/step1/caseA/DRAM_read"), "not yet measured")
        self.assertEqual(kr.profile_text(None, "ch08/after/caseA/DRAM_read"), "not yet measured")
        with self.assertRaises(kr.ResultsError):
            kr.profile_text(r, "ch08/after/caseA")
        ch08 = kr.Chapter(id="ch08", dir="08_hopper_grouped_gemm", title="Grouped", metric="flops")
        text = "a <!-- kc:profile ch08/after/caseA/SM_clock -->x<!-- /kc:profile --> b"
        self.assertEqual(kr.fill_figures(text, r, ch08), "a <!-- kc:profile ch08/after/caseA/SM_clock -->"
                         "not yet measured<!-- /kc:profile --> b")
        text = "a <!-- kc:profile ch08/before/caseA/SM_clock -->x<!-- /kc:profile --> b"
        self.assertEqual(kr.fill_figures(text, r, ch08), "a <!-- kc:profile ch08/before/caseA/SM_clock -->"
                         "1.83 GHz<!-- /kc:profile --> b")


class PlottedCasesTest(unittest.TestCase):
    """Cases without a throughput (only counters, like Chapter 4's warp-primitive costs) are left
    out of the plot and kept in the table."""

    def test_cases_without_throughput_are_not_plotted(self):
        doc = {"context": {}, "benchmarks": [
            {"name": "ch04/after/fp32_T16/manual_time_median", "run_name": "ch04/after/fp32_T16/manual_time",
             "run_type": "aggregate", "aggregate_name": "median", "repetitions": 3, "real_time": 5.0,
             "time_unit": "us", "bytes_per_second": 1e9},
            {"name": "ch04/latency/primitive_shfl/manual_time_median",
             "run_name": "ch04/latency/primitive_shfl/manual_time", "run_type": "aggregate",
             "aggregate_name": "median", "repetitions": 3, "real_time": 40.0, "time_unit": "us",
             "cycles_per_op": 23.5},
        ]}
        r = kr.ChapterResults("ch04", [kr.parse_benchmark_json(doc, "ch04_bench.json")], {}, True)
        self.assertEqual(kr.plotted_cases(r, "bandwidth"), ["fp32_T16"])
        ch04 = kr.Chapter(id="ch04", dir="04_moe_gating", title="Gating", metric="bandwidth")
        cases = [row[0] for row in table_rows(kr.render_chapter_markdown(r, ch04))]
        self.assertIn("primitive_shfl", cases)
        self.assertEqual(kr.counter_text(r, "ch04/latency/primitive_shfl/cycles_per_op"), "23.5")


class SummaryTest(unittest.TestCase):
    def test_summary_of_both_versions(self):
        status, out, _ = run_main(["summary", data("gbench_1.7.json"), data("gbench_1.8.json")])
        self.assertEqual(status, 0)
        self.assertIn("== gbench_1.7.json", out)
        self.assertIn("== gbench_1.8.json", out)
        self.assertIn("ch01/after/fp32_N1048576", out)
        self.assertIn("not measured: ch01/vendor_cub/fp32_N65536: needs a GPU of sm_90 or newer", out)
        lines = out.splitlines()
        names = [l.split()[0] for l in lines if l.startswith("ch01/")]
        self.assertEqual(names[:5], ["ch01/before/fp32_N65536", "ch01/step1_coalesced/fp32_N65536",
                                     "ch01/after/fp32_N65536", "ch01/vendor/fp32_N65536", "ch01/limit/fp32_N65536"])

    def test_summary_without_benchmarks(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "empty.json")
            with open(path, "w") as f:
                json.dump({"context": {}, "benchmarks": []}, f)
            status, out, _ = run_main(["summary", path])
        self.assertEqual(status, 0)
        self.assertIn("no benchmark results in empty.json", out)

    def test_summary_of_missing_file(self):
        status, _, err = run_main(["summary", os.path.join(DATA_DIR, "does-not-exist.json")])
        self.assertEqual(status, 2)
        self.assertIn("cannot read", err)


class ChaptersJsonTest(unittest.TestCase):
    def test_repository_chapter_list(self):
        chapters = kr.load_chapters()
        self.assertGreaterEqual(len(chapters), 1)
        first = chapters[0]
        self.assertEqual((first.id, first.dir, first.title), ("ch01", "01_vector_add", "Vector add"))
        self.assertEqual((first.headline_case, first.headline_variant, first.headline_reference, first.metric),
                         ("fp32_N268435456", "after", "limit", "bandwidth"))
        ids = [c.id for c in chapters]
        self.assertEqual(len(ids), len(set(ids)))

    def test_invalid_chapter_list(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "chapters.json")
            for content in ['{"id": "ch01"}', '[{"id": "ch01", "dir": "x"}]',
                            '[{"id": "one", "dir": "x", "title": "t"}]',
                            '[{"id": "ch01", "dir": "x", "title": "t", "headline": {"metric": "speed"}}]']:
                with open(path, "w") as f:
                    f.write(content)
                with self.assertRaises(kr.ResultsError, msg=content):
                    kr.load_chapters(path)


if __name__ == "__main__":
    unittest.main()
