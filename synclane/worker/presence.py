"""A worker as the others see it: its row in the workers table, its ear on the schema's channel,
and its word when a lane it freed has due work.

`Presence` keeps one connection of its own (besides the slots' pool):

- At start it registers (sql/workers.sql, `worker_register`). Two live workers never share a
  name, so a running job's `leased_by` names one worker: when a live worker holds the name, this
  one takes the first free of `name#2`, `name#3`, … and a warning says so. A name whose holder
  died (its session to PostgreSQL is gone) is taken over at once.
- It LISTENs on the schema's channel (synclane.wakeup): a notification naming one of its queues
  wakes that queue's idle slots, so `poll_interval` is only a safety net.
- Every `BEAT` seconds one statement renews its row (how many slots run a job) and deletes the
  rows of workers lost for `FORGET_AFTER`; it also shows that the connection still works.
- When the connection breaks it connects again with backoff, registers again and wakes every
  slot once (what was notified meanwhile was missed). The slots poll all along.
- A clean stop tells the other workers that the jobs it handed back are due, and deletes its row.

`FreedLanes` sends the third kind of wake-up: after take statements that completed jobs, at most
once every `FREED_SPACING` per queue, one statement notifies when a lane those jobs freed has a
due job the finisher did not take itself and some worker of the queue has a slot that waits (a
worker says so at once when its first slot starts to wait, and when none waits any more:
`waiting_changed`). Under full load nobody waits: it reads, and sends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from synclane.connection import Database
from synclane.errors import error_text
from synclane.model import ConfigError
from synclane.params import Bigints
from synclane.read_only import AsyncReadOnlyAwareCursor
from synclane.store import SESSION, session_sql
from synclane.version import __version__
from synclane.wakeup import channel, notify_work_async
from synclane.worker.outage import OUTAGE_BACKOFF
from synclane.worker.taker import Batch

log = logging.getLogger("synclane")

BEAT = 5.0  # seconds between two beats of a worker's row
LOST_AFTER = timedelta(seconds=30)  # a worker that has not beaten for this long is lost
FORGET_AFTER = timedelta(hours=1)  # a lost worker's row is deleted this long after that
FREED_SPACING = 0.1  # seconds between two freed-lane checks of one queue in one worker
WAITING_SPACING = 0.5  # seconds: a worker says whether a slot of its waits at most this often
MAX_NAMES = 100  # name, name#2, … name#100: beyond that the name is refused


class Presence:
    """The worker's row and its ear, on a connection of its own; see the module's text."""

    def __init__(
        self,
        database: Database,
        name: str,
        queues: Sequence[str],
        slots: int,
        *,
        busy: Callable[[], int],
        waiting: Callable[[], int],
        wake: Callable[[str | None], None],
        poll_interval: float = 5.0,
    ) -> None:
        self.database = database
        self.poll_interval = poll_interval
        self.store = database.store
        self.name = name
        self.queues = list(queues)
        self.slots = slots
        self.busy = busy  # slots that run a job now
        self.waiting = waiting  # slots that found nothing and wait for work now
        self.wake = wake
        self.instance = uuid4()
        self.channel = channel(database.schema)
        self.listed = True  # False: the table is missing or not writable; listen only
        self.pool: AsyncConnectionPool[Any] | None = None  # the slots' pool, once open
        self._waiting_changed = False  # since the last worker_waiting statement
        self._saying_waiting: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._broken = False  # said once per break, and once when listening again
        self._said_polling = False  # that nothing wakes the slots (a pooler without listen_dsn)

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, choose the name, register and listen. A database that cannot be reached
        now is tried again by run(); the slots poll meanwhile."""
        try:
            self._conn = await self._connect()
            await self._choose_name(self._conn)
            await self._listen(self._conn)
        except psycopg.OperationalError as error:
            self._lost(error)
            await self.close()

    async def run(self) -> None:
        """Listen and beat until cancelled, connecting again after a break."""
        tries = 0
        while True:
            if self._conn is None:
                try:
                    self._conn = await self._connect()
                    await self._register_again(self._conn)
                    await self._listen(self._conn)
                except psycopg.OperationalError as error:
                    self._lost(error)
                    await self.close()
                    await asyncio.sleep(OUTAGE_BACKOFF[min(tries, len(OUTAGE_BACKOFF) - 1)])
                    tries += 1
                    continue
                tries = 0
                self.wake(None)  # anything notified while away was missed
            try:
                await self._listen_and_beat(self._conn)
            except psycopg.OperationalError as error:
                self._lost(error)
                await self.close()
            except Exception:
                # A mistake of ours costs the wake-ups for a while, never the worker.
                log.exception("worker %s: its listening connection failed", self.name)
                await self.close()
                await asyncio.sleep(OUTAGE_BACKOFF[-1])

    def waiting_changed(self) -> None:
        """The first of this worker's slots began to wait for work, or the last one stopped:
        say so now, not at the next beat (notify_freed_lanes wakes workers only when one has a
        waiting slot). At most once every WAITING_SPACING; a change meanwhile is said at its
        end, as it then stands."""
        self._waiting_changed = True
        if self._saying_waiting is None and self.listed and self.pool is not None:
            self._saying_waiting = asyncio.create_task(self._say_waiting(self.pool))

    async def _say_waiting(self, pool: AsyncConnectionPool[Any]) -> None:
        try:
            while self._waiting_changed and self.listed:
                self._waiting_changed = False
                params = {**self._who(), "waiting": self.waiting(), "busy": self.busy()}
                with contextlib.suppress(psycopg.Error):
                    async with pool.connection() as conn:
                        await conn.execute(self.store.query("worker_waiting"), params)
                await asyncio.sleep(WAITING_SPACING)
        finally:
            self._saying_waiting = None

    async def stopping(self, pool: AsyncConnectionPool[Any]) -> None:
        """Show the worker as stopping while its slots hand their jobs back."""
        if not self.listed:
            return
        with contextlib.suppress(psycopg.Error):
            async with pool.connection() as conn:
                await conn.execute(self.store.query("worker_stopping"), self._who())

    async def leave(self, pool: AsyncConnectionPool[Any]) -> None:
        """The worker stopped cleanly: its jobs are back in line (wake the others) and its row
        goes. A database that is away leaves the row to be shown lost, then forgotten."""
        if self._saying_waiting is not None:
            self._saying_waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._saying_waiting
        with contextlib.suppress(psycopg.Error):
            async with pool.connection() as conn:
                await notify_work_async(conn, self.store, self.queues)
                if self.listed:
                    await conn.execute(self.store.query("worker_leave"), self._who())
        await self.close()

    async def close(self) -> None:
        """Close the connection (the row stays: leave() deletes it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    # -- the connection ----------------------------------------------------------------------

    @property
    def listens(self) -> bool:
        """Whether this worker hears notifications: on a session of its own (the DSN, or the
        listen_dsn when the DSN goes through a transaction pooler). Without one it beats through
        the pooler, records no session, and its slots poll."""
        return self.database.listening is not None

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        # Named after the worker in pg_stat_activity (PostgreSQL keeps 63 bytes of it).
        label = f"synclane-presence {self.name}".encode()[:63].decode(errors="ignore")
        if self.database.listening is not None:  # a session of its own
            conn = await psycopg.AsyncConnection.connect(
                self.database.listening,
                autocommit=True,
                connect_timeout=10,
                application_name=label,
                cursor_factory=AsyncReadOnlyAwareCursor,
                client_encoding="UTF8",
            )
            await conn.execute(session_sql(SESSION))
            return conn
        return await psycopg.AsyncConnection.connect(
            self.database.dsn,
            autocommit=True,
            connect_timeout=10,
            application_name=label,
            cursor_factory=AsyncReadOnlyAwareCursor,
            **self.database.connection_options,
        )

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if not self.listens:
            if not self._said_polling:
                self._said_polling = True
                log.warning(
                    "worker %s: the DSN goes through a transaction pooler (pooler='transaction') "
                    "and no listen_dsn is given, so nothing wakes its idle slots: they look for "
                    "due work every poll_interval (%s s); give listen_dsn, a direct connection, "
                    "for instant pickup",
                    self.name,
                    f"{self.poll_interval:g}",
                )
            return
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        if self._broken:
            self._broken = False
            log.info("worker %s listens for due work again", self.name)

    async def _listen_and_beat(self, conn: psycopg.AsyncConnection[Any]) -> None:
        mine = set(self.queues)
        while True:
            if self.listens:
                # Notifications that arrive during the beat are kept by psycopg for the next
                # round.
                async for note in conn.notifies(timeout=BEAT):
                    if note.payload in mine:
                        self.wake(note.payload)
            else:
                await asyncio.sleep(BEAT)
            await self._beat(conn)

    def _lost(self, error: BaseException) -> None:
        if not self._broken:
            self._broken = True
            log.warning(
                "worker %s lost its listening connection (%s); its slots look for due work "
                "every poll_interval until it is back",
                self.name,
                error_text(error),
            )

    # -- the row -----------------------------------------------------------------------------

    def _who(self) -> dict[str, Any]:
        return {"name": self.name, "instance": self.instance}

    def _row(self) -> dict[str, Any]:
        return {
            **self._who(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "queues": self.queues,
            "slots": self.slots,
            "busy": self.busy(),
            "waiting": self.waiting(),
            "lost_after": LOST_AFTER,
            "session": self.listens,
        }

    async def _register(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Put the row in the list under self.name; False when a live worker holds the name."""
        if not self.listed:
            return True
        try:
            cur = await conn.execute(self.store.query("worker_register"), self._row())
        except (psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege) as error:
            self._unlisted(error)
            return True
        return await cur.fetchone() is not None

    async def _choose_name(self, conn: psycopg.AsyncConnection[Any]) -> None:
        wanted = self.name
        for number in range(1, MAX_NAMES + 1):
            self.name = wanted if number == 1 else f"{wanted}#{number}"
            if await self._register(conn):
                break
        else:
            raise ConfigError(
                f"worker_name {wanted!r} and {wanted}#2 … #{MAX_NAMES} are all held by live "
                "workers; give each worker process a name of its own (the default, host:pid, is)"
            )
        if self.name != wanted:
            cur = await conn.execute(self.store.query("worker_holder"), {"name": wanted})
            holder = await cur.fetchone()
            where = f"host {holder[0]}, pid {holder[1]}" if holder else "gone since"
            log.warning(
                "worker name %r is held by a live worker (%s): this worker runs as %r, the name "
                "its jobs' leased_by shows; give each worker process a name of its own",
                wanted,
                where,
                self.name,
            )

    async def _beat(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if not self.listed:
            await conn.execute("SELECT 1")  # the connection check alone
            return
        params = {
            **self._who(),
            "busy": self.busy(),
            "waiting": self.waiting(),
            "lost_after": LOST_AFTER,
            "forget_after": FORGET_AFTER,
            "session": self.listens,
        }
        try:
            cur = await conn.execute(self.store.query("worker_beat"), params)
        except (psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege) as error:
            self._unlisted(error)
            return
        row = await cur.fetchone()
        if row is not None and not row[0]:
            await self._register_again(conn)  # forgotten after a long pause, or taken over

    async def _register_again(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Register under the name the worker's jobs carry; it cannot change any more."""
        if not await self._register(conn):
            log.warning(
                "worker %s is not in the workers list: another live worker took its name while "
                "this one could not reach the database; it tries again at every beat",
                self.name,
            )

    def _unlisted(self, error: BaseException) -> None:
        self.listed = False
        log.warning(
            "worker %s is not shown in the workers list (%s): run app.migrate() or `synclane "
            "migrate` to create it, and grant the worker role SELECT, INSERT, UPDATE, DELETE on "
            "it (docs/operations.md); jobs run as before",
            self.name,
            error_text(error),
        )


class FreedLanes:
    """Tells idle workers (through the channel) that a lane freed by this worker's finished jobs
    has a due job the finisher did not take. At most once every FREED_SPACING: the first finish
    after a quiet spell is told at once, those that follow together."""

    def __init__(self, pool: AsyncConnectionPool[Any], database: Database, queue: str) -> None:
        self.pool = pool
        self.store = database.store
        self.params = {"queue": queue}
        self._done: set[int] = set()
        self._taken: set[str] = set()
        self._telling: asyncio.Task[None] | None = None

    def note(self, batch: Batch) -> None:
        """After a take statement: the jobs it completed and the lanes it took from (since
        the first completion not told yet: a lane taken before it was freed says nothing)."""
        if not batch.completed and not self._done:
            return
        self._taken.update(job.lane for job in batch.jobs)
        self._done.update(batch.completed)
        if self._telling is None:
            self._telling = asyncio.create_task(self._tell())

    async def _tell(self) -> None:
        try:
            while self._done:
                done, taken = self._done, self._taken
                self._done, self._taken = set(), set()
                params = {**self.params, "done_ids": Bigints(done), "taken_lanes": list(taken)}
                with contextlib.suppress(psycopg.Error):  # a courtesy: polling covers it
                    async with self.pool.connection() as conn:
                        await conn.execute(self.store.query("notify_freed_lanes"), params)
                await asyncio.sleep(FREED_SPACING)
        finally:
            self._telling = None

    async def close(self) -> None:
        if self._telling is not None:
            self._telling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._telling
