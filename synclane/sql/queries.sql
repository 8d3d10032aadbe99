-- Every statement synclane runs. Each one is loaded by name into synclane.store; {schema} is the
-- schema, quoted as an identifier. The line under each name says what the statement guarantees.

-- name: schema_exists
-- whether the version table exists, so a missing schema gives a clear error instead of SQL noise
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_tables
    WHERE schemaname = %(schema)s AND tablename = 'schema_version'
) AS present;

-- name: schema_version
-- the newest schema version applied
SELECT max(version) AS version FROM {schema}.schema_version;

-- name: migration_lock
-- serialises start-up DDL of processes that start at once (transaction-scoped, released at commit)
SELECT pg_advisory_xact_lock(hashtext('synclane schema ' || %(schema)s));

-- name: plan_read
-- what exists per owner and type, each answer one index lookup, so history never slows it down
SELECT
    o.owner,
    t.type,
    now() AS now,
    CASE WHEN t.windowed THEN (
        SELECT j.window_start FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type AND j.mode = 'initial'
          AND j.window_end IS NOT NULL
        ORDER BY j.window_end LIMIT 1
    ) END AS oldest_initial_start,
    CASE WHEN t.windowed THEN (
        SELECT max(j.window_end) FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
          AND j.window_end IS NOT NULL
    ) END AS coverage_end,
    CASE WHEN t.windowed THEN (
        SELECT j.mode FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
          AND j.window_end IS NOT NULL
        ORDER BY j.window_end DESC LIMIT 1
    ) END AS coverage_mode,
    CASE WHEN NOT t.windowed THEN (
        SELECT j.created_at FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
          AND j.dedup_key = 'initial'
    ) END AS initial_created_at,
    CASE WHEN NOT t.windowed THEN (
        SELECT max(j.created_at) FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
          AND j.window_end IS NULL
    ) END AS last_created_at,
    t.windowed AND EXISTS (
        SELECT 1 FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
          AND j.mode = 'recurring' AND j.status IN ('pending', 'running', 'failed')
    ) AS open_recurring,
    NOT t.windowed AND EXISTS (
        SELECT 1 FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
          AND j.status IN ('pending', 'running', 'failed')
    ) AS open_any
FROM unnest(%(owners)s::text[]) AS o (owner)
CROSS JOIN unnest(%(types)s::text[], %(windowed)s::boolean[]) AS t (type, windowed);

-- name: database_now
-- the database clock, the one clock every process shares
SELECT now() AS now;

-- name: insert_jobs
-- adds planned jobs; the dedup index turns a job another planner already added into a no-op
INSERT INTO {schema}.jobs
    (queue, owner, lane, type, mode, priority, window_start, window_end, dedup_key)
SELECT %(queue)s::text, n.*
FROM unnest(
    %(owners)s::text[], %(lanes)s::text[], %(types)s::text[], %(modes)s::text[],
    %(priorities)s::integer[], %(starts)s::timestamptz[], %(ends)s::timestamptz[],
    %(keys)s::text[]
) AS n
ON CONFLICT (queue, owner, type, dedup_key) DO NOTHING;

-- name: enqueue_job
-- adds one job by hand; with a dedup key a second call finds the first job instead
INSERT INTO {schema}.jobs
    (queue, owner, lane, type, mode, priority, window_start, window_end, dedup_key)
VALUES (%(queue)s, %(owner)s, %(lane)s, %(type)s, 'manual', %(priority)s, %(window_start)s,
        %(window_end)s, coalesce(%(dedup_key)s::text, 'manual:' || gen_random_uuid()))
ON CONFLICT (queue, owner, type, dedup_key) DO NOTHING
RETURNING id;

-- name: job_by_dedup_key
-- the job a dedup key already names
SELECT id FROM {schema}.jobs
WHERE queue = %(queue)s AND owner = %(owner)s AND type = %(type)s AND dedup_key = %(dedup_key)s;

-- name: owner_lane
-- the lane an owner's newest job runs in, for a manual job whose lane was not given
SELECT lane FROM {schema}.jobs
WHERE queue = %(queue)s AND owner = %(owner)s
ORDER BY created_at DESC, id DESC LIMIT 1;

-- name: requeue_jobs
-- gives stopped jobs fresh attempts; the cursor stays, so they continue from their last page
UPDATE {schema}.jobs
SET status = 'pending', attempt_count = 0, throttle_count = 0, error = NULL,
    next_run_at = now(), completed_at = NULL,
    leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE queue = %(queue)s
  AND (%(owner)s::text IS NULL OR owner = %(owner)s)
  AND (%(type)s::text IS NULL OR type = %(type)s)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY (%(ids)s::bigint[]))
  AND (%(cause)s::text IS NULL OR {schema}.error_cause(error) = %(cause)s)
  AND status = ANY (%(statuses)s::text[])
RETURNING id;

-- name: cancel_jobs
-- what has not finished becomes cancelled; a running job keeps its lease until its worker notices
-- (the status guard on its next save or heartbeat refuses it), so its lane stays held meanwhile
UPDATE {schema}.jobs
SET status = 'cancelled', error = %(error)s, completed_at = now()
WHERE queue = %(queue)s AND owner = %(owner)s
  AND (%(type)s::text IS NULL OR type = %(type)s)
  AND status IN ('pending', 'running', 'failed', 'deferred')
RETURNING id;

-- name: list_jobs
-- jobs, newest first, filtered, at most `limit` rows; an error is cut to its first line (at most
-- `error_width` characters, "…" where cut) unless full_errors; durations on the database clock
SELECT id, queue, owner, lane, type, mode, status, window_start, window_end, cursor,
       processed_count, attempt_count, throttle_count,
       now() - created_at AS age,
       CASE WHEN status = 'running' THEN now() - started_at END AS running_for,
       next_run_at,
       CASE WHEN %(full_errors)s OR error IS NULL
                 OR (strpos(error, E'\n') = 0 AND length(error) <= %(error_width)s) THEN error
            ELSE left(split_part(error, E'\n', 1), %(error_width)s - 1) || '…' END AS error,
       leased_by, lease_expires_at, created_at, started_at, heartbeat_at, completed_at,
       priority, dedup_key, lease_token
FROM {schema}.jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(owner)s::text IS NULL OR owner = %(owner)s)
  AND (%(type)s::text IS NULL OR type = %(type)s)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s)
  AND (%(statuses)s::text[] IS NULL OR status = ANY (%(statuses)s::text[]))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY (%(ids)s::bigint[]))
  AND created_at >= coalesce(%(since)s::timestamptz, now() - %(since_ago)s::interval, '-infinity')
  AND created_at < coalesce(%(until)s::timestamptz, now() - %(until_ago)s::interval, 'infinity')
ORDER BY id DESC
LIMIT %(limit)s;

-- name: progress
-- how far the first load (the history slices, mode 'initial') of each owner and type is: counts,
-- records, the unbroken loaded span, a state and an ETA, aggregated in the database in one pass
-- over the history slices (refreshes never count), plus an index lookup for the rare owner whose
-- newest slice is stuck while older ones loaded
WITH counted AS (
    SELECT owner, type,
           count(*) AS slices_total,
           count(*) FILTER (WHERE status = 'completed') AS slices_completed,
           count(*) FILTER (WHERE status IN ('pending', 'running')) AS slices_open,
           count(*) FILTER (WHERE status IN ('failed', 'deferred')) AS slices_retrying,
           count(*) FILTER (WHERE status = 'abandoned') AS slices_abandoned,
           bool_or(status = 'deferred'
                   OR (status = 'failed' AND coalesce(error, '') NOT LIKE 'Throttled%%'))
               AS failing,
           -- a throttle fails its job with a Throttled error and pushes every other open job
           -- of the lane to the same time; nothing else leaves a pending job waiting
           bool_or(next_run_at > now()
                   AND (status = 'pending'
                        OR (status IN ('failed', 'deferred') AND error LIKE 'Throttled%%')))
               AS paused,
           coalesce(sum(processed_count), 0)::bigint AS records,
           max(window_end) FILTER (WHERE status = 'completed') AS coverage_end,
           min(window_start) AS history_start,
           max(window_end) FILTER (WHERE status <> 'completed') AS newest_gap_end,
           count(*) FILTER (WHERE status = 'completed' AND completed_at > now() - %(recent)s)
               AS recent_slices,
           min(started_at) FILTER (WHERE status = 'completed' AND completed_at > now() - %(recent)s)
               AS recent_since,
           max(completed_at) FILTER (WHERE status = 'completed') AS last_completed_at
    FROM {schema}.jobs
    WHERE queue = %(queue)s AND mode = 'initial'
      AND (%(owner)s::text IS NULL OR owner = %(owner)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
    GROUP BY owner, type
),
stated AS (
    SELECT c.*,
           slices_retrying + slices_abandoned AS slices_failed,
           slices_total - slices_completed - slices_open - slices_retrying - slices_abandoned
               AS slices_cancelled,
           slices_open + slices_retrying AS remaining,
           CASE WHEN slices_completed = slices_total THEN 'loaded'
                WHEN slices_abandoned > 0 THEN 'abandoned'
                WHEN failing THEN 'failing'
                WHEN slices_open + slices_retrying = 0 THEN 'cancelled'
                WHEN paused THEN 'throttled'
                WHEN slices_completed = 0 THEN 'connecting'
                ELSE 'loading' END AS state,
           -- slices tile history without gaps or overlaps, so the loaded span runs back from
           -- the newest loaded slice to the end of the newest slice below it that is not loaded
           CASE WHEN newest_gap_end <= coverage_end THEN newest_gap_end
                ELSE (SELECT g.window_end FROM {schema}.jobs g
                      WHERE newest_gap_end > coverage_end
                        AND g.queue = %(queue)s AND g.owner = c.owner AND g.type = c.type
                        AND g.window_end <= c.coverage_end
                        AND g.mode = 'initial' AND g.status <> 'completed'
                      ORDER BY g.window_end DESC LIMIT 1) END AS gap_end
    FROM counted c
)
SELECT owner, type, state,
       round(100.0 * slices_completed / slices_total, 1)::float8 AS percent,
       slices_total, slices_completed, slices_failed, slices_open, slices_cancelled, records,
       CASE WHEN coverage_end IS NOT NULL THEN coalesce(gap_end, history_start) END
           AS coverage_start,
       coverage_end,
       CASE WHEN state = 'loaded' THEN interval '0'
            WHEN remaining > 0 AND recent_slices > 0
            THEN date_trunc('second', (now() - recent_since) * remaining / recent_slices) END
           AS eta,
       last_completed_at
FROM stated
WHERE (%(states)s::text[] IS NULL OR state = ANY (%(states)s::text[]))
ORDER BY owner, type;

-- name: open_jobs
-- how many jobs of these queues have not finished (from the partial index of open rows)
SELECT count(*) FROM {schema}.jobs
WHERE queue = ANY (%(queues)s::text[]) AND status IN ('pending', 'running', 'failed', 'deferred');

-- name: running_jobs
-- how many jobs of these queues run now, in any process (from the running-lane index)
SELECT count(*) FROM {schema}.jobs
WHERE queue = ANY (%(queues)s::text[]) AND status = 'running';

-- name: failures
-- open failures grouped by cause (the error's first line, numbers and ids masked), aggregated in
-- the database; reads only failed, deferred and abandoned rows, and one error per cause
WITH causes AS (
    SELECT {schema}.error_cause(error) AS cause, queue, type,
           count(*) AS jobs,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'deferred') AS deferred,
           count(*) FILTER (WHERE status = 'abandoned') AS abandoned,
           count(DISTINCT owner) AS owner_count,
           array_agg(DISTINCT owner ORDER BY owner) AS owners,
           array_agg(DISTINCT status ORDER BY status) AS statuses,
           min(coalesce(heartbeat_at, created_at)) AS first_seen,
           max(coalesce(heartbeat_at, created_at)) AS last_seen,
           max(id) AS newest_id,
           (array_agg(id ORDER BY id DESC))[1:%(ids_shown)s] AS job_ids
    FROM {schema}.jobs
    WHERE status IN ('failed', 'deferred', 'abandoned')
      AND (%(statuses)s::text[] IS NULL OR status = ANY (%(statuses)s::text[]))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(owner)s::text IS NULL OR owner = %(owner)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
      AND coalesce(heartbeat_at, created_at)
          >= coalesce(%(since)s::timestamptz, now() - %(since_ago)s::interval, '-infinity')
      AND coalesce(heartbeat_at, created_at)
          < coalesce(%(until)s::timestamptz, now() - %(until_ago)s::interval, 'infinity')
    GROUP BY 1, queue, type
)
SELECT c.cause, c.queue, c.type, c.jobs, c.failed, c.deferred, c.abandoned, c.owner_count,
       c.owners, c.statuses, c.first_seen, c.last_seen,
       CASE WHEN %(full_errors)s OR e.error IS NULL
                 OR (strpos(e.error, E'\n') = 0 AND length(e.error) <= %(error_width)s)
            THEN e.error
            ELSE left(split_part(e.error, E'\n', 1), %(error_width)s - 1) || '…' END AS example,
       c.job_ids
FROM causes c
JOIN {schema}.jobs e ON e.id = c.newest_id
ORDER BY c.jobs DESC, c.last_seen DESC, c.cause;

-- name: lanes
-- what each lane with open jobs is doing now: its running job (if any), who holds it and since
-- when, how many jobs wait and how many are due, and until when a throttle pauses it; counts the
-- open rows per lane first, then looks up each lane's running job in the running-lane index
WITH open AS (
    SELECT queue, lane,
           count(*) FILTER (WHERE status <> 'running') AS waiting,
           count(*) FILTER (WHERE status IN ('pending', 'failed') AND next_run_at <= now()) AS due,
           min(next_run_at) FILTER (WHERE status IN ('pending', 'failed')) AS next_due,
           max(next_run_at) FILTER (WHERE status IN ('failed', 'deferred')
                                      AND next_run_at > now() AND error LIKE 'Throttled%%')
               AS paused_until
    FROM {schema}.jobs
    WHERE status IN ('pending', 'running', 'failed', 'deferred')
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(lane)s::text IS NULL OR lane = %(lane)s)
    GROUP BY queue, lane
)
SELECT o.queue, o.lane,
       r.id AS job_id, r.owner, r.type, r.mode, r.window_start, r.window_end, r.cursor,
       r.processed_count, r.attempt_count, r.leased_by, r.started_at AS since,
       now() - r.started_at AS running_for, r.lease_expires_at,
       o.waiting, o.due, o.next_due, o.paused_until
FROM open o
LEFT JOIN {schema}.jobs r ON r.queue = o.queue AND r.lane = o.lane AND r.status = 'running'
ORDER BY o.queue, o.lane;

-- name: take_front
-- serves the slots of one worker that ask at the same instant, in one statement and one commit:
-- first completes each job in %(done_ids)s under its lease guard (its slot has just finished it),
-- then takes one job for each completion that went through and for each of %(plain)s slots that
-- asked with nothing to complete. It takes the best due jobs of distinct free lanes from the
-- front of the line and marks them running under fresh lease tokens. Two takers of one lane may
-- both pass this query, and the running-lane index lets only one of them commit: the other gets
-- a unique violation, its completions roll back with it, and it asks again. One row always comes
-- back; every row carries the ids completed, and a taken job's columns (NULL when none).
WITH done AS (
    UPDATE {schema}.jobs j
    SET status = 'completed', processed_count = j.processed_count + d.count, error = NULL,
        completed_at = now(), heartbeat_at = now(),
        leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM unnest(%(done_ids)s::bigint[], %(done_tokens)s::uuid[], %(done_counts)s::bigint[])
         AS d (id, token, count)
    WHERE j.id = d.id AND j.lease_token = d.token AND j.status = 'running'
    RETURNING j.id
),
busy AS MATERIALIZED (
    -- the jobs completed above no longer hold their lanes: their next jobs may be taken at once
    SELECT lane FROM {schema}.jobs
    WHERE queue = %(queue)s AND status = 'running' AND id <> ALL (%(done_ids)s::bigint[])
    UNION ALL
    SELECT lane FROM {schema}.jobs
    WHERE queue = %(queue)s AND status = 'cancelled' AND lease_token IS NOT NULL
      AND lease_expires_at > now()
),
front AS (
    -- the best job of each free lane among the first %(front)s in taking order
    SELECT DISTINCT ON (f.lane) f.id FROM (
        SELECT id, lane, next_run_at, priority, window_start FROM {schema}.jobs
        WHERE queue = %(queue)s AND status IN ('pending', 'failed')
        ORDER BY priority, window_start DESC NULLS LAST, id
        LIMIT %(front)s
    ) f
    WHERE f.next_run_at <= now() AND f.lane NOT IN (SELECT lane FROM busy)
    ORDER BY f.lane, f.priority, f.window_start DESC NULLS LAST, f.id
),
taken AS (
    -- the limit reads the completions first, so they have freed their lanes in the
    -- running-lane index before any job of the same lane is marked running
    SELECT j.id, j.status FROM {schema}.jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM front)) AND j.status IN ('pending', 'failed')
    ORDER BY j.priority, j.window_start DESC NULLS LAST, j.id
    LIMIT (SELECT %(plain)s::int + count(*) FROM done)
    FOR UPDATE SKIP LOCKED
),
next AS (
    UPDATE {schema}.jobs j
    SET status = 'running', leased_by = %(worker)s, lease_token = gen_random_uuid(),
        lease_expires_at = now() + %(lease)s, attempt_count = j.attempt_count + 1,
        started_at = now(), heartbeat_at = now()
    FROM taken
    WHERE j.id = taken.id
    RETURNING j.id, j.queue, j.owner, j.lane, j.type, j.mode, j.window_start, j.window_end,
              j.cursor, j.attempt_count, j.throttle_count, j.processed_count, j.lease_token,
              taken.status AS previous_status, j.priority
)
SELECT ARRAY(SELECT id FROM done) AS completed, next.*
FROM (SELECT) AS one LEFT JOIN next ON true
ORDER BY next.priority, next.window_start DESC NULLS LAST, next.id;

-- name: take_by_lane
-- the same take when the front of the line waits behind busy lanes: visits each lane with open
-- jobs once (cost grows with lanes, not jobs), and gives a deferred job its last attempt only
-- once nothing else of its lane is open; the running-lane index still refuses a second taker
WITH RECURSIVE busy AS MATERIALIZED (
    SELECT lane FROM {schema}.jobs WHERE queue = %(queue)s AND status = 'running'
    UNION ALL
    SELECT lane FROM {schema}.jobs
    WHERE queue = %(queue)s AND status = 'cancelled' AND lease_token IS NOT NULL
      AND lease_expires_at > now()
),
lanes (lane) AS (
    (SELECT lane FROM {schema}.jobs
     WHERE queue = %(queue)s AND status IN ('pending', 'failed', 'deferred')
     ORDER BY lane LIMIT 1)
    UNION ALL
    SELECT (SELECT j.lane FROM {schema}.jobs j
            WHERE j.queue = %(queue)s AND j.status IN ('pending', 'failed', 'deferred')
              AND j.lane > lanes.lane
            ORDER BY j.lane LIMIT 1)
    FROM lanes WHERE lanes.lane IS NOT NULL
),
heads AS (
    SELECT head.id FROM lanes
    CROSS JOIN LATERAL (
        (SELECT j.id FROM {schema}.jobs j
         WHERE j.queue = %(queue)s AND j.lane = lanes.lane
           AND j.status IN ('pending', 'failed') AND j.next_run_at <= now()
         ORDER BY j.priority, j.window_start DESC NULLS LAST, j.id LIMIT 1)
        UNION ALL
        (SELECT d.id FROM {schema}.jobs d
         WHERE d.queue = %(queue)s AND d.lane = lanes.lane
           AND d.status = 'deferred' AND d.next_run_at <= now()
           AND NOT EXISTS (
               SELECT 1 FROM {schema}.jobs o
               WHERE o.queue = %(queue)s AND o.lane = lanes.lane
                 AND o.status IN ('pending', 'failed'))
         ORDER BY d.priority, d.window_start DESC NULLS LAST, d.id LIMIT 1)
        LIMIT 1
    ) head
    WHERE lanes.lane IS NOT NULL AND lanes.lane NOT IN (SELECT lane FROM busy)
),
taken AS (
    SELECT j.id, j.status FROM {schema}.jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM heads))
      AND j.status IN ('pending', 'failed', 'deferred')
    ORDER BY j.priority, j.window_start DESC NULLS LAST, j.id
    LIMIT 1 FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs j
SET status = 'running', leased_by = %(worker)s, lease_token = gen_random_uuid(),
    lease_expires_at = now() + %(lease)s, attempt_count = j.attempt_count + 1,
    started_at = now(), heartbeat_at = now()
FROM taken
WHERE j.id = taken.id
RETURNING j.id, j.queue, j.owner, j.lane, j.type, j.mode, j.window_start, j.window_end,
          j.cursor, j.attempt_count, j.throttle_count, j.processed_count, j.lease_token,
          taken.status AS previous_status;

-- name: save_page
-- saves the cursor and the count after a page and renews the lease; the token and status guard
-- refuse a worker that lost its lease (zero rows: stop and write nothing more)
UPDATE {schema}.jobs
SET cursor = %(cursor)s, processed_count = processed_count + %(count)s,
    heartbeat_at = now(), lease_expires_at = now() + %(lease)s
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running';

-- name: heartbeat
-- renews the lease while a slow page is in flight, under the same guard
UPDATE {schema}.jobs
SET heartbeat_at = now(), lease_expires_at = now() + %(lease)s
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running';

-- name: complete_job
-- the last page: counts it and marks the job completed, under the lease guard
UPDATE {schema}.jobs
SET status = 'completed', processed_count = processed_count + %(count)s, error = NULL,
    completed_at = now(), heartbeat_at = now(),
    leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running';

-- name: fail_job
-- a failed attempt: retried after the delay, deferred once the regular attempts are used up,
-- abandoned when the deferred attempt fails too
UPDATE {schema}.jobs
SET status = CASE WHEN attempt_count > %(max_attempts)s THEN 'abandoned'
                  WHEN attempt_count >= %(max_attempts)s THEN 'deferred'
                  ELSE 'failed' END,
    completed_at = CASE WHEN attempt_count > %(max_attempts)s THEN now() END,
    error = %(error)s, next_run_at = now() + %(delay)s, heartbeat_at = now(),
    leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
RETURNING status, next_run_at;

-- name: throttle_job
-- a throttle gives the attempt back and pushes every open job of the lane to the same time: the
-- account was told to slow down, not the job
WITH throttled AS (
    UPDATE {schema}.jobs
    SET status = CASE WHEN %(previous_status)s = 'deferred' THEN 'deferred' ELSE 'failed' END,
        attempt_count = attempt_count - 1, throttle_count = throttle_count + 1,
        error = %(error)s, next_run_at = now() + %(delay)s, heartbeat_at = now(),
        leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
    RETURNING queue, lane, next_run_at
),
lane AS (
    UPDATE {schema}.jobs o
    SET next_run_at = t.next_run_at
    FROM throttled t
    WHERE o.queue = t.queue AND o.lane = t.lane
      AND o.status IN ('pending', 'failed', 'deferred') AND o.next_run_at < t.next_run_at
    RETURNING o.id
)
SELECT t.next_run_at, (SELECT count(*) FROM lane) AS pushed FROM throttled t;

-- name: abandon_job
-- the handler said a retry cannot help: abandoned at once, waiting for a human
UPDATE {schema}.jobs
SET status = 'abandoned', error = %(error)s, completed_at = now(), heartbeat_at = now(),
    leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running';

-- name: hand_back
-- a stopping worker returns its job with its cursor; a stop is not a failed attempt
UPDATE {schema}.jobs
SET status = CASE WHEN %(previous_status)s = 'deferred' THEN 'deferred' ELSE 'pending' END,
    attempt_count = attempt_count - 1, next_run_at = now(),
    leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running';

-- name: release_cancelled
-- a worker that finds its job cancelled gives the lane back at once
UPDATE {schema}.jobs
SET leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'cancelled';

-- name: reclaim_expired
-- jobs whose worker stopped renewing its lease go back in line (the attempt counts as failed);
-- the dead worker's late writes no longer match the cleared token
UPDATE {schema}.jobs
SET status = CASE WHEN attempt_count > %(max_attempts)s THEN 'abandoned'
                  WHEN attempt_count >= %(max_attempts)s THEN 'deferred'
                  ELSE 'failed' END,
    completed_at = CASE WHEN attempt_count > %(max_attempts)s THEN now() END,
    error = 'LeaseExpired: worker ' || coalesce(leased_by, '?')
            || ' stopped renewing its lease',
    next_run_at = now(), leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE queue = %(queue)s AND status = 'running' AND lease_expires_at < now()
RETURNING id, owner, lane, type, mode, window_start, window_end, status;

-- name: depth
-- open jobs counted by queue, lane and status in the database; reads only open rows (grouped by
-- owner first, which counts the owners without a sort)
WITH by_owner AS (
    SELECT queue, lane, status, owner,
           count(*) AS jobs,
           count(*) FILTER (WHERE status IN ('pending', 'failed') AND next_run_at <= now()) AS due,
           min(created_at) AS oldest,
           min(next_run_at) FILTER (WHERE status <> 'running') AS next_run_at
    FROM {schema}.jobs
    WHERE status IN ('pending', 'running', 'failed', 'deferred')
      AND (%(statuses)s::text[] IS NULL OR status = ANY (%(statuses)s::text[]))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(owner)s::text IS NULL OR owner = %(owner)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
    GROUP BY queue, lane, status, owner
)
SELECT queue, lane, status,
       sum(jobs)::bigint AS jobs,
       sum(due)::bigint AS due,
       count(*) AS owner_count,
       now() - min(oldest) AS age,
       min(next_run_at) AS next_run_at
FROM by_owner
GROUP BY queue, lane, status
ORDER BY queue, lane,
         array_position(ARRAY['pending', 'running', 'failed', 'deferred'], status);

-- name: coverage
-- the windows of each owner and type as spans for a timeline, merged in the database: windows
-- that follow each other without a gap and share a status are one span; a gap or another
-- status starts a new one
WITH windows AS (
    SELECT owner, type, status, window_start, window_end, processed_count, id,
           lag(status) OVER w AS previous_status,
           max(window_end) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached
    FROM {schema}.jobs
    WHERE queue = %(queue)s AND window_start IS NOT NULL AND window_end IS NOT NULL
      AND (%(owner)s::text IS NULL OR owner = %(owner)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
      AND (%(statuses)s::text[] IS NULL OR status = ANY (%(statuses)s::text[]))
      AND window_end > coalesce(%(since)s::timestamptz, now() - %(since_ago)s::interval,
                                '-infinity')
      AND window_start < coalesce(%(until)s::timestamptz, now() - %(until_ago)s::interval,
                                  'infinity')
    WINDOW w AS (PARTITION BY owner, type ORDER BY window_start, window_end, id)
),
numbered AS (
    SELECT *,
           count(*) FILTER (WHERE previous_status IS DISTINCT FROM status
                              OR reached < window_start)
               OVER (PARTITION BY owner, type ORDER BY window_start, window_end, id) AS span
    FROM windows
)
SELECT owner, type, status, min(window_start) AS window_start, max(window_end) AS window_end,
       max(window_end) - min(window_start) AS duration,
       count(*) AS jobs, sum(processed_count)::bigint AS records
FROM numbered
GROUP BY owner, type, span, status
ORDER BY owner, type, min(window_start);

-- name: throughput
-- records and completed jobs per period of `every` seconds (aligned to the epoch) in the
-- database; a job's records count in the period it completed; every period of the range is
-- there, with zeros when nothing completed
WITH asked AS (
    SELECT coalesce(%(since)s::timestamptz, now() - %(since_ago)s::interval) AS since,
           coalesce(%(until)s::timestamptz, now() - %(until_ago)s::interval) AS until,
           %(every)s::float8 AS step
),
bounds AS (
    -- the range starts at the beginning of the period `since` falls in
    SELECT to_timestamp(floor(extract(epoch FROM since) / step) * step) AS since, until, step
    FROM asked
),
periods AS (
    SELECT to_timestamp(n * b.step) AS period
    FROM bounds b,
         generate_series(round(extract(epoch FROM b.since) / b.step)::bigint,
                         ceil(extract(epoch FROM b.until) / b.step)::bigint - 1) AS n
),
done AS (
    SELECT to_timestamp(floor(extract(epoch FROM j.completed_at) / b.step) * b.step) AS period,
           CASE %(by)s::text WHEN 'queue' THEN j.queue WHEN 'owner' THEN j.owner
                             WHEN 'lane' THEN j.lane WHEN 'type' THEN j.type END AS key,
           count(*) AS jobs, sum(j.processed_count)::bigint AS records
    FROM {schema}.jobs j, bounds b
    WHERE j.status = 'completed' AND j.completed_at >= b.since AND j.completed_at < b.until
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
      AND (%(owner)s::text IS NULL OR j.owner = %(owner)s)
      AND (%(type)s::text IS NULL OR j.type = %(type)s)
    GROUP BY 1, 2
),
keys AS (
    SELECT DISTINCT key FROM done
    UNION ALL
    SELECT NULL WHERE %(by)s::text IS NULL AND NOT EXISTS (SELECT 1 FROM done)
)
SELECT p.period, k.key, coalesce(d.jobs, 0) AS jobs, coalesce(d.records, 0) AS records,
       coalesce(d.jobs, 0) * 60 / b.step AS jobs_per_minute,
       coalesce(d.records, 0) * 60 / b.step AS records_per_minute
FROM periods p
CROSS JOIN keys k
CROSS JOIN bounds b
LEFT JOIN done d ON d.period = p.period AND d.key IS NOT DISTINCT FROM k.key
ORDER BY p.period, k.key;
