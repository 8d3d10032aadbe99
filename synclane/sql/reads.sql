-- Reads for the notebook SDK, the command line and the page; each aggregates in the database.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

-- name: list_jobs
-- jobs, newest first, filtered, at most `limit` rows; an error is cut to its first line (at most
-- `error_width` characters, "…" where cut) unless full_errors; durations on the database clock;
-- a next run only for a job that waits to be taken (a finished or running row keeps an old one)
SELECT id, queue, owner, lane, type, mode, status, window_start, window_end, cursor,
       processed_count, attempt_count, throttle_count,
       now() - created_at AS age,
       CASE WHEN status = 'running' THEN now() - started_at END AS running_for,
       CASE WHEN status IN ('pending', 'failed', 'deferred') THEN next_run_at END AS next_run_at,
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
-- records, the unbroken loaded span, a state and an ETA; at most `limit` rows, the first by owner
-- and type. Counts from the history index alone (jobs_history) in owner order, so a limit stops
-- the walk; reads rows only for what that index leaves out (the errors of failed and deferred
-- slices; the newest slice not loaded below the newest loaded one, when that is not the slice
-- next to it). The slices not planned yet are counted from the histories row (slices_to_plan,
-- one lookup per owner and type). Refreshes never count. Asked only for states other than
-- 'loaded', it counts only the owners that have a slice of a status such a state needs
-- (jobs_history_unloaded, and the running jobs)
WITH history AS (
    SELECT owner, type, status, processed_count, window_start, window_end, next_run_at,
           started_at, completed_at
    FROM {schema}.jobs
    WHERE queue = %(queue)s AND mode = 'initial'
      AND (%(owner)s::text IS NULL OR owner = %(owner)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
      -- every state but 'loaded' needs a slice that is not completed: when only such states are
      -- asked for, count only the owners that have a slice of a status that state needs
      AND (%(states)s::text[] IS NULL OR 'loaded' = ANY (%(states)s::text[])
           OR owner = ANY (ARRAY(
               SELECT u.owner FROM {schema}.jobs u
               WHERE u.queue = %(queue)s AND u.mode = 'initial'
                 AND u.status IN ('pending', 'failed', 'deferred', 'abandoned', 'cancelled')
                 AND ((u.status = 'abandoned' AND 'abandoned' = ANY (%(states)s::text[]))
                      OR (u.status = 'cancelled' AND 'cancelled' = ANY (%(states)s::text[]))
                      OR (u.status IN ('failed', 'deferred')
                          AND %(states)s::text[] && ARRAY['failing', 'connecting', 'loading'])
                      OR (u.status = 'pending'
                          AND %(states)s::text[] && ARRAY['connecting', 'loading'])
                      -- a throttle holds back slices until a later time
                      OR (u.status IN ('pending', 'failed', 'deferred') AND u.next_run_at > now()
                          AND 'throttled' = ANY (%(states)s::text[])))
               UNION
               SELECT r.owner FROM {schema}.jobs r
               WHERE r.queue = %(queue)s AND r.status = 'running' AND r.mode = 'initial'
                 AND %(states)s::text[] && ARRAY['connecting', 'loading'])))
),
counted AS (
    SELECT owner, type,
           count(*) AS rows_total,
           count(*) FILTER (WHERE status = 'completed') AS slices_completed,
           count(*) FILTER (WHERE status IN ('pending', 'running')) AS open_rows,
           count(*) FILTER (WHERE status IN ('failed', 'deferred')) AS slices_retrying,
           count(*) FILTER (WHERE status = 'abandoned') AS slices_abandoned,
           -- nothing but a throttle leaves a pending job waiting (it pushes every open job of
           -- the lane to its own time)
           bool_or(status = 'pending' AND next_run_at > now()) AS pending_paused,
           coalesce(sum(processed_count), 0)::bigint AS records,
           max(window_end) FILTER (WHERE status = 'completed') AS coverage_end,
           min(window_start) AS history_start,
           max(window_end) FILTER (WHERE status <> 'completed') AS newest_gap_end,
           count(*) FILTER (WHERE status = 'completed' AND completed_at > now() - %(recent)s)
               AS recent_slices,
           min(started_at) FILTER (WHERE status = 'completed' AND completed_at > now() - %(recent)s)
               AS recent_since,
           max(completed_at) FILTER (WHERE status = 'completed') AS last_completed_at,
           -- the oldest slice was cancelled (the owner was): nothing more is planned for it
           min(window_start) FILTER (WHERE status = 'cancelled') = min(window_start) AS stopped
    FROM history
    GROUP BY owner, type
),
planned AS (
    -- the slices not planned yet wait like open ones, unless the history was stopped: then
    -- they count as cancelled, as the rows of a history planned before schema 6 do
    SELECT c.*, rows_total + n AS slices_total,
           open_rows + CASE WHEN stopped THEN 0 ELSE n END AS slices_open
    FROM counted c, {schema}.slices_to_plan(%(queue)s, owner, type, history_start) AS n
),
stated AS (
    SELECT c.*,
           slices_retrying + slices_abandoned AS slices_failed,
           slices_total - slices_completed - slices_open - slices_retrying - slices_abandoned
               AS slices_cancelled,
           slices_open + slices_retrying AS remaining,
           CASE WHEN slices_completed = slices_total THEN 'loaded'
                WHEN slices_abandoned > 0 THEN 'abandoned'
                WHEN r.failing THEN 'failing'
                WHEN slices_open + slices_retrying = 0 THEN 'cancelled'
                WHEN pending_paused OR r.throttled THEN 'throttled'
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
    FROM planned c
    -- a failed or deferred slice fails the owner, unless it failed with a throttle: read those
    -- few rows for their errors
    LEFT JOIN LATERAL (
        SELECT bool_or(f.status = 'deferred' OR coalesce(f.error, '') NOT LIKE 'Throttled%%')
                   AS failing,
               bool_or(f.next_run_at > now() AND f.error LIKE 'Throttled%%') AS throttled
        FROM {schema}.jobs f
        WHERE c.slices_retrying > 0
          AND f.queue = %(queue)s AND f.status IN ('failed', 'deferred')
          AND f.owner = c.owner AND f.type = c.type AND f.mode = 'initial'
    ) r ON true
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
ORDER BY owner, type
LIMIT %(limit)s;

-- name: open_jobs
-- how many jobs of these queues have not finished, and how many of those that stopped wait for a
-- human (abandoned: nothing runs them until a requeue); from the index of unfinished rows
SELECT count(*) FILTER (WHERE status <> 'abandoned') AS open,
       count(*) FILTER (WHERE status = 'abandoned') AS waiting
FROM {schema}.jobs
WHERE queue = ANY (%(queues)s::text[])
  AND status IN ('pending', 'running', 'failed', 'deferred', 'abandoned');

-- name: history_to_plan
-- how many history slices of these queues are not planned yet (slices_to_plan of each histories
-- row, back from its oldest slice; none for a history whose oldest slice was cancelled): what a
-- progress bar adds to the open jobs. One lookup per histories row, so the bar reads it seldom
-- on a large table (synclane.terminal.JobsBar)
SELECT coalesce(sum({schema}.slices_to_plan(h.queue, h.owner, h.type, o.window_start)), 0)::bigint
    AS slices
FROM {schema}.histories h
CROSS JOIN LATERAL (
    SELECT j.window_start, j.status FROM {schema}.jobs j
    WHERE j.queue = h.queue AND j.owner = h.owner AND j.type = h.type AND j.mode = 'initial'
      AND j.window_end IS NOT NULL
    ORDER BY j.window_end LIMIT 1
) AS o
WHERE h.queue = ANY (%(queues)s::text[]) AND o.status <> 'cancelled';

-- name: failures
-- open failures grouped by cause (the error's first line, numbers and ids masked), aggregated in
-- the database; reads only failed, deferred and abandoned rows, and one error per cause. A
-- cause's id is the start of its MD5: short enough to type, the same in every process and run
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
      -- written out only when a bound is given: an open bound is no condition for the planner
      -- to guess the selectivity of
      AND (%(since)s::timestamptz IS NULL AND %(since_ago)s::interval IS NULL
           OR coalesce(heartbeat_at, created_at)
              >= coalesce(%(since)s::timestamptz, now() - %(since_ago)s::interval))
      AND (%(until)s::timestamptz IS NULL AND %(until_ago)s::interval IS NULL
           OR coalesce(heartbeat_at, created_at)
              < coalesce(%(until)s::timestamptz, now() - %(until_ago)s::interval))
    GROUP BY 1, queue, type
)
SELECT c.cause, c.queue, c.type, c.jobs, c.failed, c.deferred, c.abandoned, c.owner_count,
       c.owners, c.statuses, c.first_seen, c.last_seen,
       CASE WHEN %(full_errors)s OR e.error IS NULL
                 OR (strpos(e.error, E'\n') = 0 AND length(e.error) <= %(error_width)s)
            THEN e.error
            ELSE left(split_part(e.error, E'\n', 1), %(error_width)s - 1) || '…' END AS example,
       c.job_ids, left(md5(c.cause), 8) AS cause_id
FROM causes c
JOIN {schema}.jobs e ON e.id = c.newest_id
ORDER BY c.jobs DESC, c.last_seen DESC, c.cause;

-- name: lanes
-- what each lane with open jobs is doing now: its running job (if any), who holds it and since
-- when, how many jobs wait and how many are due, and until when a throttle pauses it (the lane's
-- own pause, which also holds jobs that joined it since, or its jobs' throttle). Counts the
-- waiting jobs of each lane from the index of waiting rows alone (jobs_waiting), takes the running
-- ones from the running-lane index, and reads rows only for the errors of failed and deferred
-- jobs that wait for a later time (is it a throttle?)
WITH waiting AS (
    SELECT queue, lane,
           count(*) AS waiting,
           count(*) FILTER (WHERE status IN ('pending', 'failed') AND next_run_at <= now()) AS due,
           min(next_run_at) FILTER (WHERE status IN ('pending', 'failed')) AS next_due,
           count(*) FILTER (WHERE status IN ('failed', 'deferred') AND next_run_at > now())
               AS held
    FROM {schema}.jobs
    WHERE status IN ('pending', 'failed', 'deferred')
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(lane)s::text IS NULL OR lane = %(lane)s)
    GROUP BY queue, lane
),
running AS (
    SELECT id, queue, lane
    FROM {schema}.jobs
    WHERE status = 'running'
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(lane)s::text IS NULL OR lane = %(lane)s)
),
open AS (
    SELECT coalesce(w.queue, r.queue) AS queue, coalesce(w.lane, r.lane) AS lane,
           r.id AS running_id, coalesce(w.waiting, 0) AS waiting, coalesce(w.due, 0) AS due,
           w.next_due, coalesce(w.held, 0) AS held
    FROM waiting w
    FULL JOIN running r ON r.queue = w.queue AND r.lane = w.lane
)
SELECT o.queue, o.lane,
       r.id AS job_id, r.owner, r.type, r.mode, r.window_start, r.window_end, r.cursor,
       r.processed_count, r.attempt_count, r.leased_by, r.started_at AS since,
       now() - r.started_at AS running_for, r.lease_expires_at,
       o.waiting, o.due, o.next_due,
       CASE WHEN p.paused_until > now() THEN greatest(p.paused_until, t.paused_until)
            ELSE t.paused_until END AS paused_until
FROM open o
LEFT JOIN {schema}.jobs r ON r.id = o.running_id
LEFT JOIN {schema}.lanes p ON p.queue = o.queue AND p.lane = o.lane
LEFT JOIN LATERAL (
    SELECT max(f.next_run_at) AS paused_until
    FROM {schema}.jobs f
    WHERE o.held > 0
      AND f.queue = o.queue AND f.lane = o.lane AND f.status IN ('failed', 'deferred')
      AND f.next_run_at > now() AND f.error LIKE 'Throttled%%'
) t ON true
ORDER BY o.queue, o.lane;

-- name: depth
-- open jobs counted by queue, lane and status in the database: the waiting ones (pending, failed,
-- deferred) from the index of waiting rows alone (jobs_waiting), the running ones from the
-- running-lane index; grouped by owner first, which counts the owners without a sort
WITH by_owner AS (
    SELECT queue, lane, status, owner,
           count(*) AS jobs,
           count(*) FILTER (WHERE status IN ('pending', 'failed') AND next_run_at <= now()) AS due,
           min(created_at) AS oldest,
           min(next_run_at) AS next_run_at
    FROM {schema}.jobs
    WHERE status IN ('pending', 'failed', 'deferred')
      AND (%(statuses)s::text[] IS NULL OR status = ANY (%(statuses)s::text[]))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(owner)s::text IS NULL OR owner = %(owner)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
    GROUP BY queue, lane, status, owner
    UNION ALL
    SELECT queue, lane, status, owner, count(*), 0, min(created_at), NULL
    FROM {schema}.jobs
    WHERE status = 'running'
      AND (%(statuses)s::text[] IS NULL OR 'running' = ANY (%(statuses)s::text[]))
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
-- status starts a new one. A span is clipped to the range asked for, so that it is the same
-- whether its windows are rows of their own or were merged into one by a prune; its records are
-- those of the jobs behind it, each counted whole
WITH asked AS (
    SELECT coalesce(%(since)s::timestamptz, now() - %(since_ago)s::interval, '-infinity')
               AS since,
           coalesce(%(until)s::timestamptz, now() - %(until_ago)s::interval, 'infinity')
               AS until
),
windows AS (
    SELECT owner, type, status, window_start, window_end, processed_count, id,
           lag(status) OVER w AS previous_status,
           max(window_end) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached
    FROM {schema}.jobs, asked
    WHERE queue = %(queue)s AND window_start IS NOT NULL AND window_end IS NOT NULL
      AND (%(owner)s::text IS NULL OR owner = %(owner)s)
      AND (%(type)s::text IS NULL OR type = %(type)s)
      AND (%(statuses)s::text[] IS NULL OR status = ANY (%(statuses)s::text[]))
      AND window_end > asked.since AND window_start < asked.until
    WINDOW w AS (PARTITION BY owner, type ORDER BY window_start, window_end, id)
),
numbered AS (
    SELECT *,
           count(*) FILTER (WHERE previous_status IS DISTINCT FROM status
                              OR reached < window_start)
               OVER (PARTITION BY owner, type ORDER BY window_start, window_end, id) AS span
    FROM windows
),
spans AS (
    SELECT owner, type, status, greatest(min(window_start), (SELECT since FROM asked)) AS s,
           least(max(window_end), (SELECT until FROM asked)) AS e,
           count(*) AS jobs, sum(processed_count)::bigint AS records
    FROM numbered
    GROUP BY owner, type, span, status
)
SELECT owner, type, status, s AS window_start, e AS window_end, e - s AS duration, jobs, records
FROM spans
ORDER BY owner, type, s;

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
