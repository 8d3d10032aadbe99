-- synclane schema, version 3. Every sync job is one row of "synclane".jobs.
-- synclane applies this at start-up (SyncLane(..., create_schema=True)); teams that run their own
-- migrations apply docs/schema.sql, which is this file rendered for the schema "synclane".
-- Idempotent: every statement can run again without changing anything.

CREATE SCHEMA IF NOT EXISTS "synclane";

CREATE TABLE IF NOT EXISTS "synclane".schema_version (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS "synclane".jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    owner text NOT NULL,
    lane text NOT NULL,
    type text NOT NULL,
    mode text NOT NULL CHECK (mode IN ('initial', 'recurring', 'manual')),
    status text NOT NULL DEFAULT 'pending' CHECK (status IN (
        'pending', 'running', 'completed', 'failed', 'deferred', 'abandoned', 'cancelled')),
    priority integer NOT NULL DEFAULT 0,
    window_start timestamptz,
    window_end timestamptz,
    dedup_key text NOT NULL,
    cursor text,
    processed_count bigint NOT NULL DEFAULT 0 CHECK (processed_count >= 0),
    attempt_count integer NOT NULL DEFAULT 0,
    throttle_count integer NOT NULL DEFAULT 0,
    error text,
    next_run_at timestamptz NOT NULL DEFAULT now(),
    leased_by text,
    lease_token uuid,
    lease_expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    heartbeat_at timestamptz,
    completed_at timestamptz,
    CHECK (window_start IS NULL OR window_end IS NULL OR window_start < window_end)
);

-- The cause of an error: its first line with UUIDs, hex strings and numbers masked, so that
-- "order 41 not found" and "order 97 not found" are one cause. Used by failures() and
-- requeue(cause=...); usable from psql too.
CREATE OR REPLACE FUNCTION "synclane".error_cause(error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT regexp_replace(regexp_replace(regexp_replace(
        split_part(error, E'\n', 1),
        '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
        '\m(0x[0-9a-fA-F]+|[0-9a-fA-F]*[0-9][0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*|[0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*[0-9][0-9a-fA-F]*)\M', '<hex>', 'g'),
        '[0-9]+', '<n>', 'g')
$$;

-- A planned job is created once, however many planners run at the same moment.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_dedup_key
    ON "synclane".jobs (queue, owner, type, dedup_key);

-- A lane is exclusive: at most one running job per queue and lane, across every process.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_running_lane
    ON "synclane".jobs (queue, lane) WHERE status = 'running';

-- Taking a job reads only open rows, whatever the size of the history.
-- In taking order, for the common case where the best job's lane is free.
CREATE INDEX IF NOT EXISTS jobs_claim_order
    ON "synclane".jobs (queue, priority, window_start DESC NULLS LAST, id)
    WHERE status IN ('pending', 'failed', 'deferred');

-- Lane by lane, for when the jobs at the front all wait behind busy lanes.
CREATE INDEX IF NOT EXISTS jobs_claim_lane
    ON "synclane".jobs (queue, lane, priority, window_start DESC NULLS LAST, id)
    WHERE status IN ('pending', 'failed', 'deferred');

-- Version 2: the lanes that have open jobs, for stepping from one lane to the next. Its keys
-- repeat, so PostgreSQL stores each lane once with a list of rows: a step reads about half the
-- pages it reads in jobs_claim_lane. Taking and finishing a job write no entry here (running
-- and finished rows are outside it).
CREATE INDEX IF NOT EXISTS jobs_open_lanes
    ON "synclane".jobs (queue, lane)
    WHERE status IN ('pending', 'failed', 'deferred');

-- Planning asks per owner and type whether a job is still open.
CREATE INDEX IF NOT EXISTS jobs_open_owner
    ON "synclane".jobs (queue, owner, type, mode)
    WHERE status IN ('pending', 'running', 'failed', 'deferred');

-- Planning finds the oldest slice and where coverage ends without scanning history.
CREATE INDEX IF NOT EXISTS jobs_owner_window
    ON "synclane".jobs (queue, owner, type, window_end) WHERE window_end IS NOT NULL;

-- Planning finds when a snapshot type's newest job was created without scanning its history.
-- (Each row is in this index or in jobs_owner_window, never both: fewer index writes a job.)
CREATE INDEX IF NOT EXISTS jobs_owner_created
    ON "synclane".jobs (queue, owner, type, created_at) WHERE window_end IS NULL;

-- Version 3 ---------------------------------------------------------------------------------

-- A job that stopped running while its page may still be in flight (cancelled, or cancelled
-- and requeued at once) keeps its lane until its worker lets go or its lease ends: a lane is held
-- by a live lease, whatever the row's status. (Replaces jobs_cancelled_lease.)
CREATE INDEX IF NOT EXISTS jobs_held_lease
    ON "synclane".jobs (queue, lane) WHERE status <> 'running' AND lease_token IS NOT NULL;
DROP INDEX IF EXISTS "synclane".jobs_cancelled_lease;

-- What belongs to a lane rather than to its rows: a pause (a throttle) that every job of the
-- lane waits for, also a job that joins the lane during the pause.
CREATE TABLE IF NOT EXISTS "synclane".lanes (
    queue text NOT NULL,
    lane text NOT NULL,
    paused_until timestamptz,
    PRIMARY KEY (queue, lane)
);

-- The attempt ladder, written once: a failed attempt is retried, deferred once the regular
-- attempts are used up, and abandoned when the deferred (last) attempt fails too.
CREATE OR REPLACE FUNCTION "synclane".after_failed_attempt(attempt_count integer, max_attempts integer)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN attempt_count > max_attempts THEN 'abandoned'
                WHEN attempt_count >= max_attempts THEN 'deferred'
                ELSE 'failed' END
$$;

-- How many times in a row the job was handed back with its page abandoned before it ended and
-- no page saved: a page longer than every worker's time budget would otherwise never finish.
ALTER TABLE "synclane".jobs ADD COLUMN IF NOT EXISTS stalls integer NOT NULL DEFAULT 0;

-- Live workers -------------------------------------------------------------------------------

-- Every running worker process, one row each: who it is, what it works, how busy it is. A worker
-- registers at start, beats every few seconds (last_seen_at, busy) and deletes its row when it
-- stops cleanly. A worker that died stops beating: it counts as lost once expires_at has passed,
-- or at once when its session (session_pid) is gone, and any live worker deletes it an hour
-- later. The name is what a running job's leased_by says; two live workers never share one.
CREATE TABLE IF NOT EXISTS "synclane".workers (
    name text PRIMARY KEY,
    instance uuid NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    queues text[] NOT NULL,
    slots integer NOT NULL,
    busy integer NOT NULL DEFAULT 0,
    -- slots that found nothing and wait for work: written at once when it goes from none to
    -- some or back, so that a worker that frees a lane knows whether anyone waits for its job
    waiting integer NOT NULL DEFAULT 0,
    stopping boolean NOT NULL DEFAULT false,
    session_pid integer,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- Metrics count the jobs that wait for a human (abandoned) every few seconds: from this small
-- index, not from a scan of the whole history. Only abandoned rows are in it.
CREATE INDEX IF NOT EXISTS jobs_abandoned
    ON "synclane".jobs (queue) WHERE status = 'abandoned';

INSERT INTO "synclane".schema_version (version) VALUES (3) ON CONFLICT DO NOTHING;
