#!/usr/bin/env python
"""Take a screenshot of a book page with headless Chromium.

    .venv/bin/python tools/screenshot.py _build/html/chapters/ch11_seats.html out.png
    .venv/bin/python tools/screenshot.py "_build/html/chapters/ch11_seats.html#lab-the-kv-cache-calculator" lab.png
    .venv/bin/python tools/screenshot.py URL out.png --selector ".cell_output" --height 600 --width 1100

A path is turned into a file:// URL. The shot is taken once images have loaded, math is
typeset and widgets have rendered (the same readiness test as tests/test_book.py). With
a #fragment or --selector the window is scrolled so the picture starts at that
element; the picture is one window (--width x --height). Problems the page reported (console errors, failed loads,
network requests) are printed, so the tool doubles as a quick check of one page.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from urllib.parse import urldefrag

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chromium import READY_JS, Browser, find_chromium  # noqa: E402


def to_url(target: str) -> str:
    if "://" in target:
        return target
    path_part, fragment = urldefrag(target)
    path = Path(path_part).resolve()
    if not path.exists():
        raise FileNotFoundError(f"{path_part}: no such file; build the book first (make book)")
    return path.as_uri() + (f"#{fragment}" if fragment else "")


def screenshot(target: str, out: Path, width: int = 1280, height: int = 1000,
               selector: str | None = None) -> tuple[Path, list[str]]:
    """Write ``out``; return it and the list of problems the page reported."""
    executable = find_chromium()
    if executable is None:
        raise FileNotFoundError("no chromium on PATH; install it with `make browser` (Debian package chromium)")
    url = to_url(target)
    fragment = urldefrag(url)[1]
    if fragment and not selector:
        selector = f'[id="{fragment}"]'
    with tempfile.TemporaryDirectory(prefix="servelab-chromium-") as profile:
        browser = Browser(executable, Path(profile), width=width, height=height)
        try:
            browser.open(url, READY_JS)
            path = browser.screenshot(Path(out).resolve(), selector=selector)
            return path, browser.problems()
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot a page with headless Chromium.")
    parser.add_argument("target", help="URL or path of an HTML file (a #fragment scrolls to it)")
    parser.add_argument("out", type=Path, help="PNG file to write")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1000, help="window (and picture) height")
    parser.add_argument("--selector", default=None, help="CSS selector of the element the picture starts at")
    args = parser.parse_args(argv)
    path, problems = screenshot(args.target, args.out, args.width, args.height, args.selector)
    for problem in problems:
        print(f"page problem: {problem}", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
