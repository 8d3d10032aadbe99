"""What a work run tells Prefect: Prefect events for what a team alerts on, and the run's report.

Pure values, no Prefect import: `prefect_event` builds the arguments of
`prefect.events.emit_event`, `WorkLog` collects a worker's events (it is a listener) and writes
the run's markdown report. The flows send them.

Resource ids (documented in docs/prefect.md; `<table>` is `TableIdentity.slug`):

| resource | id | role |
| --- | --- | --- |
| the job (the event's resource) | `synclane.job.<table>.<job id>` | |
| the jobs table | `synclane.table.<table>` | `table` |
| the queue | `synclane.queue.<table>.<queue>` | `queue` |
| the owner (one account, across queues) | `synclane.owner.<table>.<owner>` | `owner` |
| the type | `synclane.type.<table>.<queue>.<type>` | `type` |
| the lane | `synclane.lane.<table>.<queue>.<lane>` | `lane` |
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from synclane.causes import NewCause, Noted, alert, new_causes, repeats
from synclane.events import Event, Kind
from synclane.prefect.identity import TableIdentity

# What becomes a Prefect event: an attempt that failed and will be retried, a job that will not
# finish without help (deferred, abandoned), an account's history fully loaded, a lane told to
# slow down, a worker that lost a job it was running. Pages, starts and completions stay in
# synclane: they would flood the event feed.
PREFECT_EVENT_KINDS: tuple[Kind, ...] = (
    "failed",
    "deferred",
    "abandoned",
    "first_load_finished",
    "throttled",
    "lease_lost",
)
# What the work run's report lists one by one (the rest it only counts).
LISTED_KINDS: tuple[Kind, ...] = (
    "abandoned",
    "deferred",
    "failed",
    "throttled",
    "lease_lost",
    "reclaimed",
)


def event_name(kind: Kind) -> str:
    """The Prefect event name of a kind: 'synclane.job.<kind>', e.g. 'synclane.job.abandoned'."""
    return f"synclane.job.{kind}"


def prefect_event(event: Event, table: TableIdentity, noted: Noted | None = None) -> dict[str, Any]:
    """The keyword arguments of `prefect.events.emit_event` for one synclane event. The job is
    the resource; its labels carry queue, owner, lane, type, mode and status so that an
    Automation can match on them, and for a failure its cause's id (`noted`, from
    synclane.causes), and for an abandoned job whether its cause already waited for a human
    (`synclane.repeat`: "true" or "false"); the table, queue, owner, type and lane are related
    resources. Prefect adds the flow run, its deployment and flow when it is sent from a run."""
    noted = noted or Noted(event)
    t = table.slug
    resource = {
        "prefect.resource.id": f"synclane.job.{t}.{event.job_id}",
        "prefect.resource.name": f"job {event.job_id}",
        "synclane.table": t,
        "synclane.queue": event.queue,
        "synclane.owner": event.owner,
        "synclane.lane": event.lane,
        "synclane.type": event.type,
        "synclane.mode": event.mode,
    }
    if event.status is not None:
        resource["synclane.status"] = event.status
    if noted.cause_id is not None:
        resource["synclane.cause_id"] = noted.cause_id
    if event.kind == "abandoned":
        resource["synclane.repeat"] = "true" if noted.repeat else "false"
    related = [
        _related(f"synclane.table.{t}", "table", table.label),
        _related(f"synclane.queue.{t}.{event.queue}", "queue", event.queue),
        _related(f"synclane.owner.{t}.{event.owner}", "owner", event.owner),
        _related(f"synclane.type.{t}.{event.queue}.{event.type}", "type", event.type),
        _related(f"synclane.lane.{t}.{event.queue}.{event.lane}", "lane", event.lane),
    ]
    payload: dict[str, Any] = {
        "job_id": event.job_id,
        "attempt": event.attempt,
        "worker": event.worker,
        "error": event.error,
        # the error as failures() groups it (numbers and ids masked), and that cause's id
        "cause": noted.cause,
        "cause_id": noted.cause_id,
        # when a failed or deferred job may run again, or until when a throttled lane waits
        "until": _iso(event.until) if event.kind in _WAITING else None,
        "window_start": _iso(event.window_start),
        "window_end": _iso(event.window_end),
    }
    return {
        "event": event_name(event.kind),
        "resource": resource,
        "related": related,
        "payload": payload,
        "occurred": event.at,
    }


_WAITING = ("failed", "deferred", "throttled")


def _related(resource_id: str, role: str, name: str) -> dict[str, str]:
    return {
        "prefect.resource.id": resource_id,
        "prefect.resource.role": role,
        "prefect.resource.name": name,
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


@dataclass
class WorkLog:
    """A listener that keeps what a work run needs for its report: every event counted by kind,
    and the first `limit` events of each listed kind (failures, throttles, lost leases). It runs
    on the worker's event loop and only appends."""

    limit: int = 50
    counts: Counter[str] = field(default_factory=Counter)
    listed: dict[str, list[Event]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.counts[event.kind] += 1
            if event.kind in LISTED_KINDS:
                kept = self.listed.setdefault(event.kind, [])
                if len(kept) < self.limit:
                    kept.append(event)

    def events(self, kind: Kind) -> list[Event]:
        with self._lock:
            return list(self.listed.get(kind, []))

    def markdown(
        self,
        *,
        queues: Sequence[str],
        worker: str,
        table: TableIdentity,
        seconds: float,
        ended: str,
        report: dict[str, int],
    ) -> str:
        """The run's report: what the slots did, then each job that failed and why."""
        lines = [
            "# synclane work run",
            "",
            f"Worker `{worker}` worked queue(s) {', '.join(f'`{q}`' for q in queues)} of "
            f"{table.label} for {seconds:.0f} s; it stopped because {ended}.",
            "",
            "| completed | failed, will retry | deferred | abandoned | throttled | handed back "
            "| lease lost | reclaimed |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            "| "
            + " | ".join(
                str(report.get(key, 0))
                for key in (
                    "completed",
                    "failed",
                    "deferred",
                    "abandoned",
                    "throttled",
                    "handed_back",
                    "lost",
                    "reclaimed",
                )
            )
            + " |",
        ]
        sections: list[tuple[str, Kind, Sequence[str]]] = [
            (
                "Abandoned: waiting for a human (requeue them once the cause is fixed)",
                "abandoned",
                ("job", "queue", "owner", "type", "window", "attempt", "error"),
            ),
            (
                "Deferred: regular attempts used up; one more once the lane is idle",
                "deferred",
                ("job", "queue", "owner", "type", "window", "attempt", "error"),
            ),
            (
                "Failed: retried later",
                "failed",
                ("job", "queue", "owner", "type", "window", "attempt", "retry at", "error"),
            ),
            (
                "Throttled: the lane waits",
                "throttled",
                ("job", "queue", "lane", "owner", "type", "until", "error"),
            ),
            (
                "Lease lost: another worker owns the job now, or it was cancelled",
                "lease_lost",
                ("job", "queue", "owner", "type", "error"),
            ),
            (
                "Reclaimed: a worker stopped renewing its lease",
                "reclaimed",
                ("job", "queue", "owner", "type", "status", "error"),
            ),
        ]
        for title, kind, columns in sections:
            listed = self.events(kind)
            if not listed:
                continue
            lines += ["", f"## {title}", "", _header(columns)]
            lines += [_row(event, columns) for event in listed]
            hidden = self.counts[kind] - len(listed)
            if hidden > 0:
                lines += ["", f"… and {hidden} more."]
        return "\n".join(lines) + "\n"


def _header(columns: Iterable[str]) -> str:
    names = list(columns)
    return "| " + " | ".join(names) + " |\n|" + " --- |" * len(names)


def _row(event: Event, columns: Iterable[str]) -> str:
    cells = {
        "job": str(event.job_id),
        "queue": event.queue,
        "owner": event.owner,
        "lane": event.lane,
        "type": event.type,
        "window": _window(event),
        "attempt": str(event.attempt),
        "retry at": _iso(event.until) or "",
        "until": _iso(event.until) or "",
        "status": event.status or "",
        "error": event.error or "",
    }
    return "| " + " | ".join(_cell(cells[name]) for name in columns) + " |"


def _window(event: Event) -> str:
    if event.window_start is None and event.window_end is None:
        return ""
    start = event.window_start.date().isoformat() if event.window_start else "…"
    end = event.window_end.date().isoformat() if event.window_end else "…"
    return f"{start} – {end}"


def _cell(text: str) -> str:
    """Text that stays inside one markdown table cell."""
    flat = " ".join(text.split())
    return flat.replace("\\", "\\\\").replace("|", "\\|")[:300]


def work_outcome(
    report: dict[str, int], noted: Sequence[Noted], fail_on_abandoned: bool
) -> str | None:
    """Why the work run should end Failed, or None. With `fail_on_abandoned`, a run in which a
    job was abandoned for a new cause fails (synclane.causes: a cause that already waited for a
    human, such as a broken account's next refresh, does not fail it again); deferred jobs
    still have an attempt left and only show in the report and the events."""
    new = new_causes(noted)
    if not fail_on_abandoned or not new:
        return None
    return (
        alert(new, repeats(noted, new), _requeue_flow)
        + " The run's synclane work artifact lists every job."
    )


def _requeue_flow(cause: NewCause) -> str:
    which = f", cause_id={cause.cause_id!r}" if cause.cause_id else ""
    return f"the requeue flow with queue={cause.queue!r}, owner={cause.owner!r}{which}"
