"""The Prometheus endpoint: an ASGI app serving an app's registry as Prometheus text
(prometheus-client's own exposition), its database gauges read first when older than
``GAUGE_TTL``. Mounted by the dashboard at ``/metrics``, served by ``durafn metrics``
and ``durafn worker --metrics-port``, and given to the host by ``app.metrics_app()``."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from .._errors import ArgumentError
from .metrics import Metrics

Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]


def metrics_asgi(metrics: Metrics | None) -> ASGI:
    if metrics is None:
        raise ArgumentError(
            "metrics need prometheus-client: pip install 'durafn[otel]' (the gauges, "
            "counters and histograms are kept in its registry)"
        )
    from prometheus_client import make_asgi_app

    inner = make_asgi_app(registry=metrics.registry)

    async def serve(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await metrics.gauges.refresh()
        await inner(scope, receive, send)

    return serve


async def serve_metrics(asgi: ASGI, host: str, port: int) -> None:
    """Serve ``asgi`` on ``host:port`` until cancelled (uvicorn, in this event loop),
    leaving the process's signals to the worker (uvicorn's server would take SIGTERM)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", lifespan="off")
    await _Server(config).serve()
