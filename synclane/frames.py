"""Rows as pandas DataFrames. Imported only when a DataFrame is asked for: workers never pay for
pandas.

A column name means one thing in every frame, so its dtype is decided by its name: timestamps
are tz-aware UTC, counts nullable integers, durations timedeltas, statuses, modes and states
categoricals that list every value even when a frame holds none of it (so a pivot or a
`value_counts()` shows the zeros)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from synclane.model import MODES, STATUSES, WORKER_STATES

# What `progress()` says about an owner and type; docs/sdk.md defines each.
STATES = ("connecting", "loading", "loaded", "throttled", "failing", "abandoned", "cancelled")

TIMESTAMPS = frozenset(
    {
        "window_start",
        "window_end",
        "next_run_at",
        "lease_expires_at",
        "created_at",
        "started_at",
        "heartbeat_at",
        "completed_at",
        "coverage_start",
        "coverage_end",
        "last_completed_at",
        "first_seen",
        "last_seen",
        "since",
        "next_due",
        "paused_until",
        "period",
        "paused_at",
        "last_seen_at",
    }
)
INTEGERS = frozenset(
    {
        "id",
        "job_id",
        "jobs",
        "due",
        "waiting",
        "owner_count",
        "priority",
        "processed_count",
        "attempt_count",
        "throttle_count",
        "slices_total",
        "slices_completed",
        "slices_failed",
        "slices_open",
        "slices_cancelled",
        "records",
        "failed",
        "deferred",
        "abandoned",
        "rate_count",
        "rate_left",
        "pid",
        "slots",
        "busy",
    }
)
FLOATS = frozenset({"percent", "jobs_per_minute", "records_per_minute"})
DURATIONS = frozenset({"age", "running_for", "eta", "duration", "rate_period"})
STRINGS = frozenset(
    {
        "queue",
        "owner",
        "lane",
        "type",
        "dedup_key",
        "cursor",
        "error",
        "leased_by",
        "cause",
        "cause_id",
        "example",
        "paused_by",
        "pause_reason",
        "name",
        "host",
        "version",
    }
)
CATEGORIES: dict[str, tuple[str, ...]] = {"status": STATUSES, "mode": MODES, "state": STATES}


def typed_frame(columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> pd.DataFrame:
    """A frame of these rows, each column typed by its name (also when there are no rows)."""
    frame = pd.DataFrame.from_records(list(rows), columns=list(columns))
    for name in frame.columns:
        frame[name] = _typed(str(name), frame[name])
    return frame


def _typed(name: str, column: pd.Series) -> Any:
    if name in TIMESTAMPS:
        return pd.to_datetime(column, utc=True).astype("datetime64[us, UTC]")
    if name in INTEGERS:
        return column.astype("Int64")
    if name in FLOATS:
        return column.astype("Float64")
    if name in DURATIONS:
        return pd.to_timedelta(column).astype("timedelta64[us]")
    if name == "lease_token":
        return column.map(lambda token: None if token is None else str(token)).astype("string")
    if name in STRINGS:
        return column.astype("string")
    if name in CATEGORIES:
        return pd.Categorical(column, categories=CATEGORIES[name])
    return column


def workers_frame(columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> pd.DataFrame:
    """The workers list: its `state` is a worker's (WORKER_STATES), not an owner's."""
    at = list(columns).index("state")
    frame = typed_frame(
        [name for name in columns if name != "state"], [row[:at] + row[at + 1 :] for row in rows]
    )
    states = pd.Categorical([row[at] for row in rows], categories=WORKER_STATES)
    frame.insert(at, "state", pd.Series(states, index=frame.index))
    return frame


def throughput_frame(
    columns: Sequence[str], rows: Sequence[tuple[Any, ...]], by: str | None
) -> pd.DataFrame:
    """The per-period counts; the grouping column is named after what it groups by."""
    frame = typed_frame(columns, rows)
    if by is None:
        return frame.drop(columns="key")
    frame = frame.rename(columns={"key": by})
    frame[by] = frame[by].astype("string")
    return frame
