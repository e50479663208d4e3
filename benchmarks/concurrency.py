"""Concurrent writers and readers on one index or engine directory, from several processes (the harness:
tests/harness/concurrency.py, which the tests run small); and the crash test of the engine.

Usage (from the repository root): python benchmarks/concurrency.py [--trials 10] [--kind engine|passages|all]

Writes benchmarks/results/concurrency.md.

    python benchmarks/concurrency.py --kind crash [--rounds 24] [--seed 0] [--passages WORDS] [--late]

The crash test: add, upsert, delete and compact killed with SIGKILL at random moments (the harness:
tests/harness/engine_crash.py, which the tests run small); ``--late`` stores token vectors for MaxSim too. Writes
benchmarks/results/engine_crash.md. (It was benchmarks/engine_crash.py until #84 made room for benchmarks/cluster.py.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness.concurrency import readers, writers


def crash(args: argparse.Namespace) -> None:
    from tests.harness.engine_crash import run

    out = args.out or ROOT / "benchmarks" / "results" / "engine_crash.md"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.rounds, args.seed, Path(tmp), args.passages, args.late)
    text = ("# Engine crash test\n\nCommand: `python benchmarks/concurrency.py --kind crash --rounds "
            f"{args.rounds} --seed {args.seed} --passages {args.passages}{' --late' if args.late else ''}` "
            f"({time.perf_counter() - t0:.0f} s)\n\n"
            f"{result['rounds']} engine updates killed with SIGKILL at a random moment "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(result['operations'].items()))}). After every kill the engine "
            "loaded with all checksums verified, its document store, BM25 index and dense index held the same "
            "documents, and it answered the BM25 and dense queries exactly as before the operation "
            f"({result['outcomes']['old']} times) or exactly as after it ({result['outcomes']['new']} times); "
            "never anything else.\n")
    out.write_text(text)
    print(text)
    print(f"engine crash: {result['rounds']} kills, {result['outcomes']['old']} old + {result['outcomes']['new']} new; "
          f"report in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kind", default="all", choices=["engine", "passages", "all", "crash"])
    parser.add_argument("--rounds", type=int, default=24, help="--kind crash: updates killed")
    parser.add_argument("--seed", type=int, default=0, help="--kind crash: the seed of the kill times")
    parser.add_argument("--passages", type=int, default=0, help="--kind crash: words per passage (0: whole documents)")
    parser.add_argument("--late", action="store_true", help="--kind crash: store token vectors (MaxSim) too")
    parser.add_argument("--out", type=Path, default=None, help="the report (default benchmarks/results/"
                        "concurrency.md, or engine_crash.md with --kind crash)")
    args = parser.parse_args()
    if args.kind == "crash":
        return crash(args)
    args.out = args.out or ROOT / "benchmarks" / "results" / "concurrency.md"
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
