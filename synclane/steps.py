"""Logic that runs statements, written once for psycopg's sync and async connections.

Planning and enqueueing run on the app's own connection, or on the caller's (`conn=`, inside the
caller's transaction), which may be a `psycopg.Connection` or a `psycopg.AsyncConnection`. Their
logic is a generator that yields requests and receives the answers:

    def steps() -> Steps[int]:
        rows = yield Fetch("plan_read", {...})      # -> list of dicts
        added = yield Execute("insert_jobs", {...})  # -> rowcount
        return added

`run(conn, store, steps())` answers them on a sync connection, `await run_async(...)` on an
async one. `Atomic(make_steps)` runs steps in a transaction of their own (a savepoint inside the
caller's); an error inside it is rolled back and then raised where the steps yielded it, so they
can catch it. `Blocking(call)` runs user code (an owner source) where it cannot stall a loop.

On a caller's connection (`caller=True`) that is not in autocommit mode, the caller's own
transaction is opened first if it is not yet, so that everything, savepoints included, commits
or rolls back with it (psycopg would otherwise commit a transaction block that it began itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg.rows import dict_row

from synclane.store import Store

T = TypeVar("T")
IDLE = pq.TransactionStatus.IDLE


@dataclass(frozen=True)
class Fetch:
    """Run a statement; the answer is its rows as dicts."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Execute:
    """Run a statement; the answer is how many rows it changed."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Atomic:
    """Run steps in one transaction (a savepoint when a transaction is open already); the answer
    is what they return. `serializable` asks for SERIALIZABLE isolation where the transaction is
    synclane's own; inside a caller's transaction the caller's isolation stands."""

    steps: Callable[[], Generator[Any, Any, Any]]
    serializable: bool = False


@dataclass(frozen=True)
class Blocking:
    """Call user code that may block; the answer is what it returns."""

    call: Callable[[], Any]


Request = Fetch | Execute | Atomic | Blocking
Steps = Generator[Request, Any, T]


def run(
    conn: psycopg.Connection[Any],
    store: Store,
    steps: Steps[T],
    *,
    caller: bool = False,
    idle_timeout: timedelta | None = None,
) -> T:
    """Answer the steps' requests on a sync connection; returns what the steps return.
    `idle_timeout`: the server ends a transaction of the steps (and the session) whose client
    stops answering for that long (idle_in_transaction_session_timeout, set for the transaction
    alone, so that it also holds through a transaction pooler)."""
    if caller and not conn.autocommit and conn.info.transaction_status == IDLE:
        conn.execute("SELECT 1")
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = steps.throw(error) if error is not None else steps.send(answer)
        except StopIteration as done:
            result: T = done.value
            return result
        answer, error = None, None
        try:
            answer = _answer(conn, store, request, caller, idle_timeout)
        except Exception as raised:
            error = raised


def _answer(
    conn: psycopg.Connection[Any],
    store: Store,
    request: Request,
    caller: bool,
    idle_timeout: timedelta | None,
) -> Any:
    if isinstance(request, Blocking):
        return request.call()
    if isinstance(request, Atomic):
        outermost = conn.info.transaction_status == IDLE
        with conn.transaction():
            if request.serializable and outermost:
                conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            if idle_timeout is not None and outermost:
                limit_idle_transaction(conn, idle_timeout)
            return run(conn, store, request.steps(), caller=caller, idle_timeout=idle_timeout)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(store.query(request.name), request.params)
        if isinstance(request, Execute):
            return cur.rowcount
        return cur.fetchall()


def limit_idle_transaction(conn: psycopg.Connection[Any], timeout: timedelta) -> None:
    """In the transaction open on `conn`: the server ends it (and the session) when its client
    leaves it idle for `timeout` (a process stopped in the middle of it)."""
    milliseconds = max(int(timeout.total_seconds() * 1000), 1)
    conn.execute(
        "SELECT set_config('idle_in_transaction_session_timeout', %s, true)", [str(milliseconds)]
    )


async def run_async(
    conn: psycopg.AsyncConnection[Any], store: Store, steps: Steps[T], *, caller: bool = False
) -> T:
    """Answer the steps' requests on an async connection; returns what the steps return."""
    if caller and not conn.autocommit and conn.info.transaction_status == IDLE:
        await conn.execute("SELECT 1")
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = steps.throw(error) if error is not None else steps.send(answer)
        except StopIteration as done:
            result: T = done.value
            return result
        answer, error = None, None
        try:
            answer = await _answer_async(conn, store, request, caller)
        except Exception as raised:
            error = raised


async def _answer_async(
    conn: psycopg.AsyncConnection[Any], store: Store, request: Request, caller: bool
) -> Any:
    if isinstance(request, Blocking):
        return await asyncio.to_thread(request.call)
    if isinstance(request, Atomic):
        outermost = conn.info.transaction_status == IDLE
        async with conn.transaction():
            if request.serializable and outermost:
                await conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            return await run_async(conn, store, request.steps(), caller=caller)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(store.query(request.name), request.params)
        if isinstance(request, Execute):
            return cur.rowcount
        return await cur.fetchall()
