"""A server that refuses writes because it is read-only, told as an outage.

After a failover the DSN's host name can point at a standby for a while (the old primary, or a
managed service's writer endpoint until its DNS follows), and a replica given by mistake does
the same: every write fails with "cannot execute UPDATE in a read-only transaction" while the
connection itself is fine. A pool would keep handing out that connection, and a worker would
never reach the new primary.

synclane's own connections use the cursors below: a write refused as read-only closes the
connection it came on (a pool then opens a new one, which may reach the primary) and raises
`ServerReadOnly`, an OperationalError with no SQLSTATE, so that every part of synclane treats it
as the connection lost: a worker backs off and tries again, an operation reconnects and asks
whether its statement committed (it did not). A connection the caller passed in
(`enqueue(conn=...)`) is the caller's: its errors are not touched.
"""

from __future__ import annotations

from typing import Any, Self

import psycopg
from psycopg.rows import Row

from synclane.errors import first_line


class ServerReadOnly(psycopg.OperationalError):
    """The server refused a write: it is read-only. The connection was closed."""


def _refused(error: psycopg.errors.ReadOnlySqlTransaction) -> ServerReadOnly:
    return ServerReadOnly(
        f"the server is read-only ({first_line(error)}): a standby, as during a failover, or "
        "default_transaction_read_only is on; synclane closed the connection so that the next "
        "one may reach the primary"
    )


class ReadOnlyAwareCursor(psycopg.Cursor[Row]):
    """A cursor whose read-only refusal closes its connection and raises ServerReadOnly."""

    def execute(self, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().execute(*args, **kwargs)
        except psycopg.errors.ReadOnlySqlTransaction as error:
            self.connection.close()
            raise _refused(error) from None


class AsyncReadOnlyAwareCursor(psycopg.AsyncCursor[Row]):
    """ReadOnlyAwareCursor for asyncio connections (the worker's)."""

    async def execute(self, *args: Any, **kwargs: Any) -> Self:
        try:
            return await super().execute(*args, **kwargs)
        except psycopg.errors.ReadOnlySqlTransaction as error:
            raise await _closed(self.connection, error) from None


class AsyncReadOnlyAwareRawCursor(psycopg.AsyncRawCursor[Row]):
    """The same for the worker's statements with positional parameters (the take)."""

    async def execute(self, *args: Any, **kwargs: Any) -> Self:
        try:
            return await super().execute(*args, **kwargs)
        except psycopg.errors.ReadOnlySqlTransaction as error:
            raise await _closed(self.connection, error) from None


async def _closed(
    conn: psycopg.AsyncConnection[Any], error: psycopg.errors.ReadOnlySqlTransaction
) -> ServerReadOnly:
    await conn.close()
    return _refused(error)
