"""The planner: `app.plan()`, a worker's planning round, and `app.prune()`.

- `Planner.plan()` (`app.plan()`) compares what should exist with what exists for every owner
  the source names (or the one owner asked for) and inserts the difference, reading the source
  in batches (synclane.batches: one serializable read and insert per batch). With `conn=` it runs
  in the caller's transaction instead.
- `Planner.round(queue)` is what a worker runs every `plan_interval`: only one process plans a
  queue at a time (a lease on the queue's planner row that the others do not wait for, and that
  ends when its round stops renewing it), and the round plans only what is due
  (synclane.rounds).
- `Planner.prune()` deletes finished rows nothing needs any more (synclane.pruning).

docs/planning.md explains the rules and the round; docs/operations.md the retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, TypeVar

import psycopg

from synclane.batches import BATCH, compare_steps, retrying
from synclane.connection import Database
from synclane.errors import OwnerSourceError
from synclane.model import ConfigError, JobType, Owner, WindowedType, check_name, check_slices
from synclane.owners import owner_batches
from synclane.pruning import prune_queue
from synclane.queues import Catalog, Queue
from synclane.rounds import LeaseGone, PlanningLease, Round, planning_lease
from synclane.steps import Steps, run, run_async

log = logging.getLogger("synclane")

T = TypeVar("T")

OwnerArg = Owner | str | None


class Planner:
    """Plans the queues of one catalog in one database."""

    def __init__(self, database: Database, catalog: Catalog, owners_timeout: timedelta) -> None:
        self.database = database
        self.catalog = catalog
        self.owners_timeout = owners_timeout

    @property
    def timeout_seconds(self) -> float:
        """owners_timeout in seconds, as the owner source reader takes it."""
        return self.owners_timeout.total_seconds()

    # -- app.plan(): compare everything --------------------------------------------------------

    def plan(
        self,
        queue: str | None = None,
        owner: OwnerArg = None,
        horizon: timedelta | None = None,
        type: str | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> dict[str, int]:
        """Insert the jobs that should exist and do not; returns how many per queue."""
        queues = self._queues(queue, owner, horizon, type)
        if conn is not None:
            self.database.check_schema()  # once per app: a clear SchemaError, not a raw one
        added: dict[str, int] = {}
        failed: list[OwnerSourceError] = []
        for q in queues:
            try:
                added[q.name] = self.plan_queue(q, owner, horizon, type, conn)
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
        owner: OwnerArg = None,
        horizon: timedelta | None = None,
        type: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> dict[str, int]:
        """plan() for code that runs an event loop: on an async connection of the caller's,
        inside its transaction, or (without one) in a thread. Owner sources run in a thread, so
        the loop never waits on them."""
        if conn is None:
            return await asyncio.to_thread(self.plan, queue, owner, horizon, type)
        queues = self._queues(queue, owner, horizon, type)
        await asyncio.to_thread(self.database.check_schema)
        added: dict[str, int] = {}
        failed: list[OwnerSourceError] = []
        for q in queues:
            try:
                added[q.name] = await self._plan_queue_async(q, owner, horizon, type, conn)
            except OwnerSourceError as error:
                if queue is not None:
                    raise
                log.error("%s", error)
                failed.append(error)
        if failed:
            raise OwnerSourceError(
                "; ".join(str(error) for error in failed) + f" (planned: {added})", added
            )
        return added

    async def _plan_queue_async(
        self,
        queue: Queue,
        owner: OwnerArg,
        horizon: timedelta | None,
        type: str | None,
        conn: psycopg.AsyncConnection[Any],
    ) -> int:
        types = self._types(queue, type)
        if not types:
            return 0
        batches = await asyncio.to_thread(lambda: iter(self._batches(queue, owner)))
        added = 0
        while (batch := await asyncio.to_thread(next, batches, None)) is not None:
            if batch:
                steps = compare_steps(queue, batch, types, horizon, whole=type is None, again=False)
                added += await run_async(conn, self.database.store, steps, caller=True)
        return added

    def _queues(
        self, queue: str | None, owner: OwnerArg, horizon: timedelta | None, type: str | None
    ) -> list[Queue]:
        if owner is not None and queue is None:
            raise ConfigError(
                "planning one owner needs its queue too, e.g. app.plan('shops', owner)"
            )
        queues = self.catalog.pick(queue)
        if horizon is not None:
            for q in queues:
                for job_type in q.types.values():
                    if isinstance(job_type, WindowedType) and type in (None, job_type.name):
                        check_slices(f"{q.name}.{job_type.name}", horizon, job_type.slice)
        for q in queues:
            self._types(q, type)
        return queues

    @staticmethod
    def _types(queue: Queue, type: str | None) -> list[JobType]:
        return [queue.job_type(type)] if type is not None else list(queue.types.values())

    def plan_queue(
        self,
        queue: Queue,
        owner: OwnerArg,
        horizon: timedelta | None,
        type: str | None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> int:
        types = self._types(queue, type)
        if not types:
            return 0
        added = planned = 0
        for batch in self._batches(queue, owner):
            if not batch:
                continue
            added += self._plan_batch(queue, batch, types, horizon, type is None, conn)
            planned += len(batch)
        if added:
            log.info(
                "planned %d new job(s) in queue %s for %d owner(s)", added, queue.name, planned
            )
        return added

    def _plan_batch(
        self,
        queue: Queue,
        batch: list[Owner],
        types: list[JobType],
        horizon: timedelta | None,
        whole: bool,
        conn: psycopg.Connection[Any] | None,
    ) -> int:
        def steps() -> Steps[int]:
            again = conn is None  # a caller's transaction cannot commit in between
            return compare_steps(queue, batch, types, horizon, whole=whole, again=again)

        if conn is not None:
            # The caller's transaction: what PostgreSQL rolls back there is the caller's to retry.
            return run(conn, self.database.store, steps(), caller=True)
        return retrying(lambda: self._on_shared(steps))

    def _on_shared(self, steps: Callable[[], Steps[T]]) -> T:
        with self.database.connection() as conn:
            return run(conn, self.database.store, steps())

    def _batches(self, queue: Queue, owner: OwnerArg) -> Iterable[list[Owner]]:
        if isinstance(owner, Owner):
            return [[owner.check()]]
        if owner is not None:
            check_name("owner", owner)
            # An owner that is not connected (any more) gets nothing planned.
            return [self._connected(queue, owner)]
        return owner_batches(queue, self.timeout_seconds, BATCH)

    def _connected(self, queue: Queue, owner: str) -> list[Owner]:
        """The owner of this id as the source names it, or nothing; stops reading the source
        once it is found."""
        for batch in owner_batches(queue, self.timeout_seconds, BATCH):
            for candidate in batch:
                if candidate.id == owner:
                    return [candidate]
        return []

    # -- a worker's round: plan what is due ----------------------------------------------------

    def plan_due(self, queue: str | None) -> dict[str, int]:
        """A planning round of each queue (or one); a queue another process is planning right now
        counts 0 added (that process plans it)."""
        self.database.check_schema()
        return {q.name: self.round(q.name) or 0 for q in self.catalog.pick(queue)}

    def round(self, queue_name: str) -> int | None:
        """One planning round of a queue: reconcile its owners when its `owners_interval` has
        passed, plan what is due, prune when its `retention` asks. Returns how many jobs were
        added, or None when another process is planning this queue now (this round is skipped,
        not waited for)."""
        queue = self.catalog.get(queue_name)
        if not queue.types or queue.owner_source is None:
            return 0
        work = self.database.connect()
        try:
            lease = PlanningLease(
                work, self.database.store, queue.name, planning_lease(self.owners_timeout)
            )
            if not lease.take():
                return None
            try:
                return Round(self.database, queue, work, self.timeout_seconds, lease).run()
            except LeaseGone as gone:
                log.warning("%s; this round ends here", gone)
                return None
            finally:
                with contextlib.suppress(psycopg.Error):
                    lease.release()
        finally:
            work.close()

    # -- retention ---------------------------------------------------------------------------

    def prune(self, queue: str | None, older_than: timedelta) -> int:
        """Delete the finished rows older than `older_than` that nothing reads any more."""
        queues = self.catalog.pick(queue)
        self.database.check_schema()
        return sum(prune_queue(self.database, q, older_than) for q in queues)
