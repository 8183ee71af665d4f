"""The command line as a user runs it: ``hurray-schema`` in a child process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def _command() -> list[str]:
    script = Path(sys.executable).parent / "hurray-schema"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("hurray-schema")
    if found and Path(found).resolve().parent == Path(sys.executable).resolve().parent:
        return [found]
    return [sys.executable, "-m", "hurray_schema"]


CLI = _command()


def run(*args, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], input=input, capture_output=True, timeout=120)


def out(done: subprocess.CompletedProcess) -> str:
    return done.stdout.decode("utf-8")
