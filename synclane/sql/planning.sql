-- The planner's statements: one read of what exists, one insert of what is missing.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

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
-- adds planned jobs, in the order given (planners sort them, so that two never lock keys in
-- opposite orders); the dedup index turns a job another planner already added into a no-op. A
-- job that joins a paused lane (a throttle) waits for the pause like the lane's other jobs
INSERT INTO {schema}.jobs
    (queue, owner, lane, type, mode, priority, window_start, window_end, dedup_key, next_run_at)
SELECT %(queue)s::text, n.owner, n.lane, n.type, n.mode, n.priority, n.start, n.end_, n.key,
       greatest(now(), l.paused_until)
FROM unnest(
    %(owners)s::text[], %(lanes)s::text[], %(types)s::text[], %(modes)s::text[],
    %(priorities)s::integer[], %(starts)s::timestamptz[], %(ends)s::timestamptz[],
    %(keys)s::text[]
) WITH ORDINALITY AS n (owner, lane, type, mode, priority, start, end_, key, number)
LEFT JOIN {schema}.lanes l ON l.queue = %(queue)s AND l.lane = n.lane
ORDER BY n.number
ON CONFLICT (queue, owner, type, dedup_key) DO NOTHING;
