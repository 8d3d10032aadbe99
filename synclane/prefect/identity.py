"""Which jobs table a flow run works on, as a name that is safe to show: artifact keys and event
resource ids are built from it, so two databases that use the same schema name never overwrite
each other's artifacts, and no key or event ever holds a DSN or a password.

No Prefect import here: the identity is read from PostgreSQL.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import conninfo_to_dict

from synclane.app import SyncLane


@dataclass(frozen=True)
class TableIdentity:
    """A jobs table: the database's name, a digest that tells databases of that name apart, and
    the schema. `slug` is all three in lowercase letters, digits and dashes, e.g.
    'shop-3f2a9c1b-synclane' (the digest covers the database's name as it is; a schema that is
    not plain lowercase letters and digits carries a digest of its own, see `key_part`)."""

    database: str
    digest: str
    schema: str

    @property
    def slug(self) -> str:
        return f"{slugify(self.database) or 'db'}-{self.digest}-{key_part(self.schema)}"

    @property
    def label(self) -> str:
        """For people: 'shop (3f2a9c1b) · schema synclane'."""
        return f"{self.database} ({self.digest}) · schema {self.schema}"


# The cluster's system identifier is fixed when the cluster is created and differs between
# clusters, however they are reached (a host name, an address, a pooler); with the database name
# it names one database. Executable by every role unless an administrator revoked it.
_IDENTITY = "SELECT system_identifier::text, current_database() FROM pg_control_system()"


def table_identity(app: SyncLane) -> TableIdentity:
    """The identity of the app's jobs table, read from the database it is connected to."""
    try:
        with app.connect() as conn:
            row = conn.execute(_IDENTITY).fetchone()
        assert row is not None
        cluster, database = str(row[0]), str(row[1])
    except psycopg.errors.InsufficientPrivilege:
        cluster, database = where_it_points(app.dsn)
    digest = hashlib.sha256(f"{cluster}/{database}".encode()).hexdigest()[:8]
    return TableIdentity(database=database, digest=digest, schema=app.schema)


def where_it_points(dsn: str) -> tuple[str, str]:
    """('host:port', database) of a DSN, for a role that may not read the cluster's identifier:
    where it points, never who connects or with which password."""
    params = conninfo_to_dict(dsn)
    database = str(params.get("dbname") or params.get("user") or "postgres")
    return f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}", database


def slugify(text: str) -> str:
    """Lowercase letters, digits and single dashes (what Prefect accepts in an artifact key)."""
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


_PLAIN = re.compile(r"[a-z0-9]+")


def key_part(name: str) -> str:
    """A name (a schema, a queue, a type) in a key: as it is when it is plain lowercase letters
    and digits, else its slug and 8 hex digits of its digest, so that names that differ only by
    case or punctuation ('orch_a', 'Orch_A', 'orch-a') never share a key: 'orch-a-1c3e5a7b'."""
    if _PLAIN.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{slugify(name)}-{digest}".lstrip("-")


def artifact_key(table: TableIdentity, *parts: str) -> str:
    """The key of an artifact about this table: 'synclane-<table slug>-<parts>', each part as
    `key_part` writes it, e.g. 'synclane-shop-3f2a9c1b-synclane-progress-orders'."""
    return "-".join(["synclane", table.slug, *map(key_part, parts)])
