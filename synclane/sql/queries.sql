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
-- jobs, newest first, filtered
SELECT id, queue, owner, lane, type, mode, status, priority, window_start, window_end,
       dedup_key, cursor, processed_count, attempt_count, throttle_count, error, next_run_at,
       leased_by, lease_token, lease_expires_at, created_at, started_at, heartbeat_at,
       completed_at
FROM {schema}.jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(owner)s::text IS NULL OR owner = %(owner)s)
  AND (%(type)s::text IS NULL OR type = %(type)s)
  AND (%(statuses)s::text[] IS NULL OR status = ANY (%(statuses)s::text[]))
ORDER BY id DESC
LIMIT %(limit)s;

-- name: progress
-- how far the first load of each owner and type is, aggregated in the database
SELECT owner, type,
       count(*) FILTER (WHERE mode = 'initial') AS slices_total,
       count(*) FILTER (WHERE mode = 'initial' AND status = 'completed') AS slices_completed,
       count(*) FILTER (WHERE mode = 'initial'
                          AND status IN ('failed', 'deferred', 'abandoned')) AS slices_failed,
       coalesce(sum(processed_count), 0) AS records,
       min(window_start) FILTER (WHERE status = 'completed') AS coverage_start,
       max(window_end) FILTER (WHERE status = 'completed') AS coverage_end
FROM {schema}.jobs
WHERE queue = %(queue)s AND (%(owner)s::text IS NULL OR owner = %(owner)s)
GROUP BY owner, type
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
-- the database; reads only failed, deferred and abandoned rows
SELECT queue, type, {schema}.error_cause(error) AS cause,
       count(*) AS jobs,
       count(DISTINCT owner) AS owner_count,
       array_agg(DISTINCT owner ORDER BY owner) AS owners,
       array_agg(DISTINCT status ORDER BY status) AS statuses,
       min(coalesce(heartbeat_at, created_at)) AS first_seen,
       max(coalesce(heartbeat_at, created_at)) AS last_seen,
       (array_agg(error ORDER BY id DESC))[1] AS example,
       (array_agg(id ORDER BY id DESC))[1:20] AS job_ids
FROM {schema}.jobs
WHERE status IN ('failed', 'deferred', 'abandoned')
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(owner)s::text IS NULL OR owner = %(owner)s)
  AND (%(type)s::text IS NULL OR type = %(type)s)
GROUP BY queue, type, cause
ORDER BY jobs DESC, last_seen DESC;

-- name: lanes
-- what each lane with open jobs is doing now: its running job (if any) and who holds it, how many
-- jobs wait, and when the next is due; reads only open rows
SELECT o.queue, o.lane,
       count(*) FILTER (WHERE o.status <> 'running') AS waiting,
       min(o.next_run_at) FILTER (WHERE o.status IN ('pending', 'failed')) AS next_due,
       r.id AS job_id, r.owner, r.type, r.window_start, r.window_end, r.cursor,
       r.processed_count, r.leased_by, r.started_at AS since, r.lease_expires_at
FROM {schema}.jobs o
LEFT JOIN {schema}.jobs r
  ON r.queue = o.queue AND r.lane = o.lane AND r.status = 'running'
WHERE o.status IN ('pending', 'running', 'failed', 'deferred')
  AND (%(queue)s::text IS NULL OR o.queue = %(queue)s)
GROUP BY o.queue, o.lane, r.id
ORDER BY o.queue, o.lane;

-- name: take_front
-- takes the best due job of a free lane from the front of the line and marks it running under a
-- fresh lease token; two takers of one lane may both pass this query, and the running-lane
-- index lets only one of them commit (the other gets a unique violation and asks again)
WITH busy AS MATERIALIZED (
    SELECT lane FROM {schema}.jobs WHERE queue = %(queue)s AND status = 'running'
    UNION ALL
    SELECT lane FROM {schema}.jobs
    WHERE queue = %(queue)s AND status = 'cancelled' AND lease_token IS NOT NULL
      AND lease_expires_at > now()
),
front AS (
    SELECT f.id FROM (
        SELECT id, lane, next_run_at FROM {schema}.jobs
        WHERE queue = %(queue)s AND status IN ('pending', 'failed')
        ORDER BY priority, window_start DESC NULLS LAST, id
        LIMIT %(front)s
    ) f
    WHERE f.next_run_at <= now() AND f.lane NOT IN (SELECT lane FROM busy)
),
taken AS (
    SELECT j.id, j.status FROM {schema}.jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM front)) AND j.status IN ('pending', 'failed')
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
