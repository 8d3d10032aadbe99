-- Operations on jobs by hand: enqueue, requeue, cancel.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

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
  AND (%(cause_id)s::text IS NULL OR left(md5({schema}.error_cause(error)), 8) = %(cause_id)s)
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
