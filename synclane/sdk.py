"""The notebook SDK behind `SyncLane.jobs`, `progress`, `failures`, `depth`, `lanes`, `coverage`
and `throughput`: each checks its filters, runs one statement of sql/reads.sql that aggregates
in the database, and returns a typed DataFrame (synclane.frames). docs/sdk.md has every column.

Imported only when a frame is asked for, so `import synclane` and the workers never load pandas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from synclane import frames
from synclane.app import REQUEUE_STATUSES
from synclane.model import STATUSES, ConfigError, check_aware, to_duration

if TYPE_CHECKING:
    import pandas as pd

    from synclane.app import SyncLane

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


def jobs(
    app: SyncLane,
    queue: str | None,
    owner: str | None,
    status: str | Sequence[str] | None,
    type: str | None,
    limit: int,
    *,
    lane: str | None,
    ids: Sequence[int] | None,
    since: When,
    until: When,
    full_errors: bool,
) -> pd.DataFrame:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigError(f"limit={limit!r} must be a whole number >= 1")
    params = {
        "queue": _queue(app, queue),
        "owner": owner,
        "type": type,
        "lane": lane,
        "statuses": _statuses("status", status, STATUSES),
        "ids": _ids(ids),
        "limit": limit,
        **_range(since, until),
        **_errors(full_errors),
    }
    return frames.typed_frame(*_rows(app, "list_jobs", params))


def progress(
    app: SyncLane,
    queue: str,
    owner: str | None,
    type: str | None,
    *,
    state: str | Sequence[str] | None,
    recent: timedelta | float,
) -> pd.DataFrame:
    params = {
        "queue": app.get_queue(queue).name,
        "owner": owner,
        "type": type,
        "states": _statuses("state", state, frames.STATES),
        "recent": to_duration("recent", recent),
    }
    return frames.typed_frame(*_rows(app, "progress", params))


def failures(
    app: SyncLane,
    queue: str | None,
    owner: str | None,
    type: str | None,
    *,
    status: str | Sequence[str] | None,
    since: When,
    until: When,
    full_errors: bool,
) -> pd.DataFrame:
    params = {
        "queue": _queue(app, queue),
        "owner": owner,
        "type": type,
        "statuses": _statuses("status", status, REQUEUE_STATUSES),
        "ids_shown": IDS_SHOWN,
        **_range(since, until),
        **_errors(full_errors),
    }
    return frames.typed_frame(*_rows(app, "failures", params))


def depth(
    app: SyncLane,
    queue: str | None,
    owner: str | None,
    type: str | None,
    *,
    status: str | Sequence[str] | None,
) -> pd.DataFrame:
    params = {
        "queue": _queue(app, queue),
        "owner": owner,
        "type": type,
        "statuses": _statuses("status", status, OPEN),
    }
    return frames.typed_frame(*_rows(app, "depth", params))


def lanes(app: SyncLane, queue: str | None, *, lane: str | None) -> pd.DataFrame:
    params = {"queue": _queue(app, queue), "lane": lane}
    return frames.typed_frame(*_rows(app, "lanes", params))


def coverage(
    app: SyncLane,
    queue: str,
    owner: str | None,
    type: str | None,
    *,
    status: str | Sequence[str] | None,
    since: When,
    until: When,
) -> pd.DataFrame:
    params = {
        "queue": app.get_queue(queue).name,
        "owner": owner,
        "type": type,
        "statuses": _statuses("status", status, STATUSES),
        **_range(since, until),
    }
    return frames.typed_frame(*_rows(app, "coverage", params))


BY = ("queue", "owner", "lane", "type")


def throughput(
    app: SyncLane,
    queue: str | None,
    owner: str | None,
    type: str | None,
    *,
    since: When,
    until: When,
    every: timedelta | float,
    by: str | None,
) -> pd.DataFrame:
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
            f"{(end - start) / step:,.0f} periods of {step} between since and until; ask for "
            f"at most {MAX_PERIODS:,} (a larger `every` or a shorter range)"
        )
    params = {
        "queue": _queue(app, queue),
        "owner": owner,
        "type": type,
        "every": step.total_seconds(),
        "by": by,
        **bounds,
    }
    return frames.throughput_frame(*_rows(app, "throughput", params), by)


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


def _rows(
    app: SyncLane, name: str, params: Mapping[str, Any]
) -> tuple[list[str], list[tuple[Any, ...]]]:
    _check_text(params)
    with app.connection() as conn, conn.transaction():
        # Short aggregates over many rows: compiling them (JIT) costs more than it saves
        # (bench/sdk.py: progress() over 1M jobs, 0.5 s with JIT, 0.12 s without).
        conn.execute("SET LOCAL jit = off")
        # Filters read `(%(owner)s IS NULL OR owner = %(owner)s)`: only a plan made for the
        # values given turns that into an index lookup, also once psycopg has prepared the
        # statement (after five calls) and PostgreSQL would switch to a generic plan.
        conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        return app.store.rows(conn, name, params)


def _queue(app: SyncLane, queue: str | None) -> str | None:
    return None if queue is None else app.get_queue(queue).name


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


def _ids(ids: Sequence[int] | None) -> list[int] | None:
    # numpy integers (a frame's `id` column) become plain ones
    return None if ids is None else [int(i) for i in ids]


def _instant(name: str, value: When) -> tuple[datetime | None, timedelta | None]:
    """A datetime as it is, a timedelta as 'that long ago' (negative: from now on)."""
    if value is None:
        return None, None
    if isinstance(value, timedelta):
        return None, value
    if isinstance(value, datetime):
        check_aware(name, value)
        plain = getattr(value, "to_pydatetime", None)  # a pandas Timestamp
        return (plain() if callable(plain) else value), None
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
