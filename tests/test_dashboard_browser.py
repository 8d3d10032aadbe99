"""The dashboard in a real headless Chromium: it loads, shows the accounts worst first, shows an
error with markup in it as text, a Requeue button changes the row in the database and on the
page, the events panel tells what happened, the page says when its server stopped, and the
login works where the browser matters (an HttpOnly cookie).

Runs Debian's /usr/bin/chromium through the PyPI `playwright` package (`apt-get install -y
chromium`, `pip install playwright`). Never `playwright install`: it downloads a browser of its
own, which fails without a network."""

from __future__ import annotations

import importlib.util
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps import products_queue
from dashboard_kit import LONG_ERROR, SCRIPT_ERROR, arrange_shop, start, stop
from system_tools import need
from workers import arrange, job_row, running_worker, wait_for

from synclane import Job, Owner, Page, SyncLane, Throttled
from synclane.dashboard import DashboardServer
from synclane.events import Event, EventLog

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module", autouse=True)
def _browser_installed() -> None:
    need(
        CHROMIUM.exists(),
        "needs Debian's Chromium at /usr/bin/chromium: apt-get install -y chromium",
    )
    need(
        importlib.util.find_spec("playwright") is not None,
        "needs the playwright package: pip install playwright (not `playwright install`)",
    )


@pytest.fixture
def shop(app: SyncLane, db: psycopg.Connection) -> dict[str, int]:
    return arrange_shop(app, db)


@pytest.fixture
def server(app: SyncLane, shop: dict[str, int]) -> Iterator[DashboardServer]:
    running = start(app)
    yield running
    stop(running)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


class Seen:
    """What the page did besides rendering: dialogs it opened, script errors it raised."""

    def __init__(self) -> None:
        self.dialogs: list[str] = []
        self.errors: list[str] = []


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def open_tab(browser: Any, seen: Seen) -> Iterator[Callable[[str], Any]]:
    """Opens a URL in a fresh browser context, recording every dialog and script error."""
    contexts = []

    def opened(url: str) -> Any:
        context = browser.new_context()
        contexts.append(context)
        tab = context.new_page()

        def dialog_opened(dialog: Any) -> None:
            seen.dialogs.append(dialog.message)
            dialog.dismiss()

        tab.on("dialog", dialog_opened)
        tab.on("pageerror", lambda error: seen.errors.append(str(error)))
        tab.goto(url)
        return tab

    yield opened
    for context in contexts:
        context.close()


@pytest.fixture
def page(open_tab: Callable[[str], Any], server: DashboardServer) -> Any:
    """The dashboard, loaded."""
    tab = open_tab(server.url)
    tab.wait_for_selector("#jobs tbody tr")
    return tab


def test_the_page_shows_the_accounts_worst_first_and_the_lanes(
    page: Any, seen: Seen, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    accounts = page.locator("#accounts tbody tr.first strong")
    expect(accounts.first).to_have_text("globex")
    expect(page.locator("#accounts tbody tr").first.locator("td.state")).to_have_text("abandoned")
    # a loaded account needs no look; the search finds it
    expect(page.locator('#accounts tr[data-owner="initech"]')).to_have_count(0)
    page.locator("#account-search").fill("init")
    expect(accounts).to_have_text(["initech"])
    expect(page.locator('#accounts tr[data-owner="initech"] td.state').first).to_have_text("loaded")
    acme = page.locator('#lanes tbody tr[data-lane="acme"]')
    expect(acme).to_contain_text(f"#{shop['running']} orders for acme-eu")
    expect(acme).to_contain_text("worker-1")
    expect(page.locator("#health")).to_have_text("live")
    assert seen.errors == []


def test_an_error_with_a_script_tag_shows_as_text(
    page: Any, seen: Seen, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    error = page.locator(f'#jobs tr[data-job-id="{shop["failed"]}"] td.error')
    expect(error).to_have_text(SCRIPT_ERROR)
    page.wait_for_timeout(2500)  # at least one refresh re-renders the data
    assert page.locator("script").count() == 1  # only /app.js
    assert seen.dialogs == [] and seen.errors == []


def test_a_long_error_is_shortened_with_the_full_text_on_expand(
    page: Any, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    cell = page.locator(f'#jobs tr[data-job-id="{shop["deferred"]}"] td.error')
    expect(cell.locator("summary")).to_have_text("RuntimeError: order 97 not found…")
    assert cell.locator("details").get_attribute("title") == LONG_ERROR
    expect(cell.locator("pre")).to_be_hidden()
    cell.locator("summary").click()
    expect(cell.locator("pre")).to_be_visible()
    page.wait_for_timeout(2500)  # it stays open across refreshes
    expect(cell.locator("pre")).to_be_visible()


def test_pressing_requeue_changes_the_row(
    page: Any, app: SyncLane, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    job = page.locator(f'#jobs tr[data-job-id="{shop["failed"]}"]')
    expect(job.locator("td.status")).to_have_text("failed")
    job.locator("button.requeue").click()
    expect(job.locator("td.status")).to_have_text("pending")
    expect(job.locator("button.requeue")).to_have_count(0)
    expect(page.locator("#notice")).to_have_text("requeued 1 job(s)")
    stored = job_row(db, app.schema, shop["failed"])
    assert (stored["status"], stored["attempt_count"], stored["error"]) == ("pending", 0, None)
    assert job_row(db, app.schema, shop["abandoned"])["status"] == "abandoned"


def test_pressing_requeue_on_a_cause_requeues_its_jobs(
    page: Any, app: SyncLane, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    cause = page.locator('#failures tr[data-cause="RuntimeError: order <n> not found"]')
    cause.locator("button.requeue").click()
    expect(page.locator("#notice")).to_have_text("requeued 2 job(s)")
    expect(cause).to_have_count(0)
    for name in ("abandoned", "deferred"):
        expect(page.locator(f'#jobs tr[data-job-id="{shop[name]}"] td.status')).to_have_text(
            "pending"
        )
        stored = job_row(db, app.schema, shop[name])
        assert stored["status"] == "pending"
    assert job_row(db, app.schema, shop["abandoned"])["cursor"] == "50"


def test_requeue_all_stopped_jobs(
    page: Any, app: SyncLane, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    page.locator("#requeue-all").click()
    expect(page.locator("#notice")).to_have_text("requeued 3 job(s)")
    expect(page.locator("#failures .empty")).to_be_visible()
    expect(page.locator("#requeue-all")).to_be_disabled()
    for name in ("failed", "abandoned", "deferred"):
        assert job_row(db, app.schema, shop[name])["status"] == "pending"


def test_pause_needs_a_reason_shows_who_why_and_since_when_and_resume_undoes_it(
    page: Any, app: SyncLane, db: psycopg.Connection, seen: Seen
) -> None:
    from playwright.sync_api import expect

    def paused() -> list[tuple[Any, ...]]:
        query = psycopg.sql.SQL("SELECT paused_by, reason FROM {}").format(
            psycopg.sql.Identifier(app.schema, "queue_pauses")
        )
        return db.execute(query).fetchall()

    row = page.locator('#queues tbody tr[data-queue="shops"]')
    expect(row.locator("td.state")).to_have_text("taking jobs")
    pause = row.locator("button.pause")
    expect(pause).to_be_disabled()  # a reason is required
    row.locator("input.reason").fill("   ")
    expect(pause).to_be_disabled()
    why = "warehouse <b>down</b> until 14:00"
    row.locator("input.reason").fill(why)
    pause.click()
    expect(page.locator("#notice")).to_contain_text("queue shops paused by ")
    expect(row.locator("td.state")).to_have_text("paused")
    expect(row.locator("td.why")).to_have_text(why)  # markup shows as text
    [(by, reason)] = paused()
    assert reason == why and by.endswith(" via the dashboard")
    expect(row.locator("td.by")).to_have_text(by)
    expect(row).to_contain_text("s ago")
    expect(page.locator('#summary tr[data-queue="shops"]')).to_contain_text("paused")
    assert page.locator("#queues b").count() == 0

    row.locator("button.resume").click()
    expect(page.locator("#notice")).to_have_text("queue shops resumed")
    expect(row.locator("td.state")).to_have_text("taking jobs")
    expect(row.locator("input.reason")).to_have_value("")
    assert paused() == []
    assert seen.errors == []


def test_an_error_wraps_between_words(page: Any, shop: dict[str, int]) -> None:
    cell = page.locator(f'#jobs tr[data-job-id="{shop["failed"]}"] td.error')
    style = cell.evaluate(
        "node => [getComputedStyle(node).overflowWrap, getComputedStyle(node).wordBreak]"
    )
    assert style == ["break-word", "normal"]


def test_a_cause_shows_its_id_and_a_real_error(page: Any, shop: dict[str, int]) -> None:
    from playwright.sync_api import expect

    cause = page.locator('#failures tr[data-cause="RuntimeError: order <n> not found"]')
    cause_id = cause.get_attribute("data-cause-id")
    assert cause_id is not None and len(cause_id) == 8
    expect(cause.locator("td").first).to_contain_text("id " + cause_id)
    expect(cause.locator("td").nth(1)).to_contain_text("RuntimeError: order ")
    expect(cause.locator("td").nth(1)).not_to_contain_text("<n>")


@pytest.fixture
def more(app: SyncLane, db: psycopg.Connection, shop: dict[str, int]) -> dict[str, int]:
    """Beside the shop: acme-us's second slice failed with a throttle and retries in a minute;
    the running acme-eu slice still carries its previous attempt's throttle."""
    from dashboard_kit import slices

    soon = slices(db, app.schema, "acme-us")[1]
    arrange(
        db,
        app.schema,
        soon,
        status="failed",
        error="RuntimeError: 503 from the shop",
        next_run_at=datetime.now(UTC) + timedelta(seconds=90),
    )
    arrange(db, app.schema, shop["running"], error="Throttled: 429 Too Many Requests")
    return {**shop, "soon": soon}


def test_requeue_is_offered_only_where_a_human_must_act(
    open_tab: Callable[[str], Any], app: SyncLane, more: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    server = start(app)
    try:
        tab = open_tab(server.url)
        tab.wait_for_selector("#jobs tbody tr")
        for name in ("failed", "abandoned", "deferred"):  # far retry, waiting for a human
            expect(
                tab.locator(f'#jobs tr[data-job-id="{more[name]}"] button.requeue')
            ).to_have_count(1)
        for name in ("soon", "running"):  # retries by itself in 90 s; runs
            expect(
                tab.locator(f'#jobs tr[data-job-id="{more[name]}"] button.requeue')
            ).to_have_count(0)
        soon = tab.locator('#failures tr[data-cause="RuntimeError: <n> from the shop"]')
        expect(soon.locator("button.requeue")).to_have_count(0)
        expect(soon).to_contain_text("retries by itself")
        running = tab.locator(f'#jobs tr[data-job-id="{more["running"]}"] td.error')
        expect(running).to_have_text("previous attempt: Throttled: 429 Too Many Requests")
    finally:
        stop(server)


def test_the_page_says_when_its_server_stopped_and_turns_its_buttons_off(
    open_tab: Callable[[str], Any], app: SyncLane, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    server = start(app)
    tab = open_tab(server.url)
    tab.wait_for_selector("#jobs tbody tr button.requeue")
    expect(tab.locator("#offline")).to_be_hidden()
    stop(server)
    expect(tab.locator("#offline")).to_be_visible(timeout=10_000)
    expect(tab.locator("#offline")).to_contain_text("not answering")
    expect(tab.locator("#offline")).to_contain_text("The buttons are off")
    expect(tab.locator("#health")).to_have_text("not answering")
    buttons = tab.locator("button.requeue")
    assert buttons.count() >= 4
    for n in range(buttons.count()):
        expect(buttons.nth(n)).to_be_disabled()


def test_a_lane_shows_its_rate_and_its_throttle_pause_also_after_a_requeue(
    open_tab: Callable[[str], Any], app: SyncLane
) -> None:
    from playwright.sync_api import expect

    def slow_down(job: Job) -> Page:
        raise Throttled(retry_after=3600)

    products_queue(
        app, owners=[Owner("acme-us", lane="acme")], handler=slow_down, lane_rate=(5, 3600)
    )
    app.plan()
    # one start, then the 429; in a thread: playwright's loop runs in this one
    worker = threading.Thread(
        target=app.run_worker, kwargs={"until_idle": True, "idle_grace": 0, "stop_after": 30}
    )
    worker.start()
    worker.join()
    server = start(app)
    try:
        tab = open_tab(server.url)
        lane = tab.locator('#lanes tbody tr[data-lane="acme"]')
        expect(lane.locator("td.rate")).to_have_text("5 / 1h, 4 left")
        expect(lane).to_contain_text("throttled")
        expect(lane).to_contain_text("paused until in 59m")
        app.requeue("shops", owner="acme-us")
        tab.reload()
        expect(tab.locator('#jobs tbody tr[data-status="pending"]')).to_have_count(1)
        expect(lane).to_contain_text("paused until in 59m")
    finally:
        stop(server)


def test_the_workers_section_shows_each_worker_with_its_state(
    open_tab: Callable[[str], Any], app: SyncLane, db: psycopg.Connection
) -> None:
    from playwright.sync_api import expect

    products_queue(app, concurrency=2)
    db.execute(
        psycopg.sql.SQL(
            "INSERT INTO {} (name, instance, host, pid, version, queues, slots, expires_at) "
            "VALUES ('a-dead-worker', gen_random_uuid(), 'gone.example', 4242, '0.1', "
            "'{{shops}}', 3, now() + interval '1 minute')"
        ).format(psycopg.sql.Identifier(app.schema, "workers"))
    )
    with running_worker(app) as worker:
        wait_for(lambda: len(app.workers()) == 2, timeout=15, what="the worker in the list")
        server = start(app)
        try:
            tab = open_tab(server.url)
            rows = tab.locator("#workers tbody tr")
            expect(rows).to_have_count(2)
            expect(rows.nth(0).locator("td.state")).to_have_text("running")
            expect(rows.nth(0)).to_contain_text(worker.name)
            expect(rows.nth(1).locator("td.state")).to_have_text("lost")
            expect(rows.nth(1)).to_contain_text("gone.example")
            expect(tab.locator("#workers .count")).to_have_text("1–2 of 2")
        finally:
            stop(server)


def event(kind: str, owner: str, **values: Any) -> Event:
    fields: dict[str, Any] = {
        "queue": "shops",
        "job_id": 7,
        "owner": owner,
        "lane": owner,
        "type": "orders",
        "mode": "initial",
        "worker": "host:1",
        "window_start": datetime(2026, 1, 1, tzinfo=UTC),
        "window_end": datetime(2026, 1, 31, tzinfo=UTC),
    }
    return Event(kind=kind, **{**fields, **values})  # type: ignore[arg-type]


def test_the_events_panel_tells_what_happened_newest_first(
    open_tab: Callable[[str], Any], app: SyncLane, seen: Seen, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    until = datetime(2026, 1, 1, 12, 3, 5, tzinfo=UTC)
    log = EventLog()
    log.append(event("throttled", "acme-us", lane="acme", error="Throttled: 429", until=until))
    log.append(event("failed", "globex", error="RuntimeError: 503", until=until, attempt=1))
    server = start(app, events=log)
    try:
        tab = open_tab(server.url)
        lines = tab.locator("#event-lines li")
        expect(lines).to_have_count(2)
        expect(lines.nth(0)).to_contain_text(
            "orders 2026-01-01 → 2026-01-31 for globex failed (RuntimeError: 503); "
            "retry at 12:03:05 UTC"
        )
        expect(lines.nth(1)).to_contain_text("lane acme throttled until 12:03:05 UTC")
        hostile = "<img src=x onerror=alert(1)>"
        log.append(event("abandoned", hostile, error="RuntimeError: <b>broken</b>", attempt=6))
        log.append(event("first_load_finished", "initech"))
        expect(lines).to_have_count(4)
        expect(lines.nth(0)).to_contain_text("first load of orders for initech finished")
        expect(lines.nth(1)).to_contain_text(f"for {hostile} abandoned (RuntimeError: <b>broken")
        assert tab.locator("#event-lines img").count() == 0
        assert seen.dialogs == [] and seen.errors == []
    finally:
        stop(server)


def test_without_an_event_log_the_panel_is_hidden(page: Any) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#events")).to_be_hidden()


def test_the_login_gives_an_httponly_cookie(
    open_tab: Callable[[str], Any], app: SyncLane, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    server = start(app, login_secret="a-secret-for-the-browser-test")
    try:
        tab = open_tab(server.url)
        expect(tab).to_have_url(server.url + "login")
        tab.locator("#secret").fill("not the secret at all")
        tab.locator("#login").click()
        expect(tab.locator("#notice")).to_have_text("that is not the login secret")
        tab.locator("#secret").fill("a-secret-for-the-browser-test")
        tab.locator("#secret").press("Enter")
        expect(tab).to_have_url(server.url)
        tab.wait_for_selector("#jobs tbody tr")
        assert "synclane_session" not in tab.evaluate("document.cookie")  # HttpOnly
        [cookie] = tab.context.cookies()
        assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
        tab.locator("#logout").click()
        expect(tab).to_have_url(server.url + "login")
    finally:
        stop(server)


def test_the_demo_s_page_tells_its_story_as_it_happens(
    open_tab: Callable[[str], Any], dsn: str, schema: str, seen: Seen
) -> None:
    """`synclane demo` (issue 15, item 3): the worker's events and the demo's own lines reach the
    page's events panel while the story plays: the scripted 429 pauses lane acme, the broken
    globex page fails, and the demo's own notes say what happens at the shop."""
    import re
    import subprocess
    import sys

    from playwright.sync_api import expect

    env = {k: v for k, v in __import__("os").environ.items() if k != "SYNCLANE_DSN"}
    process = subprocess.Popen(
        [sys.executable, "-m", "synclane.cli", "--dsn", dsn, "--schema", schema, "demo",
         "--speed", "0.05", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        url = None
        for _ in range(20):
            found = re.search(r"open (http://\S+)", process.stdout.readline())
            if found:
                url = found.group(1)
                break
        assert url is not None, "the demo printed no URL"
        tab = open_tab(url)
        lines = tab.locator("#event-lines li")
        expect(lines.filter(has_text="lane acme throttled until")).not_to_have_count(
            0, timeout=30_000
        )
        expect(lines.filter(has_text="ShopBrokenPage")).not_to_have_count(0, timeout=30_000)
        expect(lines.filter(has_text="planned")).not_to_have_count(0, timeout=30_000)
        assert seen.errors == []
    finally:
        process.terminate()
        process.wait(timeout=30)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(f"{schema}_demo")
                )
            )


# -- issue 29, item 4: the page says nothing untrue, at 1280 and at 800 px --------------------

# For each table: its numbers' text overlaps its header's text (a right-aligned number under a
# left-aligned header sits under the next one); each control of a row lies inside its section's
# visible box; and whether the table is wider than its section.
LAYOUT = """() => {
  const text = (node) => { const r = document.createRange(); r.selectNodeContents(node);
                           return r.getBoundingClientRect(); };
  const misplaced = [], hidden = [], wide = [];
  for (const section of document.querySelectorAll("section")) {
    const table = section.querySelector("table");
    if (!table || section.hidden) continue;
    if (table.scrollWidth > section.clientWidth) wide.push(section.id);
    const headers = [...table.querySelectorAll("thead th")];
    for (const row of table.querySelectorAll("tbody tr")) {
      [...row.children].forEach((td, i) => {
        if (!td.classList.contains("num") || !td.textContent.trim()) return;
        const [a, b] = [text(td), text(headers[i])];
        if (a.right < b.left || a.left > b.right)
          misplaced.push(section.id + ": " + td.textContent + " under " + headers[i].textContent);
      });
    }
    const box = section.getBoundingClientRect();
    for (const control of table.querySelectorAll("button, input")) {
      const r = control.getBoundingClientRect();
      if (r.left < box.left || r.right > box.right)
        hidden.push(section.id + ": " + control.outerHTML);
    }
  }
  return {misplaced, hidden, wide, page: document.documentElement.scrollWidth > innerWidth};
}"""


@pytest.mark.parametrize("width", [1280, 800])
def test_every_number_sits_under_its_header_and_every_button_is_in_view(
    open_tab: Callable[[str], Any], app: SyncLane, db: psycopg.Connection, width: int
) -> None:
    """The demo's table (24 jobs, its refreshes' windows, the broken slice abandoned with its
    long error) on a page 1280 and 800 px wide: no number under another column's header, no
    Requeue or Pause cut off; at 1280 px every table fits the page."""
    from dashboard_kit import slices
    from playwright.sync_api import expect

    ids = arrange_shop(app, db)
    recurring = psycopg.sql.SQL(
        "UPDATE {} SET window_start = date_trunc('day', now()) - interval '5 minutes', "
        "window_end = now() WHERE mode = 'recurring'"
    )
    db.execute(recurring.format(psycopg.sql.Identifier(app.schema, "jobs")))
    long_error = "ShopBrokenPage: " + "the page at cursor 50 is broken on the shop's side " * 4
    arrange(
        db, app.schema, slices(db, app.schema, "initech")[0], status="abandoned", error=long_error
    )
    server = start(app)
    try:
        tab = open_tab(server.url)
        tab.set_viewport_size({"width": width, "height": 1000})
        tab.wait_for_selector("#jobs tbody tr button.requeue")
        expect(tab.locator(f'#jobs tr[data-job-id="{ids["abandoned"]}"] button')).to_be_visible()
        layout = tab.evaluate(LAYOUT)
        wide = layout.pop("wide")  # narrower, a table may scroll sideways; its buttons stay
        assert (layout, wide if width == 1280 else []) == (
            {"misplaced": [], "hidden": [], "page": False},
            [],
        )
    finally:
        stop(server)


def test_the_events_panel_shows_each_line_whole_also_from_the_tenth_on(
    open_tab: Callable[[str], Any], app: SyncLane, shop: dict[str, int]
) -> None:
    """Twelve events: every line begins with its time at the list's edge; no marker (the tenth
    line's was `0.`, its first digit clipped) stands before it."""
    log = EventLog()
    for n in range(12):
        log.append(event("failed", f"owner-{n}", error="RuntimeError: 503", attempt=1))
    server = start(app, events=log)
    try:
        tab = open_tab(server.url)
        lines = tab.locator("#event-lines li")
        lines.nth(11).wait_for()
        for n in range(12):
            lines.nth(n).scroll_into_view_if_needed()
            first = lines.nth(n).evaluate(
                """li => { const list = li.parentElement.getBoundingClientRect();
                           const time = li.querySelector("time").getBoundingClientRect();
                           const hit = document.elementFromPoint(list.left + 2,
                                                                 time.top + time.height / 2);
                           return hit && hit.tagName; }"""
            )
            assert first == "TIME", n
    finally:
        stop(server)


def test_the_summary_counts_a_small_table_and_estimates_a_large_one(
    page: Any, app: SyncLane, db: psycopg.Connection
) -> None:
    """PostgreSQL's estimate is 0 (or unknown) until the table was analyzed: a table of a few
    jobs says how many it holds; one beyond what is cheap to count says about how many."""
    from playwright.sync_api import expect

    jobs = psycopg.sql.Identifier(app.schema, "jobs")
    (count,) = db.execute(psycopg.sql.SQL("SELECT count(*) FROM {}").format(jobs)).fetchone()
    assert 0 < count < 100
    expect(page.locator("#table-size")).to_have_text(f"The table holds {count} jobs in all.")
    db.execute(
        psycopg.sql.SQL(
            "INSERT INTO {} (queue, owner, lane, type, mode, status, dedup_key)"
            " SELECT 'old', 'o' || n, 'o' || n, 't', 'manual', 'completed', 'k'"
            " FROM generate_series(1, 12000) AS n"
        ).format(jobs)
    )
    db.execute(psycopg.sql.SQL("ANALYZE {}").format(jobs))
    page.reload()  # the state is read again within its cache's interval (2 s)
    estimate = re.compile(r"The table holds about ([\d,]+) jobs in all \(PostgreSQL's estimate\)\.")
    expect(page.locator("#table-size")).to_have_text(estimate, timeout=10_000)
    found = estimate.fullmatch(str(page.locator("#table-size").text_content()))
    assert found is not None
    assert abs(int(found.group(1).replace(",", "")) - (count + 12000)) < 1200


def test_a_job_that_will_not_run_again_shows_no_next_run(page: Any, shop: dict[str, int]) -> None:
    """Completed, abandoned and running jobs have no next run; failed and deferred ones do."""

    def next_run(job_id: int) -> str:
        row = page.locator(f'#jobs tr[data-job-id="{job_id}"]')
        return str(row.locator("td.next-run").text_content()).strip()

    page.locator("#job-view").select_option("all")
    page.wait_for_selector('#jobs tbody tr[data-status="completed"]')
    completed = page.locator('#jobs tbody tr[data-status="completed"]').first.get_attribute(
        "data-job-id"
    )
    assert next_run(int(str(completed))) == ""
    for name in ("abandoned", "running"):
        assert next_run(shop[name]) == "", name
    assert next_run(shop["failed"]).startswith("in "), "a retry an hour off"
    assert next_run(shop["deferred"]) in ("due", "in 0s"), "its last attempt, due now"
