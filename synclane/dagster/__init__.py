"""synclane under Dagster: a resource, and the definitions of an app ready to load.

Install with `pip install "synclane[dagster]"`. Importing this package imports Dagster;
`import synclane` never does.

    from synclane.dagster import definitions
    from mypackage.sync import app

    defs = definitions(app)      # `dagster dev -f this_file.py`
"""

from synclane.dagster.definitions import (
    BackfillConfig,
    RequeueConfig,
    WorkConfig,
    definitions,
)
from synclane.dagster.resource import SyncLaneResource

__all__ = ["BackfillConfig", "RequeueConfig", "SyncLaneResource", "WorkConfig", "definitions"]
