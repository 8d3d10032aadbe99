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
    """What this worker found: the database out of reach (said once when it goes, once when it
    is back, whichever part of the worker notices), and the parts whose statements the server
    refuses (each said once when it starts, once when that part's statement goes through: a lock
    on one table refuses some statements while the others go on)."""

    def __init__(self) -> None:
        self.down = False
        self.refusing: set[str] = set()

    def lost(self, what: str, error: BaseException, part: str | None = None) -> None:
        """`what` failed with `error`; `part` (else `what`) names the statement for a refusal,
        so that slots refused one after the other say it once."""
        part = what if part is None else part
        if refused_by_server(error):
            if part not in self.refusing:
                self.refusing.add(part)
                log.warning(
                    "%s: the database refused the statement (%s); retrying",
                    part,
                    outage_text(error),
                )
            return
        if self.down:
            return
        self.down = True
        text = outage_text(error)
        embedded = sys.modules.get("synclane.embedded")  # loaded where the app uses it
        if embedded is not None and (notes := embedded.crash_notes()):
            text = notes[0]
        log.warning("%s cannot reach the database (%s); retrying", what, text)

    def reached(self, part: str) -> None:
        """A statement of `part` went through."""
        if self.down:
            self.down = False
            log.info("reached the database again")
        if part in self.refusing:
            self.refusing.discard(part)
            log.info("%s: the database takes the statement again", part)

    def too_long(self, part: str) -> str:
        """Why a write of `part` gave up, for LeaseLost."""
        if part in self.refusing:
            return "the database refused the statement for too long"
        return "the database was unreachable for too long"
