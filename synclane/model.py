"""The words of the domain: owners, jobs, pages, settings. Pure values, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

STATUSES = ("pending", "running", "completed", "failed", "deferred", "abandoned", "cancelled")
MODES = ("initial", "recurring", "manual")
Mode = Literal["initial", "recurring", "manual"]
# What the `workers` statement says of a worker: it beats, it was asked to stop and hands its
# jobs back, or it died (stopped beating, or its session to PostgreSQL is gone).
WORKER_STATES = ("running", "stopping", "lost")

# A worker working "until idle" waits for jobs that become due within this long (a retry, a lane
# whose throttle ends soon) before it calls itself idle.
IDLE_GRACE = timedelta(seconds=30)

# Longest text synclane stores for a name (queue, owner, lane, type, dedup key), in bytes of
# UTF-8: four of them make one entry of the dedup index, which must fit PostgreSQL's btree limit
# (about 2,700 bytes) whatever the script. And the longest error, in characters.
MAX_NAME_LENGTH = 512
MAX_ERROR_LENGTH = 2000
# The longest reason an operator gives for a pause or a cancel, in characters, in Python and on
# the command line alike (a cancel keeps "Cancelled: <reason>" as the jobs' error).
MAX_REASON_LENGTH = 1000
# The longest duration a setting may have. Longer ones overflow PostgreSQL's timestamps (or
# Python's dates) once added to now, and mean "never" anyway.
MAX_DURATION = timedelta(days=36525)
# The most history slices one owner and type may have: more would make planning itself the
# heavy job (a two-year horizon in hourly slices is 17,520).
MAX_SLICES = 100_000
# processed_count is a bigint.
MAX_COUNT = 2**63 - 1
# What an integer column or parameter holds (attempt_count, max_attempts, queue_slot, max_running).
MAX_INTEGER = 2**31 - 1
# A lane's slot number is a smallint; a rate remembers its last `count` starts per lane.
MAX_LANE_WIDTH = 32_767
MAX_RATE_COUNT = 10_000
# Slots of one queue in one process (each may hold a connection of the worker's pool); more
# work at once is more processes.
MAX_CONCURRENCY = 1_000
# Work runs a Prefect deployment or a Dagster schedule keeps going at once, and the seconds each
# works (`synclane serve --work-runs`, `--work-budget`).
MAX_WORK_RUNS = 1_000
MAX_WORK_BUDGET = 86_400
# The instants a window or a filter may name: a day inside Python's years on either side, so
# that no conversion (a time zone, a day's arithmetic) leaves them.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)


class ConfigError(ValueError):
    """A setting or an argument is wrong. The message names it and says how to fix it."""


def check_name(what: str, value: object) -> str:
    """A queue, owner, lane or type name: a non-empty string PostgreSQL text can hold."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a str, got {type(value).__name__} {value!r:.100}")
    if not value:
        raise ConfigError(f"{what} must not be empty")
    problem = unstorable(value)
    if problem:
        raise ConfigError(f"{what} {value!r:.100} contains {problem}")
    size = len(value.encode("utf-8"))
    if size > MAX_NAME_LENGTH:
        raise ConfigError(
            f"{what} is {size} bytes long in UTF-8 ({len(value)} characters); keep it to "
            f"{MAX_NAME_LENGTH} bytes"
        )
    return value


def check_reason(what: str, value: object, example: str) -> str:
    """An operator's reason (a pause, a cancel): a str with more than blanks, of at most
    MAX_REASON_LENGTH characters. What PostgreSQL text cannot hold is left out when it is
    stored (operations.storable), not refused: it is free text."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} needs a reason, e.g. {example}")
    if len(value) > MAX_REASON_LENGTH:
        raise ConfigError(
            f"{what}: the reason is {len(value):,} characters long; keep it to "
            f"{MAX_REASON_LENGTH:,}"
        )
    return value


def unstorable(text: str) -> str | None:
    """Why PostgreSQL text (UTF-8) cannot hold this string, or None when it can."""
    if "\x00" in text:
        return "a NUL byte, which PostgreSQL text cannot hold"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (
            f"a lone surrogate ({text[error.start]!r}) at position {error.start}, which is not "
            "text UTF-8 can encode; decode the bytes it came from with errors='replace'"
        )
    return None


def to_duration(setting: str, value: object, *, allow_zero: bool = False) -> timedelta:
    """A duration given as a timedelta or as seconds; positive unless allow_zero."""
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigError(f"{setting}={value!r} is not a finite number of seconds")
        try:
            duration = timedelta(seconds=value)
        except OverflowError:
            raise ConfigError(
                f"{setting}={value!r} seconds is longer than 100 years; use a shorter duration"
            ) from None
    else:
        raise ConfigError(
            f"{setting} must be a timedelta or a number of seconds, got {type(value).__name__} "
            f"{value!r}"
        )
    if duration < timedelta(0) or (duration == timedelta(0) and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{setting}={duration} must be {bound}, e.g. timedelta(minutes=5)")
    if duration > MAX_DURATION:
        raise ConfigError(f"{setting}={duration} is longer than 100 years; use a shorter duration")
    return duration


def check_whole(setting: str, value: object, most: int, why: str) -> int:
    """A count from 1 to `most` (what its column or parameter holds; `why` says which)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
        raise ConfigError(
            f"{setting}={value!r:.100} must be a whole number from 1 to {most:,} ({why})"
        )
    return value


def check_slices(name: str, horizon: timedelta, slice: timedelta) -> None:
    """A horizon cut into at most MAX_SLICES slices."""
    if horizon / slice > MAX_SLICES:
        raise ConfigError(
            f"{name}: horizon={horizon} in slices of {slice} makes {horizon // slice:,} slices "
            f"per owner; keep it to {MAX_SLICES:,}: use a longer slice"
        )


def check_aware(setting: str, value: datetime | None) -> datetime | None:
    """An instant that PostgreSQL stores and Python reads back: aware (a naive datetime would
    mean a different time on every machine) and inside Python's years once in UTC (datetime.max
    west of UTC is the year 10000 in UTC: stored, then unreadable). Returned in UTC."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ConfigError(f"{setting} must be a datetime, got {type(value).__name__} {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigError(
            f"{setting}={value!r} has no time zone; pass an aware datetime such as "
            "datetime(2026, 1, 1, tzinfo=timezone.utc)"
        )
    try:
        utc = value.astimezone(UTC)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not EARLIEST <= utc <= LATEST:
        raise ConfigError(
            f"{setting}={value.isoformat()} is outside the years synclane reads back "
            f"({EARLIEST.year}–{LATEST.year} in UTC); for an open end pass None"
        )
    plain = getattr(utc, "to_pydatetime", None)  # a pandas Timestamp
    result: datetime = plain() if callable(plain) else utc
    return result


@dataclass(frozen=True)
class Owner:
    """One connected account. Owners that share a rate limit share a lane.

    Building one never raises: an owner source that makes one Owner PostgreSQL cannot store
    must not lose the others. The planner checks each owner (`check()`) and leaves out, with
    one logged line, those it cannot store."""

    id: str
    lane: str | None = None

    def check(self) -> Owner:
        """This owner, or a ConfigError saying why its id or lane cannot be stored."""
        check_name("Owner id", self.id)
        if self.lane is not None:
            check_name(f"lane of owner {self.id!r:.100}", self.lane)
        return self

    @property
    def lane_key(self) -> str:
        return self.lane if self.lane is not None else self.id


@dataclass(frozen=True)
class Job:
    """What a handler receives: one row of the table, read-only."""

    id: int
    queue: str
    owner: str
    lane: str
    type: str
    mode: Mode
    window_start: datetime | None
    window_end: datetime | None
    cursor: str | None
    attempt_count: int
    processed_count: int


@dataclass(frozen=True)
class Page:
    """A handler's answer: where the next page starts (None: done) and how many records it saw."""

    next_cursor: str | None
    count: int = 0
    # How many calls the page made to the other side: a queue with lane_rate counts one start
    # before the page, and the rest once it ends (later pages of the lane wait for them).
    calls: int = 1

    def __post_init__(self) -> None:
        if (
            not isinstance(self.calls, int)
            or isinstance(self.calls, bool)
            or not 0 <= self.calls <= MAX_RATE_COUNT
        ):
            raise ValueError(
                f"Page.calls must be a whole number from 0 to {MAX_RATE_COUNT:,}, got "
                f"{self.calls!r:.100}"
            )
        if self.next_cursor is not None and not isinstance(self.next_cursor, str):
            raise TypeError(
                f"Page.next_cursor must be a str or None, got {type(self.next_cursor).__name__} "
                f"{self.next_cursor!r}; convert it with str()"
            )
        problem = None if self.next_cursor is None else unstorable(self.next_cursor)
        if problem:
            raise ValueError(f"Page.next_cursor contains {problem}")
        if (
            not isinstance(self.count, int)
            or isinstance(self.count, bool)
            or not 0 <= self.count <= MAX_COUNT
        ):
            raise ValueError(
                f"Page.count must be an int >= 0 (and < 2**63), got {self.count!r:.100}"
            )


def page_of(job_type: str, result: object) -> Page:
    """A handler's result as a Page, or the TypeError that fails its job (the worker and
    synclane.testing say the same)."""
    if not isinstance(result, Page):
        raise TypeError(
            f"the {job_type} handler returned {type(result).__name__} {result!r:.200}; "
            "return Page(next_cursor, count)"
        )
    return result


class Throttled(Exception):
    """The other side asked to slow down: pause the whole lane, keep the attempt."""

    def __init__(self, retry_after: timedelta | float | None = None, message: str = "") -> None:
        self.retry_after = (
            None
            if retry_after is None
            else to_duration("retry_after", retry_after, allow_zero=True)
        )
        super().__init__(message or "the API asked to slow down")


class Abandon(Exception):
    """A retry cannot help (access revoked, account gone): stop at once and wait for a human."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Rate:
    """At most `count` page starts per lane in any `per` (a sliding window on the database's
    clock, shared by every process): `Rate(2, timedelta(seconds=1))`, or `(2, 1)`."""

    count: int
    per: timedelta

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 1:
            raise ConfigError(f"a rate's count={self.count!r:.50} must be a whole number >= 1")
        if self.count > MAX_RATE_COUNT:
            raise ConfigError(
                f"a rate's count={self.count} is over {MAX_RATE_COUNT:,} starts per period; "
                "use a shorter period"
            )
        object.__setattr__(self, "per", to_duration("a rate's period", self.per))

    @classmethod
    def of(cls, setting: str, value: object) -> Rate | None:
        """None, a Rate, or a (count, period) pair as a Rate; a ConfigError naming `setting`."""
        if value is None or isinstance(value, Rate):
            return value
        if isinstance(value, tuple | list) and len(value) == 2:
            try:
                return cls(value[0], value[1])
            except ConfigError as error:
                raise ConfigError(f"{setting}: {error}") from None
        raise ConfigError(
            f"{setting}={value!r:.100} must be a Rate or a (count, period) pair, e.g. "
            "(2, timedelta(seconds=1)) for 2 page starts a second per lane"
        )

    def __str__(self) -> str:
        return f"{self.count} per {self.per}"


@dataclass(frozen=True)
class QueueSettings:
    concurrency: int = 1
    max_attempts: int = 5
    lease_duration: timedelta = timedelta(minutes=5)
    retry_base_delay: timedelta = timedelta(minutes=1)
    retry_max_delay: timedelta = timedelta(hours=1)
    throttle_base_delay: timedelta = timedelta(minutes=5)
    throttle_max_delay: timedelta = timedelta(minutes=30)
    lane_width: int = 1
    max_running: int | None = None
    lane_rate: Rate | None = None
    # How often the elected planner reads the owner source to its end (planning what is due
    # runs every plan_interval), and how long finished rows are kept (None: for ever).
    owners_interval: timedelta = timedelta(minutes=5)
    retention: timedelta | None = None

    def __post_init__(self) -> None:
        for name, most, why in (
            ("concurrency", MAX_CONCURRENCY, "for more at once, start more worker processes"),
            ("max_attempts", MAX_INTEGER, "attempts are counted in an integer column"),
            ("lane_width", MAX_LANE_WIDTH, "a lane's slot is a smallint column"),
        ):
            check_whole(name, getattr(self, name), most, why)
        if self.max_running is not None:
            check_whole(
                "max_running",
                self.max_running,
                MAX_INTEGER,
                "a queue's slot is an integer column; None for no cap",
            )
        object.__setattr__(self, "lane_rate", Rate.of("lane_rate", self.lane_rate))
        for name in (
            "lease_duration",
            "retry_base_delay",
            "retry_max_delay",
            "throttle_base_delay",
            "throttle_max_delay",
            "owners_interval",
        ):
            object.__setattr__(self, name, to_duration(name, getattr(self, name)))
        if self.retention is not None:
            object.__setattr__(self, "retention", to_duration("retention", self.retention))
        if self.lease_duration < timedelta(seconds=1):
            raise ConfigError(
                f"lease_duration={self.lease_duration} is too short to renew in time; use >= 1 s"
            )
        if self.retry_base_delay > self.retry_max_delay:
            raise ConfigError(
                f"retry_base_delay={self.retry_base_delay} exceeds retry_max_delay="
                f"{self.retry_max_delay}; raise retry_max_delay or lower the base"
            )
        if self.throttle_base_delay > self.throttle_max_delay:
            raise ConfigError(
                f"throttle_base_delay={self.throttle_base_delay} exceeds throttle_max_delay="
                f"{self.throttle_max_delay}; raise throttle_max_delay or lower the base"
            )


@dataclass(frozen=True)
class SnapshotType:
    """No window: one initial job, then one recurring job per period."""

    name: str
    every: timedelta
    priority: int = 0
    kind: Literal["snapshot"] = field(default="snapshot", init=False)

    def __post_init__(self) -> None:
        check_name("type name", self.name)
        object.__setattr__(self, "every", to_duration(f"{self.name}: every", self.every))


@dataclass(frozen=True)
class WindowedType:
    """History cut into slices back to a horizon, then one recurring job per period."""

    name: str
    horizon: timedelta
    slice: timedelta
    every: timedelta
    overlap: timedelta = timedelta(0)
    priority: int = 0
    kind: Literal["windowed"] = field(default="windowed", init=False)

    def __post_init__(self) -> None:
        check_name("type name", self.name)
        name = self.name
        for setting in ("horizon", "slice", "every"):
            value = to_duration(f"{name}: {setting}", getattr(self, setting))
            object.__setattr__(self, setting, value)
        object.__setattr__(
            self, "overlap", to_duration(f"{name}: overlap", self.overlap, allow_zero=True)
        )
        if self.slice > self.horizon:
            raise ConfigError(
                f"{name}: slice={self.slice} is longer than horizon={self.horizon}; "
                "use a slice no longer than the horizon"
            )
        check_slices(name, self.horizon, self.slice)
        if self.overlap >= self.every:
            raise ConfigError(
                f"{name}: overlap={self.overlap} must be shorter than every={self.every}, "
                "or each refresh would reload more than a whole period"
            )


JobType = SnapshotType | WindowedType
