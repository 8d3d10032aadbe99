"""The demo app for the command line: `synclane --app synclane.demo.app:app ...`.

Its database is $SYNCLANE_DSN when set, else the embedded PostgreSQL; its schema is
$SYNCLANE_SCHEMA when set (the command line sets it from `--schema`), else `synclane`, so that
`synclane --schema x --app synclane.demo.app:app jobs` reads what `synclane --schema x demo` wrote.
"""

import os

from synclane.demo import build_app, data_schema_for

_schema = os.environ.get("SYNCLANE_SCHEMA") or "synclane"
app = build_app(schema=_schema, data_schema=data_schema_for(_schema))
