"""The only module that runs SQL. It knows statements and rows, nothing of handlers or owners."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from synclane.model import ConfigError, unstorable
from synclane.planning import NewJob

SCHEMA_VERSION = 2  # 2 added the index jobs_open_lanes
# How many jobs at the front of the line the take statement looks at before it searches lane by
# lane (see docs/performance.md: the front answers in well under a millisecond).
FRONT_SIZE = 64

# Settings of every worker connection. A prepared statement's first executions get custom plans;
# for the take statement planning costs as much as running (about 0.3 ms each) and the generic
# plan is the same plan, so workers always use it (docs/performance.md). JIT compiles again at
# every execution: for statements that run in about a millisecond it only adds time (a variant of
# take_by_lane whose row estimates crossed jit_above_cost took 370 ms instead of 9).
WORKER_SESSION = (
    "SET TIME ZONE 'UTC'",
    "SET plan_cache_mode = force_generic_plan",
    "SET jit = off",
)

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _read(filename: str) -> str:
    return resources.files("synclane").joinpath("sql", filename).read_text(encoding="utf-8")


def load_queries(text: str) -> dict[str, str]:
    """Split a file of statements at its `-- name: x` headers."""
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def _load_all() -> dict[str, str]:
    """Every statement of every sql/*.sql file but the schema, by name; a name is used once."""
    found: dict[str, str] = {}
    folder = resources.files("synclane").joinpath("sql")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql") or entry.name == "schema.sql":
            continue
        for name, text in load_queries(entry.read_text(encoding="utf-8")).items():
            if name in found:
                raise RuntimeError(f"statement {name!r} is named twice in synclane/sql/")
            found[name] = text
    return found


QUERIES = _load_all()
SCHEMA_SQL = _read("schema.sql")


def render(template: str, schema: str) -> sql.Composed:
    """The schema goes in as a quoted identifier, never as text."""
    return sql.SQL(template).format(schema=sql.Identifier(schema))


def schema_ddl(schema: str) -> str:
    """The DDL as text for one schema (what docs/schema.sql holds for "synclane")."""
    return render(SCHEMA_SQL, schema).as_string(None)


def check_schema_name(schema: object) -> str:
    if not isinstance(schema, str) or not schema:
        raise ConfigError(f"schema must be a non-empty str, got {schema!r}")
    # 63 bytes of UTF-8, not characters: PostgreSQL cuts longer names silently, so two long
    # names with one beginning would share a table.
    if unstorable(schema) or len(schema.encode("utf-8")) > 63:
        raise ConfigError(
            f"schema {schema!r:.100} is not a PostgreSQL identifier (at most 63 bytes of UTF-8, "
            "no NUL byte); choose a shorter name"
        )
    if schema.startswith("pg_"):
        raise ConfigError(f"schema {schema!r}: names starting with pg_ are reserved by PostgreSQL")
    return schema


@dataclass(frozen=True)
class TakenJob:
    id: int
    queue: str
    owner: str
    lane: str
    type: str
    mode: str
    window_start: datetime | None
    window_end: datetime | None
    cursor: str | None
    attempt_count: int
    throttle_count: int
    processed_count: int
    lease_token: UUID
    previous_status: str


@dataclass(frozen=True)
class Taken:
    """What one take statement did: the ids it completed, the jobs it took (best first)."""

    completed: frozenset[int]
    jobs: list[TakenJob]


class SchemaError(RuntimeError):
    """The schema is missing, or was made by a newer synclane."""


class Store:
    """Statements bound to one schema. Sync methods take a Connection, async ones (a_*) an
    AsyncConnection; every method is one statement (or one transaction, for migrate)."""

    def __init__(self, schema: str) -> None:
        self.schema = check_schema_name(schema)
        self._queries = {name: render(text, self.schema) for name, text in QUERIES.items()}

    def query(self, name: str) -> sql.Composed:
        return self._queries[name]

    # -- schema ---------------------------------------------------------------------------

    def current_version(self, conn: psycopg.Connection[Any]) -> int | None:
        present = conn.execute(self.query("schema_exists"), {"schema": self.schema}).fetchone()
        if not present or not present[0]:
            return None
        row = conn.execute(self.query("schema_version")).fetchone()
        return None if row is None else row[0]

    def migrate(self, conn: psycopg.Connection[Any]) -> int:
        """Create or upgrade the schema; safe when several processes start at once."""
        version = self.current_version(conn)
        conn.commit()
        if version == SCHEMA_VERSION:
            return version
        self._refuse_newer(version)
        try:
            with conn.transaction():
                conn.execute(self.query("migration_lock"), {"schema": self.schema})
                conn.execute(render(SCHEMA_SQL, self.schema))
        except psycopg.OperationalError:
            raise
        except psycopg.errors.InsufficientPrivilege as error:
            raise SchemaError(
                f"schema {self.schema!r} cannot be created or upgraded by this role "
                f"({_first_line(error)}); run app.migrate() (or `synclane migrate`) once as a "
                "role that may, or apply docs/schema.sql, then start with create_schema=False"
            ) from None
        except psycopg.DatabaseError as error:
            # The DDL is idempotent on synclane's own tables; it fails on someone else's.
            raise SchemaError(
                f"schema {self.schema!r} could not be set up ({_first_line(error)}): it holds "
                "tables synclane did not create, such as a jobs table of your own; give synclane "
                "a schema of its own"
            ) from None
        return SCHEMA_VERSION

    def check_version(self, conn: psycopg.Connection[Any]) -> None:
        version = self.current_version(conn)
        conn.commit()
        if version is None:
            raise SchemaError(
                f"schema {self.schema!r} has no synclane table: run app.migrate() (or "
                "`synclane migrate`), or apply docs/schema.sql, or pass create_schema=True"
            )
        self._refuse_newer(version)
        if version < SCHEMA_VERSION:
            raise SchemaError(
                f"schema {self.schema!r} is at version {version}, this synclane needs "
                f"{SCHEMA_VERSION}: run app.migrate()"
            )

    def _refuse_newer(self, version: int | None) -> None:
        if version is not None and version > SCHEMA_VERSION:
            raise SchemaError(
                f"schema {self.schema!r} was created by a newer synclane (schema version "
                f"{version}, this one knows {SCHEMA_VERSION}); upgrade synclane instead of "
                "letting an older one write to it"
            )

    # -- planning -------------------------------------------------------------------------

    def plan_read(
        self,
        conn: psycopg.Connection[Any],
        queue: str,
        owners: Sequence[str],
        types: Sequence[tuple[str, bool]],
    ) -> tuple[datetime, list[dict[str, Any]]]:
        """One read: the database clock and, per owner and type, what exists."""
        with conn.cursor(row_factory=dict_row) as cur:
            if not owners or not types:
                row = cur.execute(self.query("database_now")).fetchone()
                assert row is not None
                return row["now"], []
            rows = cur.execute(
                self.query("plan_read"),
                {
                    "queue": queue,
                    "owners": list(owners),
                    "types": [name for name, _ in types],
                    "windowed": [windowed for _, windowed in types],
                },
            ).fetchall()
        return rows[0]["now"], rows

    def insert_jobs(self, conn: psycopg.Connection[Any], queue: str, jobs: Sequence[NewJob]) -> int:
        """One insert; returns how many rows were new."""
        if not jobs:
            return 0
        cur = conn.execute(
            self.query("insert_jobs"),
            {
                "queue": queue,
                "owners": [j.owner for j in jobs],
                "lanes": [j.lane for j in jobs],
                "types": [j.type for j in jobs],
                "modes": [j.mode for j in jobs],
                "priorities": [j.priority for j in jobs],
                "starts": [j.window_start for j in jobs],
                "ends": [j.window_end for j in jobs],
                "keys": [j.dedup_key for j in jobs],
            },
        )
        return cur.rowcount

    # -- operations -----------------------------------------------------------------------

    def enqueue(self, conn: psycopg.Connection[Any], params: Mapping[str, Any]) -> tuple[int, bool]:
        """Returns the job id and whether it is new (False: the dedup key named an existing job)."""
        row = conn.execute(self.query("enqueue_job"), params).fetchone()
        if row is not None:
            return row[0], True
        row = conn.execute(self.query("job_by_dedup_key"), params).fetchone()
        assert row is not None, "a dedup conflict names an existing row"
        return row[0], False

    def owner_lane(self, conn: psycopg.Connection[Any], queue: str, owner: str) -> str | None:
        row = conn.execute(self.query("owner_lane"), {"queue": queue, "owner": owner}).fetchone()
        return None if row is None else row[0]

    def requeue(
        self,
        conn: psycopg.Connection[Any],
        queue: str,
        owner: str | None,
        type: str | None,
        statuses: Iterable[str],
        ids: Sequence[int] | None,
        cause: str | None = None,
        cause_id: str | None = None,
    ) -> list[int]:
        params = {
            "cause_id": cause_id,
            "queue": queue,
            "owner": owner,
            "type": type,
            "statuses": list(statuses),
            "ids": None if ids is None else list(ids),
            "cause": cause,
        }
        return [row[0] for row in conn.execute(self.query("requeue_jobs"), params).fetchall()]

    def cancel(
        self, conn: psycopg.Connection[Any], queue: str, owner: str, type: str | None, error: str
    ) -> list[int]:
        params = {"queue": queue, "owner": owner, "type": type, "error": error}
        return [row[0] for row in conn.execute(self.query("cancel_jobs"), params).fetchall()]

    def rows(
        self, conn: psycopg.Connection[Any], name: str, params: Mapping[str, Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """A read for a DataFrame: column names and rows."""
        cur = conn.execute(self.query(name), params)
        return [d.name for d in cur.description or []], cur.fetchall()

    # -- worker (async) -------------------------------------------------------------------

    async def a_take(
        self,
        conn: psycopg.AsyncConnection[Any],
        queue: str,
        worker: str,
        lease: timedelta,
        done: Sequence[Mapping[str, Any]] = (),
        plain: int = 1,
    ) -> Taken:
        """One statement for the slots of a worker that ask at the same instant: completes the
        jobs in `done` (each with id, token and count) under their lease guards, and takes one
        job for each completion that went through plus `plain` more, from the front of the line,
        in distinct free lanes. May take fewer (the front waits behind busy lanes, or is short):
        take_by_lane then looks further. Raises psycopg.errors.UniqueViolation when another
        worker won a lane at the same instant; nothing was written then, the completions
        included, and the caller asks again."""
        cur = conn.cursor(row_factory=dict_row)
        params = {
            "queue": queue,
            "worker": worker,
            "lease": lease,
            "front": FRONT_SIZE,
            "plain": plain,
            "done_ids": [job["id"] for job in done],
            "done_tokens": [job["token"] for job in done],
            "done_counts": [job["count"] for job in done],
        }
        await cur.execute(self.query("take_front"), params)
        rows = await cur.fetchall()
        jobs = []
        for row in rows:
            del row["priority"]
            completed = row.pop("completed")
            if row["id"] is not None:
                jobs.append(TakenJob(**row))
        return Taken(frozenset(completed), jobs)

    async def a_take_by_lane(
        self, conn: psycopg.AsyncConnection[Any], queue: str, worker: str, lease: timedelta
    ) -> TakenJob | None:
        """Takes one job looking lane by lane: for when the front of the line waits behind busy
        lanes. Raises UniqueViolation like a_take."""
        cur = conn.cursor(row_factory=dict_row)
        params = {"queue": queue, "worker": worker, "lease": lease}
        await cur.execute(self.query("take_by_lane"), params)
        row = await cur.fetchone()
        return None if row is None else TakenJob(**row)

    async def a_guarded(
        self, conn: psycopg.AsyncConnection[Any], name: str, params: Mapping[str, Any]
    ) -> bool:
        """Runs a statement guarded by id, lease token and status: False when the lease is lost."""
        cur = await conn.execute(self.query(name), params)
        if name == "throttle_job":
            return (await cur.fetchone()) is not None
        return cur.rowcount > 0

    async def a_fail(
        self, conn: psycopg.AsyncConnection[Any], params: Mapping[str, Any]
    ) -> tuple[str, datetime] | None:
        cur = await conn.execute(self.query("fail_job"), params)
        row = await cur.fetchone()
        return None if row is None else (row[0], row[1])

    async def a_reclaim(
        self, conn: psycopg.AsyncConnection[Any], queue: str, max_attempts: int
    ) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            self.query("reclaim_expired"), {"queue": queue, "max_attempts": max_attempts}
        )
        return await cur.fetchall()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
