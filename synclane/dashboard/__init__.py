"""The dashboard: one page showing the jobs table now, the lanes and the workers, with Requeue,
Pause and Resume buttons and the worker's events. docs/dashboard.md has what it shows and its
security model.

- `wsgi_app(app, ...)`: the page as a WSGI callable, to mount in a web app you already run;
- `make_server(app, host=, port=, ...)`: the page on its own server (waitress), bound;
- `serve(app, ..., on_ready=)`: the same, serving until Ctrl-C.

Layout: `state` reads the table (sql/page.sql) into bounded JSON, `web` is the WSGI
application with its checks (`guard`), `server` serves it, `feed` turns events into lines, and
`static/` holds the page itself.
"""

from synclane.dashboard.guard import LOGIN_SECRET_ENV, is_loopback
from synclane.dashboard.server import DashboardServer, make_server, serve
from synclane.dashboard.web import Dashboard, wsgi_app

__all__ = [
    "LOGIN_SECRET_ENV",
    "Dashboard",
    "DashboardServer",
    "is_loopback",
    "make_server",
    "serve",
    "wsgi_app",
]
