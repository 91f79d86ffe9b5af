#!/usr/bin/env python3
"""Static SASS facts for the lessons: each kernel's size, its main loop, and what runs after it.

"Compare loops before you compare kernels" (Chapter 3): ptxas schedules a GEMM's K loop according
to everything else in the kernel, so two kernels built from the same loop source can run different
loops. This tool reads `cuobjdump -sass` output (or runs cuobjdump on a binary) and prints, for
every kernel whose name matches:

- its instruction count;
- its main loop: the backward branch whose body holds the most matrix instructions (HMMA, HGMMA,
  IMMA, DMMA; another pattern with --loop-op), with its length and matrix-instruction count;
- the instructions after that loop (the epilogue's static size);
- with --base, whether its main loop is the base kernel's, instruction for instruction once
  registers, predicates and immediates are masked ("same"), or else how alike the two are (0..1).

It counts static instructions: what a loop or an epilogue *could* issue, not what a run executes
(tools/ncu_source.py gives that, per instruction, on the GPU machine). Standard library only.

    python3 tools/sass_loops.py sass.txt [--kernel gemm_bf16_kernel] [--base NoEpilogue]
    python3 tools/sass_loops.py build/bin/ch03_fused_epilogue_test --kernel '128ELi256E' --base NoEpilogue

A machine without the CUDA toolkit's cuobjdump can use the pip wheels `nvidia-cuda-cuobjdump` and
`nvidia-cuda-nvdisasm` (unpack them; put their bin folder on PATH or set CUOBJDUMP).
"""

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import List, Optional

DEFAULT_LOOP_OP = r"\b(?:HG?MMA|IMMA|DMMA)\b"

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$", re.M)
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BRANCH = re.compile(r"\bBRA\b(?:\.\w+)*\s+(0x[0-9a-f]+)")
_MASK = re.compile(r"\bU?R\d+\b|\bU?P\d\b|\b0x[0-9a-f]+\b|\bB\d+\b")
_REUSE = re.compile(r"\.reuse\b")  # operand-reuse cache hints: part of register allocation


@dataclass
class Instruction:
    address: int
    text: str


@dataclass
class Loop:
    start: int  # index of the first instruction of the body (the branch target)
    end: int  # index of the backward branch
    matrix_ops: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1


@dataclass
class Kernel:
    name: str
    instructions: List[Instruction] = field(default_factory=list)
    main_loop: Optional[Loop] = None

    @property
    def after_loop(self) -> Optional[int]:
        """Instructions after the main loop's backward branch (None without a main loop)."""
        if self.main_loop is None:
            return None
        return len(self.instructions) - self.main_loop.end - 1

    def loop_body(self) -> List[str]:
        if self.main_loop is None:
            return []
        return [i.text for i in self.instructions[self.main_loop.start:self.main_loop.end + 1]]


def parse_sass(text: str) -> List[Kernel]:
    """The kernels of a `cuobjdump -sass` listing, each with its instructions in order."""
    kernels = []
    matches = list(_FUNCTION.finditer(text))
    for n, match in enumerate(matches):
        body = text[match.end():matches[n + 1].start() if n + 1 < len(matches) else len(text)]
        kernel = Kernel(match.group(1))
        for address, instruction in _INSTRUCTION.findall(body):
            kernel.instructions.append(Instruction(int(address, 16), " ".join(instruction.split())))
        kernels.append(kernel)
    return kernels


def find_main_loop(kernel: Kernel, loop_op: str = DEFAULT_LOOP_OP) -> Optional[Loop]:
    """The backward branch whose body holds the most instructions matching @p loop_op (ties: the
    longer body, then the earlier one); None when no loop body holds one."""
    pattern = re.compile(loop_op)
    index_of = {ins.address: n for n, ins in enumerate(kernel.instructions)}
    best = None
    for n, ins in enumerate(kernel.instructions):
        branch = _BRANCH.search(ins.text)
        if not branch:
            continue
        target = int(branch.group(1), 16)
        if target > ins.address or target not in index_of:
            continue
        start = index_of[target]
        ops = sum(1 for i in kernel.instructions[start:n + 1] if pattern.search(i.text))
        if ops == 0:
            continue
        loop = Loop(start, n, ops)
        if best is None or (loop.matrix_ops, loop.length) > (best.matrix_ops, best.length):
            best = loop
    return best


def masked(lines: List[str]) -> List[str]:
    """Instructions with registers, predicates, barriers, immediates and operand-reuse hints
    masked, so that two loops that differ only in register allocation compare equal."""
    return [_MASK.sub("_", _REUSE.sub("", line)) for line in lines]


def compare_loops(loop: List[str], base: List[str]) -> str:
    """'same' when the masked loops are equal, else their similarity as a ratio (0 to 1)."""
    a, b = masked(loop), masked(base)
    if a == b:
        return "same"
    return "%.3f" % difflib.SequenceMatcher(None, b, a, autojunk=False).ratio()


def demangle(names: List[str]) -> List[str]:
    """Names through c++filt where it exists; otherwise unchanged."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return list(names)
    done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=False)
    out = done.stdout.splitlines()
    return out if done.returncode == 0 and len(out) == len(names) else list(names)


def without_parameters(name: str) -> str:
    """A demangled kernel name without its return type and parameter list:
    'void k<T>(int, float)' -> 'k<T>'. Mangled names come back unchanged."""
    if name.endswith(")"):
        depth = 0
        for n in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[n], 0)
            if depth == 0:
                name = name[:n]
                break
    return name[len("void "):] if name.startswith("void ") else name


def cuobjdump_path() -> Optional[str]:
    for candidate in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def read_listing(path: str) -> str:
    """The SASS text of @p path: a saved listing as it is, a binary through cuobjdump -sass."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    tool = cuobjdump_path()
    if tool is None:
        raise RuntimeError("%s is a binary and no cuobjdump was found (set CUOBJDUMP or PATH)" % path)
    done = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError("cuobjdump -sass %s failed: %s" % (path, done.stderr.strip()))
    return done.stdout


def report(kernels: List[Kernel], base: Optional[Kernel], names: List[str]) -> str:
    rows = [("kernel", "instructions", "main loop", "matrix ops", "after loop", "loop vs base")]
    for kernel, name in zip(kernels, names):
        loop = kernel.main_loop
        versus = "-"
        if base is not None and loop is not None and base.main_loop is not None:
            versus = "(base)" if kernel is base else compare_loops(kernel.loop_body(), base.loop_body())
        rows.append((name, str(len(kernel.instructions)), str(loop.length) if loop else "-",
                     str(loop.matrix_ops) if loop else "-", str(kernel.after_loop) if loop else "-", versus))
    widths = [max(len(r[c]) for r in rows) for c in range(1, len(rows[0]))]
    lines = []
    for r in rows:
        cells = [r[c].rjust(widths[c - 1]) for c in range(1, len(r))]
        lines.append("  ".join(cells) + "  " + r[0])
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("listing", help="cuobjdump -sass output, or a binary to run cuobjdump on")
    parser.add_argument("--kernel", action="append", default=[],
                        help="keep kernels whose name (mangled or demangled) contains this; repeatable; "
                        "all by default")
    parser.add_argument("--base", help="compare every main loop with the kernel whose name contains this "
                        "(the first such kernel among those kept)")
    parser.add_argument("--loop-op", default=DEFAULT_LOOP_OP,
                        help="regex of the instructions that mark the main loop (default: %(default)s)")
    parser.add_argument("--mangled", action="store_true", help="print the mangled names")
    args = parser.parse_args(argv)
    try:
        kernels = parse_sass(read_listing(args.listing))
    except (OSError, RuntimeError) as error:
        print("sass_loops: %s" % error, file=sys.stderr)
        return 2
    # Filters match the mangled name or the demangled one.
    demangled = dict(zip((k.name for k in kernels), demangle([k.name for k in kernels])))

    def matches(kernel, text):
        return text in kernel.name or text in demangled[kernel.name]

    kernels = [k for k in kernels if not args.kernel or any(matches(k, s) for s in args.kernel)]
    if not kernels:
        print("sass_loops: no kernel matches", file=sys.stderr)
        return 1
    for kernel in kernels:
        kernel.main_loop = find_main_loop(kernel, args.loop_op)
    base = None
    if args.base:
        base = next((k for k in kernels if matches(k, args.base)), None)
        if base is None:
            print("sass_loops: no kept kernel contains %r (--base)" % args.base, file=sys.stderr)
            return 1
    names = [k.name if args.mangled else without_parameters(demangled[k.name]) for k in kernels]
    print(report(kernels, base, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
