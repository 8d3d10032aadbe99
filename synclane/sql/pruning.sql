-- Retention: deleting finished rows that no read needs any more (app.prune, a queue's
-- `retention`). synclane/pruning.py runs them; docs/operations.md says what is kept and why.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

-- name: prune_groups
-- the next owners and types of a queue after (owner, type), one descent of jobs_dedup_key each
-- (a loose index scan): a prune visits every owner and type once, whatever their history
WITH RECURSIVE groups AS (
    (SELECT owner, type FROM {schema}.jobs
     WHERE queue = %(queue)s AND (owner, type) > (%(owner)s::text, %(type)s::text)
     ORDER BY owner, type
     LIMIT 1)
    UNION ALL
    SELECT n.owner, n.type
    FROM groups g, LATERAL (
        SELECT j.owner, j.type FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND (j.owner, j.type) > (g.owner, g.type)
        ORDER BY j.owner, j.type
        LIMIT 1
    ) n
)
SELECT owner, type FROM groups LIMIT %(limit)s;

-- name: prune_owners
-- deletes, for these owners and types, the finished (completed, cancelled) recurring and manual
-- rows older than the limit that nothing reads, in one short statement. It never touches an open
-- row, one waiting for a human, an initial slice, a row whose lease may still be in use, a row
-- locked by anyone (SKIP LOCKED: it waits for no one), the row that ends coverage (the planner
-- starts the next refresh there), the newest row without a window (a snapshot's next refresh is
-- timed from it), or a refresh of the type's current period (a second planner in this period would
-- propose its key again); an owner and type of which it cannot hold every such row waits for a
-- later prune. Answers the ids it deleted (synclane.pruning settles a lost commit with them). Windows stay whole: a run of such rows that follow each other without a
-- gap and share a status becomes its newest row, widened to the run's span and carrying its
-- records, so coverage() shows the same spans and no window turns into a gap
WITH target AS (
    SELECT DISTINCT t.owner, t.type, g.prefix
    FROM unnest(%(owners)s::text[], %(types)s::text[]) AS t (owner, type)
    LEFT JOIN unnest(%(guard_types)s::text[], %(guard_prefixes)s::text[]) AS g (type, prefix)
        ON g.type = t.type
),
all_rows AS MATERIALIZED (
    SELECT j.id, j.owner, j.type, j.status, j.window_start, j.window_end, j.created_at,
           j.processed_count,
           j.mode IN ('recurring', 'manual')
               AND j.status IN ('completed', 'cancelled')
               AND j.lease_token IS NULL
               AND j.created_at < now() - %(older_than)s::interval
               AND coalesce(j.completed_at, j.created_at) < now() - %(older_than)s::interval
               AND (t.prefix IS NULL OR left(j.dedup_key, length(t.prefix)) <> t.prefix)
               AS old_enough
    FROM {schema}.jobs j
    JOIN target t ON j.owner = t.owner AND j.type = t.type
    WHERE j.queue = %(queue)s
),
held AS (
    -- the rows to prune, locked; the test is made again on each row as it is locked, and a row
    -- someone else holds is skipped, not waited for
    SELECT j.id, j.owner, j.type FROM {schema}.jobs j
    WHERE j.id IN (SELECT id FROM all_rows WHERE old_enough)
      AND j.mode IN ('recurring', 'manual')
      AND j.status IN ('completed', 'cancelled')
      AND j.lease_token IS NULL
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
),
settled AS MATERIALIZED (
    -- the owners and types whose every row to prune is held; the others wait for a later prune
    SELECT a.owner, a.type
    FROM (SELECT owner, type, count(*) AS n FROM all_rows WHERE old_enough GROUP BY 1, 2) a
    JOIN (SELECT owner, type, count(*) AS n FROM held GROUP BY 1, 2) h
        ON h.owner = a.owner AND h.type = a.type AND h.n = a.n
),
rows AS (
    SELECT r.*, r.old_enough AND s.owner IS NOT NULL AS prunable
    FROM all_rows r
    LEFT JOIN settled s ON s.owner = r.owner AND s.type = r.type
),
windowed AS (
    SELECT r.*,
           r.prunable AND r.window_start IS NOT NULL
               AND r.window_end < max(r.window_end) OVER (PARTITION BY r.owner, r.type)
               AS mergeable
    FROM rows r
    WHERE r.window_end IS NOT NULL
),
ordered AS (
    -- in coverage() order: a run continues while the rows are mergeable, share a status and
    -- leave no gap (the same test coverage() uses to join windows into one span)
    SELECT w.*,
           coalesce(lag(w.mergeable) OVER s, false) AS after_mergeable,
           lag(w.status) OVER s AS previous_status,
           max(w.window_end) OVER (s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached
    FROM windowed w
    WINDOW s AS (PARTITION BY w.owner, w.type ORDER BY w.window_start, w.window_end, w.id)
),
runs AS (
    SELECT o.*,
           count(*) FILTER (WHERE NOT (o.mergeable AND o.after_mergeable
                                       AND o.previous_status = o.status
                                       AND o.reached >= o.window_start))
               OVER (PARTITION BY o.owner, o.type
                     ORDER BY o.window_start, o.window_end, o.id) AS run
    FROM ordered o
),
merged AS (
    -- each run's span, records and newest row, beside every row of the run
    SELECT r.id, r.mergeable,
           count(*) OVER run AS run_size,
           max(r.id) OVER run AS keep,
           min(r.window_start) OVER run AS span_start,
           max(r.window_end) OVER run AS span_end,
           sum(r.processed_count) OVER run AS records
    FROM runs r
    WINDOW run AS (PARTITION BY r.owner, r.type, r.run)
),
grown AS (
    UPDATE {schema}.jobs j
    SET window_start = m.span_start, window_end = m.span_end, processed_count = m.records
    FROM merged m
    WHERE j.id = m.id AND m.mergeable AND m.run_size > 1 AND m.id = m.keep
    RETURNING j.id
),
merged_away AS (
    DELETE FROM {schema}.jobs j
    USING merged m
    WHERE j.id = m.id AND m.mergeable AND m.run_size > 1 AND m.id <> m.keep
    RETURNING j.id
),
unwindowed AS (
    SELECT r.id, r.prunable,
           row_number() OVER (PARTITION BY r.owner, r.type ORDER BY r.created_at DESC, r.id DESC)
               AS newest
    FROM rows r
    WHERE r.window_end IS NULL
),
dropped AS (
    DELETE FROM {schema}.jobs j
    USING unwindowed u
    WHERE j.id = u.id AND u.prunable AND u.newest > 1
    RETURNING j.id
)
SELECT ARRAY(SELECT id FROM merged_away) || ARRAY(SELECT id FROM dropped) AS deleted,
       (SELECT count(*) FROM grown) AS widened;

-- name: rows_left
-- how many of these rows still exist: after a prune's commit went unanswered, none means it
-- committed (the prune held them locked; nothing brings a deleted row back)
SELECT count(*) FROM {schema}.jobs WHERE id = ANY (%(ids)s::bigint[]);
