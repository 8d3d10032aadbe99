"""One statement and one commit for the slots that ask at the same instant.

Slots of one worker whose pages end together each ask for a write (a saved page, a heartbeat);
`Shared` runs one statement for everyone who asked during the same turn of the event loop, and
gives each its own answer. A slot that asks alone is served at once: nothing waits to form a
batch. While a statement is in flight, whoever asks meanwhile goes in the next one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Request = TypeVar("Request")
Answer = TypeVar("Answer")


class Shared(Generic[Request, Answer]):
    """Runs `statement` for batches of requests; `statement` answers each, in order."""

    def __init__(
        self,
        statement: Callable[[list[Request]], Awaitable[Sequence[Answer]]],
        unclaimed: Callable[[Answer], Awaitable[None]] | None = None,
        in_flight: int = 1,
    ) -> None:
        """`unclaimed` receives an answer whose asker was cancelled while its statement ran
        (a job taken for a slot that is gone must be handed back). `in_flight`: how many
        statements may run at once; a request that comes while fewer run goes at once instead
        of waiting for the one in flight (less waiting, a little less sharing)."""
        self.statement = statement
        self.unclaimed = unclaimed
        self.in_flight = in_flight
        self._waiting: list[tuple[Request, asyncio.Future[Answer]]] = []
        self._serving: set[asyncio.Task[None]] = set()
        self.statements = 0  # how many statements served how many requests: the sharing
        self.requests = 0

    async def ask(self, request: Request) -> Answer:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if len(self._serving) < self.in_flight and not self._starting:
            self._starting = True
            self._serving.add(asyncio.create_task(self._serve()))
        return await future

    _starting = False  # a server is about to take the requests of this instant

    async def idle(self) -> None:
        """Wait until no statement is in flight."""
        while self._serving:
            await asyncio.wait(set(self._serving))

    async def _serve(self) -> None:
        batch: list[tuple[Request, asyncio.Future[Answer]]] = []
        try:
            await asyncio.sleep(0)  # every slot whose page ended in this instant asks too
            self._starting = False
            while self._waiting:
                batch, self._waiting = self._waiting, []
                self.statements += 1
                self.requests += len(batch)
                try:
                    answers = await self.statement([request for request, _ in batch])
                except Exception as error:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, future), answer in zip(batch, answers, strict=True):
                    if not future.done():
                        future.set_result(answer)
                    elif self.unclaimed is not None:
                        await self.unclaimed(answer)
        except BaseException:
            self._starting = False
            # Cancelled itself (or a bug of ours): nobody may wait forever, neither those of the
            # statement in flight nor those waiting for the next.
            for _, future in [*batch, *self._waiting]:
                if not future.done():
                    future.cancel()
            self._waiting = []
            raise
        finally:
            # At once, not in a done callback: a request that comes after this loop saw no
            # waiting must find this server gone and start another.
            task = asyncio.current_task()
            if task is not None:
                self._serving.discard(task)
