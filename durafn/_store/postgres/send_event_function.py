"""``durafn.send_event(workflow_id, event, payload)``: an event for a durable workflow
sent from SQL, on PostgreSQL, in the caller's transaction (a trigger's, say): what
``app.send_event`` does from Python (``_workflow/lifecycle.py``), in one function.

It locks the workflow's row (as a turn does: a wait that begins and a send are ordered),
records the event, and, if the workflow waits for that name, schedules its turn through
``durafn.schedule``. Returns false (and records nothing) for a workflow that has ended;
an unknown id, or an empty name, raises ``invalid_parameter_value`` (SQLSTATE 22023)
with a message starting ``durafn.send_event:``.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

FUNCTION = """
CREATE OR REPLACE FUNCTION durafn.send_event(
    workflow_id uuid,
    event text,
    payload jsonb DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_state text;
    v_generation int;
    v_waiting text;
BEGIN
    IF event IS NULL OR event = '' THEN
        RAISE EXCEPTION 'durafn.send_event: an event''s name is a non-empty string'
            USING ERRCODE = '22023';
    END IF;
    SELECT w.state, w.generation, w.waiting_event INTO v_state, v_generation, v_waiting
      FROM _durafn_workflows AS w WHERE w.id = send_event.workflow_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'durafn.send_event: no workflow has id %', send_event.workflow_id
            USING ERRCODE = '22023';
    END IF;
    IF v_state NOT IN ('Running', 'Stopped') THEN
        RETURN false;
    END IF;
    INSERT INTO _durafn_workflow_events AS e (workflow_id, name, payload, sent_at)
    VALUES (send_event.workflow_id, send_event.event, send_event.payload::text,
            extract(epoch FROM clock_timestamp()));
    IF v_state = 'Running'
       AND send_event.event = ANY (string_to_array(coalesce(v_waiting, ''), ',')) THEN
        PERFORM durafn.schedule(
            'durafn:workflow_turn',
            jsonb_build_object(
                'workflow_id', send_event.workflow_id::text, 'generation', v_generation
            ),
            NULL,
            '{"kind": "mutation"}'::jsonb
        );
    END IF;
    RETURN true;
END
$$
"""


def install_send_event_function(conn: Connection) -> None:
    """Create (or replace) ``durafn.send_event`` (after ``durafn.schedule``, which it calls)."""
    conn.execute(text(FUNCTION))
