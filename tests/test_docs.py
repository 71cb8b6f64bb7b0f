"""The documentation's code runs through the tools: every ```python block of README.md
and docs/**/*.md parses, and every block that is a complete program passes mypy, all of
them in one run (what a reader pastes is what the type checker saw).

A block is a complete program unless the line before its fence says otherwise, in an
HTML comment (shown neither on the site nor on GitHub):

``<!-- fragment -->``
    a piece of a program that names what the text around it defines (``ctx``, ``app``):
    parsed, not type-checked. Keep these few.
``<!-- file: myapp/tasks.py -->``
    the block is that module of the checked tree, so that a later block (a test of it)
    imports it as a reader's project would.

mypy runs with the project's configuration (``[tool.mypy]``: strict, the pydantic plugin,
its overrides), over a temporary tree of the blocks, with the project's cache. A block's
errors are reported at the documentation's line. One canary block with a wrong argument
type to a durafn function goes through the same run and must fail there, so that the
check cannot pass by checking nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mypy import api as mypy_api

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<info>[^`\n]*)$")
MARKER = re.compile(r"^\s*<!--\s*(?P<what>fragment|file)\s*:?\s*(?P<arg>[^\s>]*)\s*-->\s*$")

# Modules of the peers a "Coming from" page shows next to durafn, and of web frameworks
# durafn does not install: their imports resolve to Any (the durafn side stays checked).
ABSENT = ["celery.*", "rq.*", "rq_scheduler.*", "redis.*", "fastapi.*"]
# ...and since their decorators (Celery's @app.task, FastAPI's @web.post) are then
# untyped, a block may use them; durafn's own decorators are typed either way.
RELAXED = {"disallow_untyped_decorators": False}
BLOCKS_PACKAGE = "doc_blocks"
"""Where the blocks go in the checked tree (those of a ``file:`` marker at its root)."""

CANARY = """\
from durafn import App, MutationCtx

app = App()


@app.mutation
async def destruct(ctx: MutationCtx, message_id: int) -> None: ...


async def schedule(ctx: MutationCtx) -> None:
    await ctx.scheduler.run_after(5, destruct, message_id="x")  # must be an error
"""
"""The README's own example of what mypy catches (``run_after(5, destruct,
message_id="x")``)."""


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the first line of code, 1-based
    code: str
    marker: str | None = None  # "fragment" or "file"
    arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def module_path(self) -> str:
        """The block's file in the checked tree."""
        if self.marker == "file":
            return self.arg
        slug = re.sub(r"\W", "_", str(self.page.relative_to(ROOT).with_suffix("")))
        return f"{BLOCKS_PACKAGE}/{slug}_{self.line}.py"


def blocks_of(page: Path) -> Iterator[Block]:
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        ticks, indent = fence["ticks"], fence["indent"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        if fence["info"].strip().split(" ")[0] == "python":
            marker = MARKER.match(lines[i - 1]) if i > 0 else None
            body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
            yield Block(
                page,
                i + 2,
                "\n".join(body) + "\n",
                marker["what"] if marker else None,
                marker["arg"] if marker else "",
            )
        i = end + 1


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def test_the_pages_have_python_blocks() -> None:
    assert (ROOT / "docs" / "index.md").exists()
    assert len(BLOCKS) > 50
    fragments = [b.where for b in BLOCKS if b.marker == "fragment"]
    assert len(fragments) <= len(BLOCKS) // 4, fragments  # complete programs, mostly
    files = [b.module_path for b in BLOCKS if b.marker == "file"]
    assert len(files) == len(set(files)), files


def test_the_readme_links_into_the_site() -> None:
    """README.md is read on GitHub, outside the site's strict build: its relative links
    must name files that exist."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links into docs/"
    assert [link for link in relative if not (ROOT / link).exists()] == []


def test_the_reference_documents_every_public_name() -> None:
    """Each name of ``durafn.__all__`` has its mkdocstrings entry (``::: durafn.X``)."""
    import durafn

    reference = "\n".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
    documented = set(re.findall(r"^::: durafn\.(\w+)\s*$", reference, re.MULTILINE))
    assert sorted(set(durafn.__all__) - documented) == []


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_every_python_block_parses(block: Block) -> None:
    try:
        ast.parse(block.code, filename=block.where)
    except SyntaxError as exc:
        pytest.fail(f"{block.where}: line {exc.lineno} of the block: {exc.msg}")


def _mypy_config(cache: Path) -> str:
    """The project's ``[tool.mypy]`` as an ini file for the blocks: its own files
    dropped, the peers' modules let in as Any."""
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    overrides: list[dict[str, Any]] = project.pop("overrides", [])
    project.pop("files", None)
    project["cache_dir"] = str(cache)
    sections = [("mypy", project)]
    overrides.append({"module": ABSENT, "ignore_missing_imports": True})
    overrides.append({"module": [f"{BLOCKS_PACKAGE}.*"], **RELAXED})
    for override in overrides:
        modules = override.pop("module")
        names = modules if isinstance(modules, list) else [modules]
        sections.append((f"mypy-{','.join(names)}", override))

    def value(v: object) -> str:
        if isinstance(v, bool):
            return str(v)
        if isinstance(v, list):
            return ", ".join(str(x) for x in v)
        return str(v)

    return "\n".join(
        f"[{title}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in options.items())
        for title, options in sections
    )


def _in_tree(reported: str) -> str:
    """A file's path in the tree of blocks: mypy replays a fresh module's errors from its
    cache with the path they were first reported at, another run's temporary tree."""
    return reported.rpartition("/tree/")[2]


def test_every_complete_python_block_type_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = [b for b in BLOCKS if b.marker != "fragment"]
    tree = tmp_path / "tree"
    (tree / BLOCKS_PACKAGE).mkdir(parents=True)
    (tree / BLOCKS_PACKAGE / "__init__.py").touch()
    by_file: dict[str, Block] = {}
    for block in checked:
        path = tree / block.module_path
        for folder in reversed(path.relative_to(tree).parents[:-1]):
            (tree / folder).mkdir(exist_ok=True)
            (tree / folder / "__init__.py").touch()
        path.write_text(block.code)
        by_file[block.module_path] = block
    canary = tree / BLOCKS_PACKAGE / "canary.py"
    canary.write_text(CANARY)
    config = tmp_path / "mypy.ini"
    config.write_text(_mypy_config(ROOT / ".mypy_cache"))

    # From the project's root, as `make typecheck` runs: durafn is found there (the
    # editable install is an import hook mypy does not follow) and its cache is reused.
    monkeypatch.chdir(ROOT)
    files = sorted(str(p) for p in tree.rglob("*.py") if p.name != "__init__.py")
    out, err, _ = mypy_api.run(
        ["--config-file", str(config), "--no-error-summary", "--show-error-codes", *files]
    )
    assert not err, err
    caught, problems = [], []
    for line in out.splitlines():
        found = re.match(r"(?P<file>[^:]+):(?P<line>\d+): (?P<rest>.*)", line)
        if found is None:
            problems.append(line)
        elif "/tree/" not in found["file"]:
            continue  # durafn's own modules: `make typecheck` checks those
        elif (file := _in_tree(found["file"])) == f"{BLOCKS_PACKAGE}/canary.py":
            caught.append(found["rest"])
        elif file in by_file:
            block = by_file[file]
            at = block.line + int(found["line"]) - 1
            problems.append(f"{block.page.relative_to(ROOT)}:{at}: {found['rest']}")
    assert not problems, "\n".join(problems)
    # The canary's wrong argument was seen: mypy checked the blocks against durafn.
    assert any(c.startswith('error: No overload variant of "run_after"') for c in caught), caught


def test_the_pages_that_state_the_schema_version_state_the_current_one() -> None:
    """Two pages name the version the schema is at; at version 19 they said 16 and 18."""
    from durafn import SCHEMA_VERSION

    operating = (ROOT / "docs/guides/operating.md").read_text()
    tables = (ROOT / "docs/reference/tables.md").read_text()
    assert f"now at version {SCHEMA_VERSION};" in operating
    assert f"| {SCHEMA_VERSION} |" in operating  # its step's row in the table of steps
    assert f"`durafn.SCHEMA_VERSION` ({SCHEMA_VERSION})" in tables
