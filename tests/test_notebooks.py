"""Every notebook in notebooks/ runs top to bottom against the test database, and is committed
without outputs."""

from __future__ import annotations

import re
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
    assert len(images) == 4, "two coverage timelines and two progress charts show as pictures"
    said = [
        "".join(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    ]
    assert not [text for text in said if "Warning" in text], "no warning in any cell's output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_the_notebook_says_how_to_open_and_run_it(path: Path) -> None:
    """`jupyter execute` alone runs a notebook and keeps nothing to look at: the notebook says
    how to open it, and how to run it headless with an output to open."""
    first = nbformat.read(path, as_version=4).cells[0].source
    assert "jupyter lab notebooks/" in first and "jupyter execute --output=" in first


def test_the_timeline_names_the_month_of_every_tick() -> None:
    """The notebook's first timeline began with a bare "15" (the 15th of a month whose first day
    is left of the axis) and ended with a stray "2026-Dec" offset: every tick now names its
    month, and the year is in the axis label."""
    import pandas as pd

    from synclane import plots

    spans = pd.DataFrame(
        {
            "owner": ["acme", "globex"],
            "type": ["orders", "orders"],
            "status": ["completed", "abandoned"],
            "window_start": pd.to_datetime(["2026-08-02", "2026-10-01"], utc=True),
            "window_end": pd.to_datetime(["2026-11-30", "2026-10-31"], utc=True),
        }
    )
    figure = plots.coverage_timeline(spans)
    figure.canvas.draw()
    axes = figure.axes[-1]
    labels = [tick.get_text() for tick in axes.get_xticklabels() if tick.get_text()]
    assert labels and all(re.search(r"[A-Z][a-z]{2}", label) for label in labels), labels
    assert axes.xaxis.get_offset_text().get_text() == ""
    assert axes.get_xlabel() == "window (UTC, 2026)"


# which distribution gives each `jupyter` subcommand
JUPYTER_COMMANDS = {"lab": "jupyterlab", "execute": "nbclient", "nbconvert": "nbconvert"}


def test_the_readme_has_one_command_that_installs_what_the_notebooks_need_and_opens_them() -> None:
    """One line a reader pastes: it installs an extra of synclane's, and that extra holds the
    package of the `jupyter` command the line runs next (`jupyter nbconvert` was not installed)."""
    import tomllib

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = [
        line
        for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
        for line in block.splitlines()
        if "notebooks/explore.ipynb" in line and "pip install" in line
    ]
    assert len(commands) == 1, commands
    extras = re.findall(r"pip install -e '\.\[([\w,]+)\]'", commands[0])
    assert extras, commands[0]
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    installed = {
        re.split(r"[<>=\[ ]", requirement)[0]
        for extra in extras[0].split(",")
        for requirement in optional[extra]
    }
    used = re.findall(r"jupyter (\w+)", commands[0])
    assert used, commands[0]
    for subcommand in used:
        assert JUPYTER_COMMANDS[subcommand] in installed, (subcommand, sorted(installed))


def test_what_running_the_notebooks_writes_is_ignored_by_git(tmp_path: Path) -> None:
    """The notebook's headless run (`jupyter execute --output=explore-run`) writes
    notebooks/explore-run.ipynb beside it; JupyterLab keeps checkpoints. Neither is committed."""
    import subprocess

    first = nbformat.read(ROOT / "notebooks" / "explore.ipynb", as_version=4).cells[0].source
    (output,) = re.findall(r"jupyter execute --output=(\S+)", first)
    for path in (f"notebooks/{output}.ipynb", "notebooks/.ipynb_checkpoints/explore.ipynb"):
        ignored = subprocess.run(
            ["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", path], check=False
        )
        assert ignored.returncode == 0, f"{path} is not in .gitignore"
