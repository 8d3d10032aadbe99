-- What the orchestrator extras read about the jobs a worker told them of (synclane.causes).
-- Each statement is loaded by name into synclane.store; {schema} is the schema, quoted as an
-- identifier. The line under each name says what the statement guarantees.

-- name: event_causes
-- the cause of each error as failures() groups it (error_cause, and its id: the start of its
-- MD5), and for each abandoned job whether an older abandoned job of its queue and owner has the
-- same cause: that cause already waits for a human. Older: abandoned earlier by the database's
-- clock (then by id), so of two jobs abandoned for one cause exactly one is the first. Reads the
-- owner's abandoned rows only (the dedup index's queue and owner)
SELECT e.n, c.cause, left(md5(c.cause), 8) AS cause_id,
       coalesce(e.abandoned AND EXISTS (
           SELECT FROM {schema}.jobs o
           WHERE o.queue = e.queue AND o.owner = e.owner AND o.status = 'abandoned'
             AND o.id <> e.id AND {schema}.error_cause(o.error) = c.cause
             AND (coalesce(o.completed_at, o.heartbeat_at, o.created_at), o.id)
                 < (coalesce(j.completed_at, j.heartbeat_at, now()), e.id)), false) AS repeat
FROM unnest(%(ids)s::bigint[], %(queues)s::text[], %(owners)s::text[], %(errors)s::text[],
            %(abandoned)s::boolean[]) WITH ORDINALITY AS e(id, queue, owner, error, abandoned, n)
CROSS JOIN LATERAL (SELECT {schema}.error_cause(e.error) AS cause) c
LEFT JOIN {schema}.jobs j ON j.id = e.id
ORDER BY e.n;
