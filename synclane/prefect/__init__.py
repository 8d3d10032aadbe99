"""synclane under Prefect: a block, four flows and their deployments.

Install with `pip install "synclane[prefect]"`. Importing this package imports Prefect;
`import synclane` never does. Prefect imports it through the `prefect.collections` entry point,
so `prefect block register -m synclane.prefect` and the UI know the `SyncLaneDatabase` block.
"""

from synclane.prefect.blocks import SyncLaneDatabase
from synclane.prefect.flows import backfill, plan, requeue, work
from synclane.prefect.serve import deployments, serve

__all__ = ["SyncLaneDatabase", "backfill", "deployments", "plan", "requeue", "serve", "work"]
