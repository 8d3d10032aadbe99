"""The database synclane keeps its table in: the DSN (checked, and never shown with its
secrets), the shared connection for operations, the schema check, and pools for workers."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from synclane.errors import DatabaseUnavailable, first_line
from synclane.model import ConfigError
from synclane.params import WORKER_ADAPTERS
from synclane.read_only import AsyncReadOnlyAwareCursor, ReadOnlyAwareCursor
from synclane.store import SESSION, WORKER_SESSION, Store, session_sql

log = logging.getLogger("synclane")

# libpq parameters whose values are secrets
_SECRETS = ("password", "sslpassword")
_KEY_VALUE_SECRET = re.compile(r"\b(password|sslpassword)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.I)


def redact(dsn: str) -> str:
    """The DSN without its secrets (password, sslpassword), for messages and reprs. What libpq
    cannot parse is not shown at all: a password may sit anywhere in it."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<a connection string libpq cannot parse>"
    if not any(params.get(key) for key in _SECRETS):
        return dsn
    shown = None
    if "://" in dsn:
        with contextlib.suppress(ValueError):  # urllib refuses some URLs libpq takes
            shown = _redact_url(dsn)
    else:
        shown = _KEY_VALUE_SECRET.sub(r"\1=***", dsn)
    if shown is not None and _hides_secrets(shown):
        return shown
    # a secret where the rewrite does not reach (a percent-encoded key): rebuild it from libpq's
    return make_conninfo("", **{k: ("***" if k in _SECRETS else v) for k, v in params.items()})


def _redact_url(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is not None:
        userinfo, _, hostinfo = parts.netloc.rpartition("@")
        parts = parts._replace(netloc=f"{userinfo.split(':', 1)[0]}:***@{hostinfo}")
    query = "&".join(
        f"{item.split('=', 1)[0]}=***" if item.split("=", 1)[0].lower() in _SECRETS else item
        for item in parts.query.split("&")
    )
    return urlunsplit(parts._replace(query=query))


def _hides_secrets(shown: str) -> bool:
    try:
        params = conninfo_to_dict(shown)
    except psycopg.ProgrammingError:
        return False
    return all(params.get(key) in (None, "***") for key in _SECRETS)


def secrets_of(dsn: str) -> list[str]:
    """The secret values a DSN holds (password, sslpassword), for hiding them in any text."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return []
    return [value for key in _SECRETS if isinstance(value := params.get(key), str) and value]


def check_dsn(dsn: str) -> None:
    """Refuse what libpq cannot parse now, with a message that quotes none of it (a password
    may sit anywhere in a broken string)."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as error:
        first = first_line(error, default="unreadable")
        # libpq quotes pieces of the string; keep only one-character ones such as "="
        reason = re.sub(r'"([^"]*)"', lambda m: m[0] if len(m[1]) <= 1 else '"…"', first)
        raise ConfigError(
            f"dsn is not a PostgreSQL connection string ({reason}); use "
            "'postgresql://user:password@host:5432/dbname' or 'host=... dbname=...', "
            "or None for the embedded PostgreSQL"
        ) from None


# Inside `reading_only()`: an app built with create_schema=True creates nothing; its schema is
# checked at its first use instead. The commands that only read (and the page) load the app's
# module this way, so that a mistyped --schema is said, never created (synclane.cli).
_READING_ONLY: ContextVar[bool] = ContextVar("synclane_reading_only", default=False)


@contextmanager
def reading_only() -> Iterator[None]:
    """While this runs, SyncLane(create_schema=True) and the demo create no schema or table."""
    token = _READING_ONLY.set(True)
    try:
        yield
    finally:
        _READING_ONLY.reset(token)


def creating_allowed() -> bool:
    """False inside reading_only()."""
    return not _READING_ONLY.get()


POOLERS = ("transaction",)
# How long a statement whose answer was lost waits before each new connection it is sent again on.
RECONNECT_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)


def lost_connection(error: psycopg.OperationalError) -> bool:
    """Whether the connection went away under a statement (no answer, a connection exception,
    or the server shutting down): what it did may have committed. An error the server answered
    with (a statement timeout, a lock not available, a serialization failure) rolled the
    statement back: nothing was written."""
    state = error.sqlstate
    return state is None or state.startswith(("08", "57P"))


def check_pooler(pooler: object) -> str | None:
    """None (a direct connection, or a session pooler) or "transaction"; $SYNCLANE_POOLER when
    not given."""
    if pooler is None:
        pooler = os.environ.get("SYNCLANE_POOLER") or None
        where = "SYNCLANE_POOLER"
    else:
        where = "pooler"
    if pooler is None:
        return None
    if isinstance(pooler, str) and pooler in POOLERS:
        return pooler
    raise ConfigError(
        f"{where}={pooler!r:.100} is not a pooler synclane knows: use 'transaction' when the DSN "
        "goes through a transaction pooler (PgBouncer in transaction mode, a managed pooler), or "
        "leave it unset for a direct connection or a session pooler"
    )


class Database:
    """The database and schema of one app. `dsn=None` means $SYNCLANE_DSN when it is set, else
    the embedded PostgreSQL. `pooler="transaction"`: the DSN goes through a transaction pooler,
    so nothing is prepared on the server and no session setting is relied on; `listen_dsn`, a
    direct connection for LISTEN (else $SYNCLANE_LISTEN_DSN; without one a pooled app polls)."""

    def __init__(
        self,
        dsn: str | None,
        schema: str,
        pooler: str | None = None,
        listen_dsn: str | None = None,
    ) -> None:
        if dsn is not None and (not isinstance(dsn, str) or not dsn.strip()):
            raise ConfigError("dsn must be a PostgreSQL connection string, or None for embedded")
        self.store = Store(schema)
        self.schema = self.store.schema
        self.pooler = check_pooler(pooler)
        if listen_dsn is None:
            listen_dsn = os.environ.get("SYNCLANE_LISTEN_DSN") or None
        if listen_dsn is not None:
            if not isinstance(listen_dsn, str) or not listen_dsn.strip():
                raise ConfigError("listen_dsn must be a PostgreSQL connection string, or None")
            check_dsn(listen_dsn)
        self.listen_dsn = listen_dsn
        if dsn is None:
            dsn = os.environ.get("SYNCLANE_DSN") or None
        if dsn is not None:
            check_dsn(dsn)
        self.embedded = dsn is None
        if dsn is None:
            from synclane.embedded import embedded_dsn

            dsn = embedded_dsn()
        self.dsn: str = dsn
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.RLock()
        # With create_schema=False the schema is checked at the first operation instead, so
        # that `SyncLane(..., create_schema=False).migrate()` works on an empty database.
        self._schema_checked = False
        self._said_isolation = False

    @property
    def where(self) -> str:
        """The database for a message: never its password."""
        return "the embedded PostgreSQL" if self.embedded else redact(self.dsn)

    @property
    def pooled(self) -> bool:
        """Whether the DSN goes through a transaction pooler: a session is not this app's."""
        return self.pooler == "transaction"

    @property
    def prepare(self) -> bool | None:
        """What worker statements pass as psycopg's `prepare`: True (prepared at their first
        execution) on a session of their own, None (never) through a transaction pooler, where
        the next transaction may run on another server connection."""
        return None if self.pooled else True

    @property
    def connection_options(self) -> dict[str, Any]:
        """psycopg connection options for this database's connections: through a transaction
        pooler, nothing prepared on the server (psycopg prepares a statement it sees five times
        otherwise). UTF-8 whatever the role's client_encoding: synclane's statements and the
        names it stores are UTF-8 (a libpq setting, so it holds through a pooler too)."""
        unprepared = {"prepare_threshold": None} if self.pooled else {}
        return {"client_encoding": "UTF8", **unprepared}

    @property
    def listening(self) -> str | None:
        """The DSN to LISTEN on: the listen_dsn, else the DSN unless it goes through a transaction
        pooler (a LISTEN there hears nothing). None: poll."""
        if self.listen_dsn is not None:
            return self.listen_dsn
        return None if self.pooled else self.dsn

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection with the session settings synclane's statements rely on
        (store.SESSION: READ COMMITTED, ISO times, UTC), whatever the role's defaults; through a
        transaction pooler they are left to the role (docs/scaling.md)."""
        try:
            conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=10,
                application_name="synclane",
                cursor_factory=ReadOnlyAwareCursor,
                **self.connection_options,
            )
        except psycopg.OperationalError as error:
            raise DatabaseUnavailable(
                f"cannot connect to {self.where}: {first_line(error, default='no answer')}. Check "
                "the DSN and that PostgreSQL runs."
            ) from None
        if not self.pooled:
            conn.execute(session_sql(SESSION))
        else:
            try:
                self._check_role_settings(conn)
            except ConfigError:
                conn.close()
                raise
        return conn

    def _check_role_settings(self, conn: psycopg.Connection[Any]) -> None:
        """Through a transaction pooler the role's settings stand (synclane sets nothing per
        session): times and durations in styles psycopg cannot read are refused with the fix,
        a stricter isolation than READ COMMITTED is said once (it works, more slowly)."""
        row = conn.execute(
            "SELECT current_user, current_setting('DateStyle'), current_setting('IntervalStyle'), "
            "current_setting('default_transaction_isolation')"
        ).fetchone()
        assert row is not None
        role, date_style, interval_style, isolation = row
        quoted = sql.Identifier(role).as_string(conn)
        fixes = []
        if not date_style.startswith("ISO"):
            fixes.append(("DateStyle", date_style, "'ISO, MDY'"))
        if interval_style != "postgres":
            fixes.append(("IntervalStyle", interval_style, "'postgres'"))
        if fixes:
            raise ConfigError(
                "through a transaction pooler synclane sets nothing per session, and the role "
                f"{role!r} has "
                + " and ".join(f"{name} {value!r}" for name, value, _ in fixes)
                + ", which psycopg cannot read times in; run "
                + " ".join(f"ALTER ROLE {quoted} SET {name} = {fix};" for name, _, fix in fixes)
                + " (docs/scaling.md), then start again"
            )
        if isolation != "read committed" and not self._said_isolation:
            self._said_isolation = True
            log.warning(
                "through a transaction pooler synclane sets nothing per session, and the role "
                "%r runs %s by default: workers that meet on a row get serialization errors and "
                "send their statements again. ALTER ROLE %s SET default_transaction_isolation = "
                "'read committed'; gives synclane's statements the isolation they were written "
                "for (docs/scaling.md)",
                role,
                isolation,
                quoted,
            )

    @contextmanager
    def connection(self, *, check_schema: bool = True) -> Iterator[psycopg.Connection[Any]]:
        """The shared connection for operations, reopened when it broke. Its first use checks
        that the schema exists and was not made by a newer synclane."""
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                conn = self._conn = self.connect()
                # Closed when the database object is collected or the interpreter exits.
                weakref.finalize(self, conn.close)
            try:
                if check_schema and not self._schema_checked:
                    self.store.check_version(self._conn)
                    self._schema_checked = True
                yield self._conn
            except psycopg.OperationalError:
                self._conn.close()
                self._conn = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def migrate(self) -> int:
        """Create or upgrade the schema (idempotent; safe when several processes run it)."""
        with self.connection(check_schema=False) as conn:
            version = self.store.migrate(conn)
        self._schema_checked = True
        return version

    def check_schema(self) -> None:
        """Raise SchemaError unless the schema exists at the version this synclane knows."""
        with self.connection():
            pass

    def worker_pool(self, size: int, *, wait: float) -> AsyncConnectionPool[Any]:
        """A pool of autocommit connections set up for worker statements (not opened yet).
        `wait`: how long a caller waits for a connection before the pool gives up."""
        return AsyncConnectionPool(
            self.dsn,
            min_size=1,
            max_size=size,
            kwargs={
                "autocommit": True,
                "application_name": "synclane-worker",
                "context": WORKER_ADAPTERS,
                "cursor_factory": AsyncReadOnlyAwareCursor,
                **self.connection_options,
            },
            # through a transaction pooler a session setting would reach whoever gets the
            # server connection next, and miss the worker's next transaction
            configure=None if self.pooled else _configure_worker,
            open=False,
            name="synclane",
            timeout=wait,
        )


async def _configure_worker(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(session_sql(WORKER_SESSION))
