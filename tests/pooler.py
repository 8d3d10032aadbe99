"""PgBouncer in transaction mode in front of the test database, for tests/test_pooler.py.

Debian's package (`apt-get install pgbouncer`, which .ci/run does), started by the test on a free
port of 127.0.0.1 with a configuration of its own: `pool_mode = transaction` and fewer server
connections than the test's clients, so that consecutive transactions of one client run on
different server connections, as behind any transaction pooler. PgBouncer refuses to run as
root: as root it runs as the `postgres` user.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

CONFIG = """
[databases]
* = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = transaction
default_pool_size = {server_connections}
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,options,application_name
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def pgbouncer(dsn: str, server_connections: int = 2) -> Iterator[str]:
    """A DSN through PgBouncer (transaction mode) to the database of `dsn`."""
    if not Path(PGBOUNCER).exists():
        raise AssertionError(
            "the pooler tests need PgBouncer: apt-get install pgbouncer (.ci/run installs it)"
        )
    params = conninfo_to_dict(dsn)
    user = params.get("user") or "postgres"
    server = " ".join(
        f"{key}={value}"
        for key, value in params.items()
        if key in ("host", "port", "dbname") and value
    )
    folder = Path(tempfile.mkdtemp(prefix="synclane-pgbouncer-"))
    port = _free_port()
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        CONFIG.format(
            server=server, port=port, folder=folder, server_connections=server_connections
        )
    )
    command = [PGBOUNCER, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses root
        shutil.chown(folder, "postgres")
        for path in folder.iterdir():
            shutil.chown(path, "postgres")
        command = ["runuser", "-u", "postgres", "--", *command]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pooled = make_conninfo(dsn, host="127.0.0.1", port=str(port), user=user)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(pooled, connect_timeout=2, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = (folder / "pgbouncer.log").read_text(errors="replace")[-2000:]
                    raise AssertionError(f"PgBouncer did not start: {log}") from None
                time.sleep(0.1)
        yield pooled
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
