"""Find the app a command or a deployment names: `package.module:attribute`, like uvicorn's."""

from __future__ import annotations

import importlib
import os
import sys

from synclane.app import DatabaseUnavailable, SyncLane
from synclane.errors import SchemaError, first_line
from synclane.model import ConfigError


def load_app(app_path: str, dsn: str | None = None) -> SyncLane:
    """Import the app named by `package.module:attribute` (like uvicorn's app paths).

    With `dsn`, the app must be built with `SyncLane(None, ...)`: the DSN reaches it through
    $SYNCLANE_DSN, set before the module is imported, and is checked afterwards. Messages never
    contain the DSN."""
    module_name, attribute = split_app_path(app_path)
    if dsn is not None:
        os.environ["SYNCLANE_DSN"] = dsn
    # Like `python -m`, the working directory is importable: `prefect deploy` projects and
    # `serve` scripts keep the app next to them.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(
            f"cannot import the app {app_path!r}: {error}; install its package or run from the "
            "folder that holds it"
        ) from error
    except (ConfigError, DatabaseUnavailable, SchemaError):
        raise  # synclane's own errors already say what to fix
    except Exception as error:
        # The module's own code failed: one line with where and what, the traceback kept as
        # the cause (`synclane --traceback` shows it).
        first = first_line(error, default="")
        raise ConfigError(
            f"the app module {module_name!r} raised {type(error).__name__}"
            + (f": {first}" if first else "")
            + " while it was imported"
        ) from error
    app = getattr(module, attribute, None)
    if not isinstance(app, SyncLane):
        found = "nothing" if app is None else type(app).__name__
        raise ConfigError(f"app path {app_path!r} names {found}, not a SyncLane")
    if dsn is not None and app.dsn != dsn:
        raise ConfigError(
            f"the app {app_path!r} is not connected to the DSN it was given: build it with "
            "SyncLane(None, ...) so that it takes its DSN from $SYNCLANE_DSN (or it was imported "
            "earlier in this process with another DSN)"
        )
    return app


def split_app_path(app_path: str) -> tuple[str, str]:
    """'package.module:attribute' → ('package.module', 'attribute'), or a ConfigError."""
    module_name, _, attribute = str(app_path).partition(":")
    if not module_name or not attribute.isidentifier() or " " in module_name:
        raise ConfigError(
            f"app path {app_path!r} must look like package.module:attribute, "
            "e.g. synclane.demo.app:app"
        )
    return module_name, attribute
