"""A database outage as a worker sees it: said once when it goes, once when it is back."""

from __future__ import annotations

import logging
import sys

from synclane.errors import error_text

log = logging.getLogger("synclane")

# How long a worker waits between tries while the database is away.
OUTAGE_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)


class Outage:
    """Whether this worker found the database away: said once when it goes, once when it is
    reached again, whichever part of the worker notices."""

    def __init__(self) -> None:
        self.down = False

    def lost(self, what: str, error: BaseException) -> None:
        if not self.down:
            self.down = True
            text = error_text(error)
            embedded = sys.modules.get("synclane.embedded")  # loaded where the app uses it
            if embedded is not None and (notes := embedded.crash_notes()):
                text = notes[0]
            log.warning("%s cannot reach the database (%s); retrying", what, text)

    def reached(self) -> None:
        if self.down:
            self.down = False
            log.info("reached the database again")
