"""The names of one app's Dagster definitions, and how their runs reach the app."""

from __future__ import annotations

from dagster import AssetExecutionContext, AssetKey, OpExecutionContext

from synclane.app import SyncLane
from synclane.model import ConfigError


class Names:
    """The names of one app's definitions: its resource key, jobs, assets and group."""

    def __init__(self, name: str) -> None:
        self.resource = name
        self.plan = f"{name}_plan"
        self.work = f"{name}_work"
        self.backfill = f"{name}_backfill"
        self.requeue = f"{name}_requeue"
        # Ops are named apart from their jobs (Dagster wants distinct names); run config
        # names the op: {"ops": {"synclane_widen_history": {"config": {...}}}}.
        self.plan_op = f"{name}_plan_queues"
        self.work_op = f"{name}_run_worker"
        self.backfill_op = f"{name}_widen_history"
        self.requeue_op = f"{name}_requeue_jobs"

    def asset_key(self, queue: str) -> AssetKey:
        return AssetKey([self.resource, queue])

    def app(self, context: OpExecutionContext | AssetExecutionContext, shape: SyncLane) -> SyncLane:
        """The run's app, from the resource; it must be the app the definitions were built for."""
        resource = getattr(context.resources, self.resource)
        app: SyncLane = resource.get_app()
        if app.schema != shape.schema or set(app.queues) != set(shape.queues):
            raise ConfigError(
                f"the {self.resource!r} resource gives the app of schema {app.schema!r} with "
                f"queues {sorted(app.queues)}, but these definitions were built for schema "
                f"{shape.schema!r} with queues {sorted(shape.queues)}; point the resource at the "
                "same app"
            )
        return app
