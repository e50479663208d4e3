"""Crash test: builds and updates of an index directory killed with SIGKILL at random moments (the harness:
tests/harness/index_crash.py, which the tests run small).

Usage (from the repository root): python benchmarks/experiments/index_crash.py [--rounds 24] [--seed 0]

Writes benchmarks/results/index_crash.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.harness.index_crash import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "index_crash.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.rounds, args.seed, Path(tmp))
    text = (f"# Index crash test\n\nCommand: `python benchmarks/experiments/index_crash.py --rounds {args.rounds} --seed {args.seed}`\n\n"
            f"{result['rounds']} operations killed with SIGKILL at a random moment "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(result['operations'].items()))}). After every kill the index "
            f"loaded with all checksums verified and answered exactly as before the operation "
            f"({result['outcomes']['old']} times) or exactly as after it ({result['outcomes']['new']} times); "
            "never anything else.\n")
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
