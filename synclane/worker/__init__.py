"""Workers: `concurrency` slots per queue in one process, plus a planner and a lease reclaimer.

A worker receives what it uses: the database, the queues it works, its name and intervals, and
a callable that plans one queue. `SyncLane.worker(...)` builds one from an app;
`app.run_worker(...)` builds and runs one.

    worker/taker.py   the take statements and the Taker that shares them between slots
    worker/lease.py   a lease and the guarded writes allowed under it
    worker/slot.py    one slot: take, run page by page, finish
    worker/presence.py  its row in the workers table, and the wake-ups between workers
    worker/duties.py  its duties beside the slots: planning, the idle check, the chores
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Literal

import psycopg
from psycopg_pool import AsyncConnectionPool

from synclane.connection import Database
from synclane.errors import WorkerDied, error_text
from synclane.events import Event, Kind, Listener, listeners
from synclane.model import IDLE_GRACE, ConfigError, to_duration
from synclane.queues import Queue
from synclane.worker.duties import Duties
from synclane.worker.lease import Lease, LeaseLost, PageWrites, Writer
from synclane.worker.presence import FreedLanes, Presence
from synclane.worker.slot import Crew, Slot, retry_delay
from synclane.worker.taker import Batch, LeasedJob, Taker

__all__ = ["IDLE_GRACE", "Worker", "error_text", "retry_delay"]

log = logging.getLogger("synclane")

# How long a slot waits for a pooled connection before it counts the database as unreachable:
# it then logs the outage and backs off, instead of waiting silently inside the pool (whose
# default is 30 s). A healthy pool always has a connection for every slot.
CONNECTION_WAIT = 3.0


class Wake(asyncio.Event):
    """One slot's wake-up call. A nudge sets it; the wait it ends clears it at once, so that a
    nudge that comes while the slot is asking for a job (its wait already over) is kept for its
    next wait instead of falling between the two. `on_wait` hears when a wait begins and ends."""

    def __init__(self, on_wait: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.on_wait = on_wait
        self.waiting = False

    async def wait(self) -> Literal[True]:
        self._waiting(True)
        try:
            await super().wait()
        finally:
            self._waiting(False)
        self.clear()
        return True

    def _waiting(self, waiting: bool) -> None:
        self.waiting = waiting
        if self.on_wait is not None:
            self.on_wait()


class Worker(Duties):
    """The slots of the given queues in this process, until stopped.

    A listener of `on_event` that also has a method `observe_take(queue, statement, seconds)`
    is told how long each take statement took (synclane.metrics.Metrics has one)."""

    def __init__(
        self,
        database: Database,
        queues: Sequence[Queue],
        *,
        name: str,
        poll_interval: timedelta,
        plan_interval: timedelta,
        plan: Callable[[str], int | None] | None = None,
        stop_after: timedelta | float | None = None,
        until_idle: bool = False,
        idle_grace: timedelta | float = IDLE_GRACE,
        stop_grace: timedelta | float = timedelta(0),
        on_event: Listener | Iterable[Listener] | None = None,
    ) -> None:
        self.database = database
        self.queues = list(queues)
        if not self.queues:
            raise ConfigError("no queue to work: declare one with app.queue(...)")
        for queue in self.queues:
            queue.check_handlers()
        self.wanted_name = name  # the name asked for; `name` is the one it runs as
        self.poll_interval = poll_interval
        self.plan_interval = plan_interval
        self.plan = plan
        self.stop_after = None if stop_after is None else to_duration("stop_after", stop_after)
        self.until_idle = until_idle
        self.idle_grace = to_duration("idle_grace", idle_grace, allow_zero=True)
        self.stop_grace = to_duration("stop_grace", stop_grace, allow_zero=True)
        self.listeners = listeners(on_event)
        self._take_observers = [
            observe
            for listener in self.listeners
            if callable(observe := getattr(listener, "observe_take", None))
        ]
        self.report: Counter[str] = Counter()
        self.interrupted_by: signal.Signals | None = None  # the signal that stopped it, if one
        self._stop_requested = False
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakes: dict[str, list[Wake]] = {}
        self._waited = False  # whether a slot waited when the last one began or ended a wait
        self._presence: Presence | None = None
        self._crew: Crew | None = None
        self._broken_listeners: set[int] = set()

    @property
    def name(self) -> str:
        """The name it runs as, the one its jobs' leased_by and the workers list show: the name
        asked for, or `name#2` … when a live worker holds it. Read from the registration itself,
        so it is never behind the list."""
        return self.wanted_name if self._presence is None else self._presence.name

    # -- life cycle ------------------------------------------------------------------------

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
        elif not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: the run has ended
                self._loop.call_soon_threadsafe(self._stop.set)

    @property
    def stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    async def run_async(self) -> dict[str, int]:
        # Before any job is taken: a schema made by a newer synclane is refused (SchemaError),
        # also with create_schema=False, and an unreachable database fails fast.
        await asyncio.to_thread(self.database.check_schema)
        loop = self._loop = asyncio.get_running_loop()
        stop = self._stop = asyncio.Event()
        if self._stop_requested:
            stop.set()
        self._wakes = {}
        self._waited = False
        planned = asyncio.Event()
        slots = sum(q.settings.concurrency for q in self.queues)
        # Before the first take: listening, so that nothing made due from now on goes unheard,
        # and registered, under a name no live worker holds (it goes into leased_by).
        presence = self._presence = Presence(
            self.database,
            self.wanted_name,
            [q.name for q in self.queues],
            slots,
            busy=lambda: 0 if self._crew is None else self._crew.busy,
            waiting=self._waiting_slots,
            wake=self._nudge,
            poll_interval=self.poll_interval.total_seconds(),
        )
        await presence.start()
        pool = self.database.worker_pool(slots + 2, wait=CONNECTION_WAIT)
        try:
            await pool.open()
        except BaseException:
            await presence.close()
            raise
        presence.pool = pool
        writer = Writer(pool, self.database.store, self.database.prepare)
        # One waiter for the whole run: every page waits on it, none creates its own.
        stop_waiter = asyncio.ensure_future(stop.wait())
        crew = self._crew = Crew(
            name=self.name,
            writer=writer,
            takers={},
            pages={
                queue.name: PageWrites(writer, queue.name, queue.settings.lease_duration)
                for queue in self.queues
            },
            report=self.report,
            emit=self._emit,
            stop=stop,
            stop_waiter=stop_waiter,
            poll_interval=self.poll_interval.total_seconds(),
            first_load=self._tell_if_first_load_finished if self.listeners else None,
            stop_grace=self.stop_grace.total_seconds(),
        )
        freed: list[FreedLanes] = []
        for queue in self.queues:
            taker = crew.takers[queue.name] = Taker(
                pool,
                self.database.store,
                queue.name,
                self.name,
                queue.settings.lease_duration,
                give_back=self._giver(queue),
                max_attempts=queue.settings.max_attempts,
                outage=writer.outage,
                lane_width=queue.settings.lane_width,
                max_running=queue.settings.max_running,
                prepare=self.database.prepare,
            )
            freed.append(FreedLanes(pool, self.database, queue.name))
            taker.watch = self._watcher(queue.name, freed[-1])
        installed = self._install_signal_handlers(loop)
        log.info(
            "worker %s started: %s",
            self.name,
            ", ".join(f"{q.name}×{q.settings.concurrency}" for q in self.queues),
        )
        # Every part of the worker runs as a task; one that dies is never silent (_watch).
        died: list[tuple[str, BaseException]] = []
        duties: list[tuple[str, Coroutine[Any, Any, None]]] = [
            ("the planner", self._plan_loop(planned)),
            ("the lease reclaimer", self._reclaim_loop()),
            ("the listener", presence.run()),
            ("the stop announcement", self._say_stopping(presence, pool)),
        ]
        if self.stop_after is not None:
            duties.append(("the time budget", self._stop_later(self.stop_after)))
        if self.until_idle:
            duties.append(("the idle check", self._stop_when_idle(planned)))
        helpers = []
        for part, duty in duties:
            helper = asyncio.create_task(duty)
            helper.add_done_callback(self._watch(part, died, slot=False))
            helpers.append(helper)
        try:
            slot_tasks = []
            for queue in self.queues:
                for number in range(queue.settings.concurrency):
                    slot = Slot(crew, queue, number, self._waker(queue.name))
                    task = asyncio.create_task(slot.run())
                    part = f"slot {queue.name}/{number}"
                    task.add_done_callback(self._watch(part, died, slot=True))
                    slot_tasks.append(task)
            try:
                await asyncio.wait(slot_tasks)
            except asyncio.CancelledError:
                # Cancelled from outside (a task group, an orchestrator): stop the slots through
                # the same path as a signal, so that every job is handed back before we return.
                stop.set()
                await asyncio.wait(slot_tasks)
                raise
        finally:
            stop.set()
            stop_waiter.cancel()
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            for sig, before in installed:
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_DFL if before is None else before)
            await asyncio.gather(*(taker.idle() for taker in crew.takers.values()))
            await asyncio.gather(*(pages.idle() for pages in crew.pages.values()))
            await crew.release_now()
            await asyncio.gather(*(f.close() for f in freed))
            await presence.leave(pool)
            await pool.close()
            log.info("worker %s stopped: %s", self.name, dict(self.report))
        if died:
            part, error = died[0]
            raise WorkerDied(
                f"worker {self.name}: {part} died ({error_text(error)}), so the worker stopped "
                "and handed its jobs back; this is a bug of synclane's, please report it"
            ) from error
        return dict(self.report)

    def _watch(
        self, part: str, died: list[tuple[str, BaseException]], *, slot: bool
    ) -> Callable[[asyncio.Task[None]], None]:
        """What to do when a part's task ends. Before the worker stops, a part that ended with
        an error died (each part carries on after the errors it expects; a slot restarts after
        every Exception), and so did a slot that returned: never silent, it is logged, the whole
        worker stops, and run_async raises WorkerDied. What escapes a slot while the worker
        stops is worse than any Exception, so it counts too."""

        main = asyncio.current_task()

        def ended(task: asyncio.Task[None]) -> None:
            if task.cancelled():
                if self.stopping or (main is not None and main.cancelling()):
                    return  # stopped, or the loop torn down from outside: not a death
                error: BaseException = asyncio.CancelledError(f"{part}'s task was cancelled")
            elif (found := task.exception()) is not None:
                if self.stopping and not slot:
                    return  # a duty's trouble while the worker stops is its own affair
                error = found
            elif slot and not self.stopping:
                error = RuntimeError(f"{part} returned before the worker stopped")
            else:
                return  # a duty done, or a slot at the stop
            log.error(
                "worker %s: %s died: %s; stopping the worker",
                self.name,
                part,
                error_text(error),
                exc_info=error,
            )
            died.append((part, error))
            self.stop()

        return ended

    def _install_signal_handlers(
        self, loop: asyncio.AbstractEventLoop
    ) -> list[tuple[signal.Signals, Any]]:
        """Ctrl-C, SIGTERM and SIGHUP (the terminal closed) stop the worker; returns what to
        put back after: asyncio's removal would leave the defaults, not the handlers before."""
        if threading.current_thread() is not threading.main_thread():
            return []
        installed = []
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            sig = getattr(signal, name, None)
            if sig is None:  # no SIGHUP on Windows
                continue
            before = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError):  # Windows, or a loop without signals
                continue
            installed.append((sig, before))
        return installed

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("worker %s received %s: handing jobs back", self.name, sig.name)
        self.interrupted_by = self.interrupted_by or sig
        self.stop()

    async def _stop_later(self, after: timedelta) -> None:
        await asyncio.sleep(after.total_seconds())
        log.info("worker %s: time budget of %s used, stopping", self.name, after)
        if self._crew is not None:
            self._crew.budget_used = True  # pages in flight may end within stop_grace
        self.stop()

    async def _pause(self, seconds: float) -> None:
        assert self._crew is not None
        await self._crew.pause(seconds)

    def _nudge(self, queue: str | None = None) -> None:
        """Wake the idle slots of a queue (None: of every queue): work may be due."""
        for name, wakes in self._wakes.items():
            if queue is None or name == queue:
                for wake in wakes:
                    wake.set()

    def _waker(self, queue: str) -> Callable[[], Wake]:
        """A slot's own wake-up call, set by every nudge of its queue."""
        wake = Wake(self._slot_waits)
        self._wakes.setdefault(queue, []).append(wake)
        return lambda: wake

    def _waiting_slots(self) -> int:
        return sum(wake.waiting for wakes in self._wakes.values() for wake in wakes)

    def _slot_waits(self) -> None:
        """A slot began or ended a wait for work. When that makes the first one wait or the
        last one stop, the workers list hears it at once: a freed lane's job is announced only
        while some worker waits."""
        waited = self._waiting_slots() > 0
        if waited != self._waited and self._presence is not None:
            self._presence.waiting_changed()
        self._waited = waited

    def _watcher(self, queue: str, freed: FreedLanes) -> Callable[[str, float, Batch], None]:
        """What the worker does after each take statement of a queue."""
        observers = self._take_observers

        def watch(statement: str, seconds: float, batch: Batch) -> None:
            freed.note(batch)
            for observe in observers:
                try:
                    observe(queue, statement, seconds)
                except Exception as error:
                    self._listener_broke(observe, error)

        return watch

    async def _say_stopping(self, presence: Presence, pool: AsyncConnectionPool[Any]) -> None:
        assert self._stop is not None
        await self._stop.wait()
        await presence.stopping(pool)

    # -- events ----------------------------------------------------------------------------

    def _emit(self, kind: Kind, job: LeasedJob | SimpleNamespace, **details: Any) -> None:
        """Tell every listener; a listener that raises is logged once and otherwise ignored."""
        if not self.listeners:
            return
        if kind == "started":  # where the job's records stand: a page's count adds to them
            details.setdefault("records", getattr(job, "processed_count", 0))
        event = Event(
            kind=kind,
            queue=job.queue,
            job_id=job.id,
            owner=job.owner,
            lane=job.lane,
            type=job.type,
            mode=job.mode,
            worker=self.name,
            attempt=job.attempt_count,
            window_start=job.window_start,
            window_end=job.window_end,
            **details,
        )
        for listener in self.listeners:
            try:
                listener(event)
            except BaseException as error:  # SystemExit from a listener is its bug, not a stop
                self._listener_broke(listener, error)

    def _listener_broke(self, listener: object, error: BaseException) -> None:
        if id(listener) not in self._broken_listeners:
            self._broken_listeners.add(id(listener))
            log.error("event listener %r raised %s", listener, error_text(error))

    async def _tell_if_first_load_finished(self, taken: LeasedJob) -> None:
        """After an initial slice completed: when no slice of its owner and type is left
        unfinished, its first load is done."""
        assert self._crew is not None
        params = {"queue": taken.queue, "owner": taken.owner, "type": taken.type}
        try:
            async with self._crew.writer.pool.connection() as conn:
                cur = await conn.execute(self.database.store.query("first_load_finished"), params)
                row = await cur.fetchone()
        except psycopg.Error:
            return  # an event is a courtesy: never worth failing over
        if row is not None and row[0]:
            self._emit("first_load_finished", taken, status="completed")

    # -- background duties -----------------------------------------------------------------

    def _giver(self, queue: Queue) -> Callable[[LeasedJob], Any]:
        async def give_back(job: LeasedJob) -> None:
            """Hands back a job no slot will run (its slot was cancelled while it was taken)."""
            assert self._crew is not None
            lease = Lease(job, self._crew.pages[queue.name], 0.0)
            slot = Slot(self._crew, queue, -1, Wake)
            with contextlib.suppress(psycopg.Error, LeaseLost):
                await slot.hand_back(lease, job.cursor)

        return give_back
