"""Arguments and results on a page, bounded: a list shows a one-line preview of each
value, a row's page the value itself up to ``SHOWN`` characters (folded away when it is
long) and a download of the whole.

A Pending row may hold an argument of up to 8 MB, and a group's callback the ids of
hundreds of rows: shown whole, one such row made a listing page 7 MB and 33 million
pixels wide. JSON text, escaped like every other value by the templates (Jinja's
``tojson`` writes ``<`` as ``\\u003c``: safe in a script, unreadable on a page).
"""

from __future__ import annotations

import json
from typing import Any

PREVIEW = 120
"""Characters of a value a list shows (on one line)."""
SHOWN = 20_000
"""Characters of a value a row's page shows; the rest is a download away."""
FOLDED = 2_000
"""A value longer than this is folded away on a row's page until opened."""


def as_json(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False, default=str)


def preview(value: Any) -> str:
    """One line of at most ``PREVIEW`` characters, saying how much more there is."""
    text = as_json(value)
    if len(text) <= PREVIEW:
        return text
    return f"{text[:PREVIEW]}… ({size(len(text))} in all)"


def shown(value: Any) -> dict[str, Any]:
    """The value as a row's page shows it: its text (indented) up to ``SHOWN``
    characters, whether that is all of it, its whole size, and whether to fold it."""
    text = as_json(value, indent=2)
    return {
        "text": text[:SHOWN],
        "whole": len(text) <= SHOWN,
        "size": size(len(text)),
        "folded": len(text) > FOLDED,
    }


def size(characters: int) -> str:
    if characters < 1000:
        return f"{characters} characters"
    if characters < 1_000_000:
        return f"{characters / 1000:.1f} thousand characters"
    return f"{characters / 1_000_000:.1f} million characters"
