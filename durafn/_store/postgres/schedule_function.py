"""``durafn.schedule(name, args, run_at, options)``: scheduling from SQL, on PostgreSQL.

Graphile Worker's ``add_job`` is the model: a trigger, or a program in another language,
schedules a function in its own transaction (rolled back, nothing is scheduled). The
function validates what Python validates for the same options and raises
``invalid_parameter_value`` (SQLSTATE 22023) with a message that names the problem and
starts ``durafn.schedule:``; nothing is written then.

* ``name``: a durable name, as a worker registers it (an unknown name is accepted and
  written, as ``run_after("name")`` writes it: the worker records the row Failed with
  ``UnknownFunctionError``). ``args``: a JSON object of the arguments by name, checked by
  the worker against the function's signature when it runs (a mismatch fails the row
  with ``ArgumentError``; a parameter left out takes its default then, as from Python:
  ``FunctionRef.decode_args``). ``run_at``: when (NULL: now).
* ``options`` (NULL: none, as ``{}``): ``kind`` (``"action"``, the default, or ``"mutation"``: SQL cannot see
  the registry), ``priority`` (a 32-bit integer), ``queue`` (1 to 255 characters; a new
  queue is serial, as from Python), ``flags`` (an array of up to 32 flags of 1 to 64 of
  ``A-Z a-z 0-9 _ . : @ / + -``). Job keys, retry policies, flow control and
  dependencies are refused by name: schedule those rows from Python.

Returns the row's id: a UUIDv7 like Python's (the time in milliseconds, then random
bits). The executors are woken by the usual NOTIFY, at commit.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..._options import MAX_FLAG, MAX_FLAGS, MAX_NAME, PRIORITY_RANGE
from .send_event_function import install_send_event_function

CHANNEL = "durafn_wakeup"
"""The executors' NOTIFY channel (``postgres/multirow.py``'s; a test keeps them one)."""

_LOW, _HIGH = PRIORITY_RANGE

FUNCTION = f"""
CREATE OR REPLACE FUNCTION durafn.schedule(
    name text,
    args jsonb DEFAULT '{{}}'::jsonb,
    run_at timestamptz DEFAULT NULL,
    options jsonb DEFAULT '{{}}'::jsonb
) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_id uuid;
    v_due float8 := extract(epoch FROM coalesce(run_at, clock_timestamp()));
    v_unknown text;
    v_kind text;
    v_priority int := 0;
    v_queue text;
    v_item jsonb;
    v_flags text;
BEGIN
    IF name IS NULL OR btrim(name) = '' THEN
        RAISE EXCEPTION 'durafn.schedule: name must be a function''s durable name, not %',
            coalesce(quote_literal(name), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION 'durafn.schedule: args must be a JSON object of the arguments by name, not %',
            coalesce(args::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    -- NULL is no options, as '{{}}' is (version 21: it was refused).
    options := coalesce(options, '{{}}'::jsonb);
    IF jsonb_typeof(options) <> 'object' THEN
        RAISE EXCEPTION 'durafn.schedule: options must be a JSON object, not %',
            options::text USING ERRCODE = '22023';
    END IF;
    SELECT string_agg(k, ', ' ORDER BY k) INTO v_unknown
      FROM jsonb_object_keys(options) AS k
     WHERE k NOT IN ('kind', 'priority', 'queue', 'flags');
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'durafn.schedule: unknown or unsupported option(s) %; the options are flags, kind, priority, queue (keys, retries, flow control and after= are scheduled from Python)',
            v_unknown USING ERRCODE = '22023';
    END IF;
    v_kind := coalesce(options->>'kind', 'action');
    IF jsonb_typeof(coalesce(options->'kind', '"action"')) <> 'string'
       OR v_kind NOT IN ('action', 'mutation') THEN
        RAISE EXCEPTION 'durafn.schedule: kind must be "action" or "mutation", not %',
            options->'kind' USING ERRCODE = '22023';
    END IF;
    IF options ? 'priority' THEN
        IF jsonb_typeof(options->'priority') <> 'number' THEN
            RAISE EXCEPTION 'durafn.schedule: priority must be an integer between {_LOW} and {_HIGH} (lower runs first), not %',
                options->'priority' USING ERRCODE = '22023';
        END IF;
        IF (options->>'priority')::numeric <> trunc((options->>'priority')::numeric)
           OR (options->>'priority')::numeric NOT BETWEEN {_LOW} AND {_HIGH} THEN
            RAISE EXCEPTION 'durafn.schedule: priority must be an integer between {_LOW} and {_HIGH} (lower runs first), not %',
                options->'priority' USING ERRCODE = '22023';
        END IF;
        v_priority := (options->>'priority')::int;
    END IF;
    IF options ? 'queue' THEN
        v_queue := options->>'queue';
        IF jsonb_typeof(options->'queue') <> 'string' OR btrim(v_queue) = ''
           OR length(v_queue) > {MAX_NAME} THEN
            RAISE EXCEPTION 'durafn.schedule: queue must be a non-empty name of at most {MAX_NAME} characters, not %',
                options->'queue' USING ERRCODE = '22023';
        END IF;
        -- As _options.check_name (version 20): a worker's --queues separates names with
        -- commas and strips them.
        IF strpos(v_queue, ',') > 0 OR v_queue <> btrim(v_queue, E' \\t\\r\\n') THEN
            RAISE EXCEPTION 'durafn.schedule: queue % has a comma or a space at an end: a worker''s --queues lists queue names separated by commas, and strips them',
                options->'queue' USING ERRCODE = '22023';
        END IF;
    END IF;
    IF options ? 'flags' THEN
        IF jsonb_typeof(options->'flags') <> 'array'
           OR jsonb_array_length(options->'flags') > {MAX_FLAGS} THEN
            RAISE EXCEPTION 'durafn.schedule: flags must be an array of at most {MAX_FLAGS} flags, not %',
                options->'flags' USING ERRCODE = '22023';
        END IF;
        FOR v_item IN SELECT value FROM jsonb_array_elements(options->'flags') LOOP
            IF jsonb_typeof(v_item) <> 'string'
               OR (v_item #>> '{{}}') !~ '^[A-Za-z0-9_.:@/+-]{{1,{MAX_FLAG}}}$' THEN
                RAISE EXCEPTION 'durafn.schedule: flags: % is not a flag; a flag is 1 to {MAX_FLAG} characters of letters, digits and _ . : @ / + -',
                    v_item USING ERRCODE = '22023';
            END IF;
        END LOOP;
        SELECT ',' || string_agg(DISTINCT f, ',' ORDER BY f) || ','
          INTO v_flags FROM jsonb_array_elements_text(options->'flags') AS f;
    END IF;
    -- A UUIDv7: 48 bits of milliseconds, then the version, the variant, random bits.
    v_id := encode(
        decode(lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0'), 'hex')
        || durafn.random_bytes_v7(), 'hex')::uuid;
    IF v_queue IS NOT NULL THEN
        INSERT INTO _durafn_queues (name, concurrency, paused, created_at)
        VALUES (v_queue, 1, false, extract(epoch FROM clock_timestamp()))
        ON CONFLICT (name) DO NOTHING;
    END IF;
    INSERT INTO _scheduled_functions
        (id, name, kind, args, state, scheduled_time, available_at, priority, queue_name, flags)
    VALUES
        (v_id, name, v_kind, args::text, 'Pending', v_due, v_due, v_priority, v_queue, v_flags);
    PERFORM pg_notify('{CHANNEL}', v_kind);
    RETURN v_id;
END
$$
"""

# Ten random bytes with the version (7) and the variant (10) set, from the server's
# random(): PostgreSQL 13+ has gen_random_uuid() in core but no gen_random_bytes without
# pgcrypto, so the bytes are taken from a v4 uuid's, whose own version and variant bits
# are overwritten.
RANDOM_BYTES = """
CREATE OR REPLACE FUNCTION durafn.random_bytes_v7() RETURNS bytea
LANGUAGE sql VOLATILE AS $$
    SELECT set_byte(set_byte(b, 0, (get_byte(b, 0) & 15) | 112), 2, (get_byte(b, 2) & 63) | 128)
      FROM (SELECT substring(uuid_send(gen_random_uuid()) FROM 7 FOR 10) AS b) AS r
$$
"""


def install_schedule_function(conn: Connection) -> None:
    """Create (or replace) ``durafn.schedule`` in the schema ``durafn``."""
    conn.execute(text("CREATE SCHEMA IF NOT EXISTS durafn"))
    conn.execute(text(RANDOM_BYTES))
    conn.execute(text(FUNCTION))
    install_send_event_function(conn)  # durable workflows' events, scheduling through it
