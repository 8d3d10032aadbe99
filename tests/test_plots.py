"""The pictures (synclane.plots): built headless from the SDK's frames, saved, one row of bars per
owner."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pandas as pd
import psycopg
import pytest
from apps import ACCOUNTS, orders_and_products, products_queue
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from psycopg import sql

from synclane import ConfigError, SyncLane, plots

DAY = timedelta(days=1)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def shops(
    app: SyncLane, db: psycopg.Connection, schema: str, every_slice_planned: None
) -> SyncLane:
    """Three accounts: acme-us loaded; acme-eu's newest slice failed, the next loaded; globex
    untouched."""
    orders_and_products(app, ACCOUNTS, horizon=120 * DAY)
    app.plan()
    table = sql.Identifier(schema, "jobs")
    db.execute(sql.SQL("UPDATE {} SET status = 'completed' WHERE owner = 'acme-us'").format(table))
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = CASE WHEN window_start = (SELECT max(window_start) FROM {} "
            "WHERE owner = 'acme-eu' AND mode = 'initial') THEN 'failed' ELSE 'completed' END "
            "WHERE owner = 'acme-eu' AND mode = 'initial' AND window_start > now() - interval "
            "'70 days'"
        ).format(table, table)
    )
    return app


def bar_rows(axes: Axes) -> set[int]:
    """The rows (y centres) the axes' bars are drawn in."""
    return {
        round(patch.get_y() + patch.get_height() / 2)
        for patch in axes.patches
        if isinstance(patch, Rectangle)
    }


def owners_on(axes: Axes) -> list[str]:
    return [label.get_text() for label in axes.get_yticklabels()]


def saved(figure: Figure, path: Path) -> bytes:
    figure.savefig(path)
    return path.read_bytes()


def test_the_coverage_timeline_has_one_row_of_bars_per_owner(
    shops: SyncLane, tmp_path: Path
) -> None:
    coverage = shops.coverage("shops")

    figure = plots.coverage_timeline(coverage, title="shops")

    assert isinstance(figure, Figure)
    [axes] = [a for a in figure.axes if a.patches]  # one panel: orders (products have no window)
    assert owners_on(axes) == ["acme-eu", "acme-us", "globex"]
    assert bar_rows(axes) == {0, 1, 2}
    # one bar per span; acme-eu's failed slice between loaded ones is a bar of its own
    assert len(axes.patches) == len(coverage)
    colours = {tuple(patch.get_facecolor()) for patch in axes.patches}
    assert len(colours) == coverage["status"].nunique()
    assert saved(figure, tmp_path / "coverage.png").startswith(PNG)


def test_the_progress_chart_has_one_row_of_bars_per_owner_and_a_panel_per_type(
    shops: SyncLane, tmp_path: Path
) -> None:
    progress = shops.progress("shops")

    figure = plots.progress_chart(progress)

    panels = [a for a in figure.axes if a.patches]
    assert [a.get_title(loc="left") for a in panels] == [
        "first load of orders",
        "first load of products",
    ]
    for axes in panels:
        assert owners_on(axes) == ["acme-eu", "acme-us", "globex"]
        assert bar_rows(axes) == {0, 1, 2}
    orders = panels[0]
    labels = [text.get_text() for text in orders.texts]
    assert labels == ["1/4 failing", "4/4 loaded", "0/4 connecting"]
    # each bar's parts add up to 100 %
    ends: dict[int, float] = {}
    for patch in orders.patches:
        row = round(patch.get_y() + patch.get_height() / 2)
        ends[row] = max(ends.get(row, 0.0), patch.get_x() + patch.get_width())
    assert ends == pytest.approx({0: 100.0, 1: 100.0, 2: 100.0})
    assert saved(figure, tmp_path / "progress.png").startswith(PNG)


def test_a_filtered_frame_draws_only_its_owners(shops: SyncLane) -> None:
    figure = plots.coverage_timeline(shops.coverage("shops", owner="globex"))
    [axes] = [a for a in figure.axes if a.patches]
    assert owners_on(axes) == ["globex"] and bar_rows(axes) == {0}


def test_empty_frames_draw_a_message_instead_of_failing(app: SyncLane, tmp_path: Path) -> None:
    products_queue(app)
    for figure in (
        plots.coverage_timeline(app.coverage("shops")),
        plots.progress_chart(app.progress("shops")),
    ):
        assert [text.get_text() for a in figure.axes for text in a.texts]
        assert saved(figure, tmp_path / "empty.png").startswith(PNG)


def test_a_frame_of_another_call_is_refused_with_a_clear_error(shops: SyncLane) -> None:
    with pytest.raises(ConfigError, match=r"app\.coverage"):
        plots.coverage_timeline(shops.progress("shops"))
    with pytest.raises(ConfigError, match=r"app\.progress"):
        plots.progress_chart(pd.DataFrame({"owner": ["x"]}))


def test_plots_are_drawn_without_pyplot_or_a_display() -> None:
    code = (
        "import os, sys\n"
        "os.environ.pop('DISPLAY', None)\n"
        "import pandas as pd\n"
        "from synclane import plots\n"
        "frame = pd.DataFrame({'owner': ['a'], 'type': ['orders'], 'status': ['completed'],\n"
        "    'window_start': pd.to_datetime(['2026-01-01'], utc=True),\n"
        "    'window_end': pd.to_datetime(['2026-02-01'], utc=True)})\n"
        "plots.coverage_timeline(frame).savefig(sys.argv[1])\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "/dev/null"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_status_colours_cover_every_status() -> None:
    from synclane.model import STATUSES

    assert set(plots.STATUS_COLOURS) == set(STATUSES)
