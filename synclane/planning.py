"""What should exist: a pure function of a type's settings, an owner, what exists, and now.

The planner reads what exists in one query, calls `missing` for every owner and type, and
inserts the result in one statement with ON CONFLICT DO NOTHING. Nothing here touches the
database, so the rules below are tested on their own (see docs/planning.md).

History is planned lazily: a windowed type keeps `ahead` open history slices per owner (pending,
running, failed), and the histories table records how far back the history goes (`History`), so
that the database plans the next older slice when one finishes (schema.sql,
plan_older_slices) with the same boundaries as this rule.
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
# The statuses of an open job, as the planner counts them (a deferred job has stepped aside).
OPEN = ("pending", "running", "failed")


def ahead_for(lane_width: int) -> int:
    """How many open history slices an owner's windowed type keeps planned: at least its lane's
    width, so that a wide lane stays busy, and one more, so that the statement that completes a
    slice finds the next one to take (the slice its completion plans, in the database after that
    statement, is not yet visible to it)."""
    return lane_width + 1


DEFAULT_AHEAD = ahead_for(1)


@dataclass(frozen=True)
class Existing:
    """What the table already holds for one owner and type (read by one query)."""

    oldest_initial_start: datetime | None = None  # window_start of the oldest initial slice
    oldest_initial_status: str | None = None  # and its status
    open_initial: int = 0  # initial slices pending, running or failed
    history_from: datetime | None = None  # the histories row (None: there is none)
    history_slice: timedelta | None = None
    history_ahead: int | None = None
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


@dataclass(frozen=True)
class History:
    """The histories row of one owner and windowed type: its history goes back to
    `history_from`, in slices of `slice`, with `ahead` open slices kept planned."""

    history_from: datetime
    slice: timedelta
    ahead: int


@dataclass(frozen=True)
class Missing:
    """What one owner and type lacks: the jobs to insert, the histories row to write (None: it
    is right, or none is needed), and whether older slices wait for that row to be committed
    first (`deferred`: the planner plans the owner again in a transaction of its own)."""

    jobs: list[NewJob]
    history: History | None = None
    deferred: bool = False


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
    ahead: int = DEFAULT_AHEAD,
) -> list[NewJob]:
    """The jobs of one owner and type that should exist now and do not."""
    return missing(job_type, owner, existing, now, horizon, ahead).jobs


def missing(
    job_type: JobType,
    owner: Owner,
    existing: Existing,
    now: datetime,
    horizon: timedelta | None = None,
    ahead: int = DEFAULT_AHEAD,
) -> Missing:
    """The jobs of one owner and type that should exist now and do not, and the histories row
    that should be written with them."""
    if isinstance(job_type, SnapshotType):
        return Missing(_snapshot(job_type, owner, existing, now))
    history = plan_history(job_type, existing, now, horizon, ahead)
    jobs = [
        _job(job_type, owner, "initial", f"initial:{iso(start)}", start, end)
        for start, end in history.slices
    ]
    jobs += _refresh(job_type, owner, existing, now)
    return Missing(jobs, history.record, history.deferred)


@dataclass(frozen=True)
class HistoryPlan:
    slices: list[tuple[datetime, datetime]]  # the older slices to plan now, newest first
    record: History | None  # the histories row to write
    deferred: bool  # slices are missing, but wait for the row to be committed first


def plan_history(
    job_type: WindowedType,
    existing: Existing,
    now: datetime,
    horizon: timedelta | None = None,
    ahead: int = DEFAULT_AHEAD,
) -> HistoryPlan:
    """The history rule (docs/planning.md, "History: initial slices"). History goes back to
    `history_from`: midnight(now) - horizon, or what the histories row recorded if that is older
    (a backfill widened it, or an earlier day). The first plan's newest slice ends at today's
    midnight; later slices only ever extend history backwards from the oldest slice that exists,
    and at most `ahead` of them are open at once: the database plans each next one as an earlier
    one finishes (schema.sql, plan_older_slices), and a plan tops up what it missed.

    A histories row the database plans under is changed in a transaction that plans no slice of
    that owner (`deferred`): the database may be planning the next slice under the old row at
    the same instant, and two slices computed under two rows could overlap. A cancelled oldest
    slice stops history (the owner was cancelled) until a wider horizon is asked for."""
    limit = midnight(now) - (horizon or job_type.horizon)
    recorded = existing.history_from
    target = limit if recorded is None else min(recorded, limit)
    oldest = existing.oldest_initial_start
    if oldest is not None and oldest <= target:
        return HistoryPlan([], None, False)  # complete
    wanted = History(target, job_type.slice, ahead)
    current = (recorded, existing.history_slice, existing.history_ahead)
    record = None if current == (target, job_type.slice, ahead) else wanted
    if oldest is None:
        end, room = midnight(now), ahead
    else:
        cancelled = existing.oldest_initial_status == "cancelled"
        if cancelled and recorded is not None and target >= recorded:
            return HistoryPlan([], None, False)
        end, room = oldest, ahead - existing.open_initial
        if record is not None and recorded is not None and not cancelled and room > 0:
            # The database plans under the recorded row while the oldest slice is live.
            return HistoryPlan([], record, True)
    slices: list[tuple[datetime, datetime]] = []
    while end > target and len(slices) < room:
        start = max(end - job_type.slice, target)
        slices.append((start, end))
        end = start
    return HistoryPlan(slices, record, False)


@dataclass(frozen=True)
class Marks:
    """The instants that tell, for one type at one instant, whether an owner's jobs are complete
    (`settled`): a cheap test the planner runs in SQL for every owner, so that it reads what
    exists, and runs `missing`, only for the owners that fail it."""

    history_from: datetime | None  # windowed: midnight(now) - horizon
    period_from: datetime  # this period's start
    period_to: datetime  # the next period's start
    covered_to: datetime | None  # windowed: coverage ending here or later leaves no refresh
    slice: timedelta | None = None  # windowed: the slice and the open slices the
    ahead: int | None = None  # histories row should record


def marks(
    job_type: JobType, now: datetime, horizon: timedelta | None = None, ahead: int = DEFAULT_AHEAD
) -> Marks:
    period = period_start(now, job_type.every)
    if isinstance(job_type, SnapshotType):
        return Marks(None, period, period + job_type.every, None)
    limit = midnight(now) - (horizon or job_type.horizon)
    covered = now + job_type.overlap
    return Marks(limit, period, period + job_type.every, covered, job_type.slice, ahead)


def settled(job_type: JobType, existing: Existing, marks: Marks) -> bool:
    """Whether `missing` finds nothing for these facts at the instant of `marks` (the SQL
    statement `unsettled_owners` asks the same of the rows themselves, in the same order). It may
    say False where nothing is missing (the planner then reads that owner and finds nothing);
    never True where something is."""
    if isinstance(job_type, SnapshotType):
        if existing.initial_created_at is None:
            return False
        last = max(existing.initial_created_at, existing.last_created_at or EPOCH)
        return existing.open_any or marks.period_from <= last < marks.period_to
    if not _history_settled(existing, marks):
        return False
    end = existing.coverage_end
    if existing.open_recurring or end is None:
        return True
    if marks.covered_to is not None and end >= marks.covered_to:
        return True
    return existing.coverage_mode == "recurring" and end >= marks.period_from


def _history_settled(existing: Existing, marks: Marks) -> bool:
    """plan_history plans nothing and writes no row: history reaches back far enough, or it is
    cancelled and not widened, or its row is right and `ahead` slices are open."""
    start, limit = existing.oldest_initial_start, marks.history_from
    recorded = existing.history_from
    if start is None or limit is None:
        return False
    if start <= (limit if recorded is None else min(recorded, limit)):
        return True
    if recorded is None or limit < recorded:
        return False  # no row yet, or a wider horizon to record
    if existing.oldest_initial_status == "cancelled":
        return True
    if (existing.history_slice, existing.history_ahead) != (marks.slice, marks.ahead):
        return False
    return marks.ahead is not None and existing.open_initial >= marks.ahead


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


def _refresh(
    job_type: WindowedType, owner: Owner, existing: Existing, now: datetime
) -> list[NewJob]:
    """The refresh rule (docs/planning.md, "Refresh: recurring jobs")."""
    jobs: list[NewJob] = []
    today = midnight(now)
    coverage_end = existing.coverage_end
    if existing.oldest_initial_start is None and (coverage_end is None or coverage_end < today):
        coverage_end = today  # a first plan: its history ends at today's midnight
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
