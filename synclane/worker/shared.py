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
    ) -> None:
        """`unclaimed` receives an answer whose asker was cancelled while its statement ran
        (a job taken for a slot that is gone must be handed back)."""
        self.statement = statement
        self.unclaimed = unclaimed
        self._waiting: list[tuple[Request, asyncio.Future[Answer]]] = []
        self._serving: asyncio.Task[None] | None = None
        self.statements = 0  # how many statements served how many requests: the sharing
        self.requests = 0

    async def ask(self, request: Request) -> Answer:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if self._serving is None:
            self._serving = asyncio.create_task(self._serve())
        return await future

    async def idle(self) -> None:
        """Wait until no statement is in flight."""
        if self._serving is not None:
            await asyncio.wait({self._serving})

    async def _serve(self) -> None:
        try:
            await asyncio.sleep(0)  # every slot whose page ended in this instant asks too
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
            for _, future in self._waiting:  # cancelled itself: nobody may wait forever
                future.cancel()
            self._waiting = []
            raise
        finally:
            self._serving = None
