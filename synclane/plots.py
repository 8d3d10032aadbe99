"""Pictures of the sync, as matplotlib Figures: a coverage timeline and a progress chart.

    from synclane import plots
    plots.coverage_timeline(app.coverage("shops")).savefig("coverage.png")
    plots.progress_chart(app.progress("shops"))

Each takes the DataFrame of the matching SDK call, so it can be filtered first, and returns a
Figure built without pyplot: headless (it renders with Agg), no global state, safe in a thread.
In Jupyter a returned Figure shows as the cell's result. matplotlib is imported only here
(`pip install "synclane[notebook]"`).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import matplotlib.dates as mdates
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from synclane.model import STATUSES

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes

# One colour per status, the same in both pictures: loaded is green, waiting grey, running blue,
# retrying orange, stuck red.
STATUS_COLOURS = {
    "completed": "#2e7d32",
    "running": "#1e88e5",
    "pending": "#b0bec5",
    "failed": "#fb8c00",
    "deferred": "#f4511e",
    "abandoned": "#c62828",
    "cancelled": "#6d4c41",
}
# The progress chart's parts of a bar, in order, with the colour of the status they stand for.
PARTS = (
    ("slices_completed", "completed", "completed"),
    ("slices_failed", "failed, deferred or abandoned", "abandoned"),
    ("slices_open", "pending or running", "pending"),
    ("slices_cancelled", "cancelled", "cancelled"),
)
ROW_HEIGHT = 0.42  # inches per row of bars
# A span narrower than this share of the time axis is drawn this wide, so that a failed
# 15-minute refresh still shows on a two-year timeline.
MIN_SHARE = 0.004


class Picture(Figure):
    """A Figure that shows itself as a PNG in Jupyter, also where pyplot was never imported."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png")
        return buffer.getvalue()


def coverage_timeline(coverage: pd.DataFrame, *, title: str | None = None) -> Picture:
    """One row of bars per owner, one panel per type: each span of `app.coverage(queue)` is a bar
    from its window_start to its window_end, coloured by status. Gaps are empty space."""
    _require(coverage, ("owner", "type", "status", "window_start", "window_end"), "coverage")
    types = sorted(str(t) for t in coverage["type"].dropna().unique())
    owners = sorted(str(o) for o in coverage["owner"].dropna().unique())
    figure = Picture(figsize=(11, 1.1 + len(types) * (0.6 + ROW_HEIGHT * max(len(owners), 1))))
    figure.set_layout_engine("constrained")
    if coverage.empty:
        axes = figure.add_subplot()
        _nothing(axes, "no windows yet: plan the queue first")
        return figure
    panels = figure.subplots(len(types), 1, sharex=True, squeeze=False)[:, 0]
    starts = _date_numbers(coverage["window_start"])
    ends = _date_numbers(coverage["window_end"])
    narrowest = (ends.max() - starts.min()) * MIN_SHARE
    row_of = {owner: number for number, owner in enumerate(owners)}
    seen: set[str] = set()
    for axes, type_name in zip(panels, types, strict=True):
        mine = (coverage["type"] == type_name).to_numpy()
        for index in mine.nonzero()[0]:
            status = str(coverage["status"].iloc[index])
            seen.add(status)
            left = float(starts[index])
            width = max(float(ends[index]) - left, narrowest)
            axes.barh(
                row_of[str(coverage["owner"].iloc[index])],
                width,
                left=left,
                height=0.6,
                color=STATUS_COLOURS.get(status, "#9e9e9e"),
                edgecolor="white",
                linewidth=0.4,
            )
        _owner_rows(axes, owners)
        axes.set_title(f"coverage of {type_name}", loc="left", fontsize="medium")
        axes.grid(axis="x", alpha=0.3)
    bottom = panels[-1]
    locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
    bottom.xaxis.set_major_locator(locator)
    # Every tick names its month (no bare "15" left of the first month), and the year is in the
    # axis label rather than in an offset text in the corner.
    formatter = mdates.ConciseDateFormatter(  # type: ignore[no-untyped-call]
        locator,
        formats=["%Y", "%b", "%d %b", "%H:%M", "%H:%M", "%S.%f"],
        zero_formats=["", "%Y", "%b", "%d %b", "%H:%M", "%H:%M"],
        show_offset=False,
    )
    bottom.xaxis.set_major_formatter(formatter)
    bottom.set_xlabel(f"window (UTC, {_span_label(coverage)})")
    _legend(panels[0], [s for s in STATUSES if s in seen])
    if title:
        figure.suptitle(title)
    return figure


def progress_chart(progress: pd.DataFrame, *, title: str | None = None) -> Picture:
    """One bar per owner, one panel per type: the first load's slices completed, failed, open
    and cancelled as parts of 100 %, labelled with the percent, the state and the ETA."""
    _require(progress, ("owner", "type", *(part for part, _, _ in PARTS)), "progress")
    types = sorted(str(t) for t in progress["type"].dropna().unique())
    owners = sorted(str(o) for o in progress["owner"].dropna().unique())
    figure = Picture(figsize=(10, 1.1 + len(types) * (0.6 + ROW_HEIGHT * max(len(owners), 1))))
    figure.set_layout_engine("constrained")
    if progress.empty:
        _nothing(figure.add_subplot(), "nothing planned yet")
        return figure
    panels = figure.subplots(len(types), 1, sharex=True, squeeze=False)[:, 0]
    row_of = {owner: number for number, owner in enumerate(owners)}
    for axes, type_name in zip(panels, types, strict=True):
        rows = progress[progress["type"] == type_name]
        positions = [row_of[str(owner)] for owner in rows["owner"]]
        total = rows["slices_total"].astype("float64").clip(lower=1).to_numpy()
        left = [0.0] * len(rows)
        for column, _, status in PARTS:
            share = 100 * rows[column].astype("float64").fillna(0).to_numpy() / total
            axes.barh(
                positions,
                share,
                left=left,
                height=0.6,
                color=STATUS_COLOURS[status],
                edgecolor="white",
                linewidth=0.4,
            )
            left = [a + b for a, b in zip(left, share, strict=True)]
        for position, label in zip(positions, _labels(rows), strict=True):
            axes.text(101, position, label, va="center", fontsize="small")
        _owner_rows(axes, owners)
        axes.set_xlim(0, 135)
        axes.set_xticks([0, 25, 50, 75, 100])
        axes.set_title(f"first load of {type_name}", loc="left", fontsize="medium")
        axes.grid(axis="x", alpha=0.3)
    panels[-1].set_xlabel("history slices (%)")
    panels[0].legend(
        handles=[Patch(color=STATUS_COLOURS[status], label=name) for _, name, status in PARTS],
        loc="lower left",
        bbox_to_anchor=(0, 1.12),
        ncols=len(PARTS),
        fontsize="small",
        frameon=False,
    )
    if title:
        figure.suptitle(title)
    return figure


def _span_label(coverage: pd.DataFrame) -> str:
    """The years the windows cover ('2026', '2025–2026'), or the day when they fit in one."""
    first = coverage["window_start"].min().tz_convert("UTC")
    last = coverage["window_end"].max().tz_convert("UTC")
    if last - first <= timedelta(days=1):
        return f"{first:%Y-%m-%d}"
    return f"{first.year}" if first.year == last.year else f"{first.year}–{last.year}"


def _date_numbers(times: pd.Series) -> Any:
    """matplotlib's numbers for tz-aware timestamps (the axis shows them as UTC)."""
    naive = times.dt.tz_convert("UTC").dt.tz_localize(None)
    return mdates.date2num(naive)  # type: ignore[no-untyped-call]


def _labels(rows: pd.DataFrame) -> list[str]:
    labels = []
    for _, row in rows.iterrows():  # one row per owner: a handful, not every job
        text = f"{row['slices_completed']}/{row['slices_total']}"
        if "state" in rows.columns and not _missing(row["state"]):
            text += f" {row['state']}"
        if "eta" in rows.columns and not _missing(row["eta"]) and row["state"] != "loaded":
            text += f", eta {_duration(row['eta'])}"
        labels.append(text)
    return labels


def _duration(value: Any) -> str:
    seconds = int(value.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _missing(value: Any) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


def _owner_rows(axes: Axes, owners: Sequence[str]) -> None:
    axes.set_yticks(range(len(owners)), list(owners))
    axes.set_ylim(len(owners) - 0.5, -0.5)  # the first owner on top
    axes.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)


def _legend(axes: Axes, statuses: Sequence[str]) -> None:
    axes.legend(
        handles=[Patch(color=STATUS_COLOURS[status], label=status) for status in statuses],
        loc="lower left",
        bbox_to_anchor=(0, 1.12),
        ncols=max(len(statuses), 1),
        fontsize="small",
        frameon=False,
    )


def _nothing(axes: Axes, message: str) -> None:
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()


def _require(frame: pd.DataFrame, columns: Sequence[str], call: str) -> None:
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        from synclane.model import ConfigError

        raise ConfigError(
            f"this is not a frame of app.{call}(...): it has no {', '.join(missing)} column"
        )
