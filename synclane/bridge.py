"""The one bridge between user code and synclane's event loop.

User code (a handler, an owner source) may be a plain function or a coroutine function, and
may misbehave: block, never return, raise BaseExceptions. Plain calls run in a daemon thread of
their own (the heartbeat keeps beating; nothing waits for a call that never returns when the
process exits) with the caller's context variables (a Prefect run's logger, tracing ids). What
a call returns decides what happens next, not how the function was declared: a plain decorator
over an `async def`, or an object with `async def __call__`, returns an awaitable, and that
awaitable runs on the loop like any coroutine handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

from synclane.errors import HandlerEscaped

T = TypeVar("T")


def in_thread(
    call: Callable[[], T], name: str, ended: Callable[[], None] | None = None
) -> asyncio.Future[T]:
    """Run `call` in a daemon thread; a future of its outcome on the running loop. A
    BaseException, and a StopIteration (which asyncio futures refuse), arrive as HandlerEscaped.
    `ended` is called on the loop when the thread has returned, also after the future was
    cancelled."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()
        if ended is not None:
            ended()

    def post(outcome: Callable[[], None]) -> None:
        # A call abandoned on stop may end after the loop closed: nobody waits for it then.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, outcome)

    def target() -> None:
        try:
            result = call()
        except BaseException as error:
            failure = _as_exception(error)
            post(lambda: future.set_exception(failure))
        else:
            post(lambda: future.set_result(result))

    _start(target, name)
    return future


def blocking_call(call: Callable[[], T], timeout: float, name: str) -> T:
    """Run `call` in a daemon thread and wait at most `timeout` seconds for it (TimeoutError;
    the thread is left behind). Works where an event loop already runs (Jupyter, a worker). A
    call that returns an awaitable has it awaited, within the same timeout, in a loop of its own.
    """
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            result: Any = call()
            if inspect.isawaitable(result):
                result = asyncio.run(_bounded(result, timeout))
            outcome["result"] = result
        except BaseException as error:
            outcome["error"] = _as_exception(error)
        finally:
            finished.set()

    _start(target, name)
    if not finished.wait(timeout):
        raise TimeoutError
    if "error" in outcome:
        raise outcome["error"]
    result: T = outcome["result"]
    return result


def batches_in_thread(
    items: Callable[[], Iterable[T]], size: int, timeout: float, name: str
) -> Iterator[list[T]]:
    """Read an iterable (made by `items()` in a thread of its own) in lists of at most `size`,
    holding at most two lists in memory. Each list must arrive within `timeout` seconds
    (TimeoutError). An exception of the iterable is raised where the list would have been."""
    handoff: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def put(kind: str, value: Any) -> bool:
        while not stop.is_set():
            try:
                handoff.put((kind, value), timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def target() -> None:
        try:
            batch: list[T] = []
            for item in items():
                batch.append(item)
                if len(batch) >= size:
                    if not put("items", batch):
                        return
                    batch = []
            if batch and not put("items", batch):
                return
            put("end", None)
        except BaseException as error:
            put("error", _as_exception(error))

    _start(target, name)
    try:
        while True:
            try:
                kind, value = handoff.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError from None
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()


class PageRun:
    """One call of a handler on the running loop: a coroutine function is called on the loop,
    anything else in a thread; an awaitable result is then awaited on the loop. `result()` gives
    the outcome once `task` is done; `stopped` is done once the user code no longer runs at all,
    which for a thread abandoned on a stop or a lost lease may be long after `task` was cancelled.

    Only `stop()` is the worker's cancellation. The handler runs in `task`, so a handler that
    cancels its own task (asyncio.current_task().cancel(), a watchdog, a timeout helper that
    forgets uncancel()) sets the very flags a stop sets (task.cancelling()): only the worker
    knows whether it asked, and a cancellation it did not ask for is the handler's failure."""

    def __init__(self, handler: Callable[[Any], Any], job: Any) -> None:
        loop = asyncio.get_running_loop()
        self.stopped: asyncio.Future[None] = loop.create_future()
        self.stopping = False  # the worker abandoned the page (a stop, a lost lease)
        self._threads = 0
        self.task: asyncio.Task[Any] = asyncio.ensure_future(
            contained(self._call(handler, job), lambda: self.stopping)
        )
        self.task.add_done_callback(lambda _: self._maybe_stopped())

    def stop(self) -> None:
        """The worker abandons the page."""
        self.stopping = True
        self.task.cancel()

    def result(self) -> Any:
        """What the page returned or raised, once `task` is done. A task that ended cancelled
        although the worker did not stop it (a handler that cancelled itself, then returned)
        raises HandlerEscaped, like a CancelledError the handler raised."""
        if self.task.cancelled() and not self.stopping:
            raise HandlerEscaped(asyncio.CancelledError())
        return self.task.result()

    async def outcome(self) -> Any:
        """Wait for the page and return `result()`; a cancellation of the waiter stops it."""
        try:
            await asyncio.wait([self.task])
        except asyncio.CancelledError:
            self.stop()
            raise
        return self.result()

    def _maybe_stopped(self) -> None:
        if self.task.done() and self._threads == 0 and not self.stopped.done():
            self.stopped.set_result(None)

    def _thread_ended(self) -> None:
        self._threads -= 1
        self._maybe_stopped()

    async def _call(self, handler: Callable[[Any], Any], job: Any) -> Any:
        if inspect.iscoroutinefunction(handler):
            result = handler(job)
        else:
            name = f"synclane-job-{getattr(job, 'id', '?')}"
            self._threads += 1
            result = await in_thread(functools.partial(handler, job), name, self._thread_ended)
        if inspect.isawaitable(result):
            result = await result
        return result


async def contained(awaitable: Awaitable[T], asked: Callable[[], bool]) -> T:
    """Await user code so that nothing it raises escapes as anything but an Exception: asyncio
    would re-raise SystemExit and KeyboardInterrupt out of the loop (killing the worker), and a
    CancelledError would pass for a cancellation of the slot. Only a cancellation the worker
    `asked` for (a stop, a page abandoned) goes through as a cancellation: task.cancelling()
    cannot tell, since user code can cancel the task it runs in."""
    try:
        return await awaitable
    except asyncio.CancelledError as error:
        if asked():
            raise
        raise HandlerEscaped(error) from error
    except Exception:
        raise
    except BaseException as error:
        raise HandlerEscaped(error) from error


def _as_exception(error: BaseException) -> Exception:
    if isinstance(error, StopIteration | StopAsyncIteration) or not isinstance(error, Exception):
        return HandlerEscaped(error)
    return error


def _start(target: Callable[[], None], name: str) -> None:
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(target,), name=name, daemon=True).start()


async def _bounded(awaitable: Awaitable[Any], timeout: float) -> Any:
    return await asyncio.wait_for(awaitable, timeout)
