-- Workers among themselves: who is alive (the workers table: register, beat, leave), that work
-- is due (notifications on the schema's channel, which idle workers LISTEN on), and what the
-- metrics read. Each statement is loaded by name into synclane.store; {schema} is the schema,
-- quoted as an identifier. The line under each name says what the statement guarantees.

-- name: worker_register
-- puts a worker in the list under its name, on the session that will beat for it (with
-- %(session)s false, through a transaction pooler, the connection is no session of its own: -1
-- is recorded). A name whose holder's session is gone (it died), or whose holder without a
-- session stopped beating, is taken over; a name held by a live worker is refused (no row comes
-- back), so two live workers never share a name, nor a running job's leased_by. The same worker
-- registering again after its connection broke finds its own row
INSERT INTO {schema}.workers AS w
    (name, instance, host, pid, version, queues, slots, busy, waiting, stopping, session_pid,
     started_at, last_seen_at, expires_at)
VALUES (%(name)s, %(instance)s, %(host)s, %(pid)s, %(version)s, %(queues)s, %(slots)s,
        %(busy)s, %(waiting)s, false, CASE WHEN %(session)s THEN pg_backend_pid() ELSE -1 END, now(),
        now(), now() + %(lost_after)s)
ON CONFLICT (name) DO UPDATE
SET instance = excluded.instance, host = excluded.host, pid = excluded.pid,
    version = excluded.version, queues = excluded.queues, slots = excluded.slots,
    busy = excluded.busy, waiting = excluded.waiting, stopping = false,
    session_pid = excluded.session_pid,
    started_at = CASE WHEN w.instance = excluded.instance THEN w.started_at ELSE now() END,
    last_seen_at = now(), expires_at = excluded.expires_at
WHERE w.instance = excluded.instance
   OR (w.session_pid IS DISTINCT FROM -1
       AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = w.session_pid))
   OR (w.session_pid = -1 AND w.expires_at < now())
RETURNING name;

-- name: worker_holder
-- the live worker that holds a name, for the line that says why this one took another
SELECT host, pid, last_seen_at FROM {schema}.workers WHERE name = %(name)s;

-- name: worker_beat
-- the worker is alive: renews its row (how many slots run a job, the session it beats on) and
-- deletes the rows of workers lost for longer than %(forget_after)s (a few rows: the table holds
-- one per worker process). False when its row is gone or is another worker's now
WITH beat AS (
    UPDATE {schema}.workers
    SET busy = %(busy)s, waiting = %(waiting)s,
        session_pid = CASE WHEN %(session)s THEN pg_backend_pid() ELSE -1 END,
        last_seen_at = now(), expires_at = now() + %(lost_after)s
    WHERE name = %(name)s AND instance = %(instance)s
    RETURNING name
),
forgotten AS (
    DELETE FROM {schema}.workers
    WHERE expires_at < now() - %(forget_after)s AND name <> %(name)s
    RETURNING name
)
SELECT EXISTS (SELECT FROM beat) AS listed, (SELECT count(*) FROM forgotten) AS forgotten;

-- name: worker_waiting
-- the worker's slots began to wait for work, or none waits any more: said at once, not at the
-- next beat, so that a worker that frees a lane knows whether anyone would take its next job
-- (notify_freed_lanes)
UPDATE {schema}.workers SET waiting = %(waiting)s, busy = %(busy)s
WHERE name = %(name)s AND instance = %(instance)s;

-- name: worker_stopping
-- the worker was asked to stop: its slots hand their jobs back before its row goes
UPDATE {schema}.workers SET stopping = true
WHERE name = %(name)s AND instance = %(instance)s;

-- name: worker_leave
-- a worker that stopped cleanly disappears from the list
DELETE FROM {schema}.workers WHERE name = %(name)s AND instance = %(instance)s;

-- name: workers
-- the workers of the list and what each is: running, stopping, or lost (it stopped beating, or
-- its session to PostgreSQL is gone: a process killed with -9 is lost at once; one that beats
-- through a transaction pooler records no session, and is lost when it stops beating)
SELECT w.name, w.host, w.pid, w.version, w.queues, w.slots, w.busy, w.started_at,
       w.last_seen_at,
       CASE WHEN w.expires_at < now() OR (w.session_pid IS DISTINCT FROM -1 AND a.pid IS NULL)
            THEN 'lost'
            WHEN w.stopping THEN 'stopping'
            ELSE 'running' END AS state
FROM {schema}.workers w
LEFT JOIN pg_stat_activity a ON a.pid = w.session_pid
WHERE %(queue)s::text IS NULL OR %(queue)s = ANY (w.queues)
ORDER BY w.name;

-- name: notify_work
-- wakes the idle slots of these queues in every worker that listens on the channel. Sent in the
-- transaction that made the work, it is delivered when that commits (never when it rolls back),
-- and PostgreSQL folds identical notifications of one transaction into one
SELECT pg_notify({channel}, queue) FROM unnest(%(queues)s::text[]) AS queue;

-- name: notify_freed_lanes
-- after take statements completed the jobs of %(done_ids)s, for the lanes they freed whose next
-- job the finisher did not take (not one of %(taken_lanes)s): a lane a look parked as busy gets a
-- wake (the next look reads it again), and idle slots are woken when such a lane has a pending or
-- failed job that is due and a live worker of the queue has a slot that waits (it says so at
-- once: worker_waiting). Writes nothing when no look parked them, so under full load it costs
-- no commit
WITH freed AS MATERIALIZED (
    SELECT DISTINCT d.lane FROM {schema}.jobs d
    WHERE d.id = ANY (%(done_ids)s::bigint[]) AND d.lane <> ALL (%(taken_lanes)s::text[])
),
woken AS (
    INSERT INTO {schema}.lane_wakes (queue, lane, due_at)
    SELECT %(queue)s, f.lane, now() FROM freed f
    JOIN {schema}.lanes l ON l.queue = %(queue)s AND l.lane = f.lane AND l.due_at = 'infinity'
    RETURNING lane
)
SELECT pg_notify({channel}, %(queue)s)
WHERE EXISTS (
    SELECT FROM {schema}.workers w
    WHERE %(queue)s = ANY (w.queues) AND w.waiting > 0 AND w.expires_at > now()
)
AND EXISTS (
    SELECT FROM freed f
    WHERE EXISTS (
          SELECT FROM {schema}.jobs j
          WHERE j.queue = %(queue)s AND j.lane = f.lane AND j.status IN ('pending', 'failed')
            AND j.next_run_at <= now())
)
AND (SELECT count(*) FROM woken) >= 0;

-- name: metrics_jobs
-- the jobs that still need something, by queue and status, with how many of them are due and
-- since when the oldest due one waits (seconds); reads the open rows and the index of abandoned
-- ones, never the history
SELECT queue, status, count(*) AS jobs,
       count(*) FILTER (WHERE status IN ('pending', 'failed') AND next_run_at <= now()) AS due,
       extract(epoch FROM now() - min(next_run_at) FILTER (
           WHERE status IN ('pending', 'failed') AND next_run_at <= now()))::float8 AS oldest_due
FROM {schema}.jobs
WHERE status IN ('pending', 'running', 'failed', 'deferred')
GROUP BY queue, status
UNION ALL
SELECT queue, 'abandoned', count(*), 0, NULL FROM {schema}.jobs
WHERE status = 'abandoned'
GROUP BY queue;

-- name: metrics_lanes
-- the lanes a throttle pauses now: how many per queue, and for the %(limit)s of each queue paused
-- the furthest ahead, how many seconds their pause has left
SELECT queue, lane, seconds, paused FROM (
    SELECT queue, lane, extract(epoch FROM paused_until - now())::float8 AS seconds,
           count(*) OVER (PARTITION BY queue) AS paused,
           row_number() OVER (PARTITION BY queue ORDER BY paused_until DESC, lane) AS rank
    FROM {schema}.lanes
    WHERE paused_until > now()
) p
WHERE rank <= %(limit)s;

-- name: metrics_paused_queues
-- the queues paused by hand (app.pause); fails with undefined_table on a schema without pauses
SELECT queue FROM {schema}.queue_pauses;
