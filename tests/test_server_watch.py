"""The test session notices a crashed server: a test during which the test database's server
restarted fails, named, whatever it asserted (synclane.testing_plugin's ServerWatch).

Each case runs a small test file in a pytest of its own, on a server of its own: one started
here for $SYNCLANE_TEST_DSN, or the embedded one the inner session starts. The crash is a
backend killed by a signal, which the postmaster takes as a crash of the whole server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from synclane.embedded import embedded_dsn, stop

INNER = """
import os, signal, time
from pathlib import Path

def test_a_healthy_server_passes(db):
    assert db.execute("SELECT 1").fetchone() == (1,)

def test_a_private_server_of_its_own_restarting_is_no_crash(db):
    import shutil, tempfile
    from synclane.embedded import embedded_dsn, stop
    import psycopg
    own = Path(tempfile.mkdtemp(prefix="synclane-test-own-")) / "own"
    with psycopg.connect(embedded_dsn(own), autocommit=True) as conn:
        conn.execute("SELECT 1")
    stop(own)
    shutil.rmtree(own.parent, ignore_errors=True)

def test_a_backend_killed_by_SIGNAL(db):
    victim = db.execute("SELECT pg_backend_pid()").fetchone()[0]
    os.kill(victim, signal.SIGNAL)
    time.sleep(0.5)  # the test itself asserts nothing that could fail

def test_the_next_test_finds_the_server_back(db):
    assert db.execute("SELECT 1").fetchone() == (1,)
"""


def _inner_run(tmp_path: Path, signal_name: str, env: dict[str, str]) -> str:
    (tmp_path / "test_inner.py").write_text(INNER.replace("SIGNAL", signal_name))
    plain = ["-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts="]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plain, "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "4 passed, 1 error" in output, output[-3000:]
    assert f"ERROR test_inner.py::test_a_backend_killed_by_{signal_name}" in output, output[-3000:]
    assert "restarted during this test" in output, output[-3000:]
    return output


@pytest.mark.processes
def test_a_server_crash_under_a_test_fails_that_test_on_a_server_given_by_dsn(
    tmp_path: Path, server_dir: Path
) -> None:
    """$SYNCLANE_TEST_DSN names the server (here a private one, never the shared one): the test
    that ran when it crashed errors; the tests before and after pass."""
    data = server_dir / "server"
    private = embedded_dsn(data)
    try:
        env = {**os.environ, "SYNCLANE_TEST_DSN": private}
        (tmp_path / "inner").mkdir()
        _inner_run(tmp_path / "inner", "SIGKILL", env)
    finally:
        stop(data)


@pytest.mark.processes
def test_a_crash_of_the_embedded_test_server_quotes_its_log(tmp_path: Path) -> None:
    """Without $SYNCLANE_TEST_DSN the session's embedded server is watched the same way, and
    the error quotes the line of its log that says which process died of which signal."""
    env = {k: v for k, v in os.environ.items() if k != "SYNCLANE_TEST_DSN"}
    output = _inner_run(tmp_path, "SIGSEGV", env)
    assert "was terminated by signal 11" in output, output[-3000:]
    assert "/log says:" in output, output[-3000:]
