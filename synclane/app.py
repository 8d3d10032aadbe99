"""SyncLane, its queues and the operations on jobs."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import re
import socket
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from synclane import planning
from synclane.events import Listener
from synclane.model import (
    ConfigError,
    Job,
    JobType,
    Owner,
    Page,
    QueueSettings,
    SnapshotType,
    WindowedType,
    check_aware,
    check_name,
    check_slices,
    to_duration,
    unstorable,
)
from synclane.store import Store

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("synclane")

Handler = Callable[[Job], Page] | Callable[[Job], Awaitable[Page]]
OwnerSource = (
    Callable[[str], Iterable[Owner | str]] | Callable[[str], Awaitable[Iterable[Owner | str]]]
)
H = TypeVar("H", bound=Callable[..., Any])

REQUEUE_STATUSES = ("failed", "deferred", "abandoned")


class DatabaseUnavailable(ConnectionError):
    """PostgreSQL could not be reached. The message never contains the password."""


class OwnerSourceError(RuntimeError):
    """A queue's owner source raised, did not answer within `owners_timeout`, or returned
    something that is not a list of owners. The queue was not planned; `added` holds what the
    other queues of the same `plan()` call added."""

    def __init__(self, message: str, added: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.added = added or {}


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


def check_dsn(dsn: str) -> None:
    """Refuse what libpq cannot parse now, with a message that quotes none of it (a password
    may sit anywhere in a broken string)."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as error:
        first = str(error).splitlines()[0] if str(error) else "unreadable"
        # libpq quotes pieces of the string; keep only one-character ones such as "="
        reason = re.sub(r'"([^"]*)"', lambda m: m[0] if len(m[1]) <= 1 else '"…"', first)
        raise ConfigError(
            f"dsn is not a PostgreSQL connection string ({reason}); use "
            "'postgresql://user:password@host:5432/dbname' or 'host=... dbname=...', "
            "or None for the embedded PostgreSQL"
        ) from None


class Queue:
    """A named group of job types with one worker configuration."""

    def __init__(self, name: str, settings: QueueSettings) -> None:
        self.name = name
        self.settings = settings
        self.types: dict[str, JobType] = {}
        self.handlers: dict[str, Handler] = {}
        self.owner_source: OwnerSource | None = None

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, types={list(self.types)})"

    def owners(self, source: H) -> H:
        """Decorate the function that says who is connected: `source(queue_name) -> [Owner]`."""
        if not callable(source):
            raise ConfigError(f"queue {self.name!r}: @owners needs a function, got {source!r}")
        self.owner_source = source
        return source

    def snapshot(self, name: str, *, every: timedelta | float) -> Callable[[H], H]:
        """Declare a type without a window: one initial job, then one per period."""
        return self._declare(SnapshotType(name, every=every, priority=len(self.types)))  # type: ignore[arg-type]

    def windowed(
        self,
        name: str,
        *,
        horizon: timedelta | float,
        slice: timedelta | float,
        every: timedelta | float,
        overlap: timedelta | float = timedelta(0),
    ) -> Callable[[H], H]:
        """Declare a type whose history is cut into slices back to `horizon`."""
        job_type = WindowedType(
            name,
            horizon=horizon,  # type: ignore[arg-type]
            slice=slice,  # type: ignore[arg-type]
            every=every,  # type: ignore[arg-type]
            overlap=overlap,  # type: ignore[arg-type]
            priority=len(self.types),
        )
        return self._declare(job_type)

    def _declare(self, job_type: JobType) -> Callable[[H], H]:
        if job_type.name in self.types:
            raise ConfigError(
                f"queue {self.name!r} declares type {job_type.name!r} twice; give each type "
                "its own name"
            )
        self.types[job_type.name] = job_type

        def register(handler: H) -> H:
            if not callable(handler):
                raise ConfigError(
                    f"{self.name}.{job_type.name}: the handler must be a function, got {handler!r}"
                )
            self.handlers[job_type.name] = handler
            return handler

        return register

    def job_type(self, name: str) -> JobType:
        try:
            return self.types[name]
        except KeyError:
            known = ", ".join(repr(t) for t in self.types) or "none yet"
            raise ConfigError(
                f"queue {self.name!r} has no type {name!r} (declared: {known}); declare it with "
                f"@{self.name}.snapshot(...) or @{self.name}.windowed(...)"
            ) from None


class SyncLane:
    """The application: a database, a schema, and the queues declared on it.

    `dsn=None` means $SYNCLANE_DSN when it is set, else the embedded PostgreSQL."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "synclane",
        create_schema: bool = True,
        poll_interval: timedelta | float = timedelta(seconds=5),
        plan_interval: timedelta | float = timedelta(minutes=1),
        worker_name: str | None = None,
        owners_timeout: timedelta | float = timedelta(minutes=1),
    ) -> None:
        if dsn is not None and (not isinstance(dsn, str) or not dsn.strip()):
            raise ConfigError("dsn must be a PostgreSQL connection string, or None for embedded")
        if not isinstance(create_schema, bool):
            raise ConfigError(
                f"create_schema must be True or False, got {type(create_schema).__name__} "
                f"{create_schema!r:.100}"
            )
        self.store = Store(schema)
        self.schema = self.store.schema
        self.poll_interval = to_duration("poll_interval", poll_interval)
        self.plan_interval = to_duration("plan_interval", plan_interval)
        self.owners_timeout = to_duration("owners_timeout", owners_timeout)
        self.worker_name = check_name(
            "worker_name", worker_name or f"{socket.gethostname()}:{os.getpid()}"
        )
        self.queues: dict[str, Queue] = {}
        if dsn is None:
            dsn = os.environ.get("SYNCLANE_DSN") or None
        if dsn is not None:
            check_dsn(dsn)
        self._embedded = dsn is None
        if dsn is None:
            from synclane.embedded import embedded_dsn

            dsn = embedded_dsn()
        self._dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None
        self._conn_lock = threading.RLock()
        # With create_schema=False the schema is checked at the first operation instead, so
        # that `SyncLane(..., create_schema=False).migrate()` works on an empty database.
        self._schema_checked = False
        if create_schema:
            self.migrate()

    def __repr__(self) -> str:
        where = "embedded" if self._embedded else redact(self._dsn)
        return f"SyncLane({where!r}, schema={self.schema!r}, queues={list(self.queues)})"

    @property
    def dsn(self) -> str:
        return self._dsn

    @property
    def embedded(self) -> bool:
        """Whether this app runs on the embedded PostgreSQL."""
        return self._embedded

    # -- configuration --------------------------------------------------------------------

    def queue(
        self,
        name: str,
        *,
        concurrency: int = 1,
        max_attempts: int = 5,
        lease_duration: timedelta | float = timedelta(minutes=5),
        retry_base_delay: timedelta | float = timedelta(minutes=1),
        retry_max_delay: timedelta | float = timedelta(hours=1),
        throttle_base_delay: timedelta | float = timedelta(minutes=5),
        throttle_max_delay: timedelta | float = timedelta(minutes=30),
    ) -> Queue:
        """Declare a queue: its types and handlers are declared on the object returned."""
        check_name("queue name", name)
        if name in self.queues:
            raise ConfigError(f"queue {name!r} is declared twice; declare it once and reuse it")
        try:
            settings = QueueSettings(
                concurrency=concurrency,
                max_attempts=max_attempts,
                lease_duration=lease_duration,  # type: ignore[arg-type]
                retry_base_delay=retry_base_delay,  # type: ignore[arg-type]
                retry_max_delay=retry_max_delay,  # type: ignore[arg-type]
                throttle_base_delay=throttle_base_delay,  # type: ignore[arg-type]
                throttle_max_delay=throttle_max_delay,  # type: ignore[arg-type]
            )
        except ConfigError as error:
            raise ConfigError(f"queue {name!r}: {error}") from None
        queue = Queue(name, settings)
        self.queues[name] = queue
        return queue

    def get_queue(self, name: str) -> Queue:
        try:
            return self.queues[name]
        except KeyError:
            known = ", ".join(repr(q) for q in self.queues) or "none"
            raise ConfigError(
                f"unknown queue {name!r} (declared: {known}); declare it with app.queue({name!r})"
            ) from None

    # -- database -------------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection on the database clock's time zone, UTC."""
        try:
            conn = psycopg.connect(
                self._dsn, autocommit=True, connect_timeout=10, application_name="synclane"
            )
        except psycopg.OperationalError as error:
            where = "the embedded PostgreSQL" if self._embedded else redact(self._dsn)
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            reason = lines[0] if lines else "no answer"
            raise DatabaseUnavailable(
                f"cannot connect to {where}: {reason}. Check the DSN and that PostgreSQL runs."
            ) from None
        conn.execute("SET TIME ZONE 'UTC'")
        return conn

    @contextmanager
    def connection(self, *, check_schema: bool = True) -> Iterator[psycopg.Connection[Any]]:
        """The app's shared connection for operations, reopened when it broke. The first use
        checks that the schema exists and was not made by a newer synclane."""
        with self._conn_lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = self.connect()
                # Closed when the app is collected or the interpreter exits, without a warning.
                weakref.finalize(self, self._conn.close)
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
        with self._conn_lock:
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

    # -- planning -------------------------------------------------------------------------

    def plan(
        self,
        queue: str | None = None,
        owner: Owner | str | None = None,
        horizon: timedelta | float | None = None,
        type: str | None = None,
    ) -> dict[str, int]:
        """Insert the jobs that should exist and do not; returns how many per queue.

        `owner` plans one owner now (an Owner is used as given; a str is looked up in the
        owner source). `horizon` widens the history of windowed types for this call only (a
        backfill); `type` limits the call to one type."""
        if owner is not None and queue is None:
            raise ConfigError("plan(owner=...) needs the queue too: app.plan('shops', owner)")
        wider = None if horizon is None else to_duration("horizon", horizon)
        names = [self.get_queue(queue).name] if queue is not None else list(self.queues)
        if wider is not None:
            for name in names:
                for job_type in self.queues[name].types.values():
                    if isinstance(job_type, WindowedType) and type in (None, job_type.name):
                        check_slices(f"{name}.{job_type.name}", wider, job_type.slice)
        added: dict[str, int] = {}
        failed: list[OwnerSourceError] = []
        for name in names:
            try:
                added[name] = self._plan_queue(self.queues[name], owner, wider, type)
            except OwnerSourceError as error:
                if queue is not None:
                    raise
                # One queue's broken owner source must not keep the others from being planned.
                log.error("%s", error)
                failed.append(error)
        if failed:
            raise OwnerSourceError(
                "; ".join(str(error) for error in failed) + f" (planned: {added})", added
            )
        return added

    async def plan_async(
        self,
        queue: str | None = None,
        owner: Owner | str | None = None,
        horizon: timedelta | float | None = None,
        type: str | None = None,
    ) -> dict[str, int]:
        return await asyncio.to_thread(self.plan, queue, owner, horizon, type)

    def _plan_queue(
        self, queue: Queue, owner: Owner | str | None, horizon: timedelta | None, type: str | None
    ) -> int:
        types = [queue.job_type(type)] if type is not None else list(queue.types.values())
        if not types:
            return 0
        owners = self._owners_to_plan(queue, owner)
        for attempt in range(1, 11):
            try:
                return self._plan_owners(queue, owners, types, horizon)
            except psycopg.errors.SerializationFailure:
                # Another planner wrote what we read in the same instant; read again.
                if attempt == 10:
                    raise
        raise AssertionError("unreachable")

    def _plan_owners(
        self,
        queue: Queue,
        owners: list[Owner],
        types: list[JobType],
        horizon: timedelta | None,
    ) -> int:
        # One read and one insert in a serializable transaction: planners that run at the same
        # instant are kept apart by the dedup index, and planners whose read and insert straddle
        # a period edge or midnight (so that their keys differ) by PostgreSQL's serializable
        # isolation, which makes one of them read again.
        with self.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            now, rows = self.store.plan_read(
                conn,
                queue.name,
                [o.id for o in owners],
                [(t.name, isinstance(t, WindowedType)) for t in types],
            )
            by_id = {o.id: o for o in owners}
            missing: list[planning.NewJob] = []
            for row in rows:
                existing = planning.Existing(
                    oldest_initial_start=row["oldest_initial_start"],
                    coverage_end=row["coverage_end"],
                    coverage_mode=row["coverage_mode"],
                    initial_created_at=row["initial_created_at"],
                    last_created_at=row["last_created_at"],
                    open_recurring=row["open_recurring"],
                    open_any=row["open_any"],
                )
                job_type = queue.types[row["type"]]
                missing += planning.missing_jobs(
                    job_type, by_id[row["owner"]], existing, now, horizon
                )
            added = self.store.insert_jobs(conn, queue.name, missing)
        if added:
            log.info(
                "planned %d new job(s) in queue %s for %d owner(s)", added, queue.name, len(owners)
            )
        return added

    def _owners_to_plan(self, queue: Queue, owner: Owner | str | None) -> list[Owner]:
        if isinstance(owner, Owner):
            return [owner]
        if owner is not None:
            check_name("owner", owner)
        connected = self.connected_owners(queue.name)
        if owner is None:
            return connected
        # An owner that is not connected (any more) gets nothing planned.
        return [o for o in connected if o.id == owner]

    def connected_owners(self, queue: str) -> list[Owner]:
        """Ask the queue's owner source who is connected now."""
        q = self.get_queue(queue)
        if q.owner_source is None:
            raise ConfigError(
                f"queue {q.name!r} has no owner source, so the planner cannot know who is "
                f"connected: decorate a function with @{q.name}.owners"
            )
        source = getattr(q.owner_source, "__qualname__", None) or repr(q.owner_source)
        timeout = self.owners_timeout
        try:
            result = _call_owner_source(q.owner_source, q.name, timeout.total_seconds())
        except _NotOwners as error:
            raise OwnerSourceError(
                f"queue {q.name!r}: the owner source {source} {error}; planning of this queue "
                "was skipped"
            ) from None
        except TimeoutError:
            raise OwnerSourceError(
                f"queue {q.name!r}: the owner source {source} did not answer within "
                f"owners_timeout={timeout}; planning of this queue was skipped. Make it answer "
                "sooner (a timeout on its own requests) or raise SyncLane(owners_timeout=...)"
            ) from None
        except BaseException as error:
            raise OwnerSourceError(
                f"queue {q.name!r}: the owner source {source} raised "
                f"{type(error).__name__}: {_text_of(error)}; planning of this queue was skipped"
            ) from error
        owners: dict[str, Owner] = {}
        refused: list[str] = []
        for item in result:
            if isinstance(item, str):
                try:
                    item = Owner(item)
                except ConfigError as error:
                    # One account with an unstorable id must not stop the others.
                    refused.append(str(error))
                    continue
            if not isinstance(item, Owner):
                raise OwnerSourceError(
                    f"queue {q.name!r}: the owner source {source} returned {item!r:.200} among "
                    "its owners; return Owner(...) objects or owner id strings"
                )
            owners.setdefault(item.id, item)
        if refused:
            log.error(
                "queue %s: the owner source %s returned %d owner id(s) that cannot be stored, "
                "left out of planning: %s",
                q.name,
                source,
                len(refused),
                refused[0],
            )
        return list(owners.values())

    # -- operations -----------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        owner: str,
        type: str,
        lane: str | None = None,
        window_start: datetime | None = None,
        window_end: datetime | None = None,
        dedup_key: str | None = None,
    ) -> int:
        """Add one job by hand (mode 'manual') and return its id. With a dedup_key a second call
        returns the first job's id instead of adding another."""
        q = self.get_queue(queue)
        job_type = q.job_type(type)
        check_name("owner", owner)
        if lane is not None:
            check_name("lane", lane)
        check_aware("window_start", window_start)
        check_aware("window_end", window_end)
        if window_start is not None and window_end is not None and window_start >= window_end:
            raise ConfigError(f"window_start={window_start} must be before window_end={window_end}")
        if dedup_key is not None:
            check_name("dedup_key", dedup_key)
            if dedup_key.startswith(("initial", "recurring:")):
                raise ConfigError(
                    f"dedup_key {dedup_key!r}: keys starting with 'initial' or 'recurring:' "
                    "belong to the planner; choose another prefix, e.g. 'manual:...'"
                )
        with self.connection() as conn:
            if lane is None:
                lane = self._lane_of(q, owner, conn)
            job_id, _ = self.store.enqueue(
                conn,
                {
                    "queue": q.name,
                    "owner": owner,
                    "lane": lane,
                    "type": job_type.name,
                    "priority": job_type.priority,
                    "window_start": window_start,
                    "window_end": window_end,
                    "dedup_key": dedup_key,
                },
            )
        return job_id

    def _lane_of(self, queue: Queue, owner: str, conn: psycopg.Connection[Any]) -> str:
        """An owner's lane: the owner source's word, else its newest job's, else its id."""
        if queue.owner_source is not None:
            for candidate in self.connected_owners(queue.name):
                if candidate.id == owner:
                    return candidate.lane_key
        return self.store.owner_lane(conn, queue.name, owner) or owner

    def requeue(
        self,
        queue: str,
        owner: str | None = None,
        type: str | None = None,
        *,
        ids: Sequence[int] | None = None,
        include_cancelled: bool = False,
        cause: str | None = None,
        cause_id: str | None = None,
    ) -> int:
        """Give failed, deferred and abandoned jobs fresh attempts (cancelled ones too when
        asked). Cursors are kept, so each continues from its last saved page. `cause` or
        `cause_id` (the columns of a row of `failures()`) requeue the jobs whose error has that
        cause. Returns how many."""
        q = self.get_queue(queue)
        if type is not None:
            q.job_type(type)
        if owner is not None:
            check_name("owner", owner)
        job_ids = None if ids is None else _job_ids(ids)
        if cause is not None and (not isinstance(cause, str) or unstorable(cause)):
            raise ConfigError(
                f"cause={cause!r:.100} must be text as a row of failures() shows it, e.g. "
                "'RuntimeError: order <n> not found'"
            )
        if cause_id is not None and (
            not isinstance(cause_id, str) or not re.fullmatch(r"[0-9a-f]{8}", cause_id)
        ):
            raise ConfigError(
                f"cause_id={cause_id!r:.100} must be the 8 hex digits that failures() shows in "
                "its cause_id column, e.g. '3f2a9c1b'"
            )
        statuses = REQUEUE_STATUSES + (("cancelled",) if include_cancelled else ())
        with self.connection() as conn:
            requeued = self.store.requeue(
                conn, q.name, owner, type, statuses, job_ids, cause, cause_id
            )
        if requeued:
            log.info("requeued %d job(s) in queue %s", len(requeued), q.name)
        return len(requeued)

    def cancel(self, queue: str, owner: str, reason: str, type: str | None = None) -> int:
        """Cancel what has not finished for an owner (an account disconnected). A running job's
        worker learns it at its next page save or heartbeat and stops. Returns how many."""
        q = self.get_queue(queue)
        check_name("owner", owner)
        if type is not None:
            q.job_type(type)
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("cancel needs a reason, e.g. cancel('shops', owner, 'disconnected')")
        # Free text: kept as given, less what PostgreSQL text cannot hold.
        error = f"Cancelled: {reason}".replace("\x00", "")
        error = error.encode("utf-8", "backslashreplace").decode("utf-8")
        with self.connection() as conn:
            cancelled = self.store.cancel(conn, q.name, owner, type, error[:2000])
        if cancelled:
            log.info(
                "cancelled %d job(s) of %s in queue %s: %s", len(cancelled), owner, q.name, reason
            )
        return len(cancelled)

    # -- the notebook SDK (synclane.sdk; columns in docs/sdk.md) -------------------------------
    # `since` and `until` take an aware datetime, or a timedelta meaning that long before now.

    def jobs(
        self,
        queue: str | None = None,
        owner: str | None = None,
        status: str | Sequence[str] | None = None,
        type: str | None = None,
        limit: int = 1000,
        *,
        lane: str | None = None,
        ids: Sequence[int] | None = None,
        since: datetime | timedelta | None = None,
        until: datetime | timedelta | None = None,
        full_errors: bool = False,
    ) -> pd.DataFrame:
        """Jobs as a DataFrame, newest first; `since`/`until` bound `created_at`. Errors are cut
        to their first line unless `full_errors`."""
        from synclane import sdk

        return sdk.jobs(
            self,
            queue,
            owner,
            status,
            type,
            limit,
            lane=lane,
            ids=ids,
            since=since,
            until=until,
            full_errors=full_errors,
        )

    def progress(
        self,
        queue: str,
        owner: str | None = None,
        type: str | None = None,
        *,
        state: str | Sequence[str] | None = None,
        recent: timedelta | float = timedelta(hours=1),
    ) -> pd.DataFrame:
        """One row per owner and type: how far the first load is, its state and an ETA from the
        slices completed in the last `recent`."""
        from synclane import sdk

        return sdk.progress(self, queue, owner, type, state=state, recent=recent)

    def failures(
        self,
        queue: str | None = None,
        owner: str | None = None,
        type: str | None = None,
        *,
        status: str | Sequence[str] | None = None,
        since: datetime | timedelta | None = None,
        until: datetime | timedelta | None = None,
        full_errors: bool = False,
    ) -> pd.DataFrame:
        """Open failures (failed, deferred, abandoned) grouped by cause: the error's first line
        with numbers, hex strings and UUIDs masked. `requeue(queue, cause=...)` takes a cause."""
        from synclane import sdk

        return sdk.failures(
            self,
            queue,
            owner,
            type,
            status=status,
            since=since,
            until=until,
            full_errors=full_errors,
        )

    def depth(
        self,
        queue: str | None = None,
        owner: str | None = None,
        type: str | None = None,
        *,
        status: str | Sequence[str] | None = None,
    ) -> pd.DataFrame:
        """Open jobs counted by queue, lane and status."""
        from synclane import sdk

        return sdk.depth(self, queue, owner, type, status=status)

    def lanes(self, queue: str | None = None, *, lane: str | None = None) -> pd.DataFrame:
        """One row per lane with open jobs: what runs there now, who holds it, since when."""
        from synclane import sdk

        return sdk.lanes(self, queue, lane=lane)

    def coverage(
        self,
        queue: str,
        owner: str | None = None,
        type: str | None = None,
        *,
        status: str | Sequence[str] | None = None,
        since: datetime | timedelta | None = None,
        until: datetime | timedelta | None = None,
    ) -> pd.DataFrame:
        """The windows of each owner and type as spans with a status, ready for a timeline
        (synclane.plots.coverage_timeline)."""
        from synclane import sdk

        return sdk.coverage(self, queue, owner, type, status=status, since=since, until=until)

    def throughput(
        self,
        queue: str | None = None,
        owner: str | None = None,
        type: str | None = None,
        *,
        since: datetime | timedelta | None = None,
        until: datetime | timedelta | None = None,
        every: timedelta | float = timedelta(minutes=1),
        by: str | None = None,
    ) -> pd.DataFrame:
        """Records and completed jobs per period (a minute by default) over the last hour, or
        `since`..`until`; `by` splits them per queue, owner, lane or type."""
        from synclane import sdk

        return sdk.throughput(
            self, queue, owner, type, since=since, until=until, every=every, by=by
        )

    def open_jobs(self, queues: Sequence[str] | None = None) -> int:
        """How many jobs of these queues (default: all declared) have not finished."""
        names = [self.get_queue(q).name for q in queues] if queues else list(self.queues)
        with self.connection() as conn:
            row = conn.execute(self.store.query("open_jobs"), {"queues": names}).fetchone()
        return 0 if row is None else int(row[0])

    # -- workers --------------------------------------------------------------------------

    def run_worker(
        self,
        queues: Sequence[str] | None = None,
        stop_after: timedelta | float | None = None,
        *,
        until_idle: bool = False,
        idle_grace: timedelta | float = timedelta(minutes=5),
        on_event: Listener | Iterable[Listener] | None = None,
    ) -> dict[str, int]:
        """Run worker slots until SIGINT/SIGTERM, until `stop_after` has passed, or (with
        `until_idle`) until no job of these queues runs anywhere and none becomes due within
        `idle_grace`; running jobs are handed back with their cursors. `on_event` receives a
        synclane.events.Event for each thing that happens to a job. Returns what the slots
        did, e.g. {'completed': 12}."""
        from synclane.worker import Worker

        worker = Worker(
            self,
            queues,
            stop_after,
            until_idle=until_idle,
            idle_grace=idle_grace,
            on_event=on_event,
        )
        return worker.run()

    async def run_worker_async(
        self,
        queues: Sequence[str] | None = None,
        stop_after: timedelta | float | None = None,
        *,
        until_idle: bool = False,
        idle_grace: timedelta | float = timedelta(minutes=5),
        on_event: Listener | Iterable[Listener] | None = None,
    ) -> dict[str, int]:
        """The async twin of run_worker, for code that already runs an event loop."""
        from synclane.worker import Worker

        worker = Worker(
            self,
            queues,
            stop_after,
            until_idle=until_idle,
            idle_grace=idle_grace,
            on_event=on_event,
        )
        return await worker.run_async()


def _call_owner_source(source: OwnerSource, queue: str, timeout: float) -> list[Any]:
    """Call an owner source (a function or a coroutine function) and read what it returns, in a
    thread of its own, so that a source that hangs cannot hang the planner: after `timeout` it
    raises TimeoutError and leaves the thread behind (a coroutine is cancelled; a blocked
    function cannot be). Works where an event loop already runs (Jupyter, a worker)."""
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            result: Any = source(queue)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result, timeout))
            if isinstance(result, str | bytes) or not isinstance(result, Iterable):
                raise _NotOwners(
                    f"returned {type(result).__name__} {result!r:.100}; return a list of "
                    "Owner(...) objects or owner id strings"
                )
            outcome["owners"] = list(result)
        except BaseException as error:  # the caller turns it into an OwnerSourceError
            outcome["error"] = error
        finally:
            finished.set()

    # The source sees the caller's context variables (a Prefect run's logger, tracing ids).
    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run, args=(target,), name=f"synclane-owners-{queue}", daemon=True
    )
    thread.start()
    if not finished.wait(timeout):
        raise TimeoutError
    if "error" in outcome:
        raise outcome["error"]
    owners: list[Any] = outcome["owners"]
    return owners


def _job_ids(ids: object) -> list[int]:
    """Job ids as the table holds them: whole numbers from 1 to the bigint limit."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise ConfigError(f"ids={ids!r:.100} must be a list of job ids, e.g. ids=[12, 13]")
    found = list(ids)
    for value in found:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**63:
            raise ConfigError(f"ids: {value!r:.100} is not a job id (a whole number >= 1)")
    return found


class _NotOwners(TypeError):
    """An owner source returned something that is not a list of owners."""


async def _awaited(awaitable: Awaitable[Any], timeout: float) -> Any:
    return await asyncio.wait_for(awaitable, timeout)


def _text_of(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:
        return f"<unprintable {type(error).__name__}>"
