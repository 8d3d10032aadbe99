"""The jobs table (docs/schema.sql): created at start-up, versioned, published, and its two unique
indexes carry the guarantees."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import apps
import psycopg
import pytest
from apps import products_queue
from psycopg import errors, sql
from workers import index_definitions, operations_sql

from synclane import Job, Owner, Page, SchemaError, SyncLane
from synclane.store import (
    QUERIES,
    SCHEMA_VERSION,
    Store,
    compact,
    positional,
    render,
    schema_ddl,
)

DOCS_SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "schema.sql"

# The columns docs/schema.sql names, with the types a user may rely on.
COLUMNS = {
    "id": "bigint",
    "queue": "text",
    "owner": "text",
    "lane": "text",
    "type": "text",
    "mode": "text",
    "status": "text",
    "priority": "integer",
    "window_start": "timestamp with time zone",
    "window_end": "timestamp with time zone",
    "dedup_key": "text",
    "cursor": "text",
    "processed_count": "bigint",
    "attempt_count": "integer",
    "throttle_count": "integer",
    "error": "text",
    "next_run_at": "timestamp with time zone",
    "leased_by": "text",
    "lease_token": "uuid",
    "lease_expires_at": "timestamp with time zone",
    "created_at": "timestamp with time zone",
    "started_at": "timestamp with time zone",
    "heartbeat_at": "timestamp with time zone",
    "completed_at": "timestamp with time zone",
    "stalls": "integer",
    "lane_slot": "smallint",
    "queue_slot": "integer",
    "release_key": "uuid",
}


def table(schema: str, name: str = "jobs") -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def schema_exists(db: psycopg.Connection, schema: str) -> bool:
    row = db.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", [schema]).fetchone()
    return row is not None and row[0] == 1


def insert_job(
    db: psycopg.Connection,
    schema: str,
    *,
    owner: str = "acme-us",
    lane: str = "acme",
    key: str = "manual:1",
    status: str = "pending",
    queue: str = "shops",
) -> int:
    row = db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, type, mode, status, dedup_key) "
            "VALUES (%s, %s, %s, 'orders', 'manual', %s, %s) RETURNING id"
        ).format(table(schema)),
        [queue, owner, lane, status, key],
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_table_is_created_at_start_up_with_the_designed_columns(app, db, schema):
    rows = db.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = 'jobs'",
        [schema],
    ).fetchall()
    assert dict(rows) == COLUMNS


def test_starting_twice_on_one_schema_keeps_the_table_and_its_rows(app, db, dsn, schema):
    job_id = insert_job(db, schema)

    again = SyncLane(dsn, schema=schema)
    try:
        assert again.migrate() == SCHEMA_VERSION
    finally:
        again.close()

    ids = db.execute(sql.SQL("SELECT id FROM {}").format(table(schema))).fetchall()
    assert ids == [(job_id,)]
    versions = db.execute(
        sql.SQL("SELECT version FROM {}").format(table(schema, "schema_version"))
    ).fetchall()
    assert versions == [(SCHEMA_VERSION,)]


def test_a_schema_version_row_is_recorded(app, db, schema):
    rows = db.execute(
        sql.SQL("SELECT version, applied_at IS NOT NULL FROM {}").format(
            table(schema, "schema_version")
        )
    ).fetchall()
    assert rows == [(SCHEMA_VERSION, True)]


def test_create_schema_false_on_a_missing_schema_fails_with_a_clear_error(dsn, db, schema):
    """The error comes at construction or, at the latest, at the first operation; it names the
    schema and the fix instead of leaking 'relation does not exist'."""
    created: list[SyncLane] = []
    try:
        with pytest.raises(SchemaError, match=r"(?s)" + schema + r".*migrate"):
            lane = SyncLane(dsn, schema=schema, create_schema=False)
            created.append(lane)
            products_queue(lane, owners=[Owner("acme")])
            lane.enqueue("shops", "acme", "products")
    finally:
        for lane in created:
            lane.close()
    assert not schema_exists(db, schema), "create_schema=False must not create the schema"


def test_create_schema_false_then_migrate_creates_the_schema(dsn, db, schema):
    lane = SyncLane(dsn, schema=schema, create_schema=False)
    try:
        assert lane.migrate() == SCHEMA_VERSION
        products_queue(lane)
        assert lane.enqueue("shops", "acme", "products") > 0
    finally:
        lane.close()
    assert schema_exists(db, schema)


def test_create_schema_false_refuses_a_schema_made_by_a_newer_synclane(app, db, dsn, schema):
    """An older synclane must not write to a newer schema just because it skips the DDL."""
    db.execute(
        sql.SQL("INSERT INTO {} (version) VALUES (99)").format(table(schema, "schema_version"))
    )
    created: list[SyncLane] = []
    try:
        with pytest.raises(SchemaError, match=r"(?s)newer synclane.*99"):
            lane = SyncLane(dsn, schema=schema, create_schema=False)
            created.append(lane)
            products_queue(lane)
            lane.enqueue("shops", "acme", "products")
    finally:
        for lane in created:
            lane.close()
    assert db.execute(sql.SQL("SELECT count(*) FROM {}").format(table(schema))).fetchone() == (0,)


def test_create_schema_false_on_an_existing_schema_works(app, dsn, schema):
    lane = SyncLane(dsn, schema=schema, create_schema=False)
    try:
        products_queue(lane)
        assert lane.enqueue("shops", "acme", "products") > 0
    finally:
        lane.close()


def test_a_schema_made_by_a_newer_synclane_is_refused(app, db, dsn, schema):
    db.execute(
        sql.SQL("INSERT INTO {} (version) VALUES (99)").format(table(schema, "schema_version"))
    )

    with pytest.raises(SchemaError, match=r"(?s)newer synclane.*99"):
        app.migrate()
    with pytest.raises(SchemaError, match=r"(?s)newer synclane.*99"):
        SyncLane(dsn, schema=schema)


def test_docs_schema_sql_is_the_ddl_the_package_applies():
    assert DOCS_SCHEMA.read_text(encoding="utf-8") == schema_ddl("synclane")


def test_docs_schema_sql_applies_and_can_be_applied_again(db):
    """Teams that run their own migrations apply docs/schema.sql as it is (rolled back here)."""
    ddl = DOCS_SCHEMA.read_text(encoding="utf-8")
    with db.transaction(force_rollback=True):
        db.execute(ddl)
        db.execute(ddl)
        row = db.execute('SELECT max(version) FROM "synclane".schema_version').fetchone()
        assert row == (SCHEMA_VERSION,)


def _make_version(db: psycopg.Connection, schema: str, version: int) -> None:
    """The table as an older synclane left it, as far as the upgrade tests look: versions 2 and
    3 had the index jobs_open_lanes (version 4 drops it), 1 did not."""
    if version in (2, 3):
        db.execute(
            sql.SQL(
                "CREATE INDEX jobs_open_lanes ON {} (queue, lane)"
                " WHERE status IN ('pending', 'failed', 'deferred')"
            ).format(table(schema))
        )
    db.execute(sql.SQL("DELETE FROM {}").format(table(schema, "schema_version")))
    db.execute(
        sql.SQL("INSERT INTO {} (version) VALUES (%s)").format(table(schema, "schema_version")),
        [version],
    )


def _make_version_1(db: psycopg.Connection, schema: str) -> None:
    _make_version(db, schema, 1)


def _has_index(db: psycopg.Connection, schema: str, name: str) -> bool:
    found = db.execute(
        "SELECT count(*) FROM pg_indexes WHERE schemaname = %s AND indexname = %s", [schema, name]
    ).fetchone()
    return found == (1,)


def test_a_version_1_schema_is_upgraded_in_place_and_keeps_its_rows(app, db, dsn, schema):
    job_id = insert_job(db, schema)
    _make_version_1(db, schema)

    upgraded = SyncLane(dsn, schema=schema)
    try:
        assert upgraded.migrate() == SCHEMA_VERSION
    finally:
        upgraded.close()

    assert _has_index(db, schema, "jobs_claim_lane") and _has_index(db, schema, "jobs_held_lease")
    assert not _has_index(db, schema, "jobs_open_lanes")
    versions = db.execute(
        sql.SQL("SELECT version FROM {} ORDER BY version").format(table(schema, "schema_version"))
    ).fetchall()
    assert versions == [(1,), (SCHEMA_VERSION,)]
    assert db.execute(sql.SQL("SELECT id FROM {}").format(table(schema))).fetchall() == [(job_id,)]


def _checks(db: psycopg.Connection, schema: str) -> dict[str, str]:
    """The checks of jobs by name: their definitions, each marked when it is not validated."""
    rows = db.execute(
        "SELECT conname, pg_get_constraintdef(oid) || CASE WHEN convalidated THEN ''"
        " ELSE ' (not validated)' END FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype = 'c'",
        [f'"{schema}".jobs'],
    ).fetchall()
    return dict(rows)


def _version_7_checks(db: psycopg.Connection, schema: str) -> None:
    """The jobs table's checks as version 7 wrote them."""
    db.execute(
        sql.SQL(
            "ALTER TABLE {} DROP CONSTRAINT jobs_mode_check, DROP CONSTRAINT jobs_status_check,"
            " DROP CONSTRAINT jobs_check,"
            " ADD CONSTRAINT jobs_mode_check CHECK (mode IN ('initial', 'recurring', 'manual')),"
            " ADD CONSTRAINT jobs_status_check CHECK (status IN ('pending', 'running',"
            " 'completed', 'failed', 'deferred', 'abandoned', 'cancelled')),"
            " ADD CONSTRAINT jobs_check"
            " CHECK (window_start IS NULL OR window_end IS NULL OR window_start < window_end)"
        ).format(table(schema))
    )
    _make_version(db, schema, 7)


def test_an_upgrade_whose_check_of_old_rows_a_statement_timeout_cuts_short_still_upgrades(
    app, db, dsn, schema, caplog
):
    """migrate() checks the rows of a version-7 table against the new checks after the upgrade
    committed, one scan of the table; under a role's statement_timeout that scan raised a bare
    QueryCanceled from a migration that had succeeded. It says what to run instead; the new
    checks refuse new writes all the same, and running what it says validates them."""
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key) "
            "SELECT 'q', 'o' || n, 'l' || (n % 50), 't', 'manual', 'k' || n "
            "FROM generate_series(1, 300000) n"
        ).format(table(schema))
    )
    _version_7_checks(db, schema)
    hurried = psycopg.conninfo.make_conninfo(dsn, options="-c statement_timeout=15")
    with caplog.at_level(logging.WARNING, logger="synclane"):
        upgraded = SyncLane(hurried, schema=schema)
        upgraded.close()
    assert "statement_timeout" in caplog.text and "validate_checks()" in caplog.text, caplog.text
    versions = sql.SQL("SELECT max(version) FROM {}").format(table(schema, "schema_version"))
    assert db.execute(versions).fetchone() == (SCHEMA_VERSION,)
    assert any(text.endswith("(not validated)") for text in _checks(db, schema).values())
    db.execute(sql.SQL("SELECT {}()").format(sql.Identifier(schema, "validate_checks")))
    assert not any(text.endswith("(not validated)") for text in _checks(db, schema).values())


def test_a_version_7_table_gets_the_cheaper_checks_which_refuse_what_they_refused(
    app, db, dsn, schema
):
    """Version 8 writes the jobs table's checks in the form PostgreSQL reads fastest (it reads
    them again for every statement that writes jobs): a table of version 7 gets them in place,
    under the same names, with its rows, added without reading the rows under the table's lock
    and validated by migrate() afterwards; they let through and refuse the same rows."""
    fresh = _checks(db, schema)
    job_id = insert_job(db, schema)
    _version_7_checks(db, schema)
    assert "ARRAY[" in _checks(db, schema)["jobs_status_check"]

    upgraded = SyncLane(dsn, schema=schema)
    try:
        assert upgraded.migrate() == SCHEMA_VERSION
    finally:
        upgraded.close()

    checks = _checks(db, schema)
    assert checks == fresh  # validated, as a new table's are
    assert not any(text.endswith("(not validated)") for text in checks.values())
    assert set(checks) == {
        "jobs_mode_check",
        "jobs_status_check",
        "jobs_check",
        "jobs_processed_count_check",
    }
    assert not any("ARRAY[" in text or "IS NULL" in text for text in checks.values())
    assert db.execute(sql.SQL("SELECT id FROM {}").format(table(schema))).fetchall() == [(job_id,)]
    insert = sql.SQL(
        "INSERT INTO {} (queue, owner, lane, type, mode, status, dedup_key, window_start,"
        " window_end) VALUES ('shops', 'acme', 'acme', 'orders', %s, %s, %s, %s, %s)"
    ).format(table(schema))
    refused = [
        ("jobs_mode_check", ("weekly", "pending", "a", None, None)),
        ("jobs_status_check", ("manual", "done", "b", None, None)),
        ("jobs_check", ("initial", "pending", "c", "2026-01-02", "2026-01-02")),
        ("jobs_check", ("initial", "pending", "d", "2026-01-03", "2026-01-02")),
    ]
    for name, values in refused:
        with pytest.raises(errors.CheckViolation) as caught, db.transaction():
            db.execute(insert, values)
        assert caught.value.diag.constraint_name == name
    # a window with one end open passes, as it did
    for key, start, end in (("e", "2026-01-01", None), ("f", None, "2026-01-01")):
        db.execute(insert, ("initial", "completed", key, start, end))


def test_a_row_that_breaks_a_check_does_not_stop_the_upgrade_or_get_lost(
    app, db, dsn, schema, caplog
):
    """The upgrade to version 8 adds the checks without reading the rows under the table's lock
    (NOT VALID), then validates them in a transaction of its own. A row written while a check was
    off (here a status check added NOT VALID after it) does not stop the upgrade: the row stays,
    the check refuses new writes, the log says how to fix it, and validate_checks() validates
    the check once the row is fixed."""
    job_id = insert_job(db, schema)
    jobs = table(schema)
    db.execute(
        sql.SQL(
            "ALTER TABLE {} DROP CONSTRAINT jobs_mode_check, DROP CONSTRAINT jobs_status_check,"
            " DROP CONSTRAINT jobs_check"
        ).format(jobs)
    )
    db.execute(sql.SQL("UPDATE {} SET status = 'bogus' WHERE id = %s").format(jobs), [job_id])
    db.execute(
        sql.SQL(
            "ALTER TABLE {}"
            " ADD CONSTRAINT jobs_mode_check CHECK (mode IN ('initial', 'recurring', 'manual')),"
            " ADD CONSTRAINT jobs_status_check CHECK (status IN ('pending', 'running',"
            " 'completed', 'failed', 'deferred', 'abandoned', 'cancelled')) NOT VALID,"
            " ADD CONSTRAINT jobs_check"
            " CHECK (window_start IS NULL OR window_end IS NULL OR window_start < window_end)"
        ).format(jobs)
    )
    _make_version(db, schema, 7)

    upgraded = SyncLane(dsn, schema=schema)
    try:
        with caplog.at_level(logging.WARNING, logger="synclane"):
            assert upgraded.migrate() == SCHEMA_VERSION
    finally:
        upgraded.close()

    checks = _checks(db, schema)
    assert checks["jobs_status_check"].endswith("(not validated)")
    assert "ARRAY[" not in checks["jobs_status_check"]
    assert not checks["jobs_mode_check"].endswith("(not validated)")
    assert not checks["jobs_check"].endswith("(not validated)")
    (warning,) = [r.getMessage() for r in caplog.records if "jobs_status_check" in r.getMessage()]
    assert f'"{schema}".validate_checks()' in warning
    rows = db.execute(sql.SQL("SELECT id, status FROM {}").format(jobs)).fetchall()
    assert rows == [(job_id, "bogus")]
    with pytest.raises(errors.CheckViolation), db.transaction():
        db.execute(sql.SQL("UPDATE {} SET status = 'wrong' WHERE id = %s").format(jobs), [job_id])

    db.execute(sql.SQL("UPDATE {} SET status = 'failed' WHERE id = %s").format(jobs), [job_id])
    validate = sql.SQL("SELECT {}()").format(sql.Identifier(schema, "validate_checks"))
    assert db.execute(validate).fetchone() == ([],)
    assert _checks(db, schema)["jobs_status_check"] == checks["jobs_status_check"].removesuffix(
        " NOT VALID (not validated)"
    )


@pytest.mark.parametrize("documented_drop_first", [False, True])
def test_a_version_3_schema_loses_the_index_no_statement_reads(
    app, db, dsn, schema, documented_drop_first
):
    job_id = insert_job(db, schema)
    _make_version(db, schema, 3)
    assert _has_index(db, schema, "jobs_open_lanes")
    if documented_drop_first:
        db.execute(operations_sql("upgrade_4", schema))  # docs/operations.md, as written
        assert not _has_index(db, schema, "jobs_open_lanes")

    upgraded = SyncLane(dsn, schema=schema)
    try:
        assert upgraded.migrate() == SCHEMA_VERSION
    finally:
        upgraded.close()

    assert not _has_index(db, schema, "jobs_open_lanes")
    assert db.execute(sql.SQL("SELECT id FROM {}").format(table(schema))).fetchall() == [(job_id,)]


def test_create_schema_false_on_a_version_1_schema_asks_for_a_migration(app, db, dsn, schema):
    _make_version_1(db, schema)

    older = SyncLane(dsn, schema=schema, create_schema=False)
    try:
        with pytest.raises(
            SchemaError, match=rf"version 1, this synclane needs {SCHEMA_VERSION}: run app.migr"
        ):
            older.check_schema()
    finally:
        older.close()
    versions = db.execute(sql.SQL("SELECT version FROM {}").format(table(schema, "schema_version")))
    assert versions.fetchall() == [(1,)]  # nothing was upgraded


@pytest.mark.processes
def test_eight_processes_starting_at_once_all_succeed(dsn, db, schema):
    reports = apps.run_together(apps.start_at_once, 8, dsn, schema)

    assert reports == [("ok", "")] * 8
    versions = db.execute(
        sql.SQL("SELECT version FROM {}").format(table(schema, "schema_version"))
    ).fetchall()
    assert versions == [(SCHEMA_VERSION,)]


def test_the_two_unique_indexes_exist(app, db, schema):
    definitions = sorted(
        definition.split(" USING btree ")[1]
        for definition in index_definitions(db, schema).values()
        if definition.startswith("CREATE UNIQUE INDEX")
    )
    assert definitions == [
        "(id)",  # the primary key
        # a running job holds a slot of its lane (one slot, 0, in a lane one wide) ...
        "(queue, lane, lane_slot) WHERE (status = 'running'::text)",
        "(queue, owner, type, dedup_key)",
        # ... and a live lease holds a slot of its queue, when the queue has max_running
        "(queue, queue_slot) WHERE ((queue_slot IS NOT NULL) AND (lease_token IS NOT NULL))",
    ]


def test_a_second_row_with_the_same_dedup_key_conflicts(app, db, schema):
    insert_job(db, schema, key="initial:2024-01-01T00:00:00Z")
    # The same key is fine for another owner or another queue.
    insert_job(db, schema, owner="globex", lane="globex", key="initial:2024-01-01T00:00:00Z")
    insert_job(db, schema, queue="other", key="initial:2024-01-01T00:00:00Z")

    with pytest.raises(errors.UniqueViolation):
        insert_job(db, schema, lane="elsewhere", key="initial:2024-01-01T00:00:00Z")


def test_a_lane_cannot_have_two_running_jobs(app, db, schema):
    # Two owners that share the lane 'acme', and one job of another lane.
    first = insert_job(db, schema, owner="acme-us", lane="acme", key="manual:1")
    second = insert_job(db, schema, owner="acme-eu", lane="acme", key="manual:2")
    other_lane = insert_job(db, schema, owner="globex", lane="globex", key="manual:3")
    other_queue = insert_job(db, schema, queue="other", lane="acme", key="manual:4")
    run = sql.SQL("UPDATE {} SET status = 'running' WHERE id = %s").format(table(schema))

    db.execute(run, [first])
    db.execute(run, [other_lane])
    db.execute(run, [other_queue])
    with pytest.raises(errors.UniqueViolation):
        db.execute(run, [second])

    # Once the first finishes, the lane is free again.
    db.execute(
        sql.SQL("UPDATE {} SET status = 'completed' WHERE id = %s").format(table(schema)), [first]
    )
    db.execute(run, [second])


def test_a_schema_name_with_quotes_and_spaces_is_an_identifier(dsn, db):
    weird = f'we"ird schema; {uuid.uuid4().hex[:8]}'
    lane = SyncLane(dsn, schema=weird)
    try:
        shops = lane.queue("shops")
        shops.owners(lambda queue: [Owner("acme-us", lane="acme"), Owner("globex")])

        @shops.windowed("orders", horizon=60 * 86400, slice=30 * 86400, every=900)
        def orders(job: Job) -> Page:
            return Page(None)

        assert schema_exists(db, weird)
        assert lane.plan() == {"shops": 6}
        assert lane.plan() == {"shops": 0}
        manual = lane.enqueue("shops", "acme-us", "orders", dedup_key="manual:x")
        assert lane.enqueue("shops", "acme-us", "orders", dedup_key="manual:x") == manual
        assert lane.cancel("shops", "globex", "disconnected") == 3
        assert lane.requeue("shops", include_cancelled=True) == 3
        assert len(lane.jobs("shops")) == 7
        assert set(lane.progress("shops")["owner"]) == {"acme-us", "globex"}
        count = db.execute(sql.SQL("SELECT count(*) FROM {}").format(table(weird))).fetchone()
        assert count == (7,)
        assert not schema_exists(db, "we"), "the name was split instead of quoted"
    finally:
        lane.close()
        db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(weird)))


def test_a_statement_is_sent_without_its_comments_and_named_on_its_first_line():
    text = """-- what it does
SELECT 'a -- b' AS kept,  -- a trailing note
       '--' || x AS also  -- another
FROM t
    -- an indented note
WHERE y = 'it''s -- here'"""

    assert compact("probe", text) == (
        "-- synclane: probe\n"
        "SELECT 'a -- b' AS kept,\n"
        "'--' || x AS also\n"
        "FROM t\n"
        "WHERE y = 'it''s -- here'"
    )


def test_every_statement_fits_psycopgs_cache_except_the_ones_run_raw():
    # psycopg keeps the conversion of statements up to 4 KiB; the two take statements, which
    # are longer, run through a raw cursor instead (positional placeholders, no conversion), and
    # so does progress() (the SDK runs a read raw when it does not fit: Store.fits_cache)
    store = Store("synclane")
    long = {name for name in QUERIES if len(store.text(name).encode("utf-8")) > 4096}
    assert long <= {"take_front", "take_by_lane", "progress"}, long
    assert {name for name in QUERIES if not store.fits_cache(name)} == long


def test_positional_numbers_each_name_once_in_order_of_first_use():
    text, names = positional("SELECT %(a)s, %(b)s, %(a)s, 100 %% 7")

    assert text == "SELECT $1, $2, $1, 100 % 7"
    assert names == ("a", "b")


def test_a_version_4_schema_gets_wakes_instead_of_hints_written_by_its_statements(
    app, db, dsn, schema
):
    """Version 5 replaces version 4's hint machinery: the insert trigger that wrote lanes goes,
    unpark_lane (which a version-4 worker still running calls) does nothing, and a lane that a
    version-4 look had parked (due_at NULL, with open jobs) is read again by the next look."""
    insert_job(db, schema, owner="acme", lane="acme", key="manual:1")
    lanes = table(schema, "lanes")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, lane, due_at) VALUES ('shops', 'acme', NULL)"
            " ON CONFLICT (queue, lane) DO UPDATE SET due_at = NULL"
        ).format(lanes)
    )
    db.execute(sql.SQL("DELETE FROM {}").format(table(schema, "lane_wakes")))
    _make_version(db, schema, 4)

    upgraded = SyncLane(dsn, schema=schema)
    try:
        assert upgraded.migrate() == SCHEMA_VERSION
    finally:
        upgraded.close()
    (body,) = db.execute(
        "SELECT prosrc FROM pg_proc WHERE oid = %s::regprocedure",
        [f'"{schema}".unpark_lane(text, text, timestamptz, bigint)'],
    ).fetchone()
    assert "UPDATE" not in body
    triggers = db.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass ORDER BY tgname",
        [f'"{schema}".jobs'],
    ).fetchall()
    assert triggers == [
        ("jobs_unsettle_changed",),  # version 7: the ends of the planner's marks
        ("jobs_unsettle_deleted",),
        ("jobs_unsettle_truncated",),
        ("jobs_wake_changed_lanes",),
        ("jobs_wake_new_lanes",),
    ]
    wakes = db.execute(
        sql.SQL("SELECT queue, lane FROM {}").format(table(schema, "lane_wakes"))
    ).fetchall()
    assert wakes == [("shops", "acme")]
    # a worker of version 3, still running while the schema moved on, counts its page starts
    # the way it did: without a key
    call = sql.SQL("SELECT {}('q', 'old', 1, interval '1 hour', 1, false)").format(
        sql.Identifier(schema, "lane_page_start")
    )
    assert db.execute(call).fetchone() == (0,)
    assert db.execute(call).fetchone()[0] > 0  # the lane's one start an hour is used


@pytest.mark.parametrize("beating", [True, False])
def test_a_version_4_schema_with_a_live_worker_is_not_upgraded_under_it(
    app, db, dsn, schema, beating
):
    """A worker of version 4 still running would write hints that version 5 does not read, and
    its take can crash PostgreSQL: the upgrade names it and waits for it to stop. A worker whose
    beat has expired (it died) does not stop the upgrade."""
    db.execute(
        sql.SQL(
            "INSERT INTO {} (name, instance, host, pid, version, queues, slots, expires_at)"
            " VALUES ('old-1:7', gen_random_uuid(), 'old-1', 7, '0.3.0', '{{shops}}', 4,"
            " now() + %s * interval '1 minute')"
        ).format(table(schema, "workers")),
        [1 if beating else -1],
    )
    _make_version(db, schema, 4)

    if beating:
        with pytest.raises(SchemaError, match=r"old-1:7 \(synclane 0\.3\.0\); stop them"):
            SyncLane(dsn, schema=schema)
        versions = db.execute(
            sql.SQL("SELECT version FROM {}").format(table(schema, "schema_version"))
        )
        assert versions.fetchall() == [(4,)]
    else:
        SyncLane(dsn, schema=schema).close()
        versions = db.execute(
            sql.SQL("SELECT max(version) FROM {}").format(table(schema, "schema_version"))
        )
        assert versions.fetchone() == (SCHEMA_VERSION,)


def test_statements_are_sent_as_psycopg_would_encode_them(db):
    # Store keeps each statement as bytes (psycopg would encode a composed statement again at
    # every execution); those bytes are what psycopg makes of it on a real connection, quotes in
    # the schema's name included. A statement that is not ASCII (a name, or an ellipsis in the
    # text of two reads) stays composed: its bytes depend on the connection's client encoding.
    for schema in ("quo\"te sch'ema", "synclane"):
        store = Store(schema)
        for name, text in QUERIES.items():
            composed = render(compact(name, text), schema)
            sent = store.query(name)
            assert sent == (
                composed.as_bytes(db) if composed.as_string(None).isascii() else composed
            )
        raw = positional(compact("take_front", QUERIES["take_front"]))[0]
        assert store.positional("take_front")[0] == render(raw, schema).as_bytes(db)
    assert not isinstance(Store("🛒 shop").query("save_pages"), bytes)
    assert not isinstance(Store("🛒 shop").positional("take_front")[0], bytes)
