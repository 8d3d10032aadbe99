"""synclane: sync data from other companies' APIs for many accounts.

Every sync job is one row in a PostgreSQL table you own: its window, its cursor, its attempts,
its error. `import synclane` imports neither pandas nor Prefect.
"""

from synclane.app import SyncLane
from synclane.errors import DatabaseUnavailable, OwnerSourceError, SchemaError, WorkerDied
from synclane.model import Abandon, ConfigError, Job, Owner, Page, Rate, Throttled
from synclane.queues import Queue
from synclane.read_only import ServerReadOnly
from synclane.version import __version__ as __version__

__all__ = [
    "Abandon",
    "ConfigError",
    "DatabaseUnavailable",
    "Job",
    "Owner",
    "OwnerSourceError",
    "Page",
    "Queue",
    "Rate",
    "SchemaError",
    "ServerReadOnly",
    "SyncLane",
    "Throttled",
    "WorkerDied",
]
