"""Prometheus metrics (prometheus_client): what a worker did, and what the table holds.

    metrics = Metrics(app.database, queues=list(app.queues))
    server = metrics.serve(9108)              # Prometheus text on http://127.0.0.1:9108/metrics
    app.run_worker(on_event=metrics)          # counters and histograms from the worker's events

- **Counters and histograms** come from the events of the worker that `metrics` listens to (jobs
  finished, pages, records, throttles, lease losses, reclaims, hand-backs; page and job
  durations) and from its take statements (their latency).
- **Gauges** are read from the table (open jobs by status, due jobs and the oldest one's wait,
  throttled lanes, paused queues, workers and their busy slots): at most once every `refresh`
  seconds, however often Prometheus scrapes, and never when nobody does. Every worker reports the
  same table, so aggregate them with `max`.

`exposition()` returns the text and its content type, for a page that serves /metrics itself
(the dashboard's `metrics=True`: the table's gauges; it runs no worker, so its counters stay
empty). Only this module imports prometheus_client: `import synclane` and a worker that
does not ask for metrics never load it. docs/operations.md lists every metric with the alerts
worth setting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any
from wsgiref.simple_server import WSGIServer

import psycopg
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    make_wsgi_app,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from psycopg import sql

from synclane.connection import Database
from synclane.errors import error_text
from synclane.events import Event
from synclane.model import WORKER_STATES
from synclane.store import READ_STYLES

log = logging.getLogger("synclane")

REFRESH = 10.0  # seconds: the table is read at most this often
LANES_SHOWN = 50  # per queue: the throttled lanes with a series of their own
# What the gauge of open jobs counts: the open statuses, and the jobs waiting for a human.
COUNTED = ("pending", "running", "failed", "deferred", "abandoned")
FINISHED = ("completed", "failed", "deferred", "abandoned")  # how an attempt ended

TAKE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
JOB_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)


@dataclasses.dataclass
class _Attempt:
    """A job running in the listened worker: its records so far, and when its page began."""

    records: int
    page_began: datetime


@dataclasses.dataclass
class MetricsServer:
    """/metrics served from a thread of this process."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{name}]" if ":" in name else name
        return f"http://{shown}:{port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class Metrics:
    """A worker's counters and histograms, and the table's gauges, in one registry. Pass it to
    a worker as a listener (`on_event=metrics`); serve it with `serve(port)` or
    `exposition()`. `queues`: queues reported (as zeros) even before they hold a job."""

    def __init__(
        self,
        database: Database,
        queues: Sequence[str] = (),
        *,
        refresh: float = REFRESH,
        registry: CollectorRegistry | None = None,
        statement_timeout: float | None = None,
    ) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        job = ("queue", "type")

        def counter(name: str, text: str, labels: Sequence[str] = job) -> Counter:
            return Counter(name, text, labels, registry=self.registry)

        self.finished = counter(
            "synclane_jobs_finished",
            "Attempts ended by this worker, by outcome: completed, failed (retried later), "
            "deferred (attempts used up), abandoned (waits for a human)",
            (*job, "outcome"),
        )
        self.pages = counter("synclane_pages", "Pages handled (handler calls that returned Page)")
        self.records = counter("synclane_records", "Records the pages reported")
        self.throttles = counter("synclane_throttles", "Pages that raised Throttled")
        self.lease_losses = counter(
            "synclane_lease_losses", "Jobs this worker stopped: taken over or cancelled"
        )
        self.reclaims = counter(
            "synclane_reclaims", "Jobs of dead workers this worker put back in line"
        )
        self.handed_back = counter(
            "synclane_handed_back", "Jobs handed back with their cursor when the worker stopped"
        )
        self.take_seconds = Histogram(
            "synclane_take_seconds",
            "Take statements: from asking for a pooled connection to the answer",
            ["queue", "statement"],
            buckets=TAKE_BUCKETS,
            registry=self.registry,
        )
        self.page_seconds = Histogram(
            "synclane_page_seconds",
            "Pages, from the handler's call to the saved cursor (the last page: to the completion)",
            job,
            buckets=PAGE_BUCKETS,
            registry=self.registry,
        )
        self.job_seconds = Histogram(
            "synclane_job_seconds",
            "Completed attempts, from their first page to their completion",
            job,
            buckets=JOB_BUCKETS,
            registry=self.registry,
        )
        self.table = TableGauges(database, queues, refresh, statement_timeout)
        self.registry.register(self.table)
        self._attempts: dict[int, _Attempt] = {}

    # -- a worker's listener -----------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        job = (event.queue, event.type)
        kind = event.kind
        if kind == "started":
            self._attempts[event.job_id] = _Attempt(event.records, event.at)
        elif kind == "page":
            self.pages.labels(*job).inc()
            self.records.labels(*job).inc(event.records)
            if event.seconds is not None:
                self.page_seconds.labels(*job).observe(event.seconds)
            attempt = self._attempts.get(event.job_id)
            if attempt is not None:
                attempt.records += event.records
                attempt.page_began = event.at
        elif kind == "completed":
            # "completed" carries the job's records in all, and the attempt's seconds.
            self.pages.labels(*job).inc()
            attempt = self._attempts.pop(event.job_id, None)
            if attempt is not None:
                self.records.labels(*job).inc(max(event.records - attempt.records, 0))
                page = (event.at - attempt.page_began).total_seconds()
                self.page_seconds.labels(*job).observe(max(page, 0.0))
            if event.seconds is not None:
                self.job_seconds.labels(*job).observe(event.seconds)
            self.finished.labels(*job, "completed").inc()
        elif kind in FINISHED:
            self._attempts.pop(event.job_id, None)
            self.finished.labels(*job, kind).inc()
        elif kind == "throttled":
            self._attempts.pop(event.job_id, None)
            self.throttles.labels(*job).inc()
        elif kind == "handed_back":
            self._attempts.pop(event.job_id, None)
            self.handed_back.labels(*job).inc()
        elif kind == "lease_lost":
            self._attempts.pop(event.job_id, None)
            self.lease_losses.labels(*job).inc()
        elif kind == "reclaimed":
            self.reclaims.labels(*job).inc()

    def observe_take(self, queue: str, statement: str, seconds: float) -> None:
        """Told by the worker after each take statement ("front" or "by_lane")."""
        self.take_seconds.labels(queue, statement).observe(seconds)

    # -- serving -------------------------------------------------------------------------------

    def exposition(self) -> tuple[bytes, str]:
        """The Prometheus text and its content type, for a server of one's own."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def wsgi_app(self) -> Any:
        """A WSGI application that answers with the Prometheus text."""
        return make_wsgi_app(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve /metrics from a thread of this process; port 0 takes a free one (see .url).
        Raises OSError when the port cannot be had."""
        server, thread = start_http_server(port, host, registry=self.registry)
        return MetricsServer(server, thread)

    def close(self) -> None:
        self.table.close()


class TableGauges:
    """The gauges read from the table: a prometheus_client collector whose answer is kept for
    `refresh` seconds. A database it cannot read gives `synclane_table_up 0` and no other
    gauge, rather than old values. Its connection only reads, each statement under
    `statement_timeout` seconds when one is given."""

    def __init__(
        self,
        database: Database,
        queues: Sequence[str],
        refresh: float,
        statement_timeout: float | None = None,
    ) -> None:
        self.database = database
        self.queues = list(queues)
        self.refresh = refresh
        self.statement_timeout = statement_timeout
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._read_at = -math.inf
        self._families: list[Metric] = []
        self._failing = False

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh:
                self._families = self._read()
                self._read_at = time.monotonic()
            return list(self._families)

    def close(self) -> None:
        with self._lock:
            self._close_connection()

    def _read(self) -> list[Metric]:
        up = GaugeMetricFamily("synclane_table_up", "1 when the last read of the table worked")
        try:
            families = self._families_from(self._rows())
        except psycopg.Error as error:
            if not self._failing:
                log.warning("metrics cannot read the table: %s", error_text(error))
            self._failing = True
            with contextlib.suppress(Exception):
                self._close_connection()
            up.add_metric([], 0)
            return [up]
        if self._failing:
            log.info("metrics read the table again")
        self._failing = False
        up.add_metric([], 1)
        return [up, *families]

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _rows(self) -> dict[str, Any]:
        pooled = self.database.pooled
        if self._conn is None or self._conn.closed or self._conn.broken:
            label = f"synclane-metrics {self.database.schema}".encode()[:63].decode(errors="ignore")
            conn = self._conn = psycopg.connect(
                self.database.dsn,
                autocommit=True,
                connect_timeout=10,
                application_name=label,
                **self.database.connection_options,
            )
            conn.read_only = True
            if not pooled:
                conn.execute("SET default_transaction_read_only = on")
                for name, value in self._settings().items():
                    conn.execute(
                        sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
                    )
        conn = self._conn
        store = self.database.store

        def read(name: str, params: dict[str, Any] | None = None) -> list[Any]:
            if not pooled:
                return conn.execute(store.query(name), params).fetchall()
            # through a transaction pooler: the settings for this read's transaction only
            with conn.transaction():
                conn.execute(store.query("read_settings"), self._settings())
                return conn.execute(store.query(name), params).fetchall()

        found: dict[str, Any] = {
            "jobs": read("metrics_jobs"),
            "lanes": read("metrics_lanes", {"limit": LANES_SHOWN}),
            "workers": [],
            "paused": set(),
        }
        with contextlib.suppress(psycopg.errors.UndefinedTable):
            found["workers"] = read("workers", {"queue": None})
        with contextlib.suppress(psycopg.errors.UndefinedTable):
            found["paused"] = {row[0] for row in read("metrics_paused_queues")}
        return found

    def _settings(self) -> dict[str, str]:
        timeout = self.statement_timeout
        return {
            # 0: none, as PostgreSQL reads it
            "statement_timeout": "0" if timeout is None else str(max(1, round(timeout * 1000))),
            "jit": "off",  # short aggregates: compiling them costs more
            "work_mem": "16MB",
            **READ_STYLES,
        }

    def _families_from(self, found: dict[str, Any]) -> list[Metric]:
        queues = dict.fromkeys(self.queues)
        queues.update(dict.fromkeys(row[0] for row in found["jobs"]))
        queues.update(dict.fromkeys(row[0] for row in found["lanes"]))
        queues.update(dict.fromkeys(found["paused"]))

        open_jobs = GaugeMetricFamily(
            "synclane_open_jobs",
            "Jobs by queue and status: open (pending, running, failed, deferred) or waiting for "
            "a human (abandoned)",
            labels=["queue", "status"],
        )
        due = GaugeMetricFamily(
            "synclane_due_jobs",
            "Pending and failed jobs that are due now (some wait for their lane)",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "synclane_oldest_due_seconds",
            "How long the longest-waiting due job has been due (0: none is due)",
            labels=["queue"],
        )
        counts = {(row[0], row[1]): row for row in found["jobs"]}
        for queue in queues:
            due_now, waited = 0, 0.0
            for status in COUNTED:
                row = counts.get((queue, status))
                open_jobs.add_metric([queue, status], 0 if row is None else row[2])
                if row is not None:
                    due_now += row[3]
                    waited = max(waited, row[4] or 0.0)
            due.add_metric([queue], due_now)
            oldest.add_metric([queue], waited)

        paused_lanes = GaugeMetricFamily(
            "synclane_paused_lanes", "Lanes a throttle pauses now", labels=["queue"]
        )
        lane_paused = GaugeMetricFamily(
            "synclane_lane_paused_seconds",
            f"Seconds until a throttled lane may run again (the {LANES_SHOWN} paused furthest "
            "ahead per queue)",
            labels=["queue", "lane"],
        )
        paused_per_queue: dict[str, int] = {}
        for queue, lane, seconds, paused in found["lanes"]:
            paused_per_queue[queue] = paused
            lane_paused.add_metric([queue, lane], seconds)
        for queue in queues:
            paused_lanes.add_metric([queue], paused_per_queue.get(queue, 0))

        queue_paused = GaugeMetricFamily(
            "synclane_queue_paused", "1 while the queue is paused by hand", labels=["queue"]
        )
        for queue in queues:
            queue_paused.add_metric([queue], 1 if queue in found["paused"] else 0)

        return [
            open_jobs,
            due,
            oldest,
            paused_lanes,
            lane_paused,
            queue_paused,
            *self._worker_families(found["workers"]),
        ]

    def _worker_families(self, rows: list[tuple[Any, ...]]) -> list[Metric]:
        # The columns of the `workers` statement: ..., slots 5, busy 6, ..., last_seen_at 8,
        # state 9.
        workers = GaugeMetricFamily(
            "synclane_workers", "Worker processes in the list, by state", labels=["state"]
        )
        for state in WORKER_STATES:
            workers.add_metric([state], sum(1 for row in rows if row[9] == state))
        running = [row for row in rows if row[9] == "running"]
        slots = GaugeMetricFamily("synclane_slots", "Slots of the running workers")
        slots.add_metric([], sum(row[5] for row in running))
        busy = GaugeMetricFamily(
            "synclane_busy_slots", "Slots of the running workers that run a job (as last beaten)"
        )
        busy.add_metric([], sum(row[6] for row in running))
        seen = GaugeMetricFamily(
            "synclane_worker_last_seen_timestamp_seconds",
            "When a worker was last seen alive, as a Unix time (0: no worker in the list)",
        )
        seen.add_metric([], max((row[8].timestamp() for row in rows), default=0.0))
        return [workers, slots, busy, seen]
