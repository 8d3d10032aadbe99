"""Where the demo's handlers put what they load: the data team's tables in the demo schema.

Handlers write with upserts: a page is handled at least once, and a page that runs twice (a
crash between this write and synclane's cursor save) must not load its rows twice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from synclane import Job
from synclane.demo.shop import Order, Product


class Connections:
    """The demo's own connections, never the app's: a small pool, opened at first use.

    The worker runs each page of a plain-function handler in a fresh thread, so a connection
    per thread would be a new connection per page; the pool hands the same few around."""

    def __init__(self, dsn: str, max_size: int = 8) -> None:
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            kwargs={"autocommit": True, "application_name": "synclane-demo"},
            configure=_utc,
            open=False,
            name="synclane-demo",
        )
        self._opened = False
        self._lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self._lock:
            if not self._opened:
                self._pool.open(wait=False)
                self._opened = True
        with self._pool.connection() as conn:
            yield conn

    def close(self) -> None:
        with self._lock:
            if self._opened:
                self._pool.close()
                self._opened = False


def _utc(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET TIME ZONE 'UTC'")


class Warehouse:
    """The demo schema's `orders` and `products` (what was loaded) and, when `record_runs` is
    on, `runs`: every page a handler ran, with its start and end on the database clock."""

    def __init__(
        self, connections: Connections, data_schema: str = "demo", *, record_runs: bool = False
    ) -> None:
        self.connections = connections
        self.data_schema = data_schema
        self.record_runs = record_runs
        orders = sql.Identifier(data_schema, "orders")
        products = sql.Identifier(data_schema, "products")
        runs = sql.Identifier(data_schema, "runs")
        # one page of orders in one statement; a page loaded twice changes nothing
        self._upsert_orders = sql.SQL(
            "INSERT INTO {} AS o (owner, order_id, placed_at, amount)"
            " SELECT %(owner)s::text, r.* FROM unnest("
            "%(ids)s::text[], %(placed)s::timestamptz[], %(amounts)s::numeric[]) AS r"
            " ON CONFLICT (owner, order_id) DO UPDATE SET placed_at = excluded.placed_at,"
            " amount = excluded.amount, loaded_at = now()"
        ).format(orders)
        # one page of products in one statement; a page loaded twice changes nothing
        self._upsert_products = sql.SQL(
            "INSERT INTO {} AS p (owner, sku, name, price)"
            " SELECT %(owner)s::text, r.* FROM unnest("
            "%(skus)s::text[], %(names)s::text[], %(prices)s::numeric[]) AS r"
            " ON CONFLICT (owner, sku) DO UPDATE SET name = excluded.name,"
            " price = excluded.price, loaded_at = now()"
        ).format(products)
        # a page starts: clock_timestamp(), not now(), so runs of one instant stay ordered
        self._run_started = sql.SQL(
            "INSERT INTO {} (job_id, owner, lane, type, cursor, started_at)"
            " VALUES (%(job_id)s, %(owner)s, %(lane)s, %(type)s, %(cursor)s, clock_timestamp())"
            " RETURNING id"
        ).format(runs)
        # a page ends, with how: 'ok' or the exception's type
        self._run_ended = sql.SQL(
            "UPDATE {} SET ended_at = clock_timestamp(), outcome = %(outcome)s WHERE id = %(id)s"
        ).format(runs)

    def upsert_orders(self, owner: str, orders: Sequence[Order]) -> None:
        if not orders:
            return
        with self.connections.connection() as conn:
            conn.execute(
                self._upsert_orders,
                {
                    "owner": owner,
                    "ids": [o.order_id for o in orders],
                    "placed": [o.placed_at for o in orders],
                    "amounts": [o.amount for o in orders],
                },
            )

    def upsert_products(self, owner: str, products: Sequence[Product]) -> None:
        if not products:
            return
        with self.connections.connection() as conn:
            conn.execute(
                self._upsert_products,
                {
                    "owner": owner,
                    "skus": [p.sku for p in products],
                    "names": [p.name for p in products],
                    "prices": [p.price for p in products],
                },
            )

    @contextmanager
    def page(self, job: Job) -> Iterator[None]:
        """Around one page of a handler: records it in `runs` when record_runs is on."""
        if not self.record_runs:
            yield
            return
        with self.connections.connection() as conn:
            row = conn.execute(
                self._run_started,
                {
                    "job_id": job.id,
                    "owner": job.owner,
                    "lane": job.lane,
                    "type": job.type,
                    "cursor": job.cursor or "0",
                },
            ).fetchone()
        assert row is not None
        outcome = "ok"
        try:
            yield
        except BaseException as error:
            outcome = type(error).__name__
            raise
        finally:
            with self.connections.connection() as conn:
                conn.execute(self._run_ended, {"id": row[0], "outcome": outcome})


def create_tables(conn: psycopg.Connection[Any], data_schema: str) -> None:
    """The loaded data, and the record of runs (empty unless runs are recorded)."""
    schema = sql.Identifier(data_schema)
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.orders ("
            " owner text NOT NULL, order_id text NOT NULL, placed_at timestamptz NOT NULL,"
            " amount numeric(12, 2) NOT NULL, loaded_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (owner, order_id))"
        ).format(schema)
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.products ("
            " owner text NOT NULL, sku text NOT NULL, name text NOT NULL,"
            " price numeric(12, 2) NOT NULL, loaded_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (owner, sku))"
        ).format(schema)
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.runs ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id bigint NOT NULL,"
            " owner text NOT NULL, lane text NOT NULL, type text NOT NULL, cursor text NOT NULL,"
            " started_at timestamptz NOT NULL, ended_at timestamptz, outcome text)"
        ).format(schema)
    )
