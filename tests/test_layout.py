"""The written map of the package cannot drift: every module of ``durafn/`` has its line
in the Layout of ``docs/contributing.md``, and every line there names a module that
exists, in the folder it is drawn under."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+(?:\.py|/))(?: {2,}\S.*)?$")
DESCRIPTION_COLUMN = 18
"""An entry starts left of it; a line indented further continues a description."""


def layout_entries(text: str) -> list[str]:
    """The paths the Layout's block names, each from the repository's root."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    folders: list[str] = []
    found = []
    for number, line in enumerate(block.splitlines()[1:], 2):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent >= DESCRIPTION_COLUMN:
            continue  # a description going on
        entry = ENTRY.match(line)
        assert entry is not None, f"line {number} of the Layout is not an entry: {line!r}"
        depth = indent // 2
        assert depth <= len(folders), f"line {number}: indented under no folder: {line!r}"
        del folders[depth:]
        path = "".join(folders) + entry["name"]
        found.append(path)
        if path.endswith("/"):
            folders.append(entry["name"])
    return found


def test_every_module_is_in_the_layout_and_every_entry_exists() -> None:
    entries = layout_entries((ROOT / "docs" / "contributing.md").read_text())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "durafn").rglob("*.py")}
    listed = {e for e in entries if e.endswith(".py")}
    assert sorted(modules - listed) == [], "modules the Layout leaves out"
    assert sorted(listed - modules) == [], "Layout entries that name no module"
    for folder in (e for e in entries if e.endswith("/")):
        assert (ROOT / folder).is_dir(), folder
    assert len(entries) == len(set(entries)), "an entry listed twice"


def test_the_reading_of_the_layout_finds_what_it_should() -> None:
    """The reader itself: nesting, continuation lines, headings."""
    text = """## Layout

```
durafn/
  # -- a heading
  a.py              one
                    going on
  b/                folder
    c.py            in it
  d.py              back out
```
"""
    assert layout_entries(text) == [
        "durafn/",
        "durafn/a.py",
        "durafn/b/",
        "durafn/b/c.py",
        "durafn/d.py",
    ]
