"""The ``twostage`` command line. Errors print one line (``-v`` shows the traceback) and exit non-zero."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from twostage.indexer.engine_dir import PRECISIONS, EngineSettings
from twostage.indexer.errors import ConfigError, TwostageError

logger = logging.getLogger("twostage")
SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"  # package data in a wheel (twostage/data)


def _interpolation(value: str) -> float | str | None:
    if value in ("auto", "none"):
        return None if value == "none" else "auto"
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"--rerank-interpolation must be auto, none or a number in [0, 1], got {value!r}") from None


def _bench(args: argparse.Namespace) -> int:
    import time

    from twostage.eval.harness import run_bench
    from twostage.eval.report import markdown_table, write_outputs
    from twostage.eval.systems import NEEDS_MODEL, NEEDS_RERANKER, SYSTEMS, SystemOptions, resolve_systems

    retriever_model, reranker_model, trained = args.retriever_model, args.reranker_model, None
    if args.train_split:
        from twostage.app.train_models import TrainSettings, load_settings, train_models

        names = list(SYSTEMS) if args.systems.strip() == "all" else resolve_systems(args.systems)
        settings = load_settings(args.train_settings) if args.train_settings else TrainSettings()
        if args.base:
            settings = replace(settings, base=args.base)
        trained = train_models(args.data, args.train_split, args.split,
                               args.models_dir or Path(f"{args.out}.models"), settings,
                               retriever=retriever_model or None,
                               need_retriever=any(n in NEEDS_MODEL for n in names) and not args.engine,
                               need_reranker=any(n in NEEDS_RERANKER for n in names) and not reranker_model,
                               show_progress=not args.quiet)
        retriever_model, reranker_model = trained.retriever or retriever_model, trained.reranker or reranker_model
    elif args.train_settings or args.base:
        raise ConfigError("--train-settings and --base only apply with --train-split")
    options = SystemOptions(retriever_model=retriever_model, engine=args.engine, precision=args.precision,
                            backend=args.backend,
                            reranker_model=reranker_model, rerank_depth=args.rerank_depth,
                            rerank_interpolation=_interpolation(args.rerank_interpolation),
                            batch_size=args.batch_size, show_progress=not args.quiet)
    t = time.perf_counter()
    result = run_bench(args.data, args.split, args.systems, k=args.k, ignore_identical_ids=args.ignore_identical_ids,
                       options=options, show_progress=not args.quiet)
    phases = {**(trained.seconds if trained else {}), "evaluate_s": time.perf_counter() - t}
    config = {"command": args.command_line, "data": str(args.data), "split": args.split,
              "systems": [s.name for s in result.systems], "k": args.k,
              "ignore_identical_ids": args.ignore_identical_ids, "retriever_model": retriever_model,
              "reranker_model": reranker_model, "rerank_depth": args.rerank_depth,
              "rerank_interpolation": args.rerank_interpolation, "precision": args.precision,
              "train_split": args.train_split, "train_settings": trained.settings if trained else None,
              "phase_seconds": phases}
    out = write_outputs(result, args.out, config)
    print(markdown_table(result.table()))
    print("phases: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    print(f"wrote {out}/report.md, metrics.json, per_query.csv, runs/, recall_at_k.png, config.json")
    return 0


def _download(args: argparse.Namespace) -> int:
    from twostage.indexer.download import download_beir

    path = download_beir(args.name, args.dest, base_url=args.base_url, sha256=args.sha256, show_progress=not args.quiet)
    print(path)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from twostage.app.demo import run_demo

    print(f"twostage demo on {args.data}: train both stages, index, evaluate every system against BM25\n")
    run_demo(args.data, args.out, base=args.base, command=args.command_line, show_progress=not args.quiet)
    return 0


def _quiet_libraries() -> None:
    """No third-party noise on the console: transformers' load reports and progress bars, hub bars."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers is first imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' own bars follow this too
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a broken PDF is our one line, not pypdf's warnings
    if "transformers" in sys.modules:  # already imported (main called from Python)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


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
    bench.add_argument("--retriever-model", default=None, help="bi-encoder name or directory (dense systems)")
    bench.add_argument("--engine", default=None, help="an engine directory built from this corpus (twostage build): "
                       "the dense, hybrid and +rerank systems search it with its models")
    bench.add_argument("--backend", default=EngineSettings().backend, help="ANN backend of the engine the dense "
                       "systems search (default: the engine's default)")
    bench.add_argument("--reranker-model", default=None, help="cross-encoder name or directory (+rerank systems)")
    bench.add_argument("--rerank-depth", type=int, default=EngineSettings().k_retrieve,
                       help=f"candidates the cross-encoder reads (default {EngineSettings().k_retrieve}, the engine's)")
    bench.add_argument("--train-split", default=None, help="train the missing models on this split first (a dev "
                       "part is held out of it; the evaluated split is never used), e.g. train")
    bench.add_argument("--base", default=None, help="base model for --train-split (default all-MiniLM-L6-v2)")
    bench.add_argument("--train-settings", default=None, help="JSON file of training settings for --train-split "
                       "(the shape config.json records; missing fields keep their defaults)")
    bench.add_argument("--models-dir", type=Path, default=None, help="where --train-split puts the models "
                       "(default: OUT.models)")
    bench.add_argument("--rerank-interpolation", default="auto", help="blend with the first stage's score: auto "
                       "(the value saved with the reranker, if any), none (reranker alone) or a number in [0, 1]")
    bench.add_argument("--precision", default=EngineSettings().precision, choices=list(PRECISIONS),
                       help="inference precision of both models (auto, as the engine: with the openvino extra "
                       "the retriever in openvino-fp32 and the reranker in openvino-int8; else bf16 on AMX CPUs, "
                       "else fp32)")
    bench.add_argument("--batch-size", type=int, default=32, help="encoding batch size")
    bench.set_defaults(func=_bench)


    dl = sub.add_parser("download", help="download a public BEIR dataset zip and unpack it")
    dl.add_argument("name", help="BEIR dataset name, e.g. scifact, nfcorpus, arguana")
    dl.add_argument("--dest", type=Path, default=Path("datasets"), help="parent directory (default: ./datasets)")
    dl.add_argument("--base-url", default=None, help="mirror to download from instead of the BEIR host")
    dl.add_argument("--sha256", default=None, help="expected sha256 of the zip")
    dl.set_defaults(func=_download)

    from twostage.app import cli_engine, cli_index, cli_train

    cli_engine.add_commands(sub)
    cli_index.add_commands(sub)
    cli_train.add_commands(sub)
    cli_train.add_adapt_command(sub)

    demo = sub.add_parser("demo", help="run the demo on the bundled sample collection")
    demo.add_argument("--data", type=Path, default=SAMPLE, help=argparse.SUPPRESS)
    demo.add_argument("--base", default="all-MiniLM-L6-v2", help=argparse.SUPPRESS)
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
    if not args.verbose:
        _quiet_libraries()
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
    except OSError as exc:  # the disk, not the library: say which file and what to do
        import errno

        if args.verbose or exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EMFILE):
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        hint = "free some space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "check the permissions"
        print(f"twostage: error: {exc.strerror}{where}; {hint} and run the command again (nothing was committed)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
