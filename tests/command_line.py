"""The `synclane` command run inside the test process, as the `run` fixture (tests/conftest.py)
gives it to tests: `run("plan")` is `synclane --dsn <test db> --app cli_app:app plan`, and
returns (exit status, stdout, stderr). `app=False` leaves --app out; `dsn=` gives another DSN
(the test database's with a password, say)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
Run = Callable[..., tuple[int, str, str]]


def run_in_process(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Run]:
    """Run `synclane --dsn <test db> --app cli_app:app ...` in this process, on a schema that
    holds the table (`migrate` was run: reads create nothing)."""
    from synclane import SyncLane, cli

    SyncLane(dsn, schema=schema).close()
    monkeypatch.setenv("SYNCLANE_CLI_TEST_SCHEMA", schema)
    # --dsn and --schema reach the app through the environment of this process: restored after
    for name in (
        "SYNCLANE_APP",
        "SYNCLANE_DSN",
        "SYNCLANE_SCHEMA",
        "SYNCLANE_CLI_TEST_RETRY",
        "SYNCLANE_POOLER",
        "SYNCLANE_LISTEN_DSN",
    ):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.syspath_prepend(str(HERE))

    def invoke(*words: str, app: bool = True, dsn: str = dsn) -> tuple[int, str, str]:
        sys.modules.pop("cli_app", None)  # a fresh app (and schema) for every call
        prefix = ["--dsn", dsn] + (["--app", "cli_app:app"] if app else [])
        code = cli.main([*prefix, *words])
        out, err = capsys.readouterr()
        return code, out, err

    yield invoke
    sys.modules.pop("cli_app", None)


def on_a_terminal(
    words: list[str], env: dict[str, str], columns: int = 160, cwd: Path | None = None
) -> tuple[int, str]:
    """`python -m synclane.cli WORDS` on a pseudo-terminal `columns` wide, 40 lines high: its
    exit status and all it wrote there, escape sequences included."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**env, "COLUMNS": str(columns), "LINES": "40", "TERM": "xterm"}
    process = subprocess.Popen(
        [sys.executable, "-m", "synclane.cli", *words],
        stdin=follower, stdout=follower, stderr=follower, env=env, cwd=cwd,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the process closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        code = process.wait(timeout=60)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
    return code, seen.decode("utf-8", "replace")
