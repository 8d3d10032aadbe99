"""The demo: four accounts of a pretend shop, synced by synclane on a fast clock.

`build_app()` returns a SyncLane with one queue, `shops`, whose handlers load orders and
products from the pretend shop (synclane.demo.shop) into a `demo` schema. What to watch is in
docs/demo.md; `synclane.demo.app:app` is the same app for the command line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from psycopg import sql

from synclane import Abandon, ConfigError, Job, Owner, Page, SyncLane, Throttled
from synclane.connection import creating_allowed
from synclane.demo import shop as shop_api
from synclane.demo import warehouse as warehouse_tables
from synclane.demo.shop import RowT, ShopPage, ShopThrottled, ShopUnknownAccount
from synclane.demo.warehouse import Connections, Warehouse

QUEUE = "shops"
MAX_ATTEMPTS = 5
HORIZON = timedelta(days=120)
# How long the shop takes to fix its broken record once it has refused the page for the last
# attempt, in seconds at speed 1: long enough to read "abandoned" on the page before the
# terminal says Requeue will now load it.
FIX_AFTER = 15.0

# acme-us and acme-eu share one API key, so they share a lane: never two requests at once.
OWNERS = (
    Owner("acme-us", lane="acme"),
    Owner("acme-eu", lane="acme"),
    Owner("globex"),
    Owner("initech"),
)


@dataclass
class Demo:
    """The app with the parts tests and tools look into: the shop and the warehouse."""

    app: SyncLane
    shop: shop_api.Shop
    warehouse: Warehouse
    connections: Connections
    data_schema: str

    def close(self) -> None:
        """Close the demo's connections and the app's."""
        self.connections.close()
        self.app.close()

    def reset(self) -> None:
        """Start the story again: forget the queue's jobs (and how far back their histories
        go), the loaded rows and the shop's memory (its access log and its healed fault)."""
        tables = ("orders", "products", "runs", "fetches", "faults")
        with self.app.connect() as conn, conn.transaction():
            conn.execute(
                sql.SQL("TRUNCATE {}").format(
                    sql.SQL(", ").join(sql.Identifier(self.data_schema, t) for t in tables)
                )
            )
            for table in ("jobs", "histories"):
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE queue = %s").format(
                        sql.Identifier(self.app.schema, table)
                    ),
                    (QUEUE,),
                )


def data_schema_for(schema: str) -> str:
    """Where the demo keeps its rows beside synclane's schema: `demo` beside `synclane`,
    `<schema>_demo` beside another."""
    return "demo" if schema == "synclane" else f"{schema}_demo"


def build_app(
    dsn: str | None = None,
    schema: str = "synclane",
    speed: float = 1.0,
    *,
    data_schema: str = "demo",
    record_runs: bool = False,
) -> SyncLane:
    """The demo app. `dsn=None`: $SYNCLANE_DSN, else the embedded PostgreSQL. `speed` scales
    every delay (0.1 plays the story ten times faster). `data_schema` holds the loaded rows and
    the shop's memory; `record_runs` also records every page's start and end in its `runs`."""
    return build_demo(dsn, schema, speed, data_schema=data_schema, record_runs=record_runs).app


def build_demo(
    dsn: str | None = None,
    schema: str = "synclane",
    speed: float = 1.0,
    *,
    data_schema: str = "demo",
    record_runs: bool = False,
    throttle_rate: float = 0.05,
    unavailable_rate: float = 0.05,
) -> Demo:
    """build_app, keeping hold of the shop, the warehouse and the demo's connections."""
    if not isinstance(speed, int | float) or not math.isfinite(speed) or speed <= 0:
        raise ConfigError(f"speed={speed!r} must be a number > 0; 1 is real time, 0.1 is 10x")
    for name, rate in (("throttle_rate", throttle_rate), ("unavailable_rate", unavailable_rate)):
        if not 0 <= rate <= 1:
            raise ConfigError(f"{name}={rate!r} must be a share between 0 and 1, e.g. 0.05")
    app = SyncLane(dsn, schema=schema, poll_interval=max(0.5 * speed, 0.05))
    # Delays a person can follow: retries after 2 s, 4 s, 8 s; the shop's answers take about a
    # second (synclane.demo.shop.ANSWER_TIME).
    shops = app.queue(
        QUEUE,
        concurrency=4,
        max_attempts=MAX_ATTEMPTS,
        lease_duration=max(20 * speed, 2.0),  # leases are renewed every third of this
        retry_base_delay=2 * speed,
        retry_max_delay=8 * speed,
        throttle_base_delay=4 * speed,
        throttle_max_delay=16 * speed,
    )
    connections = Connections(app.dsn)
    shop = shop_api.Shop(
        connections.connection,
        data_schema,
        speed=speed,
        throttle_rate=throttle_rate,
        unavailable_rate=unavailable_rate,
        # five regular attempts and the deferred one: the slice is abandoned, then fixed
        heals_after=MAX_ATTEMPTS + 1,
        fix_after=FIX_AFTER * speed,
    )
    warehouse = Warehouse(connections, data_schema, record_runs=record_runs)
    if creating_allowed():  # a read-only command (`jobs`, the page) creates nothing
        create_tables(app, data_schema)

    @shops.owners
    def connected(queue: str) -> list[Owner]:
        return list(OWNERS)

    @shops.snapshot("products", every=timedelta(days=1))
    def products(job: Job) -> Page:
        with warehouse.page(job):
            page = _ask(lambda: shop.products(job.owner, job.cursor))
            warehouse.upsert_products(job.owner, page.rows)
        return Page(page.next_cursor, len(page.rows))

    @shops.windowed(
        "orders",
        horizon=HORIZON,
        slice=shop_api.HISTORY_SLICE,
        every=timedelta(minutes=15),
        overlap=timedelta(minutes=5),
    )
    def orders(job: Job) -> Page:
        start, end = job.window_start, job.window_end
        if start is None or end is None:
            raise Abandon("an orders job needs a window: enqueue it with window_start/end")
        with warehouse.page(job):
            page = _ask(lambda: shop.orders(job.owner, start, end, job.cursor))
            warehouse.upsert_orders(job.owner, page.rows)
        return Page(page.next_cursor, len(page.rows))

    return Demo(app, shop, warehouse, connections, data_schema)


def _ask(call: Callable[[], ShopPage[RowT]]) -> ShopPage[RowT]:
    """Ask the shop, speaking synclane: a 429 pauses the lane without using up an attempt, an
    unknown account cannot be helped by retrying; any other error fails the job (and is
    retried from its cursor)."""
    try:
        return call()
    except ShopThrottled as slow:
        raise Throttled(retry_after=slow.retry_after, message=str(slow)) from slow
    except ShopUnknownAccount as gone:
        raise Abandon(str(gone)) from gone


def create_tables(app: SyncLane, data_schema: str = "demo") -> None:
    """The demo schema and its tables, created once however many processes start at once."""
    with app.connect() as conn, conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext('synclane demo ' || %s))", (data_schema,)
        )
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(data_schema)))
        warehouse_tables.create_tables(conn, data_schema)
        shop_api.create_tables(conn, data_schema)


__all__ = [
    "OWNERS",
    "QUEUE",
    "Demo",
    "build_app",
    "build_demo",
    "create_tables",
    "data_schema_for",
]
