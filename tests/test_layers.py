"""Layers point one way: indexer <- models <- retriever <- reranker <- engine <- eval <- app <- the facade (twostage/__init__).

Everything imports through the one package ``twostage``; a bare ``import indexer`` or ``from eval...`` would load
a second copy of a module (or nothing, from an installed wheel) and is rejected.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["indexer", "models", "retriever", "reranker", "engine", "eval", "app"]
FOLDERS = [*LAYERS, "facade", "tests", "benchmarks"]
PACKAGE = [*LAYERS, "facade"]


def imports(path: Path, *, typing_only: bool = True) -> set[str]:
    """Every absolute module name a file imports, ``from twostage.engine import writes`` as
    ``twostage.engine.writes`` too (a module of a package; a plain name adds only the package). Without
    ``typing_only``, imports under ``if TYPE_CHECKING:`` (annotations, never run) are left out."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    if not typing_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            if node.module.startswith("twostage.") and node.module.count(".") == 1:
                names |= {f"{node.module}.{a.name}" for a in node.names
                          if (ROOT / node.module.split(".")[1] / f"{a.name}.py").is_file()}
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
    assert twostage.SearchEngine.__module__ == "twostage.engine.search_engine"


def test_the_facade_is_the_few_names_a_user_needs():
    """About twenty names, nothing else in dir(); the errors in twostage.errors; a name the facade used to export
    still resolves, with a warning that says where it lives now."""
    import warnings

    import twostage
    import twostage.errors
    from twostage.indexer import errors

    assert len(twostage.__all__) <= 25 and len(set(twostage.__all__)) == len(twostage.__all__)
    assert dir(twostage) == sorted(twostage.__all__)
    defined = {n for n in vars(errors) if isinstance(getattr(errors, n), type)
               and issubclass(getattr(errors, n), errors.TwostageError)}
    assert set(twostage.errors.__all__) == defined
    with pytest.warns(DeprecationWarning, match="import it from twostage.errors"):
        assert twostage.ConfigError is errors.ConfigError
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert twostage.TwostageError is errors.TwostageError
        assert twostage.SearchResult.__name__ == "SearchResult" and twostage.Encoder.__name__ == "Encoder"
    with pytest.raises(AttributeError):
        twostage.no_such_name  # noqa: B018


def test_no_pickle_anywhere():
    for layer in [*LAYERS, "facade"]:
        for path in (ROOT / layer).rglob("*.py"):
            text = path.read_text()
            assert "import pickle" not in text and "allow_pickle=True" not in text, path


def test_no_import_cycles_between_modules():
    """Not even through an import inside a function or a ``from package import module``: a module either uses
    another or is used by it (an annotation-only import under TYPE_CHECKING is no use)."""
    graph = {}
    for layer in LAYERS:
        for path in (ROOT / layer).glob("*.py"):
            name = f"twostage.{layer}.{path.stem}"
            graph[name] = {n for n in imports(path, typing_only=False)
                           if n.startswith("twostage.") and n.count(".") == 2}
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


def test_every_module_is_installed():
    """The editable install is a link tree (strict mode): a module added since `pip install -e .` is not in it."""
    import importlib.util

    for folder in PACKAGE:
        prefix = "twostage" if folder == "facade" else f"twostage.{folder}"
        for path in (ROOT / folder).glob("*.py"):
            name = prefix if path.stem == "__init__" else f"{prefix}.{path.stem}"
            assert importlib.util.find_spec(name) is not None, (
                f"{path.relative_to(ROOT)} is not installed as {name}: run `pip install -e .` again")


def test_no_private_names_imported_across_modules():
    """A name starting with `_` is its module's own: nothing else imports it (the library, tests and benchmarks)."""
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("twostage"):
                    private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                    assert not private, f"{path.relative_to(ROOT)}:{node.lineno} imports {private} from {node.module}"


def privates_defined(tree: ast.AST) -> set[str]:
    """The `_names` a module defines: functions, classes, module names, and attributes assigned on self/cls or
    declared in a class body (reading `self._x` defines nothing: a free function's `self` is anyone's object)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") \
                and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names.add(target.id)
    return {n for n in names if n.startswith("_")}


def private_touches(tree: ast.AST) -> list[ast.Attribute]:
    """Every `obj._name` of another module's object: `_name` not the module's own, or read on `self`/`cls` outside a
    method of a class the module defines (#82: writes.py's free functions took `self: SearchEngine`)."""
    mine, methods = privates_defined(tree), set()
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef):
            methods |= {id(f) for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    bad: list[ast.Attribute] = []

    def visit(node: ast.AST, in_method: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, id(child) in methods or in_method)  # a closure in a method sees its self
                continue
            if isinstance(child, ast.Attribute) and child.attr.startswith("_") and not child.attr.startswith("__") \
                    and ast.unparse(child) != "os._exit":  # (stdlib, documented)
                on_self = isinstance(child.value, ast.Name) and child.value.id in ("self", "cls")
                if child.attr not in mine or (on_self and not in_method):
                    bad.append(child)
            visit(child, in_method)

    visit(tree, False)
    return bad


def test_no_private_attribute_touched_outside_its_module():
    """#45: `obj._name` only where `_name` belongs to the module (its own classes' attributes); another module's
    object is used through its public methods. Tests and benchmarks may look inside."""
    bad = []
    for folder in PACKAGE:
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            bad += [f"{path.relative_to(ROOT)}:{n.lineno} .{n.attr} of {ast.unparse(n.value)}"
                    for n in private_touches(tree)]
    assert not bad, "private attributes of other modules' objects: " + "; ".join(bad)


def test_the_private_attribute_guard_would_fail():
    tree = ast.parse("class A:\n    def f(self, other):\n        return other._secret + self._mine\n"
                     "    def g(self):\n        self._mine = 1\n"
                     "def free(self):\n    return self._models\n")  # a free function's self is anyone's
    assert sorted(n.attr for n in private_touches(tree)) == ["_models", "_secret"]


def mermaid_blocks(path: Path) -> list[str]:
    return re.findall(r"```mermaid\n(.*?)```", path.read_text(), re.S)


def edges(block: str) -> list[tuple[str, str]]:
    """Every arrow `a --> b` and `a -->|label| b` of a mermaid flowchart, chains included."""
    found = []
    for line in block.splitlines():
        parts = re.split(r"\s*-->(?:\|[^|]*\|)?\s*", line.strip())
        if len(parts) > 1:
            found += list(zip(parts, parts[1:]))
    return found


def module_of(folder: str, path: Path) -> str:
    prefix = "twostage" if folder == "facade" else f"twostage.{folder}"
    return prefix if path.stem == "__init__" else f"{prefix}.{path.stem}"


def test_architecture_layer_diagram_matches_the_code():
    layers_block, _ = mermaid_blocks(ROOT / "docs" / "ARCHITECTURE.md")
    drawn = edges(layers_block)
    order = [drawn[0][0]] + [b for _, b in drawn]
    assert order == ["facade", *reversed(LAYERS)], f"the diagram's layer order {order} is not tests' {LAYERS}"
    for upper, lower in drawn:
        target = f"twostage.{lower}"
        assert any(n == target or n.startswith(target + ".") for p in (ROOT / upper).glob("*.py") for n in imports(p)
                   ), f"the diagram draws {upper} --> {lower}, but no module of {upper}/ imports {target}"


def test_architecture_query_path_matches_the_code():
    _, path_block = mermaid_blocks(ROOT / "docs" / "ARCHITECTURE.md")
    nodes = dict(re.findall(r'^\s*(\w+)\["([^"]+)"\]', path_block, re.M))
    assert len(nodes) >= 10
    files = {}
    for node, label in nodes.items():
        file, _, what = label.partition("<br>")
        path = ROOT / file
        assert path.is_file(), f"node {node} names {file}, which does not exist"
        name = re.match(r"\w+", what).group(0)
        defined = {n.name for n in ast.parse(path.read_text()).body
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
        assert name in defined, f"node {node}: {file} defines no {name}"
        files[node] = path
    for a, b in edges(path_block):
        pa, pb = files[a], files[b]
        target = module_of(pb.parent.name, pb)
        assert target in imports(pa), f"the query path draws {a} --> {b}, but {pa.relative_to(ROOT)} does not import {target}"


def test_npy_files_are_read_only_through_load_npy():
    # numpy.load parses headers with ast, which is not thread-safe on CPython 3.11 (twostage.indexer.atomic)
    for folder in PACKAGE:
        for path in (ROOT / folder).rglob("*.py"):
            if path != ROOT / "indexer" / "atomic.py":
                assert "np.load(" not in path.read_text(), f"{path.relative_to(ROOT)}: read .npy files with load_npy"
