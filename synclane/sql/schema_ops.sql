-- Statements about the schema itself: whether it exists, its version, the start-up lock.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

-- name: schema_exists
-- whether the version table exists, so a missing schema gives a clear error instead of SQL noise
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_tables
    WHERE schemaname = %(schema)s AND tablename = 'schema_version'
) AS present;

-- name: schema_version
-- the newest schema version applied
SELECT max(version) AS version FROM {schema}.schema_version;

-- name: tables_present
-- which of the tables synclane creates already exist in a schema that has no version table (a
-- failed first migration: someone else's table by one of these names is the likely cause)
SELECT tablename FROM pg_catalog.pg_tables
WHERE schemaname = %(schema)s AND tablename = ANY (%(names)s)
ORDER BY array_position(%(names)s, tablename::text);

-- name: migration_lock
-- serialises start-up DDL of processes that start at once (transaction-scoped, released at commit)
SELECT pg_advisory_xact_lock(hashtext('synclane schema ' || %(schema)s));

-- name: validate_checks
-- the checks of jobs that a migration added NOT VALID (version 8) are checked against every row,
-- after the migration committed: validating reads the table without holding up its readers or
-- writers (schema.sql, validate_checks); the names of those a row breaks come back
SELECT {schema}.validate_checks() AS broken;

-- name: workers_alive
-- the workers that beat within their expiry, by name and synclane version: asked before a
-- migration that their statements would not survive (fails on a schema without a workers table)
SELECT w.name || ' (synclane ' || w.version || ')' FROM {schema}.workers w
WHERE w.expires_at > now()
ORDER BY w.name;

-- name: read_settings
-- a read's settings for its own transaction only (through a transaction pooler no session is
-- the reader's): a statement timeout, no JIT compilation, memory for its counts, and times and
-- durations in the styles psycopg reads (store.READ_STYLES)
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('jit', %(jit)s, true),
       set_config('work_mem', %(work_mem)s, true),
       set_config('DateStyle', %(datestyle)s, true),
       set_config('IntervalStyle', %(intervalstyle)s, true);
