"""Every statement synclane runs, by name, rendered for one schema; and the schema itself.

The statements live in sql/*.sql under `-- name: x` headers, each with a line saying what it
guarantees; the module that uses a statement runs it (`Store.query(name)`). This module applies
and checks the schema (sql/schema.sql) and knows nothing of handlers or owners."""

from __future__ import annotations

import hashlib
import logging
import re
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from synclane.errors import SchemaError, first_line
from synclane.model import ConfigError, unstorable
from synclane.read_only import ServerReadOnly

log = logging.getLogger("synclane")

# 2 added the index jobs_open_lanes; 3 the lanes table and held leases; 4 the lanes' hints written
# by every stop and arrival (the functions unpark_lane and lanes_of_new_jobs), and dropped
# jobs_open_lanes; 5 replaced those with wakes that triggers write (lane_wakes), and made the
# queue's slots count every live lease (jobs_leased_queue_slot); 6 planned history lazily: the
# histories table, and the next older slice planned by the database as one finishes; 7 the marks
# of settled owners (owners.settled_*) and the plan epoch that ends them (plan_epoch); 8 the
# checks of jobs in the form PostgreSQL reads fastest, added NOT VALID and validated afterwards
SCHEMA_VERSION = 8
# How many jobs at the front of the line the take statement looks at before it searches lane by
# lane (see docs/performance.md: the front answers in well under a millisecond).
FRONT_SIZE = 64

# What every session of synclane's own sets when it connects (not through a transaction pooler,
# where a SET would reach whoever gets the server connection next: docs/scaling.md has the role
# settings instead). A database's or a role's defaults may differ:
# - synclane's statements are written for READ COMMITTED: a take or a write that meets a row
#   another worker just changed rechecks it and goes on. A stricter default_transaction_isolation
#   turns each such meeting into a serialization error (a transaction that needs SERIALIZABLE
#   asks for it).
# - psycopg reads times and durations sent as text only in PostgreSQL's default styles: under
#   `DateStyle = 'SQL, DMY'` the planner failed with "can't parse timestamptz with DateStyle".
# - The time zone: synclane compares instants, but times read in psql are easier in UTC.
SESSION = (
    "SET TIME ZONE 'UTC'",
    "SET default_transaction_isolation = 'read committed'",
    "SET DateStyle = 'ISO'",
    "SET IntervalStyle = 'postgres'",
)

# The styles of SESSION as read settings (the page's and the metrics' reads set them for each
# transaction through a transaction pooler, with `read_settings`, and per session otherwise).
READ_STYLES = {"datestyle": "ISO", "intervalstyle": "postgres"}

# Settings of every worker connection besides. A prepared statement's first executions get custom
# plans; for the take statement planning costs as much as running (about 0.3 ms each) and the
# generic plan is the same plan, so workers always use it (docs/performance.md). JIT compiles
# again at every execution: for statements that run in about a millisecond it only adds time (a
# variant of take_by_lane whose row estimates crossed jit_above_cost took 370 ms instead of 9).
WORKER_SESSION = (
    *SESSION,
    "SET plan_cache_mode = force_generic_plan",
    "SET jit = off",
)


def session_sql(settings: tuple[str, ...]) -> str:
    """The settings as one statement: one round trip when a connection opens."""
    return "; ".join(settings)


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
# the tables schema.sql creates, in its order
TABLE_NAMES = re.findall(r"CREATE TABLE IF NOT EXISTS \{schema\}\.(\w+)", SCHEMA_SQL)


# PostgreSQL refuses channel names of 64 bytes or more.
_CHANNEL_BYTES = 63


def channel(schema: str) -> str:
    """The channel a schema's workers LISTEN on: 'synclane.<schema>', or 'synclane.<md5 of it>'
    when that would be too long for PostgreSQL. `LISTEN "synclane.synclane"` in psql shows it."""
    name = f"synclane.{schema}"
    if len(name.encode("utf-8")) <= _CHANNEL_BYTES:
        return name
    return f"synclane.{hashlib.md5(schema.encode('utf-8')).hexdigest()}"


def render(template: str, schema: str) -> sql.Composed:
    """The schema goes in as a quoted identifier ({schema}), or as a quoted string literal where
    a statement compares it with a catalog's text ({schema_name}), never as bare text; the
    schema's notification channel ({channel}) as a string literal."""
    return sql.SQL(template).format(
        schema=sql.Identifier(schema),
        schema_name=sql.Literal(schema),
        channel=sql.Literal(channel(schema)),
    )


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


def compact(name: str, text: str) -> str:
    """A statement as it is sent: its comments and indentation left out, a first line naming it
    (what pg_stat_activity and the server's log show). psycopg converts a statement's
    placeholders once and keeps the result for statements of at most 4 KiB only; take_front with
    its comments is 7 KiB, and converting it at every execution cost a worker about 0.15 ms a
    take (docs/performance.md)."""
    lines = []
    for line in text.splitlines():
        code = line.strip()
        cut = code.find("--")
        while cut >= 0 and code.count("'", 0, cut) % 2:  # "--" inside a string literal stays
            cut = code.find("--", cut + 2)
        if cut >= 0:
            code = code[:cut].rstrip()
        if code:
            lines.append(code)
    return "\n".join([f"-- synclane: {name}", *lines])


# psycopg keeps the conversion of a statement's placeholders for statements up to this size
# (MAX_CACHED_STATEMENT_LENGTH); a longer one is converted again at every execution.
CACHED_BYTES = 4096

_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]|%%")


def positional(text: str) -> tuple[str, tuple[str, ...]]:
    """A statement with PostgreSQL's own placeholders ($1, $2 …) for its named ones, and the
    names in their order: what a raw cursor sends as it is, with no conversion at all."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _PLACEHOLDER.sub(number, text), tuple(names)


# A statement as it is sent: bytes, or (for a schema whose name is not ASCII) psycopg's composed
# SQL, which it encodes for each connection's client encoding.
Statement = bytes | sql.Composed


def sendable(composed: sql.Composed) -> Statement:
    """The statement as the bytes every connection is sent, where they are the same in every
    client encoding (ASCII: every encoding PostgreSQL offers a client agrees on it); else as it
    is. psycopg encodes a composed statement again at every execution, its identifiers quoted
    one by one: about 44 µs a take statement, which names nine."""
    text = composed.as_string(None)
    return text.encode("ascii") if text.isascii() else composed


def _statement_timeout(conn: psycopg.Connection[Any]) -> str | None:
    """The connection's statement_timeout, None when it has none (read after a statement it
    cancelled, whose transaction has rolled back)."""
    row = conn.execute("SHOW statement_timeout").fetchone()
    conn.commit()
    return None if row is None or row[0] == "0" else str(row[0])


class Store:
    """The statements, rendered once for one schema, and the schema's version."""

    def __init__(self, schema: str) -> None:
        self.schema = check_schema_name(schema)
        self._queries = {
            name: sendable(render(compact(name, text), self.schema))
            for name, text in QUERIES.items()
        }
        self._positional: dict[str, tuple[Statement, tuple[str, ...]]] = {}
        self._fits: dict[str, bool] = {}

    def query(self, name: str) -> Statement:
        return self._queries[name]

    def text(self, name: str) -> str:
        """A statement as it is sent, as text."""
        query = self.query(name)
        return query.decode("ascii") if isinstance(query, bytes) else query.as_string(None)

    def fits_cache(self, name: str) -> bool:
        """Whether psycopg keeps the statement's conversion (else run it through a raw cursor,
        `positional`)."""
        if name not in self._fits:
            self._fits[name] = len(self.text(name).encode("utf-8")) <= CACHED_BYTES
        return self._fits[name]

    def positional(self, name: str) -> tuple[Statement, tuple[str, ...]]:
        """A statement for a raw cursor (psycopg's RawCursor), and the names of its parameters
        in order. The worker's two take statements run so: each is over the 4 KiB up to which
        psycopg keeps a statement's conversion, and they run for every job."""
        if name not in self._positional:
            text, names = positional(compact(name, QUERIES[name]))
            self._positional[name] = (sendable(render(text, self.schema)), names)
        return self._positional[name]

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
        if version is not None and version < 5:
            self._refuse_with_old_workers(conn, version)
        try:
            with conn.transaction():
                conn.execute(self.query("migration_lock"), {"schema": self.schema})
                conn.execute(render(SCHEMA_SQL, self.schema))
        except (psycopg.errors.ReadOnlySqlTransaction, ServerReadOnly):
            raise SchemaError(
                f"schema {self.schema!r} cannot be created or upgraded on a read-only connection "
                "(a standby, or default_transaction_read_only is on for this role or database): "
                "run app.migrate() (or `synclane migrate`) once against the primary with a "
                "connection that may write"
            ) from None
        except psycopg.errors.QueryCanceled:
            # by the connection's statement_timeout (a parallel index build reports it as a
            # "user request" of its workers' leader), or by someone when there is none
            if (timeout := _statement_timeout(conn)) is None:
                raise
            raise self._migration_timed_out(version, timeout) from None
        except psycopg.OperationalError:
            raise
        except psycopg.errors.InsufficientPrivilege as error:
            raise SchemaError(
                f"schema {self.schema!r} cannot be created or upgraded by this role "
                f"({first_line(error)}); run app.migrate() (or `synclane migrate`) once as a "
                "role that may, or apply docs/schema.sql, then start with create_schema=False"
            ) from None
        except psycopg.DatabaseError as error:
            raise self._migration_failed(conn, version, error) from None
        quoted = sql.Identifier(self.schema).as_string(None)
        try:
            with conn.transaction():
                row = conn.execute(self.query("validate_checks")).fetchone()
        except psycopg.errors.QueryCanceled:
            if _statement_timeout(conn) is None:
                raise
            log.warning(
                "schema %r is at version %d, but the check of its older rows was cut short by "
                "the connection's statement_timeout; the checks refuse every new write all the "
                "same. Run SELECT %s.validate_checks() once with a longer one (SET "
                "statement_timeout = 0 first)",
                self.schema,
                SCHEMA_VERSION,
                quoted,
            )
            return SCHEMA_VERSION
        for check in row[0] if row is not None else []:
            log.warning(
                "schema %r: rows of %s.jobs break its check %s (they were written while the "
                "check was off); it refuses every new write all the same. Find them with the "
                "check's condition (\\d %s.jobs shows it), fix them, then run SELECT "
                "%s.validate_checks()",
                self.schema,
                quoted,
                check,
                quoted,
                quoted,
            )
        return SCHEMA_VERSION

    def _migration_timed_out(self, version: int | None, timeout: str) -> SchemaError:
        """The error of a migration that the connection's statement_timeout ended (managed
        PostgreSQL often sets one for application roles; an index built on a large jobs table,
        or a wait for a busy one, takes longer)."""
        step = "created" if version is None else f"upgraded from version {version}"
        return SchemaError(
            f"schema {self.schema!r} could not be {step} to version {SCHEMA_VERSION}: the "
            f"connection's statement_timeout ({timeout}) ended it; nothing was changed (the "
            "migration is one transaction). Run it once without one: PGOPTIONS='-c "
            "statement_timeout=0' synclane migrate, or app.migrate() on a DSN with "
            "options='-c statement_timeout=0'"
        )

    def _migration_failed(
        self, conn: psycopg.Connection[Any], version: int | None, error: psycopg.Error
    ) -> SchemaError:
        """The error of a migration whose DDL failed (its transaction rolled back). The DDL is
        idempotent on synclane's own tables, so on a schema without a version table a table by
        one of synclane's names is someone else's; any other failure is told as the server
        said it."""
        if version is None:
            asked = {"schema": self.schema, "names": TABLE_NAMES}
            found = [row[0] for row in conn.execute(self.query("tables_present"), asked)]
            conn.commit()
            if found:
                return SchemaError(
                    f"schema {self.schema!r} could not be set up ({first_line(error)}): it holds "
                    f"a table synclane did not create ({', '.join(found)}); give synclane a "
                    "schema of its own"
                )
        step = "created" if version is None else f"upgraded from version {version}"
        return SchemaError(
            f"schema {self.schema!r} could not be {step} to version {SCHEMA_VERSION}: "
            f"{first_line(error)}; nothing was changed (the migration is one transaction)"
        )

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

    def _refuse_with_old_workers(self, conn: psycopg.Connection[Any], version: int) -> None:
        """Version 5 moved the lanes' hints out of the workers' statements: a worker of version 3
        or 4 still running beside it would write hints that version 5 does not read, hiding
        jobs, and its take statement has the shape that crashes PostgreSQL (docs/reliability.md).
        They must stop before the schema moves on."""
        try:
            with conn.transaction():
                alive = [row[0] for row in conn.execute(self.query("workers_alive"))]
        except psycopg.errors.UndefinedTable:
            return  # older than the workers list: nothing says who runs
        if alive:
            raise SchemaError(
                f"schema {self.schema!r} is at version {version} and these workers still run on "
                f"it: {', '.join(alive[:10])}{' …' if len(alive) > 10 else ''}; stop them, then "
                f"start this synclane (schema version {SCHEMA_VERSION}): a worker of version "
                f'{version} beside it would hide jobs (docs/operations.md, "Upgrading")'
            )

    def _refuse_newer(self, version: int | None) -> None:
        if version is not None and version > SCHEMA_VERSION:
            raise SchemaError(
                f"schema {self.schema!r} was created by a newer synclane (schema version "
                f"{version}, this one knows {SCHEMA_VERSION}); upgrade synclane instead of "
                "letting an older one write to it"
            )
