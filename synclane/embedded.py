"""PostgreSQL from the pgserver wheel, for laptops and demos with nothing installed."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_servers: dict[Path, Any] = {}


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


def embedded_dsn(directory: Path | None = None) -> str:
    """Start (or join) the embedded server and return its DSN. It stops when the last process
    that uses it exits; the data stays in the directory for the next run."""
    path = (directory or data_dir()).resolve()
    with _lock:
        server = _servers.get(path)
        if server is None:
            get_server = _import_pgserver()
            path.mkdir(parents=True, exist_ok=True)
            server = get_server(path, cleanup_mode="stop")
            _servers[path] = server
    return str(server.get_uri())


def _import_pgserver() -> Any:
    """pgserver's get_server, imported without platformdirs' RuntimeDirWarning.

    pgserver asks platformdirs for the user's runtime directory when it is imported, to keep a
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
        from pgserver import get_server  # type: ignore[attr-defined]
    return get_server
