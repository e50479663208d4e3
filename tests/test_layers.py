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
