"""Taking jobs: the rows a take returns, the two take statements, and the Taker that lets the
slots of one queue share one statement.

Slots whose pages end at the same instant ask together (synclane.worker.shared): one
`take_front` statement completes every job they have just finished (each under its own lease
guard) and takes one job for each completion that went through and for each slot that had
nothing to complete. One commit serves them all; a slot that asks alone is served at once,
nothing waits to form a batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg import errors
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from synclane.connection import lost_connection
from synclane.params import Bigints, Uuids
from synclane.read_only import AsyncReadOnlyAwareRawCursor
from synclane.store import Store
from synclane.worker.outage import OUTAGE_BACKOFF, Outage
from synclane.worker.shared import Shared

# How many jobs at the front of the line `take_front` looks at before a slot searches lane by
# lane (docs/performance.md: the front answers in well under a millisecond).
FRONT_SIZE = 64
# How many lanes one look lane by lane reads, and how many looks one slot's ask may make in a
# row while each finds only busy lanes (it parks them: the next look reads others).
LANES_A_LOOK = 256
LOOKS = 40
# How often a take is sent again after losing a lane race in a row (each loss means another
# worker took a job at that instant: progress is made).
RACES = 20


@dataclass(frozen=True)
class LeasedJob:
    """A job's row as a take marked it running under a fresh lease token."""

    id: int
    queue: str
    owner: str
    lane: str
    type: str
    mode: str
    window_start: datetime | None
    window_end: datetime | None
    cursor: str | None
    attempt_count: int
    throttle_count: int
    processed_count: int
    lease_token: UUID
    stalls: int
    previous_status: str


@dataclass(frozen=True)
class Finished:
    """A job a slot has just finished, to complete in the statement that takes its next one."""

    id: int
    token: UUID
    count: int


@dataclass(frozen=True)
class Batch:
    """What one take statement did: the ids it completed, the jobs it took (best first)."""

    completed: frozenset[int]
    jobs: list[LeasedJob]


@dataclass(frozen=True)
class Turn:
    """One slot's share of a batch: whether the job it finished was completed, and its next
    job (None when there was nothing for it)."""

    completed: bool
    job: LeasedJob | None


async def take_front(
    conn: psycopg.AsyncConnection[Any],
    store: Store,
    queue: str,
    worker: str,
    lease: timedelta,
    finished: Sequence[Finished] = (),
    plain: int = 1,
    token: UUID | None = None,
    lane_width: int = 1,
    max_running: int | None = None,
    prepare: bool | None = True,
) -> Batch:
    """One `take_front` statement: completes `finished` under their lease guards and takes one
    job per completion that went through plus `plain` more, from the front of the line, in
    distinct free lanes; may take fewer. Each job's lease token is made from `token` (the
    worker's own, so that it can find them after a lost answer: taken_by_tokens; a fresh one
    when not given) and the job's id. Raises psycopg.errors.UniqueViolation when another worker
    won a lane at the same instant: nothing was written then, the completions included."""
    cur = AsyncReadOnlyAwareRawCursor(conn, row_factory=dict_row)
    params = {
        "token": token or uuid4(),
        "lane_width": lane_width,
        "max_running": max_running,
        "queue": queue,
        "worker": worker,
        "lease": lease,
        "front": FRONT_SIZE,
        "plain": plain,
        "done_ids": Bigints(job.id for job in finished),
        "done_tokens": Uuids(job.token for job in finished),
        "done_counts": Bigints(job.count for job in finished),
    }
    # the slot numbering costs a third of the plan's nodes: only queues that need it run it
    statement = "take_front" if lane_width == 1 and max_running is None else "take_front_slotted"
    query, names = store.positional(statement)
    # Prepared at its first execution: psycopg would wait for the fifth of each combination of
    # parameter types (an empty list or none, small or large numbers) and plan each before it.
    # Never through a transaction pooler (`prepare=None`).
    await cur.execute(query, [params[name] for name in names], prepare=prepare)
    rows = await cur.fetchall()
    jobs = []
    completed: list[int] = []
    for row in rows:
        del row["priority"]
        completed = row.pop("completed")
        if row["id"] is not None:
            jobs.append(LeasedJob(**row))
    return Batch(frozenset(completed), jobs)


async def take_by_lane(
    conn: psycopg.AsyncConnection[Any],
    store: Store,
    queue: str,
    worker: str,
    lease: timedelta,
    token: UUID | None = None,
    lane_width: int = 1,
    max_running: int | None = None,
    prepare: bool | None = True,
) -> tuple[LeasedJob | None, bool]:
    """One job from the lanes whose hint says a job may be due: for when the front of the line
    waits behind busy lanes. Also whether a look again may find one (this look read a full
    batch of lanes, parking or moving each). Raises UniqueViolation like take_front."""
    cur = AsyncReadOnlyAwareRawCursor(conn, row_factory=dict_row)
    params = {
        "queue": queue,
        "worker": worker,
        "lease": lease,
        "token": token or uuid4(),
        "lane_width": lane_width,
        "max_running": max_running,
        "visit": LANES_A_LOOK,
    }
    query, names = store.positional("take_by_lane")
    await cur.execute(query, [params[name] for name in names], prepare=prepare)
    row = await cur.fetchone()
    assert row is not None, "take_by_lane always answers one row"
    looked, written = row.pop("looked"), row.pop("written")
    job = None if row["id"] is None else LeasedJob(**row)
    # another look may find more: this one read a full batch and changed what the next one reads
    return job, job is None and looked >= LANES_A_LOOK and written > 0


async def taken_by_tokens(
    conn: psycopg.AsyncConnection[Any],
    store: Store,
    worker: str,
    tokens: Sequence[UUID],
    finished: Sequence[Finished],
    max_attempts: int,
) -> tuple[Batch, bool]:
    """After a take whose answer was lost: what it did, and whether it committed at all (False:
    the jobs it meant to complete still run under their leases, and nothing of it happened).
    `tokens`: the tokens the take statements sent (each job's is made from one and its id)."""
    cur = conn.cursor(row_factory=dict_row)
    params = {
        "worker": worker,
        "tokens": Uuids(tokens),
        "done_ids": Bigints(job.id for job in finished),
        "done_tokens": Uuids(job.token for job in finished),
        "max_attempts": max_attempts,
    }
    await cur.execute(store.query("taken_by_tokens"), params)
    rows = await cur.fetchall()
    unfinished = {row["id"] for row in rows if row["unfinished"]}
    jobs = [
        LeasedJob(**{k: v for k, v in row.items() if k != "unfinished"})
        for row in rows
        if not row["unfinished"]
    ]
    committed = bool(jobs) or not unfinished
    completed = frozenset(job.id for job in finished if job.id not in unfinished)
    return Batch(completed if committed else frozenset(), jobs), committed


class Taker:
    """Takes jobs for the slots of one queue in one worker. `give_back` hands back a job taken
    for a slot that was cancelled while its statement ran."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        store: Store,
        queue: str,
        worker: str,
        lease: timedelta,
        give_back: Callable[[LeasedJob], Awaitable[None]],
        max_attempts: int = 5,
        outage: Outage | None = None,
        lane_width: int = 1,
        max_running: int | None = None,
        prepare: bool | None = True,
    ) -> None:
        self.pool, self.store = pool, store
        self.prepare = prepare
        self.outage = outage or Outage()
        self.lane_width, self.max_running = lane_width, max_running
        self.queue, self.worker, self.lease = queue, worker, lease
        self.max_attempts = max_attempts
        self.give_back = give_back
        self._shared: Shared[Finished | None, Turn | None] = Shared(
            self._statement, self._unclaimed
        )
        # Told after each take statement: which ("front" or "by_lane"), its seconds (a pooled
        # connection's wait included) and what it did; the worker's metrics and its wake-up of
        # other workers for the lanes it freed listen here. It must return at once.
        self.watch: Callable[[str, float, Batch], None] | None = None

    async def take(self, finished: Finished | None) -> Turn | None:
        """The next job, completing `finished` in the same statement when given. None: several
        races for a lane in a row were lost, and nothing was written."""
        return await self._shared.ask(finished)

    async def idle(self) -> None:
        """Wait until no statement is in flight (before the pool closes)."""
        await self._shared.idle()

    async def _unclaimed(self, turn: Turn | None) -> None:
        if turn is not None and turn.job is not None:
            await self.give_back(turn.job)

    async def _statement(self, requests: list[Finished | None]) -> list[Turn | None]:
        finished = [request for request in requests if request is not None]
        for _ in range(RACES):
            token = uuid4()
            sent = time.monotonic()
            try:
                async with self.pool.connection() as conn:
                    batch = await take_front(
                        conn,
                        self.store,
                        self.queue,
                        self.worker,
                        self.lease,
                        finished,
                        len(requests) - len(finished),
                        token,
                        self.lane_width,
                        self.max_running,
                        self.prepare,
                    )
                self._watched("front", sent, batch)
                break
            except (errors.UniqueViolation, errors.TransactionRollback):
                # Another worker won a lane in the same instant (or PostgreSQL broke a deadlock
                # with it): nothing was written, ask again.
                continue
            except psycopg.OperationalError as error:
                if not lost_connection(error):
                    raise  # the server answered and refused: nothing was written
                # The answer was lost: the statement may have committed. Jobs leased under these
                # tokens are this worker's to run; were the completions not made, ask again.
                found = await self._recover([token], finished)
                if found is None:
                    continue
                batch = found
                break
        else:
            return [None] * len(requests)
        jobs = iter(batch.jobs)
        turns: list[Turn | None] = []
        for request in requests:
            completed = request is not None and request.id in batch.completed
            if request is not None and not completed:
                turns.append(Turn(False, None))  # its lease was lost: it takes nothing
            else:
                turns.append(Turn(completed, next(jobs, None)))
        # Slots the front of the line could not serve look lane by lane, until a look finds
        # nothing.
        for number, turn in enumerate(turns):
            if turn is None or turn.job is not None:
                continue
            if requests[number] is not None and not turn.completed:
                continue
            try:
                job = await self._by_lane()
            except psycopg.OperationalError:
                job = None  # the front's outcome stands; these slots ask again later
            if job is None:
                break
            turns[number] = Turn(turn.completed, job)
        return turns

    async def _by_lane(self) -> LeasedJob | None:
        races = looks = 0
        while races < RACES and looks < LOOKS:
            token = uuid4()
            sent = time.monotonic()
            try:
                async with self.pool.connection() as conn:
                    job, again = await take_by_lane(
                        conn,
                        self.store,
                        self.queue,
                        self.worker,
                        self.lease,
                        token,
                        self.lane_width,
                        self.max_running,
                        self.prepare,
                    )
                self._watched("by_lane", sent, Batch(frozenset(), [] if job is None else [job]))
            except (errors.UniqueViolation, errors.TransactionRollback):
                races += 1  # another taker won the slot, or a deadlock was broken: look again
                continue
            except psycopg.OperationalError as error:
                if not lost_connection(error):
                    raise  # refused, not lost: nothing was taken
                found = await self._recover([token], [])
                if found is not None and found.jobs:
                    return found.jobs[0]
                raise
            if job is not None or not again:
                return job
            looks += 1
        return None

    def _watched(self, statement: str, sent: float, batch: Batch) -> None:
        if self.watch is not None:
            self.watch(statement, time.monotonic() - sent, batch)

    async def _recover(self, tokens: Sequence[UUID], finished: Sequence[Finished]) -> Batch | None:
        """What a take whose answer was lost did; None when it did not commit. Asked through
        a short outage; when the database stays away, the OperationalError is raised (jobs it
        may have taken are reclaimed when their leases expire)."""
        what = f"queue {self.queue}: a take whose answer was lost"
        for delay in (*OUTAGE_BACKOFF, None):
            try:
                async with self.pool.connection() as conn:
                    batch, committed = await taken_by_tokens(
                        conn, self.store, self.worker, tokens, finished, self.max_attempts
                    )
            except psycopg.OperationalError as error:
                self.outage.lost(what, error)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                continue
            self.outage.reached(what)
            return batch if committed else None
        raise AssertionError("unreachable")
