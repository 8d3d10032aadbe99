"""The demo's four deployments, served from this one process (one machine).

    pip install "synclane[prefect]"
    prefect server start                                    # in another terminal
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    export SYNCLANE_DSN=postgresql://user:password@host:5432/db    # else the embedded PostgreSQL
    python flows/serve.py

The same as `synclane --app synclane.demo.app:app serve`: the app is loaded first (a wrong path
or an unreachable database stops here), then synclane-plan, -work, -backfill and -requeue are
served under the name `synclane-demo-app`. The work pool's deployments in prefect.yaml are
named `demo-pool`, so serving never takes them over (and a name a pool already uses, or one
that serves another table, is refused: a second table needs `synclane serve --name`).

Runs are processes started by this one and inherit its environment: $SYNCLANE_DSN reaches the
demo app (built with SyncLane(None)), PREFECT_LOGGING_EXTRA_LOGGERS=synclane puts the library's
log lines in each run's logs. For several machines, use prefect.yaml beside this file.
"""

from __future__ import annotations

import sys

from synclane import ConfigError, DatabaseUnavailable, SchemaError
from synclane.prefect import serve

APP = "synclane.demo.app:app"

if __name__ == "__main__":
    try:
        # Plan every minute; keep one work run going (9 minutes each, a successor follows).
        serve(APP, work_budget_seconds=540, work_runs=1)
    except (ConfigError, DatabaseUnavailable, SchemaError) as error:
        sys.exit(f"flows/serve.py: {error}")
