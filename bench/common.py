"""Shared pieces of the benchmarks: the database, a fresh schema, timing."""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def bench_dsn() -> str:
    """SYNCLANE_BENCH_DSN, else SYNCLANE_TEST_DSN, else the local PostgreSQL."""
    return (
        os.environ.get("SYNCLANE_BENCH_DSN") or os.environ.get("SYNCLANE_TEST_DSN") or DEFAULT_DSN
    )


@contextmanager
def fresh_schema(dsn: str, prefix: str = "bench") -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:.2f} ms, "
        f"p95 {percentile(values, 0.95) * 1000:.2f} ms"
    )
