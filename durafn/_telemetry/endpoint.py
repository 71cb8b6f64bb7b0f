"""The Prometheus endpoint: an ASGI app serving an app's registry as Prometheus text
(prometheus-client's own exposition), its database gauges read first when older than
``GAUGE_TTL``. Mounted by the dashboard at ``/metrics``, served by ``durafn metrics``
and ``durafn worker --metrics-port``, and given to the host by ``app.metrics_app()``."""

from __future__ import annotations

import contextlib
import socket
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


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for the endpoint, bound before the worker starts:
    a port in use is one error that names it (uvicorn logged it, then the worker died
    with a traceback and exit status 3)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ArgumentError(f"cannot serve metrics on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ArgumentError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} (another "
            "process's metrics port? give each worker its own --metrics-port)"
        ) from None
    return sock


async def serve_metrics(asgi: ASGI, sock: socket.socket) -> None:
    """Serve ``asgi`` on ``sock`` (``listen``) until cancelled (uvicorn, in this event
    loop), leaving the process's signals to the worker (uvicorn's server would take
    SIGTERM)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(asgi, log_level="warning", lifespan="off")
    try:
        await _Server(config).serve(sockets=[sock])
    finally:
        sock.close()
