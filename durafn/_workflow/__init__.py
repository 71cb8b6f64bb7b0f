"""Durable workflows: one ``async def`` whose steps are journaled on durafn's own tables
and resumed after any crash (``@app.workflow``; the guide: docs/guides/durable-workflows.md).

How a workflow runs, and which module owns each part::

    app.start_workflow / ctx.scheduler.start_workflow        (lifecycle.start)
      a _durafn_workflows row (Running, generation 0) and a Pending row of
      durafn:workflow_turn, in the caller's transaction
                          │
                          ▼
    durafn:workflow_turn (a mutation: one transaction)        (lifecycle.workflow_turn)
      lock the workflow row; drop the turn if its generation is stale
      replay.Turn.run: the body re-run against _durafn_workflow_steps
        steps.advance: mutation/query steps run inline (savepoint), journaled;
                       an action step's row written (on_complete: step_done);
                       a sleep's or an event timeout's turn written (run_at);
                       a child's row and first turn written
      ending.conclude: Success/Failed (and the parent told), Stopped (a replay
                       that does not match its journal), or what it waits on
                          ▲
    durafn:workflow_step_done (the action row's completion)   (lifecycle.workflow_step_done)
      journal the outcome once (Started -> Success/Failed), then a turn, inline
    app.send_event / scheduler.send_event                     (lifecycle.send_event)
      an event row; a turn if the workflow waits for that name

The SQL is ``_store/workflows.py``; the tables ``_store/schema/tables.py`` (version 27).
Where to add things: a new kind of step is a method of ``api.WorkflowCtx`` (a
``Turn.request``) and a branch of ``steps.advance``; what a workflow's end does is
``ending``.
"""
