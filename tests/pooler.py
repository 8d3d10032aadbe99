"""PgBouncer in transaction mode in front of the test database, for tests/test_pooler.py.

Debian's package (`apt-get install pgbouncer`, which .ci/run does), started by the test on a free
port of 127.0.0.1 with a configuration of its own: `pool_mode = transaction` and fewer server
connections than the test's clients, so that consecutive transactions of one client run on
different server connections, as behind any transaction pooler. PgBouncer refuses to run as
root: as root it runs as the `postgres` user, or as the embedded server's own user.
"""

from __future__ import annotations

import os
import pwd
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
from system_tools import need

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
server_round_robin = 1
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,options,application_name
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _runs_as(host: str) -> str:
    """The user PgBouncer runs as when the test runs as root: the owner of the server's socket
    folder when the server listens on a socket in a folder of its own (the embedded test server,
    whose data folder is 0700 and holds its socket), else `postgres`."""
    folder = Path(host)
    if host.startswith("/") and folder.is_dir() and folder.stat().st_uid != 0:
        return pwd.getpwuid(folder.stat().st_uid).pw_name
    return "postgres"


def _open_every_server_connection(pooled: str, server_connections: int) -> None:
    """Open every server connection of the pool at once (PgBouncer opens them one by one, as
    clients need them): with `server_round_robin`, a client's consecutive transactions then run
    on different server connections, as they do behind a busy pooler."""
    clients = [psycopg.connect(pooled, prepare_threshold=None) for _ in range(server_connections)]
    try:
        for client in clients:
            client.execute("SELECT 1")  # each holds a server connection until its transaction ends
        for client in clients:
            client.commit()  # (a client that leaves mid-transaction takes its server connection)
    finally:
        for client in clients:
            client.close()


@contextmanager
def pgbouncer(dsn: str, server_connections: int = 2) -> Iterator[str]:
    """A DSN through PgBouncer (transaction mode) to the database of `dsn`."""
    need(
        Path(PGBOUNCER).exists(),
        "the pooler tests need PgBouncer: apt-get install pgbouncer (.ci/run installs it)",
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
        user_name = _runs_as(params.get("host") or "")
        shutil.chown(folder, user_name)
        for path in folder.iterdir():
            shutil.chown(path, user_name)
        command = ["runuser", "-u", user_name, "--", *command]
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
        _open_every_server_connection(pooled, server_connections)
        yield pooled
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
