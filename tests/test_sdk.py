"""The notebook SDK (docs/sdk.md): each call against a table arranged by hand, as a user
with UPDATE would leave it, with the exact answers, the dtypes, and the masking of causes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import psycopg
import pytest
from apps import done
from psycopg import sql
from psycopg.rows import dict_row
from workers import arrange, database_now

from synclane import ConfigError, Owner, SyncLane
from synclane.frames import STATES
from synclane.model import MODES, STATUSES

DAY = timedelta(days=1)
OWNERS = [
    Owner("acme-us", lane="acme"),
    Owner("acme-eu", lane="acme"),
    Owner("globex"),
    Owner("initech"),
]


def declare(app: SyncLane, owners: list[Owner]) -> SyncLane:
    """Queue 'shops': orders (120 days in four 30-day slices, a 15-minute refresh), products."""
    queue = app.queue("shops")
    queue.owners(lambda name: owners)
    queue.windowed(
        "orders",
        horizon=120 * DAY,
        slice=30 * DAY,
        every=timedelta(minutes=15),
        overlap=timedelta(minutes=5),
    )(done)
    queue.snapshot("products", every=DAY)(done)
    return app


@pytest.fixture
def shops(app: SyncLane, every_slice_planned: None) -> SyncLane:
    declare(app, OWNERS)
    assert app.plan() == {"shops": 24}  # per owner: four slices, a refresh, products
    return app


def table(schema: str) -> sql.Composed:
    return sql.SQL("{}.jobs").format(sql.Identifier(schema))


def rows(db: psycopg.Connection, schema: str, where: str, *params: Any) -> list[dict[str, Any]]:
    with db.cursor(row_factory=dict_row) as cur:
        query = sql.SQL("SELECT * FROM {} WHERE " + where + " ORDER BY id").format(table(schema))
        return cur.execute(query, params).fetchall()


def slices(db: psycopg.Connection, schema: str, owner: str) -> list[dict[str, Any]]:
    """The owner's history slices of orders, newest first."""
    found = rows(db, schema, "owner = %s AND type = 'orders' AND mode = 'initial'", owner)
    return sorted(found, key=lambda row: row["window_start"], reverse=True)


def refresh(db: psycopg.Connection, schema: str, owner: str) -> dict[str, Any]:
    [row] = rows(db, schema, "owner = %s AND type = 'orders' AND mode = 'recurring'", owner)
    return row


def ids(found: Iterable[dict[str, Any]]) -> list[int]:
    return [row["id"] for row in found]


def assert_utc(frame: pd.DataFrame, *columns: str) -> None:
    for column in columns:
        dtype = frame[column].dtype
        assert isinstance(dtype, pd.DatetimeTZDtype) and str(dtype.tz) == "UTC", (column, dtype)


def assert_dtypes(frame: pd.DataFrame, expected: dict[str, str]) -> None:
    found = {column: str(frame[column].dtype) for column in expected}
    assert found == expected


# -- import --------------------------------------------------------------------------------------


def test_import_synclane_loads_neither_pandas_nor_matplotlib() -> None:
    code = (
        "import sys, synclane, synclane.worker\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'matplotlib'))\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- jobs() --------------------------------------------------------------------------------------


def test_jobs_reads_like_a_table_people_scan_left_to_right(shops: SyncLane) -> None:
    frame = shops.jobs("shops")

    assert list(frame.columns[:9]) == [
        "id",
        "queue",
        "owner",
        "lane",
        "type",
        "mode",
        "status",
        "window_start",
        "window_end",
    ]
    assert list(frame.columns[-3:]) == ["priority", "dedup_key", "lease_token"]
    assert isinstance(frame.index, pd.RangeIndex)
    assert list(frame["id"]) == sorted(frame["id"], reverse=True)


def test_jobs_have_utc_times_categorical_statuses_nullable_counts_and_durations(
    shops: SyncLane, db: psycopg.Connection, schema: str
) -> None:
    [running, *_] = slices(db, schema, "globex")
    arrange(db, schema, running["id"], status="running", started_at=database_now(db) - DAY)

    frame = shops.jobs("shops")

    assert_utc(frame, "window_start", "window_end", "next_run_at", "created_at", "completed_at")
    assert list(frame["status"].cat.categories) == list(STATUSES)
    assert list(frame["mode"].cat.categories) == list(MODES)
    assert frame["status"].value_counts()["abandoned"] == 0  # every status, even when absent
    assert_dtypes(
        frame,
        {
            "id": "Int64",
            "processed_count": "Int64",
            "attempt_count": "Int64",
            "owner": "string",
            "error": "string",
            "lease_token": "string",
            "age": "timedelta64[us]",
            "running_for": "timedelta64[us]",
        },
    )
    by_id = frame.set_index("id")
    assert DAY <= by_id.loc[running["id"], "running_for"] < DAY + timedelta(minutes=1)
    assert frame["running_for"].notna().sum() == 1  # only a running job runs
    assert (frame["age"] >= timedelta(0)).all() and (frame["age"] < timedelta(minutes=1)).all()
    assert pd.isna(by_id.loc[running["id"], "completed_at"])  # missing is NaT, not None


def test_an_error_is_cut_to_its_first_line_unless_the_full_text_is_asked_for(
    shops: SyncLane, db: psycopg.Connection, schema: str
) -> None:
    first, second, third, fourth = slices(db, schema, "acme-us")
    traceback = "RuntimeError: order 97 not found\n  File 'shop.py', line 3, in fetch"
    long_line = "RuntimeError: " + "x" * 300
    arrange(db, schema, first["id"], status="failed", error=traceback)
    arrange(db, schema, second["id"], status="failed", error=long_line)
    arrange(db, schema, third["id"], status="failed", error="RuntimeError: short")

    short = shops.jobs("shops", owner="acme-us").set_index("id")["error"]
    full = shops.jobs("shops", owner="acme-us", full_errors=True).set_index("id")["error"]

    assert short[first["id"]] == "RuntimeError: order 97 not found…"
    assert short[second["id"]] == long_line[:119] + "…" and len(short[second["id"]]) == 120
    assert short[third["id"]] == "RuntimeError: short"
    assert pd.isna(short[fourth["id"]])
    assert full[first["id"]] == traceback and full[second["id"]] == long_line


def test_jobs_filter_by_lane_ids_status_and_creation_time(
    shops: SyncLane, db: psycopg.Connection, schema: str
) -> None:
    old = slices(db, schema, "globex")[-1]
    arrange(db, schema, old["id"], created_at=database_now(db) - 3 * DAY, status="failed")

    assert set(shops.jobs(lane="acme")["owner"]) == {"acme-us", "acme-eu"}
    assert len(shops.jobs(lane="acme")) == 12
    assert list(shops.jobs(ids=[old["id"], 2])["id"]) == [old["id"], 2]
    assert list(shops.jobs(since=DAY, status=["failed"])["id"]) == []
    assert list(shops.jobs(until=DAY)["id"]) == [old["id"]]
    assert list(shops.jobs(until=datetime.now(UTC) - 2 * DAY)["id"]) == [old["id"]]
    assert len(shops.jobs(since=DAY)) == 23
    assert len(shops.jobs("shops", "globex", type="orders", limit=2)) == 2


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda app: app.jobs(status="done"), "unknown status 'done'"),
        (lambda app: app.jobs(limit=0), "limit=0"),
        (lambda app: app.jobs(since=datetime(2026, 1, 1)), "no time zone"),
        (lambda app: app.jobs(since="yesterday"), "aware datetime or a timedelta"),
        (lambda app: app.failures(status="pending"), "unknown status 'pending'"),
        (lambda app: app.depth(status="completed"), "unknown status 'completed'"),
        (lambda app: app.progress("shops", state="stuck"), "unknown state 'stuck'"),
        (lambda app: app.progress("nope"), "'nope'"),
        (lambda app: app.coverage("nope"), "'nope'"),
        (lambda app: app.lanes("nope"), "'nope'"),
        (lambda app: app.throughput(every=0.5), "shorter than a second"),
        (lambda app: app.throughput(by="hour"), "by='hour'"),
        (lambda app: app.throughput(since=DAY, until=2 * DAY), "must be before until"),
        (lambda app: app.throughput(since=400 * DAY, every=60), "periods"),
    ],
)
def test_a_wrong_filter_is_a_config_error_that_names_it(
    shops: SyncLane, call: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        call(shops)


def test_every_frame_keeps_its_dtypes_when_it_is_empty(app: SyncLane) -> None:
    declare(app, [])
    frames = {
        "jobs": app.jobs(),
        "progress": app.progress("shops"),
        "failures": app.failures(),
        "depth": app.depth(),
        "lanes": app.lanes(),
        "coverage": app.coverage("shops"),
    }
    for name, frame in frames.items():
        assert frame.empty, name
        for column in ("status", "state", "mode"):
            if column in frame.columns:
                assert isinstance(frame[column].dtype, pd.CategoricalDtype), (name, column)
        for column in ("created_at", "first_seen", "window_start", "coverage_end", "since"):
            if column in frame.columns:
                assert_utc(frame, column)
    assert str(frames["progress"]["eta"].dtype) == "timedelta64[us]"
    assert str(frames["depth"]["jobs"].dtype) == "Int64"


# -- progress() ----------------------------------------------------------------------------------

# One account per state of the first load (docs/sdk.md defines them).
STATE_OWNERS = [Owner(state) for state in STATES] + [Owner("stuck-newest")]


@pytest.fixture
def states(
    app: SyncLane, db: psycopg.Connection, schema: str, every_slice_planned: None
) -> dict[str, list[dict[str, Any]]]:
    """Each account's four history slices (newest first) arranged into the state it is named
    after. Returns the slices as planned."""
    declare(app, STATE_OWNERS)
    app.plan()
    now = database_now(db)
    planned = {owner.id: slices(db, schema, owner.id) for owner in STATE_OWNERS}

    def set_(owner: str, number: int, **values: Any) -> None:
        arrange(db, schema, planned[owner][number]["id"], **values)

    def completed(owner: str, number: int, records: int = 10, **values: Any) -> None:
        set_(owner, number, status="completed", processed_count=records, **values)

    # connecting: nothing loaded, nothing wrong.
    # loading: the two newest loaded within the hour, the third running, the oldest pending.
    completed("loading", 0, 100, started_at=now - 30 * 60 * S, completed_at=now - 10 * 60 * S)
    completed("loading", 1, 50, started_at=now - 12 * 60 * S, completed_at=now - 5 * 60 * S)
    set_("loading", 2, status="running", processed_count=7, started_at=now)
    # loaded: all four, long ago.
    for number in range(4):
        completed("loaded", number, completed_at=now - 3 * DAY)
    # failing: one loaded, one waiting for its retry after an error.
    completed("failing", 0)
    set_("failing", 1, status="failed", error="RuntimeError: boom", next_run_at=now + DAY)
    # throttled: a throttle failed one slice and pushed the lane's other open jobs.
    completed("throttled", 0)
    set_("throttled", 1, status="failed", error="Throttled: slow down", next_run_at=now + DAY)
    for number in (2, 3):
        set_("throttled", number, next_run_at=now + DAY)
    # abandoned: one slice waits for a human (and another fails: abandoned wins).
    completed("abandoned", 0)
    set_("abandoned", 1, status="abandoned", error="Abandon: access revoked")
    set_("abandoned", 2, status="failed", error="RuntimeError: boom")
    completed("abandoned", 3)
    # cancelled: the account disconnected after its newest slice.
    completed("cancelled", 0)
    for number in (1, 2, 3):
        set_("cancelled", number, status="cancelled")
    # stuck-newest: the newest slice fails while the two below it loaded.
    set_("stuck-newest", 0, status="deferred", error="RuntimeError: boom")
    completed("stuck-newest", 1)
    completed("stuck-newest", 2)
    # Refreshes load records too; they are not the first load.
    db.execute(
        sql.SQL("UPDATE {} SET processed_count = 999 WHERE mode = 'recurring'").format(
            table(schema)
        )
    )
    return planned


S = timedelta(seconds=1)


def test_progress_names_the_state_of_each_first_load(
    app: SyncLane, states: dict[str, list[dict[str, Any]]]
) -> None:
    frame = app.progress("shops", type="orders")

    assert dict(zip(frame["owner"], frame["state"].astype(str), strict=True)) == {
        **{state: state for state in STATES},
        "stuck-newest": "failing",
    }
    assert list(frame["state"].cat.categories) == list(STATES)
    products = app.progress("shops", type="products")
    assert set(products["state"]) == {"connecting"} and set(products["slices_total"]) == {1}


def test_progress_counts_the_history_slices_and_their_records_only(
    app: SyncLane, states: dict[str, list[dict[str, Any]]]
) -> None:
    frame = app.progress("shops", type="orders").set_index("owner")
    counts = ["slices_total", "slices_completed", "slices_failed", "slices_open"]
    counts += ["slices_cancelled", "records", "percent"]

    assert frame.loc["loading", counts].tolist() == [4, 2, 0, 2, 0, 157, 50.0]
    assert frame.loc["loaded", counts].tolist() == [4, 4, 0, 0, 0, 40, 100.0]
    assert frame.loc["abandoned", counts].tolist() == [4, 2, 2, 0, 0, 20, 50.0]
    assert frame.loc["cancelled", counts].tolist() == [4, 1, 0, 0, 3, 10, 25.0]
    assert frame.loc["connecting", counts].tolist() == [4, 0, 0, 4, 0, 0, 0.0]
    assert list(frame.columns[:3]) == ["type", "state", "percent"]
    assert_dtypes(
        frame,
        {
            "slices_total": "Int64",
            "records": "Int64",
            "percent": "Float64",
            "eta": "timedelta64[us]",
            "coverage_start": "datetime64[us, UTC]",
        },
    )


def test_coverage_is_the_unbroken_loaded_span_back_from_the_newest_loaded_slice(
    app: SyncLane, states: dict[str, list[dict[str, Any]]]
) -> None:
    frame = app.progress("shops", type="orders").set_index("owner")

    def span(owner: str) -> tuple[Any, Any]:
        return frame.loc[owner, "coverage_start"], frame.loc[owner, "coverage_end"]

    def window(owner: str, newest: int, oldest: int) -> tuple[Any, Any]:
        found = states[owner]
        return (
            pd.Timestamp(found[oldest]["window_start"]),
            pd.Timestamp(found[newest]["window_end"]),
        )

    assert span("loaded") == window("loaded", 0, 3)
    assert span("loading") == window("loading", 0, 1)
    assert span("abandoned") == window("abandoned", 0, 0)  # slice 1 is a gap; 2 and 3 do not join
    assert span("stuck-newest") == window("stuck-newest", 1, 2)  # the newest is not loaded
    assert all(pd.isna(value) for value in span("connecting"))


def test_the_eta_comes_from_the_slices_completed_recently(
    app: SyncLane, states: dict[str, list[dict[str, Any]]]
) -> None:
    eta = app.progress("shops", type="orders").set_index("owner")["eta"]

    # Two slices in the 30 minutes since the first of them started; two remain: 30 more minutes.
    assert timedelta(minutes=30) <= eta["loading"] < timedelta(minutes=30, seconds=30)
    assert eta["loaded"] == timedelta(0)
    assert pd.isna(eta["failing"])  # nothing completed in the last hour: no estimate
    assert pd.isna(eta["connecting"])
    # Over the last 7 minutes only the second counts: 12 minutes a slice, two remain.
    recent = app.progress("shops", "loading", "orders", recent=timedelta(minutes=7))
    assert timedelta(minutes=24) <= recent["eta"].iloc[0] < timedelta(minutes=24, seconds=30)


def test_progress_filters_by_owner_type_and_state(
    app: SyncLane, states: dict[str, list[dict[str, Any]]]
) -> None:
    assert list(app.progress("shops", "loaded")["type"]) == ["orders", "products"]
    stopped = app.progress("shops", state=["abandoned", "failing"])
    assert list(stopped["owner"]) == ["abandoned", "failing", "stuck-newest"]
    assert app.progress("shops", type="nothing").empty


# -- failures() ----------------------------------------------------------------------------------

UUID_A = "0b6f1c2e-8d1a-4c55-9a43-2f1e4a7b9c10"
UUID_B = "7d2c3b4a-1e5f-4a6b-8c7d-9e0f1a2b3c4d"
TRACE = "\n  File 'shop.py', line 12, in fetch"


@pytest.fixture
def failing(shops: SyncLane, db: psycopg.Connection, schema: str) -> dict[str, int]:
    """Stopped jobs whose errors differ by numbers and ids, and some that differ in words."""
    us, eu, gx, it = (
        slices(db, schema, owner) for owner in ("acme-us", "acme-eu", "globex", "initech")
    )
    base = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    arranged = {
        "order 41": (us[0], "failed", "RuntimeError: order 41 not found"),
        "order 97": (gx[0], "deferred", "RuntimeError: order 97 not found" + TRACE),
        "missing": (gx[1], "abandoned", "RuntimeError: order 41 missing"),
        "uuid a": (it[0], "failed", f"ShopUnavailable: 503 (request {UUID_A})"),
        "uuid b": (it[1], "failed", f"ShopUnavailable: 503 (request {UUID_B})"),
        "hex a": (eu[0], "failed", "HTTPError: key a1b2c3d4e5 rejected"),
        "hex b": (eu[1], "abandoned", "HTTPError: key 9f8e7d6c5b rejected"),
    }
    for minutes, (row, status, error) in enumerate(arranged.values()):
        seen = base + timedelta(minutes=minutes)
        arrange(db, schema, row["id"], status=status, error=error, heartbeat_at=seen)
    # A completed job keeps no error; a running one is not a failure.
    arrange(db, schema, it[2]["id"], status="running", error="RuntimeError: order 5 not found")
    return {name: row["id"] for name, (row, _, _) in arranged.items()}


def test_failures_group_errors_that_differ_only_by_numbers_and_ids(
    shops: SyncLane, failing: dict[str, int]
) -> None:
    frame = shops.failures("shops")

    assert list(frame["cause"]) == [
        "HTTPError: key <hex> rejected",
        "ShopUnavailable: <n> (request <uuid>)",
        "RuntimeError: order <n> not found",
        "RuntimeError: order <n> missing",
    ]
    table = frame.set_index("cause")
    found = table.loc["RuntimeError: order <n> not found"]
    assert (found["jobs"], found["failed"], found["deferred"], found["abandoned"]) == (2, 1, 1, 0)
    assert (found["owner_count"], found["owners"]) == (2, ["acme-us", "globex"])
    assert found["statuses"] == ["deferred", "failed"]
    assert found["job_ids"] == sorted([failing["order 41"], failing["order 97"]], reverse=True)
    assert found["first_seen"] == pd.Timestamp("2026-03-01 12:00", tz="UTC")
    assert found["last_seen"] == pd.Timestamp("2026-03-01 12:01", tz="UTC")
    assert table.loc["RuntimeError: order <n> missing", "jobs"] == 1
    assert table.loc["HTTPError: key <hex> rejected", "owners"] == ["acme-eu"]
    assert list(frame.columns[:4]) == ["cause", "queue", "type", "jobs"]
    assert_utc(frame, "first_seen", "last_seen")
    assert_dtypes(frame, {"cause": "string", "jobs": "Int64", "abandoned": "Int64"})


def test_the_example_is_the_newest_error_cut_to_its_first_line(
    shops: SyncLane, failing: dict[str, int]
) -> None:
    newest = max(failing["order 41"], failing["order 97"])
    errors = shops.jobs(ids=[newest], full_errors=True)["error"]

    short = shops.failures("shops").set_index("cause")["example"]
    full = shops.failures("shops", full_errors=True).set_index("cause")["example"]

    assert full["RuntimeError: order <n> not found"] == errors.iloc[0]
    assert short["RuntimeError: order <n> not found"] == errors.iloc[0].split("\n")[0] + (
        "…" if "\n" in errors.iloc[0] else ""
    )


def test_failures_filter_by_owner_type_status_and_time(
    shops: SyncLane, failing: dict[str, int]
) -> None:
    assert set(shops.failures(owner="globex")["cause"]) == {
        "RuntimeError: order <n> not found",
        "RuntimeError: order <n> missing",
    }
    abandoned = shops.failures(status="abandoned")
    assert list(abandoned["jobs"]) == [1, 1]
    assert shops.failures(type="products").empty
    since = datetime(2026, 3, 1, 12, 5, tzinfo=UTC)
    assert set(shops.failures(since=since)["cause"]) == {"HTTPError: key <hex> rejected"}


def test_requeue_by_a_cause_from_failures_requeues_the_lot(
    shops: SyncLane, failing: dict[str, int]
) -> None:
    cause = "RuntimeError: order <n> not found"
    assert cause in set(shops.failures("shops")["cause"])

    assert shops.requeue("shops", cause=cause) == 2

    assert cause not in set(shops.failures("shops")["cause"])
    requeued = shops.jobs(ids=[failing["order 41"], failing["order 97"]])
    assert set(requeued["status"]) == {"pending"}
    assert "RuntimeError: order <n> missing" in set(shops.failures("shops")["cause"])


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ("RuntimeError: order 41 not found", "RuntimeError: order 97 not found", True),
        ("RuntimeError: order 41 not found", "RuntimeError: order 41 missing", False),
        ("KeyError: 'sku 12'", "ValueError: 'sku 12'", False),
        (f"Timeout: request {UUID_A}", f"Timeout: request {UUID_B}", True),
        ("HTTPError: key a1b2c3d4e5 rejected", "HTTPError: key 0x9F rejected", True),
        ("RuntimeError: page 3" + TRACE, "RuntimeError: page 4\n  another trace", True),
        ("RuntimeError: shop deadbeef down", "RuntimeError: shop cafe down", False),
    ],
)
def test_a_cause_masks_numbers_hex_and_uuids_and_nothing_else(
    app: SyncLane, db: psycopg.Connection, schema: str, one: str, other: str, same: bool
) -> None:
    cause = sql.SQL("SELECT {}.error_cause(%s)").format(sql.Identifier(schema))
    first, second = (db.execute(cause, [text]).fetchone()[0] for text in (one, other))  # type: ignore[index]
    assert (first == second) is same, (first, second)
    assert "\n" not in first


# -- depth() and lanes() ---------------------------------------------------------------------------


@pytest.fixture
def busy(shops: SyncLane, db: psycopg.Connection, schema: str) -> dict[str, int]:
    """acme-us runs its newest slice; acme-eu's newest waits for a retry; globex's is deferred;
    initech has loaded everything."""
    now = database_now(db)
    running = slices(db, schema, "acme-us")[0]["id"]
    failed = slices(db, schema, "acme-eu")[0]["id"]
    deferred = slices(db, schema, "globex")[0]["id"]
    arrange(
        db,
        schema,
        running,
        status="running",
        leased_by="worker-1",
        started_at=now - 90 * S,
        lease_expires_at=now + 210 * S,
        cursor="50",
    )
    arrange(db, schema, failed, status="failed", error="RuntimeError: boom", next_run_at=now + DAY)
    arrange(db, schema, deferred, status="deferred", error="RuntimeError: boom")
    db.execute(
        sql.SQL("UPDATE {} SET status = 'completed' WHERE owner = 'initech'").format(table(schema))
    )
    return {"running": running, "failed": failed, "deferred": deferred}


def test_depth_counts_open_jobs_by_queue_lane_and_status(
    shops: SyncLane, busy: dict[str, int]
) -> None:
    frame = shops.depth()

    found = [
        (row.queue, row.lane, row.status, row.jobs, row.due, row.owner_count)
        for row in frame.itertuples()
    ]
    assert found == [
        ("shops", "acme", "pending", 10, 10, 2),
        ("shops", "acme", "running", 1, 0, 1),
        ("shops", "acme", "failed", 1, 0, 1),
        ("shops", "globex", "pending", 5, 5, 1),
        ("shops", "globex", "deferred", 1, 0, 1),
    ]
    assert list(frame["status"].cat.categories) == list(STATUSES)
    assert str(frame["age"].dtype) == "timedelta64[us]"
    wide = frame.pivot_table(
        index="lane", columns="status", values="jobs", observed=False, aggfunc="sum"
    )
    assert list(wide.columns) == list(STATUSES) and wide.loc["globex", "running"] == 0
    assert list(shops.depth(owner="acme-eu")["jobs"]) == [5, 1]
    assert list(shops.depth(status="deferred")["lane"]) == ["globex"]
    assert shops.depth(type="products")["jobs"].sum() == 3


def test_lanes_show_who_runs_what_since_when_and_what_waits(
    shops: SyncLane, db: psycopg.Connection, schema: str, busy: dict[str, int]
) -> None:
    frame = shops.lanes("shops").set_index("lane")

    assert list(frame.index) == ["acme", "globex"]
    acme = frame.loc["acme"]
    assert (acme["job_id"], acme["owner"], acme["type"], acme["cursor"]) == (
        busy["running"],
        "acme-us",
        "orders",
        "50",
    )
    assert acme["leased_by"] == "worker-1"
    assert timedelta(seconds=90) <= acme["running_for"] < timedelta(seconds=150)
    assert (acme["waiting"], acme["due"]) == (11, 10)
    assert pd.isna(acme["paused_until"])
    assert pd.isna(frame.loc["globex", "job_id"]) and frame.loc["globex", "waiting"] == 6

    until = database_now(db) + timedelta(hours=2)
    arrange(db, schema, busy["failed"], error="Throttled: slow down", next_run_at=until)
    assert shops.lanes(lane="acme")["paused_until"].iloc[0] == pd.Timestamp(until)


# -- coverage() ----------------------------------------------------------------------------------


def test_coverage_merges_neighbouring_windows_of_one_status_into_spans(
    shops: SyncLane, db: psycopg.Connection, schema: str
) -> None:
    newest, second, third, oldest = slices(db, schema, "globex")
    arrange(db, schema, [newest["id"], second["id"]], status="completed", processed_count=10)
    arrange(db, schema, third["id"], status="failed", error="RuntimeError: boom")
    arrange(db, schema, oldest["id"], status="completed", processed_count=3)
    recurring = refresh(db, schema, "globex")
    arrange(db, schema, recurring["id"], status="completed", processed_count=5)
    # A manual reload far before the history: a gap separates it.
    before = oldest["window_start"] - timedelta(days=60)
    manual = shops.enqueue(
        "shops", "globex", "orders", window_start=before, window_end=before + DAY
    )
    arrange(db, schema, manual, status="completed", processed_count=1)

    frame = shops.coverage("shops", "globex")

    spans = [
        (row.status, row.window_start, row.window_end, row.jobs, row.records)
        for row in frame.itertuples()
    ]
    assert spans == [
        ("completed", pd.Timestamp(before), pd.Timestamp(before + DAY), 1, 1),
        (
            "completed",
            pd.Timestamp(oldest["window_start"]),
            pd.Timestamp(oldest["window_end"]),
            1,
            3,
        ),
        ("failed", pd.Timestamp(third["window_start"]), pd.Timestamp(third["window_end"]), 1, 0),
        (
            "completed",
            pd.Timestamp(second["window_start"]),
            pd.Timestamp(recurring["window_end"]),
            3,
            25,
        ),
    ]
    assert set(frame["type"]) == {"orders"}  # products have no window
    assert frame["duration"].iloc[0] == DAY
    assert_utc(frame, "window_start", "window_end")
    pending = shops.coverage("shops", "acme-us")
    assert list(pending["status"]) == ["pending"] and pending["jobs"].iloc[0] == 5
    assert len(shops.coverage("shops")) == 4 + 3  # globex's four spans, one per other owner


def test_coverage_filters_windows_by_time_and_status(
    shops: SyncLane, db: psycopg.Connection, schema: str
) -> None:
    _, second, third, _ = slices(db, schema, "globex")
    arrange(db, schema, third["id"], status="failed", error="RuntimeError: boom")

    # A range keeps the windows that overlap it, and clips their spans to it.
    recent = shops.coverage("shops", "globex", since=second["window_start"] + DAY)
    assert list(recent["window_start"]) == [pd.Timestamp(second["window_start"] + DAY)]
    old = shops.coverage("shops", "globex", until=third["window_end"] - DAY)
    assert list(old["status"]) == ["pending", "failed"]
    assert old["window_end"].iloc[-1] == pd.Timestamp(third["window_end"] - DAY)
    assert list(shops.coverage("shops", status="failed")["owner"]) == ["globex"]


# -- throughput() ----------------------------------------------------------------------------------

T = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


@pytest.fixture
def finished(shops: SyncLane, db: psycopg.Connection, schema: str) -> None:
    us, gx = slices(db, schema, "acme-us"), slices(db, schema, "globex")
    for row, status, at, records in [
        (us[0], "completed", T + 30 * S, 100),
        (gx[0], "completed", T + 50 * S, 50),
        (gx[1], "completed", T + 130 * S, 7),
        (gx[2], "abandoned", T + 20 * S, 9),  # finished, not completed: not counted
        (us[1], "completed", T - 10 * S, 1000),  # before the range
    ]:
        arrange(db, schema, row["id"], status=status, completed_at=at, processed_count=records)


def test_throughput_counts_records_and_completed_jobs_per_minute(
    shops: SyncLane, finished: None
) -> None:
    frame = shops.throughput("shops", since=T, until=T + 4 * 60 * S)

    assert list(frame["period"]) == [pd.Timestamp(T + n * 60 * S) for n in range(4)]
    assert list(frame["jobs"]) == [2, 0, 1, 0]
    assert list(frame["records"]) == [150, 0, 7, 0]
    assert list(frame["records_per_minute"]) == [150.0, 0.0, 7.0, 0.0]
    assert list(frame.columns) == [
        "period",
        "jobs",
        "records",
        "jobs_per_minute",
        "records_per_minute",
    ]
    assert_utc(frame, "period")
    wide = shops.throughput(since=T + 15 * S, until=T + 4 * 60 * S, every=timedelta(minutes=2))
    assert list(wide["period"]) == [pd.Timestamp(T), pd.Timestamp(T + 120 * S)]
    assert list(wide["jobs"]) == [2, 1] and list(wide["records_per_minute"]) == [75.0, 3.5]


def test_throughput_splits_by_owner_with_zeros_where_nothing_completed(
    shops: SyncLane, finished: None
) -> None:
    frame = shops.throughput(since=T, until=T + 3 * 60 * S, by="owner")

    assert list(frame.columns[:2]) == ["period", "owner"]
    assert [(row.owner, row.jobs, row.records) for row in frame.itertuples()] == [
        ("acme-us", 1, 100),
        ("globex", 1, 50),
        ("acme-us", 0, 0),
        ("globex", 0, 0),
        ("acme-us", 0, 0),
        ("globex", 1, 7),
    ]
    assert list(shops.throughput(since=T, until=T + 60 * S, owner="globex")["records"]) == [50]


def test_throughput_reaches_back_from_now_by_default(
    shops: SyncLane, db: psycopg.Connection, schema: str
) -> None:
    job = slices(db, schema, "initech")[0]
    arrange(
        db, schema, job["id"], status="completed", completed_at=database_now(db), processed_count=4
    )

    frame = shops.throughput()

    assert 60 <= len(frame) <= 61  # the last hour, minute by minute
    assert (frame["jobs"].sum(), frame["records"].sum()) == (1, 4)
    assert frame["period"].is_monotonic_increasing


def test_requeue_by_the_cause_id_failures_shows_requeues_that_cause_only(
    shops: SyncLane, failing: dict[str, int]
) -> None:
    frame = shops.failures("shops").set_index("cause")
    ids = frame["cause_id"]
    assert ids.str.fullmatch("[0-9a-f]{8}").all() and ids.is_unique
    again = shops.failures("shops", owner="globex").set_index("cause")["cause_id"]
    assert again["RuntimeError: order <n> not found"] == ids["RuntimeError: order <n> not found"]

    assert shops.requeue("shops", cause_id=ids["RuntimeError: order <n> not found"]) == 2

    assert set(shops.jobs(ids=[failing["order 41"], failing["order 97"]])["status"]) == {"pending"}
    assert shops.requeue("shops", cause_id="00000000") == 0
    with pytest.raises(ConfigError, match="cause_id"):
        shops.requeue("shops", cause_id="RuntimeError: order")
