"""Tests of tools/exercises.py: skeletons from marked solution regions, and the drift check."""

import tempfile
import unittest
from pathlib import Path

from tools import exercises

SOLUTION = """\
// Add two vectors.
__device__ float add(float x, float y) {
  // exercise 1: Return the sum of x and y.
  // exercise 1: One line is enough.
  // stub: (void)x;
  // stub: return y;
  return x + y;
  // end exercise 1
}
int untouched = 3;
"""


class ExercisesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = Path(self.tmp.name)
        self.chapter = self.repo / "chapters" / "09_demo"
        self.chapter.mkdir(parents=True)
        (self.chapter / "add.cu").write_text(SOLUTION)

    def tearDown(self):
        self.tmp.cleanup()

    def test_region_becomes_todo_hint_and_stub(self):
        lines, todos = exercises.transform(SOLUTION.splitlines(), "add.cu")
        self.assertEqual(todos, [1])
        self.assertEqual(lines[2:6], ["  // TODO 1: Return the sum of x and y.", "  // One line is enough.",
                                      "  (void)x;", "  return y;"])
        self.assertNotIn("  return x + y;", lines)
        self.assertEqual(lines[-1], "int untouched = 3;")

    def test_generate_then_check_passes_and_drift_fails(self):
        self.assertEqual(exercises.generate(self.repo), 0)
        skeleton = self.chapter / "exercises" / "add.cu"
        text = skeleton.read_text()
        self.assertIn("ctest --preset exercises -L ch09", text)
        self.assertEqual(exercises.check(self.repo), 0)
        skeleton.write_text(text.replace("int untouched = 3;", "int untouched = 4;"))
        self.assertEqual(exercises.check(self.repo), 1)

    def test_orphan_skeleton_fails_check(self):
        exercises.generate(self.repo)
        (self.chapter / "exercises" / "old.cu").write_text("int x;\n")
        self.assertEqual(exercises.check(self.repo), 1)

    def test_unclosed_or_mismatched_regions_are_errors(self):
        with self.assertRaises(exercises.MarkupError):
            exercises.transform(["// exercise 1: hint", "code();"], "f.cu")
        with self.assertRaises(exercises.MarkupError):
            exercises.transform(["// exercise 1: hint", "code();", "// end exercise 2"], "f.cu")
        with self.assertRaises(exercises.MarkupError):
            exercises.transform(["// exercise 1: hint", "// end exercise 1"], "f.cu")
        with self.assertRaises(exercises.MarkupError):
            exercises.transform(["// stub: x;"], "f.cu")


if __name__ == "__main__":
    unittest.main()
