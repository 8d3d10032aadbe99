"""CI runs what the README tells a newcomer to run: its install and its test command."""

from __future__ import annotations

import re
from pathlib import Path

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
