"""Lines of product code (the package folders) in git revisions: all lines, and code lines
(no blank, comment or docstring line). ``python benchmarks/experiments/product_lines.py addfff1 HEAD``."""

from __future__ import annotations

import ast
import subprocess

DIRS = ["indexer", "retriever", "reranker", "engine", "eval", "app", "facade"]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def count(rev: str) -> tuple[int, int]:
    total = code = 0
    for f in _git("ls-tree", "-r", "--name-only", rev, "--", *DIRS).split():
        if not f.endswith(".py"):
            continue
        src = _git("show", f"{rev}:{f}")
        lines = src.splitlines()
        doc: set[int] = set()
        for node in ast.walk(ast.parse(src)):
            body = getattr(node, "body", None)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
                first = body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                        and isinstance(first.value.value, str):
                    doc.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
        total += len(lines)
        code += sum(1 for i, line in enumerate(lines, 1)
                    if line.strip() and not line.strip().startswith("#") and i not in doc)
    return total, code


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Lines of product code in git revisions (two: the change).")
    parser.add_argument("revs", nargs="*", default=["HEAD"], help="git revisions")
    revs = parser.parse_args().revs
    results = {rev: count(rev) for rev in revs}
    for rev, (total, code) in results.items():
        print(f"{rev}: {total} lines, {code} code lines")
    if len(revs) == 2:
        (t0, c0), (t1, c1) = results[revs[0]], results[revs[1]]
        print(f"change: {t1 - t0:+d} lines, {c1 - c0:+d} code lines")
