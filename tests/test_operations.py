"""The operations on jobs (the README's Operations table; docs/sdk.md for jobs and progress):
enqueue, requeue, cancel, jobs, progress, and the configuration errors that fail at declaration."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pandas as pd
import psycopg
import pytest
from apps import ACCOUNTS, done, orders_and_products
from psycopg import sql
from psycopg.rows import dict_row
from workers import arrange, database_now, job_row

from synclane import ConfigError, SyncLane

DAY = timedelta(days=1)
STATUSES = ["pending", "running", "completed", "failed", "deferred", "abandoned", "cancelled"]
TIMESTAMPS = [
    "window_start",
    "window_end",
    "next_run_at",
    "lease_expires_at",
    "created_at",
    "started_at",
    "heartbeat_at",
    "completed_at",
]


@pytest.fixture
def shops(app: SyncLane) -> SyncLane:
    """The app with queue 'shops': orders (windowed, 120 days in four slices), then products."""
    orders_and_products(app, ACCOUNTS, horizon=120 * DAY, overlap=timedelta(minutes=5))
    return app


def jobs_table(schema: str) -> sql.Composed:
    return sql.SQL("{}.jobs").format(sql.Identifier(schema))


def count(db: psycopg.Connection, schema: str) -> int:
    row = db.execute(sql.SQL("SELECT count(*) FROM {}").format(jobs_table(schema))).fetchone()
    assert row is not None
    return int(row[0])


def one_job_per_status(
    app: SyncLane, db: psycopg.Connection, schema: str, owner: str = "acme-us"
) -> dict[str, int]:
    """Seven manual jobs of one owner, one in each status, each with a cursor and used attempts.
    Only one is running, so the lane index allows it."""
    ids: dict[str, int] = {}
    for status in STATUSES:
        job_id = app.enqueue("shops", owner, "orders", dedup_key=f"manual:{status}")
        running = status == "running"
        arrange(
            db,
            schema,
            job_id,
            status=status,
            cursor="page-3",
            processed_count=300,
            attempt_count=4,
            throttle_count=2,
            error=None if status in ("pending", "running", "completed") else "HTTPError: 503",
            next_run_at=database_now(db) + timedelta(hours=1),
            lease_token=uuid.uuid4() if running else None,
            leased_by="host:1" if running else None,
        )
        ids[status] = job_id
    return ids


# -- enqueue --------------------------------------------------------------------------------------


def test_enqueue_adds_a_manual_job_in_the_owners_lane(shops, db, schema):
    start = datetime(2024, 3, 1, tzinfo=UTC)
    end = datetime(2024, 3, 2, tzinfo=UTC)

    job_id = shops.enqueue("shops", "acme-eu", "orders", window_start=start, window_end=end)

    row = job_row(db, schema, job_id)
    assert (row["queue"], row["owner"], row["type"]) == ("shops", "acme-eu", "orders")
    assert row["lane"] == "acme", "the lane comes from the owner source"
    assert (row["mode"], row["status"], row["attempt_count"]) == ("manual", "pending", 0)
    assert (row["window_start"], row["window_end"]) == (start, end)
    assert row["next_run_at"] <= database_now(db)


def test_enqueue_uses_the_lane_given(shops, db, schema):
    job_id = shops.enqueue("shops", "acme-eu", "products", lane="special")

    row = job_row(db, schema, job_id)
    assert (row["lane"], row["priority"]) == ("special", 1)


def test_enqueue_without_a_dedup_key_adds_a_job_every_call(shops, db, schema):
    ids = {shops.enqueue("shops", "globex", "products") for _ in range(3)}

    assert len(ids) == 3
    assert count(db, schema) == 3


def test_enqueue_with_a_dedup_key_returns_the_same_job(shops, db, schema):
    first = shops.enqueue("shops", "globex", "products", dedup_key="manual:fix-42")
    second = shops.enqueue("shops", "globex", "products", dedup_key="manual:fix-42")
    other_owner = shops.enqueue("shops", "acme-us", "products", dedup_key="manual:fix-42")

    assert second == first
    assert other_owner != first
    assert count(db, schema) == 2


@pytest.mark.parametrize("setting", ["window_start", "window_end"])
def test_enqueue_refuses_naive_datetimes(shops, db, schema, setting):
    aware = {
        "window_start": datetime(2024, 3, 1, tzinfo=UTC),
        "window_end": datetime(2024, 3, 2, tzinfo=UTC),
    }
    aware[setting] = aware[setting].replace(tzinfo=None)

    with pytest.raises(ConfigError, match=rf"{setting}.*time zone"):
        shops.enqueue("shops", "globex", "orders", **aware)
    assert count(db, schema) == 0


@pytest.mark.parametrize("key", ["initial:2024-01-01T00:00:00Z", "initial", "recurring:x"])
def test_enqueue_refuses_dedup_keys_reserved_for_the_planner(shops, db, schema, key):
    with pytest.raises(ConfigError, match="dedup_key"):
        shops.enqueue("shops", "globex", "orders", dedup_key=key)
    assert count(db, schema) == 0


def test_enqueue_of_an_unknown_queue_or_type_is_a_config_error(shops, db, schema):
    with pytest.raises(ConfigError, match="'nope'"):
        shops.enqueue("nope", "globex", "orders")
    with pytest.raises(ConfigError, match="'nope'"):
        shops.enqueue("shops", "globex", "nope")
    assert count(db, schema) == 0


# -- requeue --------------------------------------------------------------------------------------


def test_requeue_gives_stopped_jobs_fresh_attempts_and_keeps_their_cursor(shops, db, schema):
    ids = one_job_per_status(shops, db, schema)
    before = {status: job_row(db, schema, job_id) for status, job_id in ids.items()}

    assert shops.requeue("shops") == 3

    now = database_now(db)
    for status in ("failed", "deferred", "abandoned"):
        row = job_row(db, schema, ids[status])
        assert row["status"] == "pending"
        assert row["attempt_count"] == 0
        assert (row["cursor"], row["processed_count"]) == ("page-3", 300)
        assert row["next_run_at"] <= now, "a fresh attempt is due now"
    for status in ("pending", "running", "completed", "cancelled"):
        assert job_row(db, schema, ids[status]) == before[status]


def test_requeue_revives_cancelled_jobs_only_when_asked(shops, db, schema):
    ids = one_job_per_status(shops, db, schema)

    shops.requeue("shops")
    assert job_row(db, schema, ids["cancelled"])["status"] == "cancelled"

    assert shops.requeue("shops", include_cancelled=True) == 1
    row = job_row(db, schema, ids["cancelled"])
    assert (row["status"], row["attempt_count"], row["cursor"]) == ("pending", 0, "page-3")


def test_requeue_filters_by_owner_and_type(shops, db, schema):
    failed: dict[tuple[str, str], int] = {}
    for owner in ("acme-us", "globex"):
        for type in ("orders", "products"):
            job_id = shops.enqueue("shops", owner, type)
            arrange(db, schema, job_id, status="failed", attempt_count=2)
            failed[owner, type] = job_id

    def pending() -> set[tuple[str, str]]:
        return {
            key
            for key, job_id in failed.items()
            if job_row(db, schema, job_id)["status"] == "pending"
        }

    assert shops.requeue("shops", owner="globex") == 2
    assert pending() == {("globex", "orders"), ("globex", "products")}
    assert shops.requeue("shops", type="products") == 1
    assert pending() == {("globex", "orders"), ("globex", "products"), ("acme-us", "products")}
    assert shops.requeue("shops", owner="acme-us", type="orders") == 1
    assert shops.requeue("shops") == 0


# -- cancel ---------------------------------------------------------------------------------------


def test_cancel_stops_what_has_not_finished_and_leaves_completed_jobs(shops, db, schema):
    ids = one_job_per_status(shops, db, schema)
    other_owner = shops.enqueue("shops", "globex", "orders")
    completed = job_row(db, schema, ids["completed"])

    assert shops.cancel("shops", "acme-us", "disconnected") == 4

    for status in ("pending", "failed", "deferred", "running"):
        row = job_row(db, schema, ids[status])
        assert (row["status"], row["error"]) == ("cancelled", "Cancelled: disconnected")
    assert job_row(db, schema, ids["completed"]) == completed
    assert job_row(db, schema, other_owner)["status"] == "pending"


def test_a_cancelled_running_job_can_no_longer_save_a_page(shops, db, schema):
    job_id = shops.enqueue("shops", "acme-us", "orders")
    token = uuid.uuid4()
    arrange(db, schema, job_id, status="running", lease_token=token, leased_by="host:1")
    save_pages = shops.store.query("save_pages")

    saved: list[str | None] = [None]

    def save(cursor: str) -> int:
        params = {"queue": "shops", "lease": timedelta(minutes=5), "ids": [job_id]}
        params |= {"tokens": [token], "expected": [saved[-1]], "cursors": [cursor], "counts": [10]}
        params |= {"counted": [10 * (len(saved) - 1)]}
        row = db.execute(save_pages, params).fetchone()
        if row and row[0]:
            saved.append(cursor)
        return int(bool(row and row[0]))

    assert save("page-2") == 1, "the worker holding the lease saves its page"
    assert shops.cancel("shops", "acme-us", "disconnected") == 1
    assert save("page-3") == 0, "the cancelled job's worker is fenced off"

    row = job_row(db, schema, job_id)
    assert (row["status"], row["cursor"], row["processed_count"]) == ("cancelled", "page-2", 10)


# -- jobs() ---------------------------------------------------------------------------------------


def assert_typed(frame: pd.DataFrame) -> None:
    for column in TIMESTAMPS:
        dtype = frame[column].dtype
        assert isinstance(dtype, pd.DatetimeTZDtype), (column, dtype)
        assert str(dtype.tz) == "UTC", (column, dtype)
    assert isinstance(frame["status"].dtype, pd.CategoricalDtype)
    assert list(frame["status"].cat.categories) == STATUSES
    for column in ("processed_count", "attempt_count", "throttle_count"):
        assert frame[column].dtype == "Int64", (column, frame[column].dtype)


def test_jobs_is_a_frame_with_utc_timestamps_categorical_status_and_int64_counts(shops, db, schema):
    shops.plan()
    job_id = shops.enqueue("shops", "globex", "products")
    arrange(db, schema, job_id, processed_count=12, started_at=database_now(db))
    row = job_row(db, schema, job_id)

    frame = shops.jobs()

    assert_typed(frame)
    assert len(frame) == count(db, schema)
    mine = frame.set_index("id").loc[job_id]
    assert mine["created_at"] == pd.Timestamp(row["created_at"])
    assert mine["started_at"] == pd.Timestamp(row["started_at"])
    assert pd.isna(mine["completed_at"])
    assert mine["processed_count"] == 12


def test_an_empty_jobs_frame_has_the_same_types(shops):
    frame = shops.jobs("shops", owner="nobody")

    assert frame.empty
    assert_typed(frame)


def test_jobs_filters_by_queue_owner_status_and_type_and_limits(shops, db, schema):
    other = shops.queue("other")
    other.owners(lambda name: ACCOUNTS)
    other.snapshot("invoices", every=DAY)(done)
    shops.plan()
    failed = shops.enqueue("shops", "globex", "products", dedup_key="manual:f")
    arrange(db, schema, failed, status="failed")

    assert set(shops.jobs("other")["queue"]) == {"other"}
    assert len(shops.jobs("other")) == 3
    assert set(shops.jobs(owner="globex")["owner"]) == {"globex"}
    assert list(shops.jobs(status="failed")["id"]) == [failed]
    assert set(shops.jobs(status=["failed", "pending"])["status"]) == {"failed", "pending"}
    assert set(shops.jobs("shops", type="orders")["type"]) == {"orders"}
    newest = shops.jobs(limit=4)
    assert list(newest["id"]) == sorted(shops.jobs()["id"], reverse=True)[:4]


# -- progress() -----------------------------------------------------------------------------------


def test_progress_reports_each_owner_and_type_from_the_rows(shops, db, schema, every_slice_planned):
    shops.plan()  # per owner: four 30-day order slices, a refresh, and a products snapshot

    def slices(owner: str) -> list[dict]:
        with db.cursor(row_factory=dict_row) as cur:
            query = sql.SQL(
                "SELECT * FROM {} WHERE owner = %s AND type = 'orders' AND mode = 'initial' "
                "ORDER BY window_start DESC"
            ).format(jobs_table(schema))
            return cur.execute(query, [owner]).fetchall()

    us = slices("acme-us")
    # acme-us: the two newest slices loaded, the third failing, the oldest deferred.
    arrange(db, schema, us[0]["id"], status="completed", processed_count=100)
    arrange(db, schema, us[1]["id"], status="completed", processed_count=50)
    arrange(db, schema, us[2]["id"], status="failed", processed_count=7)
    arrange(db, schema, us[3]["id"], status="deferred")
    # globex: one slice loaded.
    gx = slices("globex")
    arrange(db, schema, gx[0]["id"], status="completed", processed_count=5)

    frame = shops.progress("shops")

    assert list(zip(frame["owner"], frame["type"], strict=True)) == [
        ("acme-eu", "orders"),
        ("acme-eu", "products"),
        ("acme-us", "orders"),
        ("acme-us", "products"),
        ("globex", "orders"),
        ("globex", "products"),
    ]
    table = frame.set_index(["owner", "type"])
    row = table.loc[("acme-us", "orders")]
    assert (row["slices_total"], row["slices_completed"], row["slices_failed"]) == (4, 2, 2)
    assert row["records"] == 157
    assert row["coverage_start"] == pd.Timestamp(us[1]["window_start"])
    assert row["coverage_end"] == pd.Timestamp(us[0]["window_end"])
    assert row["percent"] == 50.0
    row = table.loc[("globex", "orders")]
    assert (row["slices_total"], row["slices_completed"], row["slices_failed"]) == (4, 1, 0)
    assert (row["records"], row["percent"]) == (5, 25.0)
    row = table.loc[("acme-eu", "orders")]
    assert (row["slices_completed"], row["records"], row["percent"]) == (0, 0, 0.0)
    assert pd.isna(row["coverage_start"]) and pd.isna(row["coverage_end"])
    row = table.loc[("acme-eu", "products")]
    assert (row["slices_total"], row["slices_completed"], row["percent"]) == (1, 0, 0.0)

    for column in ("slices_total", "slices_completed", "slices_failed", "records"):
        assert frame[column].dtype == "Int64", column
    for column in ("coverage_start", "coverage_end"):
        assert isinstance(frame[column].dtype, pd.DatetimeTZDtype)
        assert str(frame[column].dtype.tz) == "UTC"

    only = shops.progress("shops", owner="globex")
    assert list(only["owner"]) == ["globex", "globex"]


# -- configuration errors -------------------------------------------------------------------------

WEEK = timedelta(days=7)


def windowed(**settings: object) -> Callable[[SyncLane], object]:
    def declare(app: SyncLane) -> object:
        values = {"horizon": 4 * WEEK, "slice": WEEK, "every": timedelta(hours=1)} | settings
        return app.queue("shops").windowed("orders", **values)  # type: ignore[arg-type]

    return declare


def duplicate_type(app: SyncLane) -> object:
    queue = app.queue("shops")
    queue.snapshot("orders", every=DAY)(done)
    return queue.windowed("orders", horizon=4 * WEEK, slice=WEEK, every=DAY)


def duplicate_queue(app: SyncLane) -> object:
    app.queue("shops")
    return app.queue("shops")


@pytest.mark.parametrize(
    ("declare", "names"),
    [
        pytest.param(windowed(slice=timedelta(0)), r"\bslice\b", id="slice zero"),
        pytest.param(windowed(slice=-WEEK), r"\bslice\b", id="slice negative"),
        pytest.param(windowed(slice=5 * WEEK), r"(?s)slice.*horizon", id="slice over horizon"),
        pytest.param(windowed(every=timedelta(0)), r"\bevery\b", id="every zero"),
        pytest.param(windowed(every=-60), r"\bevery\b", id="every negative"),
        pytest.param(
            lambda app: app.queue("shops").snapshot("products", every=0),
            r"\bevery\b",
            id="snapshot every zero",
        ),
        pytest.param(windowed(overlap=timedelta(hours=1)), r"\boverlap\b", id="overlap = every"),
        pytest.param(windowed(overlap=2 * 3600), r"\boverlap\b", id="overlap > every"),
        pytest.param(windowed(overlap=timedelta(minutes=-1)), r"\boverlap\b", id="overlap < 0"),
        pytest.param(windowed(horizon=timedelta(0)), r"\bhorizon\b", id="horizon zero"),
        pytest.param(duplicate_type, r"'orders'", id="duplicate type"),
        pytest.param(duplicate_queue, r"'shops'", id="duplicate queue"),
        pytest.param(lambda app: app.queue("shops", concurrency=0), "concurrency", id="conc 0"),
        pytest.param(lambda app: app.queue("shops", concurrency=-2), "concurrency", id="conc <0"),
        pytest.param(lambda app: app.queue("shops", concurrency=1.5), "concurrency", id="conc 1.5"),
        pytest.param(lambda app: app.queue("shops", concurrency="4"), "concurrency", id="conc str"),
    ],
)
def test_a_wrong_setting_fails_at_declaration_naming_it(app, declare, names):
    with pytest.raises(ConfigError, match=names):
        declare(app)


def test_a_refused_declaration_leaves_no_half_declared_type(app):
    queue = app.queue("shops")
    with pytest.raises(ConfigError):
        queue.windowed("orders", horizon=WEEK, slice=2 * WEEK, every=DAY)

    assert "orders" not in queue.types
    queue.windowed("orders", horizon=2 * WEEK, slice=WEEK, every=DAY)(done)
    assert list(queue.types) == ["orders"]


def test_operations_on_an_unknown_queue_or_type_are_config_errors(shops):
    calls = [
        lambda: shops.requeue("nope"),
        lambda: shops.requeue("shops", type="nope"),
        lambda: shops.cancel("nope", "globex", "gone"),
        lambda: shops.cancel("shops", "globex", "gone", type="nope"),
        lambda: shops.jobs("nope"),
        lambda: shops.progress("nope"),
    ]
    for call in calls:
        with pytest.raises(ConfigError, match=re.escape("'nope'")):
            call()


@pytest.mark.parametrize(
    ("dsn_text", "shown"),
    [
        ("postgresql://u:s3cret@h:5432/db", "postgresql://u:***@h:5432/db"),
        (
            "postgresql://h/db?sslmode=require&password=s3cret",
            "postgresql://h/db?sslmode=require&password=***",
        ),
        ("host=h password=s3cret dbname=db", "host=h password=*** dbname=db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_redact_hides_every_form_of_password(dsn_text: str, shown: str) -> None:
    from synclane.app import redact

    assert redact(dsn_text) == shown
