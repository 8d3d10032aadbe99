-- Operations on jobs by hand: enqueue, requeue, cancel.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

-- name: enqueue_job
-- adds one job by hand; with a dedup key a second call finds the first job instead. A job that
-- joins a paused lane (a throttle) waits for the pause like the lane's other jobs; one that is
-- due wakes idle workers when the transaction commits (synclane.wakeup)
WITH added AS (
    INSERT INTO {schema}.jobs
        (queue, owner, lane, type, mode, priority, window_start, window_end, dedup_key,
         next_run_at)
    VALUES (%(queue)s, %(owner)s, %(lane)s, %(type)s, 'manual', %(priority)s, %(window_start)s,
            %(window_end)s, coalesce(%(dedup_key)s::text, 'manual:' || gen_random_uuid()),
            greatest(now(), (SELECT paused_until FROM {schema}.lanes
                             WHERE queue = %(queue)s AND lane = %(lane)s)))
    ON CONFLICT (queue, owner, type, dedup_key) DO NOTHING
    RETURNING id, next_run_at
),
woken AS (
    SELECT pg_notify({channel}, %(queue)s) FROM added WHERE next_run_at <= now()
)
SELECT id, (SELECT count(*) FROM woken) AS woken FROM added;

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
-- gives stopped jobs fresh attempts; the cursor stays, so they continue from their last page. A
-- paused lane keeps them waiting until its pause ends. A cancelled job whose page may still be in
-- flight keeps its lease, and with it its lane, until its worker lets go (release_cancelled) or
-- the lease ends. Rows are locked in id order, so two requeues never wait on each other in a
-- circle. Jobs due at once wake idle workers when the transaction commits (one notification)
WITH chosen AS (
    SELECT j.id, l.paused_until,
           j.lease_token IS NOT NULL AND j.lease_expires_at > now() AS held
    FROM {schema}.jobs j
    LEFT JOIN {schema}.lanes l ON l.queue = j.queue AND l.lane = j.lane
    WHERE j.queue = %(queue)s
      AND (%(owner)s::text IS NULL OR j.owner = %(owner)s)
      AND (%(type)s::text IS NULL OR j.type = %(type)s)
      AND (%(ids)s::bigint[] IS NULL OR j.id = ANY (%(ids)s::bigint[]))
      AND (%(cause)s::text IS NULL OR {schema}.error_cause(j.error) = %(cause)s)
      AND (%(cause_id)s::text IS NULL
           OR left(md5({schema}.error_cause(j.error)), 8) = %(cause_id)s)
      AND j.status = ANY (%(statuses)s::text[])
    ORDER BY j.id
    FOR UPDATE OF j
),
requeued AS (
    UPDATE {schema}.jobs j
    SET status = 'pending', attempt_count = 0, throttle_count = 0, stalls = 0, error = NULL,
        next_run_at = greatest(now(), c.paused_until), completed_at = NULL,
        leased_by = CASE WHEN c.held THEN j.leased_by END,
        lease_token = CASE WHEN c.held THEN j.lease_token END,
        lease_expires_at = CASE WHEN c.held THEN j.lease_expires_at END
    FROM chosen c
    WHERE j.id = c.id
    RETURNING j.id, j.queue, j.lane, j.next_run_at
),
woken AS (
    SELECT pg_notify({channel}, %(queue)s)
    WHERE EXISTS (SELECT FROM requeued WHERE next_run_at <= now())
)
SELECT id, (SELECT count(*) FROM woken) AS woken FROM requeued;

-- name: cancel_jobs
-- what has not finished becomes cancelled; a running job keeps its lease until its worker notices
-- (the status guard on its next save or heartbeat refuses it), so its lane stays held meanwhile.
-- Rows are locked in id order
WITH chosen AS (
    SELECT id FROM {schema}.jobs
    WHERE queue = %(queue)s AND owner = %(owner)s
      AND (%(type)s::text IS NULL OR type = %(type)s)
      AND status IN ('pending', 'running', 'failed', 'deferred')
    ORDER BY id
    FOR UPDATE
)
UPDATE {schema}.jobs j
SET status = 'cancelled', error = %(error)s, completed_at = now()
FROM chosen c
WHERE j.id = c.id
RETURNING j.id, j.queue, j.lane, j.next_run_at

-- name: pause_queue
-- pauses a queue for every process: nothing new is taken from it (the take statements read this
-- table), a running job stops at its next page boundary (save_page reads it), planning goes on;
-- pausing a paused queue keeps when and by whom it was first paused
INSERT INTO {schema}.queue_pauses AS p (queue, paused_by, reason)
VALUES (%(queue)s, %(by)s, %(reason)s)
ON CONFLICT (queue) DO UPDATE SET reason = excluded.reason
RETURNING paused_at, paused_by, reason;

-- name: resume_queue
-- takes from the queue again, in every process, and wakes the queue's idle slots when it commits
-- (the jobs that piled up during the pause are due now, not at the next poll)
WITH resumed AS (
    DELETE FROM {schema}.queue_pauses WHERE queue = %(queue)s
    RETURNING paused_at
),
woken AS (
    SELECT pg_notify({channel}, %(queue)s) FROM resumed
)
SELECT paused_at, (SELECT count(*) FROM woken) AS woken FROM resumed;

-- name: set_lane_rate
-- a lane's own rate (an account on a bigger plan), or none (the queue's applies again); takes
-- effect at the lane's next page start, in every process
INSERT INTO {schema}.lanes AS l (queue, lane, rate_count, rate_period)
VALUES (%(queue)s, %(lane)s, %(count)s, %(period)s)
ON CONFLICT (queue, lane) DO UPDATE SET rate_count = excluded.rate_count,
                                        rate_period = excluded.rate_period;

-- name: set_queue_rate
-- a queue's rate without a deploy (it overrides the declared lane_rate), or none (the declared
-- one applies again)
WITH cleared AS (
    DELETE FROM {schema}.queue_rates WHERE queue = %(queue)s AND %(count)s::int IS NULL
)
INSERT INTO {schema}.queue_rates AS q (queue, rate_count, rate_period)
SELECT %(queue)s, %(count)s, %(period)s WHERE %(count)s::int IS NOT NULL
ON CONFLICT (queue) DO UPDATE SET rate_count = excluded.rate_count,
                                  rate_period = excluded.rate_period;

-- name: transaction_id
-- the id of the transaction a change by hand runs in: after its commit's answer was lost, its
-- status says whether it committed
SELECT pg_current_xact_id()::text AS xid;

-- name: transaction_status
-- whether a transaction committed ('committed', 'aborted', 'in progress'; NULL when too old to
-- tell)
SELECT pg_xact_status(%(xid)s::xid8) AS status;
