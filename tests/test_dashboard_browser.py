"""The dashboard in a real headless Chromium: it loads, shows the four accounts, shows an error
with markup in it as text, and a Requeue button changes the row in the database and on the page.

Runs Debian's /usr/bin/chromium through the PyPI `playwright` package (`apt-get install -y
chromium`, `pip install playwright`). Never `playwright install`: it downloads a browser of its
own, which fails without a network."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dashboard_kit import LONG_ERROR, SCRIPT_ERROR, arrange_shop, row, start, stop

from synclane import SyncLane
from synclane.dashboard import DashboardServer

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's Chromium at /usr/bin/chromium: apt-get install -y chromium",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None,
        reason="needs the playwright package: pip install playwright (not `playwright install`)",
    ),
]


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
def page(browser: Any, server: DashboardServer, seen: Seen) -> Iterator[Any]:
    """The dashboard, loaded, with every dialog and script error recorded in `seen`."""
    context = browser.new_context()
    tab = context.new_page()

    def dialog_opened(dialog: Any) -> None:
        seen.dialogs.append(dialog.message)
        dialog.dismiss()

    tab.on("dialog", dialog_opened)
    tab.on("pageerror", lambda error: seen.errors.append(str(error)))
    tab.goto(server.url)
    tab.wait_for_selector("#jobs tbody tr")
    yield tab
    context.close()


def test_the_page_shows_the_four_accounts_and_the_lanes(
    page: Any, seen: Seen, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    accounts = page.locator("#progress tbody tr.first strong")
    expect(accounts).to_have_text(["acme-eu", "acme-us", "globex", "initech"])
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
    stored = row(db, app.schema, shop["failed"])
    assert (stored["status"], stored["attempt_count"], stored["error"]) == ("pending", 0, None)
    assert row(db, app.schema, shop["abandoned"])["status"] == "abandoned"


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
        stored = row(db, app.schema, shop[name])
        assert stored["status"] == "pending"
    assert row(db, app.schema, shop["abandoned"])["cursor"] == "50"


def test_requeue_all_stopped_jobs(
    page: Any, app: SyncLane, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    from playwright.sync_api import expect

    page.locator("#requeue-all").click()
    expect(page.locator("#notice")).to_have_text("requeued 3 job(s)")
    expect(page.locator("#failures .empty")).to_be_visible()
    expect(page.locator("#requeue-all")).to_be_disabled()
    for name in ("failed", "abandoned", "deferred"):
        assert row(db, app.schema, shop[name])["status"] == "pending"
