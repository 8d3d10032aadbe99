"""A Prefect block that holds where a synclane app's jobs table is and where its code is."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator

from synclane.app import SyncLane
from synclane.prefect.operations import load_app, split_app_path


class SyncLaneDatabase(Block):
    """The PostgreSQL database of a synclane app and the import path of the app's code. Flows
    load the app through it, so the connection string stays a secret in Prefect.

    Example:
        Load the app bound to the stored database:
        ```python
        from synclane.prefect import SyncLaneDatabase

        database = SyncLaneDatabase.load("BLOCK_NAME")
        app = database.get_app()
        app.plan()
        ```
    """

    _block_type_name = "SyncLane Database"
    _block_type_slug = "synclane-database"
    # No synclane logo is hosted anywhere yet: Prefect's default collection logo.
    _logo_url = "https://images.ctfassets.net/gm98wzqotmnx/08yCE6xpJMX9Kjl5VArDS/c2ede674c20f90b9b6edeab71feffac9/prefect-200x200.png?h=250"  # type: ignore[assignment]
    _documentation_url = "https://pypi.org/project/synclane/"  # type: ignore[assignment]

    dsn: SecretStr = Field(
        title="DSN",
        description=(
            "The PostgreSQL connection string of the database that holds the jobs table, "
            "e.g. postgresql://user:password@host:5432/db."
        ),
    )
    app_path: str = Field(
        title="App path",
        description=(
            "Where the app is, as package.module:attribute (like uvicorn's app paths); the app "
            "must be built with SyncLane(None, ...) so that it takes this block's DSN."
        ),
        examples=["synclane.demo.app:app"],
    )

    @field_validator("app_path")
    @classmethod
    def _check_app_path(cls, value: str) -> str:
        split_app_path(value)
        return value

    def get_app(self) -> SyncLane:
        """Import the app and bind it to this block's DSN (through $SYNCLANE_DSN, set before the
        import; checked after it)."""
        return load_app(self.app_path, self.dsn.get_secret_value())
