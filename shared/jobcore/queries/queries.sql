-- Every statement of jobqueue, by name, as compiled for asyncpg: $n is the n-th parameter
-- listed above it. Generated from jobcore.queries: do not edit; after a change run
--     python -m jobcore.queries
-- (tests/jobcore/test_queries.py fails while this file is stale).

-- name: job_submit
-- parameters: $1 id, $2 type, $3 payload, $4 max_attempts, $5 delay, $6 coalesce_1=0.0, $7 not_before, $8 queue, $9 priority, $10 timeout, $11 idempotency_key, $12 concurrency_key, $13 traceparent
INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, run_at, queue, priority, timeout, idempotency_key, concurrency_key, traceparent) VALUES ($1::UUID, $2::VARCHAR, $3::JSONB, $4::INTEGER, greatest(now() + coalesce($5::FLOAT, $6::FLOAT) * interval '1 second', coalesce($7::TIMESTAMP WITH TIME ZONE, '-infinity'::timestamptz)), $8::VARCHAR, $9::SMALLINT, $10::FLOAT, $11::VARCHAR, $12::VARCHAR, $13::VARCHAR) ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO UPDATE SET idempotency_key = excluded.idempotency_key WHERE jobqueue.jobs.type = excluded.type AND jobqueue.jobs.payload = excluded.payload AND jobqueue.jobs.max_attempts = excluded.max_attempts AND jobqueue.jobs.queue = excluded.queue AND jobqueue.jobs.priority = excluded.priority AND jobqueue.jobs.timeout IS NOT DISTINCT FROM excluded.timeout AND jobqueue.jobs.concurrency_key IS NOT DISTINCT FROM excluded.concurrency_key RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.status, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.run_at, jobqueue.jobs.locked_until, jobqueue.jobs.lease_token, jobqueue.jobs.last_error, jobqueue.jobs.idempotency_key, jobqueue.jobs.created_at, jobqueue.jobs.updated_at, jobqueue.jobs.queue, jobqueue.jobs.priority, jobqueue.jobs.timeout, jobqueue.jobs.concurrency_key, jobqueue.jobs.result, jobqueue.jobs.cancel_requested_at, jobqueue.jobs.finished_at, (xmax = 0) AS created;

-- name: job_submit_notify
-- parameters: $1 id, $2 type, $3 payload, $4 max_attempts, $5 delay, $6 coalesce_1=0.0, $7 not_before, $8 queue, $9 priority, $10 timeout, $11 idempotency_key, $12 concurrency_key, $13 traceparent
WITH submitted AS 
(INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, run_at, queue, priority, timeout, idempotency_key, concurrency_key, traceparent) VALUES ($1::UUID, $2::VARCHAR, $3::JSONB, $4::INTEGER, greatest(now() + coalesce($5::FLOAT, $6::FLOAT) * interval '1 second', coalesce($7::TIMESTAMP WITH TIME ZONE, '-infinity'::timestamptz)), $8::VARCHAR, $9::SMALLINT, $10::FLOAT, $11::VARCHAR, $12::VARCHAR, $13::VARCHAR) ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO UPDATE SET idempotency_key = excluded.idempotency_key WHERE jobqueue.jobs.type = excluded.type AND jobqueue.jobs.payload = excluded.payload AND jobqueue.jobs.max_attempts = excluded.max_attempts AND jobqueue.jobs.queue = excluded.queue AND jobqueue.jobs.priority = excluded.priority AND jobqueue.jobs.timeout IS NOT DISTINCT FROM excluded.timeout AND jobqueue.jobs.concurrency_key IS NOT DISTINCT FROM excluded.concurrency_key RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.status, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.run_at, jobqueue.jobs.locked_until, jobqueue.jobs.lease_token, jobqueue.jobs.last_error, jobqueue.jobs.idempotency_key, jobqueue.jobs.created_at, jobqueue.jobs.updated_at, jobqueue.jobs.queue, jobqueue.jobs.priority, jobqueue.jobs.timeout, jobqueue.jobs.concurrency_key, jobqueue.jobs.result, jobqueue.jobs.cancel_requested_at, jobqueue.jobs.finished_at, (xmax = 0) AS created)
 SELECT submitted.id, submitted.type, submitted.payload, submitted.status, submitted.attempts, submitted.max_attempts, submitted.run_at, submitted.locked_until, submitted.lease_token, submitted.last_error, submitted.idempotency_key, submitted.created_at, submitted.updated_at, submitted.queue, submitted.priority, submitted.timeout, submitted.concurrency_key, submitted.result, submitted.cancel_requested_at, submitted.finished_at, submitted.created, CASE WHEN submitted.created THEN pg_notify('jobqueue_jobs', '') END AS notified 
FROM submitted;

-- name: job_submit_many
-- parameters: $1 coalesce_1=0.0, $2 ids, $3 types, $4 payloads, $5 max_attempts, $6 keys, $7 queues, $8 priorities, $9 timeouts, $10 concurrency_keys, $11 traceparents, $12 not_befores, $13 delays
INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, idempotency_key, queue, priority, timeout, concurrency_key, traceparent, run_at) SELECT b.id, b.type, CAST(b.payload AS JSONB) AS payload, b.max_attempts, b.key, b.queue, b.priority, b.timeout, b.concurrency_key, b.traceparent, greatest(now() + coalesce(b.delay, $1::FLOAT) * interval '1 second', coalesce(b.not_before, '-infinity'::timestamptz)) AS greatest_1 
FROM unnest($2::UUID[], $3::TEXT[], $4::TEXT[], $5::INTEGER[], $6::TEXT[], $7::TEXT[], $8::SMALLINT[], $9::FLOAT[], $10::TEXT[], $11::TEXT[], $12::TIMESTAMP WITH TIME ZONE[], $13::FLOAT[]) AS b(id, type, payload, max_attempts, key, queue, priority, timeout, concurrency_key, traceparent, not_before, delay) ORDER BY b.key ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING jobqueue.jobs.id, jobqueue.jobs.idempotency_key, (xmax = 0) AS created;

-- name: job_submit_many_keyless
-- parameters: $1 shared_type, $2 shared_max_attempts, $3 shared_queue, $4 shared_priority, $5 shared_timeout, $6 shared_concurrency_key, $7 shared_traceparent, $8 shared_delay, $9 coalesce_8=0.0, $10 shared_not_before, $11 ids, $12 payloads, $13 types, $14 max_attempts, $15 queues, $16 priorities, $17 timeouts, $18 concurrency_keys, $19 traceparents, $20 not_befores, $21 delays
INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, idempotency_key, queue, priority, timeout, concurrency_key, traceparent, run_at) SELECT b.id, coalesce(b.type, $1::VARCHAR) AS coalesce_1, CAST(b.payload AS JSONB) AS payload, coalesce(b.max_attempts, $2::INTEGER) AS coalesce_2, NULL AS anon_1, coalesce(b.queue, $3::VARCHAR) AS coalesce_3, coalesce(b.priority, $4::SMALLINT) AS coalesce_4, coalesce(b.timeout, $5::FLOAT) AS coalesce_5, coalesce(b.concurrency_key, $6::VARCHAR) AS coalesce_6, coalesce(b.traceparent, $7::VARCHAR) AS coalesce_7, greatest(now() + coalesce(coalesce(b.delay, $8::FLOAT), $9::FLOAT) * interval '1 second', coalesce(coalesce(b.not_before, $10::TIMESTAMP WITH TIME ZONE), '-infinity'::timestamptz)) AS greatest_1 
FROM unnest($11::UUID[], $12::TEXT[], $13::TEXT[], $14::INTEGER[], $15::TEXT[], $16::SMALLINT[], $17::FLOAT[], $18::TEXT[], $19::TEXT[], $20::TIMESTAMP WITH TIME ZONE[], $21::FLOAT[]) AS b(id, payload, type, max_attempts, queue, priority, timeout, concurrency_key, traceparent, not_before, delay);

-- name: job_submit_group
-- parameters: $1 shared_type, $2 shared_max_attempts, $3 shared_queue, $4 shared_priority, $5 shared_timeout, $6 shared_concurrency_key, $7 shared_traceparent, $8 shared_delay, $9 coalesce_8=0.0, $10 shared_not_before, $11 ids, $12 payloads, $13 types, $14 max_attempts, $15 queues, $16 priorities, $17 timeouts, $18 concurrency_keys, $19 traceparents, $20 not_befores, $21 delays
INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, idempotency_key, queue, priority, timeout, concurrency_key, traceparent, run_at) SELECT b.id, coalesce(b.type, $1::VARCHAR) AS coalesce_1, CAST(b.payload AS JSONB) AS payload, coalesce(b.max_attempts, $2::INTEGER) AS coalesce_2, NULL AS anon_1, coalesce(b.queue, $3::VARCHAR) AS coalesce_3, coalesce(b.priority, $4::SMALLINT) AS coalesce_4, coalesce(b.timeout, $5::FLOAT) AS coalesce_5, coalesce(b.concurrency_key, $6::VARCHAR) AS coalesce_6, coalesce(b.traceparent, $7::VARCHAR) AS coalesce_7, greatest(now() + coalesce(coalesce(b.delay, $8::FLOAT), $9::FLOAT) * interval '1 second', coalesce(coalesce(b.not_before, $10::TIMESTAMP WITH TIME ZONE), '-infinity'::timestamptz)) AS greatest_1 
FROM unnest($11::UUID[], $12::TEXT[], $13::TEXT[], $14::INTEGER[], $15::TEXT[], $16::SMALLINT[], $17::FLOAT[], $18::TEXT[], $19::TEXT[], $20::TIMESTAMP WITH TIME ZONE[], $21::FLOAT[]) AS b(id, payload, type, max_attempts, queue, priority, timeout, concurrency_key, traceparent, not_before, delay) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.status, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.run_at, jobqueue.jobs.locked_until, jobqueue.jobs.lease_token, jobqueue.jobs.last_error, jobqueue.jobs.idempotency_key, jobqueue.jobs.created_at, jobqueue.jobs.updated_at, jobqueue.jobs.queue, jobqueue.jobs.priority, jobqueue.jobs.timeout, jobqueue.jobs.concurrency_key, jobqueue.jobs.result, jobqueue.jobs.cancel_requested_at, jobqueue.jobs.finished_at;

-- name: job_submit_group_notify
-- parameters: $1 shared_type, $2 shared_max_attempts, $3 shared_queue, $4 shared_priority, $5 shared_timeout, $6 shared_concurrency_key, $7 shared_traceparent, $8 shared_delay, $9 coalesce_8=0.0, $10 shared_not_before, $11 ids, $12 payloads, $13 types, $14 max_attempts, $15 queues, $16 priorities, $17 timeouts, $18 concurrency_keys, $19 traceparents, $20 not_befores, $21 delays
WITH grouped AS 
(INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, idempotency_key, queue, priority, timeout, concurrency_key, traceparent, run_at) SELECT b.id AS id, coalesce(b.type, $1::VARCHAR) AS coalesce_1, CAST(b.payload AS JSONB) AS payload, coalesce(b.max_attempts, $2::INTEGER) AS coalesce_2, NULL AS anon_1, coalesce(b.queue, $3::VARCHAR) AS coalesce_3, coalesce(b.priority, $4::SMALLINT) AS coalesce_4, coalesce(b.timeout, $5::FLOAT) AS coalesce_5, coalesce(b.concurrency_key, $6::VARCHAR) AS coalesce_6, coalesce(b.traceparent, $7::VARCHAR) AS coalesce_7, greatest(now() + coalesce(coalesce(b.delay, $8::FLOAT), $9::FLOAT) * interval '1 second', coalesce(coalesce(b.not_before, $10::TIMESTAMP WITH TIME ZONE), '-infinity'::timestamptz)) AS greatest_1 
FROM unnest($11::UUID[], $12::TEXT[], $13::TEXT[], $14::INTEGER[], $15::TEXT[], $16::SMALLINT[], $17::FLOAT[], $18::TEXT[], $19::TEXT[], $20::TIMESTAMP WITH TIME ZONE[], $21::FLOAT[]) AS b(id, payload, type, max_attempts, queue, priority, timeout, concurrency_key, traceparent, not_before, delay) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.status, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.run_at, jobqueue.jobs.locked_until, jobqueue.jobs.lease_token, jobqueue.jobs.last_error, jobqueue.jobs.idempotency_key, jobqueue.jobs.created_at, jobqueue.jobs.updated_at, jobqueue.jobs.queue, jobqueue.jobs.priority, jobqueue.jobs.timeout, jobqueue.jobs.concurrency_key, jobqueue.jobs.result, jobqueue.jobs.cancel_requested_at, jobqueue.jobs.finished_at)
 SELECT grouped.id, grouped.type, grouped.payload, grouped.status, grouped.attempts, grouped.max_attempts, grouped.run_at, grouped.locked_until, grouped.lease_token, grouped.last_error, grouped.idempotency_key, grouped.created_at, grouped.updated_at, grouped.queue, grouped.priority, grouped.timeout, grouped.concurrency_key, grouped.result, grouped.cancel_requested_at, grouped.finished_at, (SELECT pg_notify('jobqueue_jobs', '') AS pg_notify_1) AS notified 
FROM grouped;

-- name: job_match_requests
-- parameters: $1 ids, $2 types, $3 payloads, $4 max_attempts, $5 keys, $6 queues, $7 priorities, $8 timeouts, $9 concurrency_keys, $10 traceparents, $11 not_befores, $12 delays
SELECT b.id AS item, jobqueue.jobs.id, jobqueue.jobs.idempotency_key, jobqueue.jobs.type = b.type AND jobqueue.jobs.payload = CAST(b.payload AS JSONB) AND jobqueue.jobs.max_attempts = b.max_attempts AND jobqueue.jobs.queue = b.queue AND jobqueue.jobs.priority = b.priority AND jobqueue.jobs.timeout IS NOT DISTINCT FROM b.timeout AND jobqueue.jobs.concurrency_key IS NOT DISTINCT FROM b.concurrency_key AS same 
FROM unnest($1::UUID[], $2::TEXT[], $3::TEXT[], $4::INTEGER[], $5::TEXT[], $6::TEXT[], $7::SMALLINT[], $8::FLOAT[], $9::TEXT[], $10::TEXT[], $11::TIMESTAMP WITH TIME ZONE[], $12::FLOAT[]) AS b(id, type, payload, max_attempts, key, queue, priority, timeout, concurrency_key, traceparent, not_before, delay) JOIN jobqueue.jobs ON jobqueue.jobs.idempotency_key = b.key;

-- name: job_get
-- parameters: $1 id
SELECT jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.status, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.run_at, jobqueue.jobs.locked_until, jobqueue.jobs.lease_token, jobqueue.jobs.last_error, jobqueue.jobs.idempotency_key, jobqueue.jobs.created_at, jobqueue.jobs.updated_at, jobqueue.jobs.queue, jobqueue.jobs.priority, jobqueue.jobs.timeout, jobqueue.jobs.concurrency_key, jobqueue.jobs.result, jobqueue.jobs.cancel_requested_at, jobqueue.jobs.finished_at, coalesce(jobqueue.jobs.errors, '[]'::jsonb) AS errors, jobqueue.jobs.leased_by 
FROM jobqueue.jobs 
WHERE jobqueue.jobs.id = $1::UUID UNION ALL SELECT jobqueue.jobs_history.id, jobqueue.jobs_history.type, jobqueue.jobs_history.payload, jobqueue.jobs_history.status, jobqueue.jobs_history.attempts, jobqueue.jobs_history.max_attempts, jobqueue.jobs_history.run_at, jobqueue.jobs_history.locked_until, jobqueue.jobs_history.lease_token, jobqueue.jobs_history.last_error, jobqueue.jobs_history.idempotency_key, jobqueue.jobs_history.created_at, jobqueue.jobs_history.updated_at, jobqueue.jobs_history.queue, jobqueue.jobs_history.priority, jobqueue.jobs_history.timeout, jobqueue.jobs_history.concurrency_key, jobqueue.jobs_history.result, jobqueue.jobs_history.cancel_requested_at, jobqueue.jobs_history.finished_at, coalesce(jobqueue.jobs_history.errors, '[]'::jsonb) AS errors, jobqueue.jobs_history.leased_by 
FROM jobqueue.jobs_history 
WHERE jobqueue.jobs_history.id = $1::UUID;

-- name: job_count_pending
-- parameters: $1 known_queues, $2 others, $3 queues, $4 caps, $5 floor_queues, $6 floor_priorities, $7 floors
WITH RECURSIVE listed AS MATERIALIZED (
    SELECT coalesce(array_agg(q ORDER BY q), '{}') AS qs
    FROM unnest(CAST($1 AS text[])) AS q
),
present(queue, i) AS (
    SELECT s.queue, s.i FROM listed CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.queue, 1 AS i FROM (
                SELECT queue FROM jobqueue.jobs WHERE status = 'pending' AND CAST($2 AS bigint) IS NOT NULL AND queue < listed.qs[1]
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT g.queue, 1 FROM (
                SELECT queue FROM jobqueue.jobs WHERE status = 'pending' AND CAST($2 AS bigint) IS NOT NULL AND listed.qs[1] IS NULL
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT listed.qs[1], 1 + 1 WHERE listed.qs[1] IS NOT NULL
        ) AS step LIMIT 1) AS s
    UNION ALL
    SELECT s.queue, s.i FROM present CROSS JOIN listed
    CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.queue, present.i AS i FROM (
                SELECT queue FROM jobqueue.jobs WHERE status = 'pending' AND CAST($2 AS bigint) IS NOT NULL AND queue > present.queue AND queue < listed.qs[present.i]
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT g.queue, present.i FROM (
                SELECT queue FROM jobqueue.jobs WHERE status = 'pending' AND CAST($2 AS bigint) IS NOT NULL AND queue > present.queue AND listed.qs[present.i] IS NULL
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT listed.qs[present.i], present.i + 1 WHERE listed.qs[present.i] IS NOT NULL
        ) AS step LIMIT 1) AS s
),
capped(queue, cap) AS (
    SELECT * FROM unnest(CAST($3 AS text[]), CAST($4 AS bigint[]))
    UNION ALL
    SELECT queue, CAST($2 AS bigint) FROM present
    WHERE queue <> ALL(CAST($3 AS text[])) AND CAST($2 AS bigint) IS NOT NULL
)
SELECT w.queue, coalesce(p.pending, 0) AS pending,
       coalesce(p.priorities, '{}') AS priorities, coalesce(p.firsts, '{}') AS firsts
FROM capped AS w
CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($5 AS text[]),
                    CAST($6 AS smallint[]),
                    CAST($7 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
    SELECT (SELECT count(*) FROM (
                SELECT 1 FROM priorities AS at CROSS JOIN LATERAL (
                    SELECT 1 FROM jobqueue.jobs
                    WHERE status = 'pending' AND queue = w.queue AND priority = at.p
                      AND run_at >= coalesce(at.f, CAST('-infinity' AS timestamptz))
                    LIMIT w.cap
                ) AS j
                LIMIT w.cap
            ) AS n) AS pending,
           array_agg(priorities.p ORDER BY priorities.p DESC) AS priorities,
           array_agg(CAST(extract(epoch FROM least((SELECT run_at FROM jobqueue.jobs
                  WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p
                    AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz))
                  ORDER BY run_at LIMIT 1), now())) * 1000000 AS bigint) ORDER BY priorities.p DESC) AS firsts
    FROM priorities
) AS p;

-- name: job_find_keys
-- parameters: $1 keys
SELECT jobqueue.jobs.idempotency_key 
FROM jobqueue.jobs 
WHERE jobqueue.jobs.idempotency_key = ANY ($1::TEXT[]);

-- name: job_notify
-- parameters: $1 param_1='jobqueue_jobs', $2 param_2=''
SELECT pg_notify($1::VARCHAR, $2::VARCHAR) AS pg_notify_1;

-- name: job_claim
-- parameters: $1 attempts_1=1, $2 lease_seconds, $3 lease_token_1=1, $4 claim, $5 holder, $6 queues, $7 slots, $8 key_limits, $9 floor_queues, $10 floor_priorities, $11 floors, $12 turn_queues, $13 turn_priorities, $14 turns, $15 overrun_queues, $16 overrun_keys, $17 overrun_counts, $18 key_lease_floor
WITH due AS MATERIALIZED 
(
SELECT c.id FROM (
    SELECT j.id, j.k_left, row_number() OVER (
               PARTITION BY w.queue, j.k ORDER BY j.p DESC, j.run_at, j.id) AS nth
    FROM unnest(CAST($6 AS text[]), CAST($7 AS integer[]),
                CAST($8 AS integer[])) AS w(queue, n, key_limit)
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($9 AS text[]),
                    CAST($10 AS smallint[]),
                    CAST($11 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT d.id, d.k, d.k_left, d.run_at, priorities.p
        FROM priorities CROSS JOIN LATERAL (
        WITH RECURSIVE last_turn AS MATERIALIZED (
            SELECT (SELECT t.k FROM unnest(CAST($12 AS text[]),
                                           CAST($13 AS smallint[]),
                                           CAST($14 AS text[])) AS t(q, p, k)
                    WHERE t.q = w.queue AND t.p = priorities.p LIMIT 1) COLLATE "C" AS c
        ), after(k, tid, present) AS (
            SELECT CASE WHEN l.c IS NULL THEN CAST('' AS text) COLLATE "C" ELSE n.k END, n.tid, true
            FROM last_turn AS l LEFT JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > l.c ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n ON true
            UNION ALL
            SELECT n.k, n.tid, true FROM after CROSS JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n
        ), wrapped(k, tid, present) AS (
            SELECT CAST('' AS text) COLLATE "C", CAST(NULL AS tid), true WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, true FROM wrapped
            CROSS JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        ), found AS MATERIALIZED (
            -- The keys in turn, read as far as the claim needs them: the first w.n, then,
            -- should some have no room, as many again and SEEN_BEYOND more.
            SELECT k, tid FROM (SELECT k, tid, present FROM after WHERE k IS NOT NULL
                                UNION ALL
                                SELECT k, tid, present FROM wrapped
                                WHERE k <= (SELECT c FROM last_turn)) AS f
            -- '' takes a turn only with a due job past its floor (read from there).
            WHERE present AND (k <> '' OR EXISTS (
                SELECT FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = '' AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now()))
            LIMIT 2 * w.n + 16
        ), ask1 AS MATERIALIZED (
            SELECT k, tid, 0 + row_number() OVER () AS nth FROM (SELECT k, tid FROM found LIMIT w.n) AS f
        ), room1 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($15 AS text[]),
                               CAST($16 AS text[]),
                               CAST($17 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST(w.n AS integer) - (SELECT count(*) FROM ask1
                                                    WHERE k = '')::integer AS wanted
                FROM ask1 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($18 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen1 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room1 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask1 AS a
        ), short AS MATERIALIZED (
            -- The keys of the first w.n without room: as many keys with room are looked for
            -- among the next m + SEEN_BEYOND.
            SELECT count(*) AS m FROM seen1 WHERE k_left <= 0
        ), ask2 AS MATERIALIZED (
            SELECT k, tid, w.n + row_number() OVER () AS nth FROM (SELECT k, tid FROM found OFFSET w.n LIMIT (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short)) AS f
        ), room2 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($15 AS text[]),
                               CAST($16 AS text[]),
                               CAST($17 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST((SELECT m FROM short) AS integer) - (SELECT count(*) FROM ask2
                                                    WHERE k = '')::integer AS wanted
                FROM ask2 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($18 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen2 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room2 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask2 AS a
        ), keys AS MATERIALIZED (
            SELECT k, tid, k_left FROM (SELECT * FROM seen1 UNION ALL SELECT * FROM seen2) AS s
            WHERE k_left > 0 ORDER BY nth LIMIT w.n
        ), shares AS MATERIALIZED (
            SELECT k, tid, k_left,
                   least(ceil(w.n / (SELECT count(*) FROM keys)::float8)::integer, k_left)
                   AS share
            FROM keys
        ), by_tid AS MATERIALIZED (
            SELECT shares.k, shares.share, shares.k_left, j.id, j.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE ctid = shares.tid AND status = 'pending' AND queue = w.queue AND priority = priorities.p AND run_at <= now()
                FOR UPDATE SKIP LOCKED
            ) AS j
            WHERE shares.share = 1 AND shares.tid IS NOT NULL
        ), first AS MATERIALIZED (
            SELECT k, share, k_left, id, run_at FROM by_tid UNION ALL
            SELECT shares.k, shares.share, shares.k_left, f.id, f.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = shares.k
                  AND run_at >= CASE WHEN shares.k = '' THEN coalesce(priorities.f, CAST('-infinity' AS timestamptz)) ELSE CAST('-infinity' AS timestamptz) END
                  AND run_at <= now()
                ORDER BY run_at, id LIMIT shares.share FOR UPDATE SKIP LOCKED
            ) AS f
            WHERE shares.share > 1 OR shares.tid IS NULL OR NOT EXISTS (SELECT FROM by_tid WHERE by_tid.k = shares.k)
        ), filled AS MATERIALIZED (
            -- Only when every key had its turn (fewer keys with room than slots, and every
            -- key seen): a key not reached yet comes before a second turn of one that was.
            SELECT k, k_left, count(*) AS taken, max(run_at) AS last_run_at,
                   (array_agg(id ORDER BY run_at DESC, id DESC))[1] AS last_id
            FROM first WHERE (SELECT count(*) FROM keys) < w.n
                         AND ((SELECT count(*) FROM seen1) < w.n
                              OR (SELECT count(*) FROM seen2) < (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short))
            GROUP BY k, share, k_left
            HAVING count(*) = share AND count(*) < k_left
        ), more AS MATERIALIZED (
            SELECT m.id, filled.k, filled.k_left, m.run_at FROM filled CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = filled.k
                  AND (run_at, id) > (filled.last_run_at, filled.last_id)
                  AND run_at <= now()
                ORDER BY run_at, id
                LIMIT least(filled.k_left - filled.taken,
                            ceil((w.n - (SELECT count(*) FROM first))
                                 / (SELECT count(*) FROM filled)::float8)::integer)
                FOR UPDATE SKIP LOCKED
            ) AS m
            LIMIT greatest(w.n - (SELECT count(*) FROM first), 0)
        )
        SELECT id, k, k_left, run_at FROM first
        UNION ALL SELECT id, k, k_left, run_at FROM more
        ) AS d
        WHERE priorities.p IS NOT NULL
        LIMIT w.n
    ) AS j
) AS c
WHERE c.nth <= c.k_left AND (
    SELECT count(pg_advisory_xact_lock_shared(l.k)) FROM (
        SELECT DISTINCT hashtextextended('jobqueue.keys:' || q.queue, 0) AS k
        FROM unnest(CAST($6 AS text[]), CAST($8 AS integer[])) AS q(queue, n)
        WHERE q.n IS NOT NULL
        ORDER BY k
    ) AS l) >= 0)
 UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $1::INTEGER), locked_until=(now() + $2::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $3::BIGINT), claim_id=$4::UUID, leased_by=$5::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key;

-- name: job_claim_unlimited
-- parameters: $1 attempts_1=1, $2 lease_seconds, $3 lease_token_1=1, $4 claim, $5 holder, $6 queues, $7 slots, $8 key_limits, $9 floor_queues, $10 floor_priorities, $11 floors, $12 turn_queues, $13 turn_priorities, $14 turns, $15 limited, $16 overrun_queues, $17 overrun_keys, $18 overrun_counts, $19 key_lease_floor
WITH due AS MATERIALIZED 
(
SELECT c.id FROM (
    SELECT j.id, j.k_left, row_number() OVER (
               PARTITION BY w.queue, j.k ORDER BY j.p DESC, j.run_at, j.id) AS nth
    FROM unnest(CAST($6 AS text[]), CAST($7 AS integer[]),
                CAST($8 AS integer[])) AS w(queue, n, key_limit)
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($9 AS text[]),
                    CAST($10 AS smallint[]),
                    CAST($11 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT d.id, d.k, d.k_left, d.run_at, priorities.p
        FROM priorities CROSS JOIN LATERAL (
        WITH RECURSIVE last_turn AS MATERIALIZED (
            SELECT (SELECT t.k FROM unnest(CAST($12 AS text[]),
                                           CAST($13 AS smallint[]),
                                           CAST($14 AS text[])) AS t(q, p, k)
                    WHERE t.q = w.queue AND t.p = priorities.p LIMIT 1) COLLATE "C" AS c
        ), after(k, tid, present) AS (
            SELECT CASE WHEN l.c IS NULL THEN CAST('' AS text) COLLATE "C" ELSE n.k END, n.tid, true
            FROM last_turn AS l LEFT JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > l.c ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n ON true
            UNION ALL
            SELECT n.k, n.tid, true FROM after CROSS JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n
        ), wrapped(k, tid, present) AS (
            SELECT CAST('' AS text) COLLATE "C", CAST(NULL AS tid), true WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, true FROM wrapped
            CROSS JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        ), found AS MATERIALIZED (
            -- The keys in turn, read as far as the claim needs them: the first w.n, then,
            -- should some have no room, as many again and SEEN_BEYOND more.
            SELECT k, tid FROM (SELECT k, tid, present FROM after WHERE k IS NOT NULL
                                UNION ALL
                                SELECT k, tid, present FROM wrapped
                                WHERE k <= (SELECT c FROM last_turn)) AS f
            -- '' takes a turn only with a due job past its floor (read from there).
            WHERE present AND (k <> '' OR EXISTS (
                SELECT FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = '' AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now() AND type <> ALL(CAST($15 AS text[]))))
            LIMIT 2 * w.n + 16
        ), ask1 AS MATERIALIZED (
            SELECT k, tid, 0 + row_number() OVER () AS nth FROM (SELECT k, tid FROM found LIMIT w.n) AS f
        ), room1 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($16 AS text[]),
                               CAST($17 AS text[]),
                               CAST($18 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST(w.n AS integer) - (SELECT count(*) FROM ask1
                                                    WHERE k = '')::integer AS wanted
                FROM ask1 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($19 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen1 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room1 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask1 AS a
        ), short AS MATERIALIZED (
            -- The keys of the first w.n without room: as many keys with room are looked for
            -- among the next m + SEEN_BEYOND.
            SELECT count(*) AS m FROM seen1 WHERE k_left <= 0
        ), ask2 AS MATERIALIZED (
            SELECT k, tid, w.n + row_number() OVER () AS nth FROM (SELECT k, tid FROM found OFFSET w.n LIMIT (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short)) AS f
        ), room2 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($16 AS text[]),
                               CAST($17 AS text[]),
                               CAST($18 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST((SELECT m FROM short) AS integer) - (SELECT count(*) FROM ask2
                                                    WHERE k = '')::integer AS wanted
                FROM ask2 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($19 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen2 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room2 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask2 AS a
        ), keys AS MATERIALIZED (
            SELECT k, tid, k_left FROM (SELECT * FROM seen1 UNION ALL SELECT * FROM seen2) AS s
            WHERE k_left > 0 ORDER BY nth LIMIT w.n
        ), shares AS MATERIALIZED (
            SELECT k, tid, k_left,
                   least(ceil(w.n / (SELECT count(*) FROM keys)::float8)::integer, k_left)
                   AS share
            FROM keys
        ), first AS MATERIALIZED (
            
            SELECT shares.k, shares.share, shares.k_left, f.id, f.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = shares.k
                  AND run_at >= CASE WHEN shares.k = '' THEN coalesce(priorities.f, CAST('-infinity' AS timestamptz)) ELSE CAST('-infinity' AS timestamptz) END
                  AND run_at <= now() AND type <> ALL(CAST($15 AS text[]))
                ORDER BY run_at, id LIMIT shares.share FOR UPDATE SKIP LOCKED
            ) AS f
            
        ), filled AS MATERIALIZED (
            -- Only when every key had its turn (fewer keys with room than slots, and every
            -- key seen): a key not reached yet comes before a second turn of one that was.
            SELECT k, k_left, count(*) AS taken, max(run_at) AS last_run_at,
                   (array_agg(id ORDER BY run_at DESC, id DESC))[1] AS last_id
            FROM first WHERE (SELECT count(*) FROM keys) < w.n
                         AND ((SELECT count(*) FROM seen1) < w.n
                              OR (SELECT count(*) FROM seen2) < (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short))
            GROUP BY k, share, k_left
            HAVING count(*) = share AND count(*) < k_left
        ), more AS MATERIALIZED (
            SELECT m.id, filled.k, filled.k_left, m.run_at FROM filled CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = filled.k
                  AND (run_at, id) > (filled.last_run_at, filled.last_id)
                  AND run_at <= now() AND type <> ALL(CAST($15 AS text[]))
                ORDER BY run_at, id
                LIMIT least(filled.k_left - filled.taken,
                            ceil((w.n - (SELECT count(*) FROM first))
                                 / (SELECT count(*) FROM filled)::float8)::integer)
                FOR UPDATE SKIP LOCKED
            ) AS m
            LIMIT greatest(w.n - (SELECT count(*) FROM first), 0)
        )
        SELECT id, k, k_left, run_at FROM first
        UNION ALL SELECT id, k, k_left, run_at FROM more
        ) AS d
        WHERE priorities.p IS NOT NULL
        LIMIT w.n
    ) AS j
) AS c
WHERE c.nth <= c.k_left AND (
    SELECT count(pg_advisory_xact_lock_shared(l.k)) FROM (
        SELECT DISTINCT hashtextextended('jobqueue.keys:' || q.queue, 0) AS k
        FROM unnest(CAST($6 AS text[]), CAST($8 AS integer[])) AS q(queue, n)
        WHERE q.n IS NOT NULL
        ORDER BY k
    ) AS l) >= 0)
 UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $1::INTEGER), locked_until=(now() + $2::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $3::BIGINT), claim_id=$4::UUID, leased_by=$5::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key;

-- name: job_complete_and_claim
-- parameters: $1 ids, $2 tokens, $3 results, $4 attempts_1=1, $5 lease_seconds, $6 lease_token_1=1, $7 claim, $8 holder, $9 queues, $10 slots, $11 key_limits, $12 floor_queues, $13 floor_priorities, $14 floors, $15 turn_queues, $16 turn_priorities, $17 turns, $18 overrun_queues, $19 overrun_keys, $20 overrun_counts, $21 key_lease_floor
WITH done AS 
(UPDATE jobqueue.jobs SET status='completed', locked_until=NULL, last_error=NULL, result=CAST(o.result AS JSONB), finished_at=now(), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[]) AS o(id, token, result) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke), 
due AS MATERIALIZED 
(
SELECT c.id FROM (
    SELECT j.id, j.k_left, row_number() OVER (
               PARTITION BY w.queue, j.k ORDER BY j.p DESC, j.run_at, j.id) AS nth
    FROM unnest(CAST($9 AS text[]), CAST($10 AS integer[]),
                CAST($11 AS integer[])) AS w(queue, n, key_limit)
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($12 AS text[]),
                    CAST($13 AS smallint[]),
                    CAST($14 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT d.id, d.k, d.k_left, d.run_at, priorities.p
        FROM priorities CROSS JOIN LATERAL (
        WITH RECURSIVE last_turn AS MATERIALIZED (
            SELECT (SELECT t.k FROM unnest(CAST($15 AS text[]),
                                           CAST($16 AS smallint[]),
                                           CAST($17 AS text[])) AS t(q, p, k)
                    WHERE t.q = w.queue AND t.p = priorities.p LIMIT 1) COLLATE "C" AS c
        ), after(k, tid, present) AS (
            SELECT CASE WHEN l.c IS NULL THEN CAST('' AS text) COLLATE "C" ELSE n.k END, n.tid, true
            FROM last_turn AS l LEFT JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > l.c ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n ON true
            UNION ALL
            SELECT n.k, n.tid, true FROM after CROSS JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n
        ), wrapped(k, tid, present) AS (
            SELECT CAST('' AS text) COLLATE "C", CAST(NULL AS tid), true WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, true FROM wrapped
            CROSS JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        ), found AS MATERIALIZED (
            -- The keys in turn, read as far as the claim needs them: the first w.n, then,
            -- should some have no room, as many again and SEEN_BEYOND more.
            SELECT k, tid FROM (SELECT k, tid, present FROM after WHERE k IS NOT NULL
                                UNION ALL
                                SELECT k, tid, present FROM wrapped
                                WHERE k <= (SELECT c FROM last_turn)) AS f
            -- '' takes a turn only with a due job past its floor (read from there).
            WHERE present AND (k <> '' OR EXISTS (
                SELECT FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = '' AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now()))
            LIMIT 2 * w.n + 16
        ), ask1 AS MATERIALIZED (
            SELECT k, tid, 0 + row_number() OVER () AS nth FROM (SELECT k, tid FROM found LIMIT w.n) AS f
        ), room1 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($18 AS text[]),
                               CAST($19 AS text[]),
                               CAST($20 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST(w.n AS integer) - (SELECT count(*) FROM ask1
                                                    WHERE k = '')::integer AS wanted
                FROM ask1 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($21 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen1 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room1 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask1 AS a
        ), short AS MATERIALIZED (
            -- The keys of the first w.n without room: as many keys with room are looked for
            -- among the next m + SEEN_BEYOND.
            SELECT count(*) AS m FROM seen1 WHERE k_left <= 0
        ), ask2 AS MATERIALIZED (
            SELECT k, tid, w.n + row_number() OVER () AS nth FROM (SELECT k, tid FROM found OFFSET w.n LIMIT (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short)) AS f
        ), room2 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($18 AS text[]),
                               CAST($19 AS text[]),
                               CAST($20 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST((SELECT m FROM short) AS integer) - (SELECT count(*) FROM ask2
                                                    WHERE k = '')::integer AS wanted
                FROM ask2 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($21 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen2 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room2 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask2 AS a
        ), keys AS MATERIALIZED (
            SELECT k, tid, k_left FROM (SELECT * FROM seen1 UNION ALL SELECT * FROM seen2) AS s
            WHERE k_left > 0 ORDER BY nth LIMIT w.n
        ), shares AS MATERIALIZED (
            SELECT k, tid, k_left,
                   least(ceil(w.n / (SELECT count(*) FROM keys)::float8)::integer, k_left)
                   AS share
            FROM keys
        ), by_tid AS MATERIALIZED (
            SELECT shares.k, shares.share, shares.k_left, j.id, j.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE ctid = shares.tid AND status = 'pending' AND queue = w.queue AND priority = priorities.p AND run_at <= now()
                FOR UPDATE SKIP LOCKED
            ) AS j
            WHERE shares.share = 1 AND shares.tid IS NOT NULL
        ), first AS MATERIALIZED (
            SELECT k, share, k_left, id, run_at FROM by_tid UNION ALL
            SELECT shares.k, shares.share, shares.k_left, f.id, f.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = shares.k
                  AND run_at >= CASE WHEN shares.k = '' THEN coalesce(priorities.f, CAST('-infinity' AS timestamptz)) ELSE CAST('-infinity' AS timestamptz) END
                  AND run_at <= now()
                ORDER BY run_at, id LIMIT shares.share FOR UPDATE SKIP LOCKED
            ) AS f
            WHERE shares.share > 1 OR shares.tid IS NULL OR NOT EXISTS (SELECT FROM by_tid WHERE by_tid.k = shares.k)
        ), filled AS MATERIALIZED (
            -- Only when every key had its turn (fewer keys with room than slots, and every
            -- key seen): a key not reached yet comes before a second turn of one that was.
            SELECT k, k_left, count(*) AS taken, max(run_at) AS last_run_at,
                   (array_agg(id ORDER BY run_at DESC, id DESC))[1] AS last_id
            FROM first WHERE (SELECT count(*) FROM keys) < w.n
                         AND ((SELECT count(*) FROM seen1) < w.n
                              OR (SELECT count(*) FROM seen2) < (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short))
            GROUP BY k, share, k_left
            HAVING count(*) = share AND count(*) < k_left
        ), more AS MATERIALIZED (
            SELECT m.id, filled.k, filled.k_left, m.run_at FROM filled CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = filled.k
                  AND (run_at, id) > (filled.last_run_at, filled.last_id)
                  AND run_at <= now()
                ORDER BY run_at, id
                LIMIT least(filled.k_left - filled.taken,
                            ceil((w.n - (SELECT count(*) FROM first))
                                 / (SELECT count(*) FROM filled)::float8)::integer)
                FOR UPDATE SKIP LOCKED
            ) AS m
            LIMIT greatest(w.n - (SELECT count(*) FROM first), 0)
        )
        SELECT id, k, k_left, run_at FROM first
        UNION ALL SELECT id, k, k_left, run_at FROM more
        ) AS d
        WHERE priorities.p IS NOT NULL
        LIMIT w.n
    ) AS j
) AS c
WHERE c.nth <= c.k_left AND (
    SELECT count(pg_advisory_xact_lock_shared(l.k)) FROM (
        SELECT DISTINCT hashtextextended('jobqueue.keys:' || q.queue, 0) AS k
        FROM unnest(CAST($9 AS text[]), CAST($11 AS integer[])) AS q(queue, n)
        WHERE q.n IS NOT NULL
        ORDER BY k
    ) AS l) >= 0), 
claimed AS 
(UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $4::INTEGER), locked_until=(now() + $5::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $6::BIGINT), claim_id=$7::UUID, leased_by=$8::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key)
 SELECT true AS completed, done.id, CAST(NULL AS TEXT) AS type, CAST(NULL AS JSONB) AS payload, CAST(NULL AS INTEGER) AS attempts, CAST(NULL AS INTEGER) AS max_attempts, done.lease_token, CAST(NULL AS TEXT) AS queue, CAST(NULL AS FLOAT) AS timeout, CAST(NULL AS TEXT) AS traceparent, CAST(NULL AS SMALLINT) AS priority, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS run_at, CAST(NULL AS TEXT) COLLATE "C" AS concurrency_key 
FROM done UNION ALL SELECT false AS anon_1, claimed.id, claimed.type, claimed.payload, claimed.attempts, claimed.max_attempts, claimed.lease_token, claimed.queue, claimed.timeout, claimed.traceparent, claimed.priority, claimed.run_at, claimed.concurrency_key 
FROM claimed;

-- name: job_complete_and_claim_unlimited
-- parameters: $1 ids, $2 tokens, $3 results, $4 attempts_1=1, $5 lease_seconds, $6 lease_token_1=1, $7 claim, $8 holder, $9 queues, $10 slots, $11 key_limits, $12 floor_queues, $13 floor_priorities, $14 floors, $15 turn_queues, $16 turn_priorities, $17 turns, $18 limited, $19 overrun_queues, $20 overrun_keys, $21 overrun_counts, $22 key_lease_floor
WITH done AS 
(UPDATE jobqueue.jobs SET status='completed', locked_until=NULL, last_error=NULL, result=CAST(o.result AS JSONB), finished_at=now(), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[]) AS o(id, token, result) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke), 
due AS MATERIALIZED 
(
SELECT c.id FROM (
    SELECT j.id, j.k_left, row_number() OVER (
               PARTITION BY w.queue, j.k ORDER BY j.p DESC, j.run_at, j.id) AS nth
    FROM unnest(CAST($9 AS text[]), CAST($10 AS integer[]),
                CAST($11 AS integer[])) AS w(queue, n, key_limit)
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($12 AS text[]),
                    CAST($13 AS smallint[]),
                    CAST($14 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT d.id, d.k, d.k_left, d.run_at, priorities.p
        FROM priorities CROSS JOIN LATERAL (
        WITH RECURSIVE last_turn AS MATERIALIZED (
            SELECT (SELECT t.k FROM unnest(CAST($15 AS text[]),
                                           CAST($16 AS smallint[]),
                                           CAST($17 AS text[])) AS t(q, p, k)
                    WHERE t.q = w.queue AND t.p = priorities.p LIMIT 1) COLLATE "C" AS c
        ), after(k, tid, present) AS (
            SELECT CASE WHEN l.c IS NULL THEN CAST('' AS text) COLLATE "C" ELSE n.k END, n.tid, true
            FROM last_turn AS l LEFT JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > l.c ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n ON true
            UNION ALL
            SELECT n.k, n.tid, true FROM after CROSS JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n
        ), wrapped(k, tid, present) AS (
            SELECT CAST('' AS text) COLLATE "C", CAST(NULL AS tid), true WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, true FROM wrapped
            CROSS JOIN LATERAL (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        ), found AS MATERIALIZED (
            -- The keys in turn, read as far as the claim needs them: the first w.n, then,
            -- should some have no room, as many again and SEEN_BEYOND more.
            SELECT k, tid FROM (SELECT k, tid, present FROM after WHERE k IS NOT NULL
                                UNION ALL
                                SELECT k, tid, present FROM wrapped
                                WHERE k <= (SELECT c FROM last_turn)) AS f
            -- '' takes a turn only with a due job past its floor (read from there).
            WHERE present AND (k <> '' OR EXISTS (
                SELECT FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = '' AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now() AND type <> ALL(CAST($18 AS text[]))))
            LIMIT 2 * w.n + 16
        ), ask1 AS MATERIALIZED (
            SELECT k, tid, 0 + row_number() OVER () AS nth FROM (SELECT k, tid FROM found LIMIT w.n) AS f
        ), room1 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($19 AS text[]),
                               CAST($20 AS text[]),
                               CAST($21 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST(w.n AS integer) - (SELECT count(*) FROM ask1
                                                    WHERE k = '')::integer AS wanted
                FROM ask1 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($22 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen1 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room1 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask1 AS a
        ), short AS MATERIALIZED (
            -- The keys of the first w.n without room: as many keys with room are looked for
            -- among the next m + SEEN_BEYOND.
            SELECT count(*) AS m FROM seen1 WHERE k_left <= 0
        ), ask2 AS MATERIALIZED (
            SELECT k, tid, w.n + row_number() OVER () AS nth FROM (SELECT k, tid FROM found OFFSET w.n LIMIT (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short)) AS f
        ), room2 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($19 AS text[]),
                               CAST($20 AS text[]),
                               CAST($21 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST((SELECT m FROM short) AS integer) - (SELECT count(*) FROM ask2
                                                    WHERE k = '')::integer AS wanted
                FROM ask2 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($22 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen2 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room2 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask2 AS a
        ), keys AS MATERIALIZED (
            SELECT k, tid, k_left FROM (SELECT * FROM seen1 UNION ALL SELECT * FROM seen2) AS s
            WHERE k_left > 0 ORDER BY nth LIMIT w.n
        ), shares AS MATERIALIZED (
            SELECT k, tid, k_left,
                   least(ceil(w.n / (SELECT count(*) FROM keys)::float8)::integer, k_left)
                   AS share
            FROM keys
        ), first AS MATERIALIZED (
            
            SELECT shares.k, shares.share, shares.k_left, f.id, f.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = shares.k
                  AND run_at >= CASE WHEN shares.k = '' THEN coalesce(priorities.f, CAST('-infinity' AS timestamptz)) ELSE CAST('-infinity' AS timestamptz) END
                  AND run_at <= now() AND type <> ALL(CAST($18 AS text[]))
                ORDER BY run_at, id LIMIT shares.share FOR UPDATE SKIP LOCKED
            ) AS f
            
        ), filled AS MATERIALIZED (
            -- Only when every key had its turn (fewer keys with room than slots, and every
            -- key seen): a key not reached yet comes before a second turn of one that was.
            SELECT k, k_left, count(*) AS taken, max(run_at) AS last_run_at,
                   (array_agg(id ORDER BY run_at DESC, id DESC))[1] AS last_id
            FROM first WHERE (SELECT count(*) FROM keys) < w.n
                         AND ((SELECT count(*) FROM seen1) < w.n
                              OR (SELECT count(*) FROM seen2) < (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short))
            GROUP BY k, share, k_left
            HAVING count(*) = share AND count(*) < k_left
        ), more AS MATERIALIZED (
            SELECT m.id, filled.k, filled.k_left, m.run_at FROM filled CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = filled.k
                  AND (run_at, id) > (filled.last_run_at, filled.last_id)
                  AND run_at <= now() AND type <> ALL(CAST($18 AS text[]))
                ORDER BY run_at, id
                LIMIT least(filled.k_left - filled.taken,
                            ceil((w.n - (SELECT count(*) FROM first))
                                 / (SELECT count(*) FROM filled)::float8)::integer)
                FOR UPDATE SKIP LOCKED
            ) AS m
            LIMIT greatest(w.n - (SELECT count(*) FROM first), 0)
        )
        SELECT id, k, k_left, run_at FROM first
        UNION ALL SELECT id, k, k_left, run_at FROM more
        ) AS d
        WHERE priorities.p IS NOT NULL
        LIMIT w.n
    ) AS j
) AS c
WHERE c.nth <= c.k_left AND (
    SELECT count(pg_advisory_xact_lock_shared(l.k)) FROM (
        SELECT DISTINCT hashtextextended('jobqueue.keys:' || q.queue, 0) AS k
        FROM unnest(CAST($9 AS text[]), CAST($11 AS integer[])) AS q(queue, n)
        WHERE q.n IS NOT NULL
        ORDER BY k
    ) AS l) >= 0), 
claimed AS 
(UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $4::INTEGER), locked_until=(now() + $5::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $6::BIGINT), claim_id=$7::UUID, leased_by=$8::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key)
 SELECT true AS completed, done.id, CAST(NULL AS TEXT) AS type, CAST(NULL AS JSONB) AS payload, CAST(NULL AS INTEGER) AS attempts, CAST(NULL AS INTEGER) AS max_attempts, done.lease_token, CAST(NULL AS TEXT) AS queue, CAST(NULL AS FLOAT) AS timeout, CAST(NULL AS TEXT) AS traceparent, CAST(NULL AS SMALLINT) AS priority, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS run_at, CAST(NULL AS TEXT) COLLATE "C" AS concurrency_key 
FROM done UNION ALL SELECT false AS anon_1, claimed.id, claimed.type, claimed.payload, claimed.attempts, claimed.max_attempts, claimed.lease_token, claimed.queue, claimed.timeout, claimed.traceparent, claimed.priority, claimed.run_at, claimed.concurrency_key 
FROM claimed;

-- name: job_claim_key_floors
-- parameters: $1 attempts_1=1, $2 lease_seconds, $3 lease_token_1=1, $4 claim, $5 holder, $6 queues, $7 slots, $8 key_limits, $9 floor_queues, $10 floor_priorities, $11 floors, $12 turn_queues, $13 turn_priorities, $14 turns, $15 key_floor_queues, $16 key_floor_priorities, $17 key_floor_keys, $18 key_floors, $19 overrun_queues, $20 overrun_keys, $21 overrun_counts, $22 key_lease_floor
WITH due AS MATERIALIZED 
(
SELECT c.id FROM (
    SELECT j.id, j.k_left, row_number() OVER (
               PARTITION BY w.queue, j.k ORDER BY j.p DESC, j.run_at, j.id) AS nth
    FROM unnest(CAST($6 AS text[]), CAST($7 AS integer[]),
                CAST($8 AS integer[])) AS w(queue, n, key_limit)
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($9 AS text[]),
                    CAST($10 AS smallint[]),
                    CAST($11 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT d.id, d.k, d.k_left, d.run_at, priorities.p
        FROM priorities CROSS JOIN LATERAL (
        WITH RECURSIVE last_turn AS MATERIALIZED (
            SELECT (SELECT t.k FROM unnest(CAST($12 AS text[]),
                                           CAST($13 AS smallint[]),
                                           CAST($14 AS text[])) AS t(q, p, k)
                    WHERE t.q = w.queue AND t.p = priorities.p LIMIT 1) COLLATE "C" AS c
        ), known_keys AS MATERIALIZED (
            SELECT coalesce(array_agg(x.k ORDER BY x.k COLLATE "C"), '{}') AS ks,
                   coalesce(array_agg(CAST('epoch' AS timestamptz) + x.f * INTERVAL '1 microsecond'
                                      ORDER BY x.k COLLATE "C"), '{}') AS fs
            FROM unnest(CAST($15 AS text[]),
                        CAST($16 AS smallint[]),
                        CAST($17 AS text[]) COLLATE "C",
                        CAST($18 AS bigint[])) AS x(q, p, k, f)
            WHERE x.q = w.queue AND x.p = priorities.p
        ), after(k, tid, i, present) AS (
            -- From '' (present), or from the last turn's key (served: not in this turn).
            SELECT coalesce(l.c, CAST('' AS text) COLLATE "C"), CAST(NULL AS tid),
                   (SELECT coalesce(min(n), cardinality(known_keys.ks) + 1) FROM unnest(known_keys.ks) WITH ORDINALITY AS u(k, n) WHERE u.k > coalesce(l.c, CAST('' AS text) COLLATE "C") COLLATE "C"), l.c IS NULL
            FROM last_turn AS l CROSS JOIN known_keys
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM after CROSS JOIN known_keys
            CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.k, g.tid, after.i AS i, true AS present FROM (
                SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k AND coalesce(concurrency_key, '') < known_keys.ks[after.i] AND known_keys.ks[after.i] IS NOT NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT g.k, g.tid, after.i, true FROM (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k AND known_keys.ks[after.i] IS NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT known_keys.ks[after.i], t.tid, after.i + 1, t.tid IS NOT NULL
            FROM (SELECT) AS one LEFT JOIN (
                SELECT ctid AS tid FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = known_keys.ks[after.i] AND run_at >= known_keys.fs[after.i]
                ORDER BY run_at, id LIMIT 1) AS t ON true
            WHERE known_keys.ks[after.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
        ), wrapped(k, tid, i, present) AS (
            SELECT CAST('' AS text) COLLATE "C", CAST(NULL AS tid), 1, true
            WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM wrapped CROSS JOIN known_keys
            CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.k, g.tid, wrapped.i AS i, true AS present FROM (
                SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k AND coalesce(concurrency_key, '') < known_keys.ks[wrapped.i] AND known_keys.ks[wrapped.i] IS NOT NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT g.k, g.tid, wrapped.i, true FROM (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k AND known_keys.ks[wrapped.i] IS NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT known_keys.ks[wrapped.i], t.tid, wrapped.i + 1, t.tid IS NOT NULL
            FROM (SELECT) AS one LEFT JOIN (
                SELECT ctid AS tid FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = known_keys.ks[wrapped.i] AND run_at >= known_keys.fs[wrapped.i]
                ORDER BY run_at, id LIMIT 1) AS t ON true
            WHERE known_keys.ks[wrapped.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        ), found AS MATERIALIZED (
            -- The keys in turn, read as far as the claim needs them: the first w.n, then,
            -- should some have no room, as many again and SEEN_BEYOND more.
            SELECT k, tid FROM (SELECT k, tid, present FROM after WHERE k IS NOT NULL
                                UNION ALL
                                SELECT k, tid, present FROM wrapped
                                WHERE k <= (SELECT c FROM last_turn)) AS f
            -- '' takes a turn only with a due job past its floor (read from there).
            WHERE present AND (k <> '' OR EXISTS (
                SELECT FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = '' AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now()))
            LIMIT 2 * w.n + 16
        ), ask1 AS MATERIALIZED (
            SELECT k, tid, 0 + row_number() OVER () AS nth FROM (SELECT k, tid FROM found LIMIT w.n) AS f
        ), room1 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($19 AS text[]),
                               CAST($20 AS text[]),
                               CAST($21 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST(w.n AS integer) - (SELECT count(*) FROM ask1
                                                    WHERE k = '')::integer AS wanted
                FROM ask1 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($22 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen1 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room1 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask1 AS a
        ), short AS MATERIALIZED (
            -- The keys of the first w.n without room: as many keys with room are looked for
            -- among the next m + SEEN_BEYOND.
            SELECT count(*) AS m FROM seen1 WHERE k_left <= 0
        ), ask2 AS MATERIALIZED (
            SELECT k, tid, w.n + row_number() OVER () AS nth FROM (SELECT k, tid FROM found OFFSET w.n LIMIT (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short)) AS f
        ), room2 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($19 AS text[]),
                               CAST($20 AS text[]),
                               CAST($21 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST((SELECT m FROM short) AS integer) - (SELECT count(*) FROM ask2
                                                    WHERE k = '')::integer AS wanted
                FROM ask2 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($22 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen2 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room2 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask2 AS a
        ), keys AS MATERIALIZED (
            SELECT k, tid, k_left FROM (SELECT * FROM seen1 UNION ALL SELECT * FROM seen2) AS s
            WHERE k_left > 0 ORDER BY nth LIMIT w.n
        ), shares AS MATERIALIZED (
            SELECT k, tid, k_left,
                   least(ceil(w.n / (SELECT count(*) FROM keys)::float8)::integer, k_left)
                   AS share
            FROM keys
        ), by_tid AS MATERIALIZED (
            SELECT shares.k, shares.share, shares.k_left, j.id, j.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE ctid = shares.tid AND status = 'pending' AND queue = w.queue AND priority = priorities.p AND run_at <= now()
                FOR UPDATE SKIP LOCKED
            ) AS j
            WHERE shares.share = 1 AND shares.tid IS NOT NULL
        ), first AS MATERIALIZED (
            SELECT k, share, k_left, id, run_at FROM by_tid UNION ALL
            SELECT shares.k, shares.share, shares.k_left, f.id, f.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = shares.k
                  AND run_at >= CASE WHEN shares.k = '' THEN coalesce(priorities.f, CAST('-infinity' AS timestamptz)) ELSE (SELECT coalesce(known_keys.fs[array_position(known_keys.ks, shares.k)], CAST('-infinity' AS timestamptz)) FROM known_keys) END
                  AND run_at <= now()
                ORDER BY run_at, id LIMIT shares.share FOR UPDATE SKIP LOCKED
            ) AS f
            WHERE shares.share > 1 OR shares.tid IS NULL OR NOT EXISTS (SELECT FROM by_tid WHERE by_tid.k = shares.k)
        ), filled AS MATERIALIZED (
            -- Only when every key had its turn (fewer keys with room than slots, and every
            -- key seen): a key not reached yet comes before a second turn of one that was.
            SELECT k, k_left, count(*) AS taken, max(run_at) AS last_run_at,
                   (array_agg(id ORDER BY run_at DESC, id DESC))[1] AS last_id
            FROM first WHERE (SELECT count(*) FROM keys) < w.n
                         AND ((SELECT count(*) FROM seen1) < w.n
                              OR (SELECT count(*) FROM seen2) < (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short))
            GROUP BY k, share, k_left
            HAVING count(*) = share AND count(*) < k_left
        ), more AS MATERIALIZED (
            SELECT m.id, filled.k, filled.k_left, m.run_at FROM filled CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = filled.k
                  AND (run_at, id) > (filled.last_run_at, filled.last_id)
                  AND run_at <= now()
                ORDER BY run_at, id
                LIMIT least(filled.k_left - filled.taken,
                            ceil((w.n - (SELECT count(*) FROM first))
                                 / (SELECT count(*) FROM filled)::float8)::integer)
                FOR UPDATE SKIP LOCKED
            ) AS m
            LIMIT greatest(w.n - (SELECT count(*) FROM first), 0)
        )
        SELECT id, k, k_left, run_at FROM first
        UNION ALL SELECT id, k, k_left, run_at FROM more
        ) AS d
        WHERE priorities.p IS NOT NULL
        LIMIT w.n
    ) AS j
) AS c
WHERE c.nth <= c.k_left AND (
    SELECT count(pg_advisory_xact_lock_shared(l.k)) FROM (
        SELECT DISTINCT hashtextextended('jobqueue.keys:' || q.queue, 0) AS k
        FROM unnest(CAST($6 AS text[]), CAST($8 AS integer[])) AS q(queue, n)
        WHERE q.n IS NOT NULL
        ORDER BY k
    ) AS l) >= 0)
 UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $1::INTEGER), locked_until=(now() + $2::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $3::BIGINT), claim_id=$4::UUID, leased_by=$5::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key;

-- name: job_complete_and_claim_key_floors
-- parameters: $1 ids, $2 tokens, $3 results, $4 attempts_1=1, $5 lease_seconds, $6 lease_token_1=1, $7 claim, $8 holder, $9 queues, $10 slots, $11 key_limits, $12 floor_queues, $13 floor_priorities, $14 floors, $15 turn_queues, $16 turn_priorities, $17 turns, $18 key_floor_queues, $19 key_floor_priorities, $20 key_floor_keys, $21 key_floors, $22 overrun_queues, $23 overrun_keys, $24 overrun_counts, $25 key_lease_floor
WITH done AS 
(UPDATE jobqueue.jobs SET status='completed', locked_until=NULL, last_error=NULL, result=CAST(o.result AS JSONB), finished_at=now(), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[]) AS o(id, token, result) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke), 
due AS MATERIALIZED 
(
SELECT c.id FROM (
    SELECT j.id, j.k_left, row_number() OVER (
               PARTITION BY w.queue, j.k ORDER BY j.p DESC, j.run_at, j.id) AS nth
    FROM unnest(CAST($9 AS text[]), CAST($10 AS integer[]),
                CAST($11 AS integer[])) AS w(queue, n, key_limit)
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($12 AS text[]),
                    CAST($13 AS smallint[]),
                    CAST($14 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT d.id, d.k, d.k_left, d.run_at, priorities.p
        FROM priorities CROSS JOIN LATERAL (
        WITH RECURSIVE last_turn AS MATERIALIZED (
            SELECT (SELECT t.k FROM unnest(CAST($15 AS text[]),
                                           CAST($16 AS smallint[]),
                                           CAST($17 AS text[])) AS t(q, p, k)
                    WHERE t.q = w.queue AND t.p = priorities.p LIMIT 1) COLLATE "C" AS c
        ), known_keys AS MATERIALIZED (
            SELECT coalesce(array_agg(x.k ORDER BY x.k COLLATE "C"), '{}') AS ks,
                   coalesce(array_agg(CAST('epoch' AS timestamptz) + x.f * INTERVAL '1 microsecond'
                                      ORDER BY x.k COLLATE "C"), '{}') AS fs
            FROM unnest(CAST($18 AS text[]),
                        CAST($19 AS smallint[]),
                        CAST($20 AS text[]) COLLATE "C",
                        CAST($21 AS bigint[])) AS x(q, p, k, f)
            WHERE x.q = w.queue AND x.p = priorities.p
        ), after(k, tid, i, present) AS (
            -- From '' (present), or from the last turn's key (served: not in this turn).
            SELECT coalesce(l.c, CAST('' AS text) COLLATE "C"), CAST(NULL AS tid),
                   (SELECT coalesce(min(n), cardinality(known_keys.ks) + 1) FROM unnest(known_keys.ks) WITH ORDINALITY AS u(k, n) WHERE u.k > coalesce(l.c, CAST('' AS text) COLLATE "C") COLLATE "C"), l.c IS NULL
            FROM last_turn AS l CROSS JOIN known_keys
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM after CROSS JOIN known_keys
            CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.k, g.tid, after.i AS i, true AS present FROM (
                SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k AND coalesce(concurrency_key, '') < known_keys.ks[after.i] AND known_keys.ks[after.i] IS NOT NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT g.k, g.tid, after.i, true FROM (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k AND known_keys.ks[after.i] IS NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT known_keys.ks[after.i], t.tid, after.i + 1, t.tid IS NOT NULL
            FROM (SELECT) AS one LEFT JOIN (
                SELECT ctid AS tid FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = known_keys.ks[after.i] AND run_at >= known_keys.fs[after.i]
                ORDER BY run_at, id LIMIT 1) AS t ON true
            WHERE known_keys.ks[after.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
        ), wrapped(k, tid, i, present) AS (
            SELECT CAST('' AS text) COLLATE "C", CAST(NULL AS tid), 1, true
            WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM wrapped CROSS JOIN known_keys
            CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.k, g.tid, wrapped.i AS i, true AS present FROM (
                SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k AND coalesce(concurrency_key, '') < known_keys.ks[wrapped.i] AND known_keys.ks[wrapped.i] IS NOT NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT g.k, g.tid, wrapped.i, true FROM (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k AND known_keys.ks[wrapped.i] IS NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT known_keys.ks[wrapped.i], t.tid, wrapped.i + 1, t.tid IS NOT NULL
            FROM (SELECT) AS one LEFT JOIN (
                SELECT ctid AS tid FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = known_keys.ks[wrapped.i] AND run_at >= known_keys.fs[wrapped.i]
                ORDER BY run_at, id LIMIT 1) AS t ON true
            WHERE known_keys.ks[wrapped.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        ), found AS MATERIALIZED (
            -- The keys in turn, read as far as the claim needs them: the first w.n, then,
            -- should some have no room, as many again and SEEN_BEYOND more.
            SELECT k, tid FROM (SELECT k, tid, present FROM after WHERE k IS NOT NULL
                                UNION ALL
                                SELECT k, tid, present FROM wrapped
                                WHERE k <= (SELECT c FROM last_turn)) AS f
            -- '' takes a turn only with a due job past its floor (read from there).
            WHERE present AND (k <> '' OR EXISTS (
                SELECT FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = '' AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now()))
            LIMIT 2 * w.n + 16
        ), ask1 AS MATERIALIZED (
            SELECT k, tid, 0 + row_number() OVER () AS nth FROM (SELECT k, tid FROM found LIMIT w.n) AS f
        ), room1 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($22 AS text[]),
                               CAST($23 AS text[]),
                               CAST($24 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST(w.n AS integer) - (SELECT count(*) FROM ask1
                                                    WHERE k = '')::integer AS wanted
                FROM ask1 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($25 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen1 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room1 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask1 AS a
        ), short AS MATERIALIZED (
            -- The keys of the first w.n without room: as many keys with room are looked for
            -- among the next m + SEEN_BEYOND.
            SELECT count(*) AS m FROM seen1 WHERE k_left <= 0
        ), ask2 AS MATERIALIZED (
            SELECT k, tid, w.n + row_number() OVER () AS nth FROM (SELECT k, tid FROM found OFFSET w.n LIMIT (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short)) AS f
        ), room2 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($22 AS text[]),
                               CAST($23 AS text[]),
                               CAST($24 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST((SELECT m FROM short) AS integer) - (SELECT count(*) FROM ask2
                                                    WHERE k = '')::integer AS wanted
                FROM ask2 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($25 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen2 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room2 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask2 AS a
        ), keys AS MATERIALIZED (
            SELECT k, tid, k_left FROM (SELECT * FROM seen1 UNION ALL SELECT * FROM seen2) AS s
            WHERE k_left > 0 ORDER BY nth LIMIT w.n
        ), shares AS MATERIALIZED (
            SELECT k, tid, k_left,
                   least(ceil(w.n / (SELECT count(*) FROM keys)::float8)::integer, k_left)
                   AS share
            FROM keys
        ), by_tid AS MATERIALIZED (
            SELECT shares.k, shares.share, shares.k_left, j.id, j.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE ctid = shares.tid AND status = 'pending' AND queue = w.queue AND priority = priorities.p AND run_at <= now()
                FOR UPDATE SKIP LOCKED
            ) AS j
            WHERE shares.share = 1 AND shares.tid IS NOT NULL
        ), first AS MATERIALIZED (
            SELECT k, share, k_left, id, run_at FROM by_tid UNION ALL
            SELECT shares.k, shares.share, shares.k_left, f.id, f.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = shares.k
                  AND run_at >= CASE WHEN shares.k = '' THEN coalesce(priorities.f, CAST('-infinity' AS timestamptz)) ELSE (SELECT coalesce(known_keys.fs[array_position(known_keys.ks, shares.k)], CAST('-infinity' AS timestamptz)) FROM known_keys) END
                  AND run_at <= now()
                ORDER BY run_at, id LIMIT shares.share FOR UPDATE SKIP LOCKED
            ) AS f
            WHERE shares.share > 1 OR shares.tid IS NULL OR NOT EXISTS (SELECT FROM by_tid WHERE by_tid.k = shares.k)
        ), filled AS MATERIALIZED (
            -- Only when every key had its turn (fewer keys with room than slots, and every
            -- key seen): a key not reached yet comes before a second turn of one that was.
            SELECT k, k_left, count(*) AS taken, max(run_at) AS last_run_at,
                   (array_agg(id ORDER BY run_at DESC, id DESC))[1] AS last_id
            FROM first WHERE (SELECT count(*) FROM keys) < w.n
                         AND ((SELECT count(*) FROM seen1) < w.n
                              OR (SELECT count(*) FROM seen2) < (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short))
            GROUP BY k, share, k_left
            HAVING count(*) = share AND count(*) < k_left
        ), more AS MATERIALIZED (
            SELECT m.id, filled.k, filled.k_left, m.run_at FROM filled CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = filled.k
                  AND (run_at, id) > (filled.last_run_at, filled.last_id)
                  AND run_at <= now()
                ORDER BY run_at, id
                LIMIT least(filled.k_left - filled.taken,
                            ceil((w.n - (SELECT count(*) FROM first))
                                 / (SELECT count(*) FROM filled)::float8)::integer)
                FOR UPDATE SKIP LOCKED
            ) AS m
            LIMIT greatest(w.n - (SELECT count(*) FROM first), 0)
        )
        SELECT id, k, k_left, run_at FROM first
        UNION ALL SELECT id, k, k_left, run_at FROM more
        ) AS d
        WHERE priorities.p IS NOT NULL
        LIMIT w.n
    ) AS j
) AS c
WHERE c.nth <= c.k_left AND (
    SELECT count(pg_advisory_xact_lock_shared(l.k)) FROM (
        SELECT DISTINCT hashtextextended('jobqueue.keys:' || q.queue, 0) AS k
        FROM unnest(CAST($9 AS text[]), CAST($11 AS integer[])) AS q(queue, n)
        WHERE q.n IS NOT NULL
        ORDER BY k
    ) AS l) >= 0), 
claimed AS 
(UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $4::INTEGER), locked_until=(now() + $5::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $6::BIGINT), claim_id=$7::UUID, leased_by=$8::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key)
 SELECT true AS completed, done.id, CAST(NULL AS TEXT) AS type, CAST(NULL AS JSONB) AS payload, CAST(NULL AS INTEGER) AS attempts, CAST(NULL AS INTEGER) AS max_attempts, done.lease_token, CAST(NULL AS TEXT) AS queue, CAST(NULL AS FLOAT) AS timeout, CAST(NULL AS TEXT) AS traceparent, CAST(NULL AS SMALLINT) AS priority, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS run_at, CAST(NULL AS TEXT) COLLATE "C" AS concurrency_key 
FROM done UNION ALL SELECT false AS anon_1, claimed.id, claimed.type, claimed.payload, claimed.attempts, claimed.max_attempts, claimed.lease_token, claimed.queue, claimed.timeout, claimed.traceparent, claimed.priority, claimed.run_at, claimed.concurrency_key 
FROM claimed;

-- name: job_claim_unlimited_key_floors
-- parameters: $1 attempts_1=1, $2 lease_seconds, $3 lease_token_1=1, $4 claim, $5 holder, $6 queues, $7 slots, $8 key_limits, $9 floor_queues, $10 floor_priorities, $11 floors, $12 turn_queues, $13 turn_priorities, $14 turns, $15 key_floor_queues, $16 key_floor_priorities, $17 key_floor_keys, $18 key_floors, $19 limited, $20 overrun_queues, $21 overrun_keys, $22 overrun_counts, $23 key_lease_floor
WITH due AS MATERIALIZED 
(
SELECT c.id FROM (
    SELECT j.id, j.k_left, row_number() OVER (
               PARTITION BY w.queue, j.k ORDER BY j.p DESC, j.run_at, j.id) AS nth
    FROM unnest(CAST($6 AS text[]), CAST($7 AS integer[]),
                CAST($8 AS integer[])) AS w(queue, n, key_limit)
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($9 AS text[]),
                    CAST($10 AS smallint[]),
                    CAST($11 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT d.id, d.k, d.k_left, d.run_at, priorities.p
        FROM priorities CROSS JOIN LATERAL (
        WITH RECURSIVE last_turn AS MATERIALIZED (
            SELECT (SELECT t.k FROM unnest(CAST($12 AS text[]),
                                           CAST($13 AS smallint[]),
                                           CAST($14 AS text[])) AS t(q, p, k)
                    WHERE t.q = w.queue AND t.p = priorities.p LIMIT 1) COLLATE "C" AS c
        ), known_keys AS MATERIALIZED (
            SELECT coalesce(array_agg(x.k ORDER BY x.k COLLATE "C"), '{}') AS ks,
                   coalesce(array_agg(CAST('epoch' AS timestamptz) + x.f * INTERVAL '1 microsecond'
                                      ORDER BY x.k COLLATE "C"), '{}') AS fs
            FROM unnest(CAST($15 AS text[]),
                        CAST($16 AS smallint[]),
                        CAST($17 AS text[]) COLLATE "C",
                        CAST($18 AS bigint[])) AS x(q, p, k, f)
            WHERE x.q = w.queue AND x.p = priorities.p
        ), after(k, tid, i, present) AS (
            -- From '' (present), or from the last turn's key (served: not in this turn).
            SELECT coalesce(l.c, CAST('' AS text) COLLATE "C"), CAST(NULL AS tid),
                   (SELECT coalesce(min(n), cardinality(known_keys.ks) + 1) FROM unnest(known_keys.ks) WITH ORDINALITY AS u(k, n) WHERE u.k > coalesce(l.c, CAST('' AS text) COLLATE "C") COLLATE "C"), l.c IS NULL
            FROM last_turn AS l CROSS JOIN known_keys
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM after CROSS JOIN known_keys
            CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.k, g.tid, after.i AS i, true AS present FROM (
                SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k AND coalesce(concurrency_key, '') < known_keys.ks[after.i] AND known_keys.ks[after.i] IS NOT NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT g.k, g.tid, after.i, true FROM (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k AND known_keys.ks[after.i] IS NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT known_keys.ks[after.i], t.tid, after.i + 1, t.tid IS NOT NULL
            FROM (SELECT) AS one LEFT JOIN (
                SELECT ctid AS tid FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = known_keys.ks[after.i] AND run_at >= known_keys.fs[after.i]
                ORDER BY run_at, id LIMIT 1) AS t ON true
            WHERE known_keys.ks[after.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
        ), wrapped(k, tid, i, present) AS (
            SELECT CAST('' AS text) COLLATE "C", CAST(NULL AS tid), 1, true
            WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM wrapped CROSS JOIN known_keys
            CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.k, g.tid, wrapped.i AS i, true AS present FROM (
                SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k AND coalesce(concurrency_key, '') < known_keys.ks[wrapped.i] AND known_keys.ks[wrapped.i] IS NOT NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT g.k, g.tid, wrapped.i, true FROM (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k AND known_keys.ks[wrapped.i] IS NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT known_keys.ks[wrapped.i], t.tid, wrapped.i + 1, t.tid IS NOT NULL
            FROM (SELECT) AS one LEFT JOIN (
                SELECT ctid AS tid FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = known_keys.ks[wrapped.i] AND run_at >= known_keys.fs[wrapped.i]
                ORDER BY run_at, id LIMIT 1) AS t ON true
            WHERE known_keys.ks[wrapped.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        ), found AS MATERIALIZED (
            -- The keys in turn, read as far as the claim needs them: the first w.n, then,
            -- should some have no room, as many again and SEEN_BEYOND more.
            SELECT k, tid FROM (SELECT k, tid, present FROM after WHERE k IS NOT NULL
                                UNION ALL
                                SELECT k, tid, present FROM wrapped
                                WHERE k <= (SELECT c FROM last_turn)) AS f
            -- '' takes a turn only with a due job past its floor (read from there).
            WHERE present AND (k <> '' OR EXISTS (
                SELECT FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = '' AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now() AND type <> ALL(CAST($19 AS text[]))))
            LIMIT 2 * w.n + 16
        ), ask1 AS MATERIALIZED (
            SELECT k, tid, 0 + row_number() OVER () AS nth FROM (SELECT k, tid FROM found LIMIT w.n) AS f
        ), room1 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($20 AS text[]),
                               CAST($21 AS text[]),
                               CAST($22 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST(w.n AS integer) - (SELECT count(*) FROM ask1
                                                    WHERE k = '')::integer AS wanted
                FROM ask1 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($23 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen1 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room1 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask1 AS a
        ), short AS MATERIALIZED (
            -- The keys of the first w.n without room: as many keys with room are looked for
            -- among the next m + SEEN_BEYOND.
            SELECT count(*) AS m FROM seen1 WHERE k_left <= 0
        ), ask2 AS MATERIALIZED (
            SELECT k, tid, w.n + row_number() OVER () AS nth FROM (SELECT k, tid FROM found OFFSET w.n LIMIT (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short)) AS f
        ), room2 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($20 AS text[]),
                               CAST($21 AS text[]),
                               CAST($22 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST((SELECT m FROM short) AS integer) - (SELECT count(*) FROM ask2
                                                    WHERE k = '')::integer AS wanted
                FROM ask2 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($23 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen2 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room2 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask2 AS a
        ), keys AS MATERIALIZED (
            SELECT k, tid, k_left FROM (SELECT * FROM seen1 UNION ALL SELECT * FROM seen2) AS s
            WHERE k_left > 0 ORDER BY nth LIMIT w.n
        ), shares AS MATERIALIZED (
            SELECT k, tid, k_left,
                   least(ceil(w.n / (SELECT count(*) FROM keys)::float8)::integer, k_left)
                   AS share
            FROM keys
        ), first AS MATERIALIZED (
            
            SELECT shares.k, shares.share, shares.k_left, f.id, f.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = shares.k
                  AND run_at >= CASE WHEN shares.k = '' THEN coalesce(priorities.f, CAST('-infinity' AS timestamptz)) ELSE (SELECT coalesce(known_keys.fs[array_position(known_keys.ks, shares.k)], CAST('-infinity' AS timestamptz)) FROM known_keys) END
                  AND run_at <= now() AND type <> ALL(CAST($19 AS text[]))
                ORDER BY run_at, id LIMIT shares.share FOR UPDATE SKIP LOCKED
            ) AS f
            
        ), filled AS MATERIALIZED (
            -- Only when every key had its turn (fewer keys with room than slots, and every
            -- key seen): a key not reached yet comes before a second turn of one that was.
            SELECT k, k_left, count(*) AS taken, max(run_at) AS last_run_at,
                   (array_agg(id ORDER BY run_at DESC, id DESC))[1] AS last_id
            FROM first WHERE (SELECT count(*) FROM keys) < w.n
                         AND ((SELECT count(*) FROM seen1) < w.n
                              OR (SELECT count(*) FROM seen2) < (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short))
            GROUP BY k, share, k_left
            HAVING count(*) = share AND count(*) < k_left
        ), more AS MATERIALIZED (
            SELECT m.id, filled.k, filled.k_left, m.run_at FROM filled CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = filled.k
                  AND (run_at, id) > (filled.last_run_at, filled.last_id)
                  AND run_at <= now() AND type <> ALL(CAST($19 AS text[]))
                ORDER BY run_at, id
                LIMIT least(filled.k_left - filled.taken,
                            ceil((w.n - (SELECT count(*) FROM first))
                                 / (SELECT count(*) FROM filled)::float8)::integer)
                FOR UPDATE SKIP LOCKED
            ) AS m
            LIMIT greatest(w.n - (SELECT count(*) FROM first), 0)
        )
        SELECT id, k, k_left, run_at FROM first
        UNION ALL SELECT id, k, k_left, run_at FROM more
        ) AS d
        WHERE priorities.p IS NOT NULL
        LIMIT w.n
    ) AS j
) AS c
WHERE c.nth <= c.k_left AND (
    SELECT count(pg_advisory_xact_lock_shared(l.k)) FROM (
        SELECT DISTINCT hashtextextended('jobqueue.keys:' || q.queue, 0) AS k
        FROM unnest(CAST($6 AS text[]), CAST($8 AS integer[])) AS q(queue, n)
        WHERE q.n IS NOT NULL
        ORDER BY k
    ) AS l) >= 0)
 UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $1::INTEGER), locked_until=(now() + $2::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $3::BIGINT), claim_id=$4::UUID, leased_by=$5::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key;

-- name: job_complete_and_claim_unlimited_key_floors
-- parameters: $1 ids, $2 tokens, $3 results, $4 attempts_1=1, $5 lease_seconds, $6 lease_token_1=1, $7 claim, $8 holder, $9 queues, $10 slots, $11 key_limits, $12 floor_queues, $13 floor_priorities, $14 floors, $15 turn_queues, $16 turn_priorities, $17 turns, $18 key_floor_queues, $19 key_floor_priorities, $20 key_floor_keys, $21 key_floors, $22 limited, $23 overrun_queues, $24 overrun_keys, $25 overrun_counts, $26 key_lease_floor
WITH done AS 
(UPDATE jobqueue.jobs SET status='completed', locked_until=NULL, last_error=NULL, result=CAST(o.result AS JSONB), finished_at=now(), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[]) AS o(id, token, result) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke), 
due AS MATERIALIZED 
(
SELECT c.id FROM (
    SELECT j.id, j.k_left, row_number() OVER (
               PARTITION BY w.queue, j.k ORDER BY j.p DESC, j.run_at, j.id) AS nth
    FROM unnest(CAST($9 AS text[]), CAST($10 AS integer[]),
                CAST($11 AS integer[])) AS w(queue, n, key_limit)
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($12 AS text[]),
                    CAST($13 AS smallint[]),
                    CAST($14 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT d.id, d.k, d.k_left, d.run_at, priorities.p
        FROM priorities CROSS JOIN LATERAL (
        WITH RECURSIVE last_turn AS MATERIALIZED (
            SELECT (SELECT t.k FROM unnest(CAST($15 AS text[]),
                                           CAST($16 AS smallint[]),
                                           CAST($17 AS text[])) AS t(q, p, k)
                    WHERE t.q = w.queue AND t.p = priorities.p LIMIT 1) COLLATE "C" AS c
        ), known_keys AS MATERIALIZED (
            SELECT coalesce(array_agg(x.k ORDER BY x.k COLLATE "C"), '{}') AS ks,
                   coalesce(array_agg(CAST('epoch' AS timestamptz) + x.f * INTERVAL '1 microsecond'
                                      ORDER BY x.k COLLATE "C"), '{}') AS fs
            FROM unnest(CAST($18 AS text[]),
                        CAST($19 AS smallint[]),
                        CAST($20 AS text[]) COLLATE "C",
                        CAST($21 AS bigint[])) AS x(q, p, k, f)
            WHERE x.q = w.queue AND x.p = priorities.p
        ), after(k, tid, i, present) AS (
            -- From '' (present), or from the last turn's key (served: not in this turn).
            SELECT coalesce(l.c, CAST('' AS text) COLLATE "C"), CAST(NULL AS tid),
                   (SELECT coalesce(min(n), cardinality(known_keys.ks) + 1) FROM unnest(known_keys.ks) WITH ORDINALITY AS u(k, n) WHERE u.k > coalesce(l.c, CAST('' AS text) COLLATE "C") COLLATE "C"), l.c IS NULL
            FROM last_turn AS l CROSS JOIN known_keys
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM after CROSS JOIN known_keys
            CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.k, g.tid, after.i AS i, true AS present FROM (
                SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k AND coalesce(concurrency_key, '') < known_keys.ks[after.i] AND known_keys.ks[after.i] IS NOT NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT g.k, g.tid, after.i, true FROM (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > after.k AND known_keys.ks[after.i] IS NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT known_keys.ks[after.i], t.tid, after.i + 1, t.tid IS NOT NULL
            FROM (SELECT) AS one LEFT JOIN (
                SELECT ctid AS tid FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = known_keys.ks[after.i] AND run_at >= known_keys.fs[after.i]
                ORDER BY run_at, id LIMIT 1) AS t ON true
            WHERE known_keys.ks[after.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
        ), wrapped(k, tid, i, present) AS (
            SELECT CAST('' AS text) COLLATE "C", CAST(NULL AS tid), 1, true
            WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM wrapped CROSS JOIN known_keys
            CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.k, g.tid, wrapped.i AS i, true AS present FROM (
                SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k AND coalesce(concurrency_key, '') < known_keys.ks[wrapped.i] AND known_keys.ks[wrapped.i] IS NOT NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT g.k, g.tid, wrapped.i, true FROM (SELECT coalesce(concurrency_key, '') AS k, ctid AS tid FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > wrapped.k AND known_keys.ks[wrapped.i] IS NULL ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT 1) AS g
            UNION ALL
            SELECT known_keys.ks[wrapped.i], t.tid, wrapped.i + 1, t.tid IS NOT NULL
            FROM (SELECT) AS one LEFT JOIN (
                SELECT ctid AS tid FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = known_keys.ks[wrapped.i] AND run_at >= known_keys.fs[wrapped.i]
                ORDER BY run_at, id LIMIT 1) AS t ON true
            WHERE known_keys.ks[wrapped.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        ), found AS MATERIALIZED (
            -- The keys in turn, read as far as the claim needs them: the first w.n, then,
            -- should some have no room, as many again and SEEN_BEYOND more.
            SELECT k, tid FROM (SELECT k, tid, present FROM after WHERE k IS NOT NULL
                                UNION ALL
                                SELECT k, tid, present FROM wrapped
                                WHERE k <= (SELECT c FROM last_turn)) AS f
            -- '' takes a turn only with a due job past its floor (read from there).
            WHERE present AND (k <> '' OR EXISTS (
                SELECT FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = '' AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now() AND type <> ALL(CAST($22 AS text[]))))
            LIMIT 2 * w.n + 16
        ), ask1 AS MATERIALIZED (
            SELECT k, tid, 0 + row_number() OVER () AS nth FROM (SELECT k, tid FROM found LIMIT w.n) AS f
        ), room1 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($23 AS text[]),
                               CAST($24 AS text[]),
                               CAST($25 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST(w.n AS integer) - (SELECT count(*) FROM ask1
                                                    WHERE k = '')::integer AS wanted
                FROM ask1 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($26 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen1 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room1 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask1 AS a
        ), short AS MATERIALIZED (
            -- The keys of the first w.n without room: as many keys with room are looked for
            -- among the next m + SEEN_BEYOND.
            SELECT count(*) AS m FROM seen1 WHERE k_left <= 0
        ), ask2 AS MATERIALIZED (
            SELECT k, tid, w.n + row_number() OVER () AS nth FROM (SELECT k, tid FROM found OFFSET w.n LIMIT (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short)) AS f
        ), room2 AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST($23 AS text[]),
                               CAST($24 AS text[]),
                               CAST($25 AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST((SELECT m FROM short) AS integer) - (SELECT count(*) FROM ask2
                                                    WHERE k = '')::integer AS wanted
                FROM ask2 AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, coalesce(CAST('epoch' AS timestamptz) + CAST($26 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen2 AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room2 AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask2 AS a
        ), keys AS MATERIALIZED (
            SELECT k, tid, k_left FROM (SELECT * FROM seen1 UNION ALL SELECT * FROM seen2) AS s
            WHERE k_left > 0 ORDER BY nth LIMIT w.n
        ), shares AS MATERIALIZED (
            SELECT k, tid, k_left,
                   least(ceil(w.n / (SELECT count(*) FROM keys)::float8)::integer, k_left)
                   AS share
            FROM keys
        ), first AS MATERIALIZED (
            
            SELECT shares.k, shares.share, shares.k_left, f.id, f.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = shares.k
                  AND run_at >= CASE WHEN shares.k = '' THEN coalesce(priorities.f, CAST('-infinity' AS timestamptz)) ELSE (SELECT coalesce(known_keys.fs[array_position(known_keys.ks, shares.k)], CAST('-infinity' AS timestamptz)) FROM known_keys) END
                  AND run_at <= now() AND type <> ALL(CAST($22 AS text[]))
                ORDER BY run_at, id LIMIT shares.share FOR UPDATE SKIP LOCKED
            ) AS f
            
        ), filled AS MATERIALIZED (
            -- Only when every key had its turn (fewer keys with room than slots, and every
            -- key seen): a key not reached yet comes before a second turn of one that was.
            SELECT k, k_left, count(*) AS taken, max(run_at) AS last_run_at,
                   (array_agg(id ORDER BY run_at DESC, id DESC))[1] AS last_id
            FROM first WHERE (SELECT count(*) FROM keys) < w.n
                         AND ((SELECT count(*) FROM seen1) < w.n
                              OR (SELECT count(*) FROM seen2) < (SELECT CASE WHEN m > 0 THEN m + 16 ELSE 0 END FROM short))
            GROUP BY k, share, k_left
            HAVING count(*) = share AND count(*) < k_left
        ), more AS MATERIALIZED (
            SELECT m.id, filled.k, filled.k_left, m.run_at FROM filled CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = filled.k
                  AND (run_at, id) > (filled.last_run_at, filled.last_id)
                  AND run_at <= now() AND type <> ALL(CAST($22 AS text[]))
                ORDER BY run_at, id
                LIMIT least(filled.k_left - filled.taken,
                            ceil((w.n - (SELECT count(*) FROM first))
                                 / (SELECT count(*) FROM filled)::float8)::integer)
                FOR UPDATE SKIP LOCKED
            ) AS m
            LIMIT greatest(w.n - (SELECT count(*) FROM first), 0)
        )
        SELECT id, k, k_left, run_at FROM first
        UNION ALL SELECT id, k, k_left, run_at FROM more
        ) AS d
        WHERE priorities.p IS NOT NULL
        LIMIT w.n
    ) AS j
) AS c
WHERE c.nth <= c.k_left AND (
    SELECT count(pg_advisory_xact_lock_shared(l.k)) FROM (
        SELECT DISTINCT hashtextextended('jobqueue.keys:' || q.queue, 0) AS k
        FROM unnest(CAST($9 AS text[]), CAST($11 AS integer[])) AS q(queue, n)
        WHERE q.n IS NOT NULL
        ORDER BY k
    ) AS l) >= 0), 
claimed AS 
(UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $4::INTEGER), locked_until=(now() + $5::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $6::BIGINT), claim_id=$7::UUID, leased_by=$8::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key)
 SELECT true AS completed, done.id, CAST(NULL AS TEXT) AS type, CAST(NULL AS JSONB) AS payload, CAST(NULL AS INTEGER) AS attempts, CAST(NULL AS INTEGER) AS max_attempts, done.lease_token, CAST(NULL AS TEXT) AS queue, CAST(NULL AS FLOAT) AS timeout, CAST(NULL AS TEXT) AS traceparent, CAST(NULL AS SMALLINT) AS priority, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS run_at, CAST(NULL AS TEXT) COLLATE "C" AS concurrency_key 
FROM done UNION ALL SELECT false AS anon_1, claimed.id, claimed.type, claimed.payload, claimed.attempts, claimed.max_attempts, claimed.lease_token, claimed.queue, claimed.timeout, claimed.traceparent, claimed.priority, claimed.run_at, claimed.concurrency_key 
FROM claimed;

-- name: job_claim_plain
-- parameters: $1 attempts_1=1, $2 lease_seconds, $3 lease_token_1=1, $4 claim, $5 holder, $6 queues, $7 slots, $8 floor_queues, $9 floor_priorities, $10 floors
WITH due AS MATERIALIZED 
(
SELECT j.id FROM unnest(CAST($6 AS text[]), CAST($7 AS integer[])) AS w(queue, n)
CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($8 AS text[]),
                    CAST($9 AS smallint[]),
                    CAST($10 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
    SELECT d.id FROM priorities CROSS JOIN LATERAL (
        SELECT id FROM jobqueue.jobs
        WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now()
        ORDER BY run_at, id LIMIT w.n FOR UPDATE SKIP LOCKED
    ) AS d
    WHERE priorities.p IS NOT NULL
    LIMIT w.n
) AS j)
 UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $1::INTEGER), locked_until=(now() + $2::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $3::BIGINT), claim_id=$4::UUID, leased_by=$5::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key;

-- name: job_claim_plain_unlimited
-- parameters: $1 attempts_1=1, $2 lease_seconds, $3 lease_token_1=1, $4 claim, $5 holder, $6 queues, $7 slots, $8 floor_queues, $9 floor_priorities, $10 floors, $11 limited
WITH due AS MATERIALIZED 
(
SELECT j.id FROM unnest(CAST($6 AS text[]), CAST($7 AS integer[])) AS w(queue, n)
CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($8 AS text[]),
                    CAST($9 AS smallint[]),
                    CAST($10 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
    SELECT d.id FROM priorities CROSS JOIN LATERAL (
        SELECT id FROM jobqueue.jobs
        WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now() AND type <> ALL(CAST($11 AS text[]))
        ORDER BY run_at, id LIMIT w.n FOR UPDATE SKIP LOCKED
    ) AS d
    WHERE priorities.p IS NOT NULL
    LIMIT w.n
) AS j)
 UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $1::INTEGER), locked_until=(now() + $2::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $3::BIGINT), claim_id=$4::UUID, leased_by=$5::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key;

-- name: job_complete_and_claim_plain
-- parameters: $1 ids, $2 tokens, $3 results, $4 attempts_1=1, $5 lease_seconds, $6 lease_token_1=1, $7 claim, $8 holder, $9 queues, $10 slots, $11 floor_queues, $12 floor_priorities, $13 floors
WITH done AS 
(UPDATE jobqueue.jobs SET status='completed', locked_until=NULL, last_error=NULL, result=CAST(o.result AS JSONB), finished_at=now(), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[]) AS o(id, token, result) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke), 
due AS MATERIALIZED 
(
SELECT j.id FROM unnest(CAST($9 AS text[]), CAST($10 AS integer[])) AS w(queue, n)
CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($11 AS text[]),
                    CAST($12 AS smallint[]),
                    CAST($13 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
    SELECT d.id FROM priorities CROSS JOIN LATERAL (
        SELECT id FROM jobqueue.jobs
        WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now()
        ORDER BY run_at, id LIMIT w.n FOR UPDATE SKIP LOCKED
    ) AS d
    WHERE priorities.p IS NOT NULL
    LIMIT w.n
) AS j), 
claimed AS 
(UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $4::INTEGER), locked_until=(now() + $5::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $6::BIGINT), claim_id=$7::UUID, leased_by=$8::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key)
 SELECT true AS completed, done.id, CAST(NULL AS TEXT) AS type, CAST(NULL AS JSONB) AS payload, CAST(NULL AS INTEGER) AS attempts, CAST(NULL AS INTEGER) AS max_attempts, done.lease_token, CAST(NULL AS TEXT) AS queue, CAST(NULL AS FLOAT) AS timeout, CAST(NULL AS TEXT) AS traceparent, CAST(NULL AS SMALLINT) AS priority, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS run_at, CAST(NULL AS TEXT) COLLATE "C" AS concurrency_key 
FROM done UNION ALL SELECT false AS anon_1, claimed.id, claimed.type, claimed.payload, claimed.attempts, claimed.max_attempts, claimed.lease_token, claimed.queue, claimed.timeout, claimed.traceparent, claimed.priority, claimed.run_at, claimed.concurrency_key 
FROM claimed;

-- name: job_complete_and_claim_plain_unlimited
-- parameters: $1 ids, $2 tokens, $3 results, $4 attempts_1=1, $5 lease_seconds, $6 lease_token_1=1, $7 claim, $8 holder, $9 queues, $10 slots, $11 floor_queues, $12 floor_priorities, $13 floors, $14 limited
WITH done AS 
(UPDATE jobqueue.jobs SET status='completed', locked_until=NULL, last_error=NULL, result=CAST(o.result AS JSONB), finished_at=now(), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[]) AS o(id, token, result) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke), 
due AS MATERIALIZED 
(
SELECT j.id FROM unnest(CAST($9 AS text[]), CAST($10 AS integer[])) AS w(queue, n)
CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($11 AS text[]),
                    CAST($12 AS smallint[]),
                    CAST($13 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
    SELECT d.id FROM priorities CROSS JOIN LATERAL (
        SELECT id FROM jobqueue.jobs
        WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz)) AND run_at <= now() AND type <> ALL(CAST($14 AS text[]))
        ORDER BY run_at, id LIMIT w.n FOR UPDATE SKIP LOCKED
    ) AS d
    WHERE priorities.p IS NOT NULL
    LIMIT w.n
) AS j), 
claimed AS 
(UPDATE jobqueue.jobs SET status='processing', attempts=(jobqueue.jobs.attempts + $4::INTEGER), locked_until=(now() + $5::FLOAT * interval '1 second'), lease_token=(jobqueue.jobs.lease_token + $6::BIGINT), claim_id=$7::UUID, leased_by=$8::VARCHAR, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT due.id 
FROM due))) RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.lease_token, jobqueue.jobs.queue, jobqueue.jobs.timeout, jobqueue.jobs.traceparent, jobqueue.jobs.priority, jobqueue.jobs.run_at, jobqueue.jobs.concurrency_key)
 SELECT true AS completed, done.id, CAST(NULL AS TEXT) AS type, CAST(NULL AS JSONB) AS payload, CAST(NULL AS INTEGER) AS attempts, CAST(NULL AS INTEGER) AS max_attempts, done.lease_token, CAST(NULL AS TEXT) AS queue, CAST(NULL AS FLOAT) AS timeout, CAST(NULL AS TEXT) AS traceparent, CAST(NULL AS SMALLINT) AS priority, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS run_at, CAST(NULL AS TEXT) COLLATE "C" AS concurrency_key 
FROM done UNION ALL SELECT false AS anon_1, claimed.id, claimed.type, claimed.payload, claimed.attempts, claimed.max_attempts, claimed.lease_token, claimed.queue, claimed.timeout, claimed.traceparent, claimed.priority, claimed.run_at, claimed.concurrency_key 
FROM claimed;

-- name: job_lock_keys
-- parameters: $1 locked_queues
SELECT count(pg_advisory_xact_lock(k)) AS locked
FROM (
    SELECT DISTINCT hashtextextended('jobqueue.keys:' || q, 0) AS k
    FROM unnest(CAST($1 AS text[])) AS q
    ORDER BY k
) AS keys;

-- name: job_lock_types
-- parameters: $1 types
SELECT set_config('enable_sort', 'on', true) AS sort,
       set_config('jit_above_cost', '-1', true) AS jit,
       count(pg_advisory_xact_lock(k)) AS locked
FROM (
    SELECT DISTINCT hashtextextended('jobqueue.type:' || t, 0) AS k
    FROM unnest(CAST($1 AS text[])) AS t
    ORDER BY k
) AS keys;

-- name: job_claim_limited
-- parameters: $1 types, $2 concurrency, $3 overruns, $4 rates, $5 periods, $6 lease_floors, $7 queues, $8 key_limits, $9 key_lease_floor, $10 overrun_queues, $11 overrun_keys, $12 overrun_counts, $13 slots, $14 type_floor_types, $15 type_floor_queues, $16 type_floor_priorities, $17 type_floors, $18 floor_queues, $19 floor_priorities, $20 floors, $21 lease_seconds, $22 claim, $23 holder
WITH room AS MATERIALIZED (
    SELECT l.type, l.rate, l.period, r.window_start,
           l.concurrency - l.overrun - running.n AS concurrency_left,
           l.rate - coalesce((SELECT used FROM jobqueue.job_rate_windows AS u
                              WHERE u.type = l.type AND u.window_start = r.window_start),
                             0) AS rate_left,
           least(running.first, now()) AS running
    FROM unnest(CAST($1 AS text[]), CAST($2 AS integer[]),
                CAST($3 AS integer[]), CAST($4 AS integer[]),
                CAST($5 AS float8[]), CAST($6 AS bigint[]))
         AS l(type, concurrency, overrun, rate, period, lease_floor)
    CROSS JOIN LATERAL (
        SELECT to_timestamp(floor(extract(epoch FROM statement_timestamp()) / l.period)
                            * l.period) AS window_start
    ) AS r
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(locked_until) AS first FROM jobqueue.jobs
        WHERE status = 'processing' AND type = l.type
          AND locked_until >= coalesce(CAST('epoch' AS timestamptz)
                                       + l.lease_floor * INTERVAL '1 microsecond',
                                       CAST('-infinity' AS timestamptz))
    ) AS running
), key_use AS MATERIALIZED (
    SELECT w.queue, u.k, sum(u.n) AS used
    FROM unnest(CAST($7 AS text[]), CAST($8 AS integer[])) AS w(queue, key_limit)
    CROSS JOIN LATERAL (
        SELECT r.concurrency_key AS k, 1 AS n FROM jobqueue.jobs AS r
        WHERE r.status = 'processing' AND r.queue = w.queue AND r.concurrency_key IS NOT NULL
          AND r.locked_until >= coalesce(CAST('epoch' AS timestamptz) + CAST($9 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))
        UNION ALL
        SELECT o.k, o.n FROM unnest(CAST($10 AS text[]),
                                    CAST($11 AS text[]),
                                    CAST($12 AS integer[])) AS o(q, k, n)
        WHERE o.q = w.queue
    ) AS u
    WHERE w.key_limit IS NOT NULL
    GROUP BY w.queue, u.k
), queue_limits AS MATERIALIZED (
    SELECT w.queue, w.n, w.key_limit,
           ARRAY(SELECT u.k FROM key_use AS u
                 WHERE u.queue = w.queue AND u.used >= w.key_limit) AS full_keys
    FROM unnest(CAST($7 AS text[]), CAST($13 AS integer[]),
                CAST($8 AS integer[])) AS w(queue, n, key_limit)
), due AS MATERIALIZED (
    SELECT d.id, d.priority, d.run_at, d.concurrency_key, room.type, w.queue, w.n AS slots,
           w.key_limit, greatest(least(room.concurrency_left, room.rate_left), 0) AS type_left
    FROM room CROSS JOIN queue_limits AS w
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($14 AS text[]),
                    CAST($15 AS text[]),
                    CAST($16 AS smallint[]),
                    CAST($17 AS bigint[])) AS k(t, q, p, f)
        WHERE k.t = room.type AND k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND type = room.type AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND type = room.type AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT j.id, j.priority, j.run_at, j.concurrency_key FROM priorities CROSS JOIN LATERAL (
            SELECT id, priority, run_at, concurrency_key FROM jobqueue.jobs
            WHERE status = 'pending' AND type = room.type AND queue = w.queue
              AND priority = priorities.p AND run_at <= now() AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz))
              AND (concurrency_key IS NULL OR concurrency_key <> ALL(w.full_keys))
            ORDER BY run_at, id
            LIMIT greatest(least(room.concurrency_left, room.rate_left, w.n), 0)
            FOR UPDATE SKIP LOCKED
        ) AS j
        WHERE priorities.p IS NOT NULL
        LIMIT greatest(least(room.concurrency_left, room.rate_left, w.n), 0)
    ) AS d
), keyed AS (
    SELECT due.*,
           row_number() OVER (PARTITION BY queue, concurrency_key
                              ORDER BY priority DESC, run_at, id) AS nth_key,
           CASE WHEN concurrency_key IS NOT NULL THEN
               key_limit - coalesce((SELECT u.used FROM key_use AS u
                                     WHERE u.queue = due.queue AND u.k = due.concurrency_key), 0)
           END AS key_left
    FROM due
), by_type AS (
    SELECT id, priority, run_at, queue, slots,
           row_number() OVER (PARTITION BY type ORDER BY priority DESC, run_at, id) AS nth,
           type_left
    FROM keyed WHERE key_left IS NULL OR nth_key <= key_left
), others AS MATERIALIZED (
    SELECT o.id, o.priority, o.run_at, w.queue, w.n AS slots
    FROM unnest(CAST($7 AS text[]), CAST($13 AS integer[])) AS w(queue, n)
    CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($18 AS text[]),
                    CAST($19 AS smallint[]),
                    CAST($20 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
        SELECT d.id, d.priority, d.run_at FROM priorities CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM jobqueue.jobs
            WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p
              AND run_at <= now() AND type <> ALL(CAST($1 AS text[]))
              -- Only a higher priority outranks a limited candidate: nothing to read at
              -- or below the lowest one's (or at all, in a queue without candidates).
              AND priority > (SELECT coalesce(min(c.priority), 32767) FROM due AS c
                              WHERE c.queue = w.queue)
            -- Any of them will do (they only rank): in index order, keys first.
            ORDER BY coalesce(concurrency_key, ''), run_at, id LIMIT w.n
        ) AS d
        LIMIT w.n
    ) AS o
), by_queue AS (
    SELECT id, slots, limited,
           row_number() OVER (PARTITION BY queue ORDER BY priority DESC, limited DESC, run_at, id)
           AS nth
    FROM (SELECT id, priority, run_at, queue, slots, true AS limited FROM by_type
          WHERE nth <= type_left
          UNION ALL
          SELECT id, priority, run_at, queue, slots, false FROM others) AS candidates
), claimed AS (
    UPDATE jobqueue.jobs SET status = 'processing', attempts = attempts + 1,
        lease_token = lease_token + 1,
        locked_until = now() + CAST($21 AS float8) * interval '1 second',
        claim_id = CAST($22 AS uuid), leased_by = CAST($23 AS text), updated_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM by_queue WHERE nth <= slots AND limited))
    RETURNING id, type, payload, attempts, max_attempts, lease_token, queue, timeout, traceparent, priority, run_at, concurrency_key
), started AS (
    SELECT type, count(*) AS n FROM claimed GROUP BY type
), counted AS (
    INSERT INTO jobqueue.job_rate_windows AS u (type, window_start, used)
    SELECT room.type, room.window_start, started.n
    FROM room JOIN started ON started.type = room.type
    WHERE room.rate IS NOT NULL
    ON CONFLICT (type) DO UPDATE SET
        used = CASE WHEN u.window_start = excluded.window_start
                    THEN u.used + excluded.used ELSE excluded.used END,
        window_start = excluded.window_start
)
SELECT id, type, payload, attempts, max_attempts, lease_token, queue, timeout, traceparent, priority, run_at, concurrency_key, CAST(NULL AS text) AS held, CAST(NULL AS float8) AS wait,
       CAST(NULL AS bigint) AS running
FROM claimed
UNION ALL
SELECT NULL, room.type, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       CASE WHEN room.rate_left - coalesce(started.n, 0) <= 0 THEN 'rate'
            WHEN room.concurrency_left - coalesce(started.n, 0) <= 0 THEN 'concurrency'
       END,
       extract(epoch FROM room.window_start + room.period * interval '1 second'
                          - statement_timestamp())::float8,
       CAST(extract(epoch FROM room.running) * 1000000 AS bigint)
FROM room LEFT JOIN started ON started.type = room.type;

-- name: job_next_due
-- parameters: $1 queues, $2 floor_queues, $3 floor_priorities, $4 floors
SELECT EXTRACT(EPOCH FROM min(n.run_at) - now())::float8 AS seconds
FROM unnest(CAST($1 AS text[])) AS w(queue)
CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($2 AS text[]),
                    CAST($3 AS smallint[]),
                    CAST($4 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
    SELECT (WITH RECURSIVE keys_present(k) AS (
        SELECT CAST('' AS text) COLLATE "C"
        UNION ALL
        SELECT (SELECT coalesce(concurrency_key, '') FROM jobqueue.jobs WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') > keys_present.k ORDER BY coalesce(concurrency_key, '') LIMIT 1) FROM keys_present WHERE keys_present.k IS NOT NULL
    )
            SELECT min((SELECT run_at FROM jobqueue.jobs
                        WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = keys_present.k AND run_at > now()
                        ORDER BY run_at LIMIT 1))
            FROM keys_present WHERE keys_present.k IS NOT NULL) AS run_at
    FROM priorities WHERE priorities.p IS NOT NULL
) AS n;

-- name: job_claim_heads
-- parameters: $1 queues, $2 floor_queues, $3 floor_priorities, $4 floors, $5 key_floor_queues, $6 key_floor_priorities, $7 key_floor_keys
SELECT w.queue, h.p AS priority, CAST(NULL AS text) AS concurrency_key, h.run_at
FROM unnest(CAST($1 AS text[])) AS w(queue)
CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($2 AS text[]),
                    CAST($3 AS smallint[]),
                    CAST($4 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
    SELECT priorities.p, (SELECT run_at FROM jobqueue.jobs
                          WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p AND coalesce(concurrency_key, '') = '' AND run_at <= now()
                          ORDER BY run_at, id LIMIT 1) AS run_at
    FROM priorities WHERE priorities.p IS NOT NULL
) AS h
WHERE h.run_at IS NOT NULL
UNION ALL
SELECT x.q, x.p, x.k, (SELECT run_at FROM jobqueue.jobs
                       WHERE status = 'pending' AND queue = x.q AND priority = x.p
                         AND coalesce(concurrency_key, '') = x.k AND run_at <= now()
                       ORDER BY run_at, id LIMIT 1) AS run_at
FROM unnest(CAST($5 AS text[]), CAST($6 AS smallint[]),
            CAST($7 AS text[]) COLLATE "C") AS x(q, p, k)
WHERE x.q = ANY(CAST($1 AS text[]));

-- name: job_key_lease_first
-- parameters: $1 queues, $2 key_lease_floor
SELECT least((SELECT locked_until FROM jobqueue.jobs
              WHERE status = 'processing'
                AND concurrency_key IS NOT NULL AND queue = ANY(CAST($1 AS text[]))
                AND locked_until >= coalesce(CAST('epoch' AS timestamptz) + CAST($2 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))
              ORDER BY locked_until LIMIT 1), now()) AS first;

-- name: table_count_claim_reads
-- parameters: (none)
SELECT pg_stat_get_xact_tuples_returned(CAST('jobqueue.jobs_claim_key_idx' AS regclass)) AS n;

-- name: job_set_outcome_complete
-- parameters: $1 ids, $2 tokens, $3 results
UPDATE jobqueue.jobs SET status='completed', locked_until=NULL, last_error=NULL, result=CAST(o.result AS JSONB), finished_at=now(), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[]) AS o(id, token, result) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_set_outcome_fail
-- parameters: $1 ids, $2 tokens, $3 errors, $4 tracebacks
UPDATE jobqueue.jobs SET status='failed', locked_until=NULL, last_error=o.error, finished_at=now(), errors=jsonb_path_query_array(coalesce(jobqueue.jobs.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('attempt', jobqueue.jobs.attempts, 'at', now(), 'error', o.error, 'traceback', o.traceback)), '$[last - 19 to last]'::jsonpath), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[], $4::TEXT[]) AS o(id, token, error, traceback) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_set_outcome_dead_letter
-- parameters: $1 ids, $2 tokens, $3 errors, $4 tracebacks
UPDATE jobqueue.jobs SET status='dead_letter', locked_until=NULL, last_error=o.error, finished_at=now(), errors=jsonb_path_query_array(coalesce(jobqueue.jobs.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('attempt', jobqueue.jobs.attempts, 'at', now(), 'error', o.error, 'traceback', o.traceback)), '$[last - 19 to last]'::jsonpath), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[], $4::TEXT[]) AS o(id, token, error, traceback) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_set_outcome_cancel_attempt
-- parameters: $1 ids, $2 tokens
UPDATE jobqueue.jobs SET status='cancelled', locked_until=NULL, finished_at=now(), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[]) AS o(id, token) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_set_outcome_retry_later
-- parameters: $1 ids, $2 tokens, $3 errors, $4 tracebacks, $5 delays
UPDATE jobqueue.jobs SET status=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled' ELSE 'pending' END, run_at=(now() + o.delay * interval '1 second'), locked_until=NULL, last_error=o.error, finished_at=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN now() END, errors=jsonb_path_query_array(coalesce(jobqueue.jobs.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('attempt', jobqueue.jobs.attempts, 'at', now(), 'error', o.error, 'traceback', o.traceback)), '$[last - 19 to last]'::jsonpath), updated_at=now() FROM unnest($1::UUID[], $2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::FLOAT[]) AS o(id, token, error, traceback, delay) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_set_outcome_snooze
-- parameters: $1 attempts_1=1, $2 ids, $3 tokens, $4 delays
UPDATE jobqueue.jobs SET status=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled' ELSE 'pending' END, attempts=(jobqueue.jobs.attempts - $1::INTEGER), run_at=(now() + o.delay * interval '1 second'), locked_until=NULL, finished_at=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN now() END, updated_at=now() FROM unnest($2::UUID[], $3::BIGINT[], $4::FLOAT[]) AS o(id, token, delay) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_set_outcome_release
-- parameters: $1 attempts_1=1, $2 ids, $3 tokens
UPDATE jobqueue.jobs SET status=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled' ELSE 'pending' END, attempts=(jobqueue.jobs.attempts - $1::INTEGER), locked_until=NULL, finished_at=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN now() END, updated_at=now() FROM unnest($2::UUID[], $3::BIGINT[]) AS o(id, token) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_set_outcome_unhandled
-- parameters: $1 attempts_1=1, $2 ids, $3 tokens, $4 errors, $5 tracebacks
UPDATE jobqueue.jobs SET status=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled' ELSE 'pending' END, attempts=(jobqueue.jobs.attempts - $1::INTEGER), run_at=(now() + least(1.0 * power(2, least(jsonb_array_length(jsonb_path_query_array(coalesce(jobqueue.jobs.errors, '[]'::jsonb), '$[*] ? (@.attempt == $n)'::jsonpath, jsonb_build_object('n', jobqueue.jobs.attempts))), 16)), 60.0) * interval '1 second'), locked_until=NULL, last_error=o.error, finished_at=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN now() END, errors=jsonb_path_query_array(coalesce(jobqueue.jobs.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('attempt', jobqueue.jobs.attempts, 'at', now(), 'error', o.error, 'traceback', o.traceback)), '$[last - 19 to last]'::jsonpath), updated_at=now() FROM unnest($2::UUID[], $3::BIGINT[], $4::TEXT[], $5::TEXT[]) AS o(id, token, error, traceback) WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_renew_many
-- parameters: $1 lease_seconds, $2 ids, $3 tokens
WITH unlocked AS 
(SELECT jobqueue.jobs.id AS id, jobqueue.jobs.lease_token AS lease_token 
FROM jobqueue.jobs, unnest($2::UUID[], $3::BIGINT[]) AS o(id, token) 
WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token FOR NO KEY UPDATE OF jobs SKIP LOCKED), 
renewed AS 
(UPDATE jobqueue.jobs SET locked_until=(now() + $1::FLOAT * interval '1 second') FROM unlocked WHERE jobqueue.jobs.id = unlocked.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = unlocked.lease_token RETURNING jobqueue.jobs.id, jobqueue.jobs.lease_token, jobqueue.jobs.cancel_requested_at IS NOT NULL AS cancel)
 SELECT renewed.id, renewed.lease_token, renewed.cancel, true AS renewed 
FROM renewed UNION ALL SELECT jobqueue.jobs.id, jobqueue.jobs.lease_token, jobqueue.jobs.cancel_requested_at IS NOT NULL AS cancel, false AS anon_1 
FROM jobqueue.jobs, unnest($2::UUID[], $3::BIGINT[]) AS o(id, token) 
WHERE jobqueue.jobs.id = o.id AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.lease_token = o.token AND (o.id NOT IN (SELECT renewed.id 
FROM renewed));

-- name: job_release_claim
-- parameters: $1 attempts_1=1, $2 claim_ids
UPDATE jobqueue.jobs SET status=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled' ELSE 'pending' END, attempts=(jobqueue.jobs.attempts - $1::INTEGER), locked_until=NULL, finished_at=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN now() END, updated_at=now() WHERE jobqueue.jobs.status = 'processing' AND jobqueue.jobs.claim_id = ANY ($2::UUID[]) RETURNING jobqueue.jobs.id, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_recover_expired
-- parameters: $1 concat_1='lease expired during attempt ', $2 window, $3 param_1=1000
WITH expired AS MATERIALIZED 
(SELECT jobqueue.jobs.id AS id 
FROM jobqueue.jobs 
WHERE jobqueue.jobs.status = 'processing' AND jobqueue.jobs.locked_until < now() AND jobqueue.jobs.locked_until >= coalesce(now() - $2::FLOAT * interval '1 second', CAST('-infinity' AS timestamptz)) ORDER BY jobqueue.jobs.locked_until 
 LIMIT $3::INTEGER FOR UPDATE SKIP LOCKED)
 UPDATE jobqueue.jobs SET status=CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled' WHEN (jobqueue.jobs.attempts >= jobqueue.jobs.max_attempts) THEN 'dead_letter' ELSE 'pending' END, locked_until=NULL, last_error=concat($1::VARCHAR, jobqueue.jobs.attempts), finished_at=CASE WHEN (CASE WHEN (jobqueue.jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled' WHEN (jobqueue.jobs.attempts >= jobqueue.jobs.max_attempts) THEN 'dead_letter' ELSE 'pending' END IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN now() END, errors=jsonb_path_query_array(coalesce(jobqueue.jobs.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('attempt', jobqueue.jobs.attempts, 'at', now(), 'error', concat($1::VARCHAR, jobqueue.jobs.attempts), 'traceback', NULL)), '$[last - 19 to last]'::jsonpath), updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT expired.id 
FROM expired))) RETURNING jobqueue.jobs.id, jobqueue.jobs.status, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_type_record
-- parameters: $1 recorded_by, $2 types, $3 options, $4 schedules
INSERT INTO jobqueue.job_types (type, options, schedules, recorded_by, recorded_at) SELECT g.type, CAST(g.options AS JSONB) AS options, CAST(g.schedules AS JSONB) AS schedules, $1::VARCHAR AS anon_1, now() AS now_1 
FROM unnest($2::TEXT[], $3::TEXT[], $4::TEXT[]) AS g(type, options, schedules) ORDER BY g.type ON CONFLICT (type) DO UPDATE SET options = excluded.options, schedules = excluded.schedules, recorded_by = excluded.recorded_by, recorded_at = excluded.recorded_at;

-- name: job_type_list
-- parameters: $1 max_age
SELECT jobqueue.job_types.type, jobqueue.job_types.options, jobqueue.job_types.schedules, jobqueue.job_types.recorded_by, jobqueue.job_types.recorded_at 
FROM jobqueue.job_types 
WHERE jobqueue.job_types.recorded_at > now() - $1::FLOAT * interval '1 second' ORDER BY jobqueue.job_types.type;

-- name: job_type_find
-- parameters: $1 types, $2 max_age
SELECT jobqueue.job_types.type, jobqueue.job_types.options, jobqueue.job_types.schedules, jobqueue.job_types.recorded_by, jobqueue.job_types.recorded_at 
FROM jobqueue.job_types 
WHERE jobqueue.job_types.type = ANY ($1::TEXT[]) AND jobqueue.job_types.recorded_at > now() - $2::FLOAT * interval '1 second' ORDER BY jobqueue.job_types.type;

-- name: job_retry
-- parameters: $1 attempts=0, $2 job_id
UPDATE jobqueue.jobs SET status='pending', attempts=$1::INTEGER, run_at=now(), result=NULL, cancel_requested_at=NULL, finished_at=NULL, awaited=false, updated_at=now() WHERE jobqueue.jobs.id = $2::UUID AND jobqueue.jobs.status IN ('cancelled', 'dead_letter', 'failed') RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.status, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.run_at, jobqueue.jobs.locked_until, jobqueue.jobs.lease_token, jobqueue.jobs.last_error, jobqueue.jobs.idempotency_key, jobqueue.jobs.created_at, jobqueue.jobs.updated_at, jobqueue.jobs.queue, jobqueue.jobs.priority, jobqueue.jobs.timeout, jobqueue.jobs.concurrency_key, jobqueue.jobs.result, jobqueue.jobs.cancel_requested_at, jobqueue.jobs.finished_at;

-- name: job_retry_many
-- parameters: $1 attempts=0, $2 job_ids
UPDATE jobqueue.jobs SET status='pending', attempts=$1::INTEGER, run_at=now(), result=NULL, cancel_requested_at=NULL, finished_at=NULL, awaited=false, updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT jobqueue.jobs.id 
FROM jobqueue.jobs 
WHERE jobqueue.jobs.id = ANY ($2::UUID[]) ORDER BY jobqueue.jobs.id FOR UPDATE SKIP LOCKED))) AND jobqueue.jobs.status IN ('cancelled', 'dead_letter', 'failed') RETURNING jobqueue.jobs.id;

-- name: job_cancel
-- parameters: $1 job_id
UPDATE jobqueue.jobs SET status='cancelled', finished_at=now(), updated_at=now() WHERE jobqueue.jobs.id = $1::UUID AND jobqueue.jobs.status IN ('dead_letter', 'pending') RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.status, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.run_at, jobqueue.jobs.locked_until, jobqueue.jobs.lease_token, jobqueue.jobs.last_error, jobqueue.jobs.idempotency_key, jobqueue.jobs.created_at, jobqueue.jobs.updated_at, jobqueue.jobs.queue, jobqueue.jobs.priority, jobqueue.jobs.timeout, jobqueue.jobs.concurrency_key, jobqueue.jobs.result, jobqueue.jobs.cancel_requested_at, jobqueue.jobs.finished_at, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_cancel_many
-- parameters: $1 job_ids
UPDATE jobqueue.jobs SET status='cancelled', finished_at=now(), updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT jobqueue.jobs.id 
FROM jobqueue.jobs 
WHERE jobqueue.jobs.id = ANY ($1::UUID[]) ORDER BY jobqueue.jobs.id FOR UPDATE SKIP LOCKED))) AND jobqueue.jobs.status IN ('dead_letter', 'pending') RETURNING jobqueue.jobs.id, CASE WHEN (jobqueue.jobs.awaited AND jobqueue.jobs.status IN ('cancelled', 'completed', 'dead_letter', 'failed')) THEN pg_notify('jobqueue_finished', CAST(jobqueue.jobs.id AS TEXT)) END AS woke;

-- name: job_request_cancel
-- parameters: $1 job_id
UPDATE jobqueue.jobs SET cancel_requested_at=coalesce(jobqueue.jobs.cancel_requested_at, now()), updated_at=now() WHERE jobqueue.jobs.id = $1::UUID AND jobqueue.jobs.status = 'processing' RETURNING jobqueue.jobs.id, jobqueue.jobs.type, jobqueue.jobs.payload, jobqueue.jobs.status, jobqueue.jobs.attempts, jobqueue.jobs.max_attempts, jobqueue.jobs.run_at, jobqueue.jobs.locked_until, jobqueue.jobs.lease_token, jobqueue.jobs.last_error, jobqueue.jobs.idempotency_key, jobqueue.jobs.created_at, jobqueue.jobs.updated_at, jobqueue.jobs.queue, jobqueue.jobs.priority, jobqueue.jobs.timeout, jobqueue.jobs.concurrency_key, jobqueue.jobs.result, jobqueue.jobs.cancel_requested_at, jobqueue.jobs.finished_at, pg_notify('jobqueue_cancel', CAST(jobqueue.jobs.id AS TEXT)) AS announced;

-- name: job_request_cancel_many
-- parameters: $1 job_ids
UPDATE jobqueue.jobs SET cancel_requested_at=coalesce(jobqueue.jobs.cancel_requested_at, now()), updated_at=now() WHERE jobqueue.jobs.id = ANY (array((SELECT jobqueue.jobs.id 
FROM jobqueue.jobs 
WHERE jobqueue.jobs.id = ANY ($1::UUID[]) ORDER BY jobqueue.jobs.id FOR UPDATE SKIP LOCKED))) AND jobqueue.jobs.status = 'processing' AND jobqueue.jobs.cancel_requested_at IS NULL RETURNING jobqueue.jobs.id, pg_notify('jobqueue_cancel', CAST(jobqueue.jobs.id AS TEXT)) AS announced;

-- name: job_watch
-- parameters: $1 job_id
UPDATE jobqueue.jobs SET awaited=true WHERE jobqueue.jobs.id = $1::UUID AND (jobqueue.jobs.status NOT IN ('cancelled', 'completed', 'dead_letter', 'failed')) RETURNING jobqueue.jobs.id;

-- name: queue_get_depths
-- parameters: $1 known_queues, $2 lease_floor, $3 floor_queues, $4 floor_priorities, $5 floors
WITH RECURSIVE listed AS MATERIALIZED (
    SELECT coalesce(array_agg(q ORDER BY q), '{}') AS qs
    FROM unnest(CAST($1 AS text[])) AS q
),
in_jobs(queue, i) AS (
    SELECT s.queue, s.i FROM listed CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.queue, 1 AS i FROM (
                SELECT queue FROM jobqueue.jobs WHERE status <> 'processing' AND queue < listed.qs[1]
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT g.queue, 1 FROM (
                SELECT queue FROM jobqueue.jobs WHERE status <> 'processing' AND listed.qs[1] IS NULL
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT listed.qs[1], 1 + 1 WHERE listed.qs[1] IS NOT NULL
        ) AS step LIMIT 1) AS s
    UNION ALL
    SELECT s.queue, s.i FROM in_jobs CROSS JOIN listed
    CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.queue, in_jobs.i AS i FROM (
                SELECT queue FROM jobqueue.jobs WHERE status <> 'processing' AND queue > in_jobs.queue AND queue < listed.qs[in_jobs.i]
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT g.queue, in_jobs.i FROM (
                SELECT queue FROM jobqueue.jobs WHERE status <> 'processing' AND queue > in_jobs.queue AND listed.qs[in_jobs.i] IS NULL
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT listed.qs[in_jobs.i], in_jobs.i + 1 WHERE listed.qs[in_jobs.i] IS NOT NULL
        ) AS step LIMIT 1) AS s
),
in_history(queue, i) AS (
    SELECT s.queue, s.i FROM listed CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.queue, 1 AS i FROM (
                SELECT queue FROM jobqueue.jobs_history WHERE TRUE AND queue < listed.qs[1]
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT g.queue, 1 FROM (
                SELECT queue FROM jobqueue.jobs_history WHERE TRUE AND listed.qs[1] IS NULL
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT listed.qs[1], 1 + 1 WHERE listed.qs[1] IS NOT NULL
        ) AS step LIMIT 1) AS s
    UNION ALL
    SELECT s.queue, s.i FROM in_history CROSS JOIN listed
    CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.queue, in_history.i AS i FROM (
                SELECT queue FROM jobqueue.jobs_history WHERE TRUE AND queue > in_history.queue AND queue < listed.qs[in_history.i]
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT g.queue, in_history.i FROM (
                SELECT queue FROM jobqueue.jobs_history WHERE TRUE AND queue > in_history.queue AND listed.qs[in_history.i] IS NULL
                ORDER BY queue LIMIT 1
            ) AS g
            UNION ALL
            SELECT listed.qs[in_history.i], in_history.i + 1 WHERE listed.qs[in_history.i] IS NOT NULL
        ) AS step LIMIT 1) AS s
),
running AS MATERIALIZED (
    SELECT queue, count(*) AS n, least(min(locked_until), now()) AS first
    FROM jobqueue.jobs
    WHERE status = 'processing' AND locked_until >= coalesce(CAST('epoch' AS timestamptz) + CAST($2 AS bigint) * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))
    GROUP BY queue
), queues AS (
    SELECT queue FROM in_jobs
    UNION
    SELECT queue FROM in_history
    UNION
    SELECT queue FROM running
)
SELECT w.queue, coalesce(p.pending, 0) AS pending, coalesce(p.scheduled, 0) AS scheduled,
       coalesce(r.n, 0) AS processing,
       (SELECT count(*) FROM jobqueue.jobs
        WHERE status = 'dead_letter' AND queue = w.queue) AS dead_letter,
       coalesce(extract(epoch FROM now() - p.oldest_due), 0)::float8
           AS oldest_pending_age_seconds,
       coalesce(p.priorities, '{}') AS priorities, coalesce(p.firsts, '{}') AS firsts,
       CAST(extract(epoch FROM coalesce(r.first, now())) * 1000000 AS bigint) AS running
FROM queues AS w
LEFT JOIN running AS r ON r.queue = w.queue
CROSS JOIN LATERAL (
    WITH RECURSIVE known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{}') AS fs
        FROM unnest(CAST($3 AS text[]),
                    CAST($4 AS smallint[]),
                    CAST($5 AS bigint[])) AS k(q, p, f)
        WHERE k.q = w.queue
    ), priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, 1 AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue
                  AND priority > coalesce(known.ps[1], -32768)
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[1], known.fs[1], 1 + 1 WHERE known.ps[1] IS NOT NULL
        ) AS step LIMIT 1) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL (SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, priorities.i AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE status = 'pending' AND queue = w.queue AND priority < priorities.p
                  AND priority > coalesce(known.ps[priorities.i], -32768) AND coalesce(known.ps[priorities.i], -32768) < priorities.p - 1
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[priorities.i], known.fs[priorities.i], priorities.i + 1 WHERE known.ps[priorities.i] IS NOT NULL
        ) AS step LIMIT 1) AS n
    )
    SELECT CAST(sum(x.pending) AS bigint) AS pending,
           CAST(sum(x.scheduled) AS bigint) AS scheduled,
           min(x.oldest_due) AS oldest_due,
           array_agg(priorities.p ORDER BY priorities.p DESC) AS priorities,
           array_agg(x.first ORDER BY priorities.p DESC) AS firsts
    FROM priorities CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE run_at <= now()) AS pending,
               count(*) FILTER (WHERE run_at > now()) AS scheduled,
               min(run_at) FILTER (WHERE run_at <= now()) AS oldest_due,
               CAST(extract(epoch FROM least(min(run_at), now())) * 1000000 AS bigint) AS first
        FROM jobqueue.jobs
        WHERE status = 'pending' AND queue = w.queue AND priority = priorities.p
          AND run_at >= coalesce(priorities.f, CAST('-infinity' AS timestamptz))
    ) AS x
    WHERE priorities.p IS NOT NULL
) AS p
ORDER BY w.queue;

-- name: job_count_finished_per_minute
-- parameters: (none)
WITH finished AS (
    SELECT date_trunc('minute', finished_at) AS minute, status, count(*) AS n
    FROM (SELECT finished_at, status FROM jobqueue.jobs WHERE finished_at >= date_trunc('minute', now()) - interval '59 minutes'
          UNION ALL
          SELECT finished_at, status FROM jobqueue.jobs_history
          WHERE finished_at >= date_trunc('minute', now()) - interval '59 minutes') AS hour_
    GROUP BY 1, 2
)
SELECT m.minute, f.status, f.n AS finished
FROM generate_series(date_trunc('minute', now()) - interval '59 minutes', date_trunc('minute', now()), interval '1 minute')
    AS m(minute)
LEFT JOIN finished AS f ON f.minute = m.minute
ORDER BY m.minute, f.status;

-- name: queue_get_hour
-- parameters: (none)
WITH finished AS (
    SELECT queue, date_trunc('minute', finished_at) AS minute, count(*) AS n,
           min(run_at) AS oldest
    FROM (SELECT queue, finished_at, run_at FROM jobqueue.jobs
          WHERE finished_at >= date_trunc('minute', now()) - interval '59 minutes'
          UNION ALL
          SELECT queue, finished_at, run_at FROM jobqueue.jobs_history
          WHERE finished_at >= date_trunc('minute', now()) - interval '59 minutes') AS hour_
    GROUP BY 1, 2
), unfinished AS (
    SELECT queue, min(oldest) AS oldest FROM (
        SELECT queue, min(run_at) AS oldest FROM jobqueue.jobs
        WHERE status = 'pending' GROUP BY queue
        UNION ALL
        SELECT queue, min(run_at) FROM jobqueue.jobs
        WHERE status = 'processing' GROUP BY queue
    ) AS both_ GROUP BY queue
), queues AS (
    SELECT queue FROM finished UNION SELECT queue FROM unfinished
), grid AS (
    SELECT q.queue, m.minute, least(m.minute + interval '1 minute', now()) AS at_end,
           coalesce(f.n, 0) AS finished,
           least(
               min(f.oldest) OVER (
                   PARTITION BY q.queue ORDER BY m.minute DESC
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
               ),
               u.oldest
           ) AS oldest
    FROM queues AS q
    CROSS JOIN generate_series(date_trunc('minute', now()) - interval '59 minutes', date_trunc('minute', now()), interval '1 minute')
        AS m(minute)
    LEFT JOIN finished AS f ON f.queue = q.queue AND f.minute = m.minute
    LEFT JOIN unfinished AS u ON u.queue = q.queue
)
SELECT queue, minute, finished,
       CASE WHEN oldest <= at_end THEN extract(epoch FROM at_end - oldest) ELSE 0 END::float8
           AS oldest_pending_age_seconds
FROM grid
ORDER BY queue, minute;

-- name: job_find_by_keys
-- parameters: $1 keys
SELECT jobqueue.jobs.id, jobqueue.jobs.idempotency_key, jobqueue.jobs.status, jobqueue.jobs.created_at 
FROM jobqueue.jobs 
WHERE jobqueue.jobs.idempotency_key = ANY ($1::TEXT[]) ORDER BY jobqueue.jobs.idempotency_key;

-- name: lead_take
-- parameters: $1 task, $2 holder, $3 lease_seconds
INSERT INTO jobqueue.maintenance_leases (task, holder, expires_at) VALUES ($1::VARCHAR, $2::UUID, (now() + $3::FLOAT * interval '1 second')) ON CONFLICT (task) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at WHERE jobqueue.maintenance_leases.holder = excluded.holder OR jobqueue.maintenance_leases.expires_at < now() RETURNING jobqueue.maintenance_leases.holder;

-- name: lead_resign
-- parameters: $1 task, $2 holder
DELETE FROM jobqueue.maintenance_leases WHERE jobqueue.maintenance_leases.task = $1::VARCHAR AND jobqueue.maintenance_leases.holder = $2::UUID;

-- name: job_prune_cancelled
-- parameters: $1 age
WITH gone AS (
    DELETE FROM jobqueue.jobs WHERE id = ANY(ARRAY(
        SELECT id FROM jobqueue.jobs
        WHERE status BETWEEN 'cancelled' AND 'cancelled'
          AND (status, id) < ('cancelled', CAST(regexp_replace(
    lpad(to_hex(floor(extract(epoch FROM now() - CAST($1 AS float8) * interval '1 second')
                      * 1000)::bigint), 12, '0') || '00000000000000000000',
    '^(.{8})(.{4})(.{4})(.{4})(.{12})$', '\1-\2-\3-\4-\5') AS uuid))
          AND coalesce(finished_at, updated_at)
              < now() - CAST($1 AS float8) * interval '1 second'
        ORDER BY status, id LIMIT 5000
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING 1
)
SELECT count(*) AS pruned FROM gone;

-- name: job_prune_completed
-- parameters: $1 age
WITH gone AS (
    DELETE FROM jobqueue.jobs WHERE id = ANY(ARRAY(
        SELECT id FROM jobqueue.jobs
        WHERE status BETWEEN 'completed' AND 'completed'
          AND (status, id) < ('completed', CAST(regexp_replace(
    lpad(to_hex(floor(extract(epoch FROM now() - CAST($1 AS float8) * interval '1 second')
                      * 1000)::bigint), 12, '0') || '00000000000000000000',
    '^(.{8})(.{4})(.{4})(.{4})(.{12})$', '\1-\2-\3-\4-\5') AS uuid))
          AND coalesce(finished_at, updated_at)
              < now() - CAST($1 AS float8) * interval '1 second'
        ORDER BY status, id LIMIT 5000
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING 1
)
SELECT count(*) AS pruned FROM gone;

-- name: job_prune_dead_letter
-- parameters: $1 age
WITH gone AS (
    DELETE FROM jobqueue.jobs WHERE id = ANY(ARRAY(
        SELECT id FROM jobqueue.jobs
        WHERE status BETWEEN 'dead_letter' AND 'dead_letter'
          AND (status, id) < ('dead_letter', CAST(regexp_replace(
    lpad(to_hex(floor(extract(epoch FROM now() - CAST($1 AS float8) * interval '1 second')
                      * 1000)::bigint), 12, '0') || '00000000000000000000',
    '^(.{8})(.{4})(.{4})(.{4})(.{12})$', '\1-\2-\3-\4-\5') AS uuid))
          AND coalesce(finished_at, updated_at)
              < now() - CAST($1 AS float8) * interval '1 second'
        ORDER BY status, id LIMIT 5000
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING 1
)
SELECT count(*) AS pruned FROM gone;

-- name: job_prune_failed
-- parameters: $1 age
WITH gone AS (
    DELETE FROM jobqueue.jobs WHERE id = ANY(ARRAY(
        SELECT id FROM jobqueue.jobs
        WHERE status BETWEEN 'failed' AND 'failed'
          AND (status, id) < ('failed', CAST(regexp_replace(
    lpad(to_hex(floor(extract(epoch FROM now() - CAST($1 AS float8) * interval '1 second')
                      * 1000)::bigint), 12, '0') || '00000000000000000000',
    '^(.{8})(.{4})(.{4})(.{4})(.{12})$', '\1-\2-\3-\4-\5') AS uuid))
          AND coalesce(finished_at, updated_at)
              < now() - CAST($1 AS float8) * interval '1 second'
        ORDER BY status, id LIMIT 5000
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING 1
)
SELECT count(*) AS pruned FROM gone;

-- name: table_get_stats
-- parameters: $1 tables
SELECT t.name, coalesce(s.n_dead_tup, 0) AS dead,
       current_setting('autovacuum') = 'on'
       AND NOT coalesce('autovacuum_enabled=false' = ANY(c.reloptions), false) AS autovacuum
FROM unnest(CAST($1 AS text[])) AS t(name)
JOIN pg_class AS c ON c.oid = CAST(t.name AS regclass)
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
ORDER BY 1;

-- name: queue_pause
-- parameters: $1 queue
INSERT INTO jobqueue.queue_pauses (queue) VALUES ($1::VARCHAR) ON CONFLICT (queue) DO UPDATE SET queue = excluded.queue RETURNING jobqueue.queue_pauses.queue, jobqueue.queue_pauses.paused_at, pg_notify('jobqueue_pauses', jobqueue.queue_pauses.queue) AS announced;

-- name: queue_resume
-- parameters: $1 queue
DELETE FROM jobqueue.queue_pauses WHERE jobqueue.queue_pauses.queue = $1::VARCHAR RETURNING jobqueue.queue_pauses.queue, pg_notify('jobqueue_pauses', jobqueue.queue_pauses.queue) AS announced;

-- name: queue_list_paused
-- parameters: (none)
SELECT jobqueue.queue_pauses.queue, jobqueue.queue_pauses.paused_at 
FROM jobqueue.queue_pauses ORDER BY jobqueue.queue_pauses.queue;

-- name: queue_get_paused
-- parameters: $1 queue
SELECT EXISTS (SELECT * 
FROM jobqueue.queue_pauses 
WHERE jobqueue.queue_pauses.queue = $1::VARCHAR) AS paused;

-- name: job_get_many
-- parameters: $1 job_ids
SELECT found.id, found.type, found.payload, found.status, found.attempts, found.max_attempts, found.run_at, found.locked_until, found.lease_token, found.last_error, found.idempotency_key, found.created_at, found.updated_at, found.queue, found.priority, found.timeout, found.concurrency_key, found.result, found.cancel_requested_at, found.finished_at 
FROM (SELECT jobqueue.jobs.id AS id, jobqueue.jobs.type AS type, jobqueue.jobs.payload AS payload, jobqueue.jobs.status AS status, jobqueue.jobs.attempts AS attempts, jobqueue.jobs.max_attempts AS max_attempts, jobqueue.jobs.run_at AS run_at, jobqueue.jobs.locked_until AS locked_until, jobqueue.jobs.lease_token AS lease_token, jobqueue.jobs.last_error AS last_error, jobqueue.jobs.idempotency_key AS idempotency_key, jobqueue.jobs.created_at AS created_at, jobqueue.jobs.updated_at AS updated_at, jobqueue.jobs.queue AS queue, jobqueue.jobs.priority AS priority, jobqueue.jobs.timeout AS timeout, jobqueue.jobs.concurrency_key AS concurrency_key, jobqueue.jobs.result AS result, jobqueue.jobs.cancel_requested_at AS cancel_requested_at, jobqueue.jobs.finished_at AS finished_at 
FROM jobqueue.jobs 
WHERE jobqueue.jobs.id = ANY ($1::UUID[]) UNION ALL SELECT jobqueue.jobs_history.id AS id, jobqueue.jobs_history.type AS type, jobqueue.jobs_history.payload AS payload, jobqueue.jobs_history.status AS status, jobqueue.jobs_history.attempts AS attempts, jobqueue.jobs_history.max_attempts AS max_attempts, jobqueue.jobs_history.run_at AS run_at, jobqueue.jobs_history.locked_until AS locked_until, jobqueue.jobs_history.lease_token AS lease_token, jobqueue.jobs_history.last_error AS last_error, jobqueue.jobs_history.idempotency_key AS idempotency_key, jobqueue.jobs_history.created_at AS created_at, jobqueue.jobs_history.updated_at AS updated_at, jobqueue.jobs_history.queue AS queue, jobqueue.jobs_history.priority AS priority, jobqueue.jobs_history.timeout AS timeout, jobqueue.jobs_history.concurrency_key AS concurrency_key, jobqueue.jobs_history.result AS result, jobqueue.jobs_history.cancel_requested_at AS cancel_requested_at, jobqueue.jobs_history.finished_at AS finished_at 
FROM jobqueue.jobs_history 
WHERE jobqueue.jobs_history.id = ANY ($1::UUID[])) AS found ORDER BY found.id DESC;

-- name: history_list_leaves
-- parameters: $1 parent
SELECT c.relname AS name FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = CAST($1 AS regclass);

-- name: history_prune
-- parameters: $1 age, $2 batch
WITH gone AS (
    DELETE FROM jobqueue.jobs_history
    WHERE finished_at < now() - CAST($1 AS float8) * interval '1 second'
      AND id = ANY(ARRAY(
        SELECT id FROM jobqueue.jobs_history
        WHERE finished_at < now() - CAST($1 AS float8) * interval '1 second'
        ORDER BY finished_at LIMIT $2))
    RETURNING 1
)
SELECT count(*) AS pruned FROM gone;

-- name: history_move
-- parameters: $1 since, $2 until, $3 batch
WITH moved AS (
    DELETE FROM jobqueue.jobs WHERE id = ANY(ARRAY(
        SELECT id FROM jobqueue.jobs
        WHERE status = 'completed' AND idempotency_key IS NULL
          AND finished_at >= $1::TIMESTAMP WITH TIME ZONE AND finished_at < $2::TIMESTAMP WITH TIME ZONE
        ORDER BY finished_at LIMIT $3::INTEGER
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING id, type, payload, status, attempts, max_attempts, run_at, locked_until, lease_token, last_error, claim_id, queue, priority, timeout, idempotency_key, concurrency_key, leased_by, result, cancel_requested_at, finished_at, awaited, traceparent, errors, created_at, updated_at
), kept AS (
    INSERT INTO jobqueue.jobs_history (id, type, payload, status, attempts, max_attempts, run_at, locked_until, lease_token, last_error, claim_id, queue, priority, timeout, idempotency_key, concurrency_key, leased_by, result, cancel_requested_at, finished_at, awaited, traceparent, errors, created_at, updated_at) SELECT id, type, payload, status, attempts, max_attempts, run_at, locked_until, lease_token, last_error, claim_id, queue, priority, timeout, idempotency_key, concurrency_key, leased_by, result, cancel_requested_at, finished_at, awaited, traceparent, errors, created_at, updated_at FROM moved
    RETURNING finished_at
)
SELECT count(*) AS moved, max(finished_at) AS newest FROM kept;

-- name: history_get_oldest
-- parameters: $1 since
SELECT (SELECT min(finished_at) FROM jobqueue.jobs
        WHERE status = 'completed' AND idempotency_key IS NULL
          AND finished_at >= $1::TIMESTAMP WITH TIME ZONE) AS oldest,
       now() AS now;

-- name: notification_send
-- parameters: $1 token
SELECT pg_notify('jobqueue_check', $1::VARCHAR) AS sent;
