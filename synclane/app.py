"""SyncLane: the façade a user holds. It declares queues (synclane.queues) and hands each call to
the part that does it: planning (synclane.planner), operations (synclane.operations), workers
(synclane.worker), and the notebook SDK (synclane.sdk, whose calls it inherits)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from synclane.connection import Database, check_dsn, creating_allowed, redact
from synclane.errors import DatabaseUnavailable, OwnerSourceError, SchemaError
from synclane.events import Listener
from synclane.model import (
    IDLE_GRACE,
    ConfigError,
    Owner,
    QueueSettings,
    Rate,
    check_name,
    to_duration,
)
from synclane.operations import REQUEUE_STATUSES, Operations, check_conn
from synclane.owners import connected_owners
from synclane.planner import Planner
from synclane.queues import Catalog, Queue
from synclane.sdk import Reads
from synclane.store import Store

if TYPE_CHECKING:
    from synclane.worker import Worker

__all__ = [
    "REQUEUE_STATUSES",
    "DatabaseUnavailable",
    "OwnerSourceError",
    "Queue",
    "SchemaError",
    "SyncLane",
    "check_dsn",
    "redact",
]


class SyncLane(Reads):
    """The application: a database, a schema, and the queues declared on it.

    `dsn=None` means $SYNCLANE_DSN when it is set, else the embedded PostgreSQL. When the DSN
    goes through a transaction pooler (PgBouncer in transaction mode, a managed pooler), say so
    with `pooler="transaction"` (or $SYNCLANE_POOLER): nothing is then prepared on the server and
    no session setting or lock is relied on. `listen_dsn` (or $SYNCLANE_LISTEN_DSN): a direct
    connection on which workers LISTEN for due work; a pooled app without one polls
    (docs/scaling.md, "Through a transaction pooler")."""

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
        pooler: str | None = None,
        listen_dsn: str | None = None,
    ) -> None:
        if not isinstance(create_schema, bool):
            raise ConfigError(
                f"create_schema must be True or False, got {type(create_schema).__name__} "
                f"{create_schema!r:.100}"
            )
        if dsn is not None and (not isinstance(dsn, str) or not dsn.strip()):
            raise ConfigError("dsn must be a PostgreSQL connection string, or None for embedded")
        Store(schema)  # the schema name is checked before any database is started
        self.poll_interval = to_duration("poll_interval", poll_interval)
        self.plan_interval = to_duration("plan_interval", plan_interval)
        self.owners_timeout = to_duration("owners_timeout", owners_timeout)
        # Not given: host:pid of the process that runs the worker, read then, so that processes
        # forked from one app (multiprocessing, a preloading server) do not share a name.
        self._worker_name = check_name("worker_name", worker_name) if worker_name else None
        self.database = Database(dsn, schema, pooler, listen_dsn)
        self.catalog = Catalog()
        self._planner = Planner(self.database, self.catalog, self.owners_timeout)
        self._operations = Operations(self.database, self.catalog, self.owners_timeout)
        if create_schema and creating_allowed():  # not while a read-only command loads it
            self.migrate()

    def __repr__(self) -> str:
        where = "embedded" if self.embedded else redact(self.dsn)
        pooler = f", pooler={self.pooler!r}" if self.pooler else ""
        return f"SyncLane({where!r}, schema={self.schema!r}{pooler}, queues={list(self.catalog)})"

    # -- what the app is made of -----------------------------------------------------------

    @property
    def worker_name(self) -> str:
        """What a worker of this app writes to leased_by (a live worker that holds it already
        makes a second one run as `name#2`, see docs/workers.md)."""
        return self._worker_name or f"{socket.gethostname()}:{os.getpid()}"

    @property
    def dsn(self) -> str:
        return self.database.dsn

    @property
    def pooler(self) -> str | None:
        """ "transaction" when the DSN goes through a transaction pooler, else None."""
        return self.database.pooler

    @property
    def embedded(self) -> bool:
        """Whether this app runs on the embedded PostgreSQL."""
        return self.database.embedded

    @property
    def schema(self) -> str:
        return self.database.schema

    @property
    def store(self) -> Store:
        return self.database.store

    @property
    def queues(self) -> Catalog:
        """The declared queues by name."""
        return self.catalog

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
        lane_width: int = 1,
        max_running: int | None = None,
        lane_rate: Rate | tuple[int, timedelta | float] | None = None,
        owners_interval: timedelta | float = timedelta(minutes=5),
        retention: timedelta | float | None = None,
    ) -> Queue:
        """Declare a queue: its types and handlers are declared on the object returned.

        `lane_width`: at most this many jobs of one lane run at once, across every process.
        `max_running`: at most this many jobs of the queue run at once, across every process.
        `lane_rate`: at most this many page starts per lane per period, e.g. (2, 1) for two a
        second (docs/flow-control.md). `owners_interval`: how often a worker's planner reads
        the owner source to its end (what is due is planned every `plan_interval`).
        `retention`: keep finished rows this long; the elected planner prunes older ones
        (see prune(), docs/scaling.md)."""
        check_name("queue name", name)
        try:
            settings = QueueSettings(
                concurrency=concurrency,
                max_attempts=max_attempts,
                lease_duration=lease_duration,  # type: ignore[arg-type]
                retry_base_delay=retry_base_delay,  # type: ignore[arg-type]
                retry_max_delay=retry_max_delay,  # type: ignore[arg-type]
                throttle_base_delay=throttle_base_delay,  # type: ignore[arg-type]
                throttle_max_delay=throttle_max_delay,  # type: ignore[arg-type]
                lane_width=lane_width,
                max_running=max_running,
                lane_rate=lane_rate,  # type: ignore[arg-type]
                owners_interval=owners_interval,  # type: ignore[arg-type]
                retention=retention,  # type: ignore[arg-type]
            )
        except ConfigError as error:
            raise ConfigError(f"queue {name!r}: {error}") from None
        return self.catalog.add(name, settings)

    def get_queue(self, name: str) -> Queue:
        return self.catalog.get(name)

    # -- the database ----------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection on the database clock's time zone, UTC."""
        return self.database.connect()

    @contextmanager
    def connection(self, *, check_schema: bool = True) -> Iterator[psycopg.Connection[Any]]:
        """The app's shared connection for operations, reopened when it broke."""
        with self.database.connection(check_schema=check_schema) as conn:
            yield conn

    def close(self) -> None:
        self.database.close()

    def migrate(self) -> int:
        """Create or upgrade the schema (idempotent; safe when several processes run it)."""
        return self.database.migrate()

    def check_schema(self) -> None:
        """Raise SchemaError unless the schema exists at the version this synclane knows."""
        self.database.check_schema()

    # -- planning --------------------------------------------------------------------------

    def plan(
        self,
        queue: str | None = None,
        owner: Owner | str | None = None,
        horizon: timedelta | float | None = None,
        type: str | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> dict[str, int]:
        """Insert the jobs that should exist and do not; returns how many per queue.

        `owner` plans one owner now (an Owner is used as given; a str is looked up in the
        owner source). `horizon` widens the history of windowed types for this call only (a
        backfill); `type` limits the call to one type. `conn`: run on this psycopg connection,
        inside its transaction: the jobs commit or roll back with it."""
        wider = None if horizon is None else to_duration("horizon", horizon)
        return self._planner.plan(queue, owner, wider, type, conn=check_conn(conn, sync=True))

    def plan_due(self, queue: str | None = None) -> dict[str, int]:
        """Plan what is due, as a running worker does every `plan_interval`: the owner source is
        read when the queue's `owners_interval` has passed, and the rest of the round reads only
        the types whose period began, so the cost follows what is due, not how many owners
        there are. What an orchestrator's schedule runs (docs/scaling.md). Returns how many jobs
        were added per queue; a queue that another process is planning now counts 0."""
        return self._planner.plan_due(queue)

    async def plan_async(
        self,
        queue: str | None = None,
        owner: Owner | str | None = None,
        horizon: timedelta | float | None = None,
        type: str | None = None,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> dict[str, int]:
        """plan() for async code; `conn` is a psycopg.AsyncConnection whose transaction the
        jobs join."""
        wider = None if horizon is None else to_duration("horizon", horizon)
        checked = check_conn(conn, sync=False)
        return await self._planner.plan_async(queue, owner, wider, type, conn=checked)

    def prune(
        self, queue: str | None = None, older_than: timedelta | float = timedelta(days=30)
    ) -> int:
        """Delete finished rows older than `older_than` that nothing needs any more (of this
        queue, or of every declared one); returns how many. Open jobs, jobs waiting for a human,
        initial slices and every row planning, coverage() and progress() read are kept
        (docs/operations.md, "Retention")."""
        limit = to_duration("older_than", older_than, allow_zero=True)
        return self._planner.prune(queue, limit)

    def connected_owners(self, queue: str) -> list[Owner]:
        """Ask the queue's owner source who is connected now."""
        return connected_owners(self.catalog.get(queue), self.owners_timeout.total_seconds())

    # -- operations ------------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        owner: str,
        type: str,
        lane: str | None = None,
        window_start: datetime | None = None,
        window_end: datetime | None = None,
        dedup_key: str | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> int:
        """Add one job by hand (mode 'manual') and return its id. With a dedup_key a second call
        returns the first job's id instead of adding another. An answer lost on the way back is
        settled: the insert is sent again and finds the job it added. `conn`: run on this
        psycopg connection, inside its transaction: the job commits or rolls back with it."""
        return self._operations.enqueue(
            queue,
            owner,
            type,
            lane,
            window_start,
            window_end,
            dedup_key,
            conn=check_conn(conn, sync=True),
        )

    async def enqueue_async(
        self,
        queue: str,
        owner: str,
        type: str,
        lane: str | None = None,
        window_start: datetime | None = None,
        window_end: datetime | None = None,
        dedup_key: str | None = None,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> int:
        """enqueue() for async code; `conn` is a psycopg.AsyncConnection whose transaction the
        job joins."""
        return await self._operations.enqueue_async(
            queue,
            owner,
            type,
            lane,
            window_start,
            window_end,
            dedup_key,
            conn=check_conn(conn, sync=False),
        )

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
        return self._operations.requeue(
            queue,
            owner,
            type,
            ids=ids,
            include_cancelled=include_cancelled,
            cause=cause,
            cause_id=cause_id,
        )

    def cancel(self, queue: str, owner: str, reason: str, type: str | None = None) -> int:
        """Cancel what has not finished for an owner (an account disconnected). A running job's
        worker learns it at its next page save or heartbeat and stops. The reason (at most
        1,000 characters, as `synclane cancel --reason`) is kept in the jobs' error. Returns how
        many."""
        return self._operations.cancel(queue, owner, reason, type)

    def pause(self, queue: str, reason: str, *, by: str | None = None) -> dict[str, Any]:
        """Stop taking from a queue, in every process sharing the table, until `resume`: a
        running job stops at its next page boundary and is handed back with its cursor, its
        attempt not used; planning goes on. `by` defaults to user@host. Returns the pause
        (when, by whom, why); pausing a paused queue keeps when and by whom, takes the reason.
        The reason is at most 1,000 characters, as `synclane pause --reason`."""
        return self._operations.pause(queue, reason, by)

    def resume(self, queue: str) -> bool:
        """Take from a paused queue again, in every process; False when it was not paused."""
        return self._operations.resume(queue)

    def set_lane_rate(
        self,
        queue: str,
        rate: Rate | tuple[int, timedelta | float] | None,
        *,
        lane: str | None = None,
    ) -> None:
        """Change a rate without a deploy: the queue's (it overrides the declared `lane_rate`)
        or, with `lane`, one lane's (an account on a bigger plan); None goes back to the
        declared one. Every process applies it at the lane's next page start."""
        self._operations.set_lane_rate(queue, rate, lane)

    def open_jobs(self, queues: Sequence[str] | None = None) -> int:
        """How many jobs of these queues (default: all declared) are open: pending, running,
        failed or deferred."""
        return self._operations.unfinished_jobs(queues)[0]

    def unfinished_jobs(self, queues: Sequence[str] | None = None) -> tuple[int, int]:
        """(open, waiting for a human): the open jobs of these queues, and the abandoned ones,
        which nothing runs until a requeue. What a progress bar counts besides the done ones."""
        return self._operations.unfinished_jobs(queues)

    def history_to_plan(self, queues: Sequence[str] | None = None) -> int:
        """How many history slices of these queues are not planned yet: a history keeps only
        its newest open slices as rows, and the database plans the next as one finishes
        (docs/planning.md). What a progress bar adds to the open jobs; one index lookup per owner
        and windowed type, so read it seldom on a large table."""
        return self._operations.history_to_plan(queues)

    # -- workers ---------------------------------------------------------------------------

    def worker(
        self,
        queues: str | Sequence[str] | None = None,
        stop_after: timedelta | float | None = None,
        *,
        until_idle: bool = False,
        idle_grace: timedelta | float = IDLE_GRACE,
        stop_grace: timedelta | float = timedelta(0),
        on_event: Listener | Iterable[Listener] | None = None,
    ) -> Worker:
        """A worker for these queues (default: all declared), not started: `.run()`,
        `await .run_async()`, `.stop()` from any thread. `stop_grace`: how long a page in flight
        may take to end once `stop_after` has passed (default: none, it is abandoned and its job
        handed back at once); a stop asked for (a signal, `.stop()`) abandons it at once."""
        from synclane.worker import Worker

        return Worker(
            self.database,
            self.catalog.pick(queues),
            name=self.worker_name,
            poll_interval=self.poll_interval,
            plan_interval=self.plan_interval,
            plan=self._planner.round,
            stop_after=stop_after,
            until_idle=until_idle,
            idle_grace=idle_grace,
            stop_grace=stop_grace,
            on_event=on_event,
        )

    def run_worker(
        self,
        queues: str | Sequence[str] | None = None,
        stop_after: timedelta | float | None = None,
        *,
        until_idle: bool = False,
        idle_grace: timedelta | float = IDLE_GRACE,
        stop_grace: timedelta | float = timedelta(0),
        on_event: Listener | Iterable[Listener] | None = None,
    ) -> dict[str, int]:
        """Run worker slots until SIGINT/SIGTERM, until `stop_after` has passed, or (with
        `until_idle`) until no job of these queues runs anywhere and none becomes due within
        `idle_grace`; running jobs are handed back with their cursors. `on_event` receives a
        synclane.events.Event for each thing that happens to a job. Returns what the slots
        did, e.g. {'completed': 12}."""
        worker = self.worker(
            queues,
            stop_after,
            until_idle=until_idle,
            idle_grace=idle_grace,
            stop_grace=stop_grace,
            on_event=on_event,
        )
        return worker.run()

    async def run_worker_async(
        self,
        queues: str | Sequence[str] | None = None,
        stop_after: timedelta | float | None = None,
        *,
        until_idle: bool = False,
        idle_grace: timedelta | float = IDLE_GRACE,
        stop_grace: timedelta | float = timedelta(0),
        on_event: Listener | Iterable[Listener] | None = None,
    ) -> dict[str, int]:
        """The async twin of run_worker, for code that already runs an event loop."""
        worker = self.worker(
            queues,
            stop_after,
            until_idle=until_idle,
            idle_grace=idle_grace,
            stop_grace=stop_grace,
            on_event=on_event,
        )
        return await worker.run_async()
