"""The demo as a Dagster code location: plan every minute, keep one worker run going, and
backfill and requeue from the launchpad.

    pip install "synclane[dagster]"
    export SYNCLANE_DSN=postgresql://user:password@host:5432/db    # else the embedded PostgreSQL
    dagster dev -f flows/dagster_defs.py

Every process Dagster starts (the code server, each run) imports this file and the demo app,
which takes its database from $SYNCLANE_DSN. For your own app, import it instead of the demo's;
docs/dagster.md shows a resource that names the DSN as an EnvVar.
"""

from synclane.dagster import definitions
from synclane.demo.app import app

defs = definitions(app)
