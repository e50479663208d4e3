"""Layers point one way: indexer <- retriever <- reranker <- eval. A lower layer never imports a higher one."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["indexer", "retriever", "reranker", "eval"]


def imported_packages(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", LAYERS)
def test_no_upward_imports(layer):
    higher = set(LAYERS[LAYERS.index(layer) + 1:])
    for path in (ROOT / layer).rglob("*.py"):
        bad = imported_packages(path) & higher
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}, a higher layer than {layer}"


def test_no_pickle_anywhere():
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            text = path.read_text()
            assert "import pickle" not in text and "allow_pickle=True" not in text, path
