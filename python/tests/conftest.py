"""The `vramlab` binary the equality tests compare with: $VRAMLAB_BIN, else the
repository's target/release or target/debug build."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _binary():
    explicit = os.environ.get("VRAMLAB_BIN")
    if explicit:
        return explicit
    for profile in ("release", "debug"):
        p = ROOT / "target" / profile / "vramlab"
        if p.exists():
            return str(p)
    return None


@pytest.fixture(scope="session")
def cli():
    b = _binary()
    if b is None:
        pytest.fail(
            "no vramlab binary to compare with: build it (cargo build) or set VRAMLAB_BIN",
            pytrace=False,
        )
    return b


@pytest.fixture(scope="session")
def root():
    return ROOT
