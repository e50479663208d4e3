"""Crash test of the search engine: add, upsert, delete and compact killed with SIGKILL at random moments (the
harness: tests/harness/engine_crash.py, which the tests run small).

Usage (from the repository root): python benchmarks/engine_crash.py [--rounds 24] [--seed 0] [--passages WORDS]
[--late] (token vectors for MaxSim too)

Writes benchmarks/results/engine_crash.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.engine_crash import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passages", type=int, default=0, help="words per passage (0: whole documents)")
    parser.add_argument("--late", action="store_true", help="store token vectors (late interaction) too")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "engine_crash.md")
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.rounds, args.seed, Path(tmp), args.passages, args.late)
    text = (f"# Engine crash test\n\nCommand: `python benchmarks/engine_crash.py --rounds {args.rounds} --seed {args.seed} --passages {args.passages}{' --late' if args.late else ''}` "
            f"({time.perf_counter() - t0:.0f} s)\n\n"
            f"{result['rounds']} engine updates killed with SIGKILL at a random moment "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(result['operations'].items()))}). After every kill the engine "
            "loaded with all checksums verified, its document store, BM25 index and dense index held the same "
            "documents, and it answered the BM25 and dense queries exactly as before the operation "
            f"({result['outcomes']['old']} times) or exactly as after it ({result['outcomes']['new']} times); "
            "never anything else.\n")
    args.out.write_text(text)
    print(text)
    print(f"engine crash: {result['rounds']} kills, {result['outcomes']['old']} old + {result['outcomes']['new']} new; "
          f"report in {args.out}")


if __name__ == "__main__":
    main()
