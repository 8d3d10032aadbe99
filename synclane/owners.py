"""Asking a queue's owner source who is connected, and keeping the owners table in step.

The source is user code: it may be slow, hang, raise, or return something that is not a list
of owners, and one of a million accounts may have an id PostgreSQL cannot store. It runs in a
thread of its own (synclane.bridge) under `owners_timeout`, and is read in batches so that
memory stays bounded whatever its length; owners it names badly, and items that are no owner
at all, are left out with one logged line; the rest are planned.

The owners table (sql/schema.sql) records the owners the source named and the lane each one's
jobs are planned into. `admit` registers a batch of owners; when an owner's lane changed it moves
the owner's open jobs to the new lane in the same statement, and the running-lane index decides
whether that can happen now (docs/planning.md, "When an owner changes lanes").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import psycopg

from synclane.bridge import batches_in_thread
from synclane.errors import OwnerSourceError, error_text
from synclane.model import ConfigError, Owner
from synclane.queues import Queue
from synclane.steps import Atomic, Execute, Fetch, Steps

log = logging.getLogger("synclane")

# How many owners the planner reads from a source at a time: memory stays bounded by this,
# whatever the number of accounts.
BATCH = 5_000


def source_name(queue: Queue) -> str:
    source = queue.owner_source
    return getattr(source, "__qualname__", None) or repr(source)


def owner_batches(queue: Queue, timeout: float, size: int = BATCH) -> Iterator[list[Owner]]:
    """The queue's owners in lists of at most `size`, each checked, duplicates within a list
    dropped. Raises OwnerSourceError when the source raises, returns no iterable, or a list
    takes longer than `timeout` seconds to arrive."""
    source = queue.owner_source
    if source is None:
        raise ConfigError(
            f"queue {queue.name!r} has no owner source, so the planner cannot know who is "
            f"connected: decorate a function with @{queue.name}.owners"
        )
    name = source_name(queue)
    refused = _Refusals(queue.name, name)
    items = batches_in_thread(lambda: _iterable(source(queue.name)), size, timeout, name)
    try:
        for batch in items:
            owners = refused.check(batch)
            if owners:
                yield owners
    except TimeoutError:
        raise OwnerSourceError(
            f"queue {queue.name!r}: the owner source {name} did not answer within "
            f"owners_timeout={timedelta(seconds=timeout)}; planning of this queue was skipped. "
            "Make it answer sooner (a timeout on its own requests) or raise "
            "SyncLane(owners_timeout=...)"
        ) from None
    except _NotOwners as error:
        raise OwnerSourceError(
            f"queue {queue.name!r}: the owner source {name} {error}; planning of this queue "
            "was skipped"
        ) from None
    except OwnerSourceError:
        raise
    except Exception as error:
        raise OwnerSourceError(
            f"queue {queue.name!r}: the owner source {name} raised {error_text(error)}; "
            "planning of this queue was skipped"
        ) from error
    finally:
        refused.report()


def connected_owners(queue: Queue, timeout: float) -> list[Owner]:
    """Every owner the source names, checked and without duplicates (the first one wins)."""
    found: dict[str, Owner] = {}
    for batch in owner_batches(queue, timeout):
        for owner in batch:
            found.setdefault(owner.id, owner)
    return list(found.values())


def _iterable(result: Any) -> Iterable[Any]:
    if hasattr(result, "__await__"):
        result = asyncio.run(_awaited(result))
    if hasattr(result, "__aiter__"):  # an async generator: read on a loop of its own, lazily
        return _drained(result)
    if isinstance(result, str | bytes) or not isinstance(result, Iterable):
        raise _NotOwners(
            f"returned {_shown(result)}; return a list of Owner(...) objects or owner id strings"
        )
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _drained(items: Any) -> Iterator[Any]:
    """An async iterable, item by item, from a loop this thread runs."""
    loop = asyncio.new_event_loop()
    iterator = items.__aiter__()
    try:
        while True:
            try:
                yield loop.run_until_complete(iterator.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.close()


class _NotOwners(TypeError):
    """An owner source returned something that is not a list of owners."""


def _shown(item: object) -> str:
    """An item for a log line: its type and repr, even when its repr raises."""
    try:
        return f"{type(item).__name__} {item!r:.100}"
    except Exception:
        return f"{type(item).__name__} <unprintable>"


class _Refusals:
    """Items left out of planning, logged once per planning of a queue: owners that cannot be
    stored, and items that are no owner at all (an int id, None): one bad item of a million
    costs that item, not the queue's planning."""

    def __init__(self, queue: str, source: str) -> None:
        self.queue, self.source = queue, source
        self.count = 0
        self.first = ""
        self.strangers = 0
        self.first_stranger = ""

    def check(self, items: list[Any]) -> list[Owner]:
        owners: dict[str, Owner] = {}
        for item in items:
            owner = Owner(item) if isinstance(item, str) else item
            if not isinstance(owner, Owner):
                self.strangers += 1
                self.first_stranger = self.first_stranger or _shown(item)
                continue
            try:
                owner.check()
            except ConfigError as error:
                self.count += 1
                self.first = self.first or str(error)
                continue
            owners.setdefault(owner.id, owner)
        return list(owners.values())

    def report(self) -> None:
        if self.strangers:
            log.error(
                "queue %s: the owner source %s yielded %d item(s) that are neither an Owner(...) "
                "nor an owner id string, left out of planning (first: %s); yield Owner(str(id)) "
                "for numeric ids",
                self.queue,
                self.source,
                self.strangers,
                self.first_stranger,
            )
        if self.count:
            log.error(
                "queue %s: the owner source %s named %d owner(s) that cannot be stored, left "
                "out of planning: %s",
                self.queue,
                self.source,
                self.count,
                self.first,
            )


# -- the owners table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """What the owners table says of one owner: the lane its jobs are planned into, and whether
    it had its first plan."""

    lane: str
    planned: bool


def admit(queue: str, owners: list[Owner]) -> Steps[dict[str, Known]]:
    """Register these owners in the lanes the source gives them, moving the open jobs of those
    whose lane changed; returns what the table knows of each afterwards. An owner whose move the
    running-lane index refuses (its new lane runs a job, and so does one of its own) keeps its old
    lane until a later call moves it; a new one is registered in the lane its running job holds."""
    ids = [o.id for o in owners]
    rows = yield Fetch("known_owners", {"queue": queue, "owners": ids})
    known = {r["owner"]: Known(r["lane"], r["planned"]) for r in rows}
    changed = sorted(
        (o for o in owners if o.id not in known or known[o.id].lane != o.lane_key),
        key=lambda o: o.id,
    )
    if not changed:
        return known
    try:
        moved = yield Atomic(lambda: _admit(queue, changed))
        admitted = changed
    except psycopg.errors.UniqueViolation:
        # One owner's new lane is busy: the others move now, one by one.
        moved, admitted = 0, []
        for owner in changed:
            try:
                count = yield Atomic(partial(_admit, queue, [owner]))
                moved += count
                admitted.append(owner)
            except psycopg.errors.UniqueViolation:
                params = {"queue": queue, "owner": owner.id}
                if owner.id not in known:
                    yield Execute("admit_owner_where_it_runs", params)
                log.info(
                    "queue %s: owner %s moves to lane %s once its running job or the lane's "
                    "ends (the lane runs a job now); until then its jobs stay where they are",
                    queue,
                    owner.id,
                    owner.lane_key,
                )
        rows = yield Fetch("known_owners", {"queue": queue, "owners": [o.id for o in changed]})
        known.update({r["owner"]: Known(r["lane"], r["planned"]) for r in rows})
    for owner in admitted:
        previous = known.get(owner.id)
        known[owner.id] = Known(owner.lane_key, previous is not None and previous.planned)
    if moved:
        log.info("queue %s: moved %d open job(s) to their owners' new lanes", queue, moved)
    return known


def _admit(queue: str, owners: list[Owner]) -> Steps[int]:
    params = {
        "queue": queue,
        "owners": [o.id for o in owners],
        "lanes": [o.lane_key for o in owners],
    }
    (row,) = yield Fetch("admit_owners", params)
    moved: int = row["moved"]
    return moved
