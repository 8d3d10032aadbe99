"""What the command line says besides its tables: a mistake points at the help of the command
it was made in, a change is told once, and what it prints about jobs is true of them."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pytest
from command_line import Run, on_a_terminal
from workers import arrange

from synclane import SyncLane, cli

HERE = Path(__file__).parent


def _commands() -> list[str]:
    parser = cli.parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(commands.choices)


# the options a command needs before it looks at the rest
REQUIRED = {
    "cancel": ["--owner", "globex", "--reason", "gone"],
    "pause": ["--reason", "maintenance"],
    "prune": ["--older-than-days", "30"],
}


@pytest.mark.parametrize("command", _commands())
def test_an_unknown_option_points_at_the_help_of_its_command(run: Run, command: str) -> None:
    code, out, err = run(command, *REQUIRED.get(command, []), "--bogus-flag")
    assert (code, out) == (2, "")
    assert err == (
        "synclane: error: unrecognized arguments: --bogus-flag "
        f"(`synclane {command} --help` helps)\n"
    )


def test_an_unknown_option_before_the_command_points_at_the_main_help(run: Run) -> None:
    code, _, err = run("--bogus-flag", app=False)
    assert code == 2 and err.endswith("(`synclane --help` helps)\n"), err


def test_pause_and_resume_tell_the_change_once(run: Run) -> None:
    """The result on stdout; no log line on stderr that repeats it (with -v it is a detail)."""
    code, out, err = run("pause", "--reason", "warehouse down")
    assert code == 0 and out.count("paused") == 1 and err == ""
    code, out, err = run("resume")
    assert (code, out.strip(), err) == (0, "queue shops resumed", "")
    run("pause", "--reason", "again")
    _, _, verbose = run("resume", "-v")
    assert "queue shops resumed" in verbose


def test_the_readme_lists_every_option_of_every_command() -> None:
    """The README's table of commands names each option `synclane COMMAND --help` shows (the
    options every command takes are said once, above the table)."""
    import re

    readme = (HERE.parent / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `synclane (\w+)([^|]*)\|", readme, re.M)
    listed: dict[str, set[str]] = {}
    for name, usage in rows:
        for command, words in re.findall(r"(?:^|synclane )(\w+)?([^·]*)", name + usage):
            listed.setdefault(command or name, set()).update(re.findall(r"--[\w-]+", words))
    parser = cli.parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    common = {o for a in parser._actions for o in a.option_strings}
    for name, command in commands.choices.items():
        options = {
            o for a in command._actions for o in a.option_strings if o.startswith("--")
        } - common
        assert name in listed, f"the README's table has no row for `synclane {name}`"
        assert options <= listed[name], (name, sorted(options - listed[name]))


def _started(words: list[str], schema: str, ready: str) -> subprocess.Popen[str]:
    """`synclane WORDS` in a process of its own (on cli_app), once its stderr or stdout said
    `ready`."""
    env = {**os.environ, "SYNCLANE_CLI_TEST_SCHEMA": schema, "PYTHONPATH": str(HERE)}
    process = subprocess.Popen(
        [sys.executable, "-m", "synclane.cli", *words],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if ready in line:
            return process
    process.kill()
    raise AssertionError(f"never said {ready!r}:\n{''.join(seen)}")


@pytest.mark.parametrize(
    ("command", "ready"),
    [
        (["work", "-v"], "started: shops"),
        (["plan", "--work", "-v"], "started: shops"),
        (["dashboard", "--port", "0"], "synclane dashboard on "),
    ],
)
def test_ctrl_c_exits_130_as_the_readme_says_and_sigterm_stops_as_asked(
    dsn: str, schema: str, command: list[str], ready: str
) -> None:
    """Ctrl-C (SIGINT) is an interruption: 130, after the jobs were handed back. SIGTERM is how
    a supervisor or a deploy stops a worker: its usual status."""
    words = ["--dsn", dsn, "--app", "cli_app:app", *command]
    SyncLane(dsn, schema=schema).close()  # the table exists: the page creates none
    for sig, expected in ((signal.SIGINT, 130), (signal.SIGTERM, None)):
        process = _started(words, schema, ready)
        try:
            process.send_signal(sig)
            code = process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=10)
        if expected is not None:
            assert code == expected, (sig, command)
        elif command[0] == "dashboard":  # a stop asked for, as `work` takes it
            assert code == 0, (sig, command, code)
        else:
            assert code in (0, 3), (sig, command, code)


def test_a_job_that_will_not_run_again_shows_no_next_run(
    run: Run, app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """Completed, abandoned, cancelled: nothing will run them again; a running job runs now. Their
    next_run_at is an old due time, not a next run: the frame has NaT and `jobs` an empty cell.
    Pending, failed and deferred jobs keep theirs."""
    run("plan")
    ids = sorted(int(i) for i in app.jobs()["id"])
    statuses = ["completed", "abandoned", "cancelled", "running", "pending", "failed", "deferred"]
    chosen = dict(zip(statuses, ids, strict=False))
    later = datetime.now(UTC) + timedelta(hours=1)
    for status, job_id in chosen.items():
        arrange(db, schema, job_id, status=status, next_run_at=later)
    arrange(db, schema, chosen["running"], lease_token=uuid.uuid4(), leased_by="w",
            lease_expires_at=later)  # fmt: skip
    frame = app.jobs().set_index("id")
    for status, job_id in chosen.items():
        shown = frame.loc[job_id, "next_run_at"]
        if status in ("pending", "failed", "deferred"):
            assert abs(shown - later) < timedelta(seconds=1), status
        else:
            assert pd.isna(shown), (status, shown)
    _, out, _ = run("jobs", "--limit", "100")
    lines = out.splitlines()
    header = lines[0]
    at = header.index("next run")
    for status, job_id in chosen.items():
        (line,) = [ln for ln in lines[2:] if ln.split()[0] == str(job_id)]
        cell = line[at : at + len("2026-12-02 05:01:02")].strip()
        if status in ("pending", "failed", "deferred"):
            assert cell == f"{later:%Y-%m-%d %H:%M:%S}", (status, line)
        else:
            assert cell == "", (status, line)


def _on_a_terminal(words: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    """`synclane WORDS` on a pseudo-terminal 160 columns wide: its exit status and the lines it
    showed, each as last drawn (the bar redraws its line in place)."""
    import re

    code, seen = on_a_terminal(words, env)
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", seen)
    lines = text.replace("\r\n", "\n").split("\n")
    return code, [line.split("\r")[-1].strip() for line in lines if line.strip()]


def test_the_bar_counts_a_job_waiting_for_a_human_and_says_so(dsn: str, schema: str) -> None:
    """globex's two history slices fail until abandoned: the bar ends at 7 of 9 jobs done, the
    two abandoned ones counted and named, not dropped from the total (it said 7/7)."""
    env = {
        **os.environ,
        "SYNCLANE_CLI_TEST_SCHEMA": schema,
        "SYNCLANE_CLI_TEST_RETRY": "0.05",
        "PYTHONPATH": str(HERE),
    }
    words = ["--dsn", dsn, "--app", "cli_app:app"]
    subprocess.run([sys.executable, "-m", "synclane.cli", *words, "plan"], env=env, check=True)
    code, lines = _on_a_terminal([*words, "work", "--until-idle", "--idle-grace", "5"], env)
    assert code == 3
    bars = [line for line in lines if "jobs done" in line]
    assert bars, lines
    assert "7/9 jobs done, 2 waiting for a human" in bars[-1], bars[-1]
