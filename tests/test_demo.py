"""The demo's story, in fast-forward: lanes take turns, newest first, retries continue from their
cursor, the broken globex slice is deferred then abandoned at cursor 50, the shop fixes its
record, and a requeue loads the slice from cursor 50.

The test plays the story once with a worker in a thread, then checks each promise from the
database: synclane's jobs table, the handlers' record of every page (`runs`, on the database
clock) and the shop's access log (`fetches`); and the story's own lines (synclane.demo.story)
from what the story said."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from workers import job_row

from synclane.demo import FIX_AFTER, OWNERS, Demo, build_demo
from synclane.demo.shop import BROKEN_CURSOR, SCRIPTED, catalogue, orders_between
from synclane.demo.story import Story as Teller
from synclane.testing import running_worker, wait_for

SPEED = 0.05  # twenty times faster than `synclane demo`
ACCOUNTS = [owner.id for owner in OWNERS]
NEVER = datetime.max.replace(tzinfo=UTC)


@pytest.fixture
def demo(dsn: str, schema: str) -> Iterator[Demo]:
    data_schema = f"{schema}_demo"
    demo = build_demo(dsn, schema=schema, speed=SPEED, data_schema=data_schema, record_runs=True)
    # The story is the first plan; a refresh period that begins mid-test must not add to it.
    demo.app.plan_interval = timedelta(hours=1)
    try:
        yield demo
    finally:
        demo.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(data_schema))
            )


@dataclass
class Story:
    demo: Demo
    db: psycopg.Connection[Any]
    planned: dict[int, dict[str, Any]] = field(default_factory=dict)  # the story's jobs, by id
    broken: dict[str, Any] = field(default_factory=dict)  # globex's second-newest history slice
    requeued_at: datetime = NEVER  # set just before the requeue
    said: list[tuple[datetime, str]] = field(default_factory=list)  # the story's lines

    def rows(self, query: str, *params: Any) -> list[dict[str, Any]]:
        """A query whose {jobs} is synclane's table and {runs}, {fetches}, {orders} and
        {products} are the demo schema's tables."""
        names = {t: sql.Identifier(self.demo.data_schema, t) for t in _DEMO_TABLES}
        names["jobs"] = sql.Identifier(self.demo.app.schema, "jobs")
        with self.db.cursor(row_factory=dict_row) as cur:
            cur.execute(sql.SQL(query).format(**names), params)
            return cur.fetchall() if cur.description is not None else []

    def job(self, job_id: int) -> dict[str, Any]:
        return job_row(self.db, self.demo.app.schema, job_id)

    def runs(self) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM {runs} ORDER BY started_at, id")

    def first_runs(self) -> dict[int, datetime]:
        first: dict[int, datetime] = {}
        for run in self.runs():
            first.setdefault(run["job_id"], run["started_at"])
        return first


_DEMO_TABLES = ("runs", "fetches", "faults", "orders", "products")
HISTORY = ("orders", "initial")


def test_the_demo_story_plays_out_in_fast_forward(demo: Demo, db: psycopg.Connection[Any]) -> None:
    app = demo.app
    began = time.monotonic()
    # Per account: products, the newest two of its four history slices, a refresh; each slice
    # that finishes plans the next older one (lazy history).
    assert app.plan("shops") == {"shops": 16}
    story = Story(demo, db)
    first = story.rows("SELECT id, owner, lane, type, mode, window_start, window_end FROM {jobs}")
    globex_history = [
        j for j in first if (j["owner"], j["type"], j["mode"]) == ("globex", "orders", "initial")
    ]
    story.broken = sorted(globex_history, key=lambda j: j["window_start"])[-1 - 1]

    def settled() -> bool:
        """The first plan's jobs and every history slice (all four an account's, 16) completed
        or abandoned: the story's jobs (refreshes of later periods are not)."""
        story.planned = {
            row["id"]: row
            for row in story.rows(
                "SELECT id, owner, lane, type, mode, window_start, window_end, status"
                " FROM {jobs} WHERE id = ANY(%s) OR mode = 'initial'",
                [j["id"] for j in first],
            )
        }
        history = [j for j in story.planned.values() if (j["type"], j["mode"]) == HISTORY]
        done = ("completed", "abandoned")
        return len(history) == 16 and all(j["status"] in done for j in story.planned.values())

    teller = Teller(demo, say=lambda text: story.said.append((datetime.now(UTC), text)))
    with running_worker(app, on_event=teller):
        wait_for(settled, 60, "every planned job to complete or be abandoned")
        check_the_broken_slice_is_abandoned_at_cursor_50(story)
        wait_for(lambda: _said(story, "press Requeue"), 30, "the story to say the shop fixed it")
        story.requeued_at = story.rows("SELECT clock_timestamp() AS now")[0]["now"]
        assert app.requeue("shops", owner="globex") == 1
        wait_for(
            lambda: story.job(story.broken["id"])["status"] == "completed",
            30,
            "the requeued slice to complete",
        )
        wait_for(lambda: _said(story, "the story is over"), 10, "the story's last line")
    teller.close()
    seconds = time.monotonic() - began

    check_a_lane_never_runs_two_pages_at_once(story)
    check_the_acme_accounts_take_turns_in_their_lane(story)
    check_each_account_loads_its_newest_window_first(story)
    check_the_broken_slice_steps_aside_before_its_last_attempt(story)
    check_the_requeued_slice_completes_from_cursor_50(story)
    check_retries_continue_from_their_cursor(story)
    check_the_loaded_rows_are_queryable(story)
    check_the_scripted_429_and_503_happened(story)
    check_the_story_says_each_moment_once_and_in_order(story)
    assert seconds < 30, f"the story took {seconds:.1f} s"


def _said(story: Story, words: str) -> bool:
    return any(words in text for _, text in story.said)


def check_the_broken_slice_is_abandoned_at_cursor_50(story: Story) -> None:
    """Five attempts and the deferred one, all at the broken page; everything else completed."""
    row = story.job(story.broken["id"])
    assert row["status"] == "abandoned"
    assert row["cursor"] == str(BROKEN_CURSOR)
    assert row["attempt_count"] == 6
    assert row["error"].startswith("ShopBrokenPage: globex orders ")
    assert f"the page at cursor {BROKEN_CURSOR} is broken" in row["error"]
    others = story.rows(
        "SELECT status FROM {jobs} WHERE id = ANY(%s) AND id <> %s",
        list(story.planned),
        story.broken["id"],
    )
    assert {r["status"] for r in others} == {"completed"}


def check_a_lane_never_runs_two_pages_at_once(story: Story) -> None:
    """No two recorded pages of one lane overlap in time, though pages of different lanes did:
    the worker had the slots to run a lane twice, and did not."""
    runs = story.runs()
    assert runs and all(r["ended_at"] is not None for r in runs)
    overlapping = (
        "SELECT a.lane, a.job_id AS first, b.job_id AS second FROM {runs} a JOIN {runs} b"
        " ON a.id < b.id AND {pairs}"
        " WHERE tstzrange(a.started_at, a.ended_at) && tstzrange(b.started_at, b.ended_at)"
    )
    assert story.rows(overlapping.replace("{pairs}", "a.lane = b.lane")) == []
    assert story.rows(overlapping.replace("{pairs}", "a.lane <> b.lane")) != []
    assert {r["owner"] for r in runs if r["lane"] == "acme"} == {"acme-us", "acme-eu"}


def check_the_acme_accounts_take_turns_in_their_lane(story: Story) -> None:
    """One account of a lane does not load all its history before the other starts: each one's
    newest orders ran before the other's oldest history."""
    first = story.first_runs()
    starts: dict[str, list[datetime]] = {"acme-us": [], "acme-eu": []}
    for job_id, job in story.planned.items():
        if job["lane"] == "acme" and job["type"] == "orders":
            starts[job["owner"]].append(first[job_id])
    assert min(starts["acme-us"]) < max(starts["acme-eu"])
    assert min(starts["acme-eu"]) < max(starts["acme-us"])


def check_each_account_loads_its_newest_window_first(story: Story) -> None:
    """Per account, orders jobs first ran in the order of their windows: the refresh, then the
    history slices back to the horizon."""
    first = story.first_runs()
    for owner in ACCOUNTS:
        jobs = [j for j in story.planned.values() if j["owner"] == owner and j["type"] == "orders"]
        in_order = sorted(jobs, key=lambda j: first[j["id"]])
        windows = [j["window_start"] for j in in_order]
        assert windows == sorted(windows, reverse=True), owner
        assert [j["mode"] for j in in_order] == ["recurring"] + ["initial"] * 4, owner


def check_the_broken_slice_steps_aside_before_its_last_attempt(story: Story) -> None:
    """Deferred after five attempts: its last attempt ran once the rest of globex was done."""
    runs = story.runs()
    broken = story.broken["id"]
    attempts = [r for r in runs if r["job_id"] == broken and r["started_at"] < story.requeued_at]
    assert [r["cursor"] for r in attempts] == ["0"] + [str(BROKEN_CURSOR)] * 6
    assert [r["outcome"] for r in attempts] == ["ok"] + ["ShopBrokenPage"] * 6
    rest_of_lane = [
        r["ended_at"]
        for r in runs
        if r["lane"] == "globex" and r["job_id"] != broken and r["job_id"] in story.planned
    ]
    assert attempts[-1]["started_at"] > max(rest_of_lane)


def check_the_requeued_slice_completes_from_cursor_50(story: Story) -> None:
    """After the requeue (once the shop had fixed its record) the shop was asked for cursor 50
    and on, never for a page before it, and answered at once; the slice loaded every order of
    its window."""
    fetched = story.rows(
        "SELECT cursor, outcome, fetched_at FROM {fetches} WHERE owner = 'globex'"
        " AND resource = 'orders' AND window_start = %s AND window_end = %s ORDER BY id",
        story.broken["window_start"],
        story.broken["window_end"],
    )
    after = [f for f in fetched if f["fetched_at"] > story.requeued_at]
    assert after and after[0]["cursor"] == str(BROKEN_CURSOR)
    assert all(int(f["cursor"]) >= BROKEN_CURSOR for f in after)
    assert after[0]["outcome"] == "ok", "the record was fixed before the story said Requeue"
    assert [f["cursor"] for f in fetched if f["outcome"] == "ok"].count("0") == 1
    row = story.job(story.broken["id"])
    assert row["status"] == "completed" and row["error"] is None
    expected = orders_between("globex", row["window_start"], row["window_end"])
    assert len(expected) > 2 * BROKEN_CURSOR  # the broken page is a middle page
    assert row["processed_count"] == len(expected)


def check_retries_continue_from_their_cursor(story: Story) -> None:
    """Throttled and failed pages were asked for again, but no page of any window was answered
    twice: every retry started at its job's saved cursor."""
    twice = story.rows(
        "SELECT owner, resource, window_start, cursor, count(*) FROM {fetches}"
        " WHERE outcome = 'ok'"
        " GROUP BY owner, resource, window_start, window_end, cursor HAVING count(*) > 1"
    )
    assert twice == []


def check_the_loaded_rows_are_queryable(story: Story) -> None:
    """Every order of every history slice and every product is in the demo schema."""
    for job_id, job in story.planned.items():
        if job["mode"] != "initial" or job["type"] != "orders":
            continue
        row = story.job(job_id)
        loaded = story.rows(
            "SELECT count(*) AS n FROM {orders}"
            " WHERE owner = %s AND placed_at >= %s AND placed_at < %s",
            job["owner"],
            row["window_start"],
            row["window_end"],
        )
        expected = orders_between(job["owner"], row["window_start"], row["window_end"])
        assert loaded[0]["n"] == len(expected) == row["processed_count"]
    products = story.rows("SELECT owner, count(*) AS n FROM {products} GROUP BY owner")
    assert {r["owner"]: r["n"] for r in products} == {o: len(catalogue(o)) for o in ACCOUNTS}
    revenue = story.rows(
        "SELECT owner, count(*) AS orders, sum(amount) AS revenue FROM {orders}"
        " GROUP BY owner ORDER BY owner"
    )
    assert [r["owner"] for r in revenue] == sorted(ACCOUNTS)
    assert all(r["orders"] > 0 and r["revenue"] > 0 for r in revenue)


def check_the_scripted_429_and_503_happened(story: Story) -> None:
    """Every run shows a lane told to slow down and a retry from a cursor, whatever the dice
    say on the day: the scripted answers came the first time those pages were asked for."""
    for (owner, _, cursor), outcome in SCRIPTED.items():
        first = story.rows(
            "SELECT outcome FROM {fetches} WHERE owner = %s AND resource = 'orders'"
            " AND cursor = %s AND window_end = (SELECT max(window_end) FROM {jobs}"
            "  WHERE owner = %s AND mode = 'initial') ORDER BY id LIMIT 1",
            owner,
            str(cursor),
            owner,
        )
        assert first == [{"outcome": outcome}], (owner, cursor)


def check_the_story_says_each_moment_once_and_in_order(story: Story) -> None:
    """The demo's own lines: the broken page explained at its first failure, the fix announced
    (with the cause id to requeue) only once the shop had fixed the record, the requeue and the
    end of the story; each once."""
    moments = [
        "is globex's broken slice",
        "the shop is fixing the broken record",
        "press Requeue",
        "was requeued: it continues at its saved cursor 50",
        "the story is over",
    ]
    texts = [text for _, text in story.said]
    positions = []
    for moment in moments:
        found = [n for n, text in enumerate(texts) if moment in text]
        assert len(found) == 1, (moment, texts)
        positions.append(found[0])
    assert positions == sorted(positions), texts
    requeue_line = texts[positions[2] + 1]  # the command on a line of its own
    assert re.fullmatch(
        r"  synclane --app synclane.demo.app:app requeue --cause-id \w{8}", requeue_line
    )
    fixed = story.rows("SELECT fixed_at FROM {faults}")[0]["fixed_at"]
    last_refusal = story.rows("SELECT max(fetched_at) AS t FROM {fetches} WHERE outcome = 'broken'")
    # the shop took its time to fix the record (less the last answer's own slowness)
    assert fixed - last_refusal[0]["t"] >= timedelta(seconds=FIX_AFTER * SPEED - 0.1)
    said_at = next(at for at, text in story.said if "press Requeue" in text)
    assert said_at >= fixed - timedelta(seconds=0.2)  # the database and this clock may differ


def test_a_reset_lets_the_story_play_again(demo: Demo, db: psycopg.Connection[Any]) -> None:
    """The embedded database outlives a demo run; reset() forgets the queue's jobs, the loaded
    rows and the shop's memory (its healed fault too), and the next plan starts the story."""
    story = Story(demo, db)
    assert demo.app.plan("shops") == {"shops": 16}
    demo.warehouse.upsert_products("globex", catalogue("globex")[:3])
    story.rows("INSERT INTO {faults} (fault, failures, heals_after) VALUES ('globex orders', 6, 6)")
    demo.reset()
    assert story.rows("SELECT count(*) AS n FROM {jobs}") == [{"n": 0}]
    assert story.rows("SELECT count(*) AS n FROM {products}") == [{"n": 0}]
    assert story.rows("SELECT count(*) AS n FROM {faults}") == [{"n": 0}]
    assert demo.app.plan("shops") == {"shops": 16}


def test_a_kept_story_offers_the_requeue_its_last_run_left_waiting(
    demo: Demo, db: psycopg.Connection[Any]
) -> None:
    """`synclane demo --keep` after a run that stopped with the broken slice abandoned and the
    shop's record fixed: the story says at once that Requeue will now load it."""
    story = Story(demo, db)
    demo.app.plan("shops")
    story.rows(
        "UPDATE {jobs} SET status = 'abandoned', cursor = '50', attempt_count = 6,"
        " error = 'ShopBrokenPage: globex orders: the page at cursor 50 is broken'"
        " WHERE owner = 'globex' AND mode = 'initial' AND type = 'orders'"
        " AND window_end = (SELECT max(window_end) FROM {jobs} WHERE owner = 'globex'"
        "  AND mode = 'initial' AND type = 'orders') - interval '30 days'"
    )
    story.rows(
        "INSERT INTO {faults} (fault, failures, heals_after, fixed_at)"
        " VALUES ('globex orders', 6, 6, clock_timestamp() - interval '1 second')"
    )
    said: list[str] = []
    teller = Teller(demo, say=said.append)
    teller.intro(0, kept=True)
    wait_for(lambda: any("press Requeue" in text for text in said), 10, "the requeue hint")
    teller.close()
    assert said[0] == "continuing the last run's story; 0 new jobs planned"
    assert not any("is fixing" in text for text in said), "already fixed: no wait announced"
    assert said[-2] == "the shop has fixed its broken record: press Requeue on the page, or run"
    assert re.fullmatch(r"  synclane --app \S+ requeue --cause-id [0-9a-f]{8}", said[-1])
