"""tools/ch10_check_pytorch.py's verdict, without PyTorch or a GPU."""

import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import ch10_check_pytorch as check  # noqa: E402


class VerdictTest(unittest.TestCase):
    def test_agreement_and_error_both_decide(self):
        self.assertTrue(check.verdict("a", 1.0, 0.0)[0])
        self.assertTrue(check.verdict("a", 0.9, 0.02)[0])
        self.assertFalse(check.verdict("a", 0.89, 0.0)[0])
        self.assertFalse(check.verdict("a", 1.0, 0.021)[0])
        self.assertFalse(check.verdict("a", 1.0, math.nan)[0], "a NaN error fails")

    def test_line_says_what_was_compared(self):
        ok, line = check.verdict("dsv3 T=64 after vs pytorch", 0.984, 0.0061)
        self.assertTrue(ok)
        self.assertIn("dsv3 T=64 after vs pytorch: ok", line)
        self.assertIn("98.4% of tokens routed alike", line)
        self.assertIn("relative error 0.0061", line)


if __name__ == "__main__":
    unittest.main()
