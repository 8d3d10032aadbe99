"""The planning rule of docs/planning.md, pinned without a database.

`Table` below keeps rows and histories rows in memory and derives `Existing` from them exactly as
the planner's one read (`plan_read` in synclane/sql/planning.sql) does, writes histories rows as
`record_histories` does, and inserts like `ON CONFLICT DO NOTHING`: a row whose (owner, type,
dedup_key) exists is skipped. A status change runs the model of the database's top-up
(`plan_older_slices` in synclane/sql/schema.sql, which tests/test_lazy_history.py pins against
PostgreSQL): a history slice that finishes plans the next older one. The property tests drive it
with random sequences of plans, time passing, horizon changes and jobs finishing, and check after
every step that the three mistakes of the rule (duplicates, gaps, shifts) never happen, and that
the history loads to its horizon by finishing slices alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synclane.model import JobType, Owner, SnapshotType, WindowedType
from synclane.planning import (
    DEFAULT_AHEAD,
    MAX_REFRESH_SLICES,
    OPEN,
    Existing,
    History,
    Missing,
    NewJob,
    iso,
    marks,
    midnight,
    missing,
    missing_jobs,
    period_start,
    settled,
)

FINISHED = ("completed", "deferred", "abandoned")  # what tops a history up when a slice gets it
STATUSES = ("pending", "running", "completed", "failed", "deferred", "abandoned", "cancelled")

ACME = Owner("acme-us", lane="acme")
GLOBEX = Owner("globex")
OWNERS = (ACME, GLOBEX)

# The example of docs/planning.md: planned on 2026-11-29 at 10:45 UTC.
NOW = datetime(2026, 11, 29, 10, 45, tzinfo=UTC)
ORDERS = WindowedType(
    "orders",
    horizon=timedelta(days=60),
    slice=timedelta(days=30),
    every=timedelta(minutes=15),
    overlap=timedelta(minutes=5),
    priority=1,
)
PRODUCTS = SnapshotType("products", every=timedelta(days=1))


def at(day: str, clock: str = "00:00:00") -> datetime:
    return datetime.fromisoformat(f"{day}T{clock}").replace(tzinfo=UTC)


# -- the table in memory -----------------------------------------------------------------------


@dataclass
class Row:
    job: NewJob
    created_at: datetime
    status: str = "pending"

    @property
    def window(self) -> tuple[datetime | None, datetime | None]:
        return self.job.window_start, self.job.window_end


@dataclass
class Plan:
    """One planner call for one owner and type: what it read, proposed and inserted."""

    now: datetime
    existing: Existing
    proposed: list[NewJob]
    added: list[Row]
    keys_before: set[str]


@dataclass
class Table:
    rows: list[Row] = field(default_factory=list)
    histories: dict[tuple[str, str], History] = field(default_factory=dict)
    ahead: int = DEFAULT_AHEAD
    clock: datetime = NOW

    def of(self, owner: Owner, job_type: JobType) -> list[Row]:
        return [r for r in self.rows if r.job.owner == owner.id and r.job.type == job_type.name]

    def row(self, owner: Owner, job_type: JobType, key: str) -> Row:
        (found,) = [r for r in self.of(owner, job_type) if r.job.dedup_key == key]
        return found

    def existing(self, owner: Owner, job_type: JobType) -> Existing:
        """What the planner's one read (`plan_read`) returns for one owner and type."""
        rows = self.of(owner, job_type)
        if isinstance(job_type, SnapshotType):
            initial = [r.created_at for r in rows if r.job.dedup_key == "initial"]
            unwindowed = [r.created_at for r in rows if r.job.window_end is None]
            return Existing(
                initial_created_at=initial[0] if initial else None,
                last_created_at=max(unwindowed, default=None),
                open_any=any(r.status in OPEN for r in rows),
            )
        initial = [r for r in rows if r.job.mode == "initial" and r.job.window_end is not None]
        oldest = min(initial, key=lambda r: r.job.window_end, default=None)
        windowed = [r for r in rows if r.job.window_end is not None]
        # ORDER BY window_end DESC LIMIT 1; of equal ends (a first plan exactly at midnight) the
        # database may return either row, here the one inserted last.
        newest = max(enumerate(windowed), key=lambda x: (x[1].job.window_end, x[0]), default=None)
        record = self.histories.get((owner.id, job_type.name))
        return Existing(
            oldest_initial_start=None if oldest is None else oldest.job.window_start,
            oldest_initial_status=None if oldest is None else oldest.status,
            open_initial=sum(r.status in OPEN for r in initial) if oldest is not None else 0,
            history_from=None if record is None else record.history_from,
            history_slice=None if record is None else record.slice,
            history_ahead=None if record is None else record.ahead,
            coverage_end=None if newest is None else newest[1].job.window_end,
            coverage_mode=None if newest is None else newest[1].job.mode,
            open_recurring=any(r.job.mode == "recurring" and r.status in OPEN for r in rows),
        )

    def insert(self, jobs: list[NewJob], now: datetime) -> list[Row]:
        """INSERT ... ON CONFLICT (queue, owner, type, dedup_key) DO NOTHING."""
        taken = {(r.job.owner, r.job.type, r.job.dedup_key) for r in self.rows}
        added = []
        for job in jobs:
            if (job.owner, job.type, job.dedup_key) in taken:
                continue
            taken.add((job.owner, job.type, job.dedup_key))
            added.append(Row(job, now))
        self.rows += added
        return added

    def record(self, owner: str, type_name: str, history: History) -> None:
        """record_histories: an upsert that keeps the older history_from."""
        old = self.histories.get((owner, type_name))
        if old is not None:
            history = replace(history, history_from=min(old.history_from, history.history_from))
        self.histories[(owner, type_name)] = history

    def plan(
        self,
        job_type: JobType,
        owner: Owner,
        now: datetime,
        horizon: timedelta | None = None,
    ) -> Plan:
        """One batch of the planner for one owner and type (synclane/batches.py): read, write
        the histories row, insert; and the second transaction of an owner whose older slices
        waited for its row."""
        self.clock = now
        existing = self.existing(owner, job_type)
        keys_before = {r.job.dedup_key for r in self.of(owner, job_type)}
        found = missing(job_type, owner, existing, now, horizon, self.ahead)
        if settled(job_type, existing, marks(job_type, now, horizon, self.ahead)):
            assert not found.jobs, "app.plan() skips a settled owner: nothing may be missing"
            assert found.history is None and not found.deferred
        if found.history is not None:
            self.record(owner.id, job_type.name, found.history)
        proposed, added = list(found.jobs), self.insert(found.jobs, now)
        if found.deferred:
            reread = self.existing(owner, job_type)
            again = missing(job_type, owner, reread, now, horizon, self.ahead)
            assert again.history is None and not again.deferred, "the row is right now"
            proposed += again.jobs
            added += self.insert(again.jobs, now)
        return Plan(now, existing, proposed, added, keys_before)

    def set_status(self, changed: list[Row], status: str) -> None:
        """UPDATE jobs SET status = ... WHERE id IN (...): the rows change, then the update
        trigger runs once for each row (wake_lanes_of_changed_job)."""
        before = [(r, r.status) for r in changed]
        for r in changed:
            r.status = status
        for r, old in before:
            if r.job.mode == "initial" and old in OPEN and status in FINISHED:
                self.plan_older_slices(r.job)

    def plan_older_slices(self, finished: NewJob) -> None:
        """The model of schema.sql's plan_older_slices, statement by statement."""
        record = self.histories.get((finished.owner, finished.type))
        if record is None:
            return
        for _ in range(record.ahead):
            mine = (finished.owner, finished.type, "initial")
            initial = [r for r in self.rows if (r.job.owner, r.job.type, r.job.mode) == mine]
            oldest = min(initial, key=lambda r: r.job.window_end)
            start = oldest.job.window_start
            if start <= record.history_from or oldest.status == "cancelled":
                return
            if sum(r.status in OPEN for r in initial) >= record.ahead:
                return
            older = max(start - record.slice, record.history_from)
            key = f"initial:{iso(older)}"
            job = replace(finished, window_start=older, window_end=start, dedup_key=key)
            self.insert([job], self.clock)

    def finish(self, owner: Owner, job_type: JobType, status: str = "completed") -> None:
        self.set_status([r for r in self.of(owner, job_type) if r.status in OPEN], status)

    def load(self, owner: Owner, job_type: JobType) -> None:
        """Workers complete every open history slice, and those their completions plan, until
        none is open."""
        while opened := [
            r for r in self.of(owner, job_type) if r.job.mode == "initial" and r.status in OPEN
        ]:
            self.set_status(opened, "completed")


def initial_slices(rows: list[Row]) -> list[Row]:
    return sorted((r for r in rows if r.job.mode == "initial"), key=lambda r: r.job.window_start)


def gaps(windows: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """The stretches of time between the earliest start and the latest end that no window covers."""
    found = []
    ordered = sorted(windows)
    reached = ordered[0][1]
    for start, end in ordered[1:]:
        if start > reached:
            found.append((reached, start))
        reached = max(reached, end)
    return found


# -- property tests: windowed --------------------------------------------------------------------

HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)

waits = st.one_of(
    st.integers(0, 59).map(lambda m: m * MINUTE),
    st.integers(1, 47).map(lambda h: h * HOUR),
    st.integers(1, 4).map(lambda d: timedelta(days=d)),
    st.integers(1, 10**6).map(lambda s: timedelta(seconds=s)),
)


@st.composite
def windowed_scenarios(draw: st.DrawFn) -> tuple[WindowedType, datetime, list[tuple], int]:
    slice_hours = draw(st.sampled_from([1, 6, 24, 24 * 7, 24 * 30]))
    every = draw(st.sampled_from([1, 5, 15, 60, 24 * 60])) * MINUTE
    overlap = timedelta(seconds=draw(st.integers(0, int(every.total_seconds()) - 1)))
    hours = st.integers(slice_hours, slice_hours * 25)
    job_type = WindowedType(
        "orders",
        horizon=draw(hours) * HOUR,
        slice=slice_hours * HOUR,
        every=every,
        overlap=overlap,
    )
    start = draw(st.datetimes(datetime(2020, 1, 1), datetime(2030, 1, 1), timezones=st.just(UTC)))
    owners = st.sampled_from([(ACME,), (GLOBEX,), OWNERS])
    override = st.one_of(st.none(), st.integers(1, slice_hours * 30).map(lambda h: h * HOUR))
    plan = st.tuples(st.just("plan"), waits, owners, override)  # time passes, then a plan
    step = st.one_of(
        plan,
        plan,
        st.tuples(st.just("settings"), hours.map(lambda h: h * HOUR)),
        st.tuples(
            st.just("finish"),
            st.lists(st.integers(0, 10**6), max_size=6),
            st.sampled_from(["completed", "completed", "completed", *STATUSES]),
        ),
    )
    # The first step plans one owner; the other owner's first plan comes later, if at all.
    steps = draw(st.lists(step, min_size=10, max_size=40))
    ahead = draw(st.integers(1, 4))  # a lane's width + 1, or any other number of open slices
    return job_type, start, [("plan", timedelta(0), (ACME,), None), *steps], ahead


def check_windowed_plan(table: Table, job_type: WindowedType, owner: Owner, plan: Plan) -> None:
    """What one call may propose, given what it read."""
    ex, now = plan.existing, plan.now
    keys = [j.dedup_key for j in plan.proposed]
    assert len(keys) == len(set(keys)), "one call proposes each dedup key once"

    initial = [j for j in plan.proposed if j.mode == "initial"]
    room = table.ahead if ex.oldest_initial_start is None else table.ahead - ex.open_initial
    assert len(initial) <= max(room, 0), "no more open slices than `ahead`"
    for job in initial:
        assert job.dedup_key == f"initial:{iso(job.window_start)}"
        if ex.oldest_initial_start is not None:
            # History grows backwards only, from the oldest slice.
            assert job.window_end <= ex.oldest_initial_start
        if job.dedup_key in plan.keys_before:
            # Never moves: a key that exists names the same window.
            assert table.row(owner, job_type, job.dedup_key).window == (
                job.window_start,
                job.window_end,
            )
    for newer, older in pairwise(initial):
        assert older.window_end == newer.window_start, "newest first, edge to edge"
        assert newer.window_end - newer.window_start == job_type.slice

    recurring = [j for j in plan.proposed if j.mode == "recurring"]
    if ex.open_recurring:
        assert not recurring, "no refresh while one is open"
    if not recurring:
        return
    first = ex.oldest_initial_start is None
    coverage = ex.coverage_end
    if first:
        coverage = midnight(now) if coverage is None else max(coverage, midnight(now))
    assert recurring[0].window_start == coverage - job_type.overlap
    assert recurring[-1].window_end == now
    period = iso(period_start(now, job_type.every))
    for number, (job, nxt) in enumerate(zip(recurring, [*recurring[1:], None], strict=True), 1):
        assert job.window_start < job.window_end <= job.window_start + job_type.slice
        if nxt is None:
            assert job.dedup_key == f"recurring:{period}"
        else:
            assert job.dedup_key == f"recurring:{period}:{number}"
            assert job.window_end == nxt.window_start


def check_windowed_table(
    table: Table,
    job_type: WindowedType,
    owner: Owner,
    first_midnight: datetime,
    oldest_limit: datetime,
) -> None:
    """What must hold for the rows of one owner after any step."""
    rows = table.of(owner, job_type)
    keys = [r.job.dedup_key for r in rows]
    assert len(keys) == len(set(keys)), "no duplicates"

    record = table.histories[(owner.id, job_type.name)]
    assert record.history_from == oldest_limit, "the row records the widest horizon"
    history = initial_slices(rows)
    assert history[-1].job.window_end == first_midnight, "history ends at the first midnight"
    assert history[0].job.window_start >= oldest_limit, "and never goes past its limit"
    for older, newer in pairwise(history):
        assert older.job.window_end == newer.job.window_start, "no gap, no overlap between slices"
    for r in history:
        assert r.job.window_start < r.job.window_end <= r.job.window_start + job_type.slice

    windows = [r.window for r in rows]
    assert not gaps(windows), "initial and recurring windows leave no gap"
    # Only a refresh reaches further back, and by its overlap at most (a first refresh starts at
    # the first midnight minus the overlap, which may be older than a very short horizon).
    oldest = min(start for start, _ in windows)
    assert history[0].job.window_start - job_type.overlap <= oldest <= history[0].job.window_start


def check_history_loads(
    table: Table, job_type: WindowedType, owner: Owner, horizon: timedelta | None
) -> None:
    """Finishing slices loads the history to the row's history_from, unless its oldest slice was
    cancelled (the owner was). Where nothing is open (a status changed by hand from one that is
    not open, which plans nothing), the next plan tops the history up."""
    while True:
        table.load(owner, job_type)
        if not table.plan(job_type, owner, table.clock, horizon).added:
            break
    history = initial_slices(table.of(owner, job_type))
    record = table.histories[(owner.id, job_type.name)]
    if history[0].status != "cancelled":
        assert history[0].job.window_start == record.history_from, "loaded to its horizon"


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(windowed_scenarios())
def test_windowed_history_and_refreshes_never_duplicate_gap_or_shift(scenario) -> None:
    job_type, now, steps, ahead = scenario
    table = Table(ahead=ahead)
    first_midnight: dict[str, datetime] = {}
    first_horizon: dict[str, timedelta] = {}
    oldest_limit: dict[str, datetime] = {}

    for step in steps:
        if step[0] == "settings":
            job_type = replace(job_type, horizon=step[1])  # widen or narrow in the code
        elif step[0] == "finish":
            _, picks, status = step
            unfinished = [r for r in table.rows if r.status != "completed"]
            for pick in picks:
                if unfinished:
                    table.set_status([unfinished[pick % len(unfinished)]], status)
        else:
            _, wait, owners, horizon = step
            now += wait
            for owner in owners:
                plan = table.plan(job_type, owner, now, horizon)
                check_windowed_plan(table, job_type, owner, plan)
                wide = horizon or job_type.horizon
                first_midnight.setdefault(owner.id, midnight(now))
                first_horizon.setdefault(owner.id, wide)
                limit = midnight(now) - wide
                oldest_limit[owner.id] = min(oldest_limit.get(owner.id, limit), limit)

                if midnight(now) == first_midnight[owner.id] and wide == first_horizon[owner.id]:
                    # A planner that read nothing, later on the first day, makes the same slices
                    # with the same keys: the dedup index refuses every one of them.
                    made = {(r.job.dedup_key, r.window) for r in table.of(owner, job_type)}
                    blind = missing_jobs(job_type, owner, Existing(), now, horizon, ahead)
                    for job in blind:
                        if job.mode == "initial":
                            assert (job.dedup_key, (job.window_start, job.window_end)) in made

                # Refreshed up to this instant, unless one was open or this period had one.
                coverage = table.existing(owner, job_type).coverage_end
                if not plan.existing.open_recurring:
                    period_key = f"recurring:{iso(period_start(now, job_type.every))}"
                    assert coverage == now or period_key in plan.keys_before

                again = table.plan(job_type, owner, now, horizon)
                assert not again.added, "a second plan at the same instant adds nothing"

        for owner in OWNERS:
            if owner.id in first_midnight:
                check_windowed_table(
                    table, job_type, owner, first_midnight[owner.id], oldest_limit[owner.id]
                )
    for owner in OWNERS:
        if owner.id in first_midnight:
            check_history_loads(table, job_type, owner, None)  # plans with the settings
            limit = midnight(now) - job_type.horizon
            oldest_limit[owner.id] = min(oldest_limit[owner.id], limit)
            check_windowed_table(
                table, job_type, owner, first_midnight[owner.id], oldest_limit[owner.id]
            )


# -- property tests: snapshot --------------------------------------------------------------------


@st.composite
def snapshot_scenarios(draw: st.DrawFn) -> tuple[SnapshotType, datetime, list[tuple]]:
    every = draw(st.sampled_from([1, 5, 15, 60, 24 * 60, 7 * 24 * 60])) * MINUTE
    start = draw(st.datetimes(datetime(2020, 1, 1), datetime(2030, 1, 1), timezones=st.just(UTC)))
    plan = st.tuples(st.just("plan"), waits)  # time passes, then a plan
    step = st.one_of(
        plan,
        plan,
        st.tuples(
            st.just("finish"),
            st.lists(st.integers(0, 10**6), max_size=3),
            st.sampled_from(["completed", "completed", *STATUSES]),
        ),
    )
    steps = [("plan", timedelta(0)), *draw(st.lists(step, min_size=8, max_size=30))]
    return SnapshotType("products", every=every), start, steps


@settings(max_examples=80, deadline=None)
@given(snapshot_scenarios())
def test_snapshot_gets_one_initial_then_one_refresh_per_later_period_when_idle(scenario) -> None:
    job_type, now, steps = scenario
    table = Table()
    for step in steps:
        if step[0] == "finish":
            _, picks, status = step
            unfinished = [r for r in table.rows if r.status != "completed"]
            for pick in picks:
                if unfinished:
                    unfinished[pick % len(unfinished)].status = status
        else:
            now += step[1]
            plan = table.plan(job_type, ACME, now)
            ex = plan.existing
            if ex.initial_created_at is None:
                assert [(r.job.mode, r.job.dedup_key) for r in plan.added] == [
                    ("initial", "initial")
                ]
            elif ex.open_any:
                assert not plan.proposed, "no refresh while a job is open"
            else:
                period = period_start(now, job_type.every)
                key = f"recurring:{iso(period)}"
                last = max(ex.initial_created_at, ex.last_created_at or ex.initial_created_at)
                due = period != period_start(last, job_type.every)
                assert [r.job.dedup_key for r in plan.added] == (
                    [key] if due and key not in plan.keys_before else []
                )
            assert not table.plan(job_type, ACME, now).added, "same instant adds nothing"

        rows = table.of(ACME, job_type)
        (initial,) = [r for r in rows if r.job.mode == "initial"]
        first_period = period_start(initial.created_at, job_type.every)
        periods = [period_start(r.created_at, job_type.every) for r in rows]
        assert len(periods) == len(set(periods)), "at most one job per period"
        assert periods[0] == first_period, "none in the period the initial job was created"
        for r in rows:
            assert r.job.window_start is None and r.job.window_end is None
            if r.job.mode == "recurring":
                period = period_start(r.created_at, job_type.every)
                assert r.job.dedup_key == f"recurring:{iso(period)}"


# -- property tests: the settled test app.plan() runs in SQL ---------------------------------------

instants = st.integers(-3 * 24 * 60, 3 * 24 * 60).map(lambda m: NOW + m * MINUTE)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([ORDERS, replace(ORDERS, every=timedelta(days=1)), PRODUCTS]),
    st.builds(
        Existing,
        oldest_initial_start=st.one_of(
            st.none(), instants, st.just(midnight(NOW) - ORDERS.horizon)
        ),
        oldest_initial_status=st.sampled_from([None, *STATUSES]),
        open_initial=st.integers(0, 4),
        history_from=st.one_of(
            st.none(), instants, st.just(midnight(NOW) - ORDERS.horizon - timedelta(days=3))
        ),
        history_slice=st.sampled_from([None, ORDERS.slice, timedelta(days=1)]),
        history_ahead=st.one_of(st.none(), st.integers(1, 4)),
        coverage_end=st.one_of(st.none(), instants, st.just(NOW)),
        coverage_mode=st.sampled_from([None, "initial", "recurring", "manual"]),
        initial_created_at=st.one_of(st.none(), instants),
        last_created_at=st.one_of(st.none(), instants),
        open_recurring=st.booleans(),
        open_any=st.booleans(),
    ),
    st.one_of(st.none(), st.integers(1, 90).map(lambda d: timedelta(days=d))),
    st.integers(0, 24 * 60).map(lambda m: NOW + m * MINUTE),
    st.integers(1, 4),
)
def test_a_settled_owner_has_nothing_missing_whatever_its_rows_say(
    job_type: JobType, existing: Existing, horizon: timedelta | None, now: datetime, ahead: int
) -> None:
    """app.plan() reads an owner only when its rows fail `settled` (sql/planning.sql,
    unsettled_owners): any facts that pass must be facts for which the rule adds nothing and
    writes no histories row."""
    if settled(job_type, existing, marks(job_type, now, horizon, ahead)):
        assert missing(job_type, ACME, existing, now, horizon, ahead) == Missing([])


def test_a_planned_owner_is_settled_until_its_next_period_and_unsettled_by_a_lost_row() -> None:
    table = Table()
    table.plan(ORDERS, ACME, NOW)
    table.plan(PRODUCTS, ACME, NOW)
    for job_type in (ORDERS, PRODUCTS):
        assert settled(job_type, table.existing(ACME, job_type), marks(job_type, NOW))
    later = NOW + ORDERS.every
    # Its refresh is open: nothing more is planned until that one is done.
    assert settled(ORDERS, table.existing(ACME, ORDERS), marks(ORDERS, later))
    table.finish(ACME, ORDERS)
    assert not settled(ORDERS, table.existing(ACME, ORDERS), marks(ORDERS, later))
    table.plan(ORDERS, ACME, later)
    assert settled(ORDERS, table.existing(ACME, ORDERS), marks(ORDERS, later))
    # A user deletes the oldest history slice: the owner is read again.
    oldest = initial_slices(table.of(ACME, ORDERS))[0]
    table.rows.remove(oldest)
    assert not settled(ORDERS, table.existing(ACME, ORDERS), marks(ORDERS, later))


# -- examples: the windowed rule -----------------------------------------------------------------


def summary(
    jobs: list[NewJob] | list[Row],
) -> list[tuple[str, datetime | None, datetime | None, str]]:
    found = [j.job if isinstance(j, Row) else j for j in jobs]
    return [(j.mode, j.window_start, j.window_end, j.dedup_key) for j in found]


def test_first_plan_cuts_history_newest_first_from_midnight() -> None:
    jobs = missing_jobs(ORDERS, ACME, Existing(), NOW)
    assert summary(jobs) == [
        ("initial", at("2026-10-30"), at("2026-11-29"), "initial:2026-10-30T00:00:00Z"),
        ("initial", at("2026-09-30"), at("2026-10-30"), "initial:2026-09-30T00:00:00Z"),
        (
            "recurring",
            at("2026-11-28", "23:55"),
            at("2026-11-29", "10:45"),
            "recurring:2026-11-29T10:45:00Z",
        ),
    ]
    assert {(j.owner, j.lane, j.type, j.priority) for j in jobs} == {
        ("acme-us", "acme", "orders", 1)
    }


def test_two_plans_on_the_same_day_make_the_same_slices() -> None:
    morning = missing_jobs(ORDERS, ACME, Existing(), at("2026-11-29", "00:00:00"))
    night = missing_jobs(ORDERS, ACME, Existing(), at("2026-11-29", "23:59:59.999999"))
    assert [j for j in morning if j.mode == "initial"] == [j for j in night if j.mode == "initial"]


def test_a_later_day_adds_no_history_and_moves_no_slice() -> None:
    table = Table()
    table.plan(ORDERS, ACME, NOW)
    before = [(r.job, r.created_at) for r in initial_slices(table.rows)]
    table.finish(ACME, ORDERS)
    later = table.plan(ORDERS, ACME, NOW + timedelta(days=45, minutes=3))
    assert [r.job.mode for r in later.added] == ["recurring", "recurring"]
    assert [(r.job, r.created_at) for r in initial_slices(table.rows)] == before


@pytest.mark.parametrize("how", ["horizon argument", "new settings"])
def test_widening_60_to_730_days_adds_23_older_slices_the_oldest_10_days_long(how: str) -> None:
    """The promise is the same slices as before lazy history; they now come as the open ones
    finish, at most `ahead` open at a time, instead of in the plan that widened."""
    table = Table()
    table.plan(ORDERS, ACME, NOW)
    first = {id(r): r.window for r in table.rows}
    later = NOW + timedelta(minutes=5)
    if how == "horizon argument":
        plan = table.plan(ORDERS, ACME, later, horizon=timedelta(days=730))
    else:
        plan = table.plan(replace(ORDERS, horizon=timedelta(days=730)), ACME, later)
    assert not plan.added, "both slices of the first plan are still open"
    assert table.histories[("acme-us", "orders")].history_from == at("2024-11-29")

    before = set(map(id, table.rows))
    table.load(ACME, ORDERS)
    added = [r for r in table.rows if id(r) not in before]
    added.sort(key=lambda r: r.job.window_start, reverse=True)
    assert len(added) == 23
    assert {r.job.mode for r in added} == {"initial"}
    assert {id(r): r.window for r in table.rows if id(r) in first} == first
    newest, oldest = added[0].job, added[-1].job
    assert newest.window_end == at("2026-09-30"), "starts where the oldest slice started"
    assert oldest.window_start == at("2024-11-29") == midnight(NOW) - timedelta(days=730)
    assert oldest.window_end - oldest.window_start == timedelta(days=10)
    assert oldest.dedup_key == "initial:2024-11-29T00:00:00Z"
    lengths = [r.job.window_end - r.job.window_start for r in added]
    assert lengths == [timedelta(days=30)] * 22 + [timedelta(days=10)]
    assert not table.plan(ORDERS, ACME, later, horizon=timedelta(days=730)).added


def test_widening_on_a_later_day_counts_the_horizon_from_that_day() -> None:
    table = Table()
    table.plan(ORDERS, ACME, NOW)
    table.finish(ACME, ORDERS)
    plan = table.plan(ORDERS, ACME, NOW + timedelta(days=3), horizon=timedelta(days=90))
    assert summary([r for r in plan.added if r.job.mode == "initial"]) == [
        ("initial", at("2026-09-03"), at("2026-09-30"), "initial:2026-09-03T00:00:00Z")
    ]


# -- examples: lazy history ------------------------------------------------------------------------

TWO_YEARS = replace(ORDERS, horizon=timedelta(days=730))


def history_rows(table: Table) -> list[tuple[str, datetime, datetime]]:
    return [(r.status, *r.window) for r in initial_slices(table.rows)]  # type: ignore[list-item]


def test_a_first_plan_writes_the_newest_ahead_slices_and_records_how_far_back_to_go() -> None:
    table = Table()
    plan = table.plan(TWO_YEARS, ACME, NOW)
    assert summary(plan.added) == [
        ("initial", at("2026-10-30"), at("2026-11-29"), "initial:2026-10-30T00:00:00Z"),
        ("initial", at("2026-09-30"), at("2026-10-30"), "initial:2026-09-30T00:00:00Z"),
        (
            "recurring",
            at("2026-11-28", "23:55"),
            at("2026-11-29", "10:45"),
            "recurring:2026-11-29T10:45:00Z",
        ),
    ]
    assert table.histories == {
        ("acme-us", "orders"): History(at("2024-11-29"), timedelta(days=30), DEFAULT_AHEAD)
    }
    wide = Table(ahead=5)
    assert len([r for r in wide.plan(TWO_YEARS, ACME, NOW).added if r.job.mode == "initial"]) == 5


def test_a_finished_slice_plans_the_next_older_one_and_a_cancelled_one_plans_none() -> None:
    table = Table()
    table.plan(TWO_YEARS, ACME, NOW)
    newest = initial_slices(table.rows)[-1]
    table.set_status([newest], "running")
    table.set_status([newest], "completed")
    assert history_rows(table) == [
        ("pending", at("2026-08-31"), at("2026-09-30")),
        ("pending", at("2026-09-30"), at("2026-10-30")),
        ("completed", at("2026-10-30"), at("2026-11-29")),
    ]
    for status in ("deferred", "abandoned"):  # stepped aside: the rest of history goes on
        table.set_status([initial_slices(table.rows)[1]], status)
        assert initial_slices(table.rows)[0].status == "pending"
        assert sum(r.status in OPEN for r in initial_slices(table.rows)) == DEFAULT_AHEAD
    rows = len(table.rows)
    table.set_status([r for r in initial_slices(table.rows) if r.status in OPEN], "cancelled")
    assert len(table.rows) == rows, "a cancelled owner gets nothing new"
    assert not table.plan(TWO_YEARS, ACME, NOW + HOUR).added, "nor from a plan"
    widened = table.plan(TWO_YEARS, ACME, NOW + HOUR, horizon=timedelta(days=800))
    assert [r.job.mode for r in widened.added] == ["initial", "initial"], "until a backfill"


def test_a_plan_tops_up_what_finishing_did_not() -> None:
    """A status changed by hand from one that is not open (cancelled to completed), or a top-up
    the database skipped, leaves fewer than `ahead` slices open: the next plan adds them."""
    table = Table()
    table.plan(TWO_YEARS, ACME, NOW)
    table.set_status(initial_slices(table.rows)[-1:], "cancelled")
    table.set_status(initial_slices(table.rows)[-1:], "completed")
    existing = table.existing(ACME, TWO_YEARS)
    assert existing.open_initial == 1
    assert not settled(TWO_YEARS, existing, marks(TWO_YEARS, NOW))
    (added,) = table.plan(TWO_YEARS, ACME, NOW).added
    assert added.window == (at("2026-08-31"), at("2026-09-30"))


def test_a_history_loads_completely_by_finishing_slices_newest_first() -> None:
    table = Table()
    table.plan(TWO_YEARS, ACME, NOW)
    order = []
    while opened := [r for r in initial_slices(table.rows) if r.status in OPEN]:
        assert len(opened) <= DEFAULT_AHEAD
        newest = opened[-1]
        table.set_status([newest], "completed")
        order.append(newest.job.window_start)
    assert order == sorted(order, reverse=True), "newest first"
    assert len(order) == 25
    assert history_rows(table)[0][1] == at("2024-11-29")


def test_a_changed_row_is_committed_before_a_slice_is_planned_under_it() -> None:
    """While the database may top a history up under its row, a plan that changes the row plans
    no slice beside it: the older slices come from a second transaction (or as slices finish)."""
    existing = Existing(
        oldest_initial_start=at("2026-09-30"),
        oldest_initial_status="completed",
        open_initial=0,
        history_from=at("2024-11-29"),
        history_slice=timedelta(days=30),
        history_ahead=2,
        coverage_end=NOW,
    )
    wider = missing(TWO_YEARS, ACME, existing, NOW, horizon=timedelta(days=800))
    assert wider.history == History(at("2024-09-20"), timedelta(days=30), 2)
    assert wider.deferred and not [j for j in wider.jobs if j.mode == "initial"]
    shorter = missing(replace(TWO_YEARS, slice=timedelta(days=7)), ACME, existing, NOW)
    assert shorter.history is not None and shorter.deferred
    recorded = replace(existing, history_from=at("2024-09-20"))
    assert missing(TWO_YEARS, ACME, recorded, NOW, horizon=timedelta(days=800)).history is None
    # No row (an owner planned before schema 6): the database plans nothing for it yet.
    unrecorded = replace(existing, history_from=None, history_slice=None, history_ahead=None)
    backfill = missing(TWO_YEARS, ACME, unrecorded, NOW)
    assert backfill.history is not None and not backfill.deferred
    assert len([j for j in backfill.jobs if j.mode == "initial"]) == 2


def test_a_lost_or_wrong_history_row_is_written_again() -> None:
    table = Table()
    table.plan(TWO_YEARS, ACME, NOW)
    right = table.histories[("acme-us", "orders")]
    for wrong in (replace(right, slice=timedelta(days=1)), replace(right, ahead=9), None):
        if wrong is None:
            del table.histories[("acme-us", "orders")]
        else:
            table.histories[("acme-us", "orders")] = wrong
        existing = table.existing(ACME, TWO_YEARS)
        assert not settled(TWO_YEARS, existing, marks(TWO_YEARS, NOW))
        table.plan(TWO_YEARS, ACME, NOW)
        assert table.histories[("acme-us", "orders")] == right


def test_narrowing_the_horizon_adds_nothing_and_keeps_every_slice() -> None:
    table = Table()
    table.plan(ORDERS, ACME, NOW, horizon=timedelta(days=730))
    before = list(table.rows)
    narrow = replace(ORDERS, horizon=timedelta(days=30))
    assert not table.plan(narrow, ACME, NOW + timedelta(minutes=1)).added
    assert not table.plan(ORDERS, ACME, NOW + timedelta(days=2), horizon=timedelta(days=1)).added
    assert table.rows == before


def test_refresh_starts_where_coverage_ends_minus_overlap() -> None:
    existing = Existing(oldest_initial_start=at("2026-09-30"), coverage_end=NOW)
    jobs = missing_jobs(ORDERS, ACME, existing, at("2026-11-29", "11:02:30"))
    assert summary(jobs) == [
        (
            "recurring",
            at("2026-11-29", "10:40"),
            at("2026-11-29", "11:02:30"),
            "recurring:2026-11-29T11:00:00Z",
        )
    ]


def test_each_refresh_continues_from_the_last_one() -> None:
    table = Table()
    ends = []
    for minutes in (0, 15, 30, 47, 120):
        table.finish(ACME, ORDERS)
        plan = table.plan(ORDERS, ACME, NOW + timedelta(minutes=minutes))
        (refresh,) = [r for r in plan.added if r.job.mode == "recurring"]
        if ends:
            assert refresh.job.window_start == ends[-1] - ORDERS.overlap
        ends.append(refresh.job.window_end)
    assert ends[-1] == NOW + timedelta(minutes=120)


@pytest.mark.parametrize("status", OPEN)
def test_no_refresh_while_one_is_open(status: str) -> None:
    table = Table()
    table.plan(ORDERS, ACME, NOW)
    table.finish(ACME, ORDERS, status)
    for hours in (1, 5, 30):
        assert not table.plan(ORDERS, ACME, NOW + hours * HOUR).added
    table.finish(ACME, ORDERS)
    plan = table.plan(ORDERS, ACME, NOW + 31 * HOUR)
    (refresh,) = plan.added
    assert refresh.window == (NOW - ORDERS.overlap, NOW + 31 * HOUR), "the next one fills the gap"


def test_an_open_initial_slice_does_not_hold_back_refreshes() -> None:
    table = Table()
    table.plan(ORDERS, ACME, NOW)
    table.row(ACME, ORDERS, "recurring:2026-11-29T10:45:00Z").status = "completed"
    assert [r.job.mode for r in table.plan(ORDERS, ACME, NOW + HOUR).added] == ["recurring"]


def test_one_refresh_per_period() -> None:
    table = Table()
    table.plan(ORDERS, ACME, at("2026-11-29", "10:46"))
    table.finish(ACME, ORDERS)
    assert not table.plan(ORDERS, ACME, at("2026-11-29", "10:59:59")).added
    # Even a planner that missed the first refresh would propose its dedup key, and be refused.
    missed = Existing(oldest_initial_start=at("2026-09-30"), coverage_end=NOW)
    blind = missing_jobs(ORDERS, ACME, missed, at("2026-11-29", "10:59"))
    assert [j.dedup_key for j in blind] == ["recurring:2026-11-29T10:45:00Z"]
    (next_period,) = table.plan(ORDERS, ACME, at("2026-11-29", "11:00")).added
    assert next_period.job.dedup_key == "recurring:2026-11-29T11:00:00Z"


def test_a_gap_longer_than_a_slice_is_cut_into_slices() -> None:
    existing = Existing(oldest_initial_start=at("2026-09-30"), coverage_end=NOW)
    back = at("2027-02-12", "08:07")  # the system was down for 75 days
    jobs = missing_jobs(ORDERS, ACME, existing, back)
    assert summary(jobs) == [
        (
            "recurring",
            at("2026-11-29", "10:40"),
            at("2026-12-29", "10:40"),
            "recurring:2027-02-12T08:00:00Z:1",
        ),
        (
            "recurring",
            at("2026-12-29", "10:40"),
            at("2027-01-28", "10:40"),
            "recurring:2027-02-12T08:00:00Z:2",
        ),
        ("recurring", at("2027-01-28", "10:40"), back, "recurring:2027-02-12T08:00:00Z"),
    ]


def test_a_gap_of_exactly_one_slice_is_one_job() -> None:
    existing = Existing(oldest_initial_start=at("2026-09-30"), coverage_end=NOW)
    jobs = missing_jobs(ORDERS, ACME, existing, NOW - ORDERS.overlap + ORDERS.slice)
    assert [(j.window_end - j.window_start) for j in jobs] == [ORDERS.slice]


@pytest.mark.parametrize(
    ("every", "key"),
    [
        (timedelta(minutes=15), "recurring:2026-11-29T10:45:00Z"),
        (timedelta(hours=1), "recurring:2026-11-29T10:00:00Z"),
        (timedelta(days=1), "recurring:2026-11-29T00:00:00Z"),
        (timedelta(minutes=1), "recurring:2026-11-29T10:52:00Z"),
    ],
)
def test_periods_are_aligned_to_the_clock(every: timedelta, key: str) -> None:
    job_type = replace(ORDERS, every=every, overlap=timedelta(0))
    existing = Existing(oldest_initial_start=at("2026-09-30"), coverage_end=NOW)
    (refresh,) = missing_jobs(job_type, ACME, existing, at("2026-11-29", "10:52:17.25"))
    assert refresh.dedup_key == key
    assert refresh.window_end == at("2026-11-29", "10:52:17.25"), "the window ends at the instant"


def test_dedup_keys_are_utc_whatever_the_zone_of_the_clock() -> None:
    berlin = timezone(timedelta(hours=1))
    assert missing_jobs(ORDERS, ACME, Existing(), NOW.astimezone(berlin)) == missing_jobs(
        ORDERS, ACME, Existing(), NOW
    )
    late = datetime(2026, 11, 30, 0, 30, tzinfo=berlin)  # still 2026-11-29 in UTC
    (newest, *_) = missing_jobs(ORDERS, ACME, Existing(), late)
    assert newest.window_end == at("2026-11-29")
    assert newest.dedup_key == "initial:2026-10-30T00:00:00Z"


def test_planning_twice_at_the_same_instant_adds_nothing() -> None:
    table = Table()
    for job_type in (ORDERS, PRODUCTS):
        assert table.plan(job_type, ACME, NOW).added
        assert not table.plan(job_type, ACME, NOW).added


# -- examples: the snapshot rule -----------------------------------------------------------------


def test_a_snapshot_type_gets_one_initial_job() -> None:
    table = Table()
    (initial,) = table.plan(PRODUCTS, ACME, NOW).added
    assert summary([initial]) == [("initial", None, None, "initial")]
    table.finish(ACME, PRODUCTS)
    later = table.plan(PRODUCTS, ACME, NOW + timedelta(days=3))
    assert [r.job.mode for r in later.added] == ["recurring"]


def test_no_snapshot_refresh_in_the_period_the_initial_job_was_created() -> None:
    table = Table()
    table.plan(PRODUCTS, ACME, NOW)
    table.finish(ACME, PRODUCTS)
    assert not table.plan(PRODUCTS, ACME, at("2026-11-29", "23:59:59")).proposed


def test_one_snapshot_refresh_per_later_period() -> None:
    table = Table()
    table.plan(PRODUCTS, ACME, NOW)
    table.finish(ACME, PRODUCTS)
    (refresh,) = table.plan(PRODUCTS, ACME, at("2026-11-30", "00:00:01")).added
    assert summary([refresh]) == [("recurring", None, None, "recurring:2026-11-30T00:00:00Z")]
    table.finish(ACME, PRODUCTS)
    assert not table.plan(PRODUCTS, ACME, at("2026-11-30", "18:00")).added
    (refresh,) = table.plan(PRODUCTS, ACME, at("2026-12-04", "09:00")).added
    assert refresh.job.dedup_key == "recurring:2026-12-04T00:00:00Z", (
        "missed days are not caught up"
    )


@pytest.mark.parametrize("status", OPEN)
def test_no_snapshot_refresh_while_a_job_is_open(status: str) -> None:
    table = Table()
    table.plan(PRODUCTS, ACME, NOW)
    table.finish(ACME, PRODUCTS, status)  # the initial job
    assert not table.plan(PRODUCTS, ACME, NOW + timedelta(days=2)).added
    table.finish(ACME, PRODUCTS)
    table.plan(PRODUCTS, ACME, NOW + timedelta(days=2))
    table.finish(ACME, PRODUCTS, status)  # the first refresh
    assert not table.plan(PRODUCTS, ACME, NOW + timedelta(days=3)).added


# -- a long outage is capped ---------------------------------------------------------------------


def test_a_gap_longer_than_the_cap_is_loaded_in_parts_oldest_first_without_a_gap() -> None:
    """A month-long outage in slices of 15 minutes would be 2,880 jobs in one call (a year's,
    35,040): each call adds the oldest MAX_REFRESH_SLICES of them; while they are open nothing
    more is added; the next call continues where they end; the last part ends now."""
    quarter = replace(ORDERS, slice=timedelta(minutes=15), overlap=timedelta(0))
    table = Table()
    table.plan(quarter, ACME, NOW)
    table.finish(ACME, quarter)
    back = NOW + timedelta(days=30)
    made: list[Row] = []
    for _ in range(10):
        plan = table.plan(quarter, ACME, back)
        recurring = [r for r in plan.added if r.job.mode == "recurring"]
        assert len(recurring) <= MAX_REFRESH_SLICES + 1
        if not recurring:
            break
        assert not table.plan(quarter, ACME, back).added, "nothing more while a part is open"
        made += recurring
        table.finish(ACME, quarter)
    windows = sorted(r.window for r in made)
    assert windows[0][0] == NOW, "the first part starts where coverage ended"
    assert windows[-1][1] == back, "the last part ends now"
    for (_, end), (start, _) in pairwise(windows):
        assert start == end, "parts follow each other without a gap or an overlap"
    assert len(made) == 30 * 96
    keys = [r.job.dedup_key for r in made]
    assert len(set(keys)) == len(keys)
    assert f"recurring:{iso(period_start(back, quarter.every))}:{iso(NOW)}" in keys
