"""The README and docs/ examples run as written (against the test database)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _examples() -> list[tuple[str, int, str]]:
    found = []
    for document in DOCUMENTS:
        for number, match in enumerate(BLOCK.finditer(document.read_text(encoding="utf-8"))):
            found.append((document.name, number, match.group(1)))
    return found


@pytest.mark.parametrize(("document", "number", "code"), _examples())
def test_the_example_runs(document: str, number: int, code: str, dsn: str, schema: str) -> None:
    """Each python block runs in a fresh interpreter; `SyncLane(None, schema="x")` is pointed at
    the test database and this test's schema, so nothing outside the test is touched."""
    code, replaced = re.subn(
        r'SyncLane\(None, schema="[^"]+"', f"SyncLane({dsn!r}, schema={schema!r}", code
    )
    if "SyncLane(" in code:
        assert replaced, f"{document} block {number}: use SyncLane(None, schema=...) in examples"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, f"{document} block {number} failed:\n{done.stderr[-3000:]}"
