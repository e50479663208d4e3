"""Memory and speed of an index's id bookkeeping at N documents: the id map (Arrow array + sorted 64-bit hashes)
against what the index held before (an object array of the ids and two dicts, id -> row and live id -> row); and
BM25's ids, which only name rows: the id map without its hashes against the object array BM25 held before.

Usage (from the repository root):
    python benchmarks/experiments/id_memory.py --ids 10000000 [--md FILE]

Each structure is built in its own process from the same Arrow column of ids ("d0", "d1", ... as the scale
benchmark names them, read as the index reads its parquet id columns); the figure is the growth of anonymous
memory (RssAnon) over the process's size with the Arrow column loaded, after the build. Lookups: 10,000 live rows of
random ids, one call each and all in one call (as `add`/`delete`/`documents` ask), and the ids of 10,000 random rows (as a search's
hits are named). The last line: ``id memory: N ids, map X GB, dicts Y GB, BM25 Z GB (was W)``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

KINDS = {"map": "index: id map (Arrow + sorted hashes)", "dicts": "index before: object array + two dicts",
         "names": "BM25: id map, no lookup by id yet (no hashes)", "array": "BM25 before: object array"}


def rss_anon() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssAnon:"))


def measure(kind: str, n: int) -> dict[str, float]:
    import pyarrow as pa

    column = pa.chunked_array([pa.array([f"d{i}" for i in range(s, min(n, s + 1_000_000))])
                               for s in range(0, n, 1_000_000)])
    rng = np.random.default_rng(0)
    probe_rows = rng.integers(0, n, 10_000)
    probe_ids = [f"d{i}" for i in probe_rows]
    deleted = np.zeros(n, dtype=bool)
    before = rss_anon()
    t = time.perf_counter()
    if kind in ("names", "array"):  # BM25's ids, which only name rows: an id map never asked for a lookup by id,
        if kind == "names":         # against the object array BM25 held before
            from twostage.indexer.ids import IdMap

            ids = IdMap(column)
        else:
            ids = np.asarray(column.to_pylist(), dtype=object)
        build = time.perf_counter() - t
        found, lookup, batch = probe_rows.tolist(), float("nan"), float("nan")
    elif kind == "map":
        from twostage.indexer.ids import IdMap

        ids = IdMap(column)
        ids.rows_of("d0")  # the hashes are built on the first lookup by id: count them in the build
        build = time.perf_counter() - t
        t = time.perf_counter()
        found = [ids.live_rows([i], deleted)[0] for i in probe_ids]
        lookup = time.perf_counter() - t
        t = time.perf_counter()
        assert ids.live_rows(probe_ids, deleted) == found
        batch = time.perf_counter() - t
    else:
        flat = column.to_pylist()
        ids = np.asarray(flat, dtype=object)
        row = {d: i for i, d in enumerate(flat)}
        live_row = {d: i for i, d in enumerate(flat) if not deleted[i]}
        del flat
        build = time.perf_counter() - t
        t = time.perf_counter()
        found = [live_row.get(i) for i in probe_ids]
        lookup = batch = time.perf_counter() - t
        assert len(row) == n
    grown = rss_anon() - before
    t = time.perf_counter()
    named = [ids[probe_rows[i:i + 10]] for i in range(0, len(probe_rows), 10)]
    name = time.perf_counter() - t
    assert found == probe_rows.tolist() and [str(x) for x in np.concatenate(named)] == probe_ids
    return {"gb": grown / 2**30, "build_s": build, "lookup_us": lookup / len(probe_ids) * 1e6,
            "batch_us": batch / len(probe_ids) * 1e6,
            "name10_us": name / len(named) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", type=int, default=10_000_000)
    ap.add_argument("--md", type=Path, default=None, help="append the two rows to this markdown file")
    ap.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)  # the child process's part
    args = ap.parse_args()
    if args.kind:
        print(json.dumps(measure(args.kind, args.ids)))
        return
    out = {}
    for kind in KINDS:
        proc = subprocess.run([sys.executable, __file__, "--ids", str(args.ids), "--kind", kind], check=True,
                              capture_output=True, text=True)
        out[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(kind, out[kind])
    if args.md:
        fresh = not args.md.exists()
        with open(args.md, "a", encoding="utf-8") as fh:
            if fresh:
                fh.write("| ids | structure | anonymous memory GB | build s | live row of an id, us (one call; 10k in one "
                         "call) | ids of 10 rows, us |\n|---|---|---|---|---|---|\n")
            for kind, label in KINDS.items():
                r = out[kind]
                fh.write(f"| {args.ids:,} | {label} | {r['gb']:.2f} | {r['build_s']:.1f} | {r['lookup_us']:.1f}; "
                         f"{r['batch_us']:.1f} | "
                         f"{r['name10_us']:.1f} |\n")
    print(f"id memory: {args.ids} ids, map {out['map']['gb']:.2f} GB, dicts {out['dicts']['gb']:.2f} GB, BM25 "
          f"{out['names']['gb']:.2f} GB (was {out['array']['gb']:.2f})")


if __name__ == "__main__":
    main()
