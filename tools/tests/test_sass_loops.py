"""Tests of tools/sass_loops.py on CPU: a small `cuobjdump -sass` listing written out below."""

import contextlib
import io
import os
import shutil
import sys
import tempfile
import unittest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
TOOLS_DIR = os.path.dirname(TESTS_DIR)
if TOOLS_DIR not in sys.path:
    sys.path.insert(0, TOOLS_DIR)

import sass_loops as sl  # noqa: E402

# Two kernels in cuobjdump's layout. `plain`: a prologue, a loop of 2 HMMA at 0x0020-0x0060 with a
# short inner loop of no matrix instruction (0x0030-0x0040), two stores after. `fused`: the same
# loop with other registers and reuse hints, then a longer epilogue, and a forward branch.
LISTING = """
Fatbin elf code:
================
arch = sm_90

\tcode for sm_90
\t\tFunction : _Z5plainv
\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                  /* 0x00000a0000017a02 */
                                                                           /* 0x000fe40000000f00 */
        /*0010*/                   S2R R0, SR_TID.X ;                      /* 0x0000000000007919 */
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;   /* 0x0000000c0804723c */
        /*0030*/                   IADD3 R2, R2, 0x1, RZ ;                 /* 0x0000000102027810 */
        /*0040*/               @P0 BRA 0x30 ;                              /* 0x0000000000000947 */
        /*0050*/                   HMMA.16816.F32.BF16 R16, R8, R14, R16 ; /* 0x0000000e0810723c */
        /*0060*/               @P1 BRA 0x20 ;                              /* 0x0000000000001947 */
        /*0070*/                   STG.E [R2.64], R4 ;                     /* 0x0000000402007986 */
        /*0080*/                   STG.E [R2.64+0x4], R16 ;                /* 0x0000041002007986 */
        /*0090*/                   EXIT ;                                  /* 0x000000000000794d */
\t\t..........

\t\tFunction : _Z5fusedv
\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R3, SR_TID.X ;
        /*0020*/                   HMMA.16816.F32.BF16 R20, R8.reuse, R12, R20 ;
        /*0030*/                   IADD3 R6, R6, 0x1, RZ ;
        /*0040*/               @P2 BRA 0x30 ;
        /*0050*/                   HMMA.16816.F32.BF16 R24, R8, R14, R24 ;
        /*0060*/               @P3 BRA 0x20 ;
        /*0070*/                   FADD R20, R20, R30 ;
        /*0080*/               @P0 BRA 0xb0 ;
        /*0090*/                   MUFU.TANH R20, R20 ;
        /*00a0*/                   FMUL R24, R24, 0.5 ;
        /*00b0*/                   STG.E [R6.64], R20 ;
        /*00c0*/                   EXIT ;
\t\t..........
"""


class ParseTest(unittest.TestCase):
    def test_kernels_and_instructions(self):
        kernels = sl.parse_sass(LISTING)
        self.assertEqual([k.name for k in kernels], ["_Z5plainv", "_Z5fusedv"])
        self.assertEqual(len(kernels[0].instructions), 10)
        self.assertEqual(len(kernels[1].instructions), 13)
        self.assertEqual(kernels[0].instructions[2].address, 0x20)
        self.assertEqual(kernels[0].instructions[4].text, "@P0 BRA 0x30")

    def test_main_loop_is_the_branch_around_the_matrix_instructions(self):
        plain, fused = sl.parse_sass(LISTING)
        loop = sl.find_main_loop(plain)
        # 0x20..0x60: five instructions, two HMMA; the inner loop (no HMMA) is not chosen.
        self.assertEqual((loop.start, loop.end, loop.length, loop.matrix_ops), (2, 6, 5, 2))
        plain.main_loop = loop
        self.assertEqual(plain.after_loop, 3)
        fused.main_loop = sl.find_main_loop(fused)
        self.assertEqual(fused.after_loop, 6)

    def test_no_loop_without_the_pattern(self):
        plain = sl.parse_sass(LISTING)[0]
        self.assertIsNone(sl.find_main_loop(plain, r"\bHGMMA\b"))
        # Another pattern picks the loop that holds it.
        loop = sl.find_main_loop(plain, r"\bIADD3\b")
        self.assertEqual((loop.start, loop.end), (2, 6))  # ties go to the longer body

    def test_loops_differing_in_registers_and_reuse_hints_are_the_same(self):
        plain, fused = sl.parse_sass(LISTING)
        plain.main_loop, fused.main_loop = sl.find_main_loop(plain), sl.find_main_loop(fused)
        self.assertEqual(sl.compare_loops(fused.loop_body(), plain.loop_body()), "same")

    def test_different_loops_give_a_ratio(self):
        base = ["HMMA _", "IADD3 _", "BRA _"]
        other = ["HMMA _", "FADD _", "IADD3 _", "BRA _"]
        ratio = float(sl.compare_loops(other, base))
        self.assertGreater(ratio, 0.5)
        self.assertLess(ratio, 1.0)

    def test_masking_keeps_opcodes_and_constant_registers(self):
        self.assertEqual(sl.masked(["@!P1 IADD3 R2, P0, R4.reuse, 0x10, RZ"]), ["@!_ IADD3 _, _, _, _, RZ"])
        self.assertEqual(sl.masked(["BSSY B0, 0x7920"]), ["BSSY _, _"])
        self.assertEqual(sl.masked(["ULDC.64 UR4, c[0x0][0x118]"]), ["ULDC.64 _, c[_][_]"])


class NameTest(unittest.TestCase):
    def test_parameters_and_return_type_are_dropped(self):
        self.assertEqual(sl.without_parameters("void k<T<(int)2> >(int, float (*)(int))"), "k<T<(int)2> >")
        self.assertEqual(sl.without_parameters("_Z5plainv"), "_Z5plainv")


class MainTest(unittest.TestCase):
    def run_main(self, *args):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "sass.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(LISTING)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = sl.main([path, "--mangled", *args])
        return status, out.getvalue(), err.getvalue()

    def test_table_with_base(self):
        status, out, _ = self.run_main("--base", "plain")
        self.assertEqual(status, 0)
        lines = out.splitlines()
        self.assertEqual(lines[0].split()[-1], "kernel")
        self.assertEqual(lines[1].split(), ["10", "5", "2", "3", "(base)", "_Z5plainv"])
        self.assertEqual(lines[2].split(), ["13", "5", "2", "6", "same", "_Z5fusedv"])

    def test_kernel_filter_and_missing_base(self):
        status, out, _ = self.run_main("--kernel", "fused")
        self.assertEqual(status, 0)
        self.assertEqual(len(out.splitlines()), 2)
        self.assertEqual(out.splitlines()[1].split()[-2], "-")
        status, _, err = self.run_main("--kernel", "fused", "--base", "plain")
        self.assertEqual(status, 1)
        self.assertIn("--base", err)
        status, _, err = self.run_main("--kernel", "nothing")
        self.assertEqual(status, 1)
        self.assertIn("no kernel matches", err)

    @unittest.skipUnless(shutil.which("c++filt"), "no c++filt to demangle with")
    def test_filters_match_demangled_names(self):
        status, out, _ = self.run_main("--kernel", "plain()")
        self.assertEqual(status, 0)
        self.assertEqual(out.splitlines()[1].split()[-1], "_Z5plainv")

    def test_a_binary_goes_through_cuobjdump(self):
        with tempfile.TemporaryDirectory() as tmp:
            binary = os.path.join(tmp, "program")
            with open(binary, "wb") as f:
                f.write(b"\x7fELF and the rest of a program")
            listing = os.path.join(tmp, "listing.txt")
            with open(listing, "w", encoding="utf-8") as f:
                f.write(LISTING)
            fake = os.path.join(tmp, "cuobjdump")  # prints the listing when asked for -sass
            with open(fake, "w", encoding="utf-8") as f:
                f.write('#!/bin/sh\n[ "$1" = -sass ] && [ "$2" = "%s" ] && cat "%s"\n' % (binary, listing))
            os.chmod(fake, 0o755)
            saved = os.environ.get("CUOBJDUMP")
            os.environ["CUOBJDUMP"] = fake
            try:
                kernels = sl.parse_sass(sl.read_listing(binary))
            finally:
                if saved is None:
                    del os.environ["CUOBJDUMP"]
                else:
                    os.environ["CUOBJDUMP"] = saved
        self.assertEqual([k.name for k in kernels], ["_Z5plainv", "_Z5fusedv"])

    def test_unreadable_listing(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = sl.main(["/nonexistent/sass.txt"])
        self.assertEqual(status, 2)
        self.assertIn("sass_loops:", err.getvalue())


if __name__ == "__main__":
    unittest.main()
