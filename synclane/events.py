"""What a worker tells its listeners: one `Event` per thing that happened to a job.

A listener is a plain callable that receives an `Event`, passed as
`app.run_worker(..., on_event=listener)`. It runs on the worker's event loop, so it must return
at once (hand slow work to a thread or a queue); an exception it raises is logged once and
otherwise ignored, so a broken listener never costs a job. The Prefect extra turns events into
Prefect events, the demo into story lines, the metrics into counters.

Pure values, no I/O: nothing here imports the worker or the database.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from synclane.model import ConfigError

# A log record with this attribute set (`extra={WHOLE_LINE: True}`) is a command for the reader to
# copy: the command line prints it whole on a line of its own, never wrapped to the terminal.
WHOLE_LINE = "synclane_whole_line"

Kind = Literal[
    "started",  # a slot took the job and runs its first page of this attempt
    "page",  # a page ended and its cursor is saved
    "completed",  # the last page ended: the job is done
    "failed",  # the attempt failed; `until` is when it is retried
    "deferred",  # the regular attempts are used up: it steps aside for the rest of its lane
    "abandoned",  # it waits for a human (Abandon, or its deferred attempt failed too)
    "throttled",  # the API asked to slow down: the lane pauses until `until`
    "handed_back",  # the worker stopped (or the queue paused) and returned the job with its cursor
    "lease_lost",  # another worker owns the job now, or it was cancelled: this slot stopped
    "reclaimed",  # its worker stopped renewing the lease; `status` says where it went
    "first_load_finished",  # the last history slice of an owner and type completed
]
KINDS: tuple[Kind, ...] = (
    "started",
    "page",
    "completed",
    "failed",
    "deferred",
    "abandoned",
    "throttled",
    "handed_back",
    "lease_lost",
    "reclaimed",
    "first_load_finished",
)
# What a team alerts on: a job that will not finish without help, a lane that was told to slow
# down, a worker that lost a job it was running.
FAILED_FOR_GOOD: tuple[Kind, ...] = ("deferred", "abandoned")


@dataclass(frozen=True)
class Event:
    """One thing that happened to one job, seen by the worker `worker`."""

    kind: Kind
    queue: str
    job_id: int
    owner: str
    lane: str
    type: str
    mode: str
    worker: str
    attempt: int = 0
    window_start: datetime | None = None
    window_end: datetime | None = None
    error: str | None = None  # "<ExceptionType>: <message>", for failures and throttles
    until: datetime | None = None  # when a failed job is retried, or until when a lane waits
    records: int = 0  # the page's records ("page"), or the job's so far ("completed")
    seconds: float | None = None  # how long the page ("page") or the attempt ("completed") took
    cursor: str | None = None  # where the job continues ("page", "handed_back")
    status: str | None = None  # the job's status after the event, where it changed
    at: datetime = field(default_factory=lambda: datetime.now(UTC))


Listener = Callable[[Event], object]


def listeners(on_event: Listener | Iterable[Listener] | None) -> tuple[Listener, ...]:
    """`on_event` as a tuple of callables: None, one callable, or several."""
    if on_event is None:
        return ()
    if callable(on_event):
        return (on_event,)
    found = tuple(on_event)
    for item in found:
        if not callable(item):
            raise ConfigError(
                f"on_event must be a callable or a list of callables, got {item!r:.100}"
            )
    return found


@dataclass(frozen=True)
class Note:
    """A line that is not about one job (the demo telling what happened at the shop)."""

    text: str
    at: datetime = field(default_factory=lambda: datetime.now(UTC))


class EventLog:
    """The newest events, numbered, for a reader that polls (the page): `append` is a listener,
    `note(text)` adds a line of its own, `since(number)` returns what came after. Thread-safe;
    keeps at most `size` entries."""

    def __init__(self, size: int = 500, kinds: Iterable[Kind] | None = None) -> None:
        self._events: deque[tuple[int, Event | Note]] = deque(maxlen=size)
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._kinds = None if kinds is None else frozenset(kinds)

    def __call__(self, event: Event) -> None:
        self.append(event)

    def append(self, event: Event) -> None:
        if self._kinds is not None and event.kind not in self._kinds:
            return
        with self._lock:
            self._events.append((next(self._numbers), event))

    def note(self, text: str) -> None:
        with self._lock:
            self._events.append((next(self._numbers), Note(text)))

    def since(self, number: int = 0) -> list[tuple[int, Event | Note]]:
        """The entries numbered above `number`, oldest first."""
        with self._lock:
            return [(n, event) for n, event in self._events if n > number]
