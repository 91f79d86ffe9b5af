"""Tests of tools/kc_profile.py on CPU: ncu's `--csv --page raw` output, parsed from fixtures."""

import contextlib
import io
import os
import sys
import tempfile
import unittest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(TESTS_DIR, "data")
TOOLS_DIR = os.path.dirname(TESTS_DIR)
if TOOLS_DIR not in sys.path:
    sys.path.insert(0, TOOLS_DIR)

import kc_profile as kp  # noqa: E402


def read(name):
    with open(os.path.join(DATA_DIR, name), encoding="utf-8") as f:
        return f.read()


class ParseTest(unittest.TestCase):
    def setUp(self):
        self.kernels = kp.parse_ncu_csv(read("ncu_raw_units.csv"))

    def test_rows(self):
        self.assertEqual([k.id for k in self.kernels], ["3", "4"])
        self.assertEqual(self.kernels[0].name,
                         "void kc::ch01::vector_add_after_kernel<float>(const float *, const float *, float *, long)")
        self.assertEqual(self.kernels[0].grid, "(132, 1, 1)")
        self.assertEqual(self.kernels[0].block, "(256, 1, 1)")

    def test_units_and_thousands_separators(self):
        v = self.kernels[0].values
        self.assertAlmostEqual(v["dram_read"], 2.15e9)
        self.assertAlmostEqual(v["dram_write"], 1073.74e6)
        self.assertAlmostEqual(v["duration"], 812.35e-6)
        self.assertEqual(v["ld_requests"], 8388608)
        self.assertAlmostEqual(v["st_sectors"], 33554432)
        self.assertAlmostEqual(v["dram_pct"], 92.41)
        self.assertAlmostEqual(v["occupancy"], 86.30)

    def test_missing_values(self):
        v = self.kernels[1].values
        self.assertNotIn("duration", v)  # "n/a"
        self.assertNotIn("occupancy", v)  # empty cell
        self.assertNotIn("tensor_pct", v)  # column absent

    def test_report(self):
        report = kp.render_report(self.kernels)
        first, second = report.split("\nkernel 4:")
        self.assertIn("kernel 3: void kc::ch01::vector_add_after_kernel<float>", first)
        self.assertIn("duration                      812 µs", first)
        self.assertIn("DRAM read                     2.15 GB", first)
        self.assertIn("DRAM written                  1.07 GB", first)
        # (2.15 GB + 1.07374 GB) / 812.35 µs = 3.97 TB/s
        self.assertIn("DRAM throughput               3.97 TB/s, 92.4% of peak", first)
        self.assertIn("L2 hit rate                   0.5%", first)
        self.assertIn("global load sectors/request   8.00", first)
        self.assertIn("global store sectors/request  8.00", first)
        self.assertIn("achieved occupancy            86.3%", first)
        self.assertIn("tensor pipe utilisation       n/a", first)
        self.assertIn("duration                      n/a", second)
        self.assertIn("DRAM throughput               n/a, 85.0% of peak", second)
        self.assertIn("global store sectors/request  4.00", second)
        self.assertIn("achieved occupancy            n/a", second)

    def test_no_kernels(self):
        self.assertIn("profiled no kernel", kp.render_report([]))

    def test_not_a_csv(self):
        with self.assertRaises(kp.ProfileError):
            kp.parse_ncu_csv("==PROF== Connected\nsome program output\n")

    def test_extract_csv_drops_program_output(self):
        csv_text = kp.extract_csv(read("ncu_raw_units.csv"))
        lines = csv_text.splitlines()
        self.assertTrue(lines[0].startswith('"ID","Process ID"'))
        self.assertEqual(len(lines), 4)

    def test_clock_rates(self):
        metric = kp.METRICS["sm_clock"]
        self.assertEqual(kp._unit_scale(metric, "Ghz"), 1e9)
        self.assertEqual(kp._unit_scale(metric, "cycle/nsecond"), 1e9)
        self.assertEqual(kp._unit_scale(metric, "hz"), 1.0)
        self.assertEqual(kp._unit_scale(metric, ""), 1.0)
        self.assertIsNone(kp._unit_scale(metric, "furlong/fortnight"))
        line = dict(kp.summarize(kp.KernelRow("1", "k", "(1, 1, 1)", "(32, 1, 1)", {"sm_clock": 1.73e9})))
        self.assertEqual(line["SM clock"], "1.73 GHz")

    def test_numbers(self):
        self.assertEqual(kp.parse_number('1,234,567'), 1234567.0)
        self.assertEqual(kp.parse_number(' 12.5 '), 12.5)
        self.assertIsNone(kp.parse_number('n/a'))
        self.assertIsNone(kp.parse_number(''))


class RealOutputTest(unittest.TestCase):
    """CSVs saved with --out by kc_profile.py on an H200 (Nsight Compute 2025.3.1): torch.add on
    2^24 floats and a cuBLAS bf16 4096^3 product. ncu adds many columns (device attributes, launch
    statistics, .avg/.min/.max beside each requested .sum); only the requested names are read."""

    def test_elementwise_kernel(self):
        kernels = kp.parse_ncu_csv(read("ncu_h200_add.csv"))
        self.assertEqual(len(kernels), 1)
        k = kernels[0]
        self.assertIn("CUDAFunctor_add<float>", k.name)
        self.assertEqual((k.grid, k.block), ("(16384, 1, 1)", "(128, 1, 1)"))
        self.assertAlmostEqual(k.values["duration"], 44320e-9)
        self.assertEqual(k.values["dram_read"], 134227200)
        self.assertEqual(k.values["dram_write"], 46895360)
        self.assertAlmostEqual(k.values["ld_sectors"] / k.values["ld_requests"], 16.0)
        self.assertAlmostEqual(k.values["st_sectors"] / k.values["st_requests"], 16.0)
        self.assertAlmostEqual(k.values["occupancy"], 82.38)
        self.assertAlmostEqual(k.values["l2_hit"], 34.16)
        self.assertEqual(k.values["tensor_pct"], 0.0)
        report = kp.render_report(kernels)
        self.assertIn("DRAM throughput               4.09 TB/s, 85.0% of peak", report)

    def test_tensor_core_kernel(self):
        k = kp.parse_ncu_csv(read("ncu_h200_gemm.csv"))[0]
        self.assertTrue(k.name.startswith("nvjet_sm90"))
        # The hmma metric counts Hopper's wgmma (GMMA) work too.
        self.assertAlmostEqual(k.values["tensor_pct"], 94.90)
        report = kp.render_report([k])
        # A kernel that loads through TMA makes no LSU requests: no ratio to show.
        self.assertIn("global load sectors/request   n/a", report)
        self.assertIn("tensor pipe utilisation       94.9%", report)


class CommandTest(unittest.TestCase):
    def test_command_line(self):
        command = kp.build_command("/opt/ncu", "build/bin/ch01_vector_add_bench", "ch01/after/fp32_N268435456",
                                   kernel="vector_add", launch_skip=5, launch_count=2)
        self.assertEqual(command[:9], ["/opt/ncu", "--clock-control", "none", "--print-units", "base", "--csv",
                                       "--page", "raw", "--metrics"])
        metrics = command[9].split(",")
        for name in ["dram__bytes_read.sum", "dram__bytes_write.sum",
                     "dram__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct",
                     "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
                     "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
                     "sm__warps_active.avg.pct_of_peak_sustained_active", "gpu__time_duration.sum"]:
            self.assertIn(name, metrics)
        self.assertEqual(command[10:], ["-k", "regex:vector_add", "--launch-skip", "5", "--launch-count", "2",
                                        "build/bin/ch01_vector_add_bench",
                                        "--benchmark_filter=^ch01/after/fp32_N268435456(/|$)",
                                        "--benchmark_repetitions=1"])

    def test_filter_escapes_regex_characters(self):
        self.assertEqual(kp.benchmark_filter("ch05/after/G8xM128.v2"), r"^ch05/after/G8xM128\.v2(/|$)")

    def test_ncu_from_environment(self):
        old = os.environ.get("NCU")
        os.environ["NCU"] = "/somewhere/ncu"
        try:
            self.assertEqual(kp.find_ncu(), "/somewhere/ncu")
        finally:
            if old is None:
                del os.environ["NCU"]
            else:
                os.environ["NCU"] = old

    def test_main_from_saved_csv(self):
        out = io.StringIO()
        with tempfile.TemporaryDirectory() as tmp:
            saved = os.path.join(tmp, "copy.csv")
            with contextlib.redirect_stdout(out):
                status = kp.main(["--from-csv", os.path.join(DATA_DIR, "ncu_raw_units.csv"), "--out", saved])
            self.assertEqual(status, 0)
            with open(saved, encoding="utf-8") as f:
                self.assertTrue(f.read().startswith('"ID","Process ID"'))
        self.assertIn("kernel 3:", out.getvalue())

    def test_main_needs_bench_and_case(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as raised:
            kp.main(["--bench", "x"])
        self.assertEqual(raised.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
