"""A synclane worker inside an orchestrator's run (Dagster, Prefect): run it in a thread, wait
in the caller's thread, and turn whatever interrupts the wait into a clean stop.

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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synclane.worker import Worker

log = logging.getLogger("synclane")


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
