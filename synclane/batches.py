"""Planning a batch of owners: the steps `app.plan()`, a worker's planning round and a caller's
connection (`conn=`) share.

For a batch, one SERIALIZABLE transaction holds one read of what exists (`plan_read`), the
histories rows to write (`record_histories`) and one insert of what is missing (`insert_jobs`,
ON CONFLICT DO NOTHING). Owners whose histories row changed while the database may be planning
their slices under the old one get their older slices in a second transaction
(planning.plan_history, "deferred"). Planners that run at the same
instant are kept apart by the dedup index; planners whose read and insert straddle a period edge
or midnight (so that their keys differ) by serializable isolation, which makes one of them read
again. Rows are inserted in one stable order, so that two planners never lock keys in opposite
orders; a deadlock or a serialization failure PostgreSQL reports anyway is retried (`retrying`).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg

from synclane import planning
from synclane.model import JobType, Owner, WindowedType
from synclane.owners import Known, admit
from synclane.queues import Queue
from synclane.steps import Atomic, Execute, Fetch, Steps
from synclane.wakeup import work_added

T = TypeVar("T")

# Owners per planning transaction: memory and the length of a transaction stay bounded by it.
BATCH = 5_000
# How often a transaction PostgreSQL rolled back to break a race (a serialization failure, a
# deadlock) is tried, with a growing random pause in between.
ATTEMPTS = 20
# What PostgreSQL raises to break a race, asking for the transaction to be tried again.
RACES = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.TransactionRollback,
)


def retrying(attempt: Callable[[], T]) -> T:
    """Run `attempt` again when PostgreSQL rolled it back to break a race between planners (a
    serialization failure or a deadlock), after a growing random pause."""
    for number in range(1, ATTEMPTS + 1):
        try:
            return attempt()
        except RACES:
            # Another planner wrote what we read in the same instant; read again.
            if number == ATTEMPTS:
                raise
            time.sleep(random.uniform(0, min(0.5, 0.005 * 2**number)))
    raise AssertionError("unreachable")


def plan_steps(
    queue: Queue,
    owners: list[Owner],
    types: Sequence[JobType],
    horizon: timedelta | None,
    *,
    whole: bool = True,
    again: bool = True,
) -> Steps[int]:
    """Register these owners (moving re-laned ones), then one serializable read and insert for
    them; marks them planned when every type was (`whole`). Owners whose older slices waited for
    their histories row are planned again in a transaction of their own (`again`; not inside a
    caller's transaction, where the next plan does it)."""
    known: dict[str, Known] = yield from admit(queue.name, owners)
    first = [o.id for o in owners if whole and o.id in known and not known[o.id].planned]

    def steps() -> Steps[Planned]:
        planned: Planned = yield from read_and_insert(queue, owners, types, horizon)
        if first:
            # In the transaction of the insert: retried with it, counted once.
            yield Execute("mark_planned", {"queue": queue.name, "owners": first})
        return planned

    planned: Planned = yield Atomic(steps, serializable=True)
    added: int = yield from plan_deferred(queue, owners, types, horizon, planned, again)
    return added


def compare_steps(
    queue: Queue,
    owners: list[Owner],
    types: Sequence[JobType],
    horizon: timedelta | None,
    *,
    whole: bool = True,
    again: bool = True,
) -> Steps[int]:
    """`app.plan()`'s batch: one statement compares the owners with the owners table and with
    their rows (`unsettled_owners`, the test of planning.settled, on the database clock); only
    the owners it names are registered, read and planned (`plan_steps`). An owner marked settled
    is not tested again until its mark ends (docs/planning.md, "Settled owners"): with nothing
    new that is two short statements, one index lookup an owner, and no row sent back. A plan of
    every type with the declared horizons (`whole`, no `horizon`) reads and writes the marks;
    the marks of the owners it finds settled are written in a statement of their own, unless
    the plan runs in the caller's transaction (`again` False)."""
    ahead = planning.ahead_for(queue.settings.lane_width)
    by = settled_by(types, ahead) if whole and horizon is None else None

    def compare() -> Steps[list[dict[str, Any]]]:
        if again:  # synclane's own transaction, not the caller's
            yield Execute("without_jit", {})
        (clock,) = yield Fetch("database_now", {})
        marks = [planning.marks(t, clock["now"], horizon, ahead) for t in types]
        rows: list[dict[str, Any]] = yield Fetch(
            "unsettled_owners",
            {
                "queue": queue.name,
                "owners": [o.id for o in owners],
                "lanes": [o.lane_key for o in owners],
                "types": [t.name for t in types],
                "windowed": [isinstance(t, WindowedType) for t in types],
                "history_from": [m.history_from for m in marks],
                "period_from": [m.period_from for m in marks],
                "period_to": [m.period_to for m in marks],
                "covered_to": [m.covered_to for m in marks],
                "slices": [m.slice for m in marks],
                "aheads": [m.ahead for m in marks],
                "settled_by": by,
                "mark": by is not None and again,
                # history's limit moves at midnight
                "midnight": planning.midnight(clock["now"]) + timedelta(days=1),
            },
        )
        return rows

    # One transaction: the marks' instants and the statement's now() are one instant.
    rows: list[dict[str, Any]] = yield Atomic(compare)
    if not rows:
        return 0
    settled = [r for r in rows if not r["plan"]]
    if settled:
        # The epoch the comparison read with the rows: a change committed since has moved it on.
        mark = {
            "queue": queue.name,
            "owners": [r["owner"] for r in settled],
            "untils": [r["until"] for r in settled],
            "opens": [r["open"] for r in settled],
            "epoch": settled[0]["epoch"],
            "settled_by": by,
        }
        # A role that may only read (an analyst's) plans without marks, as before schema 7.
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            yield Execute("mark_settled", mark)
    by_id = {o.id: o for o in owners}
    unsettled = [by_id[r["owner"]] for r in rows if r["plan"]]
    if not unsettled:
        return 0
    count: int = yield from plan_steps(queue, unsettled, types, horizon, whole=whole, again=again)
    return count


def settled_by(types: Sequence[JobType], ahead: int) -> str:
    """The settings an owner's settled mark was checked with (owners.settled_by): each type's
    name, kind and periods, and the open slices a history keeps. A mark checked with other
    settings (a type added, a horizon changed) does not count."""
    parts = []
    for t in types:
        if isinstance(t, WindowedType):
            parts.append(f"{t.name}: windowed {t.horizon} {t.slice} {t.every} {t.overlap}")
        else:
            parts.append(f"{t.name}: snapshot {t.every}")
    return "; ".join([*parts, f"ahead {ahead}"])


def pass_steps(
    queue: Queue, owners: list[Owner], job_type: JobType, progress: dict[str, Any]
) -> Steps[int]:
    """One batch of a pass over a type's owners: plan them, and record how far the pass came,
    in one transaction."""

    def steps() -> Steps[Planned]:
        planned: Planned = yield from read_and_insert(queue, owners, [job_type], None)
        yield Execute("pass_progress", progress)
        return planned

    planned: Planned = yield Atomic(steps, serializable=True)
    added: int = yield from plan_deferred(queue, owners, [job_type], None, planned, True)
    return added


@dataclass(frozen=True)
class Planned:
    """What one read and insert did: how many jobs it added, and the owners whose older slices
    wait for the histories row it wrote to be committed."""

    added: int
    deferred: tuple[str, ...] = ()


def plan_deferred(
    queue: Queue,
    owners: list[Owner],
    types: Sequence[JobType],
    horizon: timedelta | None,
    planned: Planned,
    again: bool,
) -> Steps[int]:
    """After the transaction that changed their histories rows: the deferred owners' older
    slices, in a serializable transaction of their own (their rows are now what the rule says,
    so this one writes none and defers nothing)."""
    if not planned.deferred or not again:
        return planned.added
    waiting = set(planned.deferred)
    later = [o for o in owners if o.id in waiting]

    def steps() -> Steps[Planned]:
        return (yield from read_and_insert(queue, later, types, horizon))

    second: Planned = yield Atomic(steps, serializable=True)
    return planned.added + second.added


def read_and_insert(
    queue: Queue, owners: list[Owner], types: Sequence[JobType], horizon: timedelta | None
) -> Steps[Planned]:
    """One read of what exists for these owners and types, the histories rows to write, and one
    insert of what is missing."""
    by_id = {o.id: o for o in owners}
    rows: list[dict[str, Any]] = yield Fetch(
        "plan_read",
        {
            "queue": queue.name,
            "owners": list(by_id),
            "types": [t.name for t in types],
            "windowed": [isinstance(t, WindowedType) for t in types],
        },
    )
    shapes = Shapes(planning.ahead_for(queue.settings.lane_width))
    for row in rows:
        owner = by_id[row["owner"]]
        existing = planning.Existing(
            oldest_initial_start=row["oldest_initial_start"],
            oldest_initial_status=row["oldest_initial_status"],
            open_initial=row["open_initial"],
            history_from=row["history_from"],
            history_slice=row["history_slice"],
            history_ahead=row["history_ahead"],
            coverage_end=row["coverage_end"],
            coverage_mode=row["coverage_mode"],
            initial_created_at=row["initial_created_at"],
            last_created_at=row["last_created_at"],
            open_recurring=row["open_recurring"],
            open_any=row["open_any"],
        )
        # The lane the owners table plans the owner into (its open jobs are there), else the
        # source's.
        lane = row["lane"] or owner.lane_key
        shapes.add(owner.id, lane, queue.types[row["type"]], existing, row["now"], horizon)
    if shapes.histories:
        # Before the insert: the database plans slices under these rows, and a slice it plans
        # now waits for them (schema.sql, plan_older_slices) instead of racing this transaction.
        yield Execute("record_histories", shapes.history_params(queue.name))
    added = 0
    if shapes.owners:
        added = yield Execute("insert_jobs", shapes.params(queue.name))
        if added:
            yield from work_added(queue.name)
    return Planned(added, tuple(shapes.deferred))


_Job = tuple[str, str, int, datetime | None, datetime | None, str]
_PLACEHOLDER = Owner("?")


class Shapes:
    """The missing jobs of a batch, grouped by shape: owners whose jobs differ only in owner and
    lane (every first plan of a batch, for one) share one list of jobs, which the insert
    multiplies out in the database. The planning rule is computed once per shape of what exists,
    not once per owner."""

    def __init__(self, ahead: int = planning.DEFAULT_AHEAD) -> None:
        self.ahead = ahead
        self.owners: dict[str, list[_Job]] = {}
        self.lanes: dict[str, str] = {}
        self.histories: list[tuple[str, str, planning.History]] = []
        self.deferred: list[str] = []
        self._rules: dict[
            tuple[str, planning.Existing, datetime, timedelta | None],
            tuple[list[_Job], planning.Missing],
        ] = {}

    def add(
        self,
        owner: str,
        lane: str,
        job_type: JobType,
        existing: planning.Existing,
        now: datetime,
        horizon: timedelta | None,
    ) -> None:
        key = (job_type.name, existing, now, horizon)
        rule = self._rules.get(key)
        if rule is None:
            found = planning.missing(job_type, _PLACEHOLDER, existing, now, horizon, self.ahead)
            made: list[_Job] = [
                (j.type, j.mode, j.priority, j.window_start, j.window_end, j.dedup_key)
                for j in found.jobs
            ]
            rule = self._rules[key] = (made, found)
        jobs, found = rule
        if jobs:
            self.owners.setdefault(owner, []).extend(jobs)
            self.lanes[owner] = lane
        if found.history is not None:
            self.histories.append((owner, job_type.name, found.history))
        if found.deferred and owner not in self.deferred:
            self.deferred.append(owner)

    def history_params(self, queue: str) -> dict[str, Any]:
        rows = sorted(self.histories, key=lambda row: (row[0], row[1]))
        return {
            "queue": queue,
            "owners": [owner for owner, _, _ in rows],
            "types": [type_name for _, type_name, _ in rows],
            "froms": [h.history_from for _, _, h in rows],
            "slices": [h.slice for _, _, h in rows],
            "aheads": [h.ahead for _, _, h in rows],
        }

    def params(self, queue: str) -> dict[str, Any]:
        numbers: dict[tuple[_Job, ...], int] = {}
        owner_shapes = []
        for jobs in self.owners.values():
            owner_shapes.append(numbers.setdefault(tuple(jobs), len(numbers)))
        columns: list[list[Any]] = [[] for _ in range(7)]
        for shape, number in numbers.items():
            for job in shape:
                for column, value in zip(columns, (number, *job), strict=True):
                    column.append(value)
        return {
            "queue": queue,
            "owners": list(self.owners),
            "lanes": [self.lanes[o] for o in self.owners],
            "owner_shapes": owner_shapes,
            "shapes": columns[0],
            "types": columns[1],
            "modes": columns[2],
            "priorities": columns[3],
            "starts": columns[4],
            "ends": columns[5],
            "keys": columns[6],
        }
