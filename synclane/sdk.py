"""The notebook SDK: `jobs`, `progress`, `failures`, `depth`, `lanes`, `coverage`,
`throughput` and `workers`. Each checks its filters, runs one statement of sql/reads.sql (the
workers': sql/workers.sql) that aggregates in the database, and returns a typed DataFrame
(synclane.frames). docs/sdk.md has every column.

`Reads` carries the calls; SyncLane inherits them. A Reads needs exactly two things: `database`
(where to read) and `catalog` (the declared queues, to check a queue's name). pandas is imported
only when a frame is made, so `import synclane` and the workers never load it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from synclane.connection import Database
from synclane.model import MAX_DURATION, STATUSES, ConfigError, check_aware, to_duration
from synclane.operations import REQUEUE_STATUSES, job_id_list
from synclane.queues import Catalog

if TYPE_CHECKING:
    import pandas as pd

# A point in time for a filter: an aware datetime, or a timedelta meaning that long before now
# (on the database clock).
When = datetime | timedelta | None

OPEN = ("pending", "running", "failed", "deferred")
# Errors are cut to their first line, at most this long, unless full_errors=True.
ERROR_WIDTH = 120
# How many job ids a row of failures() lists (the newest).
IDS_SHOWN = 20
# The most periods throughput() returns in one frame.
MAX_PERIODS = 100_000
# The most rows progress() returns unless told otherwise: an answer of this size takes a
# fraction of a second (bench/sdk.py --shape accounts); a hundred thousand owners take seconds.
PROGRESS_LIMIT = 10_000


class Reads:
    """The notebook SDK's calls. A subclass provides `database` and `catalog`."""

    database: Database
    catalog: Catalog

    def jobs(
        self,
        queue: str | None = None,
        owner: str | None = None,
        status: str | Sequence[str] | None = None,
        type: str | None = None,
        limit: int = 1000,
        *,
        lane: str | None = None,
        ids: Sequence[int] | None = None,
        since: When = None,
        until: When = None,
        full_errors: bool = False,
    ) -> pd.DataFrame:
        """Jobs as a DataFrame, newest first; `since`/`until` bound `created_at`. Errors are cut
        to their first line unless `full_errors`."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise ConfigError(
                f"limit={limit!r:.100} must be a whole number from 1 to {MAX_LIMIT:,}"
            )
        params = {
            "queue": self._queue(queue),
            "owner": owner,
            "type": type,
            "lane": lane,
            "statuses": _statuses("status", status, STATUSES),
            "ids": None if ids is None else job_id_list(ids),
            "limit": limit,
            **_range(since, until),
            **_errors(full_errors),
        }
        return self._frame("list_jobs", params)

    def progress(
        self,
        queue: str,
        owner: str | None = None,
        type: str | None = None,
        *,
        state: str | Sequence[str] | None = None,
        recent: timedelta | float = timedelta(hours=1),
        limit: int | None = PROGRESS_LIMIT,
    ) -> pd.DataFrame:
        """One row per owner and type: how far the first load is, its state and an ETA from the
        slices completed in the last `recent`. At most `limit` rows, the first by owner and type
        (None: all of them); a cut answer warns."""
        from synclane import frames

        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT
        ):
            raise ConfigError(
                f"limit={limit!r:.100} must be a whole number from 1 to {MAX_LIMIT:,}, or None "
                "for every owner and type"
            )
        params = {
            "queue": self.catalog.get(queue).name,
            "owner": owner,
            "type": type,
            "states": _statuses("state", state, frames.STATES),
            "recent": to_duration("recent", recent),
            # one row more than asked for says whether the answer was cut
            "limit": None if limit is None else limit + 1,
        }
        columns, rows = self._rows("progress", params)
        if limit is not None and len(rows) > limit:
            del rows[limit:]
            warnings.warn(
                f"progress({params['queue']!r}) returned the first {limit:,} owners and types; "
                "narrow it with owner=, type= or state=, or pass limit=None for all of them",
                stacklevel=2,
            )
        return frames.typed_frame(columns, rows)

    def failures(
        self,
        queue: str | None = None,
        owner: str | None = None,
        type: str | None = None,
        *,
        status: str | Sequence[str] | None = None,
        since: When = None,
        until: When = None,
        full_errors: bool = False,
    ) -> pd.DataFrame:
        """Open failures (failed, deferred, abandoned) grouped by cause: the error's first line
        with numbers, hex strings and UUIDs masked, and a short `cause_id`.
        `requeue(queue, cause=...)` or `requeue(queue, cause_id=...)` takes a row's cause."""
        params = {
            "queue": self._queue(queue),
            "owner": owner,
            "type": type,
            "statuses": _statuses("status", status, REQUEUE_STATUSES),
            "ids_shown": IDS_SHOWN,
            **_range(since, until),
            **_errors(full_errors),
        }
        return self._frame("failures", params)

    def depth(
        self,
        queue: str | None = None,
        owner: str | None = None,
        type: str | None = None,
        *,
        status: str | Sequence[str] | None = None,
    ) -> pd.DataFrame:
        """Open jobs counted by queue, lane and status; a paused queue's rows say since when,
        by whom and why (`paused_at`, `paused_by`, `pause_reason`)."""
        params = {
            "queue": self._queue(queue),
            "owner": owner,
            "type": type,
            "statuses": _statuses("status", status, OPEN),
        }
        frame = self._frame("depth", params)
        pauses = self._frame("paused_queues", {"queue": params["queue"]})
        return frame.merge(pauses, on="queue", how="left")

    def lanes(self, queue: str | None = None, *, lane: str | None = None) -> pd.DataFrame:
        """One row per lane with open jobs: what runs there now, who holds it, since when; and
        for a queue with `lane_rate`, the lane's rate and the page starts it has left now."""
        frame = self._frame("lanes", {"queue": self._queue(queue), "lane": lane})
        rated = [q for q in self.catalog.values() if q.settings.lane_rate is not None]
        params = {
            "queues": [q.name for q in rated],
            "counts": [q.settings.lane_rate.count for q in rated if q.settings.lane_rate],
            "periods": [q.settings.lane_rate.per for q in rated if q.settings.lane_rate],
            "lane": lane,
        }
        quotas = self._frame("lane_quotas", params)
        frame = frame.merge(quotas, on=["queue", "lane"], how="left")
        overrides = self._rows("queue_rate_overrides", {})[1]
        declared = {
            q.name: (q.settings.lane_rate.count, q.settings.lane_rate.per)
            for q in rated
            if q.settings.lane_rate
        }
        declared |= {queue: (count, period) for queue, count, period in overrides}
        # a lane that never started a page under its rate has the whole of it left
        for name, (count, period) in declared.items():
            fresh = (frame["queue"] == name) & frame["rate_count"].isna()
            frame.loc[fresh, "rate_count"] = count
            frame.loc[fresh, "rate_left"] = count
            frame.loc[fresh, "rate_period"] = period
        return frame

    def coverage(
        self,
        queue: str,
        owner: str | None = None,
        type: str | None = None,
        *,
        status: str | Sequence[str] | None = None,
        since: When = None,
        until: When = None,
    ) -> pd.DataFrame:
        """The windows of each owner and type as spans with a status, ready for a timeline
        (synclane.plots.coverage_timeline)."""
        params = {
            "queue": self.catalog.get(queue).name,
            "owner": owner,
            "type": type,
            "statuses": _statuses("status", status, STATUSES),
            **_range(since, until),
        }
        return self._frame("coverage", params)

    def throughput(
        self,
        queue: str | None = None,
        owner: str | None = None,
        type: str | None = None,
        *,
        since: When = None,
        until: When = None,
        every: timedelta | float = timedelta(minutes=1),
        by: str | None = None,
    ) -> pd.DataFrame:
        """Records and completed jobs per period (a minute by default) over the last hour, or
        `since`..`until`; `by` splits them per queue, owner, lane or type."""
        step = to_duration("every", every)
        if step < timedelta(seconds=1):
            raise ConfigError(f"every={step} is shorter than a second; use e.g. every=60")
        if by is not None and by not in BY:
            raise ConfigError(f"by={by!r}: throughput groups by one of {', '.join(BY)}, or None")
        since = timedelta(hours=1) if since is None else since
        until = timedelta(0) if until is None else until
        bounds = _range(since, until)
        # Checked on this machine's clock: only the size of the answer depends on it.
        now = datetime.now(UTC)
        start = (bounds["since"] or now - bounds["since_ago"]).astimezone(UTC)
        end = (bounds["until"] or now - bounds["until_ago"]).astimezone(UTC)
        if end <= start:
            raise ConfigError(
                f"since ({start:%Y-%m-%d %H:%M:%S} UTC) must be before until "
                f"({end:%Y-%m-%d %H:%M:%S} UTC)"
            )
        if (end - start) / step > MAX_PERIODS:
            raise ConfigError(
                f"{(end - start) / step:,.0f} periods of {step} between since and until; ask "
                f"for at most {MAX_PERIODS:,} (a larger `every` or a shorter range)"
            )
        params = {
            "queue": self._queue(queue),
            "owner": owner,
            "type": type,
            "every": step.total_seconds(),
            "by": by,
            **bounds,
        }
        from synclane import frames

        return frames.throughput_frame(*self._rows("throughput", params), by)

    def workers(self, queue: str | None = None) -> pd.DataFrame:
        """The worker processes that share the table (or work `queue`), one row each: what
        they work, how many slots run a job, when each was last seen, and its state: running,
        stopping, or lost (it died; its row goes an hour later). A running job's `leased_by` is
        a worker's `name`."""
        from synclane import frames

        return frames.workers_frame(*self._rows("workers", {"queue": self._queue(queue)}))

    # -- reading ---------------------------------------------------------------------------

    def _queue(self, queue: str | None) -> str | None:
        return None if queue is None else self.catalog.get(queue).name

    def _frame(self, name: str, params: Mapping[str, Any]) -> pd.DataFrame:
        from synclane import frames

        return frames.typed_frame(*self._rows(name, params))

    def _rows(
        self, name: str, params: Mapping[str, Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """One read statement: column names and rows."""
        _check_text(params)
        with self.database.connection() as conn, conn.transaction():
            conn.execute(READ_SETTINGS)
            store = self.database.store
            if store.fits_cache(name):
                cur = conn.execute(store.query(name), params)
            else:
                # progress() is longer than psycopg keeps converted: sent as it is, with
                # PostgreSQL's own placeholders, as the worker's take statements are
                query, names = store.positional(name)
                cur = psycopg.RawCursor(conn).execute(query, [params[n] for n in names])
            return [d.name for d in cur.description or []], cur.fetchall()


# The settings of each read, for its transaction alone (so also through a transaction pooler),
# sent together:
# - Short aggregates over many rows: compiling them (JIT) costs more than it saves (bench/sdk.py:
#   progress() over 1M jobs, 0.5 s with JIT, 0.12 s without).
# - Filters read `(%(owner)s IS NULL OR owner = %(owner)s)`: only a plan made for the values given
#   turns that into an index lookup, also once psycopg has prepared the statement (after five
#   calls) and PostgreSQL would switch to a generic plan.
# - Grouping a hundred thousand open rows or history slices sorts or hashes them: in memory, not
#   spilled to disk in 4 MB runs (the server's default work_mem).
# - psycopg reads times and durations as text only in PostgreSQL's default styles: a database or
#   role with `DateStyle = 'SQL, DMY'` or `IntervalStyle = 'sql_standard'` made jobs() fail with
#   "can't parse timestamptz with DateStyle 'SQL, DMY'".
READ_SETTINGS = (
    "SET LOCAL jit = off; SET LOCAL plan_cache_mode = force_custom_plan; "
    "SET LOCAL work_mem = '64MB'; SET LOCAL DateStyle = 'ISO'; "
    "SET LOCAL IntervalStyle = 'postgres'"
)

BY = ("queue", "owner", "lane", "type")
# The most rows jobs() returns at once.
MAX_LIMIT = 1_000_000


# -- filters ---------------------------------------------------------------------------------

TEXT_FILTERS = ("queue", "owner", "type", "lane", "cause")


def _check_text(params: Mapping[str, Any]) -> None:
    """A filter PostgreSQL text cannot hold is a mistake to name, not a DataError to show."""
    for key in TEXT_FILTERS:
        value = params.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a str, got {type(value).__name__} {value!r}")
        if "\x00" in value:
            raise ConfigError(f"{key} {value!r} contains a NUL byte, which no stored name holds")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{key} {value!r} is not valid Unicode text") from None


def _statuses(
    what: str, value: str | Sequence[str] | None, allowed: Sequence[str]
) -> list[str] | None:
    if value is None:
        return None
    values = [value] if isinstance(value, str) else list(value)
    for item in values:
        if item not in allowed:
            raise ConfigError(f"unknown {what} {item!r}; use one of {', '.join(allowed)}")
    return values


def _instant(name: str, value: When) -> tuple[datetime | None, timedelta | None]:
    """A datetime as it is, a timedelta as 'that long ago' (negative: from now on)."""
    if value is None:
        return None, None
    if isinstance(value, timedelta):
        if abs(value) > MAX_DURATION:
            raise ConfigError(
                f"{name}={value} reaches further than 100 years from now; pass a shorter "
                "timedelta, or an aware datetime"
            )
        return None, value
    if isinstance(value, datetime):
        return check_aware(name, value), None
    raise ConfigError(
        f"{name} must be an aware datetime or a timedelta (that long ago), got "
        f"{type(value).__name__} {value!r}"
    )


def _range(since: When, until: When) -> dict[str, Any]:
    since_at, since_ago = _instant("since", since)
    until_at, until_ago = _instant("until", until)
    return {"since": since_at, "since_ago": since_ago, "until": until_at, "until_ago": until_ago}


def _errors(full_errors: bool) -> dict[str, Any]:
    return {"full_errors": bool(full_errors), "error_width": ERROR_WIDTH}
