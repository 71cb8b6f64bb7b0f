"""``durafn metrics``: serve an app's metrics as Prometheus text (``app.metrics_app()``).

In a process of its own it serves what the database says (the gauges: rows due, the
oldest due row's age, rows running, workers alive, queues, crons); the counters and
histograms of runs are kept by the processes that run them: ``durafn worker
--metrics-port``.
"""

from __future__ import annotations

import click

from .._errors import DurafnError
from .options import app_options
from .running import fail, open_app


@click.command()
@app_options
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to bind")
@click.option("--port", default=9464, show_default=True, type=click.IntRange(1, 65535))
def metrics(app_ref: str | None, url: str | None, host: str, port: int) -> None:
    """Serve the database's gauges as Prometheus text at /metrics (durafn[otel])."""
    try:
        app = open_app(app_ref, url)
        asgi = app.metrics_app()
        import uvicorn

        from .._telemetry.endpoint import listen

        sock = listen(host, port)
    except (DurafnError, ModuleNotFoundError) as exc:
        fail(str(exc) if isinstance(exc, DurafnError) else "install durafn[otel]")
    uvicorn.Server(uvicorn.Config(asgi, log_level="warning")).run(sockets=[sock])
