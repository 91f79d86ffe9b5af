#!/usr/bin/env python3
"""Links that work both on GitHub and in the Doxygen site, and a check that they do.

The lessons link the way GitHub reads them: relative to the Markdown file (`vector_add_after.cu`,
`../../docs/results/h200/ch01.png`, `chapters/01_vector_add/`). Doxygen 1.9 resolves only links to
Markdown pages; a link to a source file or a folder, or an image outside the page's folder, comes out
dead. So Doxygen reads every Markdown input through `filter`, which rewrites, in Doxygen's copy only:

- a link to a source file Doxygen reads      -> `@ref <path from the repository root>` (its file page);
- a link to a folder that holds a README.md -> a link to that README.md;
- a link to a Markdown page                  -> its absolute path (the main page: `@ref index`);
- an image found in Doxygen's IMAGE_PATH     -> its file name (Doxygen copies it into the site);
- a link to another existing file (LICENSE, a script) -> its text (the site has no copy of it).

Links whose target does not exist are left as they are. `check` then fails the docs target when a
Markdown input links to a missing file, or when a page of the generated site has a relative href or
src that names no file of the site.

    python3 docs/doxygen_links.py filter BUILD/docs/Doxyfile FILE.md       (Doxygen's FILTER_PATTERNS)
    python3 docs/doxygen_links.py check BUILD/docs/Doxyfile BUILD/docs/html
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

# [text](target) and ![alt](target); the text may hold `code` but no nested brackets.
LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\[\]]*)\]\((?P<target>[^()\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")


def read_doxyfile(path: Path) -> dict[str, list[str]]:
    """The tags of a Doxyfile, each as its list of words (continuation lines joined)."""
    tags: dict[str, list[str]] = {}
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        if line.lstrip().startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        tags[key.strip()] = [w.strip('"') for w in value.split()]
    return tags


class Site:
    """What Doxygen reads, from the Doxyfile the docs target configured."""

    def __init__(self, doxyfile: Path) -> None:
        tags = read_doxyfile(doxyfile)
        self.root = Path(tags["STRIP_FROM_PATH"][0]).resolve()
        self.inputs = [Path(p).resolve() for p in tags["INPUT"]]
        self.patterns = tags["FILE_PATTERNS"]
        self.excludes = tags.get("EXCLUDE_PATTERNS", [])
        self.image_dirs = [Path(p).resolve() for p in tags.get("IMAGE_PATH", [])]
        mainpage = tags.get("USE_MDFILE_AS_MAINPAGE", [])
        self.mainpage = Path(mainpage[0]).resolve() if mainpage else None

    def reads(self, path: Path) -> bool:
        """True when Doxygen takes @p path as an input file."""
        path = path.resolve()
        if not path.is_file() or any(fnmatch.fnmatch(str(path), e) for e in self.excludes):
            return False
        for root in self.inputs:
            if path == root:
                return True
            if root.is_dir() and root in path.parents:
                return any(fnmatch.fnmatch(path.name, p) for p in self.patterns)
        return False

    def markdown_inputs(self) -> list[Path]:
        found: set[Path] = set()
        for root in self.inputs:
            candidates = [root] if root.is_file() else root.rglob("*.md")
            found.update(p.resolve() for p in candidates if p.suffix == ".md" and self.reads(p))
        return sorted(found)


def relative_target(target: str) -> str | None:
    """The path part of a relative link target, or None for URLs and in-page anchors."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
        return None
    return unquote(parts.path)


def markdown_links(text: str):
    """(line index, match) for every Markdown link outside code blocks and code spans."""
    in_fence = False
    for index, line in enumerate(text.splitlines()):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        masked = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in LINK.finditer(masked):
            yield index, m, line


def rewrite(site: Site, page: Path, text: str) -> str:
    lines = text.splitlines(keepends=True)
    for index, m, _ in reversed(list(markdown_links(text))):
        line = lines[index]
        path = relative_target(m.group("target"))
        if path is None:
            continue
        target = (page.parent / path).resolve()
        label = line[m.start("text") : m.end("text")]
        if m.group("bang"):
            found = [d for d in site.image_dirs if (d / target.name).resolve() == target]
            new = f"![{label}]({target.name})" if found else None
        elif target.is_dir() and (target / "README.md").is_file():
            new = f"[{label}]({Path(os.path.relpath(target / 'README.md', page.parent.resolve())).as_posix()})"
        elif target.suffix == ".md" and target == site.mainpage:
            new = f"[{label}](@ref index)"
        elif target.suffix == ".md" and target.is_file():
            # Doxygen resolves a link to a Markdown page, but tries the path from its working folder
            # before the page's own folder: an absolute path leaves no doubt.
            new = f"[{label}]({target.as_posix()})"
        elif site.reads(target):
            new = f"[{label}](@ref {target.relative_to(site.root).as_posix()})"
        elif target.exists():
            new = label
        else:
            new = None
        if new is not None:
            lines[index] = line[: m.start()] + new + line[m.end() :]
    return "".join(lines)


class HtmlLinks(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.targets: list[tuple[int, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.targets.append((self.getpos()[0], value))


def check(site: Site, html: Path) -> int:
    dead: list[str] = []
    pages = site.markdown_inputs()
    for page in pages:
        for index, m, _ in markdown_links(page.read_text()):
            path = relative_target(m.group("target"))
            if path is not None and not (page.parent / path).exists():
                where = page.relative_to(site.root)
                dead.append(f"{where}:{index + 1}: link to a missing file '{m.group('target')}'")
    html = html.resolve()
    files = sorted(html.rglob("*.html"))
    for f in files:
        parser = HtmlLinks()
        parser.feed(f.read_text(encoding="utf-8", errors="replace"))
        for line, target in parser.targets:
            path = relative_target(target)
            if path is None:
                continue
            resolved = (f.parent / path).resolve()
            if not resolved.is_file() or html not in resolved.parents:
                dead.append(f"{f.relative_to(html)}:{line}: dead link '{target}' in the site")
    for d in dead:
        print(d)
    print(f"doxygen_links: {len(pages)} Markdown inputs, {len(files)} HTML pages, {len(dead)} dead link(s)")
    if not files:
        print(f"doxygen_links: no HTML under {html}")
        return 1
    return 1 if dead else 0


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[1] not in ("filter", "check"):
        print(__doc__.strip().splitlines()[-2].strip(), file=sys.stderr)
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    site = Site(Path(argv[2]))
    if argv[1] == "filter":
        page = Path(argv[3])
        sys.stdout.write(rewrite(site, page, page.read_text()))
        return 0
    return check(site, Path(argv[3]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
