"""The events panel: the worker's events (synclane.events) as one short line each."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from synclane.events import Event, EventLog, Note

EVENTS_SHOWN = 100  # the most events one answer carries
ERROR_SHOWN = 120  # characters of an error in a line


def _clock(moment: datetime | None) -> str:
    return "?" if moment is None else moment.astimezone(UTC).strftime("%H:%M:%S UTC")


def _day(moment: datetime) -> str:
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d" if moment.time() == datetime.min.time() else "%m-%d %H:%M")


def _error(event: Event) -> str:
    text = (event.error or "").splitlines()[0] if event.error else "no error text"
    return text if len(text) <= ERROR_SHOWN else text[: ERROR_SHOWN - 1] + "…"


def _job(event: Event) -> str:
    """`orders 2026-01-01 → 2026-01-31 for globex`: what the job loads, for whom."""
    what = event.type
    if event.window_start is not None and event.window_end is not None:
        what += f" {_day(event.window_start)} → {_day(event.window_end)}"
    elif event.mode != "initial":
        what += f" ({event.mode})"
    return f"{what} for {event.owner}"


def line(event: Event) -> str:
    """One short human sentence for an event."""
    job = _job(event)
    kind = event.kind
    if kind == "throttled":
        return f"lane {event.lane} throttled until {_clock(event.until)}: {job} ({_error(event)})"
    if kind == "failed":
        return f"{job} failed ({_error(event)}); retry at {_clock(event.until)}"
    if kind == "deferred":
        return (
            f"{job} deferred after {event.attempt} attempts ({_error(event)}); one more try "
            "once its lane is idle"
        )
    if kind == "abandoned":
        return f"{job} abandoned ({_error(event)}); it waits for Requeue"
    if kind == "first_load_finished":
        return f"first load of {event.type} for {event.owner} finished"
    if kind == "completed":
        return f"{job} completed: {event.records} records"
    if kind == "started":
        return f"{job} started (attempt {event.attempt}) on {event.worker}"
    if kind == "page":
        return f"{job}: a page of {event.records} records, cursor {event.cursor}"
    if kind == "handed_back":
        return f"{job} handed back at cursor {event.cursor}"
    if kind == "lease_lost":
        return f"{job}: {event.worker} lost its lease and stopped"
    if kind == "reclaimed":
        return f"{job} reclaimed from a worker that stopped; now {event.status}"
    return f"{job}: {kind}"


def events_after(log: EventLog | None, after: int, mask: Callable[[str], str]) -> dict[str, Any]:
    """The events numbered above `after`, newest first, at most EVENTS_SHOWN; `last` is the
    number to ask after next time."""
    if log is None:
        return {"enabled": False, "events": [], "last": after}
    found = log.since(after)
    if not found:
        everything = log.since(0)
        if everything and everything[-1][0] < after:  # a new log (the process restarted)
            found = everything
    last = found[-1][0] if found else after
    shown = []
    for number, event in reversed(found[-EVENTS_SHOWN:]):
        if isinstance(event, Note):
            shown.append(
                {
                    "number": number,
                    "at": event.at.astimezone(UTC).isoformat(),
                    "kind": "note",
                    "line": mask(event.text),
                }
            )
            continue
        shown.append(
            {
                "number": number,
                "at": event.at.astimezone(UTC).isoformat(),
                "kind": event.kind,
                "queue": mask(event.queue),
                "owner": mask(event.owner),
                "lane": mask(event.lane),
                "type": mask(event.type),
                "job_id": event.job_id,
                "until": None if event.until is None else event.until.astimezone(UTC).isoformat(),
                "line": mask(line(event)),
            }
        )
    return {"enabled": True, "events": shown, "last": last}
