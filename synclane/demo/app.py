"""The demo app for the command line: `synclane --app synclane.demo.app:app ...`.

Its database is $SYNCLANE_DSN when set, else the embedded PostgreSQL.
"""

from synclane.demo import build_app

app = build_app()
