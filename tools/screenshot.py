#!/usr/bin/env python
"""Take a screenshot of a book page with headless Chromium.

    .venv/bin/python tools/screenshot.py _build/html/index.html out.png
    .venv/bin/python tools/screenshot.py file:///.../page.html out.png --width 1280 --height 2400

A path is turned into a file:// URL. The page gets a few seconds of virtual time so
that widgets and MathJax render before the picture is taken. Chromium runs with a
fresh profile and without background networking, the same way tests/test_book.py
runs it.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError("no chromium on PATH; install it with `make browser` (Debian package chromium)")


def to_url(target: str) -> str:
    if "://" in target:
        return target
    path = Path(target).resolve()
    if not path.exists():
        raise FileNotFoundError(f"{target}: no such file; build the book first (make book)")
    return path.as_uri()


def screenshot(target: str, out: Path, width: int = 1280, height: int = 1600, wait_ms: int = 4000) -> Path:
    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="servelab-chromium-") as profile:
        cmd = [find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
               f"--window-size={width},{height}", f"--virtual-time-budget={wait_ms}",
               f"--screenshot={out}", to_url(target)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    if not out.is_file():
        raise RuntimeError(f"chromium did not write {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot a page with headless Chromium.")
    parser.add_argument("target", help="URL or path of an HTML file")
    parser.add_argument("out", type=Path, help="PNG file to write")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1600)
    parser.add_argument("--wait-ms", type=int, default=4000, help="virtual time given to scripts before the shot")
    args = parser.parse_args(argv)
    print(screenshot(args.target, args.out, args.width, args.height, args.wait_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
