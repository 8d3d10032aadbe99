"""A pretend shop API: the other company's side of the demo.

Its data is deterministic: the orders of an account on a day, and an account's products, come
from a random generator seeded with the account (and the day), so every run and every process
sees the same shop. Its behaviour is that of a real API on a bad day:

- every answer is slow (half a second to a second and a half, scaled by `speed`), so that a
  person can follow the story on the page;
- the first time a page is asked for, it may answer "429, slow down" (`ShopThrottled`, with a
  retry-after) or "503" (`ShopUnavailable`); asked again, it answers. Two such answers are
  scripted so that every run shows them (`SCRIPTED`); the others come by chance. At most
  `MAX_RANDOM_FAILURES` pages of one slice fail with a 503, fewer than a job's attempts, so no
  job runs out of attempts by bad luck;
- one page is broken on purpose: the page at cursor 50 of globex's second-newest 30-day slice
  of orders raises `ShopBrokenPage`. Once the shop has refused it `heals_after` times, someone
  at the shop starts fixing the record, which takes `fix_after` seconds; from then on the page
  answers (`Shop.fixed_at()` says when).

What the shop remembers lives in two tables of the demo schema, so that several worker processes
see one shop: `fetches` (every request with its cursor and outcome, the shop's access log) and
`faults` (how often the broken page was refused, and when it is fixed).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import sql

PAGE_SIZE = 50
HISTORY_SLICE = timedelta(days=30)  # the slice of the demo's `orders` type
BROKEN_OWNER = "globex"
BROKEN_CURSOR = PAGE_SIZE  # the second page of the broken slice
MAX_RANDOM_FAILURES = 2  # 503s per slice; below max_attempts, so luck never abandons a job
# How long an answer takes at speed 1, in seconds: slow enough to follow on the page.
ANSWER_TIME = (0.5, 1.5)
# Answers every run gives the first time the page is asked for, so that the story always shows
# a lane told to slow down and a retry from the cursor: (owner, history slice, cursor), the
# slice counted back from today (0 is the newest), and the answer.
SCRIPTED = {
    ("acme-eu", 0, 0): "throttled",
    ("acme-us", 0, PAGE_SIZE): "unavailable",
}
SCRIPTED_RETRY_AFTER = 3.0  # seconds at speed 1


@dataclass(frozen=True)
class Account:
    """One account of the shop: how busy it is and how big its catalogue."""

    code: str  # prefix of its order ids and SKUs
    orders_per_day: tuple[int, int]  # lowest and highest, inclusive
    products: int


ACCOUNTS = {
    "acme-us": Account("AUS", (3, 6), 64),
    "acme-eu": Account("AEU", (2, 5), 41),
    "globex": Account("GLX", (4, 8), 57),
    "initech": Account("INI", (1, 3), 23),
}

_ADJECTIVES = ("Blue", "Quiet", "Sturdy", "Tiny", "Golden", "Rapid", "Woolen", "Cedar", "Polar")
_NOUNS = ("Teapot", "Lamp", "Backpack", "Kettle", "Notebook", "Chair", "Scarf", "Mug", "Clock")


@dataclass(frozen=True)
class Order:
    order_id: str
    placed_at: datetime
    amount: Decimal


@dataclass(frozen=True)
class Product:
    sku: str
    name: str
    price: Decimal


RowT = TypeVar("RowT", Order, Product)


@dataclass(frozen=True)
class ShopPage(Generic[RowT]):
    """One answer of the shop: up to PAGE_SIZE rows and the cursor of the next page."""

    rows: list[RowT]
    next_cursor: str | None


class ShopError(Exception):
    """The shop answered with an error instead of a page."""


class ShopThrottled(ShopError):
    """HTTP 429: too many requests for this account; try again after `retry_after` seconds."""

    def __init__(self, retry_after: float, message: str) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class ShopUnavailable(ShopError):
    """HTTP 503: the shop had a hiccup; asking again later works."""


class ShopBrokenPage(ShopError):
    """HTTP 500 on one page, every time, until the shop fixes its data."""


class ShopUnknownAccount(ShopError):
    """HTTP 404: the shop has no such account; retrying cannot help."""


def account(owner: str) -> Account:
    try:
        return ACCOUNTS[owner]
    except KeyError:
        known = ", ".join(ACCOUNTS)
        raise ShopUnknownAccount(f"the shop has no account {owner!r} (it has {known})") from None


@lru_cache(maxsize=4096)
def orders_on(owner: str, day: date) -> tuple[Order, ...]:
    """An account's orders placed on one UTC day: the same on every call and in every process."""
    shop = account(owner)
    rng = random.Random(f"orders|{owner}|{day.isoformat()}")
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
    orders = [
        Order(
            order_id=f"{shop.code}-{day:%Y%m%d}-{number:02d}",
            placed_at=midnight + timedelta(seconds=rng.randrange(86_400)),
            amount=Decimal(rng.randint(500, 40_000)).scaleb(-2),
        )
        for number in range(1, rng.randint(*shop.orders_per_day) + 1)
    ]
    return tuple(sorted(orders, key=lambda o: (o.placed_at, o.order_id)))


def orders_between(owner: str, start: datetime, end: datetime) -> list[Order]:
    """An account's orders placed in [start, end), oldest first (the order pages are cut in)."""
    found: list[Order] = []
    day = start.astimezone(UTC).date()
    while datetime(day.year, day.month, day.day, tzinfo=UTC) < end:
        found += [o for o in orders_on(owner, day) if start <= o.placed_at < end]
        day += timedelta(days=1)
    return found


@lru_cache(maxsize=64)
def catalogue(owner: str) -> tuple[Product, ...]:
    """An account's products, the same on every call."""
    shop = account(owner)
    rng = random.Random(f"products|{owner}")
    return tuple(
        Product(
            sku=f"{shop.code}-{number:04d}",
            name=f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}",
            price=Decimal(rng.randint(199, 19_999)).scaleb(-2),
        )
        for number in range(1, shop.products + 1)
    )


def history_slice(start: datetime, end: datetime, now: datetime) -> int | None:
    """Which history slice a window is, counted back from today (0: the 30 days ending at
    today's midnight), or None for a refresh or a manual window. A slice planned before midnight
    counts as the same slice after it, so that a story running across midnight keeps its parts."""
    if end - start != HISTORY_SLICE:
        return None
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    for ended in (today, today - timedelta(days=1)):
        back, rest = divmod(ended - end, HISTORY_SLICE)
        if rest == timedelta(0) and back >= 0:
            return back
    return None


def is_broken_slice(owner: str, start: datetime, end: datetime, now: datetime) -> bool:
    """globex's second-newest history slice: 30 days ending 30 days before today's midnight."""
    return owner == BROKEN_OWNER and history_slice(start, end, now) == 1


Connect = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]


class Shop:
    """The shop's API. `connect` gives a connection for the shop's own memory (its access log
    and its fault counter); each call uses one and gives it back."""

    def __init__(
        self,
        connect: Connect,
        data_schema: str = "demo",
        *,
        speed: float = 1.0,
        throttle_rate: float = 0.05,
        unavailable_rate: float = 0.05,
        heals_after: int = 6,
        fix_after: float = 0.0,
    ) -> None:
        if heals_after < 1:
            raise ValueError(f"heals_after={heals_after!r} must be >= 1")
        if fix_after < 0:
            raise ValueError(f"fix_after={fix_after!r} must be >= 0 seconds")
        self.connect = connect
        self.speed = speed
        self.throttle_rate = throttle_rate
        self.unavailable_rate = unavailable_rate
        self.heals_after = heals_after
        self.fix_after = fix_after
        fetches = sql.Identifier(data_schema, "fetches")
        faults = sql.Identifier(data_schema, "faults")
        # what the shop already answered for one slice: this page's requests, the slice's 503s
        self._seen = sql.SQL(
            "SELECT count(*) FILTER (WHERE cursor = %(cursor)s),"
            " count(*) FILTER (WHERE outcome = 'unavailable')"
            " FROM {} WHERE owner = %(owner)s AND resource = %(resource)s"
            " AND window_start IS NOT DISTINCT FROM %(start)s"
            " AND window_end IS NOT DISTINCT FROM %(end)s"
        ).format(fetches)
        # one line of the access log, timed by the database clock every process shares
        self._log = sql.SQL(
            "INSERT INTO {} (owner, resource, window_start, window_end, cursor, outcome, rows)"
            " VALUES (%(owner)s, %(resource)s, %(start)s, %(end)s, %(cursor)s, %(outcome)s,"
            " %(rows)s)"
        ).format(fetches)
        # one more refusal of the broken page while it is not fixed; the heals_after-th refusal
        # sets when the fix is done. No row back means the page is fixed (atomic, so several
        # processes count one fault)
        self._refuse = sql.SQL(
            "INSERT INTO {} AS f (fault, failures, heals_after, fixed_at)"
            " VALUES (%(fault)s, 1, %(heals)s, CASE WHEN %(heals)s <= 1"
            "  THEN clock_timestamp() + make_interval(secs => %(fix)s) END)"
            " ON CONFLICT (fault) DO UPDATE SET failures = f.failures + 1,"
            "  fixed_at = coalesce(f.fixed_at, CASE WHEN f.failures + 1 >= f.heals_after"
            "   THEN clock_timestamp() + make_interval(secs => %(fix)s) END)"
            " WHERE f.fixed_at IS NULL OR f.fixed_at > clock_timestamp() RETURNING failures"
        ).format(faults)
        # when the broken page is (or will be) fixed; no row or NULL: not yet known
        self._fixed_at = sql.SQL("SELECT max(fixed_at) FROM {}").format(faults)

    def orders(
        self, owner: str, start: datetime, end: datetime, cursor: str | None
    ) -> ShopPage[Order]:
        """GET /orders?placed_from=start&placed_before=end&offset=cursor"""
        account(owner)
        offset = _offset(cursor)
        key = f"{owner} orders {start:%Y-%m-%d}..{end:%Y-%m-%d}"
        broken = is_broken_slice(owner, start, end, datetime.now(UTC))
        with self.connect() as conn:
            if broken and offset == BROKEN_CURSOR:
                row = conn.execute(
                    self._refuse,
                    {
                        "fault": f"{key} cursor {offset}",
                        "heals": self.heals_after,
                        "fix": self.fix_after,
                    },
                ).fetchone()
                if row is not None:
                    self._slow(owner, "orders", start, end, offset)
                    self._record(conn, owner, "orders", start, end, offset, "broken")
                    raise ShopBrokenPage(
                        f"{key}: the page at cursor {offset} is broken on the shop's side "
                        "(HTTP 500, a bad record)"
                    )
            # The broken slice answers its first pages reliably: its story is the broken page.
            shaky = not (broken and offset <= BROKEN_CURSOR)
            return self._answer(
                conn, owner, "orders", start, end, offset, shaky, orders_between(owner, start, end)
            )

    def fixed_at(self) -> datetime | None:
        """When the shop has fixed (or will have fixed) its broken record, on the database
        clock; None while it has not started fixing it."""
        with self.connect() as conn:
            row = conn.execute(self._fixed_at).fetchone()
        return None if row is None else row[0]

    def products(self, owner: str, cursor: str | None) -> ShopPage[Product]:
        """GET /products?offset=cursor"""
        account(owner)
        offset = _offset(cursor)
        with self.connect() as conn:
            return self._answer(conn, owner, "products", None, None, offset, True, catalogue(owner))

    def _answer(
        self,
        conn: psycopg.Connection[Any],
        owner: str,
        resource: str,
        start: datetime | None,
        end: datetime | None,
        offset: int,
        shaky: bool,
        rows: Sequence[RowT],
    ) -> ShopPage[RowT]:
        draw = self._slow(owner, resource, start, end, offset)
        scripted = None
        if resource == "orders" and start is not None and end is not None:
            number = history_slice(start, end, datetime.now(UTC))
            scripted = SCRIPTED.get((owner, -1 if number is None else number, offset))
        if scripted == "throttled":
            draw = 0.0
        elif scripted == "unavailable":
            draw = self.throttle_rate
        if shaky and (scripted or draw < self.throttle_rate + self.unavailable_rate):
            params = {"owner": owner, "resource": resource, "start": start, "end": end}
            row = conn.execute(self._seen, {**params, "cursor": str(offset)}).fetchone()
            asked, unavailable = row if row is not None else (0, 0)
            if asked == 0 and (scripted == "throttled" or draw < self.throttle_rate):
                seconds = (
                    SCRIPTED_RETRY_AFTER
                    if scripted
                    else 2.0 + 4 * draw / self.throttle_rate  # 2 to 6 s
                )
                retry_after = round(seconds * self.speed, 3)
                self._record(conn, owner, resource, start, end, offset, "throttled")
                raise ShopThrottled(
                    retry_after, f"429 Too Many Requests for {owner}: retry after {retry_after} s"
                )
            if asked == 0 and unavailable < MAX_RANDOM_FAILURES:
                self._record(conn, owner, resource, start, end, offset, "unavailable")
                raise ShopUnavailable(f"503 Service Unavailable ({resource} of {owner})")
        page = list(rows[offset : offset + PAGE_SIZE])
        self._record(conn, owner, resource, start, end, offset, "ok", len(page))
        following = offset + PAGE_SIZE
        return ShopPage(page, str(following) if following < len(rows) else None)

    def _slow(
        self, owner: str, resource: str, start: datetime | None, end: datetime | None, offset: int
    ) -> float:
        """Sleep like a slow API; return this page's draw in [0, 1) for its first answer (the
        same draw on every run, so a story replays the same way on the same day)."""
        window = f"{start.isoformat()}..{end.isoformat()}" if start and end else "-"
        rng = random.Random(f"{owner}|{resource}|{window}|{offset}")
        draw = rng.random()
        time.sleep(rng.uniform(*ANSWER_TIME) * self.speed)
        return draw

    def _record(
        self,
        conn: psycopg.Connection[Any],
        owner: str,
        resource: str,
        start: datetime | None,
        end: datetime | None,
        offset: int,
        outcome: str,
        rows: int = 0,
    ) -> None:
        conn.execute(
            self._log,
            {
                "owner": owner,
                "resource": resource,
                "start": start,
                "end": end,
                "cursor": str(offset),
                "outcome": outcome,
                "rows": rows,
            },
        )


def _offset(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not cursor.isdigit():
        raise ShopError(f"400 Bad Request: cursor {cursor!r} is not an offset")
    return int(cursor)


def create_tables(conn: psycopg.Connection[Any], data_schema: str) -> None:
    """The shop's own memory: its access log and its fault counter."""
    schema = sql.Identifier(data_schema)
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.fetches ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " owner text NOT NULL, resource text NOT NULL,"
            " window_start timestamptz, window_end timestamptz,"
            " cursor text NOT NULL, outcome text NOT NULL, rows integer NOT NULL DEFAULT 0,"
            " fetched_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(schema)
    )
    conn.execute(
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS fetches_page ON {}.fetches (owner, resource, cursor)"
        ).format(schema)
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.faults ("
            " fault text PRIMARY KEY, failures integer NOT NULL, heals_after integer NOT NULL,"
            " fixed_at timestamptz)"
        ).format(schema)
    )
    # a data folder from a release before the shop took time to fix its record
    conn.execute(
        sql.SQL("ALTER TABLE {}.faults ADD COLUMN IF NOT EXISTS fixed_at timestamptz").format(
            schema
        )
    )
