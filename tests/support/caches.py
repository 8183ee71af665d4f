"""Cache folders as another user of the machine could leave them, for the tests of the caches whose files
run as code (the generated-code cache and the kernel cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PLANTED = ["world-writable", "another user's"]
"""The ways a folder of ours can be planted first: world-writable, or owned by someone else."""


def shared_root_with_planted(tmp_path: Path, name: str, planted: str) -> tuple[Path, Path]:
    """A world-writable cache root (as a ``NUMBA_CACHE_DIR=/some/shared/dir`` would be) in which the folder
    ``name`` a cache would make for itself is already there, ``planted`` (one of :data:`PLANTED`).
    Returns ``(root, planted folder)``.  Giving a folder to another user needs root: the test is skipped
    otherwise (the world-writable case runs everywhere)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    trap = shared / name
    trap.mkdir()
    if planted == "another user's":
        if os.getuid() != 0:
            pytest.skip("giving a folder to another user needs root (the world-writable case runs everywhere)")
        os.chown(trap, 65534, 65534)
        trap.chmod(0o755)
    else:
        trap.chmod(0o777)
    return shared, trap
