"""A synclane worker inside an orchestrator's run (Dagster, Prefect): run it in a thread, wait
in the caller's thread, and turn whatever interrupts the wait into a clean stop; and ride out a
short database outage in the run's own calls (`through_outage`), as the worker rides it out.

Orchestrators stop a run by raising in its main thread (Dagster's
`DagsterExecutionInterruptedError` on run termination, Prefect's `TerminationSignal` on
cancellation, `KeyboardInterrupt` on Ctrl-C). A worker running in that thread would be torn
down mid-page; a worker in a thread of its own is stopped through `Worker.stop()` instead, the
same path as SIGTERM on `synclane work` or the time budget, and hands its jobs back.

No orchestrator is imported here.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from synclane.errors import DatabaseUnavailable
from synclane.worker.outage import OUTAGE_BACKOFF, Outage

if TYPE_CHECKING:
    from synclane.worker import Worker

log = logging.getLogger("synclane")

T = TypeVar("T")

# How long an orchestrator run's own call (planning, a requeue, a backfill's look at the
# history) waits for the database to come back before the run fails: a restart or a failover
# takes seconds; what takes longer is an outage a person should hear of.
OUTAGE_PATIENCE = 300.0
# What an unreachable or restarting database raises: a broken connection or a refused one.
AWAY = (psycopg.OperationalError, DatabaseUnavailable)


def through_outage(
    call: Callable[[], T],
    what: str,
    *,
    patience: float = OUTAGE_PATIENCE,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`call()`, tried again while the database cannot be reached (a restart, a failover), with
    the worker's backoff, for up to `patience` seconds; then its error is raised. The outage is
    logged once when it starts and once when it ends, naming `what` waited. Only calls that are
    safe to send twice belong here: a second plan adds nothing, a second requeue finds nothing
    left to requeue (so a count can miss what a lost answer did)."""
    outage = Outage()
    deadline = time.monotonic() + patience
    tries = 0
    while True:
        try:
            result = call()
        except AWAY as error:
            if time.monotonic() >= deadline:
                raise
            outage.lost(what, error)
            sleep(OUTAGE_BACKOFF[min(tries, len(OUTAGE_BACKOFF) - 1)])
            tries += 1
            continue
        outage.reached(what)
        return result


def run_until_stopped(
    worker: Worker,
    *,
    poll_seconds: float = 0.5,
    stop_timeout: float = 60.0,
    between_polls: Callable[[], object] | None = None,
) -> dict[str, int]:
    """Run `worker` in a thread of its own and wait for its report.

    Whatever interrupts the waiting thread stops the worker through `Worker.stop()`: each running
    job goes back to `pending` with its last saved cursor, its attempt given back. The waiting
    thread waits up to `stop_timeout` for that hand-back, then re-raises what interrupted it.

    `between_polls` is called in the waiting thread every `poll_seconds`, once more when the
    worker has ended, and after a hand-back: the place to pass on what the worker's listeners
    collected (an orchestrator's logger may want its own thread). The worker runs in a copy of
    the caller's context, so context-bound loggers still know whose lines they are."""
    context = contextvars.copy_context()
    outcome: dict[str, Any] = {}
    # Waiting on an Event, not Thread.join: a join interrupted by an exception can mark a
    # running thread as stopped (CPython 3.11), and then is_alive() lies.
    finished = threading.Event()

    def target() -> None:
        try:
            outcome["report"] = context.run(worker.run)
        except BaseException as error:
            outcome["error"] = error
        finally:
            finished.set()

    def tell() -> None:
        if between_polls is not None:
            between_polls()

    threading.Thread(target=target, name="synclane-worker", daemon=True).start()
    try:
        while not finished.wait(poll_seconds):
            tell()
    except BaseException as interruption:
        log.warning(
            "worker %s interrupted (%s): handing its jobs back",
            worker.name,
            type(interruption).__name__,
        )
        worker.stop()
        if not _wait_within(finished, stop_timeout, poll_seconds):
            log.error(
                "worker %s did not hand its jobs back within %.0f s; their leases will expire",
                worker.name,
                stop_timeout,
            )
        _tell_despite_interruptions(tell)
        raise
    tell()
    if "error" in outcome:
        raise outcome["error"]
    report: dict[str, int] = outcome["report"]
    return report


def _wait_within(finished: threading.Event, timeout: float, poll_seconds: float) -> bool:
    """Wait for the worker, riding out further interruptions (a runner repeats its signal)
    until the deadline: the hand-back under way matters more than a second signal."""
    deadline = time.monotonic() + timeout
    while not finished.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            finished.wait(min(poll_seconds, remaining))
        except BaseException:
            continue
    return True


def _tell_despite_interruptions(tell: Callable[[], None]) -> None:
    """Pass on the hand-back events once; a second interruption must not lose them halfway."""
    try:
        tell()
    except BaseException as error:
        log.warning("could not report the hand-back (%s)", type(error).__name__)
