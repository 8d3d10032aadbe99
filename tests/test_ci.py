"""CI runs what the README tells a newcomer to run: its install and its test command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_ci_runs_the_readme_s_install_and_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"Run the tests .*?```bash\n(.*?)\n```", readme, re.S)
    assert block is not None, "the README's test command"
    venv, install, test = (part.strip() for part in block.group(1).split("&&"))
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert venv in ci
    assert install.replace(".venv/bin/pip install", ".venv/bin/pip install -q") in ci
    # the test command, as written, on the embedded server (no $SYNCLANE_TEST_DSN)
    assert f"env -u SYNCLANE_TEST_DSN {test}\n" in ci


def test_a_missing_system_tool_skips_on_a_fresh_machine_and_fails_in_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PgBouncer and Chromium come from the system, not from pip: the README's test command on
    # a machine with only Python skips their tests and names the package; CI, which installs
    # them and sets SYNCLANE_TEST_REQUIRE_TOOLS, fails instead of skipping.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "export SYNCLANE_TEST_REQUIRE_TOOLS=1" in ci
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))
    pytester.makepyfile(
        "from system_tools import need\n"
        "def test_it():\n"
        "    need(False, 'needs PgBouncer: apt-get install pgbouncer')\n"
    )
    monkeypatch.delenv("SYNCLANE_TEST_REQUIRE_TOOLS", raising=False)
    fresh = pytester.runpytest_subprocess("-rs", "-p", "no:synclane", "-p", "no:xdist")
    fresh.assert_outcomes(skipped=1)
    fresh.stdout.fnmatch_lines(["*needs PgBouncer: apt-get install pgbouncer*"])
    monkeypatch.setenv("SYNCLANE_TEST_REQUIRE_TOOLS", "1")
    required = pytester.runpytest_subprocess("-p", "no:synclane", "-p", "no:xdist")
    required.assert_outcomes(failed=1)
    required.stdout.fnmatch_lines(["*SYNCLANE_TEST_REQUIRE_TOOLS is set*"])
