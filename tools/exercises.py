#!/usr/bin/env python3
"""Workshop skeletons generated from their solutions, so the two cannot drift.

A chapter's solution file marks each region the learner writes:

    // exercise 2: Load the u-th float4 of a and of b for this thread. Neighbouring threads
    // exercise 2: read neighbouring float4, so the step between a thread's loads is `stride`.
    // stub: x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    x[u] = a4[i + u * stride];
    // end exercise 2

`generate` writes chapters/NN_name/exercises/<file> for every marked file: a short header, then the
file with each region replaced by `// TODO N: <hint>` and the stub lines as code. `check` exits 1 when
a committed skeleton differs from what `generate` would write, or when a skeleton has no marked
solution. The chapter's CMakeLists.txt (EXERCISES) names the files that -DKC_EXERCISES=ON replaces.

    python3 tools/exercises.py generate      # rewrite every skeleton
    python3 tools/exercises.py check         # CI: skeletons match their solutions
    python3 tools/exercises.py list          # marked files and their TODO numbers
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCE_SUFFIXES = {".cu", ".cuh", ".cpp", ".hpp", ".h"}
HINT = re.compile(r"^(?P<indent>\s*)// exercise (?P<n>\d+):(?P<text>.*)$")
STUB = re.compile(r"^\s*// stub:(?P<code>.*)$")
END = re.compile(r"^\s*// end exercise (?P<n>\d+)\s*$")


class MarkupError(ValueError):
    """A solution file whose exercise markers do not follow the rules (the message says where)."""


@dataclass
class Skeleton:
    """What generate makes of one solution file."""

    solution: Path
    path: Path
    text: str
    todos: list[int]


def header(solution: Path, chapter_dir: Path) -> list[str]:
    chapter = chapter_dir.name.split("_", 1)[0]
    return [
        f"// EXERCISE: {solution.name} with its key lines replaced by TODOs. Fill them in here.",
        f"// Generated from ../{solution.name} by tools/exercises.py (do not edit the solution's copy).",
        "// Build and test this file in place of the solution:",
        f"//   cmake --preset exercises && cmake --build --preset exercises && ctest --preset exercises -L ch{chapter}",
        "// Until every TODO is done the chapter's tests fail; the lesson (README.md) explains the solution.",
        "",
    ]


def transform(lines: list[str], where: str) -> tuple[list[str], list[int]]:
    """The skeleton's lines for a solution's lines, and the TODO numbers in order."""
    out: list[str] = []
    todos: list[int] = []
    i = 0
    while i < len(lines):
        m = HINT.match(lines[i])
        if m is None:
            if STUB.match(lines[i]) or END.match(lines[i]):
                raise MarkupError(f"{where}:{i + 1}: '{lines[i].strip()}' outside an exercise region")
            out.append(lines[i])
            i += 1
            continue
        start, indent, n = i, m.group("indent"), int(m.group("n"))
        hints: list[str] = []
        while i < len(lines) and (h := HINT.match(lines[i])) is not None:
            if int(h.group("n")) != n:
                raise MarkupError(f"{where}:{i + 1}: hint of exercise {h.group('n')} inside exercise {n}")
            hints.append(h.group("text").strip())
            i += 1
        stubs: list[str] = []
        while i < len(lines) and (s := STUB.match(lines[i])) is not None:
            stubs.append(s.group("code").strip())
            i += 1
        solution_lines = 0
        while i < len(lines) and END.match(lines[i]) is None:
            if HINT.match(lines[i]) or STUB.match(lines[i]):
                raise MarkupError(f"{where}:{i + 1}: exercise {n} (line {start + 1}) is not closed before this marker")
            solution_lines += 1
            i += 1
        if i == len(lines):
            raise MarkupError(f"{where}:{start + 1}: exercise {n} has no '// end exercise {n}'")
        if int(END.match(lines[i]).group("n")) != n:
            raise MarkupError(f"{where}:{i + 1}: 'end exercise' closes exercise {n} with another number")
        if solution_lines == 0:
            raise MarkupError(f"{where}:{start + 1}: exercise {n} has no solution lines to replace")
        i += 1  # the end marker
        out.append(f"{indent}// TODO {n}: {hints[0]}".rstrip())
        out.extend(f"{indent}// {text}".rstrip() for text in hints[1:])
        out.extend(f"{indent}{code}" for code in stubs)
        todos.append(n)
    return out, todos


def marked_files(repo: Path) -> list[Path]:
    """Solution files (outside exercises/) that contain at least one exercise marker."""
    found = []
    for path in sorted((repo / "chapters").glob("*/**/*")):
        if path.suffix not in SOURCE_SUFFIXES or "exercises" in path.parts or not path.is_file():
            continue
        if any(HINT.match(line) for line in path.read_text().splitlines()):
            found.append(path)
    return found


def chapter_dir_of(repo: Path, path: Path) -> Path:
    rel = path.relative_to(repo / "chapters")
    return repo / "chapters" / rel.parts[0]


def skeleton_of(repo: Path, solution: Path) -> Skeleton:
    chapter_dir = chapter_dir_of(repo, solution)
    lines = solution.read_text().splitlines()
    body, todos = transform(lines, str(solution.relative_to(repo)))
    target = chapter_dir / "exercises" / solution.relative_to(chapter_dir)
    return Skeleton(solution, target, "\n".join(header(solution, chapter_dir) + body) + "\n", todos)


def generate(repo: Path) -> int:
    for sk in map(lambda p: skeleton_of(repo, p), marked_files(repo)):
        sk.path.parent.mkdir(parents=True, exist_ok=True)
        if not sk.path.exists() or sk.path.read_text() != sk.text:
            sk.path.write_text(sk.text)
            print(f"wrote {sk.path.relative_to(repo)} (TODO {', '.join(map(str, sk.todos))})")
    return 0


def check(repo: Path) -> int:
    problems = []
    expected = {}
    for solution in marked_files(repo):
        sk = skeleton_of(repo, solution)
        expected[sk.path] = sk
        if not sk.path.exists():
            problems.append(f"{sk.path.relative_to(repo)} is missing: run tools/exercises.py generate")
        elif sk.path.read_text() != sk.text:
            diff = difflib.unified_diff(sk.path.read_text().splitlines(), sk.text.splitlines(),
                                        "committed", "generated", lineterm="", n=1)
            problems.append(f"{sk.path.relative_to(repo)} differs from its solution's regions:\n" +
                            "\n".join(list(diff)[:40]))
    for path in sorted((repo / "chapters").glob("*/exercises/**/*")):
        if path.is_file() and path.suffix in SOURCE_SUFFIXES and path not in expected:
            problems.append(f"{path.relative_to(repo)} has no solution with exercise markers")
    for p in problems:
        print(p)
    print(f"exercises: {len(expected)} skeletons, {'OK' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


def list_files(repo: Path) -> int:
    for solution in marked_files(repo):
        sk = skeleton_of(repo, solution)
        print(f"{solution.relative_to(repo)} -> {sk.path.relative_to(repo)}: TODO {', '.join(map(str, sk.todos))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["generate", "check", "list"])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="repository root (default: this script's)")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    try:
        return {"generate": generate, "check": check, "list": list_files}[args.command](repo)
    except MarkupError as error:
        print(f"exercise markup error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
