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


@pytest.mark.parametrize(("document", "number", "code"), _examples())
def test_the_example_imports_what_it_uses_and_nothing_else(
    document: str, number: int, code: str
) -> None:
    """pyflakes' checks (ruff's F rules): no unused import, no name used but not defined."""
    checked = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F",
         "--output-format", "concise", "--stdin-filename", f"{document}-{number}.py", "-"],
        input=code, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, f"{document} block {number}:\n{checked.stdout}"


def test_every_synclane_name_the_readme_shows_is_imported_where_it_is_shown() -> None:
    """A name of synclane's the README's prose shows in use (`Abandon("access revoked")`) is in a
    `from synclane import …` line the reader can copy: the example's or one beside it."""
    import synclane

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    imported = {
        name.strip()
        for names in re.findall(r"from synclane import ([\w, ]+)", readme)
        for name in names.split(",")
    }
    shown = set(re.findall(r"`([A-Z]\w+)\(", readme))
    ours = {name for name in shown if name in synclane.__all__}
    assert ours, "the prose shows synclane's names"
    assert ours <= imported, sorted(ours - imported)
