"""Rows as pandas DataFrames. Imported only when a DataFrame is asked for: workers never pay for
pandas."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from synclane.model import MODES, STATUSES

TIMESTAMPS = (
    "first_seen",
    "last_seen",
    "next_due",
    "since",
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
)
INTEGERS = (
    "id",
    "job_id",
    "jobs",
    "owner_count",
    "waiting",
    "priority",
    "processed_count",
    "attempt_count",
    "throttle_count",
    "slices_total",
    "slices_completed",
    "slices_failed",
    "records",
)
STRINGS = (
    "queue",
    "owner",
    "lane",
    "type",
    "dedup_key",
    "cursor",
    "error",
    "leased_by",
    "cause",
    "example",
)


def _typed(columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(list(rows), columns=list(columns))
    for name in frame.columns:
        if name in TIMESTAMPS:
            frame[name] = pd.to_datetime(frame[name], utc=True).astype("datetime64[us, UTC]")
        elif name in INTEGERS:
            frame[name] = frame[name].astype("Int64")
        elif name in STRINGS:
            frame[name] = frame[name].astype("string")
        elif name == "status":
            frame[name] = pd.Categorical(frame[name], categories=STATUSES)
        elif name == "mode":
            frame[name] = pd.Categorical(frame[name], categories=MODES)
        elif name == "lease_token":
            frame[name] = frame[name].map(lambda token: None if token is None else str(token))
            frame[name] = frame[name].astype("string")
    return frame


def typed_frame(columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> pd.DataFrame:
    return _typed(columns, rows)


jobs_frame = typed_frame


def progress_frame(columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> pd.DataFrame:
    frame = _typed(columns, rows)
    total = frame["slices_total"].astype("Float64")
    percent = (100 * frame["slices_completed"].astype("Float64") / total.where(total > 0)).round(1)
    frame["percent"] = percent.astype("Float64")
    return frame
