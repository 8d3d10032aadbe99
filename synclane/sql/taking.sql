-- The worker's statements: take a job, save its pages under the lease, finish it, reclaim
-- expired leases. Every write about a running job is guarded by id + lease token + status.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

-- name: take_front
-- serves the slots of one worker that ask at the same instant, in one statement and one commit:
-- first completes each job in %(done_ids)s under its lease guard (its slot has just finished it),
-- then takes one job for each completion that went through and for each of %(plain)s slots that
-- asked with nothing to complete: the best due jobs of distinct free lanes, from the front of the
-- line, none while the queue is paused, marked running under lease tokens made from the one the
-- worker sent (so that it can find them after a lost answer). For a queue with lanes one wide and
-- no cap (take_front_slotted numbers the slots of the others: the executor starts every node of a
-- plan at every execution, and the numbering is a third of them).
-- Reads the jobs and the lanes' pauses as they are, writes nothing but jobs: no hint, no second
-- table, so a caller's open transaction holds nothing it needs. Two takers of one lane may both
-- pass this query; the running-lane index lets only one of them commit: the other gets a unique
-- violation, its completions roll back with it, and it asks again. One row always comes back;
-- every row carries the ids completed, and a taken job's columns (NULL when none). A lease runs
-- from when it is granted (clock_timestamp()), not from the start of a statement that waited for
-- a row lock.
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
room AS (
    -- how many jobs to take: one per slot served, none while the queue is paused
    SELECT CASE WHEN EXISTS (SELECT FROM {schema}.queue_pauses WHERE queue = %(queue)s) THEN 0
                ELSE %(plain)s::int + (SELECT count(*) FROM done) END AS slots
),
front AS (
    -- the best due job of each lane among the first %(front)s in taking order, best first (the
    -- lanes told apart byte by byte, as equality does: no collation's rules to sort them by)
    SELECT c.id, c.lane FROM (
        SELECT DISTINCT ON (f.lane COLLATE "C") f.id, f.lane, f.priority, f.window_start FROM (
            SELECT id, lane, next_run_at, priority, window_start FROM {schema}.jobs
            WHERE queue = %(queue)s AND status IN ('pending', 'failed')
            ORDER BY priority, window_start DESC NULLS LAST, id
            LIMIT %(front)s
        ) f
        WHERE f.next_run_at <= now()
        ORDER BY f.lane COLLATE "C", f.priority, f.window_start DESC NULLS LAST, f.id
    ) c
    ORDER BY c.priority, c.window_start DESC NULLS LAST, c.id
    OFFSET 0
),
taken AS (
    -- best first, each lane looked up only until enough are locked (the lanes of the front are
    -- read in that order, one lookup each in the running-lane index, the index of live leases
    -- of jobs that stopped running, and the lane's pause): none running (the jobs completed
    -- above no longer run: their lanes are free at once), no live lease of a job
    -- that stopped running (its page may still be in flight), no throttle's pause. The limit
    -- reads the completions first, so they have freed their slots before any job of their lane
    -- is marked running
    -- (each lookup a scalar subquery that stops at its first row: no aggregate to set up at
    -- every execution, and never pulled up into a join that reads every running job)
    SELECT j.id, j.status FROM front c
    JOIN {schema}.jobs j ON j.id = c.id
    WHERE j.status IN ('pending', 'failed')
      AND (SELECT r.id FROM {schema}.jobs r
           WHERE r.queue = %(queue)s AND r.lane = c.lane AND r.status = 'running'
             AND r.id <> ALL (%(done_ids)s::bigint[])
           LIMIT 1) IS NULL
      AND (SELECT h.id FROM {schema}.jobs h
           WHERE h.queue = %(queue)s AND h.lane = c.lane AND h.status <> 'running'
             AND h.lease_token IS NOT NULL AND h.lease_expires_at > now()
           LIMIT 1) IS NULL
      AND coalesce((SELECT p.paused_until FROM {schema}.lanes p
                    WHERE p.queue = %(queue)s AND p.lane = c.lane), '-infinity') <= now()
    LIMIT (SELECT greatest(slots, 0) FROM room)
    FOR UPDATE OF j SKIP LOCKED
),
next AS (
    -- each job's lease token is md5 of the token the worker sent and the job's id: its own, and
    -- after a lost answer the worker finds what it took
    UPDATE {schema}.jobs j
    SET status = 'running', leased_by = %(worker)s,
        lease_token = md5(%(token)s::uuid::text || j.id::text)::uuid,
        lease_expires_at = clock_timestamp() + %(lease)s, attempt_count = j.attempt_count + 1,
        started_at = now(), heartbeat_at = now(),
        lane_slot = 0, queue_slot = NULL
    FROM taken
    WHERE j.id = taken.id
    RETURNING j.id, j.queue, j.owner, j.lane, j.type, j.mode, j.window_start, j.window_end,
              j.cursor, j.attempt_count, j.throttle_count, j.processed_count, j.lease_token, j.stalls,
              taken.status AS previous_status, j.priority
)
SELECT ARRAY(SELECT id FROM done) AS completed, next.*
FROM (SELECT) AS one
LEFT JOIN next ON true
ORDER BY next.priority, next.window_start DESC NULLS LAST, next.id;

-- name: take_front_slotted
-- take_front for a queue with lanes wider than one (%(lane_width)s) or a cap (%(max_running)s):
-- the best due jobs of distinct lanes with room (fewer than %(lane_width)s running), no more than
-- the queue's free slots allow (every live lease holds one, a cancelled page in flight too), each
-- marked running in a free slot of its lane and, under a cap, of its queue. Two takers of one slot
-- may both pass this query; the running-lane index (or the queue-slot index) lets only one of them
-- commit, as in take_front
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
room AS (
    -- how many jobs to take: one per slot served, none while the queue is paused, and under a cap
    -- no more than its free slots (every live lease counts, a cancelled page in flight too)
    SELECT CASE WHEN EXISTS (SELECT FROM {schema}.queue_pauses WHERE queue = %(queue)s) THEN 0
                WHEN %(max_running)s::int IS NULL THEN %(plain)s::int + (SELECT count(*) FROM done)
                ELSE least(%(plain)s::int + (SELECT count(*) FROM done),
                           %(max_running)s::int
                           - (SELECT count(*) FROM {schema}.jobs
                              WHERE queue = %(queue)s AND queue_slot IS NOT NULL
                                AND lease_token IS NOT NULL
                                AND id <> ALL (%(done_ids)s::bigint[]))) END AS slots
),
front AS (
    -- the best due job of each lane among the first %(front)s in taking order, best first (the
    -- lanes told apart byte by byte, as equality does: no collation's rules to sort them by)
    SELECT c.id, c.lane FROM (
        SELECT DISTINCT ON (f.lane) f.id, f.lane, f.priority, f.window_start FROM (
            SELECT id, lane, next_run_at, priority, window_start FROM {schema}.jobs
            WHERE queue = %(queue)s AND status IN ('pending', 'failed')
            ORDER BY priority, window_start DESC NULLS LAST, id
            LIMIT %(front)s
        ) f
        WHERE f.next_run_at <= now()
        ORDER BY f.lane, f.priority, f.window_start DESC NULLS LAST, f.id
    ) c
    ORDER BY c.priority, c.window_start DESC NULLS LAST, c.id
    OFFSET 0
),
taken AS (
    -- best first, each lane looked up only until enough are locked (the lanes of the front are
    -- read in that order, one lookup each in the running-lane index, the index of live leases
    -- of jobs that stopped running, and the lane's pause): fewer than %(lane_width)s running (the
    -- jobs completed above no longer run: their slots are free at once), no live lease of a job
    -- that stopped running (its page may still be in flight), no throttle's pause. The limit
    -- reads the completions first, so they have freed their slots before any job of their lane
    -- is marked running
    SELECT j.id, j.status, j.lane, row_number() OVER () AS n FROM (
        SELECT j.id, j.status, j.lane FROM front c
        JOIN {schema}.jobs j ON j.id = c.id
        WHERE j.status IN ('pending', 'failed')
          AND (SELECT count(*) FROM {schema}.jobs r
               WHERE r.queue = %(queue)s AND r.lane = c.lane AND r.status = 'running'
                 AND r.id <> ALL (%(done_ids)s::bigint[])) < %(lane_width)s
          AND (SELECT count(*) FROM {schema}.jobs h
               WHERE h.queue = %(queue)s AND h.lane = c.lane AND h.status <> 'running'
                 AND h.lease_token IS NOT NULL AND h.lease_expires_at > now()) = 0
          AND coalesce((SELECT p.paused_until FROM {schema}.lanes p
                        WHERE p.queue = %(queue)s AND p.lane = c.lane), '-infinity') <= now()
        LIMIT (SELECT greatest(slots, 0) FROM room)
        FOR UPDATE OF j SKIP LOCKED
    ) j
),
queue_slots AS MATERIALIZED (
    -- the slots of the queue in use (read only under a cap)
    SELECT queue_slot FROM {schema}.jobs
    WHERE %(max_running)s::int IS NOT NULL AND queue = %(queue)s AND queue_slot IS NOT NULL
      AND lease_token IS NOT NULL AND id <> ALL (%(done_ids)s::bigint[])
),
free_queue_slots AS (
    -- free slots of the queue in a random order, so that takers of several processes seldom
    -- choose the same one (the lowest slots in use + taken numbers hold enough free ones)
    SELECT s, row_number() OVER (ORDER BY random()) AS n
    FROM generate_series(0, least(coalesce(%(max_running)s::int, 0),
                                  (SELECT count(*) FROM queue_slots)
                                  + (SELECT count(*) FROM taken)) - 1) s
    WHERE %(max_running)s::int IS NOT NULL AND s NOT IN (SELECT queue_slot FROM queue_slots)
),
tokened AS (
    -- each job's slots: of its lane, and under a cap of its queue
    SELECT t.id, t.status, q.s AS queue_slot,
           CASE WHEN %(lane_width)s::int = 1 THEN 0
                ELSE (SELECT min(w) FROM generate_series(0, %(lane_width)s::int - 1) w
                      WHERE w NOT IN (SELECT r.lane_slot FROM {schema}.jobs r
                                      WHERE r.queue = %(queue)s AND r.lane = t.lane
                                        AND r.status = 'running'
                                        AND r.id <> ALL (%(done_ids)s::bigint[])))
           END AS lane_slot
    FROM taken t
    LEFT JOIN free_queue_slots q ON q.n = t.n
),
next AS (
    UPDATE {schema}.jobs j
    SET status = 'running', leased_by = %(worker)s,
        lease_token = md5(%(token)s::uuid::text || j.id::text)::uuid,
        lease_expires_at = clock_timestamp() + %(lease)s, attempt_count = j.attempt_count + 1,
        started_at = now(), heartbeat_at = now(),
        lane_slot = tokened.lane_slot, queue_slot = tokened.queue_slot
    FROM tokened
    WHERE j.id = tokened.id
    RETURNING j.id, j.queue, j.owner, j.lane, j.type, j.mode, j.window_start, j.window_end,
              j.cursor, j.attempt_count, j.throttle_count, j.processed_count, j.lease_token, j.stalls,
              tokened.status AS previous_status, j.priority
)
SELECT ARRAY(SELECT id FROM done) AS completed, next.*
FROM (SELECT) AS one
LEFT JOIN next ON true
ORDER BY next.priority, next.window_start DESC NULLS LAST, next.id;

-- name: take_by_lane
-- the same take when the front of the line waits behind busy lanes ("a look"): reads up to
-- %(visit)s lanes whose hint has come (lanes.due_at, earliest first) and the lanes of up to
-- %(visit)s wakes that have come (lane_wakes: a job of the lane became due, or the lane may have
-- room), each from its jobs as they are. Of those whose lanes row it can write without waiting
-- (another transaction may hold one: it is left alone, wakes and all), it parks the busy ones
-- (full, or held by a live lease: 'infinity'), moves the hint of those with nothing due (or
-- paused by a throttle) to their earliest open job (or the pause's end; NULL with nothing open),
-- and deletes the wakes it has answered; of the rest it takes the best head (its best due job, or
-- a deferred job's last attempt once nothing else of its lane is open or running). The same
-- pauses, lane width and queue cap as take_front; the indexes still refuse a second taker
WITH allowed AS (
    SELECT NOT EXISTS (SELECT FROM {schema}.queue_pauses WHERE queue = %(queue)s)
           AND (%(max_running)s::int IS NULL
                OR (SELECT count(*) FROM {schema}.jobs
                    WHERE queue = %(queue)s AND queue_slot IS NOT NULL
                      AND lease_token IS NOT NULL) < %(max_running)s::int)
           AS ok
),
candidates AS MATERIALIZED (
    (SELECT l.lane FROM {schema}.lanes l
     WHERE l.queue = %(queue)s AND l.due_at <= now() AND (SELECT ok FROM allowed)
     ORDER BY l.due_at
     LIMIT %(visit)s)
    UNION
    (SELECT w.lane FROM {schema}.lane_wakes w
     WHERE w.queue = %(queue)s AND w.due_at <= now() AND (SELECT ok FROM allowed)
     ORDER BY w.due_at
     LIMIT %(visit)s)
),
mine AS MATERIALIZED (
    -- the candidates' rows this look may write; one another transaction holds is skipped, never
    -- waited for (rows in lane order, as every writer of lanes locks them)
    SELECT l.lane FROM {schema}.lanes l
    WHERE l.queue = %(queue)s AND l.lane = ANY (ARRAY(SELECT lane FROM candidates))
    ORDER BY l.lane
    FOR UPDATE SKIP LOCKED
),
looked AS MATERIALIZED (
    -- each lane's row looked up by key (scalar subqueries: a join or EXISTS may be planned as a
    -- read of every lane of the queue)
    SELECT c.lane,
           (SELECT count(*) FROM {schema}.lanes x
            WHERE x.queue = %(queue)s AND x.lane = c.lane) > 0 AS listed,
           (SELECT count(*) FROM {schema}.jobs r
            WHERE r.queue = %(queue)s AND r.lane = c.lane AND r.status = 'running')
               >= %(lane_width)s
           -- a scalar subquery, not EXISTS: that one may be hashed, a read of every held
           -- lease of the queue; this looks up the lane
           OR (SELECT count(*) FROM {schema}.jobs h
               WHERE h.queue = %(queue)s AND h.lane = c.lane AND h.status <> 'running'
                 AND h.lease_token IS NOT NULL AND h.lease_expires_at > now()) > 0 AS busy,
           (SELECT p.paused_until FROM {schema}.lanes p
            WHERE p.queue = %(queue)s AND p.lane = c.lane AND p.paused_until > now()) AS paused,
           -- when the lane is worth a look again with nothing due now: its earliest pending or
           -- failed job, else its earliest deferred one (that one waits for the others)
           coalesce((SELECT min(j.next_run_at) FROM {schema}.jobs j
                     WHERE j.queue = %(queue)s AND j.lane = c.lane
                       AND j.status IN ('pending', 'failed')),
                    (SELECT min(j.next_run_at) FROM {schema}.jobs j
                     WHERE j.queue = %(queue)s AND j.lane = c.lane
                       AND j.status = 'deferred')) AS earliest,
           (SELECT head.id FROM (
                (SELECT j.id, j.priority, j.window_start FROM {schema}.jobs j
                 WHERE j.queue = %(queue)s AND j.lane = c.lane
                   AND j.status IN ('pending', 'failed') AND j.next_run_at <= now()
                 ORDER BY j.priority, j.window_start DESC NULLS LAST, j.id LIMIT 1)
                UNION ALL
                (SELECT d.id, d.priority, d.window_start FROM {schema}.jobs d
                 WHERE d.queue = %(queue)s AND d.lane = c.lane
                   AND d.status = 'deferred' AND d.next_run_at <= now()
                   -- nothing else of the lane open or running: two lookups, each in an
                   -- index of its own (no index holds both), where one NOT EXISTS over the
                   -- three statuses was planned as a read of the whole table per lane
                   AND (SELECT 1 FROM {schema}.jobs o
                        WHERE o.queue = %(queue)s AND o.lane = c.lane
                          AND o.status IN ('pending', 'failed') LIMIT 1) IS NULL
                   AND (SELECT 1 FROM {schema}.jobs o
                        WHERE o.queue = %(queue)s AND o.lane = c.lane
                          AND o.status = 'running' LIMIT 1) IS NULL
                 ORDER BY d.priority, d.window_start DESC NULLS LAST, d.id LIMIT 1)
                LIMIT 1) head) AS head
    FROM candidates c
),
hints AS MATERIALIZED (
    -- what each lane read says, for the lanes without a job to take now
    SELECT v.lane, v.listed,
           -- busy, or only a deferred job due that waits for the lane to be idle: parked
           CASE WHEN v.busy OR (v.head IS NULL AND v.paused IS NULL AND v.earliest <= now())
                THEN 'infinity'::timestamptz
                WHEN v.paused IS NOT NULL THEN greatest(v.paused, v.earliest)
                ELSE v.earliest END AS due_at
    FROM looked v
    WHERE v.busy OR v.paused IS NOT NULL OR v.head IS NULL
),
hinted AS (
    UPDATE {schema}.lanes l SET due_at = h.due_at
    FROM hints h
    WHERE l.queue = %(queue)s AND l.lane = h.lane AND l.lane = ANY (ARRAY(SELECT lane FROM mine))
    RETURNING l.lane
),
listed AS (
    INSERT INTO {schema}.lanes (queue, lane, due_at)
    SELECT %(queue)s, h.lane, h.due_at FROM hints h WHERE NOT h.listed
    ORDER BY h.lane
    ON CONFLICT (queue, lane) DO NOTHING
    RETURNING lane
),
answered AS (
    -- the wakes of the lanes whose hint this look wrote: what they announced is in that hint
    -- (a wake it can see was made before its snapshot, as were the changes of the jobs it read)
    DELETE FROM {schema}.lane_wakes w
    WHERE w.queue = %(queue)s
      AND w.lane = ANY (ARRAY(SELECT lane FROM hinted UNION ALL SELECT lane FROM listed))
    RETURNING w.lane
),
taken AS (
    SELECT j.id, j.status, j.lane FROM {schema}.jobs j
    WHERE j.id = ANY (ARRAY(SELECT head FROM looked
                            WHERE NOT busy AND paused IS NULL AND head IS NOT NULL))
      AND j.status IN ('pending', 'failed', 'deferred')
    ORDER BY j.priority, j.window_start DESC NULLS LAST, j.id
    LIMIT 1 FOR UPDATE SKIP LOCKED
),
slots AS (
    SELECT t.id, t.status,
           CASE WHEN %(lane_width)s::int = 1 THEN 0
                ELSE (SELECT min(w) FROM generate_series(0, %(lane_width)s::int - 1) w
                      WHERE w NOT IN (SELECT r.lane_slot FROM {schema}.jobs r
                                      WHERE r.queue = %(queue)s AND r.lane = t.lane
                                        AND r.status = 'running'))
           END AS lane_slot,
           CASE WHEN %(max_running)s::int IS NOT NULL THEN
               (SELECT s FROM generate_series(
                    0, least(%(max_running)s::int,
                             (SELECT count(*) FROM {schema}.jobs r
                              WHERE r.queue = %(queue)s AND r.queue_slot IS NOT NULL
                                AND r.lease_token IS NOT NULL) + 1) - 1) s
                WHERE s NOT IN (SELECT r.queue_slot FROM {schema}.jobs r
                                WHERE r.queue = %(queue)s AND r.queue_slot IS NOT NULL
                                  AND r.lease_token IS NOT NULL)
                ORDER BY random() LIMIT 1)
           END AS queue_slot
    FROM taken t
),
next AS (
    UPDATE {schema}.jobs j
    SET status = 'running', leased_by = %(worker)s,
        lease_token = md5(%(token)s::uuid::text || j.id::text)::uuid,
        lease_expires_at = clock_timestamp() + %(lease)s, attempt_count = j.attempt_count + 1,
        started_at = now(), heartbeat_at = now(),
        lane_slot = slots.lane_slot, queue_slot = slots.queue_slot
    FROM slots
    WHERE j.id = slots.id
    RETURNING j.id, j.queue, j.owner, j.lane, j.type, j.mode, j.window_start, j.window_end,
              j.cursor, j.attempt_count, j.throttle_count, j.processed_count, j.lease_token,
              j.stalls, slots.status AS previous_status
)
-- one row always: how many lanes were looked at (a full look that took nothing may be worth
-- another: it parked or moved the lanes it read), what it wrote, and the job taken (NULL: none)
SELECT (SELECT count(*) FROM looked) AS looked,
       (SELECT count(*) FROM hinted) + (SELECT count(*) FROM listed)
           + (SELECT count(*) FROM answered) AS written,
       next.*
FROM (SELECT) AS one LEFT JOIN next ON true;

-- name: taken_by_tokens
-- after a take whose answer was lost: the jobs this worker took under the tokens it sent (a job's
-- lease token is md5 of the token sent and the job's id: it may run them, nobody else holds
-- them), and which of the jobs it meant to complete still run under its lease (then the take did
-- not commit, and nothing of it happened)
SELECT j.id, j.queue, j.owner, j.lane, j.type, j.mode, j.window_start, j.window_end,
       j.cursor, j.attempt_count, j.throttle_count, j.processed_count, j.lease_token, j.stalls,
       CASE WHEN j.attempt_count > %(max_attempts)s THEN 'deferred' ELSE 'pending' END
           AS previous_status,
       false AS unfinished
FROM {schema}.jobs j
WHERE j.status = 'running' AND j.leased_by = %(worker)s
  AND EXISTS (SELECT FROM unnest(%(tokens)s::uuid[]) AS t
              WHERE j.lease_token = md5(t::text || j.id::text)::uuid)
UNION ALL
SELECT j.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       true
FROM {schema}.jobs j
JOIN unnest(%(done_ids)s::bigint[], %(done_tokens)s::uuid[]) AS d (id, token)
  ON j.id = d.id AND j.lease_token = d.token AND j.status = 'running';

-- name: save_pages
-- saves the cursors and counts of the slots of one worker whose pages ended at the same instant,
-- in one statement and one commit, and renews their leases. Each row keeps its own guard: id,
-- lease token, status = 'running' (false for a slot that lost its lease: it stops and saves
-- nothing more of the job, only holds and then releases the lost lease; the others are saved),
-- and where its page started: the cursor it replaces and the count before it (sent again after a
-- lost answer, a save finds its own and counts nothing twice, also when a page's next cursor is
-- the one it started from: a page with records moves the count on). Also says whether the queue
-- is paused, and until when the job's lane is paused by a throttle of a sibling (NULL: it is
-- not): the job then stops at this page boundary
WITH given AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(expected)s::text[],
                         %(counted)s::bigint[], %(cursors)s::text[], %(counts)s::bigint[])
         WITH ORDINALITY AS g (id, token, expected, counted, cursor, count, number)
),
saved AS (
    UPDATE {schema}.jobs j
    SET cursor = g.cursor, processed_count = j.processed_count + g.count, stalls = 0,
        heartbeat_at = now(), lease_expires_at = clock_timestamp() + %(lease)s
    FROM given g
    WHERE j.id = g.id AND j.lease_token = g.token AND j.status = 'running'
      AND j.cursor IS NOT DISTINCT FROM g.expected AND j.processed_count = g.counted
    RETURNING j.id, j.lane
)
SELECT s.id IS NOT NULL OR EXISTS (
           SELECT FROM {schema}.jobs j
           WHERE j.id = g.id AND j.lease_token = g.token AND j.status = 'running'
             AND j.cursor IS NOT DISTINCT FROM g.cursor
             AND j.processed_count = g.counted + g.count) AS saved,
       EXISTS (SELECT FROM {schema}.queue_pauses WHERE queue = %(queue)s) AS paused,
       -- the lane by primary key (a save sent again finds the job's lane in its row)
       (SELECT l.paused_until FROM {schema}.lanes l
        WHERE l.queue = %(queue)s AND l.paused_until > now()
          AND l.lane = coalesce(s.lane, (SELECT j.lane FROM {schema}.jobs j WHERE j.id = g.id)))
           AS lane_paused_until
FROM given g
LEFT JOIN saved s ON s.id = g.id
ORDER BY g.number;

-- name: heartbeats
-- renews the leases of the slots of one worker whose pages are slow, in one statement, each
-- under its own guard; returns the ids still running (a missing id lost its lease). A job that
-- stopped running under its lease (cancelled, maybe requeued since) has its lease renewed all the
-- same, and is not returned: the page is still in flight, so its lane stays held from the very
-- statement that finds it lost (hold_lease takes over from there) and never on what the last beat
-- left of the lease
UPDATE {schema}.jobs j
SET heartbeat_at = CASE WHEN j.status = 'running' THEN now() ELSE j.heartbeat_at END,
    lease_expires_at = clock_timestamp() + %(lease)s
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS g (id, token)
WHERE j.id = g.id AND j.lease_token = g.token
RETURNING j.id, j.status = 'running' AS running;

-- name: complete_job
-- the last page: counts it and marks the job completed, under the lease guard; sent again after a
-- lost answer, it finds the job completed (within the lease, nobody but this worker could have)
WITH done AS (
    UPDATE {schema}.jobs
    SET status = 'completed', processed_count = processed_count + %(count)s, error = NULL,
        completed_at = now(), heartbeat_at = now(),
        leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
    RETURNING id, queue, lane
),
woken AS (
    -- its lane has room now: a look that parked it reads it again (take_front's completions
    -- are told by the worker instead, notify_freed_lanes)
    INSERT INTO {schema}.lane_wakes (queue, lane, due_at)
    SELECT d.queue, d.lane, now() FROM done d
    JOIN {schema}.lanes l ON l.queue = d.queue AND l.lane = d.lane AND l.due_at = 'infinity'
)
SELECT EXISTS (SELECT FROM done) OR EXISTS (
    SELECT FROM {schema}.jobs
    WHERE id = %(id)s AND status = 'completed' AND completed_at > now() - %(lease)s
      AND NOT EXISTS (SELECT FROM done)
) AS done;

-- name: fail_job
-- a failed attempt: retried after the delay (not before its lane's pause ends), deferred once the
-- regular attempts are used up, abandoned when the deferred attempt fails too
-- (after_failed_attempt); sent again after a lost answer, it finds its own error on the stopped
-- job and reports what it became
WITH failed AS (
    UPDATE {schema}.jobs j
    SET status = {schema}.after_failed_attempt(attempt_count, %(max_attempts)s),
        completed_at = CASE WHEN attempt_count > %(max_attempts)s THEN now() END,
        error = %(error)s, heartbeat_at = now(), stalls = 0,
        next_run_at = greatest(now() + %(delay)s,
                               (SELECT l.paused_until FROM {schema}.lanes l
                                WHERE l.queue = j.queue AND l.lane = j.lane)),
        leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
    RETURNING id, queue, lane, status, next_run_at
)
SELECT status, next_run_at FROM failed
UNION ALL
SELECT status, next_run_at FROM {schema}.jobs
WHERE id = %(id)s AND status IN ('failed', 'deferred', 'abandoned') AND error = %(error)s
  AND heartbeat_at > now() - %(lease)s AND NOT EXISTS (SELECT FROM failed);

-- name: throttle_job
-- a throttle gives the attempt back and pauses the lane: every open job of the lane is pushed to
-- the same time, and the lane itself remembers the pause, so a job that joins it meanwhile (planned,
-- enqueued, requeued) waits too. The account was told to slow down, not the job; a pause the lane
-- already has that ends later stands. The pause runs from when the job's row is the throttle's
-- (clock_timestamp()), so a statement that waited for a lock never shortens it
WITH throttled AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN %(previous_status)s = 'deferred' THEN 'deferred' ELSE 'failed' END,
        attempt_count = attempt_count - 1, throttle_count = throttle_count + 1,
        error = %(error)s, heartbeat_at = now(),
        next_run_at = greatest(clock_timestamp() + %(delay)s,
                               (SELECT l.paused_until FROM {schema}.lanes l
                                WHERE l.queue = j.queue AND l.lane = j.lane)),
        leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
    RETURNING id, queue, lane, next_run_at
),
lane AS (
    UPDATE {schema}.jobs o
    SET next_run_at = t.next_run_at
    FROM throttled t
    WHERE o.queue = t.queue AND o.lane = t.lane
      AND o.status IN ('pending', 'failed', 'deferred') AND o.next_run_at < t.next_run_at
    RETURNING o.id
),
paused AS (
    -- the lane's pause, and its hint (lanes.due_at) back from parked: due when the pause ends
    INSERT INTO {schema}.lanes AS l (queue, lane, paused_until, due_at)
    SELECT queue, lane, next_run_at, next_run_at FROM throttled
    ON CONFLICT (queue, lane) DO UPDATE
    SET paused_until = greatest(l.paused_until, excluded.paused_until),
        due_at = coalesce(l.due_at, excluded.due_at)
    RETURNING paused_until
)
SELECT t.next_run_at, (SELECT count(*) FROM lane) AS pushed FROM throttled t
UNION ALL
SELECT next_run_at, 0 FROM {schema}.jobs
WHERE id = %(id)s AND status IN ('failed', 'deferred') AND error = %(error)s
  AND heartbeat_at > now() - %(lease)s AND NOT EXISTS (SELECT FROM throttled);

-- name: abandon_job
-- the handler said a retry cannot help: abandoned at once, waiting for a human (found again
-- after a lost answer by its error)
WITH abandoned AS (
    UPDATE {schema}.jobs
    SET status = 'abandoned', error = %(error)s, completed_at = now(), heartbeat_at = now(),
        leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
    RETURNING id, queue, lane
)
SELECT EXISTS (SELECT FROM abandoned) OR EXISTS (
    SELECT FROM {schema}.jobs
    WHERE id = %(id)s AND status = 'abandoned' AND error = %(error)s
      AND completed_at > now() - %(lease)s AND NOT EXISTS (SELECT FROM abandoned)
) AS done;

-- name: hand_back
-- a stopping worker returns its job with its cursor, due at once (or when its lane's pause ends);
-- a stop is not a failed attempt. A hand-back whose page was abandoned before it ended, with no
-- page saved under this lease, is counted (stalls; a saved page resets it). Sent again after a
-- lost answer, it finds its own commit by the lease's token (release_key), also once another
-- worker has taken the job
WITH back AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN %(previous_status)s = 'deferred' THEN 'deferred' ELSE 'pending' END,
        attempt_count = attempt_count - 1,
        next_run_at = greatest(now(),
                               (SELECT l.paused_until FROM {schema}.lanes l
                                WHERE l.queue = j.queue AND l.lane = j.lane)),
        stalls = stalls + CASE WHEN %(stalled)s THEN 1 ELSE 0 END,
        release_key = lease_token,
        leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
    RETURNING id, queue, lane, next_run_at
)
SELECT id FROM back
UNION ALL
SELECT id FROM {schema}.jobs
WHERE id = %(id)s AND release_key = %(token)s AND NOT EXISTS (SELECT FROM back);

-- name: wait_for_rate
-- the lane's rate leaves no room for another page start yet: the job goes back in line with its
-- cursor and its attempt, due when the lane has room, and the lane's other open jobs wait as long
-- (so that no slot takes one only to hand it back), or until its pause ends if that is later; the
-- slot takes something else meanwhile. Sent again after a lost answer, it finds its own commit by
-- the lease's token (release_key) and says until when the job waits
WITH back AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN %(previous_status)s = 'deferred' THEN 'deferred' ELSE 'pending' END,
        attempt_count = attempt_count - 1,
        next_run_at = greatest(clock_timestamp() + %(delay)s,
                               (SELECT l.paused_until FROM {schema}.lanes l
                                WHERE l.queue = j.queue AND l.lane = j.lane)),
        release_key = lease_token,
        leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
    RETURNING id, queue, lane, next_run_at
),
lane AS (
    UPDATE {schema}.jobs o
    SET next_run_at = b.next_run_at
    FROM back b
    WHERE o.queue = b.queue AND o.lane = b.lane
      AND o.status IN ('pending', 'failed', 'deferred') AND o.next_run_at < b.next_run_at
    RETURNING o.id
)
SELECT next_run_at, (SELECT count(*) FROM lane) AS pushed FROM back
UNION ALL
SELECT next_run_at, 0 FROM {schema}.jobs
WHERE id = %(id)s AND release_key = %(token)s AND NOT EXISTS (SELECT FROM back);

-- name: lane_page_starts
-- the page starts of the slots of one worker that fall due at the same instant, in one
-- statement and one commit, each under its lane's rate (lane_page_start in the schema): 0 when
-- it may start now, else how many seconds until the lane has room; `force` records starts a page
-- made beyond the one it announced. Each start carries a key of its own: sent again after a lost
-- answer, a start finds its key recorded and counts nothing twice. The lanes are counted in one order (queue, lane), so two
-- workers' statements lock their rows in the same order and never deadlock; the answers come
-- back in the order asked
SELECT w.wait FROM (
    SELECT g.number,
           {schema}.lane_page_start(g.queue, g.lane, g.count, g.period, g.units, g.force,
                                    g.key) AS wait
    FROM (
        SELECT * FROM unnest(%(queues)s::text[], %(lanes)s::text[], %(counts)s::integer[],
                             %(periods)s::interval[], %(units)s::integer[], %(forces)s::boolean[],
                             %(keys)s::uuid[])
             WITH ORDINALITY AS u (queue, lane, count, period, units, force, key, number)
        ORDER BY u.queue, u.lane, u.number
        OFFSET 0
    ) g
) w
ORDER BY w.number;

-- name: hold_lease
-- keeps a lost lease alive while its page is still in flight (the job was cancelled, maybe
-- requeued since): a lane stays held until the page that holds it has stopped. Only the lease's
-- end moves; the status guard of every write still refuses this worker (it is not 'running')
UPDATE {schema}.jobs
SET lease_expires_at = clock_timestamp() + %(lease)s
WHERE id = %(id)s AND lease_token = %(token)s AND status <> 'running'
RETURNING id;

-- name: release_cancelled
-- a worker whose job stopped running under it (cancelled, maybe requeued since) lets go of the
-- lease at once, and with it the lane
WITH released AS (
    UPDATE {schema}.jobs
    SET leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(token)s AND status <> 'running'
    RETURNING id, queue, lane, status, next_run_at
)
SELECT id FROM released;

-- name: reclaim_expired
-- jobs whose worker stopped renewing its lease go back in line, due at once (or when the lane's
-- pause ends); the attempt counts as failed (after_failed_attempt); the dead worker's late writes
-- no longer match the cleared token. Each reclaimed job keeps the reclaim's %(key)s
-- (release_key): after its commit went unanswered, the worker finds by it whether it committed
WITH reclaimed AS (
    UPDATE {schema}.jobs j
    SET status = {schema}.after_failed_attempt(attempt_count, %(max_attempts)s),
        completed_at = CASE WHEN attempt_count > %(max_attempts)s THEN now() END,
        error = 'LeaseExpired: worker ' || coalesce(leased_by, '?')
                || ' stopped renewing its lease',
        next_run_at = greatest(now(),
                               (SELECT l.paused_until FROM {schema}.lanes l
                                WHERE l.queue = j.queue AND l.lane = j.lane)),
        release_key = %(key)s,
        leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE queue = %(queue)s AND status = 'running' AND lease_expires_at < now()
    RETURNING id, queue, owner, lane, type, mode, window_start, window_end, status,
              attempt_count, error, next_run_at
)
SELECT id, owner, lane, type, mode, window_start, window_end, status, attempt_count, error
FROM reclaimed;

-- name: reclaimed_under_key
-- whether a reclaim whose commit went unanswered committed: its jobs carry its key (a later
-- take or finish of theirs leaves release_key alone; only another release changes it)
SELECT EXISTS (SELECT FROM {schema}.jobs
               WHERE id = ANY (%(ids)s::bigint[]) AND release_key = %(key)s) AS committed;

-- name: release_expired_holds
-- leases still held on jobs that stopped running (a cancelled job whose page was in flight,
-- hold_lease) whose worker stopped renewing them: they let go, like release_cancelled, and their
-- lanes get their hints back (a look that found the live lease parked the lane, and no stop of
-- a running job will come to un-park it). The dead worker's late writes find no lease
WITH released AS (
    UPDATE {schema}.jobs
    SET leased_by = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE queue = %(queue)s AND status <> 'running' AND lease_token IS NOT NULL
      AND lease_expires_at < now()
    RETURNING id, queue, lane, status, next_run_at
)
SELECT id FROM released;

-- name: mend_lanes
-- what keeps the lanes' hints a cache, every poll_interval: the lanes parked as busy
-- (lanes.due_at = 'infinity') that have room now, whoever gave it to them (a worker, a user's
-- UPDATE or DELETE), each get a wake, so the next look reads them again (a lane with a wake already
-- due gets no second one); and up to %(limit)s lanes' wakes become their hints (the earlier of the
-- two; a parked lane's wake un-parks it) and are deleted, so that wakes do not pile up while the
-- front of the line serves every take and no look reads them. A lane whose row another transaction
-- holds keeps its wakes for the next mend or look, never waited for; the lanes are locked in lane
-- order, as every writer does. Returns how many lanes it woke and how many it folded
WITH woken AS (
    INSERT INTO {schema}.lane_wakes (queue, lane, due_at)
    SELECT l.queue, l.lane, now() FROM {schema}.lanes l
    WHERE l.queue = %(queue)s AND l.due_at = 'infinity'
      AND (SELECT count(*) FROM {schema}.jobs r
           WHERE r.queue = %(queue)s AND r.lane = l.lane AND r.status = 'running')
          < %(lane_width)s
      AND (SELECT count(*) FROM {schema}.jobs h
           WHERE h.queue = %(queue)s AND h.lane = l.lane AND h.status <> 'running'
             AND h.lease_token IS NOT NULL AND h.lease_expires_at > now()) = 0
      AND (SELECT count(*) FROM {schema}.lane_wakes w
           WHERE w.queue = %(queue)s AND w.lane = l.lane AND w.due_at <= now()) = 0
    RETURNING lane
),
batch AS MATERIALIZED (
    -- the wakes already there (those written above are the next mend's, or a look's)
    SELECT w.lane, min(w.due_at) AS due_at FROM {schema}.lane_wakes w
    WHERE w.queue = %(queue)s
    GROUP BY w.lane
    ORDER BY w.lane
    LIMIT %(limit)s
),
mine AS MATERIALIZED (
    SELECT l.lane FROM {schema}.lanes l
    WHERE l.queue = %(queue)s AND l.lane = ANY (ARRAY(SELECT lane FROM batch))
    ORDER BY l.lane
    FOR UPDATE SKIP LOCKED
),
listed AS MATERIALIZED (
    -- each lane's row looked up by key (a join may be planned as a read of every lane)
    SELECT b.lane, b.due_at,
           (SELECT count(*) FROM {schema}.lanes x
            WHERE x.queue = %(queue)s AND x.lane = b.lane) > 0 AS listed
    FROM batch b
),
hinted AS (
    UPDATE {schema}.lanes l SET due_at = least(l.due_at, b.due_at)
    FROM listed b
    WHERE l.queue = %(queue)s AND l.lane = b.lane AND l.lane = ANY (ARRAY(SELECT lane FROM mine))
    RETURNING l.lane
),
added AS (
    INSERT INTO {schema}.lanes (queue, lane, due_at)
    SELECT %(queue)s, b.lane, b.due_at FROM listed b WHERE NOT b.listed
    ORDER BY b.lane
    ON CONFLICT (queue, lane) DO NOTHING
    RETURNING lane
),
answered AS (
    DELETE FROM {schema}.lane_wakes w
    WHERE w.queue = %(queue)s
      AND w.lane = ANY (ARRAY(SELECT lane FROM hinted UNION ALL SELECT lane FROM added))
    RETURNING w.lane
)
SELECT (SELECT count(*) FROM woken) AS woken, (SELECT count(*) FROM batch) AS lanes,
       (SELECT count(*) FROM answered) AS wakes;

-- name: idle_check
-- how many jobs of these queues run now, in any process, and how long until the next open one
-- is due (NULL: nothing open that a worker could take); a worker working "until idle" stops when
-- nothing runs and nothing is due within its grace period. A paused queue's jobs are not due:
-- nothing takes them until it is resumed, so a run until idle ends instead of waiting for that
SELECT count(*) FILTER (WHERE status = 'running') AS running,
       min(next_run_at) FILTER (
           WHERE status IN ('pending', 'failed', 'deferred')
             AND queue NOT IN (SELECT p.queue FROM {schema}.queue_pauses p)) - now()
           AS next_due_in
FROM {schema}.jobs
WHERE queue = ANY (%(queues)s::text[]) AND status IN ('pending', 'running', 'failed', 'deferred');

-- name: first_load_finished
-- whether every history slice of an owner and type has completed, and none is left to plan (its
-- oldest slice reaches its histories row's history_from, or it has none); asked after one
-- completes, only when someone listens to events
SELECT NOT EXISTS (
    SELECT 1 FROM {schema}.jobs
    WHERE queue = %(queue)s AND owner = %(owner)s AND type = %(type)s AND mode = 'initial'
      AND status <> 'completed'
) AND NOT EXISTS (
    SELECT 1 FROM {schema}.histories h
    WHERE h.queue = %(queue)s AND h.owner = %(owner)s AND h.type = %(type)s
      AND h.history_from < (
          SELECT j.window_start FROM {schema}.jobs j
          WHERE j.queue = %(queue)s AND j.owner = %(owner)s AND j.type = %(type)s
            AND j.mode = 'initial' AND j.window_end IS NOT NULL
          ORDER BY j.window_end LIMIT 1)
) AS finished;
