"""JSON logs: one object per line, with a run's fields under the names its span's
attributes have, so that a log line and a trace join on ``trace_id``.

Built on python-json-logger's formatter; durafn's records carry their fields as
``extra`` (``durafn_id``, ``durafn_function``, ``durafn_kind``, ``durafn_state``, and
for a run ``durafn_attempt``, ``durafn_lag``, ``durafn_duration``, ``durafn_worker``,
``trace_id``, ``span_id``; for a run lost with its worker, ``durafn_lost_worker``), renamed
here without the prefix. A record logged inside a
run (the user's own ``logging`` calls) gets the current span's ids.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

_PREFIX = "durafn_"
in_use = False
"""Whether a JSON formatter of durafn's was made: the executor then keeps each run's
fields for its log line (``Telemetry.on``), whether or not traces or metrics are on."""
FIELDS = ("id", "function", "kind", "state", "attempt", "lag", "duration", "worker", "lost_worker")


def _current_span() -> dict[str, str]:
    trace = sys.modules.get("opentelemetry.trace")  # never imported here for a log line
    if trace is None:
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def json_log_formatter() -> logging.Formatter:
    """A formatter writing one JSON object per record: time, level, logger, message,
    and the run's fields (``FIELDS``, ``trace_id``, ``span_id``) where it has them: put it
    on your handler (``durafn worker --log-format json`` does)."""
    global in_use
    in_use = True
    # Imported here: 25 ms a process, for the processes that log JSON only.
    from pythonjsonlogger.json import JsonFormatter

    class _Formatter(JsonFormatter):
        def add_fields(
            self,
            log_record: dict[str, Any],
            record: logging.LogRecord,
            message_dict: dict[str, Any],
        ) -> None:
            super().add_fields(log_record, record, message_dict)
            for key in list(log_record):
                if key.startswith(_PREFIX):
                    value = log_record.pop(key)  # an enum (kind, state) as its value
                    log_record[key.removeprefix(_PREFIX)] = getattr(value, "value", value)
            if "trace_id" not in log_record:
                log_record.update(_current_span())

    return _Formatter(
        "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        timestamp=False,
    )


def handler(stream: TextIO, json: bool) -> logging.Handler:
    """A stream handler, in JSON (``json_formatter``) or one line of text per record."""
    found = logging.StreamHandler(stream)
    text = "%(asctime)s %(levelname)-7s %(name)s [%(process)d] %(message)s"
    found.setFormatter(json_log_formatter() if json else logging.Formatter(text))
    return found


json_log_formatter.__module__ = "durafn"  # as users import it (``_public.publish``)
