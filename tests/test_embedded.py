"""The embedded PostgreSQL's life (synclane.embedded): it stops when its last user ends, however
that user ends; several processes share one data folder; a failed start and a crash are one
line each that name the database and its log; pgserver's PostgreSQL 16 data is refused with the
command that moves it, and that command moves it.

Every case uses data folders of its own, never the test session's server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from servers import remove_unless_running

from synclane.embedded import embedded_dsn, stop

pytestmark = pytest.mark.processes
HERE = Path(__file__).parent

# A process that uses the embedded server of the folder it is given, until it is signalled.
# A user of the server with Python's own signal handling: SIGHUP and SIGTERM set back to their
# defaults, which a run started under nohup (or by a supervisor that ignores them) would not be.
USER = (
    "import signal, sys, time; from pathlib import Path; "
    "from synclane.embedded import embedded_dsn; "
    "signal.signal(signal.SIGHUP, signal.SIG_DFL); signal.signal(signal.SIGTERM, signal.SIG_DFL); "
    "print(embedded_dsn(Path(sys.argv[1])), flush=True); time.sleep(600)"
)


@pytest.fixture(scope="module")
def data() -> Iterator[Path]:
    """One data folder for the module's lifecycle cases (initdb once), stopped between them
    (outside pytest's temporary directories: see the fixture server_dir)."""
    directory = Path(tempfile.mkdtemp(prefix="synclane-test-embedded-"))
    folder = directory / "pg"
    embedded_dsn(folder)
    stop(folder)
    yield folder
    remove_unless_running(directory)


def _running(folder: Path) -> bool:
    pid_file = folder / "postmaster.pid"
    try:
        os.kill(int(pid_file.read_text().split("\n", 1)[0]), 0)
    except (OSError, ValueError):
        return False
    return True


def _users(folder: Path) -> list[int]:
    listed = folder / ".handle_pids.json"
    return list(json.loads(listed.read_text() or "[]")) if listed.exists() else []


def _stopped_within(folder: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _running(folder):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _user(folder: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-c", USER, str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


def _cli(*words: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "synclane.cli", *words],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=HERE,
    )


def _embedded_env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCLANE_")}
    env["SYNCLANE_DATA_DIR"] = str(folder)
    return env


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSEGV", "SIGTERM", "SIGHUP"])
def test_the_server_stops_when_its_only_user_dies_of_a_signal(data: Path, how: str) -> None:
    """Neither SIGKILL nor a crash runs exit handlers, and a Python with no handler for
    SIGTERM or SIGHUP dies the same way: the watchdog stops the server all the same, and the
    dead pid leaves the list of users (where it kept every later process from stopping it)."""
    process, _ = _user(data)
    assert _running(data)
    process.send_signal(getattr(signal, how))
    process.wait(10)
    assert _stopped_within(data, 10), f"the server still runs after its user got {how}"
    assert _users(data) == []


def test_two_processes_share_one_data_folder_and_the_last_to_go_stops_it(data: Path) -> None:
    first, dsn = _user(data)
    second, same = _user(data)
    try:
        assert same == dsn
        first.kill()
        first.wait(10)
        time.sleep(1.0)  # the first one's watchdog has had its look
        assert _running(data), "the server stopped under its second user"
        with psycopg.connect(same, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert _users(data) == [second.pid]
    finally:
        second.terminate()
        second.wait(10)
    assert _stopped_within(data, 10)
    assert _users(data) == []


def test_letting_go_stops_the_server_at_once_and_its_watchdog_with_it(data: Path) -> None:
    """stop() tells its watchdog that this process let go and lives on: the watchdog waited
    for the process to end, 5 s at every stop (each test session pays it, and the tests that
    start servers of their own)."""
    embedded_dsn(data)
    started = time.monotonic()
    stop(data)
    took = time.monotonic() - started
    assert not _running(data)
    assert _users(data) == []
    assert took < 3, f"stop() took {took:.1f} s"


@pytest.mark.parametrize(
    ("command", "how"),
    [("dashboard", "SIGTERM"), ("dashboard", "SIGHUP"), ("work", "SIGHUP")],
)
def test_a_long_running_command_stops_the_server_on_sigterm_and_sighup(
    server_dir: Path, command: str, how: str
) -> None:
    """As `demo` and `work` do on SIGTERM: the command cleans up, exits 0 and stops the server
    (`dashboard` died at once with 143 and left it running, its pid in the list)."""
    env = _embedded_env(server_dir)
    app = ["--app", "synclane.demo.app:app"]
    migrate = _cli(*app, "migrate", env=env)
    assert migrate.wait(120) == 0, migrate.communicate()[1]
    folder = server_dir / "pgdata"
    assert not _running(folder)
    words = [*app, "dashboard", "--port", "0"] if command == "dashboard" else [*app, "work"]
    process = _cli(*words, env=env)
    try:
        _wait_for_server(folder)
        time.sleep(1.5 if command == "dashboard" else 3.0)  # serving, or working
        process.send_signal(getattr(signal, how))
        err = process.communicate(timeout=60)[1]
    finally:
        process.kill()
    assert process.returncode == 0, err[-2000:]
    assert _stopped_within(folder, 10), f"{command} left the server running after {how}"
    assert _users(folder) == []


def _wait_for_server(folder: Path) -> None:
    deadline = time.monotonic() + 60
    while not _running(folder):
        assert time.monotonic() < deadline, "the embedded server did not start"
        time.sleep(0.1)


def test_a_failed_start_is_the_database_s_failure_not_the_app_module_s(server_dir: Path) -> None:
    """A postmaster.pid read half-written (here: left so by a process that died while writing
    it) made the wheel raise AssertionError while the app module was imported, which read as
    "the app module 'example' raised AssertionError"."""
    env = _embedded_env(server_dir)
    folder = server_dir / "pgdata"
    embedded_dsn(folder)
    stop(folder)
    (folder / "postmaster.pid").write_text(f"{os.getpid()}\n{folder}\n")  # a live pid, 2 lines
    done = subprocess.run(
        [sys.executable, "-m", "synclane.cli", "--app", "synclane.demo.app:app", "jobs"],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE,
        timeout=120,
    )
    (folder / "postmaster.pid").unlink()  # this process's pid: the folder is free again
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"synclane: error: the embedded PostgreSQL did not start in {folder}"
    )
    assert f"its log: {folder / 'log'}" in lines[0]
    assert "app module" not in lines[0]


def test_a_crash_of_the_embedded_server_is_one_line_naming_it_and_its_log(server_dir: Path) -> None:
    """A worker on the embedded server whose backend dies of SIGSEGV says, once, that the
    embedded PostgreSQL crashed, what its log says and where the log is."""
    env = _embedded_env(server_dir)
    env["SYNCLANE_CLI_TEST_SCHEMA"] = "crash"
    folder = server_dir / "pgdata"
    app = ["--app", "cli_app:app"]
    process = _cli(*app, "work", "--for", "8", env=env)
    try:
        _wait_for_server(folder)
        time.sleep(3.0)  # the worker is connected and polling
        dsn = f"postgresql://postgres:@/postgres?host={folder}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            victims = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'synclane-worker'"
            ).fetchall()
        assert victims, "no worker connection to crash"
        os.kill(victims[0][0], signal.SIGSEGV)
        err = process.communicate(timeout=60)[1]
    finally:
        process.kill()
    said = [line for line in err.splitlines() if "crashed" in line]
    assert said, err[-3000:]
    assert "the embedded PostgreSQL crashed" in said[0]
    assert "was terminated by signal 11" in said[0]
    assert f"its log: {folder / 'log'}" in said[0]


def test_pgserver_s_16_data_is_refused_with_the_command_that_moves_it(server_dir: Path) -> None:
    """A data folder of the PostgreSQL 16 synclane used before (pgserver's) is refused in one
    line naming `python -m synclane.embedded upgrade`; that command moves the data to 18 and
    keeps the old folder beside it."""
    folder = server_dir / "pgdata"
    old = (
        "import sys, pgserver, psycopg; s = pgserver.get_server(sys.argv[1]); "
        "c = psycopg.connect(s.get_uri(), autocommit=True); "
        "c.execute('CREATE TABLE kept (n int)'); c.execute('INSERT INTO kept VALUES (42)')"
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", old, str(folder)], check=True)
    assert (folder / "PG_VERSION").read_text().strip() == "16"
    refused = subprocess.run(
        [sys.executable, "-m", "synclane.cli", "--app", "synclane.demo.app:app", "jobs"],
        capture_output=True,
        text=True,
        env=_embedded_env(server_dir),
        cwd=HERE,
        timeout=120,
    )
    assert refused.returncode == 2
    line = refused.stderr.strip()
    assert "\n" not in line, line
    assert "PostgreSQL 16 data" in line and "`python -m synclane.embedded upgrade`" in line, line
    moved = subprocess.run(
        [sys.executable, "-m", "synclane.embedded", "upgrade", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert moved.returncode == 0, moved.stderr
    assert (folder / "PG_VERSION").read_text().strip() == "18"
    assert (server_dir / "pgdata-16" / "PG_VERSION").read_text().strip() == "16"
    try:
        with psycopg.connect(embedded_dsn(folder), autocommit=True) as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(42,)]
    finally:
        stop(folder)
