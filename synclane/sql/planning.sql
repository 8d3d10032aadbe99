-- The planner's statements: what exists, what is missing, who the owners are, and where the
-- planning of each queue has come. synclane/batches.py, rounds.py and owners.py run them;
-- docs/planning.md explains them.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

-- name: plan_read
-- what exists per owner and type, each answer one index lookup, so history never slows it down;
-- with the lane the owners table plans the owner into (NULL for an owner it does not know) and
-- the histories row of a windowed type (NULL columns: none)
SELECT
    o.owner,
    t.type,
    now() AS now,
    r.lane,
    oldest.window_start AS oldest_initial_start,
    oldest.status AS oldest_initial_status,
    CASE WHEN oldest.window_start IS NOT NULL THEN (
        SELECT count(*) FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type AND j.mode = 'initial'
          AND j.status IN ('pending', 'running', 'failed')
    ) ELSE 0 END AS open_initial,
    h.history_from,
    h.slice AS history_slice,
    h.ahead AS history_ahead,
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
    -- counts, not EXISTS: PostgreSQL may answer an EXISTS for a whole batch by hashing every
    -- open job of the queue; and not LIMIT 1, which it may answer by walking the line of every
    -- pending job until one of the owner's comes (an owner has a few open jobs to count)
    t.windowed AND (
        SELECT count(*) FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
          AND j.mode = 'recurring' AND j.status IN ('pending', 'running', 'failed')
    ) > 0 AS open_recurring,
    NOT t.windowed AND (
        SELECT count(*) FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
          AND j.status IN ('pending', 'running', 'failed')
    ) > 0 AS open_any
FROM unnest(%(owners)s::text[]) AS o (owner)
LEFT JOIN LATERAL (
    SELECT r.lane FROM {schema}.owners r WHERE r.queue = %(queue)s AND r.owner = o.owner LIMIT 1
) AS r ON true
CROSS JOIN unnest(%(types)s::text[], %(windowed)s::boolean[]) AS t (type, windowed)
LEFT JOIN LATERAL (
    SELECT j.window_start, j.status FROM {schema}.jobs j
    WHERE t.windowed AND j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
      AND j.mode = 'initial' AND j.window_end IS NOT NULL
    ORDER BY j.window_end LIMIT 1
) AS oldest ON true
LEFT JOIN LATERAL (
    SELECT h.history_from, h.slice, h.ahead FROM {schema}.histories h
    WHERE t.windowed AND h.queue = %(queue)s AND h.owner = o.owner AND h.type = t.type LIMIT 1
) AS h ON true;

-- name: unsettled_owners
-- the owners of a batch that explicit planning must read (`plan`): those the owners table does
-- not know, knows in another lane or has not planned, and those with a type whose rows fail the
-- test of synclane.planning.settled (history neither back to its limit, nor cancelled, nor
-- recorded as the type says with `ahead` slices open; coverage neither current nor this period's
-- refresh, and no refresh open; a snapshot neither taken this period nor open). An owner marked
-- settled (owners.settled_*: until a time not yet come, by these settings, in the plan epoch that
-- is current, and, for a mark that counts on an open refresh, while each windowed type's newest
-- window is still an open refresh or this period's) is not tested: its mark is its lookup. With %(mark)s the statement
-- also names the owners to mark (not `plan`), with the epoch read in this statement's snapshot,
-- the one their rows were read in: those settled by every type for a reason that lasts until
-- `until` (the end of the period, or midnight: this period's refresh or snapshot), or that lasts
-- as long as a refresh stays open (`open`).
-- Each fact is one index lookup, taken only when the ones before did not decide; the rows
-- themselves are the truth, so a job a user deleted or changed is seen at once (the statement
-- moves the epoch on, which ends every mark). The others are settled: nothing is missing for
-- them, and nothing of theirs leaves the database. (The names go in binary: a fifth of the
-- client's work of the text form.)
SELECT owner, plan, epoch, until, open
FROM (
    SELECT
        o.owner,
        known.admit OR (NOT known.marked AND settled.code = 0) AS plan,
        NOT known.admit AND NOT known.marked AND settled.code >= 2 AS settled,
        settled.until,
        settled.open,
        e.epoch
    FROM unnest(%(owners)b::text[], %(lanes)b::text[]) AS o (owner, lane)
    CROSS JOIN (SELECT (SELECT p.epoch FROM {schema}.plan_epoch p) AS epoch) AS e
    -- each owner's row of the owners table, looked up by primary key (LIMIT keeps PostgreSQL
    -- from turning the lookup into a join): a join, or a filter by the batch's names, was
    -- planned as a read of every owner of the queue for each batch, a cost that grew with the
    -- square of the fleet
    LEFT JOIN LATERAL (
        SELECT * FROM {schema}.owners r
        WHERE r.queue = %(queue)s AND r.owner = o.owner
        LIMIT 1
    ) AS r ON true
    CROSS JOIN LATERAL (
        SELECT
            -- to be registered (and planned) anyway
            coalesce(r.lane IS DISTINCT FROM o.lane OR NOT r.planned, true) AS admit,
            -- marked: settled, nothing read but, for a mark that counts on open refreshes,
            -- whether each windowed type still has one open (or this period's)
            coalesce(
                r.settled_until > now() AND r.settled_epoch = e.epoch
                AND r.settled_by = %(settled_by)s
                AND (NOT r.settled_open OR NOT EXISTS (
                    SELECT FROM unnest(%(types)s::text[], %(windowed)s::boolean[],
                                       %(period_from)s::timestamptz[]) AS w (type, windowed, period_from)
                    -- the newest window is a refresh still open, or this period's (one lookup in
                    -- jobs_owner_window, whose choice no estimate of open rows can change)
                    WHERE w.windowed AND NOT coalesce((
                        SELECT j.mode = 'recurring' AND (
                            j.window_end >= w.period_from
                            OR j.status IN ('pending', 'running', 'failed'))
                        FROM {schema}.jobs j
                        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = w.type
                          AND j.window_end IS NOT NULL
                        ORDER BY j.window_end DESC LIMIT 1
                    ), false)
                )),
                false
            ) AS marked
        OFFSET 0  -- computed once an owner, not once for each place that reads it
    ) AS known
    CROSS JOIN LATERAL (
        -- per type: 0 something may be missing; 1 settled, but by coverage ahead of now or a
        -- snapshot job merely open (not marked); 2 settled while its refresh stays open; 3
        -- settled until its period ends. A mark ends with the first period of the owner's types
        -- to end, or at midnight
        SELECT coalesce(min(c.code), 3) AS code,
               least(%(midnight)s, min(c.period_to)) AS until,
               coalesce(bool_or(c.code = 2), false) AS open
        FROM (
            SELECT t.period_to, CASE
                WHEN t.windowed THEN CASE
                    WHEN NOT coalesce((
                        SELECT CASE
                            -- back to its limit (least() passes over a missing row's NULL)
                            WHEN x.window_start <= least(h.history_from, t.history_from)
                                THEN true
                            -- no row yet, or a wider horizon to record
                            WHEN h.history_from IS NULL OR t.history_from < h.history_from
                                THEN false
                            WHEN x.status = 'cancelled' THEN true
                            WHEN h.slice <> t.slice OR h.ahead <> t.ahead THEN false
                            ELSE (
                                SELECT count(*) FROM (
                                    SELECT FROM {schema}.jobs j
                                    WHERE j.queue = %(queue)s AND j.owner = o.owner
                                      AND j.type = t.type AND j.mode = 'initial'
                                      AND j.status IN ('pending', 'running', 'failed')
                                    LIMIT t.ahead
                                ) AS open
                            ) >= t.ahead
                        END
                        FROM (
                            SELECT j.window_start, j.status FROM {schema}.jobs j
                            WHERE j.queue = %(queue)s AND j.owner = o.owner
                              AND j.type = t.type AND j.mode = 'initial'
                              AND j.window_end IS NOT NULL
                            ORDER BY j.window_end LIMIT 1
                        ) AS x
                        LEFT JOIN {schema}.histories h
                            ON h.queue = %(queue)s AND h.owner = o.owner AND h.type = t.type
                    ), false) THEN 0
                    ELSE coalesce((
                        SELECT CASE
                            WHEN j.mode = 'recurring' AND j.window_end >= t.period_from THEN 3
                            -- the newest window, a refresh still open: what a mark checks
                            WHEN j.mode = 'recurring'
                                 AND j.status IN ('pending', 'running', 'failed') THEN 2
                            WHEN j.window_end >= t.covered_to THEN 1
                        END
                        FROM {schema}.jobs j
                        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
                          AND j.window_end IS NOT NULL
                        ORDER BY j.window_end DESC LIMIT 1
                    ), (
                        SELECT 1 FROM {schema}.jobs j
                        WHERE j.queue = %(queue)s AND j.owner = o.owner AND j.type = t.type
                          AND j.mode = 'recurring'
                          AND j.status IN ('pending', 'running', 'failed')
                        LIMIT 1
                    ), 0)
                END
                ELSE coalesce((
                    SELECT CASE
                        WHEN s.last >= t.period_from AND s.last < t.period_to THEN 3
                        ELSE coalesce((
                            SELECT 1 FROM {schema}.jobs j
                            WHERE j.queue = %(queue)s AND j.owner = o.owner
                              AND j.type = t.type
                              AND j.status IN ('pending', 'running', 'failed')
                            LIMIT 1
                        ), 0)
                    END
                    FROM (
                        SELECT greatest(i.created_at, (
                            SELECT max(j.created_at) FROM {schema}.jobs j
                            WHERE j.queue = %(queue)s AND j.owner = o.owner
                              AND j.type = t.type AND j.window_end IS NULL
                        )) AS last
                        FROM {schema}.jobs i
                        WHERE i.queue = %(queue)s AND i.owner = o.owner AND i.type = t.type
                          AND i.dedup_key = 'initial'
                    ) AS s
                ), 0)
            END AS code
            FROM unnest(
                %(types)s::text[], %(windowed)s::boolean[], %(history_from)s::timestamptz[],
                %(period_from)s::timestamptz[], %(period_to)s::timestamptz[],
                %(covered_to)s::timestamptz[], %(slices)s::interval[], %(aheads)s::integer[]
            ) AS t (
                type, windowed, history_from, period_from, period_to, covered_to, slice, ahead
            )
            -- read nothing for an owner to be registered, or marked
            WHERE NOT known.admit AND NOT known.marked
            OFFSET 0  -- each type's code computed once, not once for each aggregate that reads it
        ) AS c
    ) AS settled
) AS batch
WHERE plan OR (%(mark)s AND settled AND epoch IS NOT NULL);

-- name: mark_settled
-- these owners' rows lacked nothing when the comparison read them in plan epoch `epoch`: the
-- comparison skips them until `until` (the end of the period of their types, or midnight),
-- while the epoch and the settings (`settled_by`) stay as they were, and (`open`) while their
-- windowed types' refreshes stay open. Each row is looked up by
-- primary key (a filter by the batch's names was planned as a read of every owner of the queue)
-- and updated where it was locked; a row another statement holds is left as it is (a mark only
-- spares work), so this statement waits for no one
UPDATE {schema}.owners r
SET settled_until = c.until, settled_open = c.open, settled_epoch = %(epoch)s,
    settled_by = %(settled_by)s
FROM (
    SELECT k.ctid, m.until, m.open
    FROM unnest(%(owners)s::text[], %(untils)s::timestamptz[], %(opens)s::boolean[])
         AS m (owner, until, open)
    CROSS JOIN LATERAL (
        SELECT r.ctid FROM {schema}.owners r
        WHERE r.queue = %(queue)s AND r.owner = m.owner
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AS k
) AS c
WHERE r.ctid = c.ctid;

-- name: without_jit
-- the rest of this transaction compiles no statement to machine code: the comparison's plan is
-- large, and JIT compiled it again at every execution (35 ms to a second a batch) to run it for a
-- few dozen milliseconds
SELECT set_config('jit', 'off', true);

-- name: database_now
-- the database clock, the one clock every process shares
SELECT now() AS now;

-- name: insert_jobs
-- adds planned jobs: each owner gets the jobs of its shape (owners whose plans differ only in
-- owner and lane, such as every first plan of a batch, share one shape, so the statement carries
-- a few dozen jobs and the database multiplies them out). Rows go in in one order (owner, type,
-- dedup key), so that two planners never lock keys in opposite orders; the dedup index turns a
-- job another planner already added into a no-op. A job that joins a paused lane (a throttle)
-- waits for the pause like the lane's other jobs
INSERT INTO {schema}.jobs
    (queue, owner, lane, type, mode, priority, window_start, window_end, dedup_key, next_run_at)
SELECT %(queue)s::text, o.owner, o.lane, s.type, s.mode, s.priority, s.start, s.end_, s.key,
       greatest(now(), l.paused_until)
FROM unnest(%(owners)s::text[], %(lanes)s::text[], %(owner_shapes)s::integer[])
     AS o (owner, lane, shape)
JOIN unnest(
    %(shapes)s::integer[], %(types)s::text[], %(modes)s::text[], %(priorities)s::integer[],
    %(starts)s::timestamptz[], %(ends)s::timestamptz[], %(keys)s::text[]
) AS s (shape, type, mode, priority, start, end_, key) ON s.shape = o.shape
LEFT JOIN {schema}.lanes l ON l.queue = %(queue)s AND l.lane = o.lane
ORDER BY o.owner, s.type, s.key
ON CONFLICT (queue, owner, type, dedup_key) DO NOTHING;

-- name: record_histories
-- how far back these owners' histories go, their slice and how many open slices to keep
-- planned (the rows the database plans each next older slice under, plan_older_slices), written
-- in the planner's transaction before its insert; a history is never shortened (the older
-- history_from stays). Rows are written in one order, so two planners never wait in a circle
INSERT INTO {schema}.histories AS h (queue, owner, type, history_from, slice, ahead)
SELECT %(queue)s, r.owner, r.type, r.history_from, r.slice, r.ahead
FROM unnest(
    %(owners)s::text[], %(types)s::text[], %(froms)s::timestamptz[], %(slices)s::interval[],
    %(aheads)s::integer[]
) AS r (owner, type, history_from, slice, ahead)
ORDER BY r.owner, r.type
ON CONFLICT (queue, owner, type) DO UPDATE
SET history_from = least(h.history_from, excluded.history_from), slice = excluded.slice,
    ahead = excluded.ahead;

-- name: known_owners
-- what the owners table knows of these owners: the lane their jobs are planned into and whether
-- they had their first plan (one primary-key lookup each; it writes nothing)
SELECT owner, lane, planned FROM {schema}.owners
WHERE queue = %(queue)s AND owner = ANY (%(owners)s::text[]);

-- name: admit_owners
-- registers these owners in the lanes given, and moves their open jobs with them in the same
-- statement: a known owner's jobs in its old lane (and one whose page may still be in flight
-- under a live lease), a new owner's planned jobs in any other lane (a manual job enqueued into
-- a lane of its own stays there). The running job moves with the others, so the running-lane
-- index decides: when the new lane runs a job already, the statement fails with a unique
-- violation and none of it happens. A job that joins a paused lane waits for the pause; the lanes
-- the jobs join and leave get wakes from the database (lane_wakes). Jobs are locked in id order and owners written in owner order, so two planners never wait in a circle
WITH target AS (
    SELECT t.owner, t.lane, o.lane AS old
    FROM unnest(%(owners)s::text[], %(lanes)s::text[]) AS t (owner, lane)
    LEFT JOIN LATERAL (
        SELECT o.lane FROM {schema}.owners o WHERE o.queue = %(queue)s AND o.owner = t.owner
        LIMIT 1
    ) AS o ON true
),
chosen AS (
    -- each owner's jobs looked up by its key (OFFSET 0 keeps the lookups per owner: joined to
    -- the batch as a table, the open jobs of the whole queue were read and hashed per batch)
    SELECT j.id, t.lane FROM target t
    CROSS JOIN LATERAL (
        SELECT j.id FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.owner = t.owner
          AND j.status IN ('pending', 'running', 'failed', 'deferred') AND j.lane <> t.lane
          AND (j.lane = t.old OR (t.old IS NULL AND j.mode <> 'manual'))
        OFFSET 0
    ) AS j
    UNION
    SELECT j.id, t.lane FROM target t
    CROSS JOIN LATERAL (
        SELECT j.id FROM {schema}.jobs j
        WHERE j.queue = %(queue)s AND j.lane = t.old AND j.owner = t.owner
          AND j.status <> 'running' AND j.lease_token IS NOT NULL
        OFFSET 0
    ) AS j
    WHERE t.old <> t.lane
),
locked AS (
    -- in id order, each by its key
    SELECT r.id, c.lane
    FROM (SELECT id, lane FROM chosen ORDER BY id) AS c
    CROSS JOIN LATERAL (SELECT j.id FROM {schema}.jobs j WHERE j.id = c.id FOR UPDATE) AS r
),
moved AS (
    UPDATE {schema}.jobs j
    SET lane = k.lane,
        next_run_at = CASE WHEN j.status IN ('pending', 'failed', 'deferred')
                           THEN greatest(j.next_run_at, p.paused_until) ELSE j.next_run_at END
    FROM locked k
    LEFT JOIN LATERAL (
        SELECT p.paused_until FROM {schema}.lanes p
        WHERE p.queue = %(queue)s AND p.lane = k.lane LIMIT 1
    ) AS p ON true
    -- the batch's owners bound the read: joined by id alone, the whole jobs table was a candidate
    WHERE j.id = k.id AND j.queue = %(queue)s AND j.owner = ANY (%(owners)s::text[])
    RETURNING j.id, j.lane, j.status, j.next_run_at
),
registered AS (
    INSERT INTO {schema}.owners (queue, owner, lane)
    SELECT %(queue)s, owner, lane FROM target ORDER BY owner
    ON CONFLICT (queue, owner) DO UPDATE SET lane = excluded.lane
    RETURNING owner
)
SELECT (SELECT count(*) FROM moved) AS moved, (SELECT count(*) FROM registered) AS registered;

-- name: admit_owner_where_it_runs
-- a new owner whose jobs could not move yet (its new lane is busy) is registered in the lane its
-- running job holds, so that nothing new is planned beside it; the next reconciliation moves it
INSERT INTO {schema}.owners (queue, owner, lane)
SELECT %(queue)s, %(owner)s, lane FROM {schema}.jobs
WHERE queue = %(queue)s AND owner = %(owner)s AND status = 'running'
LIMIT 1
ON CONFLICT (queue, owner) DO NOTHING;

-- name: mark_planned
-- these owners had their first plan: the round no longer looks for them. Rows are locked in
-- owner order, so two planners never wait on each other in a circle. Each row is looked up by
-- primary key and updated where it was locked (joined to the batch by name, the update read the
-- queue's whole owners table)
UPDATE {schema}.owners o SET planned = true
FROM (
    SELECT k.ctid
    FROM (SELECT DISTINCT b.owner FROM unnest(%(owners)s::text[]) AS b (owner) ORDER BY b.owner)
         AS m
    CROSS JOIN LATERAL (
        SELECT r.ctid FROM {schema}.owners r
        WHERE r.queue = %(queue)s AND r.owner = m.owner AND NOT r.planned
        LIMIT 1
        FOR UPDATE
    ) AS k
) AS c
WHERE o.ctid = c.ctid;

-- name: unplanned_owners
-- owners that have not had their first plan yet, from the partial index of them
SELECT owner, lane FROM {schema}.owners
WHERE queue = %(queue)s AND NOT planned
ORDER BY owner
LIMIT %(limit)s;

-- name: owners_after
-- the next owners of a pass over a queue's owners, in primary-key order after the last one seen
SELECT owner, lane FROM {schema}.owners
WHERE queue = %(queue)s AND owner > %(after)s
ORDER BY owner
LIMIT %(limit)s;

-- name: owner_lane_known
-- the lane the owners table plans an owner into (no row: an owner it does not know)
SELECT lane FROM {schema}.owners WHERE queue = %(queue)s AND owner = %(owner)s;

-- name: take_planning_lease
-- one planning round per queue at a time, across every process: the round holds a lease on the
-- queue's planner row (its token and an end, like a job's lease), renewed while it works, and
-- another round does not wait for it (no row: someone else plans this queue now, skip the
-- round). A lease its round stopped renewing (a planner frozen or dead) ends, and the next round
-- takes it
INSERT INTO {schema}.planner AS p (queue, planning_token, planning_until)
VALUES (%(queue)s, %(token)s, now() + %(lease)s)
ON CONFLICT (queue) DO UPDATE
SET planning_token = excluded.planning_token, planning_until = excluded.planning_until
WHERE p.planning_token IS NULL OR p.planning_until <= now()
RETURNING p.planning_until;

-- name: renew_planning_lease
-- the round goes on to its next batch: its lease is renewed while the row still carries its
-- token (also once it ended, if no other round started since); no row: another round started
-- (this planner was stopped for longer than its lease), and this one ends
UPDATE {schema}.planner SET planning_until = now() + %(lease)s
WHERE queue = %(queue)s AND planning_token = %(token)s
RETURNING planning_until;

-- name: release_planning_lease
-- the round is over: the next one may start at once, in any process
UPDATE {schema}.planner SET planning_token = NULL, planning_until = NULL
WHERE queue = %(queue)s AND planning_token = %(token)s;

-- name: planner_clock
-- the database clock, and when this queue's owners were last reconciled and it was last pruned
SELECT now() AS now, p.owners_reconciled_at, p.pruned_at
FROM (SELECT) AS one
LEFT JOIN {schema}.planner p ON p.queue = %(queue)s;

-- name: owners_reconciled
-- the owner source was read to its end and the owners table now says what it said
INSERT INTO {schema}.planner (queue, owners_reconciled_at) VALUES (%(queue)s, now())
ON CONFLICT (queue) DO UPDATE SET owners_reconciled_at = excluded.owners_reconciled_at;

-- name: queue_pruned
-- the queue was pruned (its retention setting) at this instant
INSERT INTO {schema}.planner (queue, pruned_at) VALUES (%(queue)s, now())
ON CONFLICT (queue) DO UPDATE SET pruned_at = excluded.pruned_at;

-- name: planned_types
-- per type of the queue: the period and horizon every owner was planned for, and the pass under
-- way (one row per type)
SELECT type, period, horizon, pass_period, pass_horizon, pass_after
FROM {schema}.planned_types WHERE queue = %(queue)s;

-- name: pass_progress
-- a pass over the owners has planned every owner up to pass_after (in the transaction that
-- inserted their jobs, so a pass cut short continues after the last owner it committed)
INSERT INTO {schema}.planned_types (queue, type, pass_period, pass_horizon, pass_after)
VALUES (%(queue)s, %(type)s, %(period)s, %(horizon)s, %(after)s)
ON CONFLICT (queue, type) DO UPDATE
SET pass_period = excluded.pass_period, pass_horizon = excluded.pass_horizon,
    pass_after = excluded.pass_after;

-- name: pass_done
-- every owner was planned for this period with this horizon; the widest horizon is kept, so a
-- narrower one (an older version of the app still running) never starts a pass
INSERT INTO {schema}.planned_types (queue, type, period, horizon)
VALUES (%(queue)s, %(type)s, %(period)s, %(horizon)s)
ON CONFLICT (queue, type) DO UPDATE
SET period = excluded.period,
    horizon = CASE WHEN planned_types.horizon IS NULL OR excluded.horizon > planned_types.horizon
                   THEN excluded.horizon ELSE planned_types.horizon END,
    pass_period = NULL, pass_horizon = NULL, pass_after = NULL;

-- name: sweep_owners
-- after the source was read to its end: owners it no longer names (%(gone)s, of one page of the
-- owners table that the planner read in key order, owners_after) leave the owners table, so
-- nothing more is planned for them; their jobs stay as they are (cancelling is the user's call).
-- Page by page, so that no statement carries the whole fleet's names
DELETE FROM {schema}.owners
WHERE queue = %(queue)s AND owner = ANY (%(gone)s::text[])
RETURNING owner;
