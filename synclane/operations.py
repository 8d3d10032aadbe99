"""Operations on jobs by hand: enqueue one, requeue stopped ones, cancel an owner's.

Each checks its arguments first (a ConfigError naming the argument, nothing written), then runs
its statements of sql/operations.sql on the app's shared connection.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import re
import socket
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

import psycopg

from synclane.connection import RECONNECT_DELAYS, Database, lost_connection
from synclane.errors import DatabaseUnavailable, storable
from synclane.model import ConfigError, Rate, check_aware, check_name, check_reason, unstorable
from synclane.owners import owner_batches
from synclane.queues import Catalog, Queue
from synclane.steps import Blocking, Fetch, Steps, run, run_async

log = logging.getLogger(__name__)  # "synclane.operations": the command line quiets it alone

REQUEUE_STATUSES = ("failed", "deferred", "abandoned")
MAX_ID = 2**63 - 1
# How often a statement PostgreSQL rolled back (a deadlock) is sent again.
ATTEMPTS = 10


class Operations:
    """enqueue, requeue, cancel and the unfinished jobs for the queues of one catalog."""

    def __init__(self, database: Database, catalog: Catalog, owners_timeout: timedelta) -> None:
        self.database = database
        self.catalog = catalog
        self.owners_timeout = owners_timeout

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
        q, params = self._enqueue_params(
            queue, owner, type, lane, window_start, window_end, dedup_key
        )
        if conn is not None:
            self.database.check_schema()
            return run(conn, self.database.store, self._enqueue(q, params), caller=True)
        # The job gets a key of this call's own, so that the insert can be sent again after a
        # lost answer: it finds the job its first send added instead of adding a second.
        params["dedup_key"] = dedup_key or f"manual:{uuid4()}"
        lost: psycopg.OperationalError | DatabaseUnavailable | None = None
        for delay in (0.0, *RECONNECT_DELAYS):
            time.sleep(delay)
            try:
                with self.database.connection() as shared:
                    return run(shared, self.database.store, self._enqueue(q, params))
            except psycopg.OperationalError as error:
                if not lost_connection(error):
                    raise  # the server answered (a statement timeout, say): nothing committed
                lost = error
            except DatabaseUnavailable as error:
                if lost is None:
                    raise  # never sent
                lost = error
        assert lost is not None
        raise lost

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
        if conn is None:
            return await asyncio.to_thread(
                self.enqueue, queue, owner, type, lane, window_start, window_end, dedup_key
            )
        q, params = self._enqueue_params(
            queue, owner, type, lane, window_start, window_end, dedup_key
        )
        await asyncio.to_thread(self.database.check_schema)
        return await run_async(conn, self.database.store, self._enqueue(q, params), caller=True)

    def _enqueue_params(
        self,
        queue: str,
        owner: str,
        type: str,
        lane: str | None,
        window_start: datetime | None,
        window_end: datetime | None,
        dedup_key: str | None,
    ) -> tuple[Queue, dict[str, Any]]:
        """Checks the arguments at once (a ConfigError, nothing written), and returns the queue
        and the parameters of the job to add."""
        q = self.catalog.get(queue)
        job_type = q.job_type(type)
        check_name("owner", owner)
        if lane is not None:
            check_name("lane", lane)
        window_start = check_aware("window_start", window_start)
        window_end = check_aware("window_end", window_end)
        if window_start is not None and window_end is not None and window_start >= window_end:
            raise ConfigError(f"window_start={window_start} must be before window_end={window_end}")
        if dedup_key is not None:
            check_name("dedup_key", dedup_key)
            if dedup_key.startswith(("initial", "recurring:")):
                raise ConfigError(
                    f"dedup_key {dedup_key!r}: keys starting with 'initial' or 'recurring:' "
                    "belong to the planner; choose another prefix, e.g. 'manual:...'"
                )
        params = {
            "queue": q.name,
            "owner": owner,
            "lane": lane,
            "type": job_type.name,
            "priority": job_type.priority,
            "window_start": window_start,
            "window_end": window_end,
            "dedup_key": dedup_key,
        }
        return q, params

    def _enqueue(self, queue: Queue, params: dict[str, Any]) -> Steps[int]:
        if params["window_end"] is not None:
            (row,) = yield Fetch("database_now")
            _refuse_the_future(params["window_end"], row["now"])
        if params["lane"] is None:
            params["lane"] = yield from self._lane_of(queue, params["owner"])
        rows = yield Fetch("enqueue_job", params)  # a due job wakes idle workers on commit
        if not rows:  # the dedup key names an existing job: return it
            rows = yield Fetch("job_by_dedup_key", params)
            assert rows, "a dedup conflict names an existing row"
        job_id: int = rows[0]["id"]
        return job_id

    def _lane_of(self, queue: Queue, owner: str) -> Steps[str]:
        """An owner's lane: the one the owners table plans its jobs into (where its open jobs
        are), else the owner source's word, else its newest job's, else its id."""
        params = {"queue": queue.name, "owner": owner}
        rows = yield Fetch("owner_lane_known", params)
        if rows:
            known: str = rows[0]["lane"]
            return known
        if queue.owner_source is not None:
            said = yield Blocking(lambda: self._source_lane(queue, owner))
            if said is not None:
                return str(said)
        rows = yield Fetch("owner_lane", params)
        return owner if not rows else str(rows[0]["lane"])

    def _source_lane(self, queue: Queue, owner: str) -> str | None:
        """The lane the owner source gives this owner; stops reading it once found."""
        for batch in owner_batches(queue, self.owners_timeout.total_seconds()):
            for candidate in batch:
                if candidate.id == owner:
                    return candidate.lane_key
        return None

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
        q = self.catalog.get(queue)
        if type is not None:
            q.job_type(type)
        if owner is not None:
            check_name("owner", owner)
        job_ids = None if ids is None else job_id_list(ids)
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
        params = {
            "queue": q.name,
            "owner": owner,
            "type": type,
            "statuses": list(statuses),
            "ids": job_ids,
            "cause": cause,
            "cause_id": cause_id,
        }
        requeued = self._changing("requeue_jobs", params)
        if requeued:
            log.info("requeued %d job(s) in queue %s", len(requeued), q.name)
        return len(requeued)

    def cancel(self, queue: str, owner: str, reason: str, type: str | None = None) -> int:
        q = self.catalog.get(queue)
        check_name("owner", owner)
        if type is not None:
            q.job_type(type)
        check_reason("cancel", reason, "cancel('shops', owner, 'disconnected')")
        # Free text: kept as given, less what PostgreSQL text cannot hold.
        error = storable(f"Cancelled: {reason}")
        params = {"queue": q.name, "owner": owner, "type": type, "error": error}
        cancelled = self._changing("cancel_jobs", params)
        if cancelled:
            # The stored text, not the raw one: a lone surrogate in a log line broke handlers
            # that encode it (pytest-xdist's report of a test that captured it crashed a worker).
            said = storable(reason)
            log.info(
                "cancelled %d job(s) of %s in queue %s: %s", len(cancelled), owner, q.name, said
            )
        return len(cancelled)

    def _changing(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """A statement that changes rows, in a transaction of its own, and its rows. Sent again
        when PostgreSQL rolled it back to break a deadlock with a worker (its rows are locked in
        id order; a worker's lane may not be), and when the connection went away before the
        transaction committed. When only the commit's answer was lost, the transaction's status,
        asked on a new connection, says whether it committed: then its rows are the answer."""
        deadlocks = 0
        delays = iter(RECONNECT_DELAYS)
        unsettled: tuple[str, list[tuple[Any, ...]]] | None = None  # (xid, rows) of a commit
        while True:
            sent: list[Any] = []  # the transaction's id, then its rows, as their answers come
            try:
                with self.database.connection() as conn:
                    if unsettled is not None:
                        status = self._status(conn, unsettled[0])
                        if status == "committed":
                            return unsettled[1]
                        if status != "in progress":
                            unsettled = None  # it rolled back: send it again
                    if unsettled is None:
                        return self._transaction(conn, name, params, sent)
            except psycopg.errors.TransactionRollback:
                deadlocks += 1
                if deadlocks == ATTEMPTS:
                    raise
                continue
            except (psycopg.OperationalError, DatabaseUnavailable) as error:
                if isinstance(error, psycopg.OperationalError) and not lost_connection(error):
                    raise  # the server answered (a statement timeout, say): it rolled back
                if len(sent) == 2:
                    unsettled = (sent[0], sent[1])  # only the commit's answer is missing
                elif unsettled is None and not sent and isinstance(error, DatabaseUnavailable):
                    raise  # nothing was sent on this try, and no earlier one committed
                delay = next(delays, None)
                if delay is None:
                    raise
                time.sleep(delay)
                continue
            # the transaction whose commit went unanswered is still in progress: ask again
            delay = next(delays, None)
            if delay is None:
                raise psycopg.OperationalError(
                    f"the answer to {name} was lost and its transaction is still in progress: "
                    "the jobs table shows what it changed once it ends"
                )
            time.sleep(delay)

    def _transaction(
        self, conn: psycopg.Connection[Any], name: str, params: dict[str, Any], sent: list[Any]
    ) -> list[tuple[Any, ...]]:
        store = self.database.store
        with conn.transaction():
            row = conn.execute(store.query("transaction_id")).fetchone()
            assert row is not None
            sent.append(row[0])
            cur = conn.execute(store.query(name), params)
            sent.append(cur.fetchall() if cur.description is not None else [])
        rows: list[tuple[Any, ...]] = sent[1]
        return rows

    def _status(self, conn: psycopg.Connection[Any], xid: str) -> str | None:
        row = conn.execute(self.database.store.query("transaction_status"), {"xid": xid})
        found = row.fetchone()
        return None if found is None else found[0]

    def pause(self, queue: str, reason: str, by: str | None = None) -> dict[str, Any]:
        q = self.catalog.get(queue)
        check_reason("pause", reason, "pause('shops', 'warehouse maintenance until 14:00')")
        who = by if by is not None else default_author()
        check_name("by", who)
        params = {"queue": q.name, "reason": storable(reason), "by": who}
        (row,) = self._changing("pause_queue", params)
        log.warning("queue %s paused by %s: %s", q.name, row[1], row[2])
        return {"queue": q.name, "paused_at": row[0], "paused_by": row[1], "reason": row[2]}

    def resume(self, queue: str) -> bool:
        q = self.catalog.get(queue)
        resumed = bool(self._changing("resume_queue", {"queue": q.name}))
        if resumed:
            log.warning("queue %s resumed", q.name)
        return resumed

    def set_lane_rate(
        self, queue: str, rate: Rate | tuple[int, timedelta | float] | None, lane: str | None
    ) -> None:
        q = self.catalog.get(queue)
        given = Rate.of("rate", rate)
        if q.settings.lane_rate is None:
            raise ConfigError(
                f"queue {q.name!r} has no lane_rate, so its workers count no page starts: "
                f"declare one with app.queue({q.name!r}, lane_rate=(count, period)) first"
            )
        params = {
            "queue": q.name,
            "lane": lane,
            "count": None if given is None else given.count,
            "period": None if given is None else given.per,
        }
        if lane is not None:
            check_name("lane", lane)
        name = "set_queue_rate" if lane is None else "set_lane_rate"
        self._changing(name, params)
        where = f"lane {lane} of queue {q.name}" if lane is not None else f"queue {q.name}"
        log.info("rate of %s: %s", where, given or "back to the declared one")

    def unfinished_jobs(self, queues: Sequence[str] | None = None) -> tuple[int, int]:
        names = [q.name for q in self.catalog.pick(queues or None)]
        with self.database.connection() as conn:
            row = conn.execute(self.database.store.query("open_jobs"), {"queues": names}).fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def history_to_plan(self, queues: Sequence[str] | None = None) -> int:
        names = [q.name for q in self.catalog.pick(queues or None)]
        with self.database.connection() as conn:
            row = conn.execute(
                self.database.store.query("history_to_plan"), {"queues": names}
            ).fetchone()
        return 0 if row is None else int(row[0])


def default_author() -> str:
    """Who does an operation when nobody says: the operating-system user at this host."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name (a container without one)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _refuse_the_future(window_end: datetime, now: datetime) -> None:
    """A window covers time that has passed: coverage ends where its newest window ends, so an
    end in the future would stop refreshes until then and leave what arrives meanwhile unloaded
    (docs/planning.md)."""
    if window_end > now:
        raise ConfigError(
            f"window_end={window_end.isoformat()} is in the future (the database's clock says "
            f"{now.isoformat()}); a window can only cover time that has passed: end it now or "
            "earlier, and the next refresh picks up from there"
        )


def check_conn(conn: object, *, sync: bool) -> Any:
    """The caller's connection for `conn=`: None, or an open psycopg 3 connection of the kind
    the call runs on (a Connection for plan/enqueue, an AsyncConnection for their async twins)."""
    if conn is None:
        return None
    kind: type[Any] = psycopg.Connection if sync else psycopg.AsyncConnection
    if not isinstance(conn, kind):
        hint = ""
        if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
            twin = "plan_async()/enqueue_async()" if sync else "plan()/enqueue()"
            hint = f"; a psycopg.{type(conn).__name__} goes to {twin}"
        raise ConfigError(
            f"conn must be a psycopg.{kind.__name__} (psycopg 3), got {type(conn).__name__}{hint}"
        )
    if conn.closed:
        raise ConfigError("conn is closed: pass an open psycopg connection")
    return conn


def job_id_list(ids: object) -> list[int]:
    """Job ids as the table holds them: whole numbers from 1 to the bigint limit."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise ConfigError(f"ids={ids!r:.100} must be a list of job ids, e.g. ids=[12, 13]")
    found: list[int] = []
    for value in ids:
        # numpy integers (a frame's `id` column) count as whole numbers too
        whole = getattr(value, "__index__", None) is not None and not isinstance(value, bool)
        number = int(value) if whole else None
        if number is None or not 0 < number <= MAX_ID:
            raise ConfigError(f"ids: {value!r:.100} is not a job id (a whole number >= 1)")
        found.append(number)
    return found
