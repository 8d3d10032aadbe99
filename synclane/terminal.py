"""What the command line shows, built on rich: tables that fit the terminal, a progress bar that
keeps log lines above it, and one short line per worker event.

Only the command line imports this module (and with it rich): `import synclane` and the workers
never pay for it. Where stdout or stderr is not a terminal (a pipe, a file, cron), tables are not
wrapped to a width, the bar is not drawn and log lines are plain text.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from synclane import event_lines
from synclane.events import WHOLE_LINE, Event

if TYPE_CHECKING:
    import pandas as pd

    from synclane.app import SyncLane

# Where output is not a terminal, lines are as long as they need to be (no wrapping to 80).
UNWRAPPED = 10_000
# The worker logs each job change as "job <id> owner=…: …" with every detail, and its report when
# it stops; the command line prints an event line for each change and the report in words, so
# those log lines are details for -v.
_DETAILS = re.compile(r"job \d+ owner=|worker \S+ stopped: \{")
_handler: logging.Handler | None = None  # the handler main() installed, replaced on a new run

events_log = logging.getLogger("synclane.events")


class Terminal:
    """stdout for results (tables, counts), stderr for logs, the bar and errors."""

    def __init__(self, verbosity: int = 0) -> None:
        self.verbosity = verbosity  # -1 quiet, 0 normal, 1 verbose
        self.out = _console(stderr=False)
        self.err = _console(stderr=True)

    @property
    def level(self) -> int:
        return {-1: logging.WARNING, 0: logging.INFO}.get(self.verbosity, logging.DEBUG)

    def setup_logging(self) -> None:
        """Log lines of synclane (and of libraries that warn) on stderr at the chosen level:
        a short line per event at INFO, details at DEBUG (-v), only problems with -q."""
        global _handler
        root = logging.getLogger()
        if _handler is not None:
            root.removeHandler(_handler)
        handler: logging.Handler
        if self.err.is_terminal:
            handler = _WrappingHandler(
                console=self.err,
                show_path=False,
                omit_repeated_times=False,
                log_time_format="%H:%M:%S",
                markup=False,
                rich_tracebacks=False,
            )
        else:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
            )
        handler.addFilter(_DetailsFilter(verbose=self.level <= logging.DEBUG))
        root.addHandler(handler)
        # What the command line tells (event lines, the demo's story) at the chosen level; the
        # library's own INFO lines repeat what the command prints on stdout: details for -v.
        library = logging.DEBUG if self.level <= logging.DEBUG else logging.WARNING
        logging.getLogger("synclane").setLevel(library)
        for told in (events_log.name, "synclane.demo"):
            logging.getLogger(told).setLevel(self.level)
        _handler = handler

    def close_logging(self) -> None:
        """Take the handler off again (the command ran in a process that goes on: a test)."""
        global _handler
        if _handler is not None:
            logging.getLogger().removeHandler(_handler)
            _handler = None
        for name in ("synclane", events_log.name, "synclane.demo"):
            logging.getLogger(name).setLevel(logging.NOTSET)

    @contextmanager
    def telling_the_change(self) -> Iterator[None]:
        """While a one-shot command makes a change it then prints (pause, resume), the library's
        own log line of that change would tell it a second time: a detail, shown with -v."""
        operations = logging.getLogger("synclane.operations")
        if self.level <= logging.DEBUG:
            yield
            return
        before = operations.level
        operations.setLevel(logging.ERROR)
        try:
            yield
        finally:
            operations.setLevel(before)

    def say(self, text: str) -> None:
        """One line of result on stdout, as it is (no markup, no highlighting)."""
        self.out.print(Text(text), soft_wrap=True)

    def table(self, frame: pd.DataFrame, columns: Sequence[Column], empty: str) -> None:
        """The frame's columns as a table that fits the terminal: long cells wrap, none is cut."""
        if frame.empty:
            self.say(empty)
            return
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, highlight=False)
        shown = [c for c in columns if c.name in frame.columns]
        for column in shown:
            table.add_column(
                column.header or column.name,
                justify=column.justify,
                no_wrap=column.no_wrap,
                overflow="fold",
            )
        for record in frame.to_dict("records"):
            row = {str(key): value for key, value in record.items()}
            table.add_row(*(column.render(row) for column in shown))
        self.out.print(table)

    @contextmanager
    def progress(
        self,
        count_open: Callable[[], tuple[int, int]],
        label: str,
        count_to_plan: Callable[[], int] | None = None,
    ) -> Iterator[JobsBar]:
        """A bar on stderr while work runs, when stderr is a terminal: done jobs of all, with
        the open and waiting ones (`count_open` reads both) once a second, and the history
        slices not planned yet (`count_to_plan`) as often as their cost allows; the ones that
        wait for a human are counted and named. Log lines print above it."""
        bar = JobsBar(count_open, count_to_plan)
        if not self.err.is_terminal:
            yield bar
            return
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("jobs done{task.fields[waiting]}"),
            RunningClock(),
            console=self.err,
            refresh_per_second=4,
            transient=False,
        ) as shown:
            task = shown.add_task(label, total=None, waiting="")
            stop = threading.Event()

            def refresh() -> None:
                while True:
                    done, total = bar.read()
                    shown.update(
                        task, completed=done, total=total or None, waiting=bar.waiting_text
                    )
                    if stop.wait(1.0):
                        return

            thread = threading.Thread(target=refresh, name="synclane-progress", daemon=True)
            thread.start()
            try:
                yield bar
            finally:
                stop.set()
                thread.join(timeout=5)
                done, total = bar.read()
                shown.update(task, completed=done, total=max(total, done), waiting=bar.waiting_text)


class RunningClock(TimeElapsedColumn):
    """The time since the bar started. Rich's own column stops the first time the count
    reaches the total, but a worker goes on: new jobs come (a refresh, a retry) and the total
    grows again, so this one runs until the bar ends."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed
        if elapsed is None:
            return Text("-:--:--", style="progress.elapsed")
        return Text(str(timedelta(seconds=int(elapsed))), style="progress.elapsed")


class JobsBar:
    """What the bar counts: jobs completed since the start (from events), and from the table
    the jobs still open, those waiting for a human (abandoned: in the total, never done until
    someone requeues them), and the history slices not planned yet (a history keeps only its
    newest slices as rows: they are jobs to come). That last count costs a lookup per owner and
    type: it is read again only after fifty times as long as its last read took (at least a
    second)."""

    def __init__(
        self,
        count_open: Callable[[], tuple[int, int]],
        count_to_plan: Callable[[], int] | None = None,
    ) -> None:
        self.count_open = count_open
        self.count_to_plan = count_to_plan
        self.completed = 0
        self._open = 0
        self.waiting = 0
        self.to_plan = 0
        self._to_plan_due = 0.0

    def __call__(self, event: Event) -> None:
        if event.kind == "completed":
            self.completed += 1

    def read(self) -> tuple[int, int]:
        """(done, total), the waiting ones and those to plan in the total."""
        with contextlib.suppress(Exception):  # a bar must never break the work it shows
            self._open, self.waiting = self.count_open()
        if self.count_to_plan is not None and time.monotonic() >= self._to_plan_due:
            began = time.monotonic()
            with contextlib.suppress(Exception):
                self.to_plan = self.count_to_plan()
            self._to_plan_due = time.monotonic() + max(1.0, 50 * (time.monotonic() - began))
        return self.completed, self.completed + self._open + self.waiting + self.to_plan

    @property
    def waiting_text(self) -> str:
        return f", {self.waiting} waiting for a human" if self.waiting else ""


class EventPrinter:
    """A worker listener: one short line per event, logged at the level the event deserves."""

    def __init__(self, app: SyncLane) -> None:
        self.attempts = {name: q.settings.max_attempts for name, q in app.queues.items()}

    def __call__(self, event: Event) -> None:
        level, text = event_lines.line(event, self.attempts.get(event.queue))
        events_log.log(level, "%s", text)


class _WrappingHandler(RichHandler):
    """Log lines fitted to the terminal's width, after their time and level; a command for the
    reader to copy (a record marked `WHOLE_LINE`) printed whole on a line of its own instead:
    wrapped, a copy of it would lose its end."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, WHOLE_LINE, False):
            try:
                self.console.print(Text(self.format(record)), soft_wrap=True)
            except Exception:
                self.handleError(record)
            return
        super().emit(record)


class _DetailsFilter(logging.Filter):
    """The worker's per-job lines are details (DEBUG) where event lines tell the same: shown
    with -v, left out otherwise."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        told = record.name in (events_log.name, "synclane.demo")
        if told or not record.name.startswith("synclane") or record.levelno > logging.WARNING:
            return True
        if not _DETAILS.match(record.getMessage()):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self.verbose


@dataclass(frozen=True)
class Column:
    """A column of a table: the frame's column, its header, how a cell reads."""

    name: str
    header: str = ""
    justify: Any = "left"
    no_wrap: bool = False
    show: Callable[[dict[str, Any]], str | Text] | None = None

    def render(self, record: dict[str, Any]) -> str | Text:
        if self.show is not None:
            return self.show(record)
        return Text(cell(record.get(self.name)))


def cell(value: Any) -> str:
    """A value as a table shows it: times in UTC to the second, durations in words, lists
    joined, nothing for missing values."""
    if value is None or _missing(value):
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, timedelta):
        return event_lines.duration_text(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if hasattr(value, "tolist") and not isinstance(value, str):  # a numpy array of ids
        return ", ".join(str(v) for v in value.tolist())
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _missing(value: Any) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or an array is not "missing"
        return False


def _console(*, stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    return Console(
        stderr=stderr,
        width=None if terminal else UNWRAPPED,
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=False,
    )


def timer() -> Callable[[], float]:
    """Seconds since this call, for "worker stopped after 12 s"."""
    began = time.monotonic()
    return lambda: time.monotonic() - began


# -- what a stopped worker did and left ------------------------------------------------------

_REPORTED = (
    ("completed", "completed"),
    ("failed", "failed attempts"),
    ("throttled", "throttles"),
    ("deferred", "deferred"),
    ("abandoned", "abandoned"),
    ("handed_back", "handed back"),
    ("lost", "leases lost"),
    ("reclaimed", "reclaimed"),
)


def report_text(report: dict[str, int]) -> str:
    """A worker's report in words: '7 completed, 8 failed attempts, 3 throttles'."""
    said = [f"{report[key]} {words}" for key, words in _REPORTED if report.get(key)]
    said += [f"{count} {key}" for key, count in sorted(report.items()) if key not in _WORDS]
    return ", ".join(said) or "no job ran"


_WORDS = {key for key, _ in _REPORTED}


def left_open(app: SyncLane, queues: Sequence[str]) -> list[str]:
    """One line per queue with jobs still open or waiting for a human, saying why each waits:
    a lane paused by a throttle until…, a retry at…, a deferred job's last attempt, an
    abandoned job's cause. Empty when nothing is left."""
    now = datetime.now(UTC)
    lines = []
    for queue in queues:
        depth = app.depth(queue)
        abandoned = app.failures(queue, status="abandoned")
        parts = []
        counts: dict[str, int] = {}
        if not depth.empty:
            counts = {
                str(k): int(v)
                for k, v in depth.groupby("status", observed=True)["jobs"].sum().items()
            }
        if counts.get("pending", 0):
            parts.append(f"{counts['pending']} pending{_pending_why(app, queue, depth, now)}")
        if counts.get("running", 0):
            parts.append(f"{counts['running']} running in another worker")
        if counts.get("failed", 0):
            failed = depth[depth["status"] == "failed"]
            retry = event_lines.when(_earliest(failed["next_run_at"]), now)
            parts.append(f"{counts['failed']} failed, the next retry {retry}")
        if counts.get("deferred", 0):
            parts.append(f"{counts['deferred']} deferred, one more attempt once its lane is idle")
        if not abandoned.empty:
            total = int(abandoned["abandoned"].sum())
            causes = "; ".join(
                f"cause {row['cause_id']}, e.g. {event_lines.short_error(str(row['example']))}"
                for row in abandoned.head(3).to_dict("records")
            )
            parts.append(f"{total} abandoned, waiting for a human ({causes})")
        if parts:
            lines.append(f"left in queue {queue}: " + "; ".join(parts))
    return lines


def _pending_why(app: SyncLane, queue: str, depth: pd.DataFrame, now: datetime) -> str:
    """Why pending jobs were not run: their lanes are paused, or they are due later."""
    lanes = app.lanes(queue)
    paused = lanes[lanes["paused_until"].notna()] if not lanes.empty else lanes
    if not paused.empty:
        first = paused.sort_values("paused_until").iloc[0]
        until = event_lines.when(first["paused_until"].to_pydatetime(), now, preposition=False)
        more = f" and {len(paused) - 1} more" if len(paused) > 1 else ""
        return f", lane {first['lane']}{more} paused by a throttle until {until}"
    pending = depth[depth["status"] == "pending"]
    due = _earliest(pending["next_run_at"])
    if due is not None and due > now:
        return f", due {event_lines.when(due, now)}"
    return ""


def _earliest(times: pd.Series) -> datetime | None:
    value = times.min()
    return None if _missing(value) else value.to_pydatetime()


# -- the tables ------------------------------------------------------------------------------


def _window(record: dict[str, Any]) -> str:
    start, end = record.get("window_start"), record.get("window_end")
    return event_lines.window_text(
        None if _missing(start) else start, None if _missing(end) else end
    )


def _coverage(record: dict[str, Any]) -> str:
    start, end = record.get("coverage_start"), record.get("coverage_end")
    return event_lines.window_text(
        None if _missing(start) else start, None if _missing(end) else end
    )


def _slices(record: dict[str, Any]) -> str:
    return f"{record['slices_completed']}/{record['slices_total']}"


def _cause(record: dict[str, Any]) -> Text:
    """The cause, whole, with an example error beside a masked one."""
    text = Text(cell(record.get("cause")))
    example = cell(record.get("example"))
    if example and example != text.plain:
        text.append(f"\ne.g. {example}", style="dim")
    return text


JOB_COLUMNS = (
    Column("id", justify="right", no_wrap=True),
    Column("owner"),
    Column("lane"),
    Column("type"),
    Column("mode"),
    Column("status", no_wrap=True),
    Column("window_start", "window", show=_window),
    Column("cursor"),
    Column("processed_count", "records", justify="right"),
    Column("attempt_count", "attempts", justify="right"),
    Column("next_run_at", "next run"),
    Column("error"),
)
PROGRESS_COLUMNS = (
    Column("owner"),
    Column("type"),
    Column("state", no_wrap=True),
    Column("percent", "%", justify="right"),
    Column("slices_total", "slices", justify="right", show=_slices),
    Column("slices_failed", "failed", justify="right"),
    Column("records", justify="right"),
    Column("coverage_end", "loaded span", show=_coverage),
    Column("eta", "eta", show=lambda r: "" if r.get("state") == "loaded" else cell(r.get("eta"))),
)
FAILURE_COLUMNS = (
    Column("cause_id", "cause id", no_wrap=True),
    Column("queue"),
    Column("type"),
    Column("jobs", justify="right"),
    Column("statuses"),
    Column("owners"),
    Column("last_seen", "last seen"),
    Column("cause", show=_cause),
)


def _seen(record: dict[str, Any]) -> str:
    seen = record.get("last_seen_at")
    if seen is None or _missing(seen):
        return ""
    return event_lines.duration_text(max(datetime.now(UTC) - seen, timedelta(0))) + " ago"


WORKER_COLUMNS = (
    Column("name", no_wrap=True),
    Column("state", no_wrap=True),
    Column("host"),
    Column("pid", justify="right"),
    Column("queues"),
    Column("busy", "busy", justify="right", show=lambda r: f"{r['busy']}/{r['slots']}"),
    Column("last_seen_at", "last seen", show=_seen),
    Column("started_at", "started"),
    Column("version"),
)


def workers_summary(frame: pd.DataFrame) -> str:
    """'2 running, 1 lost; 5 of 8 slots busy'."""
    states = frame["state"].value_counts()
    said = ", ".join(f"{int(states[state])} {state}" for state in states.index if states[state])
    running = frame[frame["state"] == "running"]
    slots = f"{int(running['busy'].sum())} of {int(running['slots'].sum())} slots busy"
    return f"{said}; {slots}" if len(running) else said
