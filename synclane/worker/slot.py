"""One slot: take a job, run its handler page by page under its lease, finish it, take the next.

A page runs as a task (synclane.bridge) while the slot renews the lease every third of it; the
slot stops a job at once when its lease is lost, and hands it back with its cursor when the
worker stops. Each state change is one log line and one event for the worker's listeners.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg

from synclane.bridge import PageRun
from synclane.errors import error_text
from synclane.events import Kind
from synclane.model import Abandon, ConfigError, Job, Page, Rate, Throttled, page_of
from synclane.queues import Queue
from synclane.worker.lease import Lease, LeaseLost, PageWrites, Writer
from synclane.worker.outage import OUTAGE_BACKOFF
from synclane.worker.taker import Finished, LeasedJob, Taker

log = logging.getLogger("synclane")

Emit = Callable[..., None]


# How many hand-backs in a row with the page abandoned and nothing saved make a failed attempt.
STALL_LIMIT = 3


class Stopping(Exception):
    """The worker is stopping: hand the job back."""


class Paused(Stopping):
    """The job's queue, or its lane, was paused: hand the job back at this page boundary. The
    message says which."""


class RateWait(Exception):
    """The lane's rate leaves no room for another page start for `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the lane's rate has room in {seconds:.3f} s")
        self.seconds = seconds


# A lane whose rate has room within this long is waited for in the slot; a longer wait hands the
# job back (the slot takes another lane's job meanwhile).
RATE_SLEEP = 0.25


@dataclasses.dataclass
class Crew:
    """What the slots of one worker share."""

    name: str
    writer: Writer
    takers: dict[str, Taker]
    pages: dict[str, PageWrites]
    report: Counter[str]
    emit: Emit
    stop: asyncio.Event
    stop_waiter: asyncio.Future[Any]
    poll_interval: float
    # After an initial slice completed: tells listeners when its owner's first load is done.
    first_load: Callable[[LeasedJob], Awaitable[None]] | None = None
    # How long a page in flight may take to end once the worker's time budget is used, in
    # seconds (a stop asked for, a signal or a cancellation, abandons it at once).
    stop_grace: float = 0.0
    budget_used: bool = False
    busy: int = 0  # slots running a job now
    # Leases lost while their page may still run: let go once it has stopped.
    releasing: dict[asyncio.Task[None], Lease] = dataclasses.field(default_factory=dict)

    @property
    def stopping(self) -> bool:
        return self.stop.is_set()

    def release_when_stopped(self, lease: Lease, run: PageRun | None) -> None:
        """Hold a lost lease while its page may still run, then let go of it. A cancelled job's
        heartbeat is refused, but a plain handler's thread cannot be stopped: its lease is
        renewed every third of its duration (`hold_lease`, no other write) until the page has
        stopped, so the lane is not free while the page is in flight, however long it takes.
        Then `release_cancelled` frees the lane at once. A page that never ends holds the lane
        until this worker stops (or dies, and the lease expires)."""
        beat = max(lease.duration.total_seconds() / 3, 0.05)

        async def release() -> None:
            with contextlib.suppress(psycopg.Error, LeaseLost):
                while run is not None and not run.stopped.done():
                    await asyncio.wait([run.stopped], timeout=beat)
                    if not run.stopped.done() and not await lease.hold():
                        return  # reclaimed or taken over: the lease is nobody's to hold
                await lease.release()

        task = asyncio.create_task(release())
        self.releasing[task] = lease
        task.add_done_callback(lambda done: self.releasing.pop(done, None))

    async def pause(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep until the timeout, the stop, or (when given) a nudge."""
        waiters = [asyncio.ensure_future(self.stop.wait())]
        if wake is not None:
            waiters.append(asyncio.ensure_future(wake.wait()))
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def release_now(self) -> None:
        """The worker is going: let go of every lease still waiting for its page."""
        waiting = list(self.releasing.items())
        for task, _ in waiting:
            task.cancel()
        for _, lease in waiting:
            with contextlib.suppress(psycopg.Error, LeaseLost):
                await lease.release()


def retry_delay(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """base · 2^(attempt−1), capped, with up to ±10 % jitter so that a failed lane does not
    retry in lockstep with its neighbours."""
    exponent = max(attempt - 1, 0)
    # compared in seconds: base · 2^exponent soon exceeds what a timedelta holds (a day's base
    # doubled 30 times), where its cap is long reached
    doubled = base.total_seconds() * 2.0 ** min(exponent, 1000)
    delay = cap if doubled >= cap.total_seconds() else base * (2**exponent)
    return delay * random.uniform(0.9, 1.1)


class describe:  # lower case: used like a function; it formats only when a line is logged
    """The job for a log line: id, owner, lane, type and window."""

    __slots__ = ("job",)

    def __init__(self, job: LeasedJob | Job) -> None:
        self.job = job

    def __str__(self) -> str:
        job = self.job
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


class Slot:
    """One slot of one queue."""

    def __init__(self, crew: Crew, queue: Queue, number: int, wake: Callable[[], Any]) -> None:
        self.crew = crew
        self.queue = queue
        self.number = number
        self.wake = wake  # the worker's current nudge event
        self.settings = queue.settings

    async def run(self) -> None:
        """Take and run jobs until the worker stops; a bug of ours costs a pause, not the slot,
        and so does a cancellation of nobody's asking. Only a cancellation of the slot's own
        task (the loop torn down) ends it early."""
        while not self.crew.stopping:
            try:
                await self._loop()
            except (Exception, asyncio.CancelledError) as error:
                task = asyncio.current_task()
                if isinstance(error, asyncio.CancelledError) and (
                    task is None or task.cancelling()
                ):
                    raise
                log.exception("slot %s/%d crashed; restarting it", self.queue.name, self.number)
                await self.crew.pause(self.crew.poll_interval)

    async def _loop(self) -> None:
        crew = self.crew
        outage = 0
        take = f"queue {self.queue.name}: taking jobs"  # one part for every slot of the queue
        while not crew.stopping:
            try:
                asked = time.monotonic()
                turn = await crew.takers[self.queue.name].take(None)
            except psycopg.OperationalError as error:
                delay = OUTAGE_BACKOFF[min(outage, len(OUTAGE_BACKOFF) - 1)]
                outage += 1
                crew.writer.outage.lost(f"slot {self.queue.name}/{self.number}", error, take)
                await crew.pause(delay)
                continue
            outage = 0
            crew.writer.outage.reached(take)
            if turn is None or turn.job is None:
                await crew.pause(crew.poll_interval, self.wake())
                continue
            lease: Lease | None = self._lease(turn.job, asked)
            while lease is not None:
                crew.busy += 1
                try:
                    # A completed job's statement may have taken the next one already.
                    lease = await self.run_job(lease)
                finally:
                    crew.busy -= 1

    def _lease(self, job: LeasedJob, asked: float) -> Lease:
        return Lease(job, self.crew.pages[self.queue.name], asked)

    async def run_job(self, lease: Lease) -> Lease | None:
        """Runs one job to its end; returns the next job's lease when the completing statement
        took one."""
        crew, taken = self.crew, lease.job
        handler = self.queue.handlers.get(taken.type)
        log.info("%s: started (attempt %d)", describe(taken), taken.attempt_count)
        crew.emit("started", taken, cursor=taken.cursor)
        began = time.monotonic()
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
        run: PageRun | None = None  # the page in flight, or the last one
        progressed = False  # a page was saved under this lease
        try:
            if handler is None:
                raise ConfigError(
                    f"no handler for type {taken.type!r} in queue {self.queue.name!r}"
                )
            rate = self.settings.lane_rate
            while True:
                if crew.stopping:
                    raise Stopping
                lease.check()
                if rate is not None:
                    await self._page_start(lease, rate)
                page_began = time.monotonic()
                run = PageRun(handler, job)
                page = await self._page(run, job, lease)
                if rate is not None and page.calls > 1:
                    await lease.page_start(rate, page.calls - 1, force=True)
                if page.next_cursor is None:
                    following = await self._complete(lease, page.count)
                    crew.emit(
                        "completed",
                        taken,
                        status="completed",
                        records=job.processed_count + page.count,
                        seconds=time.monotonic() - began,
                    )
                    if taken.mode == "initial" and crew.first_load is not None:
                        await crew.first_load(taken)
                    return following
                saved = await lease.save_page(
                    job.cursor, job.processed_count, page.next_cursor, page.count
                )
                progressed = True
                crew.emit(
                    "page",
                    taken,
                    records=page.count,
                    seconds=time.monotonic() - page_began,
                    cursor=page.next_cursor,
                )
                job = dataclasses.replace(
                    job, cursor=page.next_cursor, processed_count=job.processed_count + page.count
                )
                if saved.queue_paused:
                    raise Paused("its queue is paused")
                if saved.lane_paused_until is not None:
                    # A sibling of the lane was told to slow down: so is this job, at once.
                    until = saved.lane_paused_until.isoformat()
                    raise Paused(f"its lane is paused by a throttle until {until}")
        except Paused as paused:
            await self.hand_back(lease, job.cursor, None, progressed, why=str(paused))
        except RateWait as waiting:
            await self._wait_for_rate(lease, waiting.seconds, job.cursor)
        except Stopping:
            await self.hand_back(lease, job.cursor, run, progressed)
        except asyncio.CancelledError:
            # Cancelled from outside (asyncio.run tearing down after a BaseException such as
            # Prefect's TerminationSignal, or a task group): the same hand-back as a stop,
            # shielded so that the cancellation cannot interrupt it. (A handler's own
            # cancellation never gets here: PageRun makes it a failure. One of nobody's asking
            # that does is logged by Slot.run, which restarts the slot.)
            with contextlib.suppress(psycopg.Error):
                await asyncio.shield(self.hand_back(lease, job.cursor, run, progressed))
            raise
        except LeaseLost as lost:
            # The lane stays held by the lease until the page in flight has really stopped (a
            # plain handler's thread cannot be stopped from outside), then it is let go.
            crew.release_when_stopped(lease, run)
            crew.report["lost"] += 1
            log.warning(
                "%s: lease lost (%s); its page is abandoned and nothing of it is saved; the lane "
                "is let go once the page has stopped",
                describe(taken),
                lost,
            )
            crew.emit("lease_lost", taken, error=str(lost))
        except Throttled as throttle:
            await self._throttle(lease, throttle)
        except Abandon as abandon:
            await self._abandon(lease, abandon)
        except Exception as error:
            await self._fail(lease, error)
        return None

    async def _page(self, run: PageRun, job: Job, lease: Lease) -> Page:
        """Wait for one page while renewing the lease; raises Stopping or LeaseLost to unwind.
        When the worker's time budget is used, the page in flight gets `stop_grace` to end."""
        stop_waiter = self.crew.stop_waiter
        beat = max(self.settings.lease_duration.total_seconds() / 3, 0.05)
        page = run.task
        deadline: float | None = None
        try:
            # A page that ends at its first step (a cached answer, nothing to fetch) is seen
            # after one turn of the loop, with no wait set up for it (a wait's callbacks and
            # timer cost a job more than the rest of its page).
            await asyncio.sleep(0)
            while not page.done():
                waiting: set[asyncio.Future[Any]] = {page}
                timeout = beat
                if deadline is None:
                    waiting.add(stop_waiter)
                else:
                    timeout = min(beat, max(deadline - time.monotonic(), 0))
                done, _ = await asyncio.wait(
                    waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if page in done:
                    break
                if deadline is None and stop_waiter in done:
                    grace = self.crew.stop_grace if self.crew.budget_used else 0.0
                    if grace <= 0:
                        raise Stopping
                    deadline = time.monotonic() + grace
                    continue
                if deadline is not None and time.monotonic() >= deadline:
                    raise Stopping
                try:
                    await lease.heartbeat()
                except LeaseLost:
                    raise LeaseLost(
                        "heartbeat refused: the job was taken over or cancelled"
                    ) from None
        except BaseException:
            run.stop()
            raise
        return page_of(job.type, run.result())

    # -- finishing -------------------------------------------------------------------------

    async def _complete(self, lease: Lease, count: int) -> Lease | None:
        """Marks the job completed and, unless the worker is stopping, takes the next job in
        the same statement (one commit a job). Raises LeaseLost when the completion is refused.
        """
        crew, taken = self.crew, lease.job
        following = None
        completed: bool | None = None
        if not crew.stopping:
            finished = Finished(taken.id, taken.lease_token, count)
            asked = time.monotonic()
            try:
                turn = await crew.takers[self.queue.name].take(finished)
            except psycopg.OperationalError:
                # Whether it committed is unknown: the completion alone is retried below, through
                # the outage. A job it may have taken is reclaimed when its lease expires.
                turn = None
            if turn is not None:
                completed = turn.completed
                if turn.job is not None:
                    following = self._lease(turn.job, asked)
        if completed is None:
            await lease.complete(count)
        elif not completed:
            raise LeaseLost("the job was taken over or cancelled")
        crew.report["completed"] += 1
        log.info("%s: completed", describe(taken))
        return following

    async def hand_back(
        self,
        lease: Lease,
        cursor: str | None,
        run: PageRun | None = None,
        progressed: bool = True,
        why: str = "",
    ) -> None:
        """Back in line with its cursor, attempt returned. After STALL_LIMIT hand-backs in a
        row with the page abandoned before it ended and no page saved, the stop costs an attempt
        instead, with an error that names the stop grace (a page longer than every worker's
        budget would otherwise never finish)."""
        taken = lease.job
        abandoned = run is not None and (not run.task.done() or run.task.cancelled())
        stalled = abandoned and not progressed
        try:
            if stalled and taken.stalls + 1 >= STALL_LIMIT:
                await self._over_budget(lease)
                return
            await lease.hand_back(stalled=stalled)
        except LeaseLost:
            return
        self.crew.report["handed_back"] += 1
        log.info("%s: handed back at cursor %r%s", describe(taken), cursor, why and f" ({why})")
        self.crew.emit("handed_back", taken, status="pending", cursor=cursor)

    async def _page_start(self, lease: Lease, rate: Rate) -> None:
        """Counts the next page start against the lane's rate; a short wait is waited out, a
        longer one raises RateWait (the job goes back in line)."""
        while True:
            wait = await lease.page_start(rate)
            if wait <= 0:
                return
            if wait > RATE_SLEEP or self.crew.stopping:
                raise RateWait(wait)
            await self.crew.pause(wait)

    async def _wait_for_rate(self, lease: Lease, seconds: float, cursor: str | None) -> None:
        taken = lease.job
        with contextlib.suppress(LeaseLost):
            until = await lease.wait_for_rate(timedelta(seconds=seconds))
            self.crew.report["rate_limited"] += 1
            log.info(
                "%s: lane %s has used its rate, back in line until %s",
                describe(taken),
                taken.lane,
                until.isoformat(),
            )
            self.crew.emit("handed_back", taken, status="pending", cursor=cursor, until=until)

    async def _over_budget(self, lease: Lease) -> None:
        grace = self.crew.stop_grace
        error = (
            f"StopGraceExceeded: the page in flight did not end within the worker's stop grace "
            f"({grace:g} s) {STALL_LIMIT} times in a row, so it never finished before its worker "
            "stopped (a time budget such as a Prefect work run's); give workers a longer budget "
            "or stop_grace, or make the page shorter"
        )
        await self._fail(lease, RuntimeError(error), text=error)

    async def _throttle(self, lease: Lease, throttle: Throttled) -> None:
        taken, settings = lease.job, self.settings
        delay = throttle.retry_after
        if delay is None:
            delay = retry_delay(
                taken.throttle_count + 1, settings.throttle_base_delay, settings.throttle_max_delay
            )
        error = error_text(throttle)
        with contextlib.suppress(LeaseLost):
            until = await lease.throttle(error, delay)
            self.crew.report["throttled"] += 1
            log.warning("%s: throttled, lane %s paused for %s", describe(taken), taken.lane, delay)
            self.crew.emit("throttled", taken, status="failed", error=error, until=until)

    async def _abandon(self, lease: Lease, abandon: Abandon) -> None:
        error = error_text(abandon)
        with contextlib.suppress(LeaseLost):
            await lease.abandon(error)
            self.crew.report["abandoned"] += 1
            log.warning("%s: abandoned: %s", describe(lease.job), abandon.reason)
            self.crew.emit("abandoned", lease.job, status="abandoned", error=error)

    async def _fail(
        self,
        lease: Lease,
        failure: Exception,
        *,
        text: str | None = None,
    ) -> None:
        taken, settings = lease.job, self.settings
        delay = retry_delay(
            taken.attempt_count, settings.retry_base_delay, settings.retry_max_delay
        )
        error = text or error_text(failure)
        try:
            # Retried like every write: a failure recorded late beats one lost (the lease would
            # expire and the job would say LeaseExpired instead of what went wrong).
            outcome = await lease.fail(error, delay, settings.max_attempts)
        except LeaseLost:
            log.warning(
                "%s: could not record its failure, left to lease expiry: %s", describe(taken), error
            )
            return
        if outcome is None:
            self.crew.report["lost"] += 1
            log.warning("%s: failed after its lease was lost: %s", describe(taken), error)
            return
        status, next_run_at = outcome
        self.crew.report[status] += 1
        kind: Kind = "failed" if status == "failed" else "abandoned"
        if status == "deferred":
            kind = "deferred"
        self.crew.emit(kind, taken, status=status, error=error, until=next_run_at)
        if status == "failed":
            log.warning(
                "%s: failed (attempt %d), retry at %s: %s",
                describe(taken),
                taken.attempt_count,
                next_run_at.isoformat(),
                error,
            )
        else:
            log.warning(
                "%s: %s after attempt %d: %s", describe(taken), status, taken.attempt_count, error
            )
