"""The `synclane` command against the test database: results, exit statuses, one-line mistakes
that name the option, and what the terminal shows while work runs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from command_line import Run, on_a_terminal
from psycopg import sql
from rich.progress import Progress, TimeElapsedColumn

from synclane import SyncLane, cli
from synclane.store import SCHEMA_VERSION
from synclane.terminal import RunningClock

HERE = Path(__file__).parent
ROOT = HERE.parent
PYTHON_WORDS = re.compile(r"timedelta|stop_after|app\.\w+\(|horizon=|limit=|\bNone\b")


def _table(out: str) -> list[list[str]]:
    """The rows of a table the command printed, cells split on runs of spaces."""
    lines = [line for line in out.splitlines() if line.strip() and not set(line) <= {"─", " "}]
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


def test_plan_work_jobs_progress_failures_requeue_cancel(run: Run) -> None:
    code, out, _ = run("plan")
    assert code == 0 and out.strip() == "shops: 9 new job(s)"
    code, out, err = run("work", "--until-idle", "--idle-grace", "0")
    assert code == 3, "jobs were left failed: the exit status says so"
    lines = out.strip().splitlines()
    assert lines[0].startswith("worker stopped after ") and "7 completed" in lines[0]
    assert re.fullmatch(r"left in queue shops: 2 failed, the next retry in \d+ s", lines[-1])
    assert re.search(r"job \d+ acme-us orders", err) and "completed, 5 records" in err
    code, out, _ = run("jobs", "--status", "failed")
    rows = _table(out)
    assert code == 0 and len(rows) == 3 and rows[0][:2] == ["id", "owner"]
    assert all("LookupError: order" in row[-1] for row in rows[1:])
    code, out, _ = run("progress")
    rows = {row[0]: row for row in _table(out)[1:]}
    assert code == 0 and set(rows) == {"acme-eu", "acme-us", "globex"}
    assert rows["globex"][2:6] == ["failing", "0", "0/2", "2"]  # state, %, slices, failed
    code, out, _ = run("cancel", "--owner", "globex", "--reason", "gone")
    assert code == 0 and out.strip() == "cancelled 2 job(s) of globex in queue shops"
    code, out, _ = run("jobs", "--owner", "globex", "--status", "cancelled")
    assert len(_table(out)) == 3


def test_a_cause_id_from_failures_requeues_that_cause(run: Run) -> None:
    """The round trip the cut cause column broke: copy the id from `failures`, paste it into
    `requeue --cause-id`. Once requeued, the same id matches no open failure: exit 2."""
    run("plan")
    run("work", "--until-idle", "--idle-grace", "0")
    code, out, _ = run("failures")
    rows = _table(out)
    assert code == 0 and rows[0][0] == "cause id"
    cause_id, *_, cause = rows[1]
    assert re.fullmatch(r"[0-9a-f]{8}", cause_id) and cause == "LookupError: order <n> not found"
    assert "e.g. LookupError: order" in out, "an example error beside the masked cause"
    code, out, _ = run("requeue", "--cause-id", cause_id)
    assert code == 0 and out.strip() == "requeued 2 job(s) in queue shops"
    code, out, err = run("requeue", "--cause-id", cause_id)
    assert code == 2 and out == ""
    assert err.startswith(f"synclane: error: no open failure matches cause id {cause_id}")
    assert err.count("\n") == 1


def test_until_idle_waits_for_retries_due_within_the_grace_period(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With retries due in 0.3 s and a grace of 10 s, one run keeps working until globex's jobs
    are used up and abandoned (the first design stopped at the first retry); then it says what
    waits for a human and exits 3."""
    monkeypatch.setenv("SYNCLANE_CLI_TEST_RETRY", "0.3")
    run("plan")
    code, out, err = run("work", "--until-idle", "--idle-grace", "10")
    assert code == 3
    last = out.strip().splitlines()[-1]
    assert last.startswith("left in queue shops: 2 abandoned, waiting for a human (cause ")
    assert "e.g. LookupError: order " in last
    assert "deferred after attempt 2 of 2" in err and "abandoned: LookupError" in err


def test_until_idle_exits_0_when_nothing_is_left(run: Run) -> None:
    """globex's jobs, which would fail, are cancelled first: what is left completes."""
    code, out, _ = run("plan")
    assert code == 0
    run("cancel", "--owner", "globex", "--reason", "the account was closed")
    code, out, _ = run("plan", "--work", "--idle-grace", "0")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == "shops: 0 new job(s)" and lines[-1] == "nothing left open"
    assert "6 completed" in lines[1]


def test_quiet_shows_only_problems_and_verbose_the_details(run: Run) -> None:
    """Default: one short line per event. -q: nothing while all goes to plan. -v: the worker's
    own lines too, with every detail, at DEBUG."""
    run("plan")
    _, _, quiet = run("-q", "work", "--until-idle", "--idle-grace", "0")
    assert quiet == ""
    run("requeue")
    _, _, normal = run("work", "--until-idle", "--idle-grace", "0")
    assert re.search(r"INFO job \d+ globex orders \S+: failed \(attempt 1 of 2\)", normal)
    assert "DEBUG" not in normal and "owner=globex" not in normal
    run("requeue")
    _, _, verbose = run("work", "--until-idle", "--idle-grace", "0", "-v")
    assert re.search(r"INFO job \d+ globex orders \S+: failed \(attempt 1 of 2\)", verbose)
    assert re.search(r"DEBUG job \d+ owner=globex lane=globex type=orders window=", verbose)


def test_migrate_without_an_app_uses_the_schema_option(run: Run, schema: str) -> None:
    code, out, _ = run("--schema", schema, "migrate", app=False)
    assert code == 0 and out.strip() == f"schema '{schema}' is at version {SCHEMA_VERSION}"


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["jobs", "--queue", "nope"], "argument --queue: the app has no queue 'nope'"),
        (["jobs", "--type", "nosuch"], "argument --type: queue shops has no type 'nosuch'"),
        (["requeue", "--type", "refunds"], "argument --type: queue shops has no type"),
        (["jobs", "--owner", "nobody"], "argument --owner: no job of 'nobody'"),
        (["progress", "--owner", "nobody"], "argument --owner: no job of 'nobody'"),
        (["cancel", "--owner", "nobody", "--reason", "x"], "argument --owner: no job of"),
        (["requeue", "--owner", "nobody"], "argument --owner: no job of 'nobody'"),
        (["plan", "--owner", "initech"], "argument --owner: the owner source of queue shops"),
        (["cancel", "--reason", "gone"], "argument --owner is needed"),
        (["plan", "--horizon-days", "-3"], "argument --horizon-days: '-3' is not a number"),
        (["plan", "--horizon-days", "nan"], "argument --horizon-days: 'nan' is not a number"),
        (["plan", "--horizon-days", "inf"], "argument --horizon-days: 'inf' is not a number"),
        (["plan", "--horizon-days", "1e12"], "at most 36525 (100 years)"),
        (["jobs", "--limit", "99999999999999999999"], "argument --limit: '9999"),
        (["jobs", "--limit", "0"], "from 1 to 100,000"),
        (["jobs", "--status", "weird"], "argument --status: invalid choice: 'weird'"),
        (["work", "--for", "-5"], "argument --for: '-5' is not a number of seconds > 0"),
        (["work", "--idle-grace", "5"], "argument --idle-grace: only means something with"),
        (["work", "--until-idle", "--idle-grace", "-1"], "argument --idle-grace: '-1'"),
        (["requeue", "--cause-id", "3f2a"], "argument --cause-id: '3f2a' is not a cause id"),
        (["requeue", "--cause-id", "deadbeef"], "no open failure matches cause id deadbeef"),
        (["requeue", "--id", "0"], "argument --id: '0' is not a whole number"),
        (["requeue", "--id", "77"], "argument --id: queue shops has no job 77"),
        (["--schema", "elsewhere", "jobs"], "argument --schema: the app cli_app:app keeps"),
        (["demo", "--speed", "0"], "argument --speed: '0' is not a time factor"),
        (["nosuch"], "argument command: invalid choice: 'nosuch'"),
    ],
)
def test_a_user_mistake_is_one_line_naming_the_option_and_exit_2(
    run: Run, words: list[str], message: str
) -> None:
    code, out, err = run(*words)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("synclane: error: "), err
    assert message in err, err
    assert "Traceback" not in err and not PYTHON_WORDS.search(err), err


def test_an_owner_with_nothing_to_show_is_not_a_mistake(run: Run) -> None:
    run("plan")
    code, out, _ = run("jobs", "--owner", "acme-us", "--status", "failed")
    assert (code, out.strip()) == (0, "no jobs match")
    code, out, _ = run("requeue", "--owner", "acme-us")
    assert code == 0
    assert out.strip() == (
        "nothing to requeue: no failed, deferred or abandoned job in queue shops (owner acme-us)"
    )
    code, out, _ = run("requeue", "--id", "1")
    assert (code, out.strip()) == (0, "nothing to requeue: job 1 is pending")


def test_an_app_that_raises_on_import_is_one_line_and_traceback_shows_where(run: Run) -> None:
    code, _, err = run("--app", "cli_broken_app:app", "jobs", app=False)
    assert code == 2 and err.count("\n") == 1
    assert err == (
        "synclane: error: the app module 'cli_broken_app' raised KeyError: 'SHOP_URL' while it "
        "was imported (--traceback shows where)\n"
    )
    code, _, err = run("--app", "cli_broken_app:app", "jobs", "--traceback", app=False)
    assert code == 2 and "Traceback (most recent call last)" in err
    assert 'SHOP_URL = settings["SHOP_URL"]' in err  # the user's own line


def test_a_bad_app_path_is_one_line(run: Run) -> None:
    for words in (["--app", "no_such_module:app"], ["--app", "cli_app"], []):
        code, _, err = run(*words, "jobs", app=False)
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_the_readme_example_as_an_app_does_not_run_its_script(
    tmp_path: Path, dsn: str, schema: str
) -> None:
    """Pointing --app at the README's example imports it; the guard keeps its script (plan and
    work for 5 s) to `python example.py`."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = re.search(r"## A short example\n\n```python\n(.*?)```", readme, re.S)
    assert example is not None and 'if __name__ == "__main__":' in example.group(1)
    code = example.group(1).replace('schema="readme"', f"schema={schema!r}")
    (tmp_path / "readme_app.py").write_text(code, encoding="utf-8")
    SyncLane(dsn, schema=schema).close()  # the table exists: `jobs` creates none
    done = subprocess.run(
        [sys.executable, "-m", "synclane.cli", "--dsn", dsn, "--app", "readme_app:app", "jobs"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    # The script's first line plans 15 jobs: had it run on import, `jobs` would list them (a
    # limit on the command's time said the same, and failed when a loaded machine was slow).
    assert done.stdout.strip() == "no jobs", "the example's script ran on import"


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "synclane.cli",
            "--dsn",
            "postgresql://someone:s3cret@127.0.0.1:1/nothing",
            "--schema",
            "x",
            "migrate",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "SYNCLANE_DSN"},
    )
    assert done.returncode == 2
    assert done.stderr.startswith("synclane: error: cannot connect to postgresql://someone:***@")
    assert done.stderr.count("\n") == 1
    assert "s3cret" not in done.stderr and "Traceback" not in done.stderr


def test_every_command_has_help_with_examples() -> None:
    parser = cli.parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, command in commands.items():
        text = command.format_help()
        assert "examples:\n  synclane " in text, name
        for action in command._actions:
            if action.option_strings and action.help is None:
                pytest.fail(f"`synclane {name} {action.option_strings[0]}` has no help text")
    main_help = parser.format_help()
    assert "exit status: 0 done; 2 a mistake" in main_help
    assert "as `synclane failures` shows it" not in commands["requeue"].format_help()


def test_serve_without_prefect_says_how_to_install_it(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "synclane.prefect.serve", None)  # as if not installed
    code, _, err = run("serve")
    assert code == 2 and "pip install 'synclane[prefect]'" in err


def test_serve_without_an_app_is_one_line(run: Run) -> None:
    code, _, err = run("serve", app=False)
    assert code == 2 and err.startswith("synclane: error: no app")


def test_the_dashboard_command_serves_the_page_until_interrupted(dsn: str, schema: str) -> None:
    import json
    import signal
    import urllib.request

    env = {**os.environ, "SYNCLANE_CLI_TEST_SCHEMA": schema, "PYTHONPATH": str(HERE)}
    SyncLane(dsn, schema=schema).close()  # the table exists: the page creates none
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "synclane.cli",
            "--dsn",
            dsn,
            "dashboard",
            "--app",
            "cli_app:app",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("synclane dashboard on http://127.0.0.1:"), line
        url = line.split()[3]
        with urllib.request.urlopen(url + "api/state", timeout=10) as answer:
            assert answer.status == 200
            assert "shops" in json.dumps(json.load(answer))
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 130, "Ctrl-C: interrupted"
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def test_log_lines_stay_above_the_progress_bar_on_a_terminal(dsn: str, schema: str) -> None:
    """On a terminal (a pseudo-terminal here) the bar is drawn and every log line starts a line
    of its own: none is glued to the bar's end ("4/21 jobs done07:17:34 INFO …")."""
    env = {
        **os.environ,
        "SYNCLANE_CLI_TEST_SCHEMA": schema,
        "PYTHONPATH": str(HERE),
        "COLUMNS": "160",
        "LINES": "40",
        "TERM": "xterm",
    }
    words = ["--dsn", dsn, "--app", "cli_app:app"]
    subprocess.run([sys.executable, "-m", "synclane.cli", *words, "plan"], env=env, check=True)
    code, seen = on_a_terminal([*words, "work", "--until-idle", "--idle-grace", "0"], env)
    assert code == 3
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", seen)
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]
    assert any(re.search(r"working .* \d+/\d+ jobs done", line) for line in lines), lines
    logged = [line for line in lines if re.search(r"\d\d:\d\d:\d\d (INFO|WARNING) ", line)]
    assert logged and all(re.match(r"\d\d:\d\d:\d\d (INFO|WARNING) ", line) for line in logged)
    assert not any("jobs done" in line and " INFO " in line for line in lines), lines


def test_no_warning_text_on_the_embedded_database(tmp_path: Path, server_dir: Path) -> None:
    """With nothing configured (no DSN, no XDG_RUNTIME_DIR, as in a container or over ssh), the
    demo and a command on the embedded PostgreSQL print no warning: platformdirs' runtime-dir
    warning is silenced where pgserver imports it, nothing else is."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SYNCLANE_DSN", "XDG_RUNTIME_DIR", "SYNCLANE_APP", "PYTHONWARNINGS")
    }
    env["SYNCLANE_DATA_DIR"] = str(server_dir / "data")
    for words in (
        ["--schema", "cli", "demo", "--no-page", "--speed", "0.05", "--for", "3"],
        ["--schema", "cli", "--app", "synclane.demo.app:app", "failures"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "synclane.cli", *words],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        output = done.stdout + done.stderr
        # what each command says when it worked: the demo's first line; `failures`' table, or
        # its one line when the short demo (3 s, on a loaded machine) failed nothing yet
        said = ("the embedded PostgreSQL", "cause id", "no open failures")
        assert any(text in output for text in said), output[-2000:]
        assert "Warning" not in output and "XDG_RUNTIME_DIR" not in output, output[-2000:]


def test_the_demo_tells_its_story_and_a_requeue_from_another_terminal_ends_it(
    dsn: str, schema: str
) -> None:
    """The demo at twenty times its pace: the terminal shows the scripted 429 (lane acme
    paused) and 503, the broken slice deferred and abandoned, the shop's fix with the command to
    requeue it; that command, run as printed, loads the slice and the story ends. The hint for
    the jobs table names the --dsn and --schema the demo ran with."""
    import signal
    import threading

    env = {k: v for k, v in os.environ.items() if k not in ("SYNCLANE_DSN", "SYNCLANE_SCHEMA")}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "synclane.cli",
            "--dsn",
            dsn,
            "--schema",
            schema,
            "demo",
            "--speed",
            "0.05",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    said: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            said.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def wait_for_line(words: str, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = [line for line in said if words in line]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no line with {words!r} in {seconds} s:\n" + "\n".join(said))

    try:
        wait_for_line("press Requeue", 60)
        fixed = wait_for_line(" requeue --cause-id ", 5)
        command = re.search(r"INFO\s+(\S+ .+ requeue --cause-id [0-9a-f]{8})$", fixed)
        assert command is not None, fixed
        requeued = subprocess.run(
            command.group(1), shell=True, capture_output=True, text=True, timeout=60, env=env
        )
        assert requeued.returncode == 0, requeued.stderr
        assert requeued.stdout.strip() == "requeued 1 job(s) in queue shops"
        wait_for_line("the story is over", 30)
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=30)
        reader.join(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{schema}_demo"))
            )
    assert process.returncode == 130, "\n".join(said[-20:])
    assert "open http://127.0.0.1:" in out
    program = Path(sys.executable).parent / "synclane"
    app_words = f"--schema {schema} --app synclane.demo.app:app jobs"
    jobs_hint = f"  {program} --dsn {shlex.quote(dsn)} {app_words}"
    assert jobs_hint in out.splitlines(), out
    story = "\n".join(said)
    for expected in (
        r"job \d+ acme-eu orders \S+: the API said slow down \(429 Too Many Requests for acme-eu",
        r"lane acme pauses for",
        r"acme-us orders \S+: failed \(attempt 1 of 5\): ShopUnavailable: 503",
        r"job \d+ globex orders \S+: deferred after attempt 5 of 5: ShopBrokenPage",
        r"job \d+ globex orders \S+: abandoned: ShopBrokenPage",
        r"the shop is fixing the broken record on its side",
        r"was requeued: it continues at its saved cursor 50",
    ):
        assert re.search(expected, story), expected
    assert "Warning" not in story and "Traceback" not in story
    assert all(len(line) < 400 for line in said), "one short line per event"
    assert out.strip().splitlines()[-2].startswith("demo stopped: ")
    assert out.strip().splitlines()[-1] == "nothing left open", "the requeued slice loaded"


def test_an_event_line_says_what_happened_in_one_short_line() -> None:
    """Each kind of worker event as the terminal prints it: the job, what happened, and when
    it continues; the steps in between at DEBUG."""
    import logging
    from datetime import UTC, datetime, timedelta

    from synclane.event_lines import line
    from synclane.events import KINDS, Event

    at = datetime(2026, 11, 30, 7, 44, tzinfo=UTC)
    job = {
        "queue": "shops",
        "job_id": 16,
        "owner": "globex",
        "lane": "globex",
        "type": "orders",
        "mode": "initial",
        "worker": "w",
        "window_start": datetime(2026, 10, 1, tzinfo=UTC),
        "window_end": datetime(2026, 10, 31, tzinfo=UTC),
        "at": at,
    }
    lines = {
        kind: line(
            Event(
                kind=kind,
                attempt=2,
                error="Throttled: 429 Too Many Requests" if kind == "throttled" else "E: 1\nmore",
                until=at + timedelta(seconds=2.5),
                records=50,
                cursor="100",
                status="pending",
                **job,
            ),
            max_attempts=5,
        )
        for kind in KINDS
    }
    label = "job 16 globex orders 2026-10-01..10-31: "
    assert lines["failed"] == (
        logging.INFO,
        label + "failed (attempt 2 of 5): E: 1; retry in 2.5 s",
    )
    assert lines["throttled"] == (
        logging.INFO,
        label + "the API said slow down (429 Too Many Requests); lane globex pauses for 2.5 s",
    )
    assert lines["deferred"][0] == lines["abandoned"][0] == logging.WARNING
    assert lines["started"][0] == lines["page"][0] == logging.DEBUG
    assert lines["handed_back"][1] == label + (
        "handed back at cursor 100, to continue there (the worker is stopping)"
    )
    for kind, (_, text) in lines.items():
        assert "\n" not in text and len(text) < 250, kind
        assert kind == "first_load_finished" or text.startswith(label), kind
    far = Event(kind="failed", until=at + timedelta(minutes=90), **job)
    assert line(far)[1].endswith("retry at 09:14:00 UTC (in 1.5 h)")


def test_pause_and_resume_from_the_command_line_while_planning_goes_on(
    run: Run, db: psycopg.Connection, schema: str
) -> None:
    code, out, _ = run("pause", "--queue", "shops", "--reason", "warehouse maintenance")
    assert code == 0
    assert re.fullmatch(
        r"queue shops paused since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC by \S+: "
        r"warehouse maintenance; running jobs stop at their next page",
        out.strip(),
    )
    pauses = sql.Identifier(schema, "queue_pauses")
    assert db.execute(sql.SQL("SELECT queue, reason FROM {}").format(pauses)).fetchall() == [
        ("shops", "warehouse maintenance")
    ]
    code, out, _ = run("plan")
    assert (code, out.strip()) == (0, "shops: 9 new job(s)"), "planning goes on while paused"
    jobs = sql.Identifier(schema, "jobs")
    started = sql.SQL("SELECT count(*) FROM {} WHERE started_at IS NOT NULL").format(jobs)
    code, _, _ = run("work", "--for", "1")
    assert db.execute(started).fetchone() == (0,), "a paused queue started a job"
    assert run("resume", "--queue", "shops")[1].strip() == "queue shops resumed"
    assert db.execute(sql.SQL("SELECT count(*) FROM {}").format(pauses)).fetchone() == (0,)
    assert run("resume", "--queue", "shops")[1].strip() == "queue shops was not paused"
    code, _, err = run("pause", "--queue", "shops", "--reason", " ")
    assert code == 2 and "reason" in err


def test_the_bars_clock_keeps_running_while_the_count_equals_the_total() -> None:
    # Rich's elapsed column stands still while a task is complete; a worker's bar is complete
    # whenever every open job is done (the demo waiting for the shop's fix), and the worker runs on
    now = [0.0]
    shown = Progress(get_time=lambda: now[0])
    task = shown.add_task("shops", total=2)
    now[0] = 1.0
    shown.update(task, completed=2)
    now[0] = 75.0

    assert str(RunningClock().render(shown.tasks[0])) == "0:01:15"
    assert str(TimeElapsedColumn().render(shown.tasks[0])) == "0:00:01", "rich's stands still"
