"""A database outage as a worker sees it: said once when it goes, once when it is back.

Two kinds, told apart because they send whoever reads the log to different places: the database
cannot be reached (no connection, a restart, a failover), or it answers but refuses the
statement (a `lock_timeout` or `statement_timeout` behind a user's lock, a serialization
failure, a full disk). Both are retried the same way.
"""

from __future__ import annotations

import logging
import sys

import psycopg

from synclane.connection import lost_connection
from synclane.errors import first_line

log = logging.getLogger("synclane")

# How long a worker waits between tries while the database is away.
OUTAGE_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)

# A connection the server would not open (too many clients) is a database out of reach too.
CONNECT_REFUSALS = frozenset({"53300"})


def refused_by_server(error: BaseException) -> bool:
    """Whether the server answered `error` for a statement it refused, on a connection that
    still works (as against a database that cannot be reached: no answer, a broken or refused
    connection, a server shutting down or read-only after a failover, which carries no
    SQLSTATE)."""
    if not isinstance(error, psycopg.OperationalError) or error.sqlstate in CONNECT_REFUSALS:
        return False
    return not lost_connection(error)


def outage_text(error: BaseException) -> str:
    """'<ExceptionType>: <first line>': the server's LINE and caret lines say nothing to a log."""
    line = first_line(error, "")
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


class Outage:
    """Whether this worker found the database away or refusing its statements: said once when
    it starts, once when it ends, whichever part of the worker notices."""

    def __init__(self) -> None:
        self.down = False
        self.refused = False  # the server answered, and refused

    def lost(self, what: str, error: BaseException) -> None:
        if self.down:
            return
        self.down = True
        self.refused = refused_by_server(error)
        text = outage_text(error)
        if self.refused:
            log.warning("%s: the database refused the statement (%s); retrying", what, text)
            return
        embedded = sys.modules.get("synclane.embedded")  # loaded where the app uses it
        if embedded is not None and (notes := embedded.crash_notes()):
            text = notes[0]
        log.warning("%s cannot reach the database (%s); retrying", what, text)

    def reached(self) -> None:
        if self.down:
            self.down = False
            if self.refused:
                log.info("the database takes the statements again")
            else:
                log.info("reached the database again")

    def too_long(self) -> str:
        """Why a write gave up, for LeaseLost."""
        if self.refused:
            return "the database refused the statement for too long"
        return "the database was unreachable for too long"
