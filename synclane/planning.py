"""What should exist: a pure function of a type's settings, an owner, what exists, and now.

The planner reads what exists in one query, calls `missing_jobs` for every owner and type, and
inserts the result in one statement with ON CONFLICT DO NOTHING. Nothing here touches the
database, so the rules below are tested on their own (see docs/planning.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from synclane.model import JobType, Mode, Owner, SnapshotType, WindowedType

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The most slices one refresh call cuts a gap into. A gap longer than that (a year-long outage in
# slices of 15 minutes would be 35,040 jobs) is loaded this many slices at a time, oldest first:
# while they are open no further refresh is added, and the next one starts where they end, so no
# time is skipped and no owner floods the table in one call.
MAX_REFRESH_SLICES = 1_000


@dataclass(frozen=True)
class Existing:
    """What the table already holds for one owner and type (read by one query)."""

    oldest_initial_start: datetime | None = None  # window_start of the oldest initial slice
    coverage_end: datetime | None = None  # latest window_end of any job of the type
    coverage_mode: str | None = None  # the mode of the job that ends there
    initial_created_at: datetime | None = None  # a snapshot type's initial job
    last_created_at: datetime | None = None  # a snapshot type's newest job
    open_recurring: bool = False  # a recurring job is pending, running or failed
    open_any: bool = False  # any job is pending, running or failed


@dataclass(frozen=True)
class NewJob:
    owner: str
    lane: str
    type: str
    mode: Mode
    priority: int
    window_start: datetime | None
    window_end: datetime | None
    dedup_key: str


def iso(moment: datetime) -> str:
    """The instant as ISO-8601 UTC with a Z; microseconds only when there are some."""
    utc = moment.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}"
    return text + "Z"


def period_start(moment: datetime, every: timedelta) -> datetime:
    """Periods are aligned to the clock: 15 minutes means :00, :15, :30, :45; a day means
    midnight UTC."""
    return EPOCH + ((moment - EPOCH) // every) * every


def midnight(moment: datetime) -> datetime:
    return period_start(moment, timedelta(days=1))


def missing_jobs(
    job_type: JobType,
    owner: Owner,
    existing: Existing,
    now: datetime,
    horizon: timedelta | None = None,
) -> list[NewJob]:
    """The jobs of one owner and type that should exist now and do not."""
    if isinstance(job_type, SnapshotType):
        return _snapshot(job_type, owner, existing, now)
    return _windowed(job_type, owner, existing, now, horizon or job_type.horizon)


@dataclass(frozen=True)
class Marks:
    """The instants that tell, for one type at one instant, whether an owner's jobs are complete
    (`settled`): a cheap test the planner runs in SQL for every owner, so that it reads what
    exists, and runs `missing_jobs`, only for the owners that fail it."""

    history_from: datetime | None  # windowed: the oldest slice starts here or earlier
    period_from: datetime  # this period's start
    period_to: datetime  # the next period's start
    covered_to: datetime | None  # windowed: coverage ending here or later leaves no refresh


def marks(job_type: JobType, now: datetime, horizon: timedelta | None = None) -> Marks:
    period = period_start(now, job_type.every)
    if isinstance(job_type, SnapshotType):
        return Marks(None, period, period + job_type.every, None)
    limit = midnight(now) - (horizon or job_type.horizon)
    return Marks(limit, period, period + job_type.every, now + job_type.overlap)


def settled(job_type: JobType, existing: Existing, marks: Marks) -> bool:
    """Whether `missing_jobs` finds nothing for these facts at the instant of `marks` (the SQL
    statement `unsettled_owners` asks the same of the rows themselves). It may say False where
    nothing is missing (the planner then reads that owner and finds nothing); never True where
    something is."""
    if isinstance(job_type, SnapshotType):
        if existing.initial_created_at is None:
            return False
        last = max(existing.initial_created_at, existing.last_created_at or EPOCH)
        return existing.open_any or marks.period_from <= last < marks.period_to
    start, end = existing.oldest_initial_start, existing.coverage_end
    if start is None or marks.history_from is None or start > marks.history_from:
        return False
    if existing.open_recurring or end is None:
        return True
    if marks.covered_to is not None and end >= marks.covered_to:
        return True
    return existing.coverage_mode == "recurring" and end >= marks.period_from


def _job(
    job_type: JobType,
    owner: Owner,
    mode: Mode,
    key: str,
    start: datetime | None = None,
    end: datetime | None = None,
) -> NewJob:
    return NewJob(owner.id, owner.lane_key, job_type.name, mode, job_type.priority, start, end, key)


def _snapshot(
    job_type: SnapshotType, owner: Owner, existing: Existing, now: datetime
) -> list[NewJob]:
    if existing.initial_created_at is None:
        return [_job(job_type, owner, "initial", "initial")]
    period = period_start(now, job_type.every)
    last = max(existing.initial_created_at, existing.last_created_at or existing.initial_created_at)
    # The first load covers its own period; a slow lane must not pile up refreshes.
    if existing.open_any or period_start(last, job_type.every) == period:
        return []
    return [_job(job_type, owner, "recurring", f"recurring:{iso(period)}")]


def _windowed(
    job_type: WindowedType, owner: Owner, existing: Existing, now: datetime, horizon: timedelta
) -> list[NewJob]:
    jobs: list[NewJob] = []
    today = midnight(now)
    limit = today - horizon
    # History grows backwards only, from the oldest slice that exists, so that slices made on
    # earlier days never shift and a wider horizon adds just the older part.
    first_plan = existing.oldest_initial_start is None
    end = today if existing.oldest_initial_start is None else existing.oldest_initial_start
    while end > limit:
        start = max(end - job_type.slice, limit)
        jobs.append(_job(job_type, owner, "initial", f"initial:{iso(start)}", start, end))
        end = start

    coverage_end = existing.coverage_end
    if first_plan and (coverage_end is None or coverage_end < today):
        coverage_end = today
    if existing.open_recurring or coverage_end is None:
        return jobs
    period_began = period_start(now, job_type.every)
    if existing.coverage_mode == "recurring" and coverage_end >= period_began:
        # A refresh ends at the instant it was planned: this period has had its refresh. (The
        # dedup key would refuse a second one too; this spares the insert.)
        return jobs
    # A refresh starts where coverage ends (minus the overlap) and ends now; a gap longer than a
    # slice (the system was down) is cut into slices so that no job covers weeks at once.
    start = coverage_end - job_type.overlap
    if start >= now:
        return jobs
    period = iso(period_began)
    pieces: list[tuple[datetime, datetime]] = []
    while start + job_type.slice < now and len(pieces) < MAX_REFRESH_SLICES:
        pieces.append((start, start + job_type.slice))
        start += job_type.slice
    if start + job_type.slice < now:
        # Capped: the oldest slices of the gap only, none ending now. Their keys name their
        # starts, so that the next part of the gap, planned in this same period once these are
        # done, gets keys of its own.
        for piece_start, piece_end in pieces:
            key = f"recurring:{period}:{iso(piece_start)}"
            jobs.append(_job(job_type, owner, "recurring", key, piece_start, piece_end))
        return jobs
    pieces.append((start, now))
    for number, (piece_start, piece_end) in enumerate(pieces, start=1):
        key = f"recurring:{period}" if number == len(pieces) else f"recurring:{period}:{number}"
        jobs.append(_job(job_type, owner, "recurring", key, piece_start, piece_end))
    return jobs
