-- Reads of the fleet controls an operator sets: paused queues and lane rates.
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

-- name: paused_queues
-- the paused queues (all, or one): since when, by whom, why
SELECT queue, paused_at, paused_by, reason AS pause_reason
FROM {schema}.queue_pauses
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY queue;

-- name: lane_quotas
-- each lane's rate (its own, else its queue's, else the declared one given per queue) and how many
-- page starts the current window still allows; lanes that never started a page have no row and
-- the whole rate left
SELECT l.queue, l.lane,
       coalesce(l.rate_count, q.rate_count, d.count) AS rate_count,
       coalesce(l.rate_period, q.rate_period, d.period) AS rate_period,
       greatest(coalesce(l.rate_count, q.rate_count, d.count)
                - cardinality(ARRAY(SELECT s FROM unnest(l.starts) s
                                    WHERE s > now() - coalesce(l.rate_period, q.rate_period,
                                                               d.period))), 0) AS rate_left
FROM unnest(%(queues)s::text[], %(counts)s::integer[], %(periods)s::interval[])
     AS d (queue, count, period)
JOIN {schema}.lanes l ON l.queue = d.queue
LEFT JOIN {schema}.queue_rates q ON q.queue = d.queue
WHERE (%(lane)s::text IS NULL OR l.lane = %(lane)s);

-- name: queue_rate_overrides
-- the rates set without a deploy for whole queues
SELECT queue, rate_count, rate_period FROM {schema}.queue_rates;
