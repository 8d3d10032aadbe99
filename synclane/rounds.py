"""A worker's planning round of one queue: knowing the owners, planning what is due, pruning.

`Planner.round(queue)` takes the queue's planning lock and runs a `Round` on a connection of its
own (docs/planning.md, "Planning in the background"). The round reconciles the owner source
with the owners table every `owners_interval`, then plans only what is due: the owners that
never had a plan, and each type once per period (or when its horizon widened), found through the
owners table and `planned_types` without reading any owner when nothing is due. It also prunes
the queue when it has a `retention`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar
from uuid import uuid4

import psycopg
from psycopg.rows import dict_row

from synclane import planning
from synclane.batches import BATCH, pass_steps, plan_steps, retrying
from synclane.connection import Database
from synclane.errors import OwnerSourceError
from synclane.model import JobType, Owner, WindowedType
from synclane.owners import admit, owner_batches
from synclane.pruning import PRUNE_EVERY, prune_queue
from synclane.queues import Queue
from synclane.steps import Steps, run

log = logging.getLogger("synclane")

T = TypeVar("T")

# During a long reconciliation or prune, how often the round stops to plan what became due.
DUE_CHECK_EVERY = 10.0
# The shortest planning lease: a round renews it before each batch, which may take a few seconds.
SHORTEST_LEASE = timedelta(seconds=5)


def planning_lease(owners_timeout: timedelta) -> timedelta:
    """How long a round is elected without a renewal: twice as long as an owner source may take
    for a batch (between two renewals the round reads one batch and plans it)."""
    return max(2 * owners_timeout, SHORTEST_LEASE)


class LeaseGone(Exception):
    """The round's planning lease ended and another round took it: this process was stopped
    (or cut off) for longer than its lease. The round ends where it is."""


class PlanningLease:
    """The lease one planning round holds on its queue's row of the planner table: only one
    round plans a queue at a time, across every process, and a round whose process stops
    (SIGSTOP, a frozen machine, a crash) keeps the others out only until its lease ends. A row,
    not a session's lock: it needs no connection kept open and holds through a pooler."""

    def __init__(
        self, conn: psycopg.Connection[Any], store: Any, queue: str, duration: timedelta
    ) -> None:
        self.conn = conn
        self.store = store
        self.duration = duration
        self.params = {"queue": queue, "token": uuid4(), "lease": duration}

    def take(self) -> bool:
        """Takes the lease; False when another round holds it."""
        row = self.conn.execute(self.store.query("take_planning_lease"), self.params).fetchone()
        return row is not None

    def hold(self) -> None:
        """Renews the lease before the next batch; LeaseGone when another round started since."""
        renewed = self.conn.execute(self.store.query("renew_planning_lease"), self.params)
        if renewed.fetchone() is None:
            raise LeaseGone(
                f"queue {self.params['queue']!r}: another process plans it now (this planner "
                f"was stopped for longer than its planning lease, {self.duration})"
            )

    def release(self) -> None:
        self.conn.execute(self.store.query("release_planning_lease"), self.params)


class Round:
    """One elected planning round of one queue, on the round's work connection."""

    def __init__(
        self,
        database: Database,
        queue: Queue,
        conn: psycopg.Connection[Any],
        owners_timeout: float,
        lease: PlanningLease,
    ) -> None:
        self.database = database
        self.queue = queue
        self.conn = conn
        self.owners_timeout = owners_timeout
        self.lease = lease
        self.store = database.store
        self.types = list(queue.types.values())
        self.added = 0
        self._last_due = 0.0

    def run(self) -> int:
        (clock,) = self._fetch("planner_clock", {"queue": self.queue.name})
        now: datetime = clock["now"]
        failure: OwnerSourceError | None = None
        reconciled = clock["owners_reconciled_at"]
        if reconciled is None or now - reconciled >= self.queue.settings.owners_interval:
            try:
                self.reconcile()
            except OwnerSourceError as error:
                failure = error
        self.plan_due()
        retention = self.queue.settings.retention
        if retention is not None:
            pruned = clock["pruned_at"]
            if pruned is None or now - pruned >= min(PRUNE_EVERY, retention):
                deleted = prune_queue(self.database, self.queue, retention, self._now_and_then)
                self._execute("queue_pruned", {"queue": self.queue.name})
                if deleted:
                    log.info(
                        "queue %s: pruned %d finished row(s) older than %s",
                        self.queue.name,
                        deleted,
                        retention,
                    )
        if self.added:
            log.info("queue %s: planned %d new job(s)", self.queue.name, self.added)
        if failure is not None:
            raise OwnerSourceError(str(failure), {self.queue.name: self.added})
        return self.added

    def _fetch(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(self.store.query(name), params).fetchall()

    def _execute(self, name: str, params: dict[str, Any]) -> int:
        return self.conn.execute(self.store.query(name), params).rowcount

    def _now_and_then(self) -> None:
        """Between the batches of a long reconciliation or prune: plan what became due."""
        self.lease.hold()
        if time.monotonic() - self._last_due >= DUE_CHECK_EVERY:
            self.plan_due()

    # -- knowing the owners ------------------------------------------------------------------

    def reconcile(self) -> None:
        """Read the owner source to its end: register new owners (they are planned at once),
        move re-laned ones, and, only when the source was read to its end, remove the owners it
        no longer names (their jobs stay)."""
        queue = self.queue.name
        # The owners named so far, in this process: the source is read across many transactions,
        # which behind a transaction pooler run on different server connections, so a session's
        # temporary table would not be there for the next one. A million ids take about 90 MB.
        seen: set[str] = set()
        for batch in owner_batches(self.queue, self.owners_timeout, BATCH):
            if not batch:
                continue
            known = self._plan(partial(admit, queue, batch))
            seen.update(o.id for o in batch)
            # New owners get their first plan while the source streams, batch by batch.
            if any(o.id in known and not known[o.id].planned for o in batch):
                self.plan_due()
            else:
                self._now_and_then()
        removed = self._sweep(seen)
        if removed:
            log.info(
                "queue %s: %d owner(s) no longer named by the owner source, nothing more is "
                "planned for them (their open jobs stay; cancel them with app.cancel): %s",
                queue,
                len(removed),
                ", ".join(removed[:3]) + ("…" if len(removed) > 3 else ""),
            )
        self._execute("owners_reconciled", {"queue": queue})

    def _sweep(self, seen: set[str]) -> list[str]:
        """Remove the owners the source no longer names, walking the owners table in key order
        a page at a time (a million names sent as one array took psycopg 400 MiB to adapt).
        Returns the names removed, in key order."""
        removed: list[str] = []
        after = ""
        while True:
            params = {"queue": self.queue.name, "after": after, "limit": BATCH}
            page = [row["owner"] for row in self._fetch("owners_after", params)]
            if not page:
                return removed
            after = page[-1]
            gone = [owner for owner in page if owner not in seen]
            if gone:
                deleted = self._fetch("sweep_owners", {"queue": self.queue.name, "gone": gone})
                removed.extend(sorted(row["owner"] for row in deleted))
            self._now_and_then()

    # -- planning what is due ------------------------------------------------------------------

    def plan_due(self) -> None:
        """Plan the owners that never had a plan, then every type whose period started (or
        whose horizon widened) since every owner was last planned for it. With nothing due this
        is three short reads."""
        self.lease.hold()
        self._last_due = time.monotonic()
        queue = self.queue.name
        while True:
            rows = self._fetch("unplanned_owners", {"queue": queue, "limit": BATCH})
            if not rows:
                break
            owners = [Owner(r["owner"], r["lane"]) for r in rows]
            self.added += self._plan(partial(plan_steps, self.queue, owners, self.types, None))
        (clock,) = self._fetch("database_now", {})
        state = {r["type"]: r for r in self._fetch("planned_types", {"queue": queue})}
        for job_type in self.types:
            period = planning.period_start(clock["now"], job_type.every)
            horizon = job_type.horizon if isinstance(job_type, WindowedType) else None
            if not _due(state.get(job_type.name), period, horizon):
                continue
            self._pass(job_type, period, horizon, state.get(job_type.name))

    def _pass(
        self,
        job_type: JobType,
        period: datetime,
        horizon: timedelta | None,
        state: dict[str, Any] | None,
    ) -> None:
        """Plan every owner for one type, in batches in owner order; each batch commits where
        the pass has come with its jobs, so a pass cut short continues from there."""
        queue = self.queue.name
        after = ""
        if state and state["pass_period"] == period and state["pass_horizon"] == horizon:
            after = state["pass_after"] or ""  # a pass of this period was cut short
        while True:
            params = {"queue": queue, "after": after, "limit": BATCH}
            rows = self._fetch("owners_after", params)
            if not rows:
                break
            owners = [Owner(r["owner"], r["lane"]) for r in rows]
            after = owners[-1].id
            progress = {
                "queue": queue,
                "type": job_type.name,
                "period": period,
                "horizon": horizon,
                "after": after,
            }
            self.added += self._plan(partial(pass_steps, self.queue, owners, job_type, progress))
        done = {"queue": queue, "type": job_type.name, "period": period, "horizon": horizon}
        self._execute("pass_done", done)

    def _plan(self, steps: Callable[[], Steps[T]]) -> T:
        """Run steps on the round's connection, again when PostgreSQL broke a race; the lease
        is renewed first, and a transaction its client leaves idle ends with the lease."""
        self.lease.hold()
        idle = self.lease.duration
        return retrying(lambda: run(self.conn, self.store, steps(), idle_timeout=idle))


def _due(state: dict[str, Any] | None, period: datetime, horizon: timedelta | None) -> bool:
    """Whether a type needs a pass over every owner: a period began since the last pass, or the
    horizon is wider than any pass used."""
    if state is None or state["period"] is None or state["period"] < period:
        return True
    return horizon is not None and (state["horizon"] is None or state["horizon"] < horizon)
