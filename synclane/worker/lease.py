"""A lease: a running job held by this worker, and the only writes allowed under it.

Every write about a running job is guarded by its id, its lease token and status = 'running'
(statements in sql/taking.sql). A write that matches no row means the lease was lost (another
worker took the job over, or it was cancelled): `LeaseLost` is raised and the slot writes
nothing more of the job's work (no page, no count, no status). Two writes touch the lost lease
itself, never the job: while the page may still run, `hold` renews it so that the lane stays
held (only when the row is no longer 'running'), and once the page has stopped `release` clears
it, freeing the lane. Writes are retried through a short database outage, for up to half the
lease; after that the job is left to lease expiry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID, uuid4

import psycopg
from psycopg_pool import AsyncConnectionPool

from synclane.model import Rate
from synclane.params import Bigints, Uuids
from synclane.store import Store
from synclane.worker.outage import OUTAGE_BACKOFF, Outage, outage_text
from synclane.worker.shared import Shared
from synclane.worker.taker import LeasedJob

log = logging.getLogger("synclane")
T = TypeVar("T")

# What is worth sending again: the connection broke (the statement may or may not have
# committed: every statement here finds its own earlier commit), or PostgreSQL rolled the
# statement back to break a deadlock or a serialization conflict.
RETRIED = (psycopg.OperationalError, psycopg.errors.TransactionRollback)


class LeaseLost(Exception):
    """A guarded write matched no row: another worker owns the job, or it was cancelled."""


class Writer:
    """Runs statements about running jobs on the worker's pool, through short outages."""

    def __init__(
        self, pool: AsyncConnectionPool[Any], store: Store, prepare: bool | None = True
    ) -> None:
        self.pool = pool
        self.store = store
        # psycopg's prepare: True on a session of the worker's own, None through a transaction
        # pooler (synclane.connection.Database.prepare)
        self.prepare = prepare
        self.outage = Outage()

    async def run(
        self,
        name: str,
        statement: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        patience: float,
        *,
        chore: bool = False,
    ) -> T:
        """The statement's result; retried while the database is unreachable or refuses it for
        up to `patience` seconds, then LeaseLost (the job is left to lease expiry). A `chore`
        (tried again at its next round) gives up without a word: the outage was said once."""
        deadline = time.monotonic() + patience
        for delay in (*OUTAGE_BACKOFF, None):
            try:
                async with self.pool.connection() as conn:
                    result = await statement(conn)
            except RETRIED as error:
                if isinstance(error, psycopg.OperationalError):
                    self.outage.lost(name, error)
                if delay is None or time.monotonic() + delay > deadline:
                    reason = self.outage.too_long(name)
                    if not chore:
                        log.warning("giving up on %s: %s (%s)", name, reason, outage_text(error))
                    raise LeaseLost(reason) from error
                await asyncio.sleep(delay)
                continue
            self.outage.reached(name)
            return result
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class PageSave:
    """One slot's page to save: its job, lease token, where the page started (the cursor it
    replaces and the job's count before it), the new cursor and the page's count."""

    id: int
    token: UUID
    expected: str | None
    counted: int
    cursor: str
    count: int


@dataclass(frozen=True)
class PageStart:
    """One slot's page start to count against its lane's rate: `units` starts (force: count
    them whatever the room, for calls a page made beyond the one it announced). Its key makes
    the start, sent again after a lost answer, find itself instead of counting twice."""

    queue: str
    lane: str
    rate: Rate
    units: int
    force: bool
    key: UUID = field(default_factory=uuid4)


@dataclass(frozen=True)
class Saved:
    """What a page save learnt besides its own guard: whether the job's queue is paused, and
    until when its lane is paused by a throttle (None: it is not). Either stops the job at this
    page boundary."""

    saved: bool
    queue_paused: bool = False
    lane_paused_until: datetime | None = None


SAVES = 2


class PageWrites:
    """The page saves and heartbeats of the slots of one queue in one worker: those that fall
    due at the same instant share one statement and one commit (synclane.worker.shared), each
    row still under its own guard, and a slot whose guard fails learns it alone."""

    def __init__(self, writer: Writer, queue: str, lease: timedelta) -> None:
        self.writer = writer
        self.queue = queue
        self.lease = lease
        # Two saves may be in flight: a page that ends while one is sent goes at once rather
        # than waiting for that one's commit (docs/performance.md measures both).
        self.saves: Shared[PageSave, Saved] = Shared(self._save, in_flight=SAVES)
        self.beats: Shared[tuple[int, UUID], bool] = Shared(self._beat)
        # Page starts under a lane rate that fall due together share one statement too.
        self.starts: Shared[PageStart, float] = Shared(self._start)

    async def save(self, page: PageSave) -> Saved:
        return await self.saves.ask(page)

    async def beat(self, job_id: int, token: UUID) -> bool:
        return await self.beats.ask((job_id, token))

    async def start(self, start: PageStart) -> float:
        """0 when the page may start now (counted), else the seconds until its lane has room."""
        return await self.starts.ask(start)

    async def idle(self) -> None:
        await self.saves.idle()
        await self.beats.idle()
        await self.starts.idle()

    @property
    def _patience(self) -> float:
        return self.lease.total_seconds() / 2

    async def _save(self, pages: list[PageSave]) -> list[Saved]:
        params = {
            "queue": self.queue,
            "lease": self.lease,
            "ids": Bigints(p.id for p in pages),
            "tokens": Uuids(p.token for p in pages),
            "expected": [p.expected for p in pages],
            "counted": Bigints(p.counted for p in pages),
            "cursors": [p.cursor for p in pages],
            "counts": Bigints(p.count for p in pages),
        }

        async def statement(conn: psycopg.AsyncConnection[Any]) -> list[Saved]:
            cur = await conn.execute(
                self.writer.store.query("save_pages"), params, prepare=self.writer.prepare
            )
            return [
                Saved(bool(saved), bool(paused), until)
                for saved, paused, until in await cur.fetchall()
            ]

        return await self.writer.run("save_pages", statement, self._patience)

    async def _start(self, starts: list[PageStart]) -> list[float]:
        params = {
            "queues": [start.queue for start in starts],
            "lanes": [start.lane for start in starts],
            "counts": [start.rate.count for start in starts],
            "periods": [start.rate.per for start in starts],
            "units": [start.units for start in starts],
            "forces": [start.force for start in starts],
            "keys": [start.key for start in starts],
        }

        async def statement(conn: psycopg.AsyncConnection[Any]) -> list[float]:
            cur = await conn.execute(
                self.writer.store.query("lane_page_starts"), params, prepare=self.writer.prepare
            )
            return [float(row[0]) for row in await cur.fetchall()]

        return await self.writer.run("lane_page_starts", statement, self._patience)

    async def _beat(self, jobs: list[tuple[int, UUID]]) -> list[bool]:
        params = {
            "lease": self.lease,
            "ids": Bigints(job_id for job_id, _ in jobs),
            "tokens": Uuids(token for _, token in jobs),
        }

        async def statement(conn: psycopg.AsyncConnection[Any]) -> set[int]:
            cur = await conn.execute(
                self.writer.store.query("heartbeats"), params, prepare=self.writer.prepare
            )
            return {job_id for job_id, running in await cur.fetchall() if running}

        renewed = await self.writer.run("heartbeats", statement, self._patience)
        return [job_id in renewed for job_id, _ in jobs]


class Lease:
    """The lease on one job: its id and token, how long it lasts, when this worker last renewed
    it (by its own monotonic clock, which keeps running while the process is paused), and one
    method per guarded statement."""

    def __init__(self, job: LeasedJob, pages: PageWrites, renewed: float) -> None:
        self.job = job
        self.pages = pages
        self.duration = pages.lease
        self.writer = pages.writer
        self.renewed = renewed  # taken before the renewing statement was sent: conservative

    @property
    def id(self) -> int:
        return self.job.id

    @property
    def token(self) -> Any:
        return self.job.lease_token

    def check(self) -> None:
        """LeaseLost when the lease ran out while this worker was not running (paused): a
        worker that wakes up between two pages must not start the next one."""
        if time.monotonic() - self.renewed >= self.duration.total_seconds():
            raise LeaseLost("the lease ran out while this worker was not running (paused?)")

    async def save_page(self, expected: str | None, counted: int, cursor: str, count: int) -> Saved:
        """Saves the cursor and the count after a page and renews the lease, in the statement
        the worker's slots whose pages end now share; `expected` and `counted` are the cursor
        the page started from and the job's count before it (a save sent again finds its own,
        also when the page kept its cursor). Returns whether the queue or the lane is paused
        (the job then stops at this page boundary)."""
        sent = time.monotonic()
        page = PageSave(self.id, self.token, expected, counted, cursor, count)
        saved = await self.pages.save(page)
        if not saved.saved:
            raise LeaseLost("the job was taken over or cancelled")
        self.renewed = sent
        return saved

    async def heartbeat(self) -> None:
        """Renews the lease while a slow page is in flight (shared like a page save)."""
        sent = time.monotonic()
        if not await self.pages.beat(self.id, self.token):
            raise LeaseLost("the job was taken over or cancelled")
        self.renewed = sent

    async def complete(self, count: int) -> None:
        """The last page: counts it and marks the job completed."""
        await self._guarded("complete_job", {"count": count}, answered=True)

    async def fail(
        self, error: str, delay: timedelta, max_attempts: int
    ) -> tuple[str, datetime] | None:
        """A failed attempt; returns the new status and when it is due, or None when the lease
        was lost before the failure could be recorded."""
        params = {**self._guard(), "error": error, "delay": delay, "max_attempts": max_attempts}

        async def statement(conn: psycopg.AsyncConnection[Any]) -> tuple[str, datetime] | None:
            cur = await conn.execute(self.writer.store.query("fail_job"), params)
            row = await cur.fetchone()
            return None if row is None else (row[0], row[1])

        return await self.writer.run("fail_job", statement, self._patience)

    async def throttle(self, error: str, delay: timedelta) -> datetime:
        """A throttle: the attempt given back, the whole lane pushed; returns until when."""
        params = {
            **self._guard(),
            "error": error,
            "delay": delay,
            "previous_status": self.job.previous_status,
        }

        async def statement(conn: psycopg.AsyncConnection[Any]) -> datetime | None:
            cur = await conn.execute(self.writer.store.query("throttle_job"), params)
            row = await cur.fetchone()
            return None if row is None else row[0]

        until = await self.writer.run("throttle_job", statement, self._patience)
        if until is None:
            raise LeaseLost("the job was taken over or cancelled")
        return until

    async def abandon(self, error: str) -> None:
        """Abandoned at once: a retry cannot help."""
        await self._guarded("abandon_job", {"error": error}, answered=True)

    async def hand_back(self, *, stalled: bool = False) -> None:
        """Back in line with its cursor; a stop is not a failed attempt. `stalled`: its page was
        abandoned before it ended and no page was saved (counted in `stalls`)."""
        params = {"previous_status": self.job.previous_status, "stalled": stalled}
        await self._guarded("hand_back", params)

    async def wait_for_rate(self, delay: timedelta) -> datetime:
        """Back in line with its cursor and its attempt until the lane's rate has room (or its
        pause ends, if later); the lane's other open jobs wait as long. Returns until when."""
        params = {**self._guard(), "previous_status": self.job.previous_status, "delay": delay}

        async def statement(conn: psycopg.AsyncConnection[Any]) -> datetime | None:
            cur = await conn.execute(self.writer.store.query("wait_for_rate"), params)
            row = await cur.fetchone()
            return None if row is None else row[0]

        until = await self.writer.run("wait_for_rate", statement, self._patience)
        if until is None:
            raise LeaseLost("the job was taken over or cancelled")
        return until

    async def page_start(self, rate: Rate, units: int = 1, *, force: bool = False) -> float:
        """Counts a page start against the lane's rate: 0 when the page may start now, else
        how many seconds until the lane has room (nothing counted then). Slots whose pages
        start at the same instant share the statement (PageWrites.start)."""
        return await self.pages.start(PageStart(self.job.queue, self.job.lane, rate, units, force))

    async def hold(self) -> bool:
        """Renews a lost lease whose page is still in flight, so that its lane stays held; no
        write of the job is allowed under it. False when the lease is nobody's any more
        (reclaimed, taken over): there is nothing left to hold."""
        try:
            await self._guarded("hold_lease", {})
        except LeaseLost:
            return False
        return True

    async def release(self) -> None:
        """A cancelled job gives its lane back once its page has stopped."""
        await self._guarded("release_cancelled", {})

    # -- statements ------------------------------------------------------------------------

    @property
    def _patience(self) -> float:
        return self.duration.total_seconds() / 2

    def _guard(self) -> dict[str, Any]:
        return {"id": self.job.id, "token": self.job.lease_token, "lease": self.duration}

    async def _guarded(self, name: str, extra: dict[str, Any], *, answered: bool = False) -> None:
        """Runs a guarded statement; LeaseLost when it matched nothing. `answered`: the
        statement answers whether it (or its own earlier commit) went through, instead of
        counting rows."""
        params = {**self._guard(), **extra}

        async def statement(conn: psycopg.AsyncConnection[Any]) -> bool:
            cur = await conn.execute(self.writer.store.query(name), params)
            if not answered:
                return cur.rowcount > 0
            row = await cur.fetchone()
            return bool(row and row[0])

        if not await self.writer.run(name, statement, self._patience):
            raise LeaseLost("the job was taken over or cancelled")
