"""The `synclane` command against the test database, error paths included."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from synclane import cli
from synclane.store import SCHEMA_VERSION

HERE = Path(__file__).parent
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Run]:
    """Run `synclane --dsn <test db> --app cli_app:app ...` in this process."""
    monkeypatch.setenv("SYNCLANE_CLI_TEST_SCHEMA", schema)
    monkeypatch.delenv("SYNCLANE_APP", raising=False)
    monkeypatch.syspath_prepend(str(HERE))

    def invoke(*words: str, app: bool = True) -> tuple[int, str, str]:
        sys.modules.pop("cli_app", None)  # a fresh app (and schema) for every call
        prefix = ["--dsn", dsn] + (["--app", "cli_app:app"] if app else [])
        code = cli.main([*prefix, *words])
        out, err = capsys.readouterr()
        return code, out, err

    yield invoke
    sys.modules.pop("cli_app", None)


def test_plan_work_jobs_progress_failures_requeue_cancel(run: Run) -> None:
    code, out, _ = run("plan")
    assert code == 0 and out.strip() == "shops: 9 new job(s)"
    code, out, _ = run("work", "--until-idle")
    assert code == 0 and "completed 7" in out and "failed 2" in out
    code, out, _ = run("jobs", "--status", "failed")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 3 and "LookupError: order" in lines[1]
    code, out, _ = run("progress")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.strip().splitlines()[1:]}
    assert set(rows) == {"acme-eu", "acme-us", "globex"}
    assert rows["globex"][2:5] == ["2", "0", "2"]  # total, completed, failed
    code, out, _ = run("failures")
    assert code == 0 and "LookupError: order <n> not found" in out and " 2 " in out
    code, out, _ = run("requeue", "--queue", "shops", "--cause", "LookupError: order <n> not found")
    assert code == 0 and out.strip() == "requeued 2 job(s)"
    code, out, _ = run("cancel", "--queue", "shops", "--owner", "globex", "--reason", "gone")
    assert code == 0 and out.strip() == "cancelled 2 job(s)"
    code, out, _ = run("jobs", "--owner", "globex", "--status", "cancelled")
    assert len(out.strip().splitlines()) == 3


def test_migrate_without_an_app_uses_the_schema_option(run: Run, schema: str) -> None:
    code, out, _ = run("--schema", schema, "migrate", app=False)
    assert code == 0 and out.strip() == f"schema '{schema}' is at version {SCHEMA_VERSION}"


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["jobs", "--queue", "nope"], "unknown queue 'nope'"),
        (["requeue", "--queue", "shops", "--type", "refunds"], "has no type 'refunds'"),
        (["plan", "--horizon-days", "-3"], "horizon"),
    ],
)
def test_a_user_mistake_is_one_line_and_exit_2(run: Run, words: list[str], message: str) -> None:
    code, _, err = run(*words)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("synclane: error: ") and message in err
    assert "Traceback" not in err


def test_a_bad_app_path_is_one_line(run: Run) -> None:
    sys.modules.pop("cli_app", None)
    assert cli.main(["--app", "no_such_module:app", "jobs"]) == 2
    assert cli.main(["--app", "cli_app", "jobs"]) == 2
    assert cli.main(["jobs"]) == 2


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


def test_serve_without_prefect_says_how_to_install_it(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "synclane.prefect.serve", None)  # as if not installed
    code, _, err = run("serve")
    assert code == 2 and "pip install 'synclane[prefect]'" in err


def test_serve_without_an_app_is_one_line(run: Run) -> None:
    code, _, err = run("serve", app=False)
    assert code == 2 and err.startswith("synclane: error: no app")


def test_the_demo_command_plays_its_story_and_serves_its_page(dsn: str, schema: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "synclane.cli",
            "--dsn",
            dsn,
            "--schema",
            schema,
            "demo",
            "--for",
            "20",
            "--speed",
            "0.05",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        assert "open http://127.0.0.1:" in done.stdout
        assert "planned" in done.stdout and "demo stopped" in done.stdout
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(
                sql.SQL("SELECT owner, status, cursor FROM {} WHERE status <> 'completed'").format(
                    sql.Identifier(schema, "jobs")
                )
            ).fetchall()
            loaded = conn.execute(
                sql.SQL("SELECT count(DISTINCT owner) FROM {}").format(
                    sql.Identifier(f"{schema}_demo", "orders")
                )
            ).fetchone()
        assert rows == [("globex", "abandoned", "50")], "everything else completes"
        assert loaded == (4,)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{schema}_demo"))
            )


def test_the_dashboard_command_serves_the_page_until_interrupted(dsn: str, schema: str) -> None:
    import json
    import signal
    import urllib.request

    env = {**os.environ, "SYNCLANE_CLI_TEST_SCHEMA": schema, "PYTHONPATH": str(HERE)}
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
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)
