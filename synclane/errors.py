"""What can go wrong, and how an exception becomes text synclane stores or prints.

Pure: no I/O. `ConfigError` lives in synclane.model (a wrong value is a fact about a value).
"""

from __future__ import annotations

from asyncio import CancelledError

from synclane.model import MAX_ERROR_LENGTH


class DatabaseUnavailable(ConnectionError):
    """PostgreSQL could not be reached. The message never contains the password."""


class SchemaError(RuntimeError):
    """The schema is missing, or was made by a newer synclane."""


class OwnerSourceError(RuntimeError):
    """A queue's owner source raised, did not answer within `owners_timeout`, or returned
    something that is not a list of owners. The queue was not planned; `added` holds what the
    other queues of the same `plan()` call added."""

    def __init__(self, message: str, added: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.added = added or {}


class HandlerEscaped(Exception):
    """A handler or an owner source raised a BaseException (SystemExit, KeyboardInterrupt, a
    CancelledError nobody asked for, StopIteration out of a thread …): it fails its job like any
    error instead of ending the worker, the slot or the event loop."""

    def __init__(self, original: BaseException) -> None:
        self.original = original
        super().__init__(type(original).__name__)


class WorkerDied(RuntimeError):
    """A part of a worker (a slot, its planner, its lease reclaimer, its listener, its idle
    check) ended before the worker stopped, a bug of synclane's that escaped it: the worker
    stops, handing its jobs back, and `run_worker` raises this instead of returning as if its
    work were done, or running on without that part."""


def message_of(error: BaseException) -> str:
    """str(error), or a stand-in when str() itself fails."""
    try:
        return str(error)
    except Exception:
        return f"<unprintable {type(error).__name__} object>"


def first_line(error: BaseException, default: str | None = None) -> str:
    """The first line of the message, trimmed; when there is none, `default` (else the type's
    name)."""
    text = message_of(error).strip()
    if not text:
        return type(error).__name__ if default is None else default
    return text.splitlines()[0].strip()


def storable(text: str, limit: int | None = None) -> str:
    """Text PostgreSQL can hold: no NUL bytes, lone surrogates escaped, cut to `limit`."""
    text = text.replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def error_text(error: BaseException) -> str:
    """'<ExceptionType>: <message>' as the table stores it, bounded and storable. An escaped
    BaseException is named after itself, not after its wrapper."""
    if isinstance(error, HandlerEscaped):
        error = error.original
    message = message_of(error)
    if not message and isinstance(error, CancelledError):
        message = "the handler was cancelled, and not by the worker"
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return storable(text, MAX_ERROR_LENGTH)
