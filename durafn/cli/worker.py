"""``durafn worker``: run due scheduled functions, in one process or under a supervisor."""

from __future__ import annotations

import functools
import sys
from typing import Any

import anyio
import click

from .._errors import ArgumentError, DurafnError
from .._executor import ExecutorConfig, ExecutorOptions, make_config
from .._supervisor import supervise
from .options import Seconds, app_options, verbose_option
from .running import fail, open_app, run

# The worker's defaults are the executor's: one place to change them.
_DEFAULTS = ExecutorConfig()


@click.command()
@app_options
@click.option(
    "--concurrency",
    type=click.IntRange(1, 100_000),
    default=_DEFAULTS.concurrency,
    show_default=True,
    help="Actions running at once in each process.",
)
@click.option(
    "-n",
    "--processes",
    type=click.IntRange(1, 1_000),
    default=1,
    show_default=True,
    help="Worker processes to run under one supervisor.",
)
@click.option(
    "--exit-on-complete",
    is_flag=True,
    help="Run everything due now (and what it schedules due now), then exit 0.",
)
@click.option(
    "--grace-period",
    type=Seconds(),
    default=_DEFAULTS.grace_period,
    show_default=True,
    help="Seconds running actions get to finish after SIGTERM/SIGINT.",
)
@click.option(
    "--heartbeat-interval",
    type=Seconds(positive=True),
    default=_DEFAULTS.heartbeat_interval,
    show_default=True,
    help="Seconds between heartbeats.",
)
@click.option(
    "--worker-timeout",
    type=Seconds(positive=True),
    default=_DEFAULTS.worker_timeout,
    show_default=True,
    help="Seconds without a heartbeat after which a worker is lost and its running "
    "actions are recorded Failed.",
)
@click.option(
    "--poll-interval",
    type=Seconds(positive=True),
    default=None,
    help="Fallback poll for work no wake-up announced [default: 0.5 SQLite, 5 PostgreSQL].",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=_DEFAULTS.batch_size,
    show_default=True,
    help="Mutations committed together.",
)
@click.option(
    "--name", "worker_name", default=None, help="Label for this worker [default: host:pid]."
)
@click.option(
    "--queues",
    default=None,
    metavar="NAME,...",
    help="Serve only rows of these named queues [default: every row, queued or not].",
)
@click.option(
    "--pool",
    "pools",
    multiple=True,
    metavar="QUEUES[:N]",
    help="Start N processes (default 1) serving QUEUES (comma-separated, or * for every "
    "row); repeat for more pools: --pool mail:2 --pool 'reports,exports' --pool '*:4'.",
)
@click.option(
    "--forbid-flag",
    "forbidden_flags",
    multiple=True,
    metavar="FLAG",
    help="Never run rows carrying this flag (repeatable): shed a kind of work.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1, 1000),
    default=None,
    help="The most database connections this worker's pool opens at once (PostgreSQL "
    "adds one for LISTEN) [default: the app's, 10 on PostgreSQL].",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="DEBUG logs one line per state change.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per line, with each run's fields and trace id.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve this worker's metrics as Prometheus text at /metrics on this port "
    "(durafn[otel]; with --processes, one port per process from this one up).",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="interface for /metrics"
)
@verbose_option
def worker(
    app_ref: str | None,
    url: str | None,
    concurrency: int,
    processes: int,
    exit_on_complete: bool,
    grace_period: float,
    heartbeat_interval: float,
    worker_timeout: float,
    poll_interval: float | None,
    batch_size: int,
    worker_name: str | None,
    queues: str | None,
    pools: tuple[str, ...],
    forbidden_flags: tuple[str, ...],
    max_connections: int | None,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    verbose: bool,
) -> None:
    """Run due scheduled functions until stopped (SIGTERM/SIGINT: graceful; twice: at once)."""
    from .._worker import configure_logging  # the app's imports: not for --help

    configure_logging(log_level, json=log_format == "json")
    if not app_ref:
        fail(
            "durafn worker needs the app that defines the functions: --app pkg.module:app "
            "(or DURAFN_APP)"
        )
    options: ExecutorOptions = {
        "concurrency": concurrency,
        "grace_period": grace_period,
        "heartbeat_interval": heartbeat_interval,
        "worker_timeout": worker_timeout,
        "poll_interval": poll_interval,
        "batch_size": batch_size,
        "worker_name": worker_name,
        "forbidden_flags": forbidden_flags,
    }
    try:
        if queues is not None:
            options["queues"] = _names(queues, "--queues")
        make_config(options)  # a bad combination fails here, not in every child
        children = _children(processes, pools, queues)
        if metrics_port is not None and metrics_port + len(children) - 1 > 65535:
            raise ArgumentError(
                f"--metrics-port {metrics_port}: {len(children)} processes serve metrics on "
                f"ports {metrics_port} to {metrics_port + len(children) - 1}, and the last "
                "port is 65535"
            )
    except DurafnError as exc:
        fail(str(exc), status=2)  # a bad option, or options that do not go together
    if len(children) > 1 or pools:
        _check_ports(metrics_host, metrics_port, len(children))
        # Likewise a bad --app or a database that is not ready (not migrated, away): one
        # error line now, the one a single worker gives, not children dying for 18 s.
        run(functools.partial(_check_ready, app_ref, url), verbose=verbose)
        args = _child_args(click.get_current_context().params)
        every = [
            [
                *args,
                *child,
                *([] if metrics_port is None else ["--metrics-port", str(metrics_port + i)]),
            ]
            for i, child in enumerate(children)
        ]
        sys.exit(run(lambda: supervise(every), verbose=verbose))
    serving = functools.partial(
        _serve, app_ref, url, options, exit_on_complete, max_connections, metrics_host, metrics_port
    )
    sys.exit(run(serving, verbose=verbose))


def _check_ports(host: str, first: int | None, count: int) -> None:
    """Each child binds its own port: one in use fails now, not five times a child."""
    if first is None:
        return
    from .._telemetry.endpoint import listen

    try:
        for i in range(count):
            listen(host, first + i).close()
    except DurafnError as exc:
        fail(str(exc))


_PASSED_ON = (
    ("url", "--url"),
    ("concurrency", "--concurrency"),
    ("grace_period", "--grace-period"),
    ("heartbeat_interval", "--heartbeat-interval"),
    ("worker_timeout", "--worker-timeout"),
    ("batch_size", "--batch-size"),
    ("poll_interval", "--poll-interval"),
    ("worker_name", "--name"),
    ("max_connections", "--max-connections"),
)
"""The options a supervisor passes on to each child as given (its own, --processes,
--queues, --pool and --metrics-port, it decides per child)."""


def _child_args(params: dict[str, Any]) -> list[str]:
    args = ["--app", params["app_ref"], "--log-level", params["log_level"]]
    args += ["--log-format", params["log_format"], "--metrics-host", params["metrics_host"]]
    for name, flag in _PASSED_ON:
        if params[name] is not None:
            args += [flag, str(params[name])]
    for forbidden in params["forbidden_flags"]:
        args += ["--forbid-flag", forbidden]
    args += ["--exit-on-complete"] if params["exit_on_complete"] else []
    args += ["--verbose"] if params["verbose"] else []
    return args


async def _serve(
    app_ref: str,
    url: str | None,
    options: ExecutorOptions,
    exit_on_complete: bool,
    max_connections: int | None,
    metrics_host: str,
    metrics_port: int | None,
) -> int:
    """One worker in this process, and its metrics endpoint if asked for."""
    from .._worker import serve

    app = open_app(app_ref, url, create=True)
    if max_connections is not None:
        app._limit_connections(max_connections)
    try:
        if metrics_port is None:
            return await serve(app, options, exit_on_complete=exit_on_complete)
        from .._telemetry.endpoint import listen, serve_metrics

        asgi = app.metrics_app()  # a clear error, before the worker starts, if missing
        sock = listen(metrics_host, metrics_port)
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_metrics, asgi, sock)
            status = await serve(app, options, exit_on_complete=exit_on_complete)
            tg.cancel_scope.cancel()
        return status
    finally:
        await app.aclose()


def _names(text: str, option: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise ArgumentError(f"{option} takes queue names separated by commas, not {text!r}")
    return names


def _children(processes: int, pools: tuple[str, ...], queues: str | None) -> list[list[str]]:
    """Each child's own arguments: ``--queues`` of its pool, or nothing (every row)."""
    if not pools:
        return [[]] * processes
    if processes != 1 or queues is not None:
        raise ArgumentError("--pool says which processes to start: leave out -n and --queues")
    children: list[list[str]] = []
    for pool in pools:
        spec, _, count = pool.rpartition(":") if ":" in pool else (pool, "", "1")
        if not count.isdigit() or not 1 <= int(count) <= 1_000:
            raise ArgumentError(
                f"--pool {pool!r}: the number of processes after ':' must be 1 to 1000"
            )
        own = [] if spec.strip() == "*" else ["--queues", ",".join(_names(spec, "--pool"))]
        children += [own] * int(count)
    return children


async def _check_ready(app_ref: str, url: str | None) -> None:
    app = open_app(app_ref, url, create=True)
    try:
        await app._rt.ensure_ready()
    finally:
        await app.aclose()
