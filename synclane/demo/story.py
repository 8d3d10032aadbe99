"""The demo's own lines beside the worker's events: what the broken page is, when the shop has
fixed it (so Requeue will now load it), when the requeued slice loads, when the story is over.

The worker's events say what synclane did; only the demo knows what happened at the shop. A
`Story` is a worker listener (`on_event=[..., story]`) that adds those lines, through `say`
(by default the `synclane.demo` logger at INFO). docs/demo.md tells the same story step by step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from synclane.demo import QUEUE, Demo
from synclane.demo.shop import BROKEN_CURSOR, BROKEN_OWNER, is_broken_slice
from synclane.events import WHOLE_LINE, Event

log = logging.getLogger("synclane.demo")


class Story:
    """Tells the demo's moments once each. `command` is how the reader runs synclane against
    the demo (e.g. `synclane --app synclane.demo.app:app`), for the requeue hint, which
    `say_command` says (by default `say`, or a log line marked to be printed whole: a command
    to copy must not be cut into lines). `page`: whether the demo serves its page, where a
    Requeue button does the same."""

    def __init__(
        self,
        demo: Demo,
        command: str = "synclane --app synclane.demo.app:app",
        say: Callable[[str], object] | None = None,
        *,
        say_command: Callable[[str], object] | None = None,
        page: bool = True,
    ) -> None:
        self.demo = demo
        self.command = command
        self.page = page
        self.say: Callable[[str], object] = say or (lambda text: log.info("%s", text))
        self.say_command: Callable[[str], object] = say_command or (
            say or (lambda text: log.info("%s", text, extra={WHOLE_LINE: True}))
        )
        self.told: set[str] = set()
        self.broken_job: int | None = None
        self._stop = threading.Event()
        self._fix_watch: threading.Thread | None = None

    def intro(self, planned: int, *, kept: bool = False) -> None:
        """What happens first, and where each step is explained. `kept`: the story continues
        a run that may have left the broken slice abandoned, waiting for its requeue."""
        if kept:
            self.say(f"continuing the last run's story; {planned} new jobs planned")
            waiting = self.demo.app.failures(QUEUE, owner=BROKEN_OWNER, status="abandoned")
            if not waiting.empty:
                self.broken_job = int(waiting["job_ids"].iloc[0][0])
                self.told.add("abandoned")
                self._watch_the_fix()
            return
        self.say(
            f"planned {planned} jobs for 4 accounts: each account's products first, then its "
            "orders newest first (a refresh, then 30-day history slices back 120 days, the "
            "next one planned as each finishes)"
        )
        self.say(
            "acme-us and acme-eu share the lane acme: never two requests for them at once; "
            "what each step means: docs/demo.md"
        )

    def close(self) -> None:
        self._stop.set()
        if self._fix_watch is not None:
            self._fix_watch.join(timeout=5)

    def __call__(self, event: Event) -> None:
        """A listener: runs on the worker's event loop, so it only decides and says; the one
        wait (for the shop's fix) runs in a thread of its own."""
        if event.queue != QUEUE or not self._is_broken(event):
            return
        self.broken_job = event.job_id
        if event.kind == "failed":
            self._once(
                "broken",
                f"job {event.job_id} is globex's broken slice: the shop cannot answer the page "
                f"at cursor {BROKEN_CURSOR} (a bad record on its side), so every retry starts "
                f"there, not at the first page",
            )
        elif event.kind == "abandoned" and "abandoned" not in self.told:
            self.told.add("abandoned")
            self._watch_the_fix()
        elif event.kind == "started" and "abandoned" in self.told:
            self._once(
                "requeued",
                f"job {event.job_id} was requeued: it continues at its saved cursor "
                f"{event.cursor or BROKEN_CURSOR}; the pages before it are not asked for again",
            )
        elif event.kind == "completed" and "abandoned" in self.told:
            self._once(
                "healed",
                f"job {event.job_id} completed after the requeue ({event.records} records): "
                "every account's history is loaded and the story is over. The demo keeps "
                "refreshing every 15 minutes; Ctrl-C stops it",
            )

    def _watch_the_fix(self) -> None:
        self._fix_watch = threading.Thread(
            target=self._tell_when_fixed, name="synclane-demo-story", daemon=True
        )
        self._fix_watch.start()

    def _is_broken(self, event: Event) -> bool:
        if event.owner != BROKEN_OWNER or event.window_start is None or event.window_end is None:
            return False
        return event.job_id == self.broken_job or is_broken_slice(
            event.owner, event.window_start, event.window_end, event.at
        )

    def _once(self, moment: str, text: str) -> None:
        if moment not in self.told:
            self.told.add(moment)
            self.say(text)

    def _tell_when_fixed(self) -> None:
        """Waits until the shop has fixed its record, then says Requeue will now load it."""
        try:
            fixed_at = self.demo.shop.fixed_at()
            while fixed_at is None and not self._stop.wait(0.5):
                fixed_at = self.demo.shop.fixed_at()
            if fixed_at is None:
                return
            left = (fixed_at - datetime.now(UTC)).total_seconds()
            if left > 0:
                self.say(
                    "the shop is fixing the broken record on its side; the page will answer in "
                    f"about {left:.0f} s"
                )
            while not self._stop.is_set() and datetime.now(UTC) < fixed_at:
                self._stop.wait(min((fixed_at - datetime.now(UTC)).total_seconds(), 1.0))
            if self._stop.is_set():
                return
            # The command on a line of its own, printed whole: copied whole.
            command = f"  {self.command} requeue {self._requeue_filter()}"
            if self.page:
                self.say("the shop has fixed its broken record: press Requeue on the page, or run")
            else:
                self.say("the shop has fixed its broken record: requeue the slice with")
            self.say_command(command)
        except Exception as error:  # the story must never break the demo
            log.debug("the demo's story could not follow the shop's fix: %s", error)

    def _requeue_filter(self) -> str:
        """--cause-id of the broken page's cause, as `synclane failures` shows it."""
        for _ in range(20):
            failures = self.demo.app.failures(QUEUE, owner=BROKEN_OWNER, status="abandoned")
            if not failures.empty:
                return f"--cause-id {failures['cause_id'].iloc[0]}"
            time.sleep(0.1)
        return f"--owner {BROKEN_OWNER}"
