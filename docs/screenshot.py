"""Write docs/audit-page.png: the ``audit --html`` page of the bundled faulty sample, its
first finding selected, as headless chromium draws it.

    python docs/screenshot.py [--chromium /usr/bin/chromium]

The page is written by ``python -m hurray_schema audit --html`` from this checkout, then
opened with ``#finding=0`` (the page selects that finding when it loads) and captured with
chromium's own ``--screenshot``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "hurray_schema" / "samples" / "faulty.stream"
OUTPUT = ROOT / "docs" / "audit-page.png"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--size", default="1400,860", help="window width,height in pixels")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "faulty.html"
        environment = dict(os.environ, PYTHONPATH=str(ROOT))
        done = subprocess.run([sys.executable, "-m", "hurray_schema", "audit", "--html", str(page),
                               "hurray_schema/samples/faulty.stream"], cwd=ROOT, env=environment,
                              capture_output=True, text=True)
        if not page.is_file():
            sys.exit(f"no page written: {done.stderr}")
        profile = Path(tmp) / "profile"
        subprocess.run([args.chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size={args.size}",
                        f"--screenshot={OUTPUT}", page.as_uri() + "#finding=0"],
                       check=True, capture_output=True, timeout=120)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
