"""Bad input (issue 8, docs/reliability.md): every invalid setting of the README's Configuration
table fails fast with a ConfigError that names it; hostile strings are stored and shown as they
are, or refused clearly, and never reach SQL as anything but a parameter; a hostile schema name
is an identifier.

(A schema made by a newer synclane is refused at start-up and at the first operation:
tests/test_table.py. Here: a worker with create_schema=False refuses it too.)
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from apps import done, products_queue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from workers import job_row

from synclane import ConfigError, Job, Owner, Page, SchemaError, SyncLane
from synclane.model import MAX_DURATION, MAX_NAME_LENGTH, MAX_SLICES
from synclane.testing import make_app, running_worker, wait_for

DAY = timedelta(days=1)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- the oracle: what the README's Configuration table allows ------------------------------


def as_duration(value: object) -> timedelta | None:
    """The duration a value means, or None when it is not one (the README's Configuration:
    a timedelta, or seconds as a number)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return None
    try:
        return timedelta(seconds=value)
    except OverflowError:
        return None


def duration_ok(value: object, *, allow_zero: bool = False) -> bool:
    duration = as_duration(value)
    if duration is None or duration > MAX_DURATION:
        return False
    return duration >= timedelta(0) if allow_zero else duration > timedelta(0)


def whole_ok(value: object, most: int) -> bool:
    """A whole number from 1 to `most`: what the setting's column or parameter holds."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most


def name_ok(value: object) -> bool:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        return False
    return "\x00" not in value and _encodes(value)


def schema_ok(value: object) -> bool:
    if not isinstance(value, str) or not value or "\x00" in value or not _encodes(value):
        return False
    return len(value.encode()) <= 63 and not value.startswith("pg_")


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- what hypothesis draws ---------------------------------------------------------------------

# Durations: numbers of every kind (NaN, infinities, huge, tiny, negative), timedeltas from the
# smallest to the largest, and things that are not durations at all.
durations = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e6, max_value=1e10),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.sampled_from([0, 0.0, -0.0, 1e-7, 1, 59.5, 3600, 2**63, 10**300, True, False]),
    st.timedeltas(),
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=400)),
    st.sampled_from([None, "60", "1 minute", b"60", [60], {"seconds": 60}, object()]),
)
wholes = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.sampled_from([0, 1, 2, True, False, 1.0, 1.5, "4", None, 2**70]),
    # the edges of what the columns hold: smallint, integer, bigint, and the slots of a process
    st.sampled_from([1000, 1001, 2**15 - 1, 2**15, 2**31 - 1, 2**31, 2**63 - 1, 2**63]),
)
texts = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=600),
    st.sampled_from(
        [
            "",
            "a\x00b",
            "\udc80",
            "'); DROP TABLE jobs; --",
            "🛒" * 20,
            "é" * 32,
            "x" * 63,
            "x" * 64,
            "pg_catalog",
            "pg_x",
            "x" * MAX_NAME_LENGTH,
            "x" * (MAX_NAME_LENGTH + 1),
        ]
    ),
    st.sampled_from([None, 5, b"bytes", ["list"], 1.5]),
)


def refused(call: Callable[[], object], *names: str) -> None:
    """The call raises ConfigError and its message names every one of `names`."""
    with pytest.raises(ConfigError) as raised:
        call()
    for name in names:
        assert name in str(raised.value), f"{name!r} not named in: {raised.value}"


def app_without_database(dsn: str, **settings: Any) -> SyncLane:
    """SyncLane(create_schema=False) touches no database until its first operation."""
    return SyncLane(dsn, create_schema=False, **settings)


# -- SyncLane(...) -----------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["poll_interval", "plan_interval", "owners_timeout"])
@PROPERTY
@given(value=durations)
def test_app_durations_are_accepted_or_refused_by_name(dsn: str, setting: str, value: Any) -> None:
    if duration_ok(value):
        app = app_without_database(dsn, **{setting: value})
        assert getattr(app, setting) == as_duration(value)
    else:
        refused(lambda: app_without_database(dsn, **{setting: value}), setting)


@PROPERTY
@given(value=texts)
def test_the_schema_name_is_accepted_or_refused_by_name(dsn: str, value: Any) -> None:
    if schema_ok(value):
        assert app_without_database(dsn, schema=value).schema == value
    else:
        refused(lambda: app_without_database(dsn, schema=value), "schema")


@PROPERTY
@given(value=texts)
def test_the_worker_name_is_accepted_or_refused_by_name(dsn: str, value: Any) -> None:
    if value in ("", None):
        return  # the default (host:pid)
    if name_ok(value):
        assert app_without_database(dsn, worker_name=value).worker_name == value
    else:
        refused(lambda: app_without_database(dsn, worker_name=value), "worker_name")


@pytest.mark.parametrize("value", ["no", "false", 0, 1, None, [], "True"])
def test_create_schema_must_be_a_bool(dsn: str, schema: str, value: Any) -> None:
    """`create_schema="false"` is truthy: it would create the schema it was meant to forbid."""
    refused(lambda: SyncLane(dsn, schema=schema, create_schema=value), "create_schema")


@pytest.mark.parametrize(
    "value",
    [
        5,
        b"postgresql://x",
        "",
        "   ",
        "not a dsn",
        "postgresql://u:pw@[::1/db",
        "host=h port",
        "host=h password='unclosed",
    ],
)
def test_a_dsn_libpq_cannot_read_is_refused_before_connecting(value: Any) -> None:
    refused(lambda: SyncLane(value, schema="never_created"), "dsn")


# -- app.queue(...) ----------------------------------------------------------------------------


QUEUE_DURATIONS = [
    "lease_duration",
    "retry_base_delay",
    "retry_max_delay",
    "throttle_base_delay",
    "throttle_max_delay",
]
DEFAULTS = {
    "lease_duration": timedelta(minutes=5),
    "retry_base_delay": timedelta(minutes=1),
    "retry_max_delay": timedelta(hours=1),
    "throttle_base_delay": timedelta(minutes=5),
    "throttle_max_delay": timedelta(minutes=30),
}
PAIRS = {
    "retry_base_delay": "retry_max_delay",
    "retry_max_delay": "retry_base_delay",
    "throttle_base_delay": "throttle_max_delay",
    "throttle_max_delay": "throttle_base_delay",
}


@pytest.mark.parametrize("setting", QUEUE_DURATIONS)
@PROPERTY
@given(value=durations)
def test_queue_durations_are_accepted_or_refused_by_name(
    dsn: str, setting: str, value: Any
) -> None:
    app = app_without_database(dsn)
    ok = duration_ok(value)
    if ok:
        chosen = {**DEFAULTS, setting: as_duration(value)}
        ok = chosen["retry_base_delay"] <= chosen["retry_max_delay"]
        ok = ok and chosen["throttle_base_delay"] <= chosen["throttle_max_delay"]
        ok = ok and chosen["lease_duration"] >= timedelta(seconds=1)
    if ok:
        queue = app.queue("shops", **{setting: value})
        assert getattr(queue.settings, setting) == as_duration(value)
    else:
        refused(lambda: app.queue("shops", **{setting: value}), setting, "'shops'")
        assert "shops" not in app.queues, "a refused queue was declared anyway"


# The most each count may be: what its column or parameter holds (integer; lane_slot is a
# smallint), and for concurrency, the slots one process runs of one queue.
QUEUE_COUNTS = {
    "concurrency": 1000,
    "max_attempts": 2**31 - 1,
    "lane_width": 2**15 - 1,
    "max_running": 2**31 - 1,
}


@pytest.mark.parametrize("setting", QUEUE_COUNTS)
@PROPERTY
@given(value=wholes)
def test_queue_counts_are_accepted_or_refused_by_name(dsn: str, setting: str, value: Any) -> None:
    app = app_without_database(dsn)
    no_cap = setting == "max_running" and value is None
    if whole_ok(value, QUEUE_COUNTS[setting]) or no_cap:
        assert getattr(app.queue("shops", **{setting: value}).settings, setting) == value
    else:
        refused(lambda: app.queue("shops", **{setting: value}), setting)
        assert "shops" not in app.queues, "a refused queue was declared anyway"


@PROPERTY
@given(value=texts)
def test_queue_and_type_names_are_accepted_or_refused(dsn: str, value: Any) -> None:
    app = app_without_database(dsn)
    if name_ok(value):
        queue = app.queue(value)
        queue.snapshot(value, every=DAY)(done)
        assert list(queue.types) == [value]
    else:
        refused(lambda: app.queue(value), "queue name")
        queue = app.queue("shops")
        refused(lambda: queue.snapshot(value, every=DAY), "type name")
        refused(lambda: queue.windowed(value, horizon=DAY, slice=DAY, every=DAY), "type name")


# -- @queue.windowed / @queue.snapshot ---------------------------------------------------------

WINDOWED = {"horizon": 30 * DAY, "slice": DAY, "every": timedelta(minutes=15), "overlap": 0}


@pytest.mark.parametrize("setting", ["horizon", "slice", "every", "overlap"])
@PROPERTY
@given(value=durations)
def test_windowed_settings_are_accepted_or_refused_by_name(
    dsn: str, setting: str, value: Any
) -> None:
    queue = app_without_database(dsn).queue("shops")
    values = {**WINDOWED, setting: value}
    ok = duration_ok(value, allow_zero=setting == "overlap")
    if ok:
        chosen = {k: as_duration(v) for k, v in values.items()}
        assert all(v is not None for v in chosen.values())
        horizon, slice_, every, overlap = (
            chosen[k] for k in ("horizon", "slice", "every", "overlap")
        )
        assert horizon and slice_ and every and overlap is not None
        ok = slice_ <= horizon and horizon / slice_ <= MAX_SLICES and overlap < every
    if ok:
        queue.windowed("orders", **values)(done)
        assert getattr(queue.types["orders"], setting) == as_duration(value)
    else:
        refused(lambda: queue.windowed("orders", **values), setting, "orders")
        assert "orders" not in queue.types


@PROPERTY
@given(value=durations)
def test_a_snapshot_period_is_accepted_or_refused_by_name(dsn: str, value: Any) -> None:
    queue = app_without_database(dsn).queue("shops")
    if duration_ok(value):
        queue.snapshot("products", every=value)(done)
    else:
        refused(lambda: queue.snapshot("products", every=value), "every", "products")


def test_history_that_would_make_planning_the_heavy_job_is_refused(dsn: str) -> None:
    """Two years in slices of a minute are a million jobs per owner: refused with the fix."""
    queue = app_without_database(dsn).queue("shops")
    refused(
        lambda: queue.windowed("orders", horizon=730 * DAY, slice=60, every=900),
        "horizon",
        "slice",
        "longer slice",
    )
    queue.windowed("orders", horizon=730 * DAY, slice=3600, every=900)  # 17,520 slices


def test_a_backfill_horizon_is_checked_like_the_declared_one(app: SyncLane) -> None:
    queue = app.queue("shops")
    queue.owners(lambda name: [Owner("acme")])
    queue.windowed("orders", horizon=30 * DAY, slice=3600, every=900)(done)
    refused(lambda: app.plan("shops", horizon=MAX_DURATION * 2), "horizon")
    refused(lambda: app.plan("shops", horizon=365 * 1000 * DAY), "horizon")
    refused(lambda: app.plan("shops", horizon=-DAY), "horizon")
    too_many = timedelta(hours=MAX_SLICES + 1)
    refused(lambda: app.plan("shops", horizon=too_many), "horizon", "slices", "shops.orders")
    # Accepted: its newest two slices (the older ones as those finish) and the refreshes since
    # midnight, in slices of an hour.
    assert app.plan("shops", horizon=60 * DAY)["shops"] >= 2 + 1
    assert list(app.jobs("shops")["mode"]).count("initial") == 2


# -- operation arguments -----------------------------------------------------------------------


@pytest.fixture
def shops(app: SyncLane) -> SyncLane:
    products_queue(app, owners=[Owner("acme")])
    return app


NAIVE = datetime(2026, 1, 1)
AWARE = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda a: a.enqueue("nope", "acme", "products"), ["'nope'"]),
        (lambda a: a.enqueue(None, "acme", "products"), ["queue"]),
        (lambda a: a.enqueue("shops", "acme", "nope"), ["'nope'"]),
        (lambda a: a.enqueue("shops", "", "products"), ["owner"]),
        (lambda a: a.enqueue("shops", 5, "products"), ["owner"]),
        (lambda a: a.enqueue("shops", "a\x00b", "products"), ["owner", "NUL"]),
        (lambda a: a.enqueue("shops", "a\udc80", "products"), ["owner", "surrogate"]),
        (lambda a: a.enqueue("shops", "x" * 513, "products"), ["owner", "512"]),
        (lambda a: a.enqueue("shops", "acme", "products", lane=""), ["lane"]),
        (lambda a: a.enqueue("shops", "acme", "products", lane=7), ["lane"]),
        (lambda a: a.enqueue("shops", "acme", "products", lane="\x00"), ["lane"]),
        (lambda a: a.enqueue("shops", "acme", "products", window_start=NAIVE), ["window_start"]),
        (lambda a: a.enqueue("shops", "acme", "products", window_end="2026"), ["window_end"]),
        (
            lambda a: a.enqueue("shops", "acme", "products", window_start=AWARE, window_end=AWARE),
            ["window_start", "window_end"],
        ),
        (lambda a: a.enqueue("shops", "acme", "products", dedup_key="initial"), ["dedup_key"]),
        (lambda a: a.enqueue("shops", "acme", "products", dedup_key="\x00"), ["dedup_key"]),
        (lambda a: a.requeue("shops", owner=5), ["owner"]),
        (lambda a: a.requeue("shops", owner="a\x00"), ["owner"]),
        (lambda a: a.requeue("shops", ids=["12"]), ["ids"]),
        (lambda a: a.requeue("shops", ids=12), ["ids"]),
        (lambda a: a.requeue("shops", ids=[2**64]), ["ids"]),
        (lambda a: a.requeue("shops", ids=[True]), ["ids"]),
        (lambda a: a.requeue("shops", cause="a\x00b"), ["cause"]),
        (lambda a: a.requeue("shops", cause=3), ["cause"]),
        (lambda a: a.requeue("shops", type="nope"), ["'nope'"]),
        (lambda a: a.cancel("shops", "acme", ""), ["reason"]),
        (lambda a: a.cancel("shops", "acme", None), ["reason"]),
        (lambda a: a.cancel("shops", None, "gone"), ["owner"]),
        (lambda a: a.plan("nope"), ["'nope'"]),
        (lambda a: a.plan(owner="acme"), ["queue"]),
        (lambda a: a.plan("shops", owner=5), ["owner"]),
        (lambda a: a.plan("shops", type="nope"), ["'nope'"]),
        (lambda a: a.plan("shops", horizon="2y"), ["horizon"]),
        (lambda a: a.run_worker(stop_after=-1), ["stop_after"]),
        (lambda a: a.run_worker(stop_after="soon"), ["stop_after"]),
        (lambda a: a.run_worker(queues=5), ["queues"]),
        (lambda a: a.run_worker(queues=["nope"]), ["'nope'"]),
    ],
)
def test_a_wrong_operation_argument_is_a_config_error_naming_it(
    shops: SyncLane, db: psycopg.Connection[Any], schema: str, call: Any, names: list[str]
) -> None:
    refused(lambda: call(shops), *names)
    count = db.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "jobs")))
    assert count.fetchone() == (0,), "a refused call wrote something"


def test_a_cancel_reason_keeps_what_text_can_hold(
    shops: SyncLane, db: psycopg.Connection[Any], schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """In the table and in the log line alike: a lone surrogate logged raw crashed the xdist
    worker whose report carried the captured line."""
    job_id = shops.enqueue("shops", "acme", "products")
    with caplog.at_level(logging.INFO, logger="synclane"):
        assert shops.cancel("shops", "acme", "gone \x00for good \udc80; DROP TABLE jobs; --") == 1
    kept = "gone for good \\udc80; DROP TABLE jobs; --"
    assert job_row(db, schema, job_id)["error"] == f"Cancelled: {kept}"
    assert [r.getMessage() for r in caplog.records if "cancelled" in r.getMessage()] == [
        f"cancelled 1 job(s) of acme in queue shops: {kept}"
    ]


# -- hostile strings ---------------------------------------------------------------------------

HOSTILE = [
    "o'brien",
    'say "hi"',
    "semi;colon",
    "'); DROP TABLE jobs; --",
    "Robert'); DROP TABLE students;--",
    "back\\slash \\x41 E'\\n'",
    "%s %(owner)s {schema} {0} $1 $$dollar$$",
    "naïve café Ünïcödé",
    "日本語のアカウント",
    "🛒🔥👨‍👩‍👧",
    "\u202eevil\u202c right-to-left",
    "tab\tnew\nline\rreturn",
    "<script>alert(1)</script>",
    "x" * MAX_NAME_LENGTH,
]


def test_hostile_strings_round_trip_through_planning_the_worker_and_the_frames(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """Owner ids, lanes, a type name, cursors and error texts full of quotes, semicolons,
    injections, placeholders, non-ASCII, emoji and control characters are stored and read back
    exactly: enqueue and the planner → jobs() → the worker (job.cursor) → the error →
    failures(). The table is still there afterwards."""
    hostile_type = "orders'; DROP TABLE jobs; --"
    queue = app.queue("shops", retry_base_delay=3600, retry_max_delay=3600, concurrency=4)
    owners = [Owner(text, lane=f"lane {text}"[:MAX_NAME_LENGTH]) for text in HOSTILE]
    queue.owners(lambda name: owners)
    seen: dict[str, list[str | None]] = {}
    big_cursor = "ç'\";" * 25_000  # 100,000 characters

    @queue.snapshot(hostile_type, every=DAY)
    def handle(job: Job) -> Page:
        seen.setdefault(job.owner, []).append(job.cursor)
        if job.cursor is None:
            return Page(job.owner, 1)  # the owner id as the cursor
        if job.cursor == job.owner:
            return Page(big_cursor, 1)
        raise RuntimeError(f"{job.owner} \x00 failed at a cursor of {len(job.cursor)}")

    assert app.plan() == {"shops": len(HOSTILE)}
    manual = app.enqueue("shops", HOSTILE[3], hostile_type, lane=HOSTILE[4], dedup_key=HOSTILE[5])
    assert app.enqueue("shops", HOSTILE[3], hostile_type, dedup_key=HOSTILE[5]) == manual

    with running_worker(app):
        wait_for(
            lambda: len(app.jobs(status="failed")) == len(HOSTILE) + 1, 30, "every job to fail"
        )

    assert set(seen) == set(HOSTILE)
    for owner, cursors in seen.items():
        expected = [None, owner, big_cursor] * (2 if owner == HOSTILE[3] else 1)
        assert sorted(cursors, key=str) == sorted(expected, key=str)
    jobs = app.jobs("shops", full_errors=True)
    assert set(jobs["owner"]) == set(HOSTILE)
    assert set(jobs["type"]) == {hostile_type}
    assert {o.lane for o in owners} | {HOSTILE[4]} == set(jobs["lane"])
    assert set(jobs["cursor"]) == {big_cursor}
    for row in jobs.itertuples():
        assert row.error == f"RuntimeError: {row.owner}  failed at a cursor of 100000"
    for text in HOSTILE:
        only = app.jobs("shops", owner=text)
        assert len(only) == (2 if text == HOSTILE[3] else 1)
        assert set(app.lanes("shops", lane=f"lane {text}"[:MAX_NAME_LENGTH])["lane"]) <= {
            f"lane {text}"[:MAX_NAME_LENGTH]
        }
    failures = app.failures("shops")
    assert failures["jobs"].sum() == len(HOSTILE) + 1
    assert {o for row in failures["owners"] for o in row} == set(HOSTILE)
    # Requeue by a hostile cause finds exactly its jobs.
    cause = failures.iloc[0]["cause"]
    assert app.requeue("shops", cause=cause) == failures.iloc[0]["jobs"]
    assert db.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "jobs"))
    ).fetchone() == (len(HOSTILE) + 1,)


def test_hostile_queue_names_work(app: SyncLane) -> None:
    for name in ["q'; DROP TABLE jobs; --", "🛒 queue", "q\nwith a line"]:
        products_queue(app, name, owners=[Owner(name)])
        assert app.plan(name) == {name: 1}
        assert list(app.jobs(name)["owner"]) == [name]
        assert app.cancel(name, name, "done") == 1


def test_error_texts_are_bounded_and_stored_without_what_text_cannot_hold(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", retry_base_delay=3600, retry_max_delay=3600)

    @queue.snapshot("noisy", every=DAY)
    def noisy(job: Job) -> Page:
        raise ValueError("\x00nul " + "🔥" * 100_000)

    job_id = app.enqueue("q", "acme", "noisy")
    with running_worker(app):
        wait_for(lambda: job_row(db, schema, job_id)["status"] == "failed", 10, "the failure")
    error = job_row(db, schema, job_id)["error"]
    assert error.startswith("ValueError: nul 🔥🔥") and error.endswith("…")
    assert len(error) == 2000


# -- hostile schema names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "x'); DROP SCHEMA public CASCADE; --",
        'quo"te',
        "🛒 shop",
        "UPPER case",
        "é" * 25,  # 50 bytes, 59 with the suffix below
    ],
)
def test_a_hostile_schema_name_is_an_identifier(
    dsn: str, db: psycopg.Connection[Any], name: str
) -> None:
    name = f"{name} {uuid.uuid4().hex[:8]}"
    lane = make_app(dsn, name)
    try:
        products_queue(lane, owners=[Owner("acme")])
        assert lane.plan() == {"shops": 1}
        assert lane.run_worker(until_idle=True, stop_after=10) == {"completed": 1}
        row = db.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", [name]).fetchone()
        assert row == (1,)
        assert db.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'public'"
        ).fetchone() == (1,)
    finally:
        lane.close()
        db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_a_schema_name_postgresql_would_cut_is_refused(dsn: str) -> None:
    """PostgreSQL cuts names at 63 bytes: two long names with one beginning would share a table.
    Counted in bytes, not characters."""
    refused(lambda: app_without_database(dsn, schema="é" * 32), "schema", "63 bytes")
    refused(lambda: app_without_database(dsn, schema="x" * 64), "schema", "63 bytes")


def test_a_schema_holding_someone_else_s_jobs_table_is_refused_clearly(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    db.execute(
        sql.SQL("CREATE TABLE {} (id int, title text)").format(sql.Identifier(schema, "jobs"))
    )
    with pytest.raises(SchemaError, match=r"holds a table synclane did not create \(jobs\)"):
        SyncLane(dsn, schema=schema)
    columns = db.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = %s", [schema]
    ).fetchone()
    assert columns == (2,), "someone else's table was changed"


def test_a_migration_on_a_read_only_connection_says_so_and_names_the_fix(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """A standby, or a role whose transactions are read-only by default: the error said the
    schema held tables synclane did not create, which sent people looking for a table."""
    read_only = psycopg.conninfo.make_conninfo(dsn, options="-c default_transaction_read_only=on")
    with pytest.raises(SchemaError) as raised:
        SyncLane(read_only, schema=schema)
    message = str(raised.value)
    assert "read-only" in message and "primary" in message, message
    assert "did not create" not in message, message
    assert (
        db.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", [schema]).fetchone()[0]
        == 0
    )


def test_a_migration_that_fails_for_another_reason_quotes_the_server(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """A failure that is not someone else's table is told as the server said it, with what
    became of the schema; not as a table of someone else's."""
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    db.execute(
        sql.SQL("CREATE FUNCTION {}() RETURNS int LANGUAGE sql AS 'SELECT 1'").format(
            sql.Identifier(schema, "validate_checks")
        )
    )
    with pytest.raises(SchemaError) as raised:
        SyncLane(dsn, schema=schema)
    message = str(raised.value)
    assert "cannot change return type of existing function" in message, message
    assert "did not create" not in message and "nothing was changed" in message, message
    tables = db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s", [schema]).fetchone()
    assert tables == (0,), "the failed migration left tables behind"


def test_a_worker_refuses_a_schema_made_by_a_newer_synclane(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """With create_schema=False nothing checked the version before the first operation; a worker
    took jobs from a newer schema. It now refuses before it takes any."""
    products_queue(app)
    job_id = app.enqueue("shops", "acme", "products")
    db.execute(
        sql.SQL("INSERT INTO {} (version) VALUES (99)").format(
            sql.Identifier(schema, "schema_version")
        )
    )
    older = SyncLane(dsn, schema=schema, create_schema=False)
    products_queue(older)
    try:
        with pytest.raises(SchemaError, match="newer synclane"):
            older.run_worker(stop_after=2)
    finally:
        older.close()
    assert job_row(db, schema, job_id)["status"] == "pending"


@pytest.mark.parametrize("hostile", ["a\x00b", "\ud800", 42])
@pytest.mark.parametrize("call", ["jobs", "failures", "depth", "coverage", "progress"])
def test_sdk_filters_refuse_what_text_cannot_hold(
    app: SyncLane, hostile: object, call: str
) -> None:
    products_queue(app)
    method = getattr(app, call)
    with pytest.raises(ConfigError, match="owner"):
        method("shops", owner=hostile)


def test_a_migration_cut_short_by_a_statement_timeout_names_the_setting(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """Managed PostgreSQL often gives application roles a `statement_timeout`; an upgrade that
    builds an index on a large jobs table, or waits for a busy one (here: a transaction holds
    it), runs longer. migrate() raised psycopg's bare `QueryCanceled: canceling statement due
    to statement timeout`, saying neither that nothing was changed nor how to run it without."""
    SyncLane(dsn, schema=schema).close()
    # as at version 7, before the index an upgrade builds
    db.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, "jobs_history")))
    versions = sql.Identifier(schema, "schema_version")
    db.execute(sql.SQL("DELETE FROM {}").format(versions))
    db.execute(sql.SQL("INSERT INTO {} (version) VALUES (7)").format(versions))
    hurried = psycopg.conninfo.make_conninfo(dsn, options="-c statement_timeout=500")
    with psycopg.connect(dsn) as holder:
        holder.execute(
            sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.Identifier(schema, "jobs"))
        )
        with pytest.raises(SchemaError) as raised:
            SyncLane(hurried, schema=schema)
    message = str(raised.value)
    assert "statement_timeout (500ms)" in message and "nothing was changed" in message, message
    assert "PGOPTIONS='-c statement_timeout=0' synclane migrate" in message, message
    assert db.execute(sql.SQL("SELECT max(version) FROM {}").format(versions)).fetchone() == (7,)
    SyncLane(dsn, schema=schema).close()  # as the message says: without the timeout
    index = db.execute("SELECT to_regclass(%s)", [f'"{schema}".jobs_history']).fetchone()
    assert index is not None and index[0] is not None
