"""``durafn workflows``: durable workflows, listed (``ls``), shown with their journal
(``show``), cancelled and resumed (audited, as the other changes are). Reads need only
the database (``--url``): a workflow's row and journal say all there is."""

from __future__ import annotations

import functools
from typing import Any

import click
from rich.table import Column

from .._workflow.lifecycle import WorkflowNotFoundError
from .._workflow.models import Workflow, WorkflowState
from .options import app_options, output_options
from .output import Output, error_text, iso, shorten
from .running import Audited, run_with_app


@click.group()
def workflows() -> None:
    """Durable workflows (@app.workflow): list, show, explain, cancel, resume."""


@workflows.command(name="ls")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in WorkflowState]),
    help="Only workflows in this state (repeat for several).",
)
@click.option("--name", help="Only workflows of this durable name.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@app_options
@output_options
def list_workflows(
    states: tuple[str, ...],
    name: str | None,
    limit: int,
    app_ref: str | None,
    url: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Workflows, newest first: state, what a running one waits for, its steps."""
    chosen = [WorkflowState(s) for s in states] or None

    async def _list(app: Any) -> list[Workflow]:
        found: list[Workflow] = await app.list_workflows(state=chosen, name=name, limit=limit)
        return found

    found = run_with_app(app_ref, url, _list, verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json([w.model_dump(mode="json") for w in found])
        return
    if not found:
        out.line("no workflows")
        return
    out.table(
        [Column("id", no_wrap=True), "name", "state", Column("steps", justify="right"), "now"],
        [(w.id, w.name, w.state.value, w.step_count, _now(w)) for w in found],
    )


def _now(w: Workflow) -> str:
    if w.state is WorkflowState.RUNNING:
        return f"waits: {w.waiting}" if w.waiting else "running"
    if w.error is not None:
        return shorten(error_text(w.error), 80)
    return f"ended {iso(w.ended_at)}" if w.ended_at else ""


@workflows.command()
@click.argument("workflow_id")
@app_options
@output_options
def show(
    workflow_id: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """One workflow: its fields, then its journal, a line per step."""
    found = run_with_app(app_ref, url, functools.partial(_get, workflow_id), verbose=verbose)
    out = Output(as_json)
    if as_json:
        out.json(found.model_dump(mode="json"))
        return
    out.fields((name, getattr(found, name)) for name in type(found).model_fields if name != "steps")
    out.table(
        [Column("#", justify="right"), "kind", "name", "state", "result or error", "ended"],
        [
            (
                s.step_no,
                s.kind,
                s.name,
                s.state,
                shorten(error_text(s.error) if s.error else repr(s.result), 60),
                iso(s.ended_at) if s.ended_at else "",
            )
            for s in found.steps
        ],
        title="journal",
    )


async def _get(workflow_id: str, app: Any) -> Workflow:
    found: Workflow | None = await app.get_workflow(workflow_id)
    if found is None:
        raise WorkflowNotFoundError(workflow_id)
    return found


@workflows.command()
@click.argument("workflow_id")
@app_options
@output_options
def explain(
    workflow_id: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """Why a workflow is where it is: how it ended, or what it waits for (and, for an
    action step, what holds its row)."""
    said = run_with_app(
        app_ref, url, lambda app: app.explain_workflow(workflow_id), verbose=verbose
    )
    if as_json:
        Output(True).json({"id": workflow_id, "explanation": said})
    else:
        click.echo(said)


@workflows.command()
@click.argument("workflow_id")
@app_options
@output_options
def cancel(
    workflow_id: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """Cancel a Running or Stopped workflow (its action steps' rows and its children too)."""
    done = run_with_app(
        app_ref,
        url,
        lambda app: app.cancel_workflow(workflow_id),
        verbose=verbose,
        audited=Audited("workflow cancel", workflow_id, int, _said("cancelled")),
    )
    _report(done, "cancelled", "had ended already", as_json)


@workflows.command()
@click.argument("workflow_id")
@app_options
@output_options
def resume(
    workflow_id: str, app_ref: str | None, url: str | None, as_json: bool, verbose: bool
) -> None:
    """Run a Stopped workflow on from its journal (once its code matches it again)."""
    done = run_with_app(
        app_ref,
        url,
        lambda app: app.resume_workflow(workflow_id),
        verbose=verbose,
        audited=Audited("workflow resume", workflow_id, int, _said("resumed")),
    )
    _report(done, "resumed", "was not Stopped", as_json)


def _said(verb: str) -> Any:
    return lambda done: verb if done else "nothing to do"


def _report(done: bool, yes: str, no: str, as_json: bool) -> None:
    if as_json:
        Output(True).json({"done": done})
    else:
        click.echo(yes if done else f"nothing done: the workflow {no}")
