"""Shared test fixtures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("exploring", derandomize=False)

CONFORMANCE = Path(__file__).resolve().parents[1].parent / "shared" / "conformance"

os.environ.setdefault("HURRAY_SCHEMA_COMPILE", "eager")
"""The tests test the kernels: each compiles at its first use, also in the processes tests start, rather
than NumPy standing in for it on small jobs (evaluate/jit/kernels.py ``Kernel.worth_it``; the tests that compare
the two paths choose them explicitly)."""
os.environ.setdefault("HURRAY_SCHEMA_SHARED_KERNELS", "0")
os.environ.setdefault("HURRAY_SCHEMA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "tests"))
"""The generated-code and kernel caches of the suite live in the checkout (git ignores ``.cache/``), not in
the user's: a fresh clone compiles everything once, a later run of the same sources loads it."""
"""Kernels are not linked as shared libraries as the suite compiles them (a tenth of a second or more
each); tests/test_kernel_cache.py links and loads one."""


def pytest_addoption(parser):
    parser.addoption("--thorough", action="store_true",
                     help="run the slow property runs and mutation sweeps at full size (tests/support/sizes.py)")


def pytest_configure(config):
    """``--thorough``: full sizes and fresh random examples; otherwise the same examples every run.

    A default run draws each property's examples from a seed fixed by the test's name, so a
    second run meets the same element types and quantizer variants as the first and finds their
    kernels compiled; a thorough run explores new examples each time.
    """
    thorough = config.getoption("--thorough")
    if thorough:
        os.environ["HURRAY_THOROUGH"] = "1"  # read by tests/support/sizes.py when the test modules are imported
    if config.getoption("hypothesis_profile", None) is None:  # an explicit --hypothesis-profile wins
        settings.load_profile("exploring" if thorough else "repeatable")


@pytest.fixture(autouse=True)
def fresh_decoder():
    """Every test starts with the decoder's memo empty (``hurray_schema.codec.DECODER``): no test
    sees what another one left in the tables of the fast path, whatever the order they run in."""
    from hurray_schema.codec import DECODER

    DECODER.reset()
    yield


@pytest.fixture
def eager_kernels(monkeypatch):
    """Every kernel compiles at its first use in this test (``HURRAY_SCHEMA_COMPILE=eager``): for the
    tests that check which kernel a job takes, also in the pass that runs the default policy."""
    from hurray_schema.evaluate import jit

    monkeypatch.setattr(jit.kernels, "COMPILE_EAGERLY", True)


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    """``../shared/conformance`` beside the checkout (the reference project's golden vectors)."""
    if not (CONFORMANCE / "manifest.json").is_file():
        pytest.skip(f"golden vectors not found at {CONFORMANCE} (the shared/ folder is absent)")
    return CONFORMANCE


@pytest.fixture(scope="session")
def manifest(conformance_dir) -> dict:
    return json.loads((conformance_dir / "manifest.json").read_text())


@pytest.fixture(scope="session")
def nginx():
    """nginx (the Debian package .ci/run installs) serving a temporary folder on 127.0.0.1."""
    import shutil

    from support.remote_servers import Nginx

    binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
    if binary is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light; .ci/run installs it)")
    server = Nginx(binary)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto_s3():
    """moto's S3 in server mode on 127.0.0.1, counting the ranged GETs it answers."""
    from support.remote_servers import CountingMoto

    server = CountingMoto()
    yield server
    server.stop()


@pytest.fixture
def fault_server():
    """A small HTTP server of ours on 127.0.0.1 that misbehaves as a test asks."""
    from support.remote_servers import FaultServer

    server = FaultServer()
    yield server
    server.stop()
