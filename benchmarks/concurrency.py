"""Concurrent writers and readers on one index or engine directory, from several processes (the harness:
tests/harness/concurrency.py, which the tests run small).

Usage (from the repository root): python benchmarks/concurrency.py [--trials 10] [--kind engine|passages|all]

Writes benchmarks/results/concurrency.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness.concurrency import readers, writers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kind", default="all", choices=["engine", "passages", "all"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "concurrency.md")
    args = parser.parse_args()
    kinds = ["engine", "passages"] if args.kind == "all" else [args.kind]
    lines = ["# Concurrent writers and readers", "",
             f"Command: `python benchmarks/concurrency.py --trials {args.trials} --kind {args.kind}`", "",
             "| directory | writer pairs (add+add, add+compact, delete+compact, upsert+delete) | lost updates | "
             "refused writers |", "|---|---|---|---|"]
    read_lines = ["", "| directory | commits while reading | reads (8 threads + 2 processes) | failed reads | "
                  "answers equal to no committed version | versions seen |", "|---|---|---|---|---|---|"]
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp:
            w = writers(kind, args.trials, Path(tmp))
            print(w, flush=True)
            r = readers(kind, 20, Path(tmp))
            print(r, flush=True)
        lines.append(f"| {kind} | {w['runs']} | {w['lost']} | {w['refused']} |")
        read_lines.append(f"| {kind} | {r['commits']} | {r['reads']} | {r['failures']} | {r['wrong']} | "
                          f"{r['versions_seen']} |")
    text = "\n".join(lines + read_lines) + "\n"
    args.out.write_text(text)
    print(text)
    lost = sum(int(line.split("|")[3]) for line in lines[-len(kinds):])
    failed = sum(int(line.split("|")[4]) for line in read_lines[-len(kinds):])
    print(f"concurrency: {lost} lost updates, {failed} failed reads; table in {args.out}")


if __name__ == "__main__":
    main()
