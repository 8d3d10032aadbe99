"""Every notebook in notebooks/ runs top to bottom against the test database, and is committed
without outputs."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import psycopg
import pytest
from nbclient import NotebookClient
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_is_a_notebook_to_run() -> None:
    assert [path.name for path in NOTEBOOKS if path.name == "explore.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_the_notebook_is_committed_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_the_notebook_runs_top_to_bottom(
    path: Path, dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel inherits the environment: the test database and this test's schema (the
    notebook's demo tables go in `<schema>_demo`, dropped here too). A cell that raises fails
    the test with that cell's traceback."""
    monkeypatch.setenv("SYNCLANE_DSN", dsn)
    monkeypatch.setenv("SYNCLANE_NOTEBOOK_SCHEMA", schema)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    began = time.monotonic()
    try:
        client.execute()
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{schema}_demo"))
            )
    seconds = time.monotonic() - began
    assert seconds < 60, f"{path.name} took {seconds:.0f} s"
    images = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    assert len(images) == 3, "two coverage timelines and the progress chart show as pictures"
