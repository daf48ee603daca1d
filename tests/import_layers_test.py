"""The package's imports run down its layers and never in a circle (read with ast, so every
import counts: a function's deferred one, a TYPE_CHECKING one, and a module named in a
string for importlib).

LAYERS is the one list of the layers, bottom first; docs/design.md shows the same. A module
belongs to the layer of the longest name in it that prefixes its own, and it may import
only modules of its own layer or of a layer below.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYERS = (
    # Leaves: no other module of cpbjax below them but each other.
    (
        "cpbjax.version",
        "cpbjax.columns",
        "cpbjax.workdir",
        "cpbjax.writers",
        "cpbjax.sharding",
        "cpbjax.runtime",
        "cpbjax.process_pool",
        "cpbjax.band",
        "cpbjax.config_rules",
        "cpbjax.progress",
    ),
    ("cpbjax.models",),  # architectures: windows in, forecasts out; they know no data source
    ("cpbjax.data",),  # sources, parsing, features, windows, groups of series
    ("cpbjax.config",),  # the schema and its checks (they read the data and model registries)
    ("cpbjax.training",),
    ("cpbjax.score",),
    ("cpbjax.report",),
    ("cpbjax.modes",),
    # Entry points and the package face.
    ("cpbjax.api", "cpbjax", "launch", "configs"),
)
MAX_TOP_MODULES = 12  # modules directly in cpbjax/, __init__.py included


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    paths = [*(ROOT / "cpbjax").rglob("*.py"), ROOT / "launch.py", *(ROOT / "configs").glob("*.py")]
    return {_module_name(p): p for p in paths}


def _imported(node: ast.AST, modules: dict) -> list[str]:
    """The cpbjax or configs modules one import statement names; or a string that is
    exactly a dotted module name (one that importlib.import_module loads later)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in modules and "." in node.value else []
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
        subs = [f"{node.module}.{a.name}" for a in node.names]
        return [s for s in subs if s in modules] or [node.module]
    return []


def _edges() -> dict[str, set[str]]:
    modules = _modules()
    edges = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        edges[name] = {t for node in ast.walk(tree) for t in _imported(node, modules)} - {name}
    return edges


def _layer(module: str) -> int:
    owners = [
        (len(prefix), i)
        for i, layer in enumerate(LAYERS)
        for prefix in layer
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert owners, f"{module} is in no layer of LAYERS: add it"
    return max(owners)[1]


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, as the modules on it, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == "open":
                return stack[stack.index(t) :] + [t]
            if t not in state and (found := visit(t)):
                return found
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_every_import_runs_down_the_layers():
    upward = [
        f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
        for m, targets in _edges().items()
        for t in sorted(targets)
        if _layer(t) > _layer(m)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    assert _cycle(_edges()) is None


def test_the_top_floor_holds_few_modules():
    top = sorted(p.name for p in (ROOT / "cpbjax").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


@pytest.mark.parametrize(
    "edges, circle",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"b2"}, "b2": {"b"}}, ["b", "b2", "b"]),
    ],
)
def test_the_circle_finder_finds_circles(edges, circle):
    assert _cycle(edges) == circle


def test_a_module_in_no_layer_is_named():
    with pytest.raises(AssertionError, match="cpbjaxx.stray is in no layer"):
        _layer("cpbjaxx.stray")
