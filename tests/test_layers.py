"""Layers point one way: indexer <- retriever <- reranker <- eval <- the facade (twostage/__init__).

Everything imports through the one package ``twostage``; a bare ``import indexer`` or ``from eval...`` would load
a second copy of a module (or nothing, from an installed wheel) and is rejected.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["indexer", "retriever", "reranker", "eval"]
FOLDERS = [*LAYERS, "facade", "tests", "benchmarks"]


def imports(path: Path) -> set[str]:
    """Every absolute module name a file imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", LAYERS)
def test_no_upward_imports(layer):
    higher = set(LAYERS[LAYERS.index(layer) + 1:]) | {""}
    for path in (ROOT / layer).rglob("*.py"):
        ours = {n.split(".")[1] if "." in n else "" for n in imports(path) if n.split(".")[0] == "twostage"}
        bad = ours & higher
        assert not bad, f"{path.relative_to(ROOT)} imports twostage.{bad}, a higher layer than {layer} (or the facade)"


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_bare_layer_imports(folder):
    for path in (ROOT / folder).rglob("*.py"):
        bare = {n for n in imports(path) if n.split(".")[0] in LAYERS}
        assert not bare, f"{path.relative_to(ROOT)} imports {bare}: import them as twostage.<layer>"


def test_facade_exports_resolve():
    import twostage

    for name in twostage.__all__:
        assert getattr(twostage, name) is not None, name
    assert twostage.SearchEngine.__module__ == "twostage.reranker.engine"


def test_no_pickle_anywhere():
    for layer in [*LAYERS, "facade"]:
        for path in (ROOT / layer).rglob("*.py"):
            text = path.read_text()
            assert "import pickle" not in text and "allow_pickle=True" not in text, path


def test_no_import_cycles_between_modules():
    """Not even through an import inside a function: a module either uses another or is used by it."""
    graph = {}
    for layer in LAYERS:
        for path in (ROOT / layer).glob("*.py"):
            name = f"twostage.{layer}.{path.stem}"
            graph[name] = {n for n in imports(path) if n.startswith("twostage.") and n.count(".") == 2}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if seen.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in seen:
                visit(nxt, [*path, nxt])
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node, [node])
