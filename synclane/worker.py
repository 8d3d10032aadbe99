"""Worker slots: take the best job of a free lane, run it page by page under a lease, finish.

Every write about a running job is guarded by its id, its lease token and status = 'running'
(statements in sql/taking.sql); a write that matches no row means the lease was lost, and the
slot stops that job at once without writing anything more.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import errors
from psycopg_pool import AsyncConnectionPool

from synclane.events import Event, Kind, Listener, listeners
from synclane.model import MAX_ERROR_LENGTH, Abandon, ConfigError, Job, Page, Throttled, to_duration
from synclane.store import WORKER_SESSION, TakenJob

if TYPE_CHECKING:
    from synclane.app import Queue, SyncLane

log = logging.getLogger("synclane")
T = TypeVar("T")

# How long a worker keeps retrying a write while the database is away before it leaves the job
# to lease expiry (another worker, or this one, reclaims it then).
_OUTAGE_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)
# How long a slot waits for a pooled connection before it counts the database as unreachable:
# it then logs the outage and backs off, instead of waiting silently inside the pool (whose
# default is 30 s). A healthy pool always has a connection for every slot.
_CONNECTION_WAIT = 3.0
# A worker working "until idle" waits for jobs that become due within this long (a retry, a lane
# whose throttle ends soon) before it calls itself idle.
IDLE_GRACE = timedelta(minutes=5)


def error_text(error: BaseException) -> str:
    """'<ExceptionType>: <message>', bounded, without NUL bytes or lone surrogates PostgreSQL
    cannot store; an exception whose str() itself fails still gets a line."""
    error = getattr(error, "original", error)
    try:
        message = str(error)
    except Exception:
        message = f"<unprintable {type(error).__name__} object>"
    message = message.replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    if len(text) > MAX_ERROR_LENGTH:
        text = text[: MAX_ERROR_LENGTH - 1] + "…"
    return text


def retry_delay(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """base · 2^(attempt−1), capped, with up to ±10 % jitter so that a failed lane does not
    retry in lockstep with its neighbours."""
    exponent = max(attempt - 1, 0)
    delay = cap if exponent >= 40 else min(base * (2**exponent), cap)
    return delay * random.uniform(0.9, 1.1)


class describe:  # lower case: used like a function; it formats only when a line is logged
    """The job for a log line: id, owner, lane, type and window."""

    __slots__ = ("job",)

    def __init__(self, job: TakenJob | Job) -> None:
        self.job = job

    def __str__(self) -> str:
        return _describe(self.job)


def _describe(job: TakenJob | Job) -> str:
    window = ""
    if job.window_start is not None or job.window_end is not None:
        start = job.window_start.isoformat() if job.window_start else "…"
        end = job.window_end.isoformat() if job.window_end else "…"
        window = f" window={start}..{end}"
    owner, lane, kind = _printable(job.owner), _printable(job.lane), _printable(job.type)
    return f"job {job.id} owner={owner} lane={lane} type={kind}{window}"


def _printable(name: str) -> str:
    """A name as it is, unless it holds a line break or another control character: then
    escaped, so that an account's name cannot forge log lines."""
    return name if name.isprintable() else repr(name)[1:-1]


class LeaseClock:
    """When this worker last renewed a job's lease, by its own monotonic clock (which keeps
    running while the process is paused). A worker that finds its lease ran out while it was
    not running stops before it starts another page; the token guard refuses its writes anyway.
    """

    __slots__ = ("renewed", "seconds")

    def __init__(self, lease: timedelta, renewed: float) -> None:
        self.seconds = lease.total_seconds()
        self.renewed = renewed  # taken before the renewing statement was sent: conservative

    def check(self) -> None:
        if time.monotonic() - self.renewed >= self.seconds:
            raise LeaseLost("the lease ran out while this worker was not running (paused?)")


class LeaseLost(Exception):
    """A guarded write matched no row: another worker owns the job, or it was cancelled."""


class Stopping(Exception):
    """The worker is stopping: hand the job back."""


class Worker:
    """`concurrency` slots per queue in one process, plus a planner and a lease reclaimer."""

    def __init__(
        self,
        app: SyncLane,
        queues: Sequence[str] | None = None,
        stop_after: timedelta | float | None = None,
        *,
        until_idle: bool = False,
        idle_grace: timedelta | float = IDLE_GRACE,
        on_event: Listener | Iterable[Listener] | None = None,
    ) -> None:
        self.app = app
        self.idle_grace = to_duration("idle_grace", idle_grace, allow_zero=True)
        self.listeners = listeners(on_event)
        self.until_idle = until_idle
        if queues is not None and not isinstance(queues, Iterable):
            raise ConfigError(
                f"queues must be a queue name or a list of them, got {type(queues).__name__} "
                f"{queues!r:.100}"
            )
        names = list(app.queues) if queues is None else list(queues)
        if isinstance(queues, str):
            names = [queues]
        self.queues: list[Queue] = [app.get_queue(name) for name in names]
        if not self.queues:
            raise ConfigError("no queue to work: declare one with app.queue(...)")
        for queue in self.queues:
            for type_name in queue.types:
                if type_name not in queue.handlers:
                    raise ConfigError(
                        f"{queue.name}.{type_name} has no handler: decorate a function with "
                        f"@{queue.name}.snapshot/windowed({type_name!r}, ...)"
                    )
        self.stop_after = None if stop_after is None else to_duration("stop_after", stop_after)
        self.report: Counter[str] = Counter()
        self._stop: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        self._busy = 0  # slots running a job now
        self._started = 0  # jobs started so far
        self._planned: asyncio.Event | None = None
        self._stop_waiter: asyncio.Future[Any] | None = None
        self._takers: dict[str, Taker] | None = None
        self._broken_listeners: set[int] = set()

    # -- life cycle -----------------------------------------------------------------------

    def run(self) -> dict[str, int]:
        return asyncio.run(self.run_async())

    def stop(self) -> None:
        """Ask the worker to stop: slots hand their jobs back and return. Callable from any
        thread."""
        self._stop_requested = True
        if self._stop is None or self._loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._stop.set()
        else:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def run_async(self) -> dict[str, int]:
        # Before any job is taken: a schema made by a newer synclane is refused (SchemaError),
        # also with create_schema=False, and an unreachable database fails fast.
        await asyncio.to_thread(self.app.check_schema)
        loop = self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested:
            self._stop.set()
        self._wake = asyncio.Event()
        self._planned = asyncio.Event()
        # One waiter for the whole run: every page waits on it, none creates its own.
        self._stop_waiter = asyncio.ensure_future(self._stop.wait())
        self._takers = {queue.name: Taker(self, queue) for queue in self.queues}
        slots = sum(q.settings.concurrency for q in self.queues)
        self._pool = AsyncConnectionPool(
            self.app.dsn,
            min_size=1,
            max_size=slots + 2,
            kwargs={"autocommit": True, "application_name": "synclane-worker"},
            configure=_configure,
            open=False,
            name="synclane",
            timeout=_CONNECTION_WAIT,
        )
        await self._pool.open()
        installed = self._install_signal_handlers(loop)
        log.info(
            "worker %s started: %s",
            self.app.worker_name,
            ", ".join(f"{q.name}×{q.settings.concurrency}" for q in self.queues),
        )
        helpers = [
            asyncio.create_task(self._plan_loop()),
            asyncio.create_task(self._reclaim_loop()),
        ]
        if self.stop_after is not None:
            helpers.append(asyncio.create_task(self._stop_later(self.stop_after)))
        if self.until_idle:
            helpers.append(asyncio.create_task(self._stop_when_idle()))
        try:
            slot_tasks = [
                asyncio.create_task(self._slot(queue, number))
                for queue in self.queues
                for number in range(queue.settings.concurrency)
            ]
            try:
                await asyncio.wait(slot_tasks)
            except asyncio.CancelledError:
                # Cancelled from outside (a task group, an orchestrator): stop the slots through
                # the same path as a signal, so that every job is handed back before we return.
                self._stop.set()
                await asyncio.wait(slot_tasks)
                raise
        finally:
            self._stop.set()
            self._stop_waiter.cancel()
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            for sig in installed:
                loop.remove_signal_handler(sig)
            await asyncio.gather(*(taker.idle() for taker in self._takers.values()))
            await self._pool.close()
            log.info("worker %s stopped: %s", self.app.worker_name, dict(self.report))
        return dict(self.report)

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        if threading.current_thread() is not threading.main_thread():
            return []
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError):  # Windows, or a loop without signals
                continue
            installed.append(sig)
        return installed

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("worker %s received %s: handing jobs back", self.app.worker_name, sig.name)
        self.stop()

    async def _stop_later(self, after: timedelta) -> None:
        await asyncio.sleep(after.total_seconds())
        log.info("worker %s: time budget of %s used, stopping", self.app.worker_name, after)
        self.stop()

    @property
    def stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    async def _pause(self, seconds: float) -> None:
        """Sleep until the timeout, a nudge (new work may be there) or the stop."""
        assert self._stop is not None and self._wake is not None
        waiters = [
            asyncio.ensure_future(self._stop.wait()),
            asyncio.ensure_future(self._wake.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def _nudge(self) -> None:
        """Wake idle slots: planning or reclaiming may have made work."""
        assert self._wake is not None
        self._wake.set()
        self._wake = asyncio.Event()

    def _emit(self, kind: Kind, job: TakenJob | SimpleNamespace, **details: Any) -> None:
        """Tell every listener; a listener that raises is logged and otherwise ignored."""
        if not self.listeners:
            return
        event = Event(
            kind=kind,
            queue=job.queue,
            job_id=job.id,
            owner=job.owner,
            lane=job.lane,
            type=job.type,
            mode=job.mode,
            worker=self.app.worker_name,
            attempt=job.attempt_count,
            window_start=job.window_start,
            window_end=job.window_end,
            **details,
        )
        for listener in self.listeners:
            try:
                listener(event)
            except Exception as error:
                if id(listener) not in self._broken_listeners:
                    self._broken_listeners.add(id(listener))
                    log.error("event listener %r raised %s", listener, error_text(error))

    # -- background duties ----------------------------------------------------------------

    async def _stop_when_idle(self) -> None:
        """Stop once no job of these queues runs anywhere (a job finishing elsewhere could free
        a lane) and none becomes due within `idle_grace` (a retry, the end of a throttle)."""
        assert self._planned is not None and self._pool is not None
        await self._planned.wait()
        interval = self.app.poll_interval.total_seconds()
        names = [q.name for q in self.queues]
        while not self.stopping:
            await self._pause_for_stop(interval)
            if self._busy:
                continue
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(self.app.store.query("idle_check"), {"queues": names})
                    row = await cur.fetchone()
            except psycopg.OperationalError:
                continue
            assert row is not None
            running, next_due_in = row
            if running == 0 and (next_due_in is None or next_due_in > self.idle_grace):
                log.info("worker %s: nothing left to do, stopping", self.app.worker_name)
                self.stop()

    async def _plan_loop(self) -> None:
        assert self._planned is not None
        plannable = [q for q in self.queues if q.types and q.owner_source is not None]
        if not plannable:
            self._planned.set()
        while not self.stopping and plannable:
            # Side by side: a queue whose owner source hangs (until owners_timeout) does not hold
            # up the others.
            await asyncio.gather(*(self._plan_queue(queue) for queue in plannable))
            self._planned.set()
            await self._pause_for_stop(self.app.plan_interval.total_seconds())

    async def _plan_queue(self, queue: Queue) -> None:
        try:
            added = await _in_thread(
                functools.partial(self.app.plan, queue.name), f"synclane-plan-{queue.name}"
            )
        except Exception as error:
            log.error("planning queue %s failed: %s", queue.name, error_text(error))
            return
        if added.get(queue.name):
            self._nudge()

    async def _reclaim_loop(self) -> None:
        assert self._pool is not None
        interval = self.app.poll_interval.total_seconds()
        while not self.stopping:
            for queue in self.queues:
                try:
                    async with self._pool.connection() as conn:
                        rows = await self.app.store.a_reclaim(
                            conn, queue.name, queue.settings.max_attempts
                        )
                except psycopg.Error as error:
                    log.warning("reclaiming expired leases failed: %s", error_text(error))
                    continue
                for row in rows:
                    self.report["reclaimed"] += 1
                    self._emit(
                        "reclaimed",
                        SimpleNamespace(queue=queue.name, **row),
                        status=row["status"],
                        error=row["error"],
                    )
                    log.warning(
                        "job %s owner=%s lane=%s type=%s: lease expired, reclaimed as %s",
                        row["id"],
                        row["owner"],
                        row["lane"],
                        row["type"],
                        row["status"],
                    )
                if rows:
                    self._nudge()
            await self._pause_for_stop(interval)

    async def _pause_for_stop(self, seconds: float) -> None:
        assert self._stop is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    # -- one slot -------------------------------------------------------------------------

    async def _slot(self, queue: Queue, number: int) -> None:
        while not self.stopping:
            try:
                await self._slot_loop(queue, number)
            except Exception:  # a bug of ours must not silently cost a slot
                log.exception("slot %s/%d crashed; restarting it", queue.name, number)
                await self._pause_for_stop(self.app.poll_interval.total_seconds())

    async def _slot_loop(self, queue: Queue, number: int) -> None:
        outage = 0
        while not self.stopping:
            try:
                asked = time.monotonic()
                taken = await self._take(queue)
            except psycopg.OperationalError as error:
                delay = _OUTAGE_BACKOFF[min(outage, len(_OUTAGE_BACKOFF) - 1)]
                outage += 1
                log.warning(
                    "slot %s/%d cannot reach the database (%s); retrying in %.1f s",
                    queue.name,
                    number,
                    error_text(error),
                    delay,
                )
                await self._pause_for_stop(delay)
                continue
            if outage:
                log.info("slot %s/%d reached the database again", queue.name, number)
                outage = 0
            if taken is None:
                await self._pause(self.app.poll_interval.total_seconds())
                continue
            job: tuple[TakenJob, LeaseClock] | None
            job = (taken, LeaseClock(queue.settings.lease_duration, asked))
            while job is not None:
                self._busy += 1
                self._started += 1
                try:
                    # A completed job's statement may have taken the next one already.
                    job = await self._run_job(queue, *job)
                finally:
                    self._busy -= 1

    async def _take(self, queue: Queue) -> TakenJob | None:
        assert self._takers is not None
        took = await self._takers[queue.name].take(None)
        return None if took is None else took.job

    async def _write(self, queue: Queue, name: str, params: dict[str, Any]) -> bool:
        """A guarded write, retried through a short database outage. False: lease lost."""
        store = self.app.store
        return await self._retrying(queue, name, lambda conn: store.a_guarded(conn, name, params))

    async def _retrying(
        self,
        queue: Queue,
        name: str,
        statement: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
    ) -> T:
        """A statement about a running job, retried through a database outage for up to half
        the lease; after that it raises LeaseLost and leaves the job to lease expiry."""
        assert self._pool is not None
        deadline = time.monotonic() + queue.settings.lease_duration.total_seconds() / 2
        for delay in (*_OUTAGE_BACKOFF, None):
            try:
                async with self._pool.connection() as conn:
                    return await statement(conn)
            except psycopg.OperationalError as error:
                if delay is None or time.monotonic() + delay > deadline:
                    log.warning("giving up on %s after a database outage: %s", name, error)
                    raise LeaseLost("the database was unreachable for too long") from error
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _run_job(
        self, queue: Queue, taken: TakenJob, lease: LeaseClock
    ) -> tuple[TakenJob, LeaseClock] | None:
        """Runs one job to its end; returns the next job when the completing statement took one."""
        settings = queue.settings
        guard = {"id": taken.id, "token": taken.lease_token, "lease": settings.lease_duration}
        handler = queue.handlers.get(taken.type)
        log.info("%s: started (attempt %d)", describe(taken), taken.attempt_count)
        self._emit("started", taken, cursor=taken.cursor)
        attempt_began = time.monotonic()
        job = Job(
            id=taken.id,
            queue=taken.queue,
            owner=taken.owner,
            lane=taken.lane,
            type=taken.type,
            mode=taken.mode,  # type: ignore[arg-type]
            window_start=taken.window_start,
            window_end=taken.window_end,
            cursor=taken.cursor,
            attempt_count=taken.attempt_count,
            processed_count=taken.processed_count,
        )
        try:
            if handler is None:
                raise ConfigError(f"no handler for type {taken.type!r} in queue {queue.name!r}")
            while True:
                if self.stopping:
                    raise Stopping
                lease.check()
                page_began = time.monotonic()
                page = await self._page(queue, handler, job, guard, lease)
                if page.next_cursor is None:
                    following = await self._complete(queue, taken, guard, page.count)
                    self._emit(
                        "completed",
                        taken,
                        status="completed",
                        records=job.processed_count + page.count,
                        seconds=time.monotonic() - attempt_began,
                    )
                    if taken.mode == "initial" and self.listeners:
                        await self._tell_if_first_load_finished(queue, taken)
                    return following
                params = {**guard, "cursor": page.next_cursor, "count": page.count}
                sent = time.monotonic()
                if not await self._write(queue, "save_page", params):
                    raise LeaseLost("the job was taken over or cancelled")
                lease.renewed = sent
                self._emit(
                    "page",
                    taken,
                    records=page.count,
                    seconds=sent - page_began,
                    cursor=page.next_cursor,
                )
                job = dataclasses.replace(
                    job, cursor=page.next_cursor, processed_count=job.processed_count + page.count
                )
        except Stopping:
            await self._hand_back(queue, taken, guard, job.cursor)
        except asyncio.CancelledError:
            # Cancelled from outside (asyncio.run tearing down after a BaseException such as
            # Prefect's TerminationSignal, or a task group): the same hand-back as a stop,
            # shielded so that the cancellation cannot interrupt it.
            with contextlib.suppress(LeaseLost, psycopg.Error):
                await asyncio.shield(self._hand_back(queue, taken, guard, job.cursor))
            raise
        except LeaseLost as lost:
            await self._release_if_cancelled(queue, guard)
            self.report["lost"] += 1
            log.warning("%s: lease lost (%s); stopped without writing more", describe(taken), lost)
            self._emit("lease_lost", taken, error=str(lost))
        except Throttled as throttle:
            await self._throttle(queue, taken, guard, throttle)
        except Abandon as abandon:
            params = {**guard, "error": error_text(abandon)}
            if await self._write(queue, "abandon_job", params):
                self.report["abandoned"] += 1
                log.warning("%s: abandoned: %s", describe(taken), abandon.reason)
                self._emit("abandoned", taken, status="abandoned", error=params["error"])
        except Exception as error:
            await self._fail(queue, taken, guard, error)
        return None

    async def _complete(
        self, queue: Queue, taken: TakenJob, guard: dict[str, Any], count: int
    ) -> tuple[TakenJob, LeaseClock] | None:
        """Marks the job completed and, unless the worker is stopping, takes the next job in
        the same statement (one commit a job). Raises LeaseLost when the completion is refused.
        """
        assert self._takers is not None
        following = None
        completed: bool | None = None
        if not self.stopping:
            done = {"id": taken.id, "token": taken.lease_token, "count": count}
            asked = time.monotonic()
            try:
                took = await self._takers[queue.name].take(done)
            except psycopg.OperationalError:
                # Whether it committed is unknown: the completion alone is retried below, through
                # the outage. A job it may have taken is reclaimed when its lease expires.
                took = None
            if took is not None:
                completed = took.completed
                if took.job is not None:
                    following = (took.job, LeaseClock(queue.settings.lease_duration, asked))
        if completed is None:
            completed = await self._write(queue, "complete_job", {**guard, "count": count})
        if not completed:
            raise LeaseLost("the job was taken over or cancelled")
        self.report["completed"] += 1
        log.info("%s: completed", describe(taken))
        return following

    async def _hand_back(
        self, queue: Queue, taken: TakenJob, guard: dict[str, Any], cursor: str | None
    ) -> None:
        params = {**guard, "previous_status": taken.previous_status}
        if await self._write(queue, "hand_back", params):
            self.report["handed_back"] += 1
            log.info("%s: handed back at cursor %r", describe(taken), cursor)
            self._emit("handed_back", taken, status="pending", cursor=cursor)

    async def _give_back(self, queue: Queue, taken: TakenJob) -> None:
        """Hands back a job no slot will run (its slot was cancelled while it was taken)."""
        guard = {"id": taken.id, "token": taken.lease_token, "lease": queue.settings.lease_duration}
        with contextlib.suppress(psycopg.Error, LeaseLost):
            await self._hand_back(queue, taken, guard, taken.cursor)

    async def _throttle(
        self, queue: Queue, taken: TakenJob, guard: dict[str, Any], throttle: Throttled
    ) -> None:
        settings = queue.settings
        delay = throttle.retry_after
        if delay is None:
            delay = retry_delay(
                taken.throttle_count + 1, settings.throttle_base_delay, settings.throttle_max_delay
            )
        params = {
            **guard,
            "error": error_text(throttle),
            "delay": delay,
            "previous_status": taken.previous_status,
        }
        if await self._write(queue, "throttle_job", params):
            self.report["throttled"] += 1
            log.warning("%s: throttled, lane %s paused for %s", describe(taken), taken.lane, delay)
            self._emit(
                "throttled",
                taken,
                status="failed",
                error=params["error"],
                until=datetime.now(UTC) + delay,
            )

    async def _fail(
        self, queue: Queue, taken: TakenJob, guard: dict[str, Any], error: Exception
    ) -> None:
        assert self._pool is not None
        settings = queue.settings
        delay = retry_delay(
            taken.attempt_count, settings.retry_base_delay, settings.retry_max_delay
        )
        params = {**guard, "error": error_text(error), "delay": delay}
        params["max_attempts"] = settings.max_attempts
        store = self.app.store
        try:
            # Retried like every write: a failure recorded late beats one lost (the lease would
            # expire and the job would say LeaseExpired instead of what went wrong).
            outcome = await self._retrying(
                queue, "fail_job", lambda conn: store.a_fail(conn, params)
            )
        except LeaseLost:
            log.warning(
                "%s: could not record its failure, left to lease expiry: %s",
                describe(taken),
                params["error"],
            )
            return
        if outcome is None:
            self.report["lost"] += 1
            log.warning("%s: failed after its lease was lost: %s", describe(taken), params["error"])
            return
        status, next_run_at = outcome
        self.report[status] += 1
        kind: Kind = "failed" if status == "failed" else "deferred"
        if status == "abandoned":
            kind = "abandoned"
        self._emit(kind, taken, status=status, error=params["error"], until=next_run_at)
        if status == "failed":
            log.warning(
                "%s: failed (attempt %d), retry at %s: %s",
                describe(taken),
                taken.attempt_count,
                next_run_at.isoformat(),
                params["error"],
            )
        else:
            log.warning(
                "%s: %s after attempt %d: %s",
                describe(taken),
                status,
                taken.attempt_count,
                params["error"],
            )

    async def _tell_if_first_load_finished(self, queue: Queue, taken: TakenJob) -> None:
        """After an initial slice completed: when no slice of its owner and type is left
        unfinished, its first load is done."""
        assert self._pool is not None
        params = {"queue": queue.name, "owner": taken.owner, "type": taken.type}
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(self.app.store.query("first_load_finished"), params)
                row = await cur.fetchone()
        except psycopg.Error:
            return  # an event is a courtesy: never worth failing over
        if row is not None and row[0]:
            self._emit("first_load_finished", taken, status="completed")

    async def _release_if_cancelled(self, queue: Queue, guard: dict[str, Any]) -> None:
        with contextlib.suppress(psycopg.Error, LeaseLost):
            await self._write(queue, "release_cancelled", guard)

    # -- one page -------------------------------------------------------------------------

    async def _page(
        self,
        queue: Queue,
        handler: Callable[[Job], Any],
        job: Job,
        guard: dict[str, Any],
        lease: LeaseClock,
    ) -> Page:
        """Run one page while renewing the lease; raises Stopping or LeaseLost to unwind."""
        assert self._stop_waiter is not None
        stop_waiter = self._stop_waiter
        beat = max(queue.settings.lease_duration.total_seconds() / 3, 0.05)
        page = _start_page(handler, job)
        try:
            while True:
                done, _ = await asyncio.wait(
                    {page, stop_waiter}, timeout=beat, return_when=asyncio.FIRST_COMPLETED
                )
                if page in done:
                    break
                if stop_waiter in done:
                    raise Stopping
                sent = time.monotonic()
                if not await self._write(queue, "heartbeat", guard):
                    raise LeaseLost("heartbeat refused: the job was taken over or cancelled")
                lease.renewed = sent
        except BaseException:
            page.cancel()
            raise
        result = page.result()
        if inspect.isawaitable(result):
            result = await _contained(result)
        if not isinstance(result, Page):
            raise TypeError(
                f"the {job.type} handler returned {type(result).__name__} {result!r:.200}; "
                "return Page(next_cursor, count)"
            )
        return result


@dataclasses.dataclass(frozen=True)
class Take:
    """A slot's answer from its Taker: whether the job it finished was completed, and its next
    job."""

    completed: bool
    job: TakenJob | None


class Taker:
    """Takes jobs for the slots of one queue in this worker. Slots that ask at the same instant
    (their pages ended together) are served by one statement, which also completes the jobs they
    have just finished: one commit for all of them, and one look at the front of the line."""

    def __init__(self, worker: Worker, queue: Queue) -> None:
        self.worker = worker
        self.queue = queue
        self._waiting: list[tuple[dict[str, Any] | None, asyncio.Future[Take | None]]] = []
        self._serving: asyncio.Task[None] | None = None

    async def take(self, done: dict[str, Any] | None) -> Take | None:
        """The next job, completing `done` (id, token, count) in the same statement when given.
        None: several races for a lane in a row were lost, and nothing was written."""
        future: asyncio.Future[Take | None] = asyncio.get_running_loop().create_future()
        self._waiting.append((done, future))
        if self._serving is None:
            self._serving = asyncio.create_task(self._serve())
        return await future

    async def idle(self) -> None:
        """Wait until no statement is in flight (before the pool closes)."""
        if self._serving is not None:
            await asyncio.wait({self._serving})

    async def _serve(self) -> None:
        try:
            await asyncio.sleep(0)  # let every slot whose page ended in this instant ask too
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    outcomes = await self._statement([done for done, _ in batch])
                except Exception as error:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if not future.done():
                        future.set_result(outcome)
                    elif outcome is not None and outcome.job is not None:
                        # The slot was cancelled while the statement ran: nobody runs this job.
                        await self.worker._give_back(self.queue, outcome.job)
        except BaseException:
            # Cancelled itself: no slot may wait forever for an answer.
            for _, future in self._waiting:
                future.cancel()
            self._waiting = []
            raise
        finally:
            self._serving = None

    async def _statement(self, requests: list[dict[str, Any] | None]) -> list[Take | None]:
        worker, queue = self.worker, self.queue
        store, pool = worker.app.store, worker._pool
        assert pool is not None
        name, lease = worker.app.worker_name, queue.settings.lease_duration
        done = [request for request in requests if request is not None]
        for _ in range(20):
            try:
                async with pool.connection() as conn:
                    taken = await store.a_take(
                        conn, queue.name, name, lease, done, len(requests) - len(done)
                    )
                break
            except errors.UniqueViolation:
                # Another worker won a lane in the same instant: nothing was written, ask again.
                continue
        else:
            return [None] * len(requests)
        jobs = iter(taken.jobs)
        outcomes: list[Take | None] = []
        for request in requests:
            completed = request is not None and request["id"] in taken.completed
            if request is not None and not completed:
                outcomes.append(Take(False, None))  # its lease was lost: it takes nothing
            else:
                outcomes.append(Take(completed, next(jobs, None)))
        # Slots the front of the line could not serve look lane by lane, until a look finds
        # nothing.
        for number, outcome in enumerate(outcomes):
            if outcome is None or outcome.job is not None:
                continue
            if requests[number] is not None and not outcome.completed:
                continue
            try:
                job = await self._by_lane()
            except psycopg.OperationalError:
                job = None  # the front's outcome stands; these slots ask again later
            if job is None:
                break
            outcomes[number] = Take(outcome.completed, job)
        return outcomes

    async def _by_lane(self) -> TakenJob | None:
        worker, queue = self.worker, self.queue
        assert worker._pool is not None
        for _ in range(20):
            try:
                async with worker._pool.connection() as conn:
                    return await worker.app.store.a_take_by_lane(
                        conn, queue.name, worker.app.worker_name, queue.settings.lease_duration
                    )
            except errors.UniqueViolation:
                continue
        return None


def _start_page(handler: Callable[[Job], Any], job: Job) -> asyncio.Future[Any]:
    """Coroutine handlers run on the loop; plain functions in a thread of their own, so that the
    heartbeat keeps beating and a page that never returns cannot hold the slot."""
    if inspect.iscoroutinefunction(handler):
        coroutine: Awaitable[Any] = handler(job)
        return asyncio.ensure_future(_contained(coroutine))
    return _in_thread(functools.partial(handler, job), f"synclane-job-{job.id}")


def _in_thread(call: Callable[[], Any], name: str) -> asyncio.Future[Any]:
    """Run `call` in a daemon thread of its own; returns a future of its result. Unlike
    asyncio.to_thread nothing waits for the thread when the loop closes, so a call that never
    returns (a page, an owner source) cannot hold up the worker's exit. A BaseException it
    raises arrives as an Exception (_Escaped)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def post(outcome: Callable[[], None]) -> None:
        # A page abandoned on stop may finish after the loop closed: nobody waits for it then.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, outcome)

    def target() -> None:
        try:
            result = call()
        except BaseException as error:  # the slot turns it into a job error
            failure = error if isinstance(error, Exception) else _Escaped(error)
            post(lambda: future.set_exception(failure))
        else:
            post(lambda: future.set_result(result))

    # The call sees the caller's context variables (a Prefect run's logger, tracing ids).
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(target,), name=name, daemon=True)
    thread.start()
    return future


async def _contained(coroutine: Awaitable[Any]) -> Any:
    """A coroutine handler that raises SystemExit, KeyboardInterrupt or another BaseException
    fails its job like any error: left alone, asyncio would re-raise the first two out of the
    event loop (killing the worker) and the others would end the slot's task (a dead slot).
    Cancellation still goes through: it is how a page is abandoned."""
    try:
        return await coroutine
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as error:
        raise _Escaped(error) from error


class _Escaped(Exception):
    """A handler raised a BaseException (SystemExit, KeyboardInterrupt …)."""

    def __init__(self, original: BaseException) -> None:
        self.original = original
        super().__init__(type(original).__name__)


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    for setting in WORKER_SESSION:
        await conn.execute(setting)
