"""The notebook SDK's reads at a hundred thousand owners (issue 14, docs/sdk.md "Cost"):
`progress()` answers at most `limit` rows and says when it cut, its `state=` lookup of the owners
still loading gives the full answer filtered, and `lanes()` and `depth()`, counted from the index
of waiting rows, agree with a count of every open row. The table holds every state at once, as
a user with UPDATE or a busy day would leave it."""

from __future__ import annotations

import warnings
from datetime import timedelta

import pandas as pd
import psycopg
import pytest
from apps import done
from psycopg import sql
from workers import database_now

from synclane import ConfigError, SyncLane
from synclane.frames import STATES

OPEN = ("pending", "running", "failed", "deferred")
WAITING = ("pending", "failed", "deferred")

# Owner o (1..70) is in lane o % 9. Its history is four 30-day slices of orders, newest first
# (s = 1); o % 7 chooses how far its first load is. Running jobs sit in distinct lanes (1, 8, 3).
HISTORY = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, window_start, window_end, dedup_key,
                    processed_count, attempt_count, error, next_run_at, created_at, started_at,
                    completed_at, leased_by, lease_token, lease_expires_at)
SELECT 'shops', 'owner-' || lpad(o::text, 3, '0'), 'lane-' || (o %% 9), 'orders', 'initial',
       st.status, m.midnight - s * interval '30 days', m.midnight - (s - 1) * interval '30 days',
       'initial:' || s, CASE WHEN st.status = 'completed' THEN 100 * o + s ELSE 7 END, 1,
       st.error, now() + st.wait, now() - interval '3 days', now() - interval '50 minutes',
       CASE WHEN st.status IN ('completed', 'abandoned', 'cancelled')
            THEN now() - (o %% 5) * interval '20 minutes' END,
       CASE WHEN st.status = 'running' THEN 'worker-1' END,
       CASE WHEN st.status = 'running' THEN gen_random_uuid() END,
       CASE WHEN st.status = 'running' THEN now() + interval '5 minutes' END
FROM (SELECT date_trunc('day', now()) AS midnight) m,
     generate_series(1, 70) o,
     generate_series(1, 4) s,
     LATERAL (
         SELECT CASE
             WHEN o %% 7 = 0 THEN 'completed'
             -- loading: the newest slice loaded, the next one running (or waiting), the rest wait
             -- (owner 1's only slice not loaded runs)
             WHEN o = 1 THEN CASE WHEN s = 2 THEN 'running' ELSE 'completed' END
             WHEN o %% 7 = 1 AND s = 1 THEN 'completed'
             WHEN o %% 7 = 1 AND s = 2 AND o <= 9 THEN 'running'
             WHEN o %% 7 = 1 THEN 'pending'
             -- failing: a slice waits for its retry (the newest one for some), or is deferred
             WHEN o %% 7 = 2 AND s = CASE WHEN o %% 3 = 0 THEN 1 ELSE 2 END
             THEN CASE WHEN o %% 14 = 9 THEN 'deferred' ELSE 'failed' END
             WHEN o %% 7 = 2 THEN 'completed'
             -- throttled: a throttle (or only its push) holds the older slices back
             WHEN o %% 7 = 3 AND s = 1 THEN 'completed'
             WHEN o %% 7 = 3 AND s = 2 AND o %% 21 <> 10 THEN 'failed'
             WHEN o %% 7 = 3 THEN 'pending'
             WHEN o %% 7 = 4 AND s = 3 THEN 'abandoned'
             WHEN o %% 7 = 5 AND s >= 3 THEN 'cancelled'
             WHEN o %% 7 = 6 THEN 'pending'
             ELSE 'completed' END AS status
     ) raw,
     LATERAL (
         SELECT raw.status,
                CASE WHEN raw.status = 'abandoned' THEN 'Abandon: account revoked'
                     WHEN raw.status IN ('failed', 'deferred') AND o %% 7 = 3
                     THEN 'Throttled: 429 slow down'
                     WHEN raw.status IN ('failed', 'deferred')
                     THEN 'RuntimeError: order ' || o || ' not found' END AS error,
                CASE WHEN o %% 7 = 3 AND raw.status IN ('failed', 'pending')
                     THEN interval '20 minutes'
                     WHEN raw.status IN ('failed', 'deferred') THEN interval '1 hour'
                     ELSE interval '-3 days' END AS wait
     ) st
"""
# Three refreshes of orders each: the newest waits (due) for even owners, and owner 3's runs;
# some older ones failed with a throttle, or are deferred after a 503.
REFRESHES = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, window_start, window_end, dedup_key,
                    attempt_count, error, next_run_at, created_at, started_at, completed_at,
                    leased_by, lease_token, lease_expires_at)
SELECT 'shops', 'owner-' || lpad(o::text, 3, '0'), 'lane-' || (o %% 9), 'orders', 'recurring',
       st.status, now() - (4 - k) * interval '15 minutes' - interval '20 minutes',
       now() - (4 - k) * interval '15 minutes', 'recurring:' || k, 1,
       CASE st.status WHEN 'failed' THEN 'Throttled: 429 slow down'
                      WHEN 'deferred' THEN 'ShopUnavailable: 503 (request ' || o || ')' END,
       now() + CASE st.status WHEN 'failed' THEN interval '40 minutes'
                              WHEN 'deferred' THEN interval '-1 minute'
                              ELSE interval '-2 minutes' END,
       now() - (4 - k) * interval '15 minutes' - (o %% 13) * interval '1 minute',
       now() - interval '2 minutes',
       CASE WHEN st.status = 'completed' THEN now() - interval '1 minute' END,
       CASE WHEN st.status = 'running' THEN 'worker-2' END,
       CASE WHEN st.status = 'running' THEN gen_random_uuid() END,
       CASE WHEN st.status = 'running' THEN now() + interval '5 minutes' END
FROM generate_series(1, 70) o,
     generate_series(1, 3) k,
     LATERAL (
         SELECT CASE WHEN k = 3 AND o = 3 THEN 'running'
                     WHEN k = 3 AND o %% 2 = 0 THEN 'pending'
                     WHEN k = 2 AND o %% 5 = 0 THEN 'failed'
                     WHEN k = 1 AND o %% 11 = 0 THEN 'deferred'
                     ELSE 'completed' END AS status
     ) st
"""
# One products snapshot each (waiting for the owners that are connecting); a lane whose only
# open job runs, and one whose only open job waits out a throttle; two lane pauses, one over.
OTHERS = [
    """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, dedup_key, next_run_at, created_at,
                    completed_at)
SELECT 'shops', 'owner-' || lpad(o::text, 3, '0'), 'lane-' || (o %% 9), 'products', 'initial',
       CASE WHEN o %% 7 = 6 THEN 'pending' ELSE 'completed' END, 'initial',
       now() - interval '1 day', now() - interval '1 day',
       CASE WHEN o %% 7 <> 6 THEN now() - interval '1 day' END
FROM generate_series(1, 70) o
""",
    """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, dedup_key, started_at, leased_by,
                    lease_token, lease_expires_at)
VALUES ('shops', 'solo', 'lane-solo', 'products', 'manual', 'running', 'manual:1',
        now() - interval '30 seconds', 'worker-3', gen_random_uuid(), now() + interval '1 minute')
""",
    """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, dedup_key, error, next_run_at)
VALUES ('shops', 'calm', 'lane-calm', 'products', 'manual', 'failed', 'manual:2',
        'Throttled: 429 slow down', now() + interval '10 minutes')
""",
    """
INSERT INTO {lanes} (queue, lane, paused_until)
VALUES ('shops', 'lane-4', now() + interval '2 hours'),
       ('shops', 'lane-5', now() - interval '1 hour')
ON CONFLICT (queue, lane) DO UPDATE SET paused_until = excluded.paused_until
""",
]


@pytest.fixture
def busy(app: SyncLane, db: psycopg.Connection, schema: str) -> SyncLane:
    queue = app.queue("shops")
    queue.windowed(
        "orders",
        horizon=timedelta(days=120),
        slice=timedelta(days=30),
        every=timedelta(minutes=15),
    )(done)
    queue.snapshot("products", every=timedelta(days=1))(done)
    tables = {"jobs": sql.Identifier(schema, "jobs"), "lanes": sql.Identifier(schema, "lanes")}
    for statement in (HISTORY, REFRESHES, *OTHERS):
        db.execute(sql.SQL(statement).format(**tables), {})
    db.execute(sql.SQL("ANALYZE {}").format(tables["jobs"]))
    return app


def steady(frame: pd.DataFrame) -> pd.DataFrame:
    """Without the ETA, which moves with the clock between two calls."""
    return frame.drop(columns="eta").reset_index(drop=True)


# -- progress() --------------------------------------------------------------------------------


def test_progress_asked_for_some_states_is_the_full_answer_filtered(busy: SyncLane) -> None:
    full = busy.progress("shops", limit=None)
    assert set(full["state"]) == set(STATES)  # the table holds every state

    asked: list[list[str]] = [[state] for state in STATES]
    asked += [["failing", "abandoned"], ["throttled", "cancelled"], ["loaded", "failing"]]
    for states in asked:
        found = busy.progress("shops", state=states, limit=None)
        expected = full[full["state"].isin(states)]
        assert len(found) == len(expected) > 0, states
        pd.testing.assert_frame_equal(steady(found), steady(expected))
    narrowed = busy.progress("shops", type="orders", state="failing")
    expected = full[(full["state"] == "failing") & (full["type"] == "orders")]
    pd.testing.assert_frame_equal(steady(narrowed), steady(expected))


def test_progress_returns_the_first_owners_up_to_limit_and_warns_when_it_cuts(
    busy: SyncLane,
) -> None:
    full = busy.progress("shops", limit=None)

    with pytest.warns(UserWarning, match=r"first 10 owners and types.*limit=None"):
        first = busy.progress("shops", limit=10)
    pd.testing.assert_frame_equal(steady(first), steady(full.head(10)))

    loaded = full[full["state"] == "loaded"]
    with pytest.warns(UserWarning, match="first 3 "):
        some = busy.progress("shops", state="loaded", limit=3)
    pd.testing.assert_frame_equal(steady(some), steady(loaded.head(3)))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an answer that fits is not cut, and says nothing
        whole = busy.progress("shops", limit=len(full))
        default = busy.progress("shops")  # 141 rows: well within the default limit
    pd.testing.assert_frame_equal(steady(whole), steady(full))
    pd.testing.assert_frame_equal(steady(default), steady(full))


@pytest.mark.parametrize("limit", [0, -1, True, 2.5, "10"])
def test_progress_limit_must_be_a_whole_number_or_none(busy: SyncLane, limit: object) -> None:
    with pytest.raises(ConfigError, match=r"limit=.*whole number from 1 to 1,000,000, or None"):
        busy.progress("shops", limit=limit)  # type: ignore[arg-type]


# -- lanes() and depth() -----------------------------------------------------------------------


def every_open_job(app: SyncLane) -> pd.DataFrame:
    return app.jobs(status=list(OPEN), limit=100_000)


def test_lanes_agree_with_a_count_of_every_open_row(
    busy: SyncLane, db: psycopg.Connection, schema: str
) -> None:
    jobs = every_open_job(busy)
    now = pd.Timestamp(database_now(db))
    pauses = dict(
        db.execute(
            sql.SQL("SELECT lane, paused_until FROM {} WHERE paused_until > now()").format(
                sql.Identifier(schema, "lanes")
            )
        ).fetchall()
    )

    frame = busy.lanes()

    assert list(frame["lane"]) == sorted(set(jobs["lane"]))
    assert "lane-solo" in set(frame["lane"])  # a lane whose only open job runs
    assert frame.set_index("lane").loc["lane-calm", "paused_until"] > now
    for row in frame.itertuples():
        mine = jobs[jobs["lane"] == row.lane]
        waiting = mine[mine["status"].isin(WAITING)]
        retrying = mine[mine["status"].isin(("pending", "failed"))]
        running = mine[mine["status"] == "running"]
        assert row.waiting == len(waiting), row.lane
        assert row.due == int((retrying["next_run_at"] <= now).sum()), row.lane
        assert row.next_due == retrying["next_run_at"].min() or (
            pd.isna(row.next_due) and retrying.empty
        )
        if running.empty:
            assert pd.isna(row.job_id) and pd.isna(row.owner)
        else:
            assert (row.job_id, row.owner) == (running["id"].iloc[0], running["owner"].iloc[0])
        throttled = mine[
            mine["status"].isin(("failed", "deferred"))
            & (mine["next_run_at"] > now)
            & mine["error"].str.startswith("Throttled").fillna(False)
        ]["next_run_at"]
        candidates = [*throttled, *([pauses[row.lane]] if row.lane in pauses else [])]
        expected = max(candidates) if candidates else None
        if expected is None:
            assert pd.isna(row.paused_until), row.lane
        else:
            assert row.paused_until == pd.Timestamp(expected), row.lane
    assert frame["paused_until"].notna().any()
    assert list(busy.lanes("shops", lane="lane-4")["lane"]) == ["lane-4"]


def test_depth_agrees_with_a_count_of_every_open_row(
    busy: SyncLane, db: psycopg.Connection
) -> None:
    jobs = every_open_job(busy)
    now = pd.Timestamp(database_now(db))

    def expected(rows: pd.DataFrame) -> list[tuple[object, ...]]:
        found = []
        for (queue, lane, status), group in rows.groupby(
            ["queue", "lane", "status"], observed=True
        ):
            due = group["status"].isin(("pending", "failed")) & (group["next_run_at"] <= now)
            next_run = None if status == "running" else group["next_run_at"].min()
            owners = group["owner"].nunique()
            found.append((queue, lane, status, len(group), int(due.sum()), owners, next_run))
        return sorted(found, key=lambda row: (row[0], row[1], OPEN.index(str(row[2]))))

    def answered(frame: pd.DataFrame) -> list[tuple[object, ...]]:
        return [
            (
                row.queue,
                row.lane,
                row.status,
                row.jobs,
                row.due,
                row.owner_count,
                None if pd.isna(row.next_run_at) else row.next_run_at,
            )
            for row in frame.itertuples()
        ]

    assert answered(busy.depth()) == expected(jobs)
    products = jobs[jobs["type"] == "products"]
    assert answered(busy.depth(type="products")) == expected(products)
    assert answered(busy.depth(status=["running", "deferred"])) == expected(
        jobs[jobs["status"].isin(("running", "deferred"))]
    )
    one = jobs[jobs["owner"] == "owner-003"]
    assert answered(busy.depth("shops", "owner-003")) == expected(one)
    ages = busy.depth().set_index(["lane", "status"])["age"]
    oldest = jobs.groupby(["lane", "status"], observed=True)["created_at"].min()
    for key, created in oldest.items():
        assert abs(ages[key] - (now - created)) < timedelta(seconds=5), key
