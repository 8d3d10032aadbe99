"""`SyncLaneResource`: how Dagster ops and assets get a synclane app.

The resource holds where the app's jobs table is (the DSN, best given as `EnvVar`, and the
schema) and where its code is (an app path). Dagster builds resources afresh from their config
in every run, so the resource can hold only config, never the app object itself: it finds its
app by path, or by schema among the apps that `definitions(app)` (or `for_app`) registered in
this process; the code location's module runs that call in every process that runs a job.
"""

from __future__ import annotations

import threading

from dagster import ConfigurableResource
from pydantic import Field, field_validator

from synclane.app import SyncLane
from synclane.loading import load_app, split_app_path
from synclane.model import ConfigError

_registered: dict[str, SyncLane] = {}
_lock = threading.Lock()


def register(app: SyncLane) -> None:
    """Make `app` the app of its schema in this process (the latest registration wins: a
    re-imported module builds a new app for the same table)."""
    if not isinstance(app, SyncLane):
        raise ConfigError(
            f"expected a SyncLane app, got {type(app).__name__} {app!r:.100}; pass the app "
            "object, e.g. `from mypackage.sync import app`"
        )
    with _lock:
        _registered[app.schema] = app


class SyncLaneResource(ConfigurableResource):  # type: ignore[type-arg]
    """The synclane app for Dagster ops and assets: `synclane.get_app()` returns it.

    Give the DSN as `EnvVar("SYNCLANE_DSN")`: Dagster then shows and stores the variable's name,
    never the connection string. Either name the app by `app_path` (it must be built with
    `SyncLane(None, ...)` so that it takes the DSN), or leave `app_path` empty to use the app
    that `synclane.dagster.definitions(app)` registered for `schema_name` in this process.
    """

    app_path: str | None = Field(
        default=None,
        description=(
            "Where the app is, as package.module:attribute, e.g. synclane.demo.app:app. Empty: "
            "the app that synclane.dagster.definitions(app) registered for schema_name."
        ),
    )
    dsn: str | None = Field(
        default=None,
        description=(
            "The PostgreSQL connection string of the jobs table's database; pass "
            "EnvVar('SYNCLANE_DSN') so that it stays a secret. Empty: the app's own."
        ),
    )
    schema_name: str | None = Field(
        default=None,
        description=(
            "The PostgreSQL schema of the jobs table, e.g. synclane. The app must use it. "
            "Empty: whatever schema the app uses (needed when app_path is empty)."
        ),
    )

    @field_validator("app_path")
    @classmethod
    def _check_app_path(cls, value: str | None) -> str | None:
        if value:
            split_app_path(value)
        return value

    @classmethod
    def for_app(cls, app: SyncLane) -> SyncLaneResource:
        """A resource for an app object of this process (registered under its schema)."""
        register(app)
        return cls(schema_name=app.schema)

    def get_app(self) -> SyncLane:
        """The app: imported from `app_path` and bound to `dsn` (through $SYNCLANE_DSN, set
        before the import and checked after it), or the one registered for `schema_name`."""
        app = load_app(self.app_path, self.dsn or None) if self.app_path else self._registered_app()
        if self.schema_name is not None and app.schema != self.schema_name:
            raise ConfigError(
                f"SyncLaneResource: schema_name={self.schema_name!r} but the app "
                f"{self.app_path or ''!r} uses schema {app.schema!r}; make them agree (or leave "
                "schema_name empty)"
            )
        return app

    def _registered_app(self) -> SyncLane:
        if self.schema_name is None:
            raise ConfigError(
                "SyncLaneResource needs app_path='package.module:attribute' (with "
                "dsn=EnvVar('SYNCLANE_DSN')), or schema_name of an app registered by "
                "synclane.dagster.definitions(app)"
            )
        with _lock:
            app = _registered.get(self.schema_name)
        if app is None:
            raise ConfigError(
                f"SyncLaneResource: no app for schema {self.schema_name!r} in this process; set "
                "app_path='package.module:attribute', or build the code location's definitions "
                "with synclane.dagster.definitions(app)"
            )
        if self.dsn and app.dsn != self.dsn:
            raise ConfigError(
                f"SyncLaneResource: the app of schema {self.schema_name!r} is connected to "
                "another database than the resource's dsn; give both the same DSN"
            )
        return app
