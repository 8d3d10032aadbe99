"""synclane under Dagster: a resource, and the definitions of an app ready to load.

Install with `pip install "synclane[dagster]"`. Importing this package imports Dagster;
`import synclane` never does.

    from synclane.dagster import definitions
    from mypackage.sync import app

    defs = definitions(app)      # `dagster dev -f this_file.py`
"""

from synclane.dagster.adhoc import BackfillConfig, RequeueConfig
from synclane.dagster.definitions import definitions
from synclane.dagster.resource import SyncLaneResource
from synclane.dagster.work import WorkConfig

__all__ = ["BackfillConfig", "RequeueConfig", "SyncLaneResource", "WorkConfig", "definitions"]
