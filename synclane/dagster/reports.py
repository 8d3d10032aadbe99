"""What the plan job records about a queue, in Dagster's terms: the metadata of the queue's
asset (how far history is loaded, who is failing) and the result of its asset check (no job
waits for a human).

Everything is read with the notebook SDK (`app.progress`, `app.failures`, `app.depth`): three
aggregate statements per queue, whatever the size of the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from dagster import AssetCheckResult, AssetCheckSeverity, AssetKey, MetadataValue

from synclane.app import SyncLane

if TYPE_CHECKING:
    import pandas as pd

NO_ABANDONED_JOBS = "no_abandoned_jobs"


@dataclass(frozen=True)
class QueueReport:
    """One queue's state, read once, for the asset's metadata and the check's result."""

    queue: str
    progress: pd.DataFrame  # app.progress(queue): one row per owner and type
    failures: pd.DataFrame  # app.failures(queue): open failures grouped by cause
    depth: pd.DataFrame  # app.depth(queue): open jobs by lane and status

    @classmethod
    def read(cls, app: SyncLane, queue: str) -> QueueReport:
        return cls(queue, app.progress(queue, limit=None), app.failures(queue), app.depth(queue))

    # -- numbers ---------------------------------------------------------------------------

    @property
    def slices_total(self) -> int:
        return _total(self.progress, "slices_total")

    @property
    def slices_loaded(self) -> int:
        return _total(self.progress, "slices_completed")

    @property
    def percent(self) -> float:
        """How much of the history is loaded, 0 to 100 (100 when there is none to load)."""
        total = self.slices_total
        return 100.0 if total == 0 else round(100.0 * self.slices_loaded / total, 1)

    def jobs(self, status: str) -> int:
        """Jobs of this status among the failures (failed, deferred, abandoned)."""
        return _total(self.failures, status)

    @property
    def failing_owners(self) -> list[str]:
        """Owners with a job that failed for another reason than a throttle: waiting for a
        retry, deferred, or abandoned. A throttle is the other side asking to slow down."""
        owners: set[str] = set()
        for cause, names in zip(self.failures["cause"], self.failures["owners"], strict=True):
            if not str(cause).startswith("Throttled"):
                owners.update(names)
        return sorted(owners)

    # -- Dagster ---------------------------------------------------------------------------

    def metadata(self, added: int) -> dict[str, Any]:
        """The queue asset's metadata for one planning run; the numbers plot over time."""
        open_jobs = self.depth.groupby("status", observed=False)["jobs"].sum()
        return {
            "jobs_added": MetadataValue.int(added),
            "owners": MetadataValue.int(int(self.progress["owner"].nunique())),
            "slices_loaded": MetadataValue.int(self.slices_loaded),
            "slices_total": MetadataValue.int(self.slices_total),
            "percent_loaded": MetadataValue.float(self.percent),
            "records": MetadataValue.int(_total(self.progress, "records")),
            "failing_owners": MetadataValue.json(self.failing_owners),
            "pending_jobs": MetadataValue.int(int(open_jobs.get("pending", 0))),
            "running_jobs": MetadataValue.int(int(open_jobs.get("running", 0))),
            "failed_jobs": MetadataValue.int(self.jobs("failed")),
            "deferred_jobs": MetadataValue.int(self.jobs("deferred")),
            "abandoned_jobs": MetadataValue.int(self.jobs("abandoned")),
            "progress": MetadataValue.md(progress_table(self.progress)),
        }

    def abandoned_check(self, asset_key: AssetKey, requeue_job: str) -> AssetCheckResult:
        """Fails (severity ERROR) while a job of the queue is abandoned: it will not run again
        until someone requeues it, so it is what a team should be alerted to."""
        abandoned = self.failures[self.failures["abandoned"].fillna(0) > 0]
        count = self.jobs("abandoned")
        metadata: dict[str, Any] = {
            "abandoned_jobs": MetadataValue.int(count),
            "owners": MetadataValue.json(
                sorted({o for names in abandoned["owners"] for o in names})
            ),
        }
        if count:
            metadata["causes"] = MetadataValue.md(causes_table(abandoned))
            metadata["to_retry"] = MetadataValue.text(
                f"fix the cause, then launch {requeue_job} with queue={self.queue!r} and "
                "cause_id=<a cause_id above> (or owner=...): the jobs continue from their cursors"
            )
        return AssetCheckResult(
            asset_key=asset_key,
            check_name=NO_ABANDONED_JOBS,
            passed=count == 0,
            severity=AssetCheckSeverity.ERROR,
            metadata=metadata,
            description=(
                "No job waits for a human."
                if count == 0
                else f"{count} job(s) abandoned: they wait for a fix and a requeue."
            ),
        )


def _total(frame: pd.DataFrame, column: str) -> int:
    return int(frame[column].sum()) if len(frame) else 0


def progress_table(progress: pd.DataFrame) -> str:
    """`app.progress(queue)` as a markdown table for Dagster's UI."""
    if progress.empty:
        return "No owner is planned yet."
    lines = [
        "| owner | type | state | loaded | slices | failed | records | loaded up to | eta |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for row in progress.itertuples(index=False):
        lines.append(
            f"| {row.owner} | {row.type} | {row.state} | {_text(row.percent)} % "
            f"| {row.slices_completed} / {row.slices_total} | {row.slices_failed} "
            f"| {row.records} | {_text(row.coverage_end)} | {_text(row.eta)} |"
        )
    return "\n".join(lines)


def causes_table(failures: pd.DataFrame) -> str:
    """Rows of `app.failures()` as a markdown table: what failed, how often, for whom."""
    lines = [
        "| cause | cause_id | jobs | abandoned | owners | example job ids |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for row in failures.itertuples(index=False):
        cause = str(row.cause).replace("|", "\\|")
        ids = ", ".join(str(i) for i in cast(list[int], row.job_ids)[:5])
        lines.append(
            f"| {cause} | {row.cause_id} | {row.jobs} | {row.abandoned} "
            f"| {', '.join(cast(list[str], row.owners))} | {ids} |"
        )
    return "\n".join(lines)


def _text(value: object) -> str:
    """A cell of a markdown table: missing values (NaT, <NA>) as a dash."""
    import pandas as pd

    if value is None or (not isinstance(value, str) and pd.isna(cast(Any, value))):
        return "–"
    if isinstance(value, pd.Timestamp):
        return value.strftime("%Y-%m-%d %H:%M UTC")
    if isinstance(value, pd.Timedelta):
        return str(value.to_pytimedelta())  # "0:12:30", "2 days, 1:00:00"
    return str(value)
