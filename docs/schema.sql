-- synclane schema, version 8. Every sync job is one row of "synclane".jobs.
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
    -- (the checks are written as PostgreSQL reads them fastest: it reads each check again for
    -- every statement that writes jobs, twice for a take; version 8)
    mode text NOT NULL CHECK (mode = ANY ('{initial,recurring,manual}'::text[])),
    status text NOT NULL DEFAULT 'pending' CHECK (status = ANY (
        '{pending,running,completed,failed,deferred,abandoned,cancelled}'::text[])),
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
    stalls integer NOT NULL DEFAULT 0,
    lane_slot smallint NOT NULL DEFAULT 0,
    queue_slot integer,
    -- a window without one of its ends (NULL) passes, as a check that is not false does
    CHECK (window_start < window_end)
);

-- Columns added since version 2 (a table created by an older synclane gets them here):
-- stalls: how many times in a row the job was handed back with its page abandoned before it
-- ended and no page saved (a page longer than every worker's time budget would never finish);
-- lane_slot, queue_slot: the numbered slot a running job holds in its lane (0 in a lane one wide)
-- and in its queue (only when the queue has max_running).
ALTER TABLE "synclane".jobs ADD COLUMN IF NOT EXISTS stalls integer NOT NULL DEFAULT 0;
ALTER TABLE "synclane".jobs ADD COLUMN IF NOT EXISTS lane_slot smallint NOT NULL DEFAULT 0;
ALTER TABLE "synclane".jobs ADD COLUMN IF NOT EXISTS queue_slot integer;

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

-- A lane is exclusive: at most lane_width running jobs per queue and lane, across every process,
-- each in a slot of its own (one slot, 0, in a lane one wide). Version 2's index knew no slots: it
-- is replaced in place.
DO $migrate$
BEGIN
    -- read from the catalogs by name only (pg_indexes would render every index's definition,
    -- also of tables other sessions are dropping)
    IF EXISTS (SELECT FROM pg_catalog.pg_class i
               JOIN pg_catalog.pg_namespace n ON n.oid = i.relnamespace
               WHERE n.nspname = 'synclane' AND i.relname = 'jobs_running_lane'
                 AND NOT EXISTS (SELECT FROM pg_catalog.pg_attribute a
                                 WHERE a.attrelid = i.oid AND a.attname = 'lane_slot')) THEN
        DROP INDEX "synclane".jobs_running_lane;
    END IF;
END
$migrate$;
CREATE UNIQUE INDEX IF NOT EXISTS jobs_running_lane
    ON "synclane".jobs (queue, lane, lane_slot) WHERE status = 'running';

-- A queue with max_running runs at most that many jobs at once, across every process: each
-- live lease of it holds a numbered slot of the queue (jobs_leased_queue_slot, version 5).

-- Taking a job reads only open rows, whatever the size of the history.
-- In taking order, for the common case where the best job's lane is free.
CREATE INDEX IF NOT EXISTS jobs_claim_order
    ON "synclane".jobs (queue, priority, window_start DESC NULLS LAST, id)
    WHERE status IN ('pending', 'failed', 'deferred');

-- Lane by lane, for when the jobs at the front all wait behind busy lanes.
CREATE INDEX IF NOT EXISTS jobs_claim_lane
    ON "synclane".jobs (queue, lane, priority, window_start DESC NULLS LAST, id)
    WHERE status IN ('pending', 'failed', 'deferred');

-- (Version 2 added jobs_open_lanes, the lanes with open jobs, for a take that stepped from lane
-- to lane; version 3's lanes table replaced that walk, and version 4 drops the index below.)

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

-- Every unfinished row, those waiting for a human included: the page's summary, its worst
-- accounts and its stopped jobs, and failures(), read it instead of the history.
CREATE INDEX IF NOT EXISTS jobs_unfinished
    ON "synclane".jobs (queue, status, owner, type)
    WHERE status IN ('pending', 'running', 'failed', 'deferred', 'abandoned');

-- Queues an operator paused (app.pause): nothing new is taken from them, in any process, and a
-- running job stops at its next page boundary; planning goes on.
CREATE TABLE IF NOT EXISTS "synclane".queue_pauses (
    queue text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text NOT NULL,
    reason text NOT NULL
);

-- Rate limits: at most `count` page starts per lane in any `period` (app.queue(lane_rate=...)),
-- decided on the database clock and shared by every process. A queue's rate, or one lane's, may
-- be changed without a deploy (app.set_lane_rate): queue_rates and lanes.rate_* hold those.
CREATE TABLE IF NOT EXISTS "synclane".queue_rates (
    queue text PRIMARY KEY,
    rate_count integer NOT NULL CHECK (rate_count > 0),
    rate_period interval NOT NULL CHECK (rate_period > interval '0')
);
ALTER TABLE "synclane".lanes ADD COLUMN IF NOT EXISTS rate_count integer CHECK (rate_count > 0);
ALTER TABLE "synclane".lanes ADD COLUMN IF NOT EXISTS rate_period interval
    CHECK (rate_period > interval '0');
-- the newest page starts of the lane (at most rate_count of them), oldest first: a sliding window
ALTER TABLE "synclane".lanes ADD COLUMN IF NOT EXISTS starts timestamptz[] NOT NULL DEFAULT '{}';

-- Version 4: the key each recorded start was asked under (NULL for starts recorded before),
-- aligned with starts, so that a start asked again after a lost answer finds its own.
ALTER TABLE "synclane".lanes ADD COLUMN IF NOT EXISTS start_keys uuid[] NOT NULL DEFAULT '{}';

-- A page start under a lane's rate: records `units` starts and returns 0 when the last period
-- leaves room for them, else how many seconds until it will (and records nothing). A lane paused
-- by a throttle has no room until its pause ends. With `force` it records them whatever the room
-- or the pause (a page that made more calls than it announced). The lane's own rate, then its
-- queue's, then the one given (the declared one) apply, in that order. A start asked under a
-- `key` already recorded returns 0 and records nothing: it is the same start, sent again after
-- its answer was lost.
CREATE OR REPLACE FUNCTION "synclane".lane_page_start(
    queue_name text, lane_name text, declared_count integer, declared_period interval,
    units integer, force boolean, start_key uuid
) RETURNS double precision LANGUAGE plpgsql AS $start$
DECLARE
    allowed integer;
    period interval;
    kept timestamptz[];
    kept_keys uuid[];
    seen boolean;
    held integer;
    pause timestamptz;
    at timestamptz;
BEGIN
    INSERT INTO "synclane".lanes (queue, lane) VALUES (queue_name, lane_name)
    ON CONFLICT (queue, lane) DO NOTHING;
    SELECT coalesce(l.rate_count, q.rate_count, declared_count),
           coalesce(l.rate_period, q.rate_period, declared_period),
           coalesce(start_key = ANY (l.start_keys), false), l.starts, l.start_keys,
           l.paused_until
      INTO allowed, period, seen, kept, kept_keys, pause
      FROM "synclane".lanes l
      LEFT JOIN "synclane".queue_rates q ON q.queue = l.queue
     WHERE l.queue = queue_name AND l.lane = lane_name
       FOR UPDATE OF l;
    -- the instant of this start: when the lane's row is ours, not when the statement began (it
    -- may have waited for another worker's start of the same lane meanwhile)
    at := clock_timestamp();
    IF seen THEN
        RETURN 0;
    END IF;
    IF pause > at AND NOT force THEN
        RETURN greatest(extract(epoch FROM pause - at), 0.001);
    END IF;
    -- the starts still in the window, oldest first, each with its key (in one pass)
    SELECT coalesce(array_agg(u.s ORDER BY u.s, u.n), '{}'),
           coalesce(array_agg(u.k ORDER BY u.s, u.n), '{}')
      INTO kept, kept_keys
      FROM unnest(kept, kept_keys) WITH ORDINALITY AS u (s, k, n)
     WHERE u.s > at - period;
    held := coalesce(array_length(kept, 1), 0);
    IF held + units > allowed AND NOT force THEN
        -- room for `units` more once enough of the oldest starts have left the window
        RETURN greatest(extract(epoch FROM kept[held + units - allowed] + period - at), 0.001);
    END IF;
    kept := kept || ARRAY(SELECT at FROM generate_series(1, units));
    kept_keys := kept_keys || ARRAY(SELECT start_key FROM generate_series(1, units));
    held := held + units;
    UPDATE "synclane".lanes
       SET starts = kept[greatest(held - allowed, 0) + 1:held],
           start_keys = kept_keys[greatest(held - allowed, 0) + 1:held]
     WHERE queue = queue_name AND lane = lane_name;
    RETURN 0;
END
$start$;

-- Version 3's form, without a key (what a worker of that version calls): a start of its own.
CREATE OR REPLACE FUNCTION "synclane".lane_page_start(
    queue_name text, lane_name text, declared_count integer, declared_period interval,
    units integer, force boolean DEFAULT false
) RETURNS double precision LANGUAGE sql AS $start$
    SELECT "synclane".lane_page_start(queue_name, lane_name, declared_count, declared_period,
                                    units, force, NULL::uuid)
$start$;

-- The notebook SDK's reads at a hundred thousand owners (docs/sdk.md, "Cost"): each answers
-- from an index alone instead of visiting a row per job. Refreshes and manual jobs never enter
-- the two history indexes, and taking or finishing a job writes no entry in jobs_waiting or
-- jobs_history_unloaded (running and finished rows are outside them); a history slice costs an
-- entry in jobs_history when it is planned, taken and finished.
-- progress() counts each owner's history slices here, walking owners in order, so that its
-- limit stops the walk.
CREATE INDEX IF NOT EXISTS jobs_history
    ON "synclane".jobs (queue, owner, type)
    INCLUDE (status, processed_count, window_start, window_end, next_run_at, started_at,
             completed_at)
    WHERE mode = 'initial';
-- progress(state=...) finds here the few owners whose first load is not done (their running
-- slices are in jobs_running_lane).
CREATE INDEX IF NOT EXISTS jobs_history_unloaded
    ON "synclane".jobs (queue, status, owner) INCLUDE (next_run_at)
    WHERE mode = 'initial' AND status IN ('pending', 'failed', 'deferred', 'abandoned', 'cancelled');
-- lanes() and depth() count the jobs that wait (pending, failed, deferred) here.
CREATE INDEX IF NOT EXISTS jobs_waiting
    ON "synclane".jobs (queue, lane, status, owner) INCLUDE (type, next_run_at, created_at)
    WHERE status IN ('pending', 'failed', 'deferred');

-- Where a worker looks when the front of the line waits behind busy lanes (take_by_lane, "a
-- look"): each lane's due_at says when a look should read the lane again. It is a cache of what
-- the lane's jobs say, written only by looks (and by folded wakes, below): a time (its earliest
-- open job, or when its throttle's pause ends), 'infinity' (busy when last read: "parked"), or
-- NULL (nothing open when last read). Nothing hides behind it: whatever makes a job of a lane
-- due, or may give a lane room, writes a wake (lane_wakes, version 5) that the next look reads.
ALTER TABLE "synclane".lanes ADD COLUMN IF NOT EXISTS due_at timestamptz;
CREATE INDEX IF NOT EXISTS lanes_due ON "synclane".lanes (queue, due_at) WHERE due_at IS NOT NULL;

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
    -- the backend that beats for it (its session), or -1 for a worker that beats through a
    -- transaction pooler and has no session of its own
    session_pid integer,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- Metrics count the jobs that wait for a human (abandoned) every few seconds: from this small
-- index, not from a scan of the whole history. Only abandoned rows are in it.
CREATE INDEX IF NOT EXISTS jobs_abandoned
    ON "synclane".jobs (queue) WHERE status = 'abandoned';

-- Planning at scale ------------------------------------------------------------------------
-- (synclane/rounds.py; docs/planning.md "Planning in the background" and docs/scaling.md)

-- The owners each queue's owner source named when it was last reconciled, with the lane their
-- jobs are planned into. A lane change moves the owner's open jobs and this row in one
-- transaction, so that new jobs never join a lane the open ones have not moved to. An owner the
-- source stopped naming is deleted here (its jobs stay); `planned` is false until its first plan.
CREATE TABLE IF NOT EXISTS "synclane".owners (
    queue text NOT NULL,
    owner text NOT NULL,
    lane text NOT NULL,
    planned boolean NOT NULL DEFAULT false,
    PRIMARY KEY (queue, owner)
);

-- The owners waiting for their first plan, found without reading the others.
CREATE INDEX IF NOT EXISTS owners_unplanned ON "synclane".owners (queue, owner) WHERE NOT planned;

-- Per queue and type: the period every owner was last planned for and the widest horizon it was
-- planned with, so that a planning round reads no owner until a new period starts or the
-- horizon widens; and how far a pass over the owners that is under way has come (pass_after,
-- the last owner planned), so that a pass cut short continues where it stopped.
CREATE TABLE IF NOT EXISTS "synclane".planned_types (
    queue text NOT NULL,
    type text NOT NULL,
    period timestamptz,
    horizon interval,
    pass_period timestamptz,
    pass_horizon interval,
    pass_after text,
    PRIMARY KEY (queue, type)
);

-- Per queue: when its owner source was last reconciled with the owners table, and when the
-- queue was last pruned (its `retention` setting).
CREATE TABLE IF NOT EXISTS "synclane".planner (
    queue text PRIMARY KEY,
    owners_reconciled_at timestamptz,
    pruned_at timestamptz
);

-- Version 4 (with lanes.start_keys above) wrote the lanes' hints in every statement that stopped
-- or added a job (version 5 replaces that with wakes, below). And it drops jobs_open_lanes: no statement reads it since the lanes table (version 3), and it
-- cost an entry for every job that became open (jobs_waiting answers the same lookups).
DROP INDEX IF EXISTS "synclane".jobs_open_lanes;

-- Version 5 -------------------------------------------------------------------------------------
-- The lanes' hints are a cache that no writer has to keep: the database writes a wake for every
-- change of jobs that can make a lane worth reading, whoever makes it (synclane, the SQL of
-- docs/operations.md, your own INSERT, UPDATE or DELETE), and the workers turn wakes into hints.

-- A wake: a lane worth a look from due_at on (a job of it became open or due sooner, joined it,
-- left it, or let go of a lease). Only ever inserted and deleted, never updated, and with no key:
-- writing one never waits for another transaction, and one that is written by a transaction
-- still open (enqueue(conn=...)) holds nothing a worker needs. A look deletes the wakes of the
-- lanes it has read; mend_lanes turns the others into hints every poll_interval.
CREATE TABLE IF NOT EXISTS "synclane".lane_wakes (
    queue text NOT NULL,
    lane text NOT NULL,
    due_at timestamptz NOT NULL
);
-- looks read the wakes that have come, earliest first; a fold and a look find a lane's wakes
CREATE INDEX IF NOT EXISTS lane_wakes_due ON "synclane".lane_wakes (queue, due_at);
CREATE INDEX IF NOT EXISTS lane_wakes_lane ON "synclane".lane_wakes (queue, lane);

-- New jobs wake their lanes: one wake per lane of the statement's open rows. The wake functions
-- run as the schema's owner (SECURITY DEFINER, with a search_path of nothing but the catalog), so
-- that a role that may write jobs, yours, needs no grant on lane_wakes.
CREATE OR REPLACE FUNCTION "synclane".wake_lanes_of_new_jobs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $wake$
BEGIN
    INSERT INTO "synclane".lane_wakes (queue, lane, due_at)
    SELECT queue, lane, min(next_run_at) FROM added
    WHERE status IN ('pending', 'failed', 'deferred')
    GROUP BY queue, lane;
    RETURN NULL;
END
$wake$;
DROP TRIGGER IF EXISTS jobs_wake_new_lanes ON "synclane".jobs;
CREATE TRIGGER jobs_wake_new_lanes AFTER INSERT ON "synclane".jobs
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT
    EXECUTE FUNCTION "synclane".wake_lanes_of_new_jobs();

-- A changed job wakes its lane when it became open, due sooner, joined the lane or stopped
-- running other than by completing (its lane may have room), or when a stopped job let go of its
-- lease; a job that left a lane wakes the lane it left. Taking a job (it starts running),
-- completing one (the worker's hot path) and saving pages wake nothing: the worker that completes
-- tells about the lanes it frees (notify_freed_lanes), and mend_lanes finds any lane freed
-- otherwise. No WHEN condition: PostgreSQL would prepare it again for every statement that updates
-- jobs, the take's included; the function returns at its first line for a take or a completion.
-- It runs as its caller; the wakes are written by add_wake, which runs as the schema's owner.
CREATE OR REPLACE FUNCTION "synclane".add_wake(queue_name text, lane_name text, due timestamptz)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $wake$
BEGIN
    INSERT INTO "synclane".lane_wakes (queue, lane, due_at) VALUES (queue_name, lane_name, due);
END
$wake$;
CREATE OR REPLACE FUNCTION "synclane".wake_lanes_of_changed_job() RETURNS trigger
LANGUAGE plpgsql AS $wake$
BEGIN
    -- (version 6) a history slice that finished: plan the next older one (plan_older_slices)
    IF NEW.status IN ('completed', 'deferred', 'abandoned') AND NEW.mode = 'initial'
       AND OLD.status IN ('pending', 'running', 'failed') THEN
        PERFORM "synclane".plan_older_slices(NEW.queue, NEW.owner, NEW.type, NEW.lane, NEW.priority);
    END IF;
    IF (NEW.status = 'running' OR NEW.status = 'completed')
       AND NEW.lane = OLD.lane AND NEW.queue = OLD.queue THEN
        RETURN NULL;  -- taken or completed: the worker's own, see above
    END IF;
    IF (OLD.queue, OLD.lane) IS DISTINCT FROM (NEW.queue, NEW.lane) THEN
        PERFORM "synclane".add_wake(OLD.queue, OLD.lane, now());
        IF NEW.status IN ('pending', 'failed', 'deferred') THEN
            PERFORM "synclane".add_wake(NEW.queue, NEW.lane, NEW.next_run_at);
        END IF;
    ELSIF OLD.status = 'running' OR (OLD.lease_token IS NOT NULL AND NEW.lease_token IS NULL) THEN
        -- stopped running, or let go of a lease: the lane may have room now
        PERFORM "synclane".add_wake(
            NEW.queue, NEW.lane,
            CASE WHEN NEW.status IN ('pending', 'failed', 'deferred')
                 THEN least(NEW.next_run_at, now()) ELSE now() END);
    ELSIF NEW.status IN ('pending', 'failed', 'deferred')
          AND (OLD.status NOT IN ('pending', 'failed', 'deferred')
               OR NEW.next_run_at < OLD.next_run_at) THEN
        PERFORM "synclane".add_wake(NEW.queue, NEW.lane, NEW.next_run_at);
    END IF;
    RETURN NULL;
END
$wake$;
DROP TRIGGER IF EXISTS jobs_wake_changed_lanes ON "synclane".jobs;
CREATE TRIGGER jobs_wake_changed_lanes
    AFTER UPDATE OF status, next_run_at, lane, queue, lease_token ON "synclane".jobs
    FOR EACH ROW EXECUTE FUNCTION "synclane".wake_lanes_of_changed_job();

-- A throttle's pause made shorter by hand (docs/operations.md, fix_unthrottle) brings the lane's
-- hint to now: a look reads the lane again at once (a parked lane stays parked: it is busy).
CREATE OR REPLACE FUNCTION "synclane".lanes_pause_shortened() RETURNS trigger
LANGUAGE plpgsql AS $pause$
BEGIN
    IF NEW.due_at IS DISTINCT FROM 'infinity' THEN
        NEW.due_at := now();
    END IF;
    RETURN NEW;
END
$pause$;
DROP TRIGGER IF EXISTS lanes_pause_shortened ON "synclane".lanes;
CREATE TRIGGER lanes_pause_shortened BEFORE UPDATE OF paused_until ON "synclane".lanes
    FOR EACH ROW
    WHEN (OLD.paused_until IS NOT NULL
          AND (NEW.paused_until IS NULL OR NEW.paused_until < OLD.paused_until))
    EXECUTE FUNCTION "synclane".lanes_pause_shortened();

-- A lane's row deleted by hand takes its hint along: the lane gets a wake instead.
CREATE OR REPLACE FUNCTION "synclane".wake_deleted_lanes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $wake$
BEGIN
    INSERT INTO "synclane".lane_wakes (queue, lane, due_at)
    SELECT queue, lane, now() FROM removed;
    RETURN NULL;
END
$wake$;
DROP TRIGGER IF EXISTS lanes_wake_deleted ON "synclane".lanes;
CREATE TRIGGER lanes_wake_deleted AFTER DELETE ON "synclane".lanes
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
    EXECUTE FUNCTION "synclane".wake_deleted_lanes();

-- Version 4 wrote the hints in its statements: its insert trigger goes, and unpark_lane, which a
-- worker of version 4 still running beside this schema calls, does nothing any more.
DROP TRIGGER IF EXISTS jobs_hint_lanes ON "synclane".jobs;
DROP FUNCTION IF EXISTS "synclane".lanes_of_new_jobs();
CREATE OR REPLACE FUNCTION "synclane".unpark_lane(
    queue_name text, lane_name text, also timestamptz, changed bigint
) RETURNS integer LANGUAGE plpgsql AS $unpark$
BEGIN
    RETURN 1;
END
$unpark$;

-- A queue's cap (max_running) counts every live lease, as a lane does: a cancelled job whose page
-- is still in flight keeps its slot of the queue until its worker lets go of the lease.
-- (Replaces version 3's jobs_running_queue_slot, which counted only running rows.)
DROP INDEX IF EXISTS "synclane".jobs_running_queue_slot;
CREATE UNIQUE INDEX IF NOT EXISTS jobs_leased_queue_slot
    ON "synclane".jobs (queue, queue_slot) WHERE queue_slot IS NOT NULL AND lease_token IS NOT NULL;

-- Version 4's hints said NULL both for "parked" and for "nothing open", and nothing told version
-- 5's looks about a parked lane: every lane with open jobs gets a wake once, and a look rereads it.
DO $upgrade$
BEGIN
    IF NOT EXISTS (SELECT FROM "synclane".schema_version WHERE version >= 5) THEN
        INSERT INTO "synclane".lane_wakes (queue, lane, due_at)
        SELECT queue, lane, min(next_run_at) FROM "synclane".jobs
        WHERE status IN ('pending', 'failed', 'deferred')
        GROUP BY queue, lane;
    END IF;
END
$upgrade$;
-- Version 5, continued: lost answers and the planning lease -------------------------------

-- The key of the statement that last ended a job's lease without finishing it: the lease token
-- for a hand-back or a wait for the lane's rate, the reclaim's own key for an expired lease. A
-- statement sent again after its answer was lost finds its own commit by it (also once another
-- worker has taken the job), so that the worker reports what the table did.
ALTER TABLE "synclane".jobs ADD COLUMN IF NOT EXISTS release_key uuid;

-- The planning round of a queue holds a lease on its planner row (synclane/rounds.py): a token and
-- an end, renewed while the round works, so that a planner stopped in its round (SIGSTOP, a
-- frozen machine) keeps the others from planning the queue only until its lease ends. (It
-- replaces a transaction advisory lock, which a stopped planner kept for as long as it was
-- stopped, and which a transaction pooler cannot carry.)
ALTER TABLE "synclane".planner ADD COLUMN IF NOT EXISTS planning_token uuid;
ALTER TABLE "synclane".planner ADD COLUMN IF NOT EXISTS planning_until timestamptz;

-- (Version 5 ends here; a table created since version 6 records only its own version.)

-- Version 6: lazy history ---------------------------------------------------------------------
-- (docs/planning.md, "History: initial slices")
-- A first plan no longer writes every history slice of an owner: it writes the newest few, and
-- each next older slice is planned when one finishes, by the database, whoever finishes it (a
-- worker, or your own UPDATE). What the slices are planned towards is recorded here, one row per
-- owner and windowed type whose history the planner planned since version 6: how far back it
-- goes (the first plan's midnight minus the horizon, or older when a backfill widened it), the
-- slice length, and how many open slices (pending, running, failed) to keep planned. Owners
-- planned before version 6 have every slice as a row already, and no row here until a backfill
-- widens their history. The planner writes these rows; the rows of jobs stay the truth (a plan
-- repairs a row that is missing or wrong).
CREATE TABLE IF NOT EXISTS "synclane".histories (
    queue text NOT NULL,
    owner text NOT NULL,
    type text NOT NULL,
    history_from timestamptz NOT NULL,
    slice interval NOT NULL CHECK (slice > interval '0'),
    ahead integer NOT NULL CHECK (ahead > 0),
    PRIMARY KEY (queue, owner, type)
);

-- A history slice's dedup key, 'initial:<window_start as ISO-8601 UTC>', exactly as
-- synclane.planning.iso writes it (microseconds only when there are some).
CREATE OR REPLACE FUNCTION "synclane".initial_key(start timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT 'initial:' || to_char(start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
           || CASE WHEN date_trunc('second', start) = start THEN ''
                   ELSE '.' || to_char(start AT TIME ZONE 'UTC', 'US') END
           || 'Z'
$$;

-- How many slices of an owner's history are not planned yet: from history_from to `oldest`, the
-- start of its oldest slice, in slices of its histories row; 0 without a row (an owner planned
-- before version 6 has every slice as a row). progress() and the page count them; so can you.
CREATE OR REPLACE FUNCTION "synclane".slices_to_plan(
    queue_name text, owner_name text, type_name text, oldest timestamptz
) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT ceil(extract(epoch FROM oldest - h.history_from) / extract(epoch FROM h.slice))
        FROM "synclane".histories h
        WHERE h.queue = queue_name AND h.owner = owner_name AND h.type = type_name
          AND h.history_from < oldest
    ), 0)::bigint
$$;

-- The next older slices of an owner's history, after one of its slices finished (called by the
-- update trigger of jobs, above): while the history does not reach history_from, its oldest
-- slice is not cancelled (a cancelled owner gets nothing new) and fewer than `ahead` slices are
-- open, the slice [greatest(start - slice, history_from), start) below the oldest one is added,
-- in the owner's lane (the owners table's; else the finished job's), due now or when the lane's
-- throttle pause ends. Its boundaries are those the planner computes (synclane.planning
-- .plan_history), and the dedup index refuses a slice a planner added at the same instant.
-- It holds the histories row FOR SHARE while it reads and inserts, so a planner that changes the
-- row waits for it, and a slice is never computed under a row that is being changed. It waits
-- for no one for long: a planner holding the row (NOWAIT), or a transaction that inserted the
-- same slice and has not committed (lock_timeout), makes it plan nothing, and the next plan
-- tops up instead. It runs as the schema's owner, so that a role that may write jobs needs no
-- grant on histories or owners.
CREATE OR REPLACE FUNCTION "synclane".plan_older_slices(
    queue_name text, owner_name text, type_name text, lane_name text, job_priority integer
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET lock_timeout = '50ms' AS $older$
DECLARE
    history record;
    oldest record;
    open integer;
    start timestamptz;
    lane_of_owner text;
BEGIN
    SELECT h.history_from, h.slice, h.ahead INTO history
    FROM "synclane".histories h
    WHERE h.queue = queue_name AND h.owner = owner_name AND h.type = type_name
    FOR SHARE NOWAIT;
    IF NOT FOUND THEN
        RETURN;  -- planned before version 6: every slice is a row already
    END IF;
    FOR attempt IN 1 .. history.ahead LOOP
        SELECT j.window_start, j.status INTO oldest
        FROM "synclane".jobs j
        WHERE j.queue = queue_name AND j.owner = owner_name AND j.type = type_name
          AND j.mode = 'initial' AND j.window_end IS NOT NULL
        ORDER BY j.window_end LIMIT 1;
        EXIT WHEN NOT FOUND OR oldest.window_start <= history.history_from
                  OR oldest.status = 'cancelled';
        SELECT count(*) INTO open
        FROM "synclane".jobs j
        WHERE j.queue = queue_name AND j.owner = owner_name AND j.type = type_name
          AND j.mode = 'initial' AND j.status IN ('pending', 'running', 'failed');
        EXIT WHEN open >= history.ahead;
        start := greatest(oldest.window_start - history.slice, history.history_from);
        SELECT o.lane INTO lane_of_owner
        FROM "synclane".owners o WHERE o.queue = queue_name AND o.owner = owner_name;
        lane_of_owner := coalesce(lane_of_owner, lane_name);
        INSERT INTO "synclane".jobs
            (queue, owner, lane, type, mode, priority, window_start, window_end, dedup_key,
             next_run_at)
        VALUES (queue_name, owner_name, lane_of_owner, type_name, 'initial', job_priority, start,
                oldest.window_start, "synclane".initial_key(start),
                greatest(now(), (SELECT l.paused_until FROM "synclane".lanes l
                                 WHERE l.queue = queue_name AND l.lane = lane_of_owner)))
        ON CONFLICT (queue, owner, type, dedup_key) DO NOTHING;
    END LOOP;
EXCEPTION WHEN lock_not_available OR serialization_failure OR deadlock_detected THEN
    -- another transaction holds the row or the slice: the next plan (app.plan(), or a worker's
    -- planning pass) tops up what this one did not
    RETURN;
END
$older$;

-- (Version 6 ends here.)

-- Version 7: settled owners --------------------------------------------------------------------
-- (docs/planning.md, "Settled owners: what an explicit plan remembers")
-- app.plan() compares every owner the source names with its rows. An owner whose rows lacked
-- nothing, for reasons that hold until a period of its types ends (or midnight), is marked
-- settled in the owners table: until settled_until, under the settings it was checked with
-- (settled_by), under the plan epoch it was checked in (settled_epoch), and (settled_open) while
-- a refresh it counted on stays open.
-- The next app.plan() skips such an owner's rows while all three still hold. The rows stay the
-- truth: a mark is a cache that ends with its period, and any statement that may have removed
-- what an owner was settled by moves the plan epoch on, which ends every mark at once.
ALTER TABLE "synclane".owners ADD COLUMN IF NOT EXISTS settled_until timestamptz;
ALTER TABLE "synclane".owners ADD COLUMN IF NOT EXISTS settled_epoch uuid;
ALTER TABLE "synclane".owners ADD COLUMN IF NOT EXISTS settled_by text;
-- the mark counts on a refresh still open (of an earlier period: no new one is planned while
-- one is open), so it also ends when no refresh of a windowed type is open any more
ALTER TABLE "synclane".owners ADD COLUMN IF NOT EXISTS settled_open boolean NOT NULL DEFAULT false;

-- The plan epoch: one row. It changes with every DELETE or TRUNCATE of jobs (yours, a prune's),
-- every UPDATE of jobs that sets a column the comparison reads to tell a settled owner (queue,
-- owner, type, mode, window_start, window_end, dedup_key, created_at: the workers' statements set
-- none of them, so they pay nothing), and every DELETE or UPDATE of histories rows. A mark
-- counts only while the epoch is the one it was written under. Deleting the row turns marks off
-- until the next such statement writes it again.
CREATE TABLE IF NOT EXISTS "synclane".plan_epoch (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    epoch uuid NOT NULL DEFAULT gen_random_uuid(),
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO "synclane".plan_epoch DEFAULT VALUES ON CONFLICT DO NOTHING;

-- Moves the plan epoch on; in the statement's transaction, so a comparison that does not see
-- the statement's change does not see the new epoch either, and its marks end when it commits.
-- It runs as the schema's owner, so that a role that may delete jobs needs no grant on
-- plan_epoch.
CREATE OR REPLACE FUNCTION "synclane".unsettle_owners() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $unsettle$
BEGIN
    INSERT INTO "synclane".plan_epoch AS p (one) VALUES (true)
    ON CONFLICT (one) DO UPDATE SET epoch = gen_random_uuid(), changed_at = now();
    RETURN NULL;
END
$unsettle$;
DROP TRIGGER IF EXISTS jobs_unsettle_deleted ON "synclane".jobs;
CREATE TRIGGER jobs_unsettle_deleted AFTER DELETE ON "synclane".jobs
    FOR EACH STATEMENT EXECUTE FUNCTION "synclane".unsettle_owners();
DROP TRIGGER IF EXISTS jobs_unsettle_truncated ON "synclane".jobs;
CREATE TRIGGER jobs_unsettle_truncated AFTER TRUNCATE ON "synclane".jobs
    FOR EACH STATEMENT EXECUTE FUNCTION "synclane".unsettle_owners();
DROP TRIGGER IF EXISTS jobs_unsettle_changed ON "synclane".jobs;
CREATE TRIGGER jobs_unsettle_changed
    AFTER UPDATE OF queue, owner, type, mode, window_start, window_end, dedup_key, created_at
    ON "synclane".jobs
    FOR EACH STATEMENT EXECUTE FUNCTION "synclane".unsettle_owners();
DROP TRIGGER IF EXISTS histories_unsettle_deleted ON "synclane".histories;
CREATE TRIGGER histories_unsettle_deleted AFTER DELETE ON "synclane".histories
    FOR EACH STATEMENT EXECUTE FUNCTION "synclane".unsettle_owners();
-- A histories row changed (a backfill, other settings, your UPDATE) ends the marks too; the
-- planner's upsert of first rows changes none (an empty transition table), and so ends nothing.
CREATE OR REPLACE FUNCTION "synclane".unsettle_owners_of_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $unsettle$
BEGIN
    IF EXISTS (SELECT FROM changed) THEN
        INSERT INTO "synclane".plan_epoch AS p (one) VALUES (true)
        ON CONFLICT (one) DO UPDATE SET epoch = gen_random_uuid(), changed_at = now();
    END IF;
    RETURN NULL;
END
$unsettle$;
DROP TRIGGER IF EXISTS histories_unsettle_changed ON "synclane".histories;
CREATE TRIGGER histories_unsettle_changed AFTER UPDATE ON "synclane".histories
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION "synclane".unsettle_owners_of_changed();

-- (Version 7 ends here.)

-- Version 8: checks that cost less ---------------------------------------------------------------
-- PostgreSQL reads a table's CHECK constraints from the catalog again for every statement that
-- writes the table (for a take, twice: it completes and takes in two updates), and a list of
-- words costs it a node per word. Version 8 writes the same three checks in the form it reads
-- fastest (one constant array; a window check without its NULL tests, which a check passes
-- anyway): the same rows pass and the same rows are refused, under the same names. A table of
-- an older version gets them NOT VALID, which takes the table's lock for an instant and reads no
-- row (its rows passed the same checks until now); app.migrate() then validates them in a
-- transaction of its own (validate_checks, below), which reads the table without holding up
-- its writers.
DO $checks$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_constraint c
               JOIN pg_catalog.pg_class t ON t.oid = c.conrelid
               JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace
               WHERE n.nspname = 'synclane' AND t.relname = 'jobs' AND c.contype = 'c'
                 AND c.conname IN ('jobs_mode_check', 'jobs_status_check', 'jobs_check')
                 -- the stored expression, as text: a list of words, or a NULL test (rendering
                 -- definitions would open tables, also those other sessions are dropping)
                 AND (pg_catalog.strpos(c.conbin::text, '{ARRAYEXPR') > 0
                      OR pg_catalog.strpos(c.conbin::text, '{NULLTEST') > 0)) THEN
        ALTER TABLE "synclane".jobs
            DROP CONSTRAINT IF EXISTS jobs_mode_check,
            DROP CONSTRAINT IF EXISTS jobs_status_check,
            DROP CONSTRAINT IF EXISTS jobs_check,
            ADD CONSTRAINT jobs_mode_check
                CHECK (mode = ANY ('{initial,recurring,manual}'::text[])) NOT VALID,
            ADD CONSTRAINT jobs_status_check CHECK (status = ANY (
                '{pending,running,completed,failed,deferred,abandoned,cancelled}'::text[]))
                NOT VALID,
            ADD CONSTRAINT jobs_check CHECK (window_start < window_end) NOT VALID;
    END IF;
END
$checks$;

-- Checks the rows against the checks of jobs still NOT VALID, one by one, and returns the names
-- of those some row breaks (such a row was written while the check was off; the check still
-- refuses every new write, and a later call validates it once the row is fixed). Each validation
-- takes a lock that lets readers and writers go on (it waits only for a VACUUM, an index build
-- or another validation). app.migrate() calls it in a transaction of its own after an upgrade; a
-- team that applies this file itself runs `SELECT synclane.validate_checks();` after its
-- migration's transaction (inside it, the lock the ALTER TABLE above took is still held).
CREATE OR REPLACE FUNCTION "synclane".validate_checks() RETURNS text[]
LANGUAGE plpgsql AS $validate$
DECLARE
    unchecked record;
    broken text[] := '{}';
BEGIN
    FOR unchecked IN
        SELECT c.conname FROM pg_catalog.pg_constraint c
        JOIN pg_catalog.pg_class t ON t.oid = c.conrelid
        JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = 'synclane' AND t.relname = 'jobs' AND c.contype = 'c'
          AND NOT c.convalidated
        ORDER BY c.conname
    LOOP
        BEGIN
            EXECUTE pg_catalog.format('ALTER TABLE %I.jobs VALIDATE CONSTRAINT %I',
                                      'synclane', unchecked.conname);
        EXCEPTION WHEN check_violation THEN
            broken := broken || unchecked.conname::text;
        END;
    END LOOP;
    RETURN broken;
END
$validate$;

INSERT INTO "synclane".schema_version (version) VALUES (8) ON CONFLICT DO NOTHING;
