"""Tests that need a program of the system, not of PyPI: PgBouncer (the pooler tests) and
Debian's Chromium (the page's browser test).

On a machine with only Python, the README's test command skips them and says which package to
install (`pytest -ra` lists the reasons). Where SYNCLANE_TEST_REQUIRE_TOOLS is set (.ci/run sets
it after installing both), a missing program fails the test instead: CI never passes without
running them."""

from __future__ import annotations

import os

import pytest

REQUIRED = "SYNCLANE_TEST_REQUIRE_TOOLS"


def need(present: bool, what: str) -> None:
    """Skip the test unless `present` (`what` says what to install); fail it where the tools
    are required."""
    if present:
        return
    if os.environ.get(REQUIRED):
        pytest.fail(f"{what} ({REQUIRED} is set: this run must not skip it)")
    pytest.skip(what)
