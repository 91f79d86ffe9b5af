"""Tests of tools/ncu_source.py on CPU: ncu's source-page CSV, read from a small fixture."""

import os
import sys
import unittest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(TESTS_DIR, "data")
TOOLS_DIR = os.path.dirname(TESTS_DIR)
if TOOLS_DIR not in sys.path:
    sys.path.insert(0, TOOLS_DIR)

import ncu_source as ns  # noqa: E402


def fixture():
    with open(os.path.join(DATA_DIR, "ncu_source_small.csv"), encoding="utf-8") as f:
        return f.read()


class ReadTest(unittest.TestCase):
    def test_skips_the_benchmark_output_and_keeps_instruction_rows(self):
        header, rows = ns.read_rows(fixture())
        self.assertEqual(header[1], "Source")
        self.assertEqual(len(rows), 7)

    def test_missing_header_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "no source-page header"):
            ns.read_rows("Benchmark Time\nnothing here\n")

    def test_missing_column_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "Instructions Executed"):
            ns.read_rows('"Address","Source","Warp Stall Sampling (All Samples)"\n"0x0","NOP","1"\n')

    def test_opcode_drops_predicate_and_modifiers(self):
        self.assertEqual(ns.opcode("@!P0  BRA 0x20"), "BRA")
        self.assertEqual(ns.opcode("      HMMA.16816.F32.BF16 R4, R8, R12, R4"), "HMMA")
        self.assertEqual(ns.opcode(""), "")


class SummaryTest(unittest.TestCase):
    def setUp(self):
        self.header, self.rows = ns.read_rows(fixture())

    def test_splits_after_the_last_marker(self):
        warps, (loop, after) = ns.summarize(self.header, self.rows)
        self.assertEqual(warps, 8)  # the first instruction runs once per warp
        self.assertEqual((loop.instructions, after.instructions), (4, 3))
        self.assertEqual((loop.executed, after.executed), (176, 32))
        self.assertEqual((loop.samples, after.samples), (20.0, 5.0))
        self.assertEqual(loop.reasons["wait"], 14.0)
        self.assertEqual(after.reasons["no_inst"], 3.0)
        self.assertNotIn("wait (Not Issued)", loop.reasons)  # the not-issued columns are not reasons
        self.assertEqual(after.opcodes["STG"], 8)
        self.assertEqual(loop.opcodes["HMMA"], 88)

    def test_other_marker_and_no_match(self):
        _, (head, tail) = ns.summarize(self.header, self.rows, r"\bBRA\b")
        self.assertEqual((head.instructions, tail.instructions), (3, 4))
        self.assertEqual(head.name, "through the last BRA")
        with self.assertRaisesRegex(ValueError, "no instruction matches"):
            ns.summarize(self.header, self.rows, r"\bHGMMA\b")

    def test_format_gives_per_warp_figures_and_shares(self):
        text = ns.format_summary(*ns.summarize(self.header, self.rows))
        self.assertIn("warps per launch (the first instruction's count): 8", text)
        self.assertIn("4 SASS instructions, 22.0 executed per warp, 20 stall samples (80.0 %)", text)
        self.assertIn("HMMA 11.0", text)

    def test_compact_keeps_source_counts_and_reasons(self):
        lines = ns.compact(self.header, self.rows).splitlines()
        self.assertEqual(lines[0], "index,Source,Instructions Executed,Warp Stall Sampling (All Samples),stall_wait,"
                         "stall_no_inst")
        self.assertEqual(len(lines), 8)
        self.assertTrue(lines[2].startswith("1,"))
        # a compact file reads back with the same summary
        again = ns.summarize(*ns.read_rows("\n".join(lines)))
        self.assertEqual(again[1][0].executed, 176)


if __name__ == "__main__":
    unittest.main()
