"""What a work run under an orchestrator alerts a team to, the same under Prefect and Dagster.

A worker tells of each job that failed, was deferred or abandoned (synclane.events). A team is
alerted per owner and per cause, not per job: an account whose API is broken for good makes a
new refresh job every period, each abandoned in turn, and each would otherwise alert again. So:

- a job's cause is its error as `app.failures()` groups it (the first line, numbers and ids
  masked) with the cause's 8-hex id, the one `requeue(cause_id=...)` takes;
- an abandoned job whose queue and owner already have an older abandoned job with that cause
  is a *repeat*: that cause already waits for a human. Requeued, those jobs are no longer
  abandoned, so the next abandonment for the cause is new again; another cause is new too;
- a work run fails for the new causes abandoned in it (`new_causes`), with one message
  (`alert`) that says how to stop it: requeue once fixed, or take the account out and cancel.

`Causes` is the worker listener that keeps the events and hands them out, with their causes, in
the orchestrator's own thread (`take`): one statement per batch, never on the worker's loop.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import psycopg

from synclane.app import SyncLane
from synclane.events import Event, Kind
from synclane.hosting import AWAY

log = logging.getLogger("synclane")

# The kinds whose error has a cause worth naming.
WITH_CAUSE: tuple[Kind, ...] = ("failed", "deferred", "abandoned")
# After a look-up that found the database away, events wait this long for the next one.
_AWAY_PAUSE = 5.0


@dataclass(frozen=True)
class Noted:
    """An event and what is known about its cause (nothing when the database was away)."""

    event: Event
    cause: str | None = None  # the error as failures() groups it
    cause_id: str | None = None  # its 8 hex digits
    repeat: bool = False  # abandoned for a cause that already waited for a human

    @property
    def new_abandonment(self) -> bool:
        return self.event.kind == "abandoned" and not self.repeat


class Causes:
    """A worker listener that keeps the events of `kinds` (every kind when None), and hands
    them out in order with their causes through `take()`, which reads the database: call it
    from the orchestrator's thread, never from a listener."""

    def __init__(
        self,
        app: SyncLane,
        kinds: Iterable[Kind] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.kinds = None if kinds is None else frozenset(kinds)
        self._arrived: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._waiting: list[Event] = []
        self._clock = clock
        self._away_until = 0.0
        self._said = False

    def __call__(self, event: Event) -> None:
        if self.kinds is None or event.kind in self.kinds:
            self._arrived.put(event)

    def take(self, *, final: bool = False) -> list[Noted]:
        """The events since the last call, each with its cause. While the database is away
        they wait for the next call; with `final` (the run is ending) they are handed out
        without causes, and an abandoned one counts as new: an alert too many rather than one
        missed."""
        while not self._arrived.empty():
            self._waiting.append(self._arrived.get_nowait())
        events, self._waiting = self._waiting, []
        if not any(e.kind in WITH_CAUSE and e.error for e in events):
            return [Noted(event) for event in events]
        if self._clock() >= self._away_until or final:
            try:
                return self._with_causes(events)
            except AWAY:
                self._away_until = self._clock() + _AWAY_PAUSE
            except psycopg.Error as error:  # a mistake of ours costs the causes, never the run
                if not self._said:
                    self._said = True
                    log.warning("could not read the causes of the run's events: %s", error)
                return [Noted(event) for event in events]
        if final:
            return [Noted(event) for event in events]
        self._waiting = events
        return []

    def _with_causes(self, events: list[Event]) -> list[Noted]:
        asked = [e for e in events if e.kind in WITH_CAUSE and e.error]
        params = {
            "ids": [e.job_id for e in asked],
            "queues": [e.queue for e in asked],
            "owners": [e.owner for e in asked],
            "errors": [e.error for e in asked],
            "abandoned": [e.kind == "abandoned" for e in asked],
        }
        with self.app.connection() as conn:
            rows = conn.execute(self.app.store.query("event_causes"), params).fetchall()
        found = {id(event): row for event, row in zip(asked, rows, strict=True)}
        noted = []
        for event in events:
            row = found.get(id(event))
            if row is None:
                noted.append(Noted(event))
            else:
                noted.append(Noted(event, cause=row[1], cause_id=row[2], repeat=bool(row[3])))
        return noted


@dataclass(frozen=True)
class NewCause:
    """A cause that started waiting for a human in a work run: one owner's, in one queue."""

    queue: str
    owner: str
    cause: str  # as failures() shows it, or the error itself when it could not be read
    cause_id: str | None
    error: str  # one job's error, as it is
    jobs: tuple[int, ...]  # the run's abandoned jobs of this owner and cause

    def requeue_command(self) -> str:
        which = f" --cause-id {self.cause_id}" if self.cause_id else ""
        return f"synclane requeue --queue {self.queue} --owner {self.owner}{which}"

    def cancel_command(self) -> str:
        return f"synclane cancel --queue {self.queue} --owner {self.owner} --reason 'account gone'"


def new_causes(noted: Iterable[Noted]) -> list[NewCause]:
    """The causes that started waiting for a human among these events, in order, each with
    every job of the run abandoned for it (repeats after the first included)."""
    abandoned = [n for n in noted if n.event.kind == "abandoned"]
    keys = {_key(n) for n in abandoned if n.new_abandonment}
    found: dict[tuple[str, str, str], NewCause] = {}
    for item in abandoned:
        key = _key(item)
        if key not in keys:
            continue
        if key in found:
            known = found[key]
            found[key] = NewCause(
                known.queue, known.owner, known.cause, known.cause_id, known.error,
                (*known.jobs, item.event.job_id),
            )  # fmt: skip
            continue
        event = item.event
        found[key] = NewCause(
            event.queue, event.owner, item.cause or event.error or "", item.cause_id,
            event.error or "", (event.job_id,),
        )  # fmt: skip
    return list(found.values())


def repeats(noted: Iterable[Noted], new: Sequence[NewCause]) -> int:
    """How many jobs were abandoned for a cause that already waited before the run."""
    keys = {(c.queue, c.owner, c.cause_id or c.cause) for c in new}
    return sum(1 for n in noted if n.event.kind == "abandoned" and _key(n) not in keys)


def _key(noted: Noted) -> tuple[str, str, str]:
    event = noted.event
    return (event.queue, event.owner, noted.cause_id or noted.cause or event.error or "")


def alert(new: Sequence[NewCause], repeated: int, requeue: Callable[[NewCause], str]) -> str:
    """Why a work run failed: each new cause, the jobs abandoned for it, and how to stop it
    (`requeue` names the orchestrator's own way to requeue, beside the command line's)."""
    parts = []
    for cause in new[:3]:
        which = f"cause {cause.cause_id}, " if cause.cause_id else ""
        jobs = ", ".join(map(str, cause.jobs[:5])) + (" …" if len(cause.jobs) > 5 else "")
        parts.append(
            f"{cause.owner} (queue {cause.queue}): {cause.error} ({which}job(s) {jobs}); once "
            f"fixed, `{cause.requeue_command()}` or {requeue(cause)}; if the account is gone, "
            f"take it out of the owner source and `{cause.cancel_command()}`"
        )
    more = f"; and {len(new) - 3} more cause(s)" if len(new) > 3 else ""
    again = (
        f" {repeated} more job(s) were abandoned for causes that already wait for a human: they "
        "alert no one again until the cause changes or is requeued."
        if repeated
        else ""
    )
    return (
        f"{len(new)} new cause(s) of abandoned jobs, waiting for a human: "
        + "; ".join(parts)
        + more
        + "."
        + again
    )
