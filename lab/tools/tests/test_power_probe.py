"""Tests of tools/power_probe.py's reading and summarising of nvidia-smi samples (no GPU)."""

import json
import os
import sys
import tempfile
import unittest

TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TOOLS_DIR not in sys.path:
    sys.path.insert(0, TOOLS_DIR)

import power_probe as pp  # noqa: E402

# As driver 580's nvidia-smi writes it (query with clocks_throttle_reasons, header with the new
# name), idle at both ends, a last line cut short.
CSV = """timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, clocks_event_reasons.active
2026/11/30 22:57:44.530, 375 MHz, 3201 MHz, 105.51 W, 37, 0x0000000000000001
2026/11/30 22:57:44.587, 1980 MHz, 3201 MHz, 420.00 W, 38, 0x0000000000000000
2026/11/30 22:57:44.640, 1500 MHz, 3201 MHz, 690.00 W, 41, 0x0000000000000004
2026/11/30 22:57:44.690, 1470 MHz, 3201 MHz, 700.00 W, 43, 0x0000000000000004
2026/11/30 22:57:44.740, 1485 MHz, 3201 MHz, 680.00 W, 44, 0x0000000000000024
2026/11/30 22:57:44.790, 345 MHz, 3201 MHz, 110.00 W, 40, 0x0000000000000001
2026/11/30 22:57:44.84
"""

BENCH = {"context": {}, "benchmarks": [
    {"name": "ch05/x/caseA/min_time:0.200/manual_time_mean", "run_name": "ch05/x/caseA/min_time:0.200/manual_time",
     "run_type": "aggregate", "aggregate_name": "mean", "real_time": 5100.0, "time_unit": "us"},
    {"name": "ch05/x/caseA/min_time:0.200/manual_time_median",
     "run_name": "ch05/x/caseA/min_time:0.200/manual_time", "run_type": "aggregate", "aggregate_name": "median",
     "real_time": 5.064,
     "time_unit": "ms"},
]}


class PowerProbeTest(unittest.TestCase):
    def test_reasons_are_decoded(self):
        self.assertEqual(pp.decode_reasons(0x4), ["software power cap"])
        self.assertEqual(pp.decode_reasons(0x24), ["software power cap", "software thermal slowdown"])
        self.assertEqual(pp.decode_reasons(0), [])
        self.assertEqual(pp.decode_reasons(0x1000 | 0x1), ["GPU idle", "0x1000"])

    def test_samples_are_read_by_column_name(self):
        samples = pp.read_samples(CSV)
        self.assertEqual(len(samples), 6)  # the line cut short is dropped
        self.assertEqual(samples[3], pp.Sample(1470.0, 3201.0, 700.0, 43.0, 0x4))

    def test_busy_samples_by_default_half_the_highest_power(self):
        s = pp.summarize("caseA", pp.read_samples(CSV))
        self.assertEqual(s.busy_watts, 350.0)
        self.assertEqual(s.busy, 4)  # 420, 690, 700, 680 W
        self.assertEqual(s.sm_mhz_median, (1500 + 1485) / 2)
        self.assertEqual(s.sm_mhz_min, 1470)
        self.assertEqual(s.watts_median, 685.0)
        self.assertEqual(s.watts_max, 700.0)
        self.assertEqual(s.celsius_max, 44.0)
        self.assertEqual(s.reasons, ["software power cap", "software thermal slowdown"])

    def test_busy_threshold_can_be_given(self):
        s = pp.summarize("caseA", pp.read_samples(CSV), busy_watts=600)
        self.assertEqual(s.busy, 3)
        self.assertEqual(s.sm_mhz_median, 1485)
        none = pp.summarize("caseA", pp.read_samples(CSV), busy_watts=800)
        self.assertEqual(none.busy, 0)
        self.assertIn("no sample at or above 800 W", pp.format_summary(none))

    def test_missing_column_is_named(self):
        with self.assertRaisesRegex(ValueError, "power.draw"):
            pp.read_samples("timestamp, clocks.sm [MHz], clocks.mem [MHz], temperature.gpu\n")

    def test_benchmark_medians_in_microseconds(self):
        self.assertEqual(pp.benchmark_medians(BENCH), {"ch05/x/caseA": 5064.0})

    def test_folder_summary_pairs_csv_and_json(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "ch05_x_caseA.csv"), "w", encoding="utf-8") as f:
                f.write(CSV)
            with open(os.path.join(d, "ch05_x_caseA.json"), "w", encoding="utf-8") as f:
                json.dump(BENCH, f)
            (s,) = pp.summarize_dir(d, None)
            self.assertEqual(s.name, "ch05_x_caseA")
            self.assertEqual(s.medians_us, {"ch05/x/caseA": 5064.0})
            text = pp.format_summary(s)
            self.assertIn("SM clock            median 1492 MHz, lowest 1470 MHz", text)
            self.assertIn("5064.00 us  ch05/x/caseA", text)

    def test_slug_and_command(self):
        self.assertEqual(pp.slug("^ch05/step2_one_launch_wide_tile/G256xM128_N4096_K7168/"),
                         "ch05_step2_one_launch_wide_tile_G256xM128_N4096_K7168")
        self.assertEqual(pp.slug("///"), "all")
        cmd = pp.smi_command("/o/a.csv", 50)
        self.assertEqual(cmd[0], "nvidia-smi")
        self.assertIn("--loop-ms=50", cmd)
        self.assertIn("--filename=/o/a.csv", cmd)
        self.assertTrue(any(c.startswith("--query-gpu=") and "power.draw" in c for c in cmd))


if __name__ == "__main__":
    unittest.main()
