-- What the dashboard (synclane.dashboard) reads. Every answer is bounded: counts, or at most
-- `limit` rows, so the page costs the same at ten accounts and at a hundred thousand.
-- Each statement reads only rows that are not finished (pending, running, failed, deferred,
-- abandoned), the per-owner indexes, or the newest ids; never a scan of the finished history.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

-- name: page_summary
-- jobs that are not finished, counted per queue and status, with how many owners they belong
-- to; reads only unfinished rows, and counts owners by hashing, without a sort
WITH per_owner AS (
    SELECT queue, status, owner, count(*) AS jobs
    FROM {schema}.jobs
    WHERE status IN ('pending', 'running', 'failed', 'deferred', 'abandoned')
    GROUP BY queue, status, owner
)
SELECT queue, status, sum(jobs)::bigint AS jobs, count(*) AS owners
FROM per_owner
GROUP BY queue, status
ORDER BY queue, array_position(ARRAY['running', 'pending', 'failed', 'deferred', 'abandoned'],
                               status);

-- name: page_table_rows
-- the table's rows counted up to `count_up_to` (the count stops there: the same cost on any
-- table), and the planner's estimate (pg_class.reltuples, -1 before the first ANALYZE) for a
-- table that holds more
SELECT (SELECT count(*) FROM (SELECT FROM {schema}.jobs LIMIT %(count_up_to)s) AS j) AS counted,
       (SELECT c.reltuples::bigint
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relname = 'jobs') AS estimate;

-- name: page_accounts
-- owners and types that need a look, worst first: something abandoned, then failing, then a
-- throttled lane, then the first loads waiting longest; at most `limit` rows from `offset`, and
-- `total` how many need a look. Reads only the unfinished rows that can put an account here
-- (stopped, history, or waiting for a later time), not the refreshes simply due
WITH open AS (
    SELECT queue, owner, type,
           min(lane) AS lane,
           count(*) FILTER (WHERE status = 'abandoned') AS abandoned,
           count(*) FILTER (WHERE status = 'deferred') AS deferred,
           count(*) FILTER (WHERE status = 'failed' AND coalesce(error, '') NOT LIKE 'Throttled%%')
               AS failing,
           -- a throttle fails its job with a Throttled error and pushes every other open job of
           -- the lane to the same time; nothing else leaves a pending job waiting
           max(next_run_at) FILTER (WHERE next_run_at > now()
                                      AND (status = 'pending'
                                           OR (status IN ('failed', 'deferred')
                                               AND error LIKE 'Throttled%%')))
               AS paused_until,
           count(*) FILTER (WHERE mode = 'initial') AS history_open,
           min(created_at) FILTER (WHERE mode = 'initial') AS history_since,
           max(id) FILTER (WHERE status IN ('failed', 'deferred', 'abandoned')) AS newest_failure
    FROM {schema}.jobs
    WHERE status IN ('pending', 'running', 'failed', 'deferred', 'abandoned')
      AND (status IN ('failed', 'deferred', 'abandoned') OR mode = 'initial'
           OR next_run_at > now())
    GROUP BY queue, owner, type
),
ranked AS (
    SELECT *, CASE WHEN abandoned > 0 THEN 0
                WHEN deferred + failing > 0 THEN 1
                WHEN paused_until IS NOT NULL THEN 2
                WHEN history_open > 0 THEN 3
                ELSE 4 END AS severity
    FROM open
)
SELECT r.queue, r.owner, r.type, r.lane, r.severity, r.abandoned,
       r.deferred, r.failing, r.paused_until, r.history_open, r.history_since,
       left(e.error, %(error_width)s) AS newest_error, count(*) OVER () AS total
FROM ranked r
LEFT JOIN {schema}.jobs e ON e.id = r.newest_failure
WHERE r.severity < 4
ORDER BY r.severity,
         CASE WHEN r.severity = 3 THEN r.history_since END,
         r.newest_failure DESC NULLS LAST, r.queue, r.owner, r.type
LIMIT %(limit)s OFFSET %(offset)s;

-- name: page_search_accounts
-- every account (owner and type, finished or not) whose owner starts with `search`, worst first
-- as in page_accounts, at most `limit` from `offset`; walks the per-owner unique index from the
-- text on, one owner and type at a time, and stops at the first owner that does not start with
-- it or after `walk` accounts, so it never reads more than that many accounts' rows
WITH RECURSIVE walk(queue, owner, type, n) AS (
    SELECT f.queue, f.owner, f.type, 1
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.queue, j.owner, j.type FROM {schema}.jobs j
        WHERE j.queue = q.name AND j.owner >= %(search)s
        ORDER BY j.owner, j.type LIMIT 1
    ) f
    WHERE starts_with(f.owner, %(search)s)
    UNION ALL
    SELECT nx.queue, nx.owner, nx.type, w.n + 1
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT j.queue, j.owner, j.type FROM {schema}.jobs j
        WHERE j.queue = w.queue AND (j.owner, j.type) > (w.owner, w.type)
        ORDER BY j.owner, j.type LIMIT 1
    ) nx
    WHERE starts_with(nx.owner, %(search)s) AND w.n < %(walk)s
),
open AS (
    SELECT w.queue, w.owner, w.type, o.*
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT
           min(lane) AS lane,
           count(*) FILTER (WHERE status = 'abandoned') AS abandoned,
           count(*) FILTER (WHERE status = 'deferred') AS deferred,
           count(*) FILTER (WHERE status = 'failed' AND coalesce(error, '') NOT LIKE 'Throttled%%')
               AS failing,
           -- a throttle fails its job with a Throttled error and pushes every other open job of
           -- the lane to the same time; nothing else leaves a pending job waiting
           max(next_run_at) FILTER (WHERE next_run_at > now()
                                      AND (status = 'pending'
                                           OR (status IN ('failed', 'deferred')
                                               AND error LIKE 'Throttled%%')))
               AS paused_until,
           count(*) FILTER (WHERE mode = 'initial') AS history_open,
           min(created_at) FILTER (WHERE mode = 'initial') AS history_since,
           max(id) FILTER (WHERE status IN ('failed', 'deferred', 'abandoned')) AS newest_failure
        FROM {schema}.jobs
        WHERE queue = w.queue AND owner = w.owner AND type = w.type
          AND status IN ('pending', 'running', 'failed', 'deferred', 'abandoned')
    ) o
),
ranked AS (
    SELECT *, CASE WHEN abandoned > 0 THEN 0
                WHEN deferred + failing > 0 THEN 1
                WHEN paused_until IS NOT NULL THEN 2
                WHEN history_open > 0 THEN 3
                ELSE 4 END AS severity
    FROM open
)
SELECT r.queue, r.owner, r.type, r.lane, r.severity, r.abandoned,
       r.deferred, r.failing, r.paused_until, r.history_open, r.history_since,
       left(e.error, %(error_width)s) AS newest_error, count(*) OVER () AS total
FROM ranked r
LEFT JOIN {schema}.jobs e ON e.id = r.newest_failure
ORDER BY r.severity,
         CASE WHEN r.severity = 3 THEN r.history_since END,
         r.newest_failure DESC NULLS LAST, r.queue, r.owner, r.type
LIMIT %(limit)s OFFSET %(offset)s;

-- name: page_history
-- the first load (history slices) of the given owners and types: how many slices (those not
-- planned yet counted from the histories row, slices_to_plan, as progress() does), how many
-- loaded, the records and the span loaded; looks each owner up in the per-owner unique index, so
-- it reads only those owners' rows
SELECT c.queue, c.owner, c.type, c.rows_total + n AS slices_total,
       CASE WHEN c.stopped THEN 0 ELSE n END AS slices_unplanned,
       c.slices_completed, c.slices_failed, c.records, c.loaded_from, c.loaded_to
FROM (
    SELECT a.queue, a.owner, a.type,
           count(j.id) AS rows_total,
           count(j.id) FILTER (WHERE j.status = 'completed') AS slices_completed,
           count(j.id) FILTER (WHERE j.status IN ('failed', 'deferred', 'abandoned'))
               AS slices_failed,
           coalesce(sum(j.processed_count), 0)::bigint AS records,
           min(j.window_start) FILTER (WHERE j.status = 'completed') AS loaded_from,
           max(j.window_end) FILTER (WHERE j.status = 'completed') AS loaded_to,
           min(j.window_start) AS history_start,
           -- the oldest slice was cancelled (the owner was): nothing more is planned for it
           min(j.window_start) FILTER (WHERE j.status = 'cancelled') = min(j.window_start)
               AS stopped
    FROM unnest(%(queues)s::text[], %(owners)s::text[], %(types)s::text[]) AS a(queue, owner, type)
    LEFT JOIN {schema}.jobs j
           ON j.queue = a.queue AND j.owner = a.owner AND j.type = a.type AND j.mode = 'initial'
    GROUP BY a.queue, a.owner, a.type
) AS c, {schema}.slices_to_plan(c.queue, c.owner, c.type, c.history_start) AS n;

-- name: page_lanes
-- the busiest lanes first: those running a job, then those with most jobs waiting; at most
-- `limit` from `offset`, `total` how many lanes have unfinished jobs. Counts the waiting jobs of
-- every lane in the index of open lanes and takes the running ones from the running-lane index;
-- only the lanes shown are then read in full: what is due, until when a throttle pauses them
-- (the lane's own pause, which outlives a requeue of its jobs, or its jobs' throttle, as lanes()
-- reads it), and for a queue with a declared rate (`rate_queues`, `rate_counts`,
-- `rate_periods`) the lane's rate as lane_page_start resolves it (the lane's own, the queue's,
-- the declared one) and the page starts its current window still allows
WITH waiting AS (
    SELECT queue, lane, count(*) AS waiting
    FROM {schema}.jobs
    WHERE status IN ('pending', 'failed', 'deferred')
      AND (%(search)s::text IS NULL OR starts_with(lane, %(search)s))
    GROUP BY queue, lane
),
running AS (
    SELECT queue, lane, id
    FROM {schema}.jobs
    WHERE status = 'running'
      AND (%(search)s::text IS NULL OR starts_with(lane, %(search)s))
),
shown AS (
    SELECT coalesce(w.queue, r.queue) AS queue, coalesce(w.lane, r.lane) AS lane,
           coalesce(w.waiting, 0) AS waiting, r.id AS running_id, count(*) OVER () AS total
    FROM waiting w
    FULL JOIN running r ON r.queue = w.queue AND r.lane = w.lane
    ORDER BY r.id IS NOT NULL DESC, coalesce(w.waiting, 0) DESC, 1, 2
    LIMIT %(limit)s OFFSET %(offset)s
),
declared AS (
    SELECT * FROM unnest(%(rate_queues)s::text[], %(rate_counts)s::integer[],
                         %(rate_periods)s::interval[]) AS d (queue, count, period)
)
SELECT s.queue, s.lane,
       r.id AS job_id, r.owner, r.type, r.mode, r.window_start, r.window_end, r.cursor,
       r.processed_count, r.attempt_count, r.leased_by, r.started_at AS since,
       r.lease_expires_at, s.waiting, d.due, d.next_due,
       CASE WHEN l.paused_until > now() THEN greatest(l.paused_until, d.paused_until)
            ELSE d.paused_until END AS paused_until,
       q.rate_count, q.rate_period,
       CASE WHEN q.rate_count IS NOT NULL  -- greatest() would turn no rate into 0 left
            THEN greatest(q.rate_count - cardinality(ARRAY(SELECT t FROM unnest(l.starts) t
                                                           WHERE t > now() - q.rate_period)),
                          0) END AS rate_left,
       s.total
FROM shown s
LEFT JOIN {schema}.jobs r ON r.id = s.running_id
LEFT JOIN {schema}.lanes l ON l.queue = s.queue AND l.lane = s.lane
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE o.status IN ('pending', 'failed') AND o.next_run_at <= now())
               AS due,
           min(o.next_run_at) FILTER (WHERE o.status IN ('pending', 'failed')) AS next_due,
           max(o.next_run_at) FILTER (WHERE o.status IN ('failed', 'deferred')
                                        AND o.next_run_at > now() AND o.error LIKE 'Throttled%%')
               AS paused_until
    FROM {schema}.jobs o
    WHERE o.queue = s.queue AND o.lane = s.lane AND o.status IN ('pending', 'failed', 'deferred')
) d
LEFT JOIN LATERAL (
    SELECT coalesce(l.rate_count, qr.rate_count, dr.count) AS rate_count,
           coalesce(l.rate_period, qr.rate_period, dr.period) AS rate_period
    FROM declared dr
    LEFT JOIN {schema}.queue_rates qr ON qr.queue = dr.queue
    WHERE dr.queue = s.queue
) q ON true
ORDER BY s.running_id IS NOT NULL DESC, s.waiting DESC, s.queue, s.lane;

-- name: page_failures
-- stopped jobs (failed, deferred, abandoned) grouped by cause (the error's first line with
-- numbers and ids masked), most jobs first, at most `limit`; each cause with its short id (the
-- one requeue(cause_id=...) takes), one real error as an example, and how many of its jobs wait
-- for a human (deferred, abandoned, or failed with a retry further off than `far`); `search`
-- keeps the causes that contain it or whose id it is
WITH causes AS (
    SELECT {schema}.error_cause(error) AS cause, queue, type,
           count(*) AS jobs,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'deferred') AS deferred,
           count(*) FILTER (WHERE status = 'abandoned') AS abandoned,
           count(*) FILTER (WHERE status IN ('deferred', 'abandoned')
                              OR (status = 'failed' AND next_run_at > now() + %(far)s
                                  AND coalesce(error, '') NOT LIKE 'Throttled%%'))
               AS waiting_for_a_human,
           min(next_run_at) FILTER (WHERE status = 'failed') AS next_retry,
           count(DISTINCT owner) AS owner_count,
           (array_agg(DISTINCT owner ORDER BY owner))[1:%(owners_shown)s] AS owners,
           array_agg(DISTINCT status ORDER BY status) AS statuses,
           (array_agg(id ORDER BY id DESC))[1:%(owners_shown)s] AS job_ids,
           min(coalesce(heartbeat_at, created_at)) AS first_seen,
           max(coalesce(heartbeat_at, created_at)) AS last_seen,
           max(id) AS newest_id
    FROM {schema}.jobs
    WHERE status IN ('failed', 'deferred', 'abandoned')
    GROUP BY 1, queue, type
)
SELECT c.cause, left(md5(c.cause), 8) AS cause_id, c.queue, c.type, c.jobs, c.failed,
       c.deferred, c.abandoned, c.waiting_for_a_human, c.next_retry, c.owner_count, c.owners,
       c.statuses, c.job_ids, c.first_seen, c.last_seen, left(e.error, %(error_width)s) AS example,
       count(*) OVER () AS total
FROM causes c
JOIN {schema}.jobs e ON e.id = c.newest_id
WHERE %(search)s::text IS NULL OR left(md5(c.cause), 8) = %(search)s
   OR strpos(lower(c.cause), lower(%(search)s)) > 0
ORDER BY c.jobs DESC, c.last_seen DESC, c.cause, c.queue, c.type
LIMIT %(limit)s;

-- name: page_jobs
-- jobs newest first below the id `before`, at most `limit`: by default every job that runs or
-- waits for a human however old (keyset paging reaches the oldest), or filtered by queue, owner,
-- lane, statuses or a cause's short id. With `narrow` (unfinished statuses, an owner, a lane)
-- the rows come from the per-owner and open-row indexes and are sorted, instead of walking the
-- newest ids, which would read the whole history to find a few old stopped jobs. An owner is
-- looked up in the declared `queues`. `offer_requeue` says whether a Requeue button belongs on
-- it: deferred, abandoned, or failed with a retry further off than `far` (not a throttle). A
-- next run only for a job that waits to be taken
SELECT id, queue, owner, lane, type, mode, status, window_start, window_end, cursor,
       processed_count, attempt_count, throttle_count,
       left(error, %(error_width)s) AS error,
       CASE WHEN status IN ('failed', 'deferred', 'abandoned') AND error IS NOT NULL
            THEN left(md5({schema}.error_cause(error)), 8) END AS cause_id,
       CASE WHEN status IN ('pending', 'failed', 'deferred') THEN next_run_at END AS next_run_at,
       leased_by, created_at, started_at, completed_at,
       (status IN ('deferred', 'abandoned')
        OR (status = 'failed' AND next_run_at > now() + %(far)s
            AND coalesce(error, '') NOT LIKE 'Throttled%%')) AS offer_requeue
FROM {schema}.jobs
WHERE (%(before)s::bigint IS NULL OR id < %(before)s)
  AND (%(statuses)s::text[] IS NULL OR status = ANY (%(statuses)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(owner)s::text IS NULL OR (owner = %(owner)s AND queue = ANY (%(queues)s::text[])))
  AND (%(lane)s::text IS NULL OR lane = %(lane)s)
  AND (%(cause_id)s::text IS NULL
       OR (status IN ('failed', 'deferred', 'abandoned')
           AND left(md5({schema}.error_cause(error)), 8) = %(cause_id)s))
ORDER BY CASE WHEN %(narrow)s THEN id + 0 END DESC, id DESC
LIMIT %(limit)s;

-- name: page_workers
-- the worker processes of the list, running first, then stopping, then lost, by name; at most
-- `limit` from `offset`, `total` how many. A worker is lost as the `workers` statement
-- (workers.sql) decides it: it stopped beating, or its session to PostgreSQL is gone
SELECT name, host, pid, version, queues, slots, busy, started_at, last_seen_at, state,
       count(*) OVER () AS total
FROM (
    SELECT w.*,
           CASE WHEN w.expires_at < now() OR (w.session_pid IS DISTINCT FROM -1 AND a.pid IS NULL)
                THEN 'lost'
                WHEN w.stopping THEN 'stopping'
                ELSE 'running' END AS state
    FROM {schema}.workers w
    LEFT JOIN pg_stat_activity a ON a.pid = w.session_pid
) listed
ORDER BY array_position(ARRAY['running', 'stopping', 'lost'], state), name
LIMIT %(limit)s OFFSET %(offset)s;
