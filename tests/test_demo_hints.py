"""The commands the demo prints run as printed from another terminal: one that has not
activated the virtualenv synclane was installed into and opens in another folder, on a terminal
80 columns wide, where a command is never cut into lines (issue 29, items 2 and 5)."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from command_line import on_a_terminal
from psycopg import sql
from rich.console import Console

from synclane.demo import build_demo, data_schema_for
from synclane.events import WHOLE_LINE
from synclane.terminal import Terminal

ROOT = Path(__file__).parent.parent


def another_terminal(tmp_path: Path) -> dict[str, str]:
    """The environment of a new terminal: the virtualenv not on the PATH, no synclane setting."""
    here = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != here)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCLANE_")}
    env.update(PATH=path, HOME=str(tmp_path))
    env.pop("VIRTUAL_ENV", None)
    return env


@pytest.fixture
def demo_left_waiting(dsn: str, schema: str) -> Iterator[str]:
    """The demo's table as a run leaves it once the shop fixed its record: globex's broken slice
    abandoned, the fix done. `synclane demo --keep` then says at once how to requeue it."""
    data_schema = data_schema_for(schema)
    demo = build_demo(dsn, schema=schema, speed=0.05, data_schema=data_schema)
    try:
        demo.app.plan()
        with psycopg.connect(dsn, autocommit=True) as conn:
            jobs = sql.Identifier(schema, "jobs")
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET status = 'abandoned', cursor = '50', attempt_count = 6,"
                    " error = 'ShopBrokenPage: globex orders: the page at cursor 50 is broken'"
                    " WHERE id = (SELECT min(id) FROM {} WHERE owner = 'globex'"
                    "  AND mode = 'initial' AND type = 'orders')"
                ).format(jobs, jobs)
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (fault, failures, heals_after, fixed_at)"
                    " VALUES ('globex orders', 6, 6, clock_timestamp() - interval '1 second')"
                ).format(sql.Identifier(data_schema, "faults"))
            )
    finally:
        demo.close()
    yield data_schema
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(data_schema))
        )


def _on_an_80_column_terminal(words: list[str], cwd: Path) -> str:
    """What `python -m synclane.cli WORDS` wrote to a pseudo-terminal 80 columns wide."""
    env = {k: v for k, v in os.environ.items() if k not in ("SYNCLANE_DSN", "SYNCLANE_SCHEMA")}
    _, seen = on_a_terminal(words, env, columns=80, cwd=cwd)
    # the bar redraws itself with a carriage return or by erasing its line: each starts a line
    text = re.sub(r"\r|\x1b\[2K", "\n", seen)
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", text)


def test_the_demo_s_commands_run_as_printed_from_another_terminal(
    dsn: str, schema: str, demo_left_waiting: str, tmp_path: Path
) -> None:
    """`demo --keep --no-page` on an 80-column terminal: the jobs command and the requeue command
    each stand whole on a line of their own (the requeue one was cut before its cause id), each
    starts with this synclane's own path (not on the new terminal's PATH: `command not found`)
    and carries the --dsn and --schema the demo ran with; pasted into a new terminal elsewhere,
    each runs. Without the page the story says nothing of pressing Requeue on it."""
    words = ["--dsn", dsn, "--schema", schema, "demo", "--keep", "--no-page", "--for", "4"]
    shown = _on_an_80_column_terminal(words, cwd=tmp_path)
    lines = [line.strip() for line in shown.split("\n")]
    program = re.escape(str(Path(sys.executable).parent / "synclane"))
    jobs = [line for line in lines if re.fullmatch(program + r" .* jobs", line)]
    requeue = [
        line for line in lines if re.fullmatch(program + r" .* requeue --cause-id \w{8}", line)
    ]
    assert len(jobs) == 1 and len(requeue) == 1, shown
    assert f"--schema {schema} --app synclane.demo.app:app" in requeue[0]
    assert "press Requeue" not in shown and "on the page" not in shown, shown
    assert "the shop has fixed its broken record: requeue the slice with" in shown, shown

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = another_terminal(tmp_path)

    def pasted(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, shell=True, env=env, cwd=elsewhere, capture_output=True, text=True, timeout=60
        )

    assert pasted("synclane --version").returncode == 127, "synclane is not on this PATH"
    listed = pasted(jobs[0])
    assert listed.returncode == 0, listed.stderr
    assert "globex" in listed.stdout and "abandoned" in listed.stdout
    requeued = pasted(requeue[0])
    assert (requeued.returncode, requeued.stdout.strip()) == (
        0,
        "requeued 1 job(s) in queue shops",
    ), requeued.stderr


def test_a_command_the_log_prints_is_never_wrapped(capsys: pytest.CaptureFixture[str]) -> None:
    """On a terminal, log lines wrap to its width; a line marked as a command prints whole."""
    term = Terminal()
    shown = io.StringIO()
    term.err = Console(file=shown, force_terminal=True, width=80, highlight=False, markup=False)
    term.setup_logging()
    try:
        story = logging.getLogger("synclane.demo")
        command = "  /a/rather/long/path/to/.venv/bin/synclane --schema demo_two --app "
        command += "synclane.demo.app:app requeue --cause-id 8041c8e0"
        story.info("the shop has fixed its broken record: requeue the slice with")
        story.info("%s", command, extra={WHOLE_LINE: True})
    finally:
        term.close_logging()
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", shown.getvalue())
    assert command in text.split("\n"), text
