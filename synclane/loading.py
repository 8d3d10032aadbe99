"""Find the app a command or a deployment names: `package.module:attribute`, like uvicorn's."""

from __future__ import annotations

import importlib
import os
import sys
from types import FunctionType, ModuleType

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
    except ModuleNotFoundError as error:
        if _names_the_app_module(error.name, module_name):
            raise ConfigError(_not_found(app_path, module_name)) from None
        raise ConfigError(
            f"the app module {module_name!r} was found, but its import of {error.name!r} failed "
            f"({first_line(error)}); install the package that provides it into the Python that "
            f"runs synclane ({sys.executable})"
        ) from error
    except ImportError as error:
        # `from x import y` without a y, an import circle, a broken compiled extension
        raise ConfigError(
            f"the app module {module_name!r} was found, but an import in it failed: "
            f"{first_line(error)}"
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
        raise ConfigError(_not_an_app(app_path, module, attribute, app))
    if dsn is not None and app.dsn != dsn:
        raise ConfigError(
            f"the app {app_path!r} is not connected to the DSN it was given: build it with "
            "SyncLane(None, ...) so that it takes its DSN from $SYNCLANE_DSN (or it was imported "
            "earlier in this process with another DSN)"
        )
    return app


def _names_the_app_module(missing: str | None, module_name: str) -> bool:
    """Whether a ModuleNotFoundError is about the app's module (or a package on its path)
    rather than about something the module imports."""
    if missing is None:
        return False
    return module_name == missing or module_name.startswith(missing + ".")


def _not_found(app_path: str, module_name: str) -> str:
    package, _, leaf = module_name.rpartition(".")
    if package and package in sys.modules:  # the package was imported: it lacks the module
        return (
            f"cannot import the app {app_path!r}: the package {package!r} has no module "
            f"{leaf!r}; check the app path (package.module:attribute)"
        )
    return (
        f"cannot import the app {app_path!r}: there is no module {module_name.split('.')[0]!r}; "
        "install its package or run from the folder that holds it"
    )


def _not_an_app(app_path: str, module: ModuleType, attribute: str, found: object) -> str:
    """What the module holds instead, and the SyncLanes it does define (a path that names the
    wrong attribute, or a module that shadows the user's own: its file says which it is)."""
    apps = sorted(name for name, value in vars(module).items() if isinstance(value, SyncLane))
    if len(apps) == 1:
        hint = f"its SyncLane is {apps[0]!r}: the app path {module.__name__}:{apps[0]}"
    elif apps:
        hint = "its SyncLanes are " + ", ".join(repr(name) for name in apps)
    else:
        hint = "the module defines no SyncLane"
    if found is None:
        where = getattr(module, "__file__", None) or "a namespace package"
        return f"the module {module.__name__!r} ({where}) has no {attribute!r}; {hint}"
    kind = "function" if isinstance(found, FunctionType) else type(found).__name__
    return f"the app path {app_path!r} names a {kind}, not a SyncLane; {hint}"


def split_app_path(app_path: str) -> tuple[str, str]:
    """'package.module:attribute' → ('package.module', 'attribute'), or a ConfigError."""
    module_name, _, attribute = str(app_path).partition(":")
    if not module_name or not attribute.isidentifier() or " " in module_name:
        raise ConfigError(
            f"app path {app_path!r} must look like package.module:attribute, "
            "e.g. synclane.demo.app:app"
        )
    return module_name, attribute
