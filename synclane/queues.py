"""The declaration language: queues, their types, handlers and owner sources.

    shops = app.queue("shops", concurrency=4)

    @shops.owners
    def connected(queue: str) -> list[Owner]: ...

    @shops.windowed("orders", horizon=..., slice=..., every=...)
    def orders(job: Job) -> Page: ...

Declaring touches no database; `Catalog` is the set of queues one app declared.
"""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

from synclane.model import (
    ConfigError,
    Job,
    JobType,
    Owner,
    Page,
    QueueSettings,
    SnapshotType,
    WindowedType,
    check_name,
)

Handler = Callable[[Job], Page] | Callable[[Job], Awaitable[Page]]
OwnerSource = (
    Callable[[str], Iterable[Owner | str]] | Callable[[str], Awaitable[Iterable[Owner | str]]]
)
H = TypeVar("H", bound=Callable[..., Any])


class Queue:
    """A named group of job types with one worker configuration."""

    def __init__(self, name: str, settings: QueueSettings) -> None:
        self.name = name
        self.settings = settings
        self.types: dict[str, JobType] = {}
        self.handlers: dict[str, Handler] = {}
        self.owner_source: OwnerSource | None = None

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, types={list(self.types)})"

    def owners(self, source: H) -> H:
        """Decorate the function that says who is connected: `source(queue_name) -> [Owner]`
        (any iterable of Owner objects or owner id strings, or a coroutine returning one)."""
        if not callable(source):
            raise ConfigError(f"queue {self.name!r}: @owners needs a function, got {source!r}")
        self.owner_source = source
        return source

    def snapshot(self, name: str, *, every: timedelta | float) -> Callable[[H], H]:
        """Declare a type without a window: one initial job, then one per period."""
        return self._declare(SnapshotType(name, every=every, priority=len(self.types)))  # type: ignore[arg-type]

    def windowed(
        self,
        name: str,
        *,
        horizon: timedelta | float,
        slice: timedelta | float,
        every: timedelta | float,
        overlap: timedelta | float = timedelta(0),
    ) -> Callable[[H], H]:
        """Declare a type whose history is cut into slices back to `horizon`."""
        job_type = WindowedType(
            name,
            horizon=horizon,  # type: ignore[arg-type]
            slice=slice,  # type: ignore[arg-type]
            every=every,  # type: ignore[arg-type]
            overlap=overlap,  # type: ignore[arg-type]
            priority=len(self.types),
        )
        return self._declare(job_type)

    def _declare(self, job_type: JobType) -> Callable[[H], H]:
        if job_type.name in self.types:
            raise ConfigError(
                f"queue {self.name!r} declares type {job_type.name!r} twice; give each type "
                "its own name"
            )
        self.types[job_type.name] = job_type

        def register(handler: H) -> H:
            if not callable(handler):
                raise ConfigError(
                    f"{self.name}.{job_type.name}: the handler must be a function, got {handler!r}"
                )
            self.handlers[job_type.name] = handler
            return handler

        return register

    def job_type(self, name: str) -> JobType:
        try:
            return self.types[name]
        except (KeyError, TypeError):
            known = ", ".join(repr(t) for t in self.types) or "none yet"
            close = difflib.get_close_matches(str(name), list(self.types), n=1)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else f"declare it with @{self.name}.snapshot(...) or @{self.name}.windowed(...)"
            )
            raise ConfigError(
                f"queue {self.name!r} has no type {name!r:.100} (declared: {known}); {hint}"
            ) from None

    def check_handlers(self) -> None:
        """Every type has a handler (a worker needs one for each job it may take)."""
        for type_name in self.types:
            if type_name not in self.handlers:
                raise ConfigError(
                    f"{self.name}.{type_name} has no handler: decorate a function with "
                    f"@{self.name}.snapshot/windowed({type_name!r}, ...)"
                )


class Catalog:
    """The queues one app declared, by name."""

    def __init__(self) -> None:
        self._queues: dict[str, Queue] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(self._queues)

    def __len__(self) -> int:
        return len(self._queues)

    def __contains__(self, name: object) -> bool:
        return name in self._queues

    def __getitem__(self, name: str) -> Queue:
        return self._queues[name]

    def values(self) -> list[Queue]:
        return list(self._queues.values())

    def items(self) -> list[tuple[str, Queue]]:
        return list(self._queues.items())

    def add(self, name: str, settings: QueueSettings) -> Queue:
        check_name("queue name", name)
        if name in self._queues:
            raise ConfigError(f"queue {name!r} is declared twice; declare it once and reuse it")
        queue = self._queues[name] = Queue(name, settings)
        return queue

    def get(self, name: str) -> Queue:
        """The queue named `name`, or a ConfigError that lists the declared ones."""
        try:
            return self._queues[name]
        except (KeyError, TypeError):
            known = ", ".join(repr(q) for q in self._queues) or "none"
            close = difflib.get_close_matches(str(name), list(self._queues), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "declare it with app.queue(...)"
            raise ConfigError(f"unknown queue {name!r:.100} (declared: {known}); {hint}") from None

    def pick(self, names: str | Iterable[str] | None) -> list[Queue]:
        """The queues named (one name, a list, or None for all of them)."""
        if names is None:
            return self.values()
        if isinstance(names, str):
            return [self.get(names)]
        if not isinstance(names, Iterable):
            raise ConfigError(
                f"queues must be a queue name or a list of them, got {type(names).__name__} "
                f"{names!r:.100}"
            )
        return [self.get(name) for name in names]
