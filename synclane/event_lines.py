"""Worker events as short lines for people: what `synclane work` and `synclane demo` print.

`line(event)` gives one line and the logging level it deserves: what a person follows (a job
completed, failed, was throttled, deferred, abandoned) at INFO or WARNING, the steps in between
(a job started, a page saved) at DEBUG. Pure formatting, no I/O; the worker's own log lines keep
the full details (ids, tokens, ISO timestamps) for `-v`.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from synclane.events import Event

# How long an error's first line may be in an event line; the jobs table keeps all of it.
ERROR_WIDTH = 100

LEVELS = {
    "started": logging.DEBUG,
    "page": logging.DEBUG,
    "completed": logging.INFO,
    "first_load_finished": logging.INFO,
    "failed": logging.INFO,
    "throttled": logging.INFO,
    "handed_back": logging.INFO,
    "reclaimed": logging.INFO,
    "deferred": logging.WARNING,
    "abandoned": logging.WARNING,
    "lease_lost": logging.WARNING,
}


def line(event: Event, max_attempts: int | None = None) -> tuple[int, str]:
    """The event as (logging level, one line). `max_attempts`, the queue's, says "attempt 2 of
    5" instead of "attempt 2"."""
    job = job_label(event)
    error = short_error(event.error)
    attempt = f"attempt {event.attempt}" + (f" of {max_attempts}" if max_attempts else "")
    if max_attempts and event.attempt > max_attempts:
        attempt = "its deferred last attempt"
    kind = event.kind
    if kind == "started":
        where = f" at cursor {event.cursor}" if event.cursor else ""
        text = f"{job}: started ({attempt}){where}"
    elif kind == "page":
        after = f", next cursor {event.cursor}" if event.cursor else ""
        text = f"{job}: page saved, {event.records} records{after}"
    elif kind == "completed":
        took = f" in {_seconds(event.seconds)}" if event.seconds is not None else ""
        text = f"{job}: completed, {event.records} records{took}"
    elif kind == "first_load_finished":
        slices = ", every history slice is loaded" if event.window_start is not None else ""
        text = f"{event.owner} {event.type}: first load complete{slices}"
    elif kind == "failed":
        text = f"{job}: failed ({attempt}): {error}; retry {when(event.until, event.at)}"
    elif kind == "throttled":
        reason = error.removeprefix("Throttled: ").removeprefix("Throttled")
        said = f" ({reason})" if reason else ""
        pause = "for a while"
        if event.until is not None:
            pause = when(event.until, event.at)
            pause = f"for {pause[3:]}" if pause.startswith("in ") else f"until {pause[3:]}"
        text = f"{job}: the API said slow down{said}; lane {event.lane} pauses {pause}"
    elif kind == "deferred":
        text = (
            f"{job}: deferred after {attempt}: {error}; it steps aside for the rest of lane "
            f"{event.lane} and gets one more attempt once the lane is idle"
        )
    elif kind == "abandoned":
        text = (
            f"{job}: abandoned: {error}; it waits for a human (`synclane failures` shows its "
            "cause, `synclane requeue` gives it fresh attempts)"
        )
    elif kind == "handed_back":
        where = f" at cursor {event.cursor}" if event.cursor else ""
        text = f"{job}: handed back{where}, to continue there (the worker is stopping)"
    elif kind == "lease_lost":
        text = (
            f"{job}: lease lost ({error or 'taken over or cancelled'}); this worker abandoned "
            "its page and saves nothing of it, and lets the lane go once the page has stopped"
        )
    elif kind == "reclaimed":
        now = f", now {event.status}" if event.status else ""
        text = f"{job}: reclaimed from a worker that stopped renewing its lease{now}"
    else:  # a kind added after this module: still one line
        text = f"{job}: {kind}" + (f": {error}" if error else "")
    return LEVELS.get(kind, logging.INFO), text


def job_label(event: Event) -> str:
    """'job 12 globex orders 2026-10-01..10-31': enough to find it in `synclane jobs`."""
    window = window_text(event.window_start, event.window_end)
    return f"job {event.job_id} {event.owner} {event.type}" + (f" {window}" if window else "")


def window_text(start: datetime | None, end: datetime | None) -> str:
    """A window, short: '2026-10-01..10-31' for whole days, '2026-11-30 07:15..07:30' within a
    day, in UTC; '' without one."""
    if start is None and end is None:
        return ""
    if start is None or end is None:
        known = start or end
        assert known is not None
        text = _instant(known.astimezone(UTC))
        return f"{text}.." if start is not None else f"..{text}"
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    # the end without what it shares with the start: 2026-10-01..10-31, 07:15..07:30
    if _is_midnight(start) and _is_midnight(end):
        last = end.strftime("%m-%d" if end.year == start.year else "%Y-%m-%d")
        return f"{start:%Y-%m-%d}..{last}"
    clock = _clock(end)
    if end.date() == start.date():
        last = end.strftime(clock)
    elif end.year == start.year:
        last = end.strftime(f"%m-%d {clock}")
    else:
        last = _instant(end)
    return f"{_instant(start)}..{last}"


def when(moment: datetime | None, now: datetime, *, preposition: bool = True) -> str:
    """'in 2.3 s' for what is near, 'at 07:45:00 UTC (in 12 min)' for what is not."""
    if moment is None:
        return "later"
    wait = moment - now
    if wait < timedelta(minutes=1):
        return f"in {_seconds(max(wait.total_seconds(), 0.0))}"
    at = moment.astimezone(UTC).strftime("%H:%M:%S UTC")
    if wait >= timedelta(days=1):
        at = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{'at ' if preposition else ''}{at} (in {duration_text(wait)})"


def duration_text(span: timedelta) -> str:
    seconds = span.total_seconds()
    if seconds < 60:
        return _seconds(seconds)
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def short_error(error: str | None) -> str:
    """An error's first line, at most ERROR_WIDTH characters."""
    if not error:
        return ""
    first = error.strip().splitlines()[0] if error.strip() else ""
    return first if len(first) <= ERROR_WIDTH else first[: ERROR_WIDTH - 1] + "…"


def _seconds(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds >= 10 or seconds == int(seconds):
        return f"{seconds:.0f} s"
    return f"{seconds:.1f} s"


def _is_midnight(moment: datetime) -> bool:
    return (moment.hour, moment.minute, moment.second, moment.microsecond) == (0, 0, 0, 0)


def _instant(moment: datetime) -> str:
    return moment.strftime(f"%Y-%m-%d {_clock(moment)}")


def _clock(moment: datetime) -> str:
    """Minutes, or seconds too where the moment is not a whole minute (a refresh's end)."""
    return "%H:%M" if moment.second == 0 and moment.microsecond == 0 else "%H:%M:%S"
