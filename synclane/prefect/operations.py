"""What the Prefect flows do, as plain functions: no Prefect import here, so each is tested
against PostgreSQL without a Prefect server.

The flows in `synclane.prefect.flows` only resolve the app, call these, and publish the result
as logs and artifacts.
"""

from __future__ import annotations

import difflib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from synclane.app import SyncLane
from synclane.hosting import AWAY, run_until_stopped, through_outage
from synclane.loading import load_app, split_app_path
from synclane.model import ConfigError, WindowedType
from synclane.worker.outage import Outage

__all__ = ["load_app", "split_app_path"]  # re-exported: the flows and the block load apps here

if TYPE_CHECKING:
    from synclane.worker import Worker

log = logging.getLogger("synclane")

Row = dict[str, Any]

# How long a work run works before it hands its jobs back and ends (a successor follows): long
# enough that starting a run is a small cost, short enough that new code and a lost machine
# are picked up within minutes.
WORK_BUDGET_SECONDS = 540
# How long a page in flight may take to end once a work run's budget is used (or the run is
# cancelled): well within the 10-minute schedule of a 540 s budget.
STOP_GRACE_SECONDS = 30

# -- the app -------------------------------------------------------------------------------


def check_queues(app: SyncLane, names: Sequence[str] | None) -> list[str]:
    """The queue names a flow run was given, checked: each must be declared by the app. A
    misspelt name (typed in a deployment's parameters) gets the declared name it is closest to,
    not advice to declare it."""
    if names is None:
        return list(app.queues)
    if isinstance(names, str):
        names = [names]
    declared = list(app.queues)
    for name in names:
        if name in app.queues:
            continue
        close = difflib.get_close_matches(str(name), declared, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"unknown queue {name!r}: {hint}the app declares {', '.join(map(repr, declared))}; "
            "fix the flow run's queue parameter"
        )
    return list(names)


# -- reports -------------------------------------------------------------------------------


def progress_rows(
    app: SyncLane,
    queue: str,
    *,
    owners: Sequence[str] | None = None,
    type: str | None = None,
) -> list[Row]:
    """`app.progress(queue)` as JSON-safe rows (one per owner and type; timestamps in ISO 8601,
    missing values as None), ready for a table artifact."""
    frame = app.progress(queue, limit=None)
    if owners is not None:
        frame = frame[frame["owner"].isin(list(owners))]
    if type is not None:
        frame = frame[frame["type"] == type]
    frame.insert(0, "queue", queue)
    rows: list[Row] = json.loads(frame.to_json(orient="records", date_format="iso"))
    return rows


def slices(rows: Sequence[Row]) -> tuple[int, int]:
    """(loaded, total) history slices in these progress rows."""
    total = sum(int(row.get("slices_total") or 0) for row in rows)
    done = sum(int(row.get("slices_completed") or 0) for row in rows)
    return done, total


def loaded_percent(rows: Sequence[Row]) -> float:
    """How much of the history in these progress rows is loaded, 0 to 100 (100 when there is
    none to load)."""
    done, total = slices(rows)
    return 100.0 if total == 0 else round(100.0 * done / total, 1)


def plan_summary(added: dict[str, int], progress: dict[str, list[Row]]) -> str:
    """A markdown summary of a planning run: per queue, what was added and how far history is."""
    lines = [
        "# synclane plan",
        "",
        "| queue | jobs added | owners | history slices loaded | loaded |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for queue, count in added.items():
        rows = progress.get(queue, [])
        owners = len({row["owner"] for row in rows})
        done, total = slices(rows)
        lines.append(
            f"| {queue} | {count} | {owners} | {done} / {total} | {loaded_percent(rows):.1f} % |"
        )
    failing = [
        row for rows in progress.values() for row in rows if int(row.get("slices_failed") or 0)
    ]
    if failing:
        lines += ["", "Failing history slices (see `app.failures()` or the requeue flow):", ""]
        lines += [
            f"- {row['queue']} · {row['owner']} · {row['type']}: {row['slices_failed']}"
            for row in failing
        ]
    return "\n".join(lines) + "\n"


# Compared to decide whether a progress table changed: what a person acts on (slices loaded and
# failing, the state), not the record counts and coverage that move with every refresh; the
# coverage end counts by its day, so a steady system still publishes about once a day.
_SHAPE = ("owner", "type", "state", "slices_total", "slices_completed", "slices_failed")


def progress_shape(rows: Sequence[Row]) -> list[tuple[Any, ...]]:
    """What of a progress table decides whether it is worth a new artifact version."""
    return sorted(
        (*(row.get(name) for name in _SHAPE), str(row.get("coverage_end") or "")[:10])
        for row in rows
    )


def worth_publishing(
    rows: Sequence[Row],
    previous: Sequence[Row] | None,
    previous_at: datetime | None,
    now: datetime,
    every: timedelta,
) -> bool:
    """Whether a progress table gets a new artifact version: when there is none yet, or when the
    progress changed and the latest version is at least `every` old. Planning every minute then
    adds a version only when something a person acts on moved, and at most one per `every`."""
    if previous is None or previous_at is None:
        return True
    if progress_shape(rows) == progress_shape(previous):
        return False
    return now - previous_at >= every


# -- working -------------------------------------------------------------------------------


def run_worker_until_stopped(
    worker: Worker,
    *,
    poll_seconds: float = 0.5,
    stop_timeout: float | None = None,
    between_polls: Callable[[], object] | None = None,
) -> dict[str, int]:
    """Run `worker` in a thread of its own and wait for its report (synclane.hosting): whatever
    interrupts the waiting thread (Prefect's `TerminationSignal` when a run is cancelled, a
    `KeyboardInterrupt`) stops the worker through `Worker.stop()`, and each running job goes
    back to `pending` with its last saved cursor. The wait for that hand-back lasts the worker's
    stop grace plus a minute unless `stop_timeout` says otherwise. The worker thread runs in a
    copy of the caller's context, so that log lines of the `synclane` logger are attributed to
    the caller's Prefect flow run. `between_polls` runs in the waiting thread (sending what the
    listeners collected)."""
    if stop_timeout is None:
        stop_timeout = worker.stop_grace.total_seconds() + 60.0
    return run_until_stopped(
        worker, poll_seconds=poll_seconds, stop_timeout=stop_timeout, between_polls=between_polls
    )


# -- backfill ------------------------------------------------------------------------------


def widen_history(
    app: SyncLane,
    queue: str,
    type: str,
    horizon: timedelta | float,
    owners: Sequence[str] | None = None,
) -> int:
    """Plan the older history slices of a windowed type back to `horizon`, for every connected
    owner or only `owners`. Existing slices never move; only missing older ones are added.
    Returns how many slices the wider horizon added to their histories: a history keeps only its
    newest open slices as rows, so most of them are planned as the open ones finish
    (docs/planning.md, lazy history)."""
    job_type = app.get_queue(queue).job_type(type)
    if not isinstance(job_type, WindowedType):
        raise ConfigError(
            f"{queue}.{type} is a snapshot type: it has no history to widen; a backfill needs a "
            "windowed type"
        )
    if owners is not None:
        connected = {owner.id for owner in app.connected_owners(queue)}
        unknown = [owner for owner in owners if owner not in connected]
        if unknown:
            known = ", ".join(sorted(connected)[:10]) or "none"
            raise ConfigError(
                f"owner(s) {', '.join(map(repr, unknown))} are not connected in queue {queue!r} "
                f"(connected: {known}); the planner only plans connected owners"
            )
    before = slices(progress_rows(app, queue, owners=owners, type=type))[1]
    if owners is None:
        app.plan(queue, horizon=horizon, type=type)
    for owner in owners or ():
        app.plan(queue, owner, horizon=horizon, type=type)
    return slices(progress_rows(app, queue, owners=owners, type=type))[1] - before


@dataclass(frozen=True)
class History:
    """Where the history slices of one type stand (for some owners, or all)."""

    total: int
    loaded: int
    abandoned: int
    cancelled: int

    @property
    def open(self) -> int:
        """Slices that may still load: pending, running, or failed and waiting for a retry."""
        return self.total - self.loaded - self.abandoned - self.cancelled

    @property
    def settled(self) -> bool:
        """Every slice is loaded or stopped for good (abandoned, cancelled)."""
        return self.open == 0

    @property
    def percent(self) -> float:
        return 100.0 if self.total == 0 else round(100.0 * self.loaded / self.total, 1)

    def describe(self) -> str:
        parts = [f"{self.loaded} of {self.total} slice(s) loaded ({self.percent:.1f} %)"]
        for count, what in (
            (self.abandoned, "abandoned"),
            (self.cancelled, "cancelled"),
            (self.open, "still open"),
        ):
            if count:
                parts.append(f"{count} {what}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "slices": self.total,
            "loaded": self.loaded,
            "abandoned": self.abandoned,
            "cancelled": self.cancelled,
            "open": self.open,
            "percent": self.percent,
        }


def history_of(
    app: SyncLane, queue: str, type: str, owners: Sequence[str] | None, rows: Sequence[Row]
) -> History:
    """The history of `type` from its progress rows, with the abandoned slices counted apart
    from those still retrying (progress() counts both as failed)."""
    abandoned = app.jobs(queue, status="abandoned", type=type, limit=100_000)
    abandoned = abandoned[abandoned["mode"] == "initial"]
    if owners is not None:
        abandoned = abandoned[abandoned["owner"].isin(list(owners))]
    return History(
        total=sum(int(row.get("slices_total") or 0) for row in rows),
        loaded=sum(int(row.get("slices_completed") or 0) for row in rows),
        abandoned=len(abandoned),
        cancelled=sum(int(row.get("slices_cancelled") or 0) for row in rows),
    )


def watch_history(
    app: SyncLane,
    queue: str,
    type: str,
    owners: Sequence[str] | None,
    *,
    budget_seconds: float,
    poll_seconds: float,
    report: Callable[[History, list[Row]], None],
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[History, list[Row]]:
    """Report where the history of `type` stands (for `owners`, or all) every `poll_seconds`,
    until every slice is loaded or stopped for good, or `budget_seconds` have passed. Returns
    the last state and progress rows. Workers do the loading; this only looks. A look that
    cannot reach the database (a restart) is said once and tried again at the next poll, as
    long as the budget lasts; the first look waits for the database as `through_outage` does."""
    deadline = time.monotonic() + budget_seconds
    outage = Outage()

    def look() -> tuple[History, list[Row]]:
        rows = progress_rows(app, queue, owners=owners, type=type)
        return history_of(app, queue, type, owners, rows), rows

    history, rows = through_outage(look, f"the backfill of {queue}.{type}")
    while True:
        report(history, rows)
        remaining = deadline - time.monotonic()
        if history.settled or remaining <= 0:
            return history, rows
        sleep(min(poll_seconds, remaining))
        what = f"the backfill of {queue}.{type}"
        try:
            history, rows = look()
        except AWAY as error:
            outage.lost(what, error)
        else:
            outage.reached(what)
