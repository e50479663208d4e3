"""The ``twostage`` command line. Errors print one line (``-v`` shows the traceback) and exit non-zero."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from indexer.errors import TwostageError

logger = logging.getLogger("twostage")
SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"


def _bench(args: argparse.Namespace) -> int:
    from eval.harness import run_bench
    from eval.report import markdown_table, write_outputs

    result = run_bench(args.data, args.split, args.systems, k=args.k, ignore_identical_ids=args.ignore_identical_ids,
                       show_progress=not args.quiet)
    config = {"command": args.command_line, "data": str(args.data), "split": args.split,
              "systems": [s.name for s in result.systems], "k": args.k,
              "ignore_identical_ids": args.ignore_identical_ids}
    out = write_outputs(result, args.out, config)
    print(markdown_table(result.table()))
    print(f"wrote {out}/report.md, metrics.json, per_query.csv, runs/, recall_at_k.png")
    return 0


def _download(args: argparse.Namespace) -> int:
    from indexer.download import download_beir

    path = download_beir(args.name, args.dest, base_url=args.base_url, sha256=args.sha256, show_progress=not args.quiet)
    print(path)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from eval.harness import run_bench
    from eval.report import markdown_table, write_outputs
    from eval.systems import SYSTEMS

    data = Path(args.data)
    print(f"twostage demo on {data}: every system against BM25 on the test queries\n")
    result = run_bench(data, "test", list(SYSTEMS), k=100, show_progress=not args.quiet)
    write_outputs(result, args.out, {"command": args.command_line, "data": str(data), "split": "test"})
    print(markdown_table(result.table()))
    bm25 = next(s for s in result.systems if s.name == "bm25")
    from indexer.beir import BeirDataset

    corpus = BeirDataset(data).corpus
    for query in result.split.queries[:3]:
        print(f"\nquery {query.id}: {query.text}")
        relevant = result.split.qrels.relevant(query.id)
        for rank, (doc_id, score) in enumerate(zip(bm25.run[query.id].ids[:5], bm25.run[query.id].scores), 1):
            mark = "*" if doc_id in relevant else " "
            print(f"  {rank}. {mark} [{score:6.2f}] {doc_id}: {corpus.get(doc_id).title}")
    print(f"\n(* = judged relevant)  full report: {args.out}/report.md")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twostage", description="Retrieve, then rerank: build, train and benchmark search.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more and show tracebacks on errors")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="cmd", required=True)

    bench = sub.add_parser("bench", help="evaluate systems on a BEIR directory against BM25")
    bench.add_argument("--data", required=True, type=Path, help="BEIR directory (corpus.jsonl, queries.jsonl, qrels/)")
    bench.add_argument("--split", default="test", help="qrels split to evaluate (default: test)")
    bench.add_argument("--systems", default="bm25", help="comma-separated system names, or 'all' (default: bm25)")
    bench.add_argument("--out", required=True, type=Path, help="output directory (replaced atomically)")
    bench.add_argument("--k", type=int, default=100, help="depth of every run (default: 100)")
    bench.add_argument("--ignore-identical-ids", action="store_true",
                       help="drop retrieved documents whose id equals the query id (ArguAna, Quora)")
    bench.set_defaults(func=_bench)

    dl = sub.add_parser("download", help="download a public BEIR dataset zip and unpack it")
    dl.add_argument("name", help="BEIR dataset name, e.g. scifact, nfcorpus, arguana")
    dl.add_argument("--dest", type=Path, default=Path("datasets"), help="parent directory (default: ./datasets)")
    dl.add_argument("--base-url", default=None, help="mirror to download from instead of the BEIR host")
    dl.add_argument("--sha256", default=None, help="expected sha256 of the zip")
    dl.set_defaults(func=_download)

    demo = sub.add_parser("demo", help="run the demo on the bundled sample collection")
    demo.add_argument("--data", type=Path, default=SAMPLE, help=argparse.SUPPRESS)
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="where the report goes (default: out/demo)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = "twostage " + " ".join(shlex.quote(a) for a in argv)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # some libraries (bm25s) set their own loggers to DEBUG
        handler.setLevel(level)
    try:
        return int(args.func(args))
    except TwostageError as exc:
        if args.verbose:
            raise
        print(f"twostage: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("twostage: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
