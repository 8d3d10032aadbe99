"""What the page shows, read from the jobs table with the statements of sql/page.sql.

Every list is bounded (a page of rows and a total), so an answer costs the same at ten accounts
and at a hundred thousand. The reads run on a small pool of read-only connections of their own,
each statement under a timeout, and an answer is computed at most once per interval for every
viewer (`Views`). Rows become JSON values here, without pandas; every text that could quote the
database's connection string or password is masked on its way out.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from synclane.errors import SchemaError
from synclane.model import Rate
from synclane.store import READ_STYLES, Store

log = logging.getLogger("synclane.dashboard")

PAGE_SIZE = 50  # rows in every list of the page
WALK = 500  # the most accounts a search visits
OWNERS_SHOWN = 20  # owners and job ids listed per cause
ERROR_WIDTH = 2000  # characters of an error text sent to the page
# The table's rows are counted up to this many (a few milliseconds); PostgreSQL's estimate is
# shown above it (below, it is often 0 or unknown: a table the autovacuum has not analyzed yet)
COUNTED_ROWS = 10_000
# A failed job whose retry is further off than this waits for a human as much as a deferred one:
# the page offers Requeue for it. One due sooner retries by itself, and a throttled one waits for
# the other side.
FAR_RETRY = timedelta(minutes=5)
OPEN_STATUSES = ("running", "pending", "failed", "deferred", "abandoned")
STOPPED_STATUSES = ("failed", "deferred", "abandoned")
JOB_STATUSES = ("pending", "running", "completed", "failed", "deferred", "abandoned", "cancelled")
DATABASE_DOWN = "the database is not answering; the page keeps trying"


class Unavailable(Exception):
    """The database did not answer (or the schema is missing): a message safe to show."""


# -- masking ----------------------------------------------------------------------------------

_ASSIGNED_SECRET = re.compile(r"\b((?:ssl)?password)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.I)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s@/]*@", re.I)


class Mask:
    """Hides the connection string and its secrets in every text the page sends: the DSN as a
    whole, its password and sslpassword wherever they stand alone (anywhere, when 4 characters
    or longer), and any `password=...` or `user:password@` written in a text."""

    def __init__(self, dsn: str) -> None:
        self.texts = [dsn]
        self.words: list[re.Pattern[str]] = []
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.Error:
            params = {}
        for key in ("password", "sslpassword"):
            value = params.get(key)
            if not isinstance(value, str) or not value:
                continue
            if len(value) >= 4:
                self.texts.append(value)
            else:  # short: hidden where it stands alone, so ordinary words stay readable
                self.words.append(re.compile(rf"(?<![\w]){re.escape(value)}(?![\w])"))
        self.texts.sort(key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.texts:
            text = text.replace(secret, "***")
        for word in self.words:
            text = word.sub("***", text)
        text = _ASSIGNED_SECRET.sub(r"\1\2***", text)
        return _URL_PASSWORD.sub(r"\1***@", text)


def plain(value: Any, mask: Callable[[str], str]) -> Any:
    """A database value as a JSON value: ISO 8601 times, seconds for durations, masked text."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, float | Decimal):
        number = float(value)
        return number if number == number and abs(number) != float("inf") else None
    if isinstance(value, list | tuple):
        return [plain(item, mask) for item in value]
    return mask(str(value))


def records(rows: Iterable[Mapping[str, Any]], mask: Callable[[str], str]) -> list[dict[str, Any]]:
    return [{key: plain(value, mask) for key, value in row.items()} for row in rows]


# -- reading ----------------------------------------------------------------------------------


class Reader:
    """The page's reads for one app: each method runs statements of sql/page.sql on the pool
    and returns JSON-ready values. Raises Unavailable when the database does not answer."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        queues: Callable[[], list[str]],
        *,
        rates: Callable[[], Mapping[str, Rate]] = dict,
        statement_timeout: float = 5.0,
        pool_size: int = 4,
        pooled: bool = False,
    ) -> None:
        self.store = Store(schema)
        # through a transaction pooler no session is the page's: its settings go with each read
        self.pooled = pooled
        self.schema = self.store.schema
        self.queues = queues
        self.rates = rates  # the declared lane_rate of each queue that has one
        self.mask = Mask(dsn)
        self._dsn = dsn
        self._statement_timeout_ms = max(1, round(statement_timeout * 1000))
        self._pool_size = pool_size
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pool_lock = threading.Lock()

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def _settings(self) -> dict[str, str]:
        return {
            "statement_timeout": str(self._statement_timeout_ms),
            # Compiling a plan costs more than these statements take (see store.WORKER_SESSION).
            "jit": "off",
            # The counts hash and sort a few hundred thousand unfinished rows at most: in memory.
            "work_mem": "64MB",
            **READ_STYLES,
        }

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        if self.pooled:
            conn.read_only = True  # each read's transaction: BEGIN READ ONLY
            return
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute("SET default_transaction_read_only = on")
        for name, value in self._settings().items():
            conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))

    def _connections(self) -> ConnectionPool[psycopg.Connection[Any]]:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    self._dsn,
                    min_size=0,
                    max_size=self._pool_size,
                    timeout=5,
                    # Unprepared statements are planned with their values, so the optional
                    # filters (`%(x)s IS NULL OR ...`) fold away and indexes serve the rest.
                    kwargs={
                        "autocommit": True,
                        "connect_timeout": 5,
                        "prepare_threshold": None,
                        "application_name": "synclane-dashboard",
                        "client_encoding": "UTF8",  # as Database.connection_options
                    },
                    configure=self._configure,
                    name="synclane-dashboard",
                    open=True,
                )
            return self._pool

    def _rows(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        try:
            with (
                self._connections().connection() as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                if not self.pooled:
                    return cur.execute(self.store.query(name), params).fetchall()
                # through a transaction pooler: the settings for this read's transaction only
                with conn.transaction():
                    cur.execute(self.store.query("read_settings"), self._settings())
                    return cur.execute(self.store.query(name), params).fetchall()
        except psycopg.errors.UndefinedTable:
            raise Unavailable(self._no_schema()) from None
        except psycopg.errors.QueryCanceled:
            log.warning("dashboard: %s took longer than the statement timeout", name)
            raise Unavailable("the database took too long to answer; the page keeps trying") from (
                None
            )
        except (psycopg.Error, PoolTimeout, OSError) as error:
            log.warning("dashboard: cannot read the jobs: %s", type(error).__name__)
            raise Unavailable(DATABASE_DOWN) from None

    def _no_schema(self) -> str:
        return str(
            SchemaError(
                f"schema {self.schema!r} has no synclane table: run app.migrate() (or "
                "`synclane migrate`), or apply docs/schema.sql"
            )
        )

    # -- the parts of the page -------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Unfinished jobs per queue and status, each queue's pause (since when, by whom, why;
        None when it takes jobs), and the table's size: counted up to COUNTED_ROWS, PostgreSQL's
        estimate above."""
        (size,) = self._rows(
            "page_table_rows", {"schema": self.schema, "count_up_to": COUNTED_ROWS}
        )
        counted = size["counted"] < COUNTED_ROWS
        rows = size["counted"] if counted else max(size["estimate"] or 0, COUNTED_ROWS)
        by_queue: dict[str, dict[str, Any]] = {}
        for row in self._rows("page_summary", {}):
            entry = by_queue.setdefault(row["queue"], {"queue": row["queue"], "statuses": {}})
            entry["statuses"][row["status"]] = {"jobs": row["jobs"], "owners": row["owners"]}
        pauses = {row["queue"]: row for row in self._rows("paused_queues", {"queue": None})}
        for name in [*self.queues(), *pauses]:
            by_queue.setdefault(name, {"queue": name, "statuses": {}})
        queues = []
        for name, entry in sorted(by_queue.items()):
            pause = pauses.get(name)
            if pause is not None:
                pause = {
                    "paused_at": pause["paused_at"],
                    "paused_by": pause["paused_by"],
                    "reason": pause["pause_reason"],
                }
            queues.append(
                {
                    **entry,
                    "queue": self.mask(name),
                    "pause": None if pause is None else records([pause], self.mask)[0],
                }
            )
        return {"queues": queues, "table_rows": {"rows": rows, "counted": counted}}

    def accounts(self, search: str | None = None, page: int = 0) -> dict[str, Any]:
        """The accounts (owner and type) that need a look, worst first, with their first load;
        or, with `search`, every account whose owner starts with it."""
        params: dict[str, Any] = {
            "limit": PAGE_SIZE,
            "offset": page * PAGE_SIZE,
            "error_width": ERROR_WIDTH,
        }
        if search:
            params.update(search=search, queues=self.queues(), walk=WALK)
            rows = self._rows("page_search_accounts", params)
        else:
            rows = self._rows("page_accounts", params)
        total = rows[0]["total"] if rows else 0
        history = {}
        if rows:
            found = self._rows(
                "page_history",
                {
                    "queues": [row["queue"] for row in rows],
                    "owners": [row["owner"] for row in rows],
                    "types": [row["type"] for row in rows],
                },
            )
            history = {(h["queue"], h["owner"], h["type"]): h for h in found}
        shown = []
        for row in rows:
            first_load = history.get((row["queue"], row["owner"], row["type"]), {})
            shown.append({**_without(row, "total", "severity"), **_first_load(row, first_load)})
        return {
            "rows": records(shown, self.mask),
            "total": total,
            "page": page,
            "page_size": PAGE_SIZE,
            "search": search,
            "capped": bool(search) and total >= WALK,
        }

    def lanes(self, search: str | None = None, page: int = 0) -> dict[str, Any]:
        """The busiest lanes first; with `search`, the lanes whose name starts with it. Each
        with until when a throttle pauses it, and for a queue with `lane_rate` its rate and the
        page starts it has left now (`rate_count`, `rate_period`, `rate_left`)."""
        rates = self.rates()
        params = {
            "search": search or None,
            "limit": PAGE_SIZE,
            "offset": page * PAGE_SIZE,
            "rate_queues": list(rates),
            "rate_counts": [rate.count for rate in rates.values()],
            "rate_periods": [rate.per for rate in rates.values()],
        }
        rows = self._rows("page_lanes", params)
        return {
            "rows": records((_without(row, "total") for row in rows), self.mask),
            "total": rows[0]["total"] if rows else 0,
            "page": page,
            "page_size": PAGE_SIZE,
            "search": search,
        }

    def workers(self, page: int = 0) -> dict[str, Any]:
        """The worker processes of the list (what app.workers() shows), running first."""
        params = {"limit": PAGE_SIZE, "offset": page * PAGE_SIZE}
        rows = self._rows("page_workers", params)
        return {
            "rows": records((_without(row, "total") for row in rows), self.mask),
            "total": rows[0]["total"] if rows else 0,
            "page": page,
            "page_size": PAGE_SIZE,
        }

    def failures(self, search: str | None = None) -> dict[str, Any]:
        """Stopped jobs grouped by cause, most jobs first."""
        params = {
            "search": search or None,
            "limit": PAGE_SIZE,
            "far": FAR_RETRY,
            "owners_shown": OWNERS_SHOWN,
            "error_width": ERROR_WIDTH,
        }
        rows = self._rows("page_failures", params)
        return {
            "rows": records((_without(row, "total") for row in rows), self.mask),
            "total": rows[0]["total"] if rows else 0,
            "search": search,
        }

    def jobs(
        self,
        *,
        before: int | None = None,
        statuses: list[str] | None = None,
        queue: str | None = None,
        owner: str | None = None,
        lane: str | None = None,
        cause_id: str | None = None,
        limit: int = PAGE_SIZE,
    ) -> dict[str, Any]:
        """Jobs newest first, `limit` at most, below the id `before`."""
        unfinished = bool(statuses) and set(statuses or ()) <= set(OPEN_STATUSES)
        params = {
            "narrow": unfinished or owner is not None or lane is not None or cause_id is not None,
            "queues": self.queues(),
            "before": before,
            "statuses": statuses,
            "queue": queue,
            "owner": owner,
            "lane": lane,
            "cause_id": cause_id,
            "limit": limit,
            "far": FAR_RETRY,
            "error_width": ERROR_WIDTH,
        }
        rows = self._rows("page_jobs", params)
        more = len(rows) == limit
        return {
            "rows": records(rows, self.mask),
            "next_before": rows[-1]["id"] if more else None,
        }

    def state(self) -> dict[str, Any]:
        """The page's first view, the same for every viewer: the summary, the worst accounts,
        the busiest lanes, the workers, the causes, the running and stopped jobs however old
        (paged), and the newest jobs."""
        started = time.monotonic()
        # The parts are independent reads: each runs on a connection of its own, at once. The
        # first that fails fails the state at once; the others are not waited for.
        reads = ThreadPoolExecutor(self._pool_size, thread_name_prefix="dashboard-read")
        try:
            parts = {
                "summary": reads.submit(self.summary),
                "accounts": reads.submit(self.accounts),
                "lanes": reads.submit(self.lanes),
                "workers": reads.submit(self.workers),
                "failures": reads.submit(self.failures),
                "stopped": reads.submit(self.jobs, statuses=["running", *STOPPED_STATUSES]),
                "recent": reads.submit(self.jobs),
            }
            finished, _ = wait(parts.values(), return_when=FIRST_EXCEPTION)
            for part in finished:
                failure = part.exception()
                if failure is not None:
                    raise failure
            done = {name: part.result() for name, part in parts.items()}
        finally:
            reads.shutdown(wait=False, cancel_futures=True)
        stopped, recent = done["stopped"], done["recent"]
        by_id = {job["id"]: job for job in [*recent["rows"], *stopped["rows"]]}
        return {
            "now": datetime.now(UTC).isoformat(),
            "schema": self.mask(self.schema),
            "queues": [self.mask(name) for name in self.queues()],
            "requeue_statuses": list(STOPPED_STATUSES),
            "far_retry_seconds": FAR_RETRY.total_seconds(),
            "page_size": PAGE_SIZE,
            "summary": done["summary"],
            "accounts": done["accounts"],
            "lanes": done["lanes"],
            "workers": done["workers"],
            "failures": done["failures"],
            "jobs": [by_id[key] for key in sorted(by_id, reverse=True)],
            "stopped_before": stopped["next_before"],
            "seconds": round(time.monotonic() - started, 3),
        }


def _without(row: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key not in keys}


def _first_load(row: Mapping[str, Any], history: Mapping[str, Any]) -> dict[str, Any]:
    """What an account's jobs are doing, worst first (abandoned, failing, throttled), else how
    far its first load is (connecting, loading, loaded, cancelled: the states of progress())."""
    total = history.get("slices_total") or 0
    completed = history.get("slices_completed") or 0
    severity = row["severity"]
    state: str | None
    if severity == 0:
        state = "abandoned"
    elif severity == 1:
        state = "failing"
    elif severity == 2:
        state = "throttled"
    elif not total:
        state = None  # no history slices: manual jobs only
    elif completed == total:
        state = "loaded"
    elif row["history_open"] == 0 and not history.get("slices_unplanned"):
        state = "cancelled"
    elif completed == 0:
        state = "connecting"
    else:
        state = "loading"
    return {
        "state": state,
        "slices_total": total,
        "slices_completed": completed,
        "slices_failed": history.get("slices_failed") or 0,
        "percent": round(100.0 * completed / total, 1) if total else None,
        "records": history.get("records") or 0,
        "loaded_from": history.get("loaded_from"),
        "loaded_to": history.get("loaded_to"),
    }


# -- answers computed once per interval -------------------------------------------------------


class Views:
    """Answers kept for `interval` seconds and shared by every viewer: the first to ask after
    it expires computes it (once, however many ask at the same moment); the others get the
    previous answer meanwhile, or wait for the first one. A slow database widens the interval
    (to three times the last computation), so the page never keeps it busy. An answer that
    failed is kept for the interval, so a database that is down is asked once per interval."""

    def __init__(self, interval: float, size: int = 64) -> None:
        self.interval = interval
        self._size = size
        self._lock = threading.Condition()
        self._answers: OrderedDict[Any, _Answer] = OrderedDict()
        self._generation = 0  # forget() counts up: what was computed before is stale

    def forget(self) -> None:
        """Let every kept answer expire: the next look computes it again."""
        with self._lock:
            self._generation += 1
            for answer in self._answers.values():
                answer.expires = 0.0

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        """The answer for `key`; raises what `compute` raised when that is the kept answer."""
        with self._lock:
            answer = self._answers.get(key)
            if answer is None:
                answer = self._answers[key] = _Answer()
                while len(self._answers) > self._size:
                    self._answers.popitem(last=False)
            self._answers.move_to_end(key)
            now = time.monotonic()
            while True:
                if answer.ready and now < answer.expires:
                    return answer.result()
                if not answer.computing:
                    answer.computing = True
                    generation = self._generation
                    break
                if answer.ready:
                    return answer.result()  # the previous one, while the next is computed
                self._lock.wait(1.0)
                now = time.monotonic()
        started = time.monotonic()
        value: Any = None
        error: BaseException | None = None
        try:
            value = compute()
        except Unavailable as raised:
            error = raised
        finally:
            took = time.monotonic() - started
            with self._lock:
                answer.computing = False
                if error is not None or value is not None:
                    answer.ready = True
                    answer.value, answer.error = value, error
                    keep = self.interval if error is not None else max(self.interval, 3 * took)
                    answer.expires = time.monotonic() + keep
                    if generation != self._generation:
                        answer.expires = 0.0
                self._lock.notify_all()
        return answer.result()


class _Answer:
    def __init__(self) -> None:
        self.ready = False
        self.computing = False
        self.expires = 0.0
        self.value: Any = None
        self.error: BaseException | None = None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value
