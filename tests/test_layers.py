"""The package's layers, read from its imports: no module imports one that imports it back
(counting imports made only for type checking and those inside functions), the store
sees only value modules outside itself, and the rest reaches the store through its face.
A circle makes every module on it load and change with every other; these tests keep one
from coming back unseen."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "durafn"

VALUES = {
    "durafn._models",
    "durafn._kinds",
    "durafn._public",
    "durafn._errors",
    "durafn._clock",
    "durafn._checks",
    "durafn._flow",
    "durafn._retries",
    "durafn._completions",
    "durafn._options",
    "durafn._latency",
}
"""What the store may import from outside itself: values and their checks, no behaviour."""


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str) -> Iterator[str]:
    """Every module of the package that ``module`` imports, wherever the import stands."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]  # a name imported from a module
            if target in MODULES and target != module:
                yield target


GRAPH = {module: set(_imports(module)) for module in MODULES}


def _circles() -> list[list[str]]:
    """The graph's strongly connected parts of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(GRAPH[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            part = [stack.pop()]
            while part[-1] != module:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    return found


def test_the_graph_is_read() -> None:
    """The reading itself: the imports everyone knows are there are found."""
    assert "durafn._store.driver" in GRAPH["durafn._store"]
    assert "durafn._store.postgres.driver" in GRAPH["durafn._store"]  # inside a function
    assert {"durafn._options", "durafn._hooks"} <= GRAPH["durafn._registry"]
    assert "durafn._store.claim.take" in GRAPH["durafn._store.claim.statements"]


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert _circles() == []


def test_the_store_imports_only_values_from_outside_it() -> None:
    outside = {
        (module, target)
        for module, targets in GRAPH.items()
        if module.startswith("durafn._store")
        for target in targets
        if not target.startswith("durafn._store") and target not in VALUES
    }
    assert outside == set()
    # and the values never reach back into the store, or anything above them
    assert {t for m in VALUES for t in GRAPH[m] if t not in VALUES} == set()


def test_the_rest_of_durafn_reaches_the_store_through_its_face() -> None:
    """Outside ``_store`` a module imports ``durafn._store`` (its ``__init__``: the face,
    with ``interface.Store``), never a room of it: a room can move without its callers."""
    past_the_face = {
        (module, target)
        for module, targets in GRAPH.items()
        if not module.startswith("durafn._store")
        for target in targets
        if target.startswith("durafn._store.")
    }
    assert past_the_face == set()
