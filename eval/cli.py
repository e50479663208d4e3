"""The ``twostage`` command line. Errors print one line (``-v`` shows the traceback) and exit non-zero."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

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
        from twostage.eval.train_models import TrainSettings, load_settings, train_models

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
    from twostage.eval.demo import run_demo

    print(f"twostage demo on {args.data}: train both stages, index, evaluate every system against BM25\n")
    run_demo(args.data, args.out, base=args.base, command=args.command_line, show_progress=not args.quiet)
    return 0


def _pick(args: argparse.Namespace, name: str, default: object) -> Any:
    """A flag's value, or the recipe's default when the flag was not given (flags default to None)."""
    value = getattr(args, name)
    return default if value is None else value


def _retriever_recipe(args: argparse.Namespace) -> Any:
    """The recipe ``train-retriever`` trains: TrainSettings' (= bench --train-split's), with the given flags."""
    from twostage.eval.train_models import TrainSettings

    base = TrainSettings().aligned().retriever
    t = base.train
    train = replace(t, **{name: _pick(args, name, getattr(t, name)) for name in (
        "epochs", "batch_size", "lr", "seed", "bf16", "scale", "symmetric", "mini_batch_size", "warmup_ratio",
        "margin_rank_weight")})
    mining = replace(base.mining, depth=_pick(args, "mine_depth", base.mining.depth),
                     skip_top=_pick(args, "mine_skip_top", base.mining.skip_top),
                     max_ratio=_pick(args, "mine_max_ratio", base.mining.max_ratio),
                     seed=_pick(args, "seed", base.mining.seed))
    return replace(base, train=train, mining=mining, **{name: _pick(args, name, getattr(base, name)) for name in (
        "negatives", "mine_from", "title_pairs", "dev_fraction", "max_length", "mine_with", "nli_pairs")},
        nli=tuple(str(p) for p in args.nli) if args.nli else base.nli)


def _reranker_recipe(args: argparse.Namespace) -> tuple[Any, float, int]:
    """The config ``train-reranker`` trains (and its dev fraction and depth): TrainSettings' with the given flags."""
    from twostage.eval.train_models import TrainSettings

    settings = TrainSettings().aligned()
    c = settings.reranker
    mine_from = tuple(s.strip() for s in args.mine_from.split(",") if s.strip()) if args.mine_from else c.mine_from
    negatives = _pick(args, "negatives", c.negatives)
    mining = replace(c.mining, num_negatives=negatives, depth=_pick(args, "mine_depth", c.mining.depth),
                     max_ratio=_pick(args, "mine_max_ratio", c.mining.max_ratio))
    config = replace(c, mine_from=mine_from, negatives=negatives, mining=mining, **{
        name: _pick(args, name, getattr(c, name)) for name in (
            "epochs", "groups_per_batch", "loss", "lr", "max_length", "seed", "bf16", "title_groups")})
    return config, _pick(args, "dev_fraction", settings.dev_fraction), _pick(args, "dev_depth", settings.dev_depth)


def _train_retriever(args: argparse.Namespace) -> int:
    from twostage.eval.metrics import evaluate
    from twostage.eval.train_models import TrainSettings
    from twostage.retriever.recipe import train_retriever

    recipe = _retriever_recipe(args)
    teacher = None
    if args.teacher:
        from twostage.reranker.cross_encoder import CrossEncoder

        ce = CrossEncoder.load(args.teacher, precision="bf16" if recipe.train.bf16 else "fp32")
        teacher = lambda pairs: ce.predict(pairs, activation=None, show_progress=not args.quiet)  # noqa: E731
    base = args.base or TrainSettings().base
    result = train_retriever(args.data, args.split, base, args.out, recipe,
                             dev_metric=lambda qrels, run: float(evaluate(qrels, run, ["ndcg@10"])["ndcg@10"].mean()),
                             teacher=teacher, teacher_name=str(args.teacher or ""), show_progress=not args.quiet)
    print(f"trained {result.steps} steps in {result.seconds:.0f} s; model in {result.model_dir}"
          + (f" (best dev nDCG@10 {result.best_dev:.4f})" if result.best_dev is not None else ""))
    return 0


def _train_reranker(args: argparse.Namespace) -> int:
    from twostage.eval.metrics import evaluate
    from twostage.eval.train_models import TrainSettings
    from twostage.reranker.training import train_reranker_on
    from twostage.retriever.biencoder import BiEncoder

    config, dev_fraction, dev_depth = _reranker_recipe(args)
    retriever = BiEncoder.load(args.retriever_model, precision="bf16" if config.bf16 else "fp32") \
        if args.retriever_model else None
    result = train_reranker_on(args.data, args.split, args.base or TrainSettings().base, args.out, config,
                               dev_fraction=dev_fraction, dev_depth=dev_depth, retriever=retriever,
                               resume=not args.no_resume,
                               dev_metric=lambda q, run: float(evaluate(q, run, ["ndcg@10"])["ndcg@10"].mean()),
                               show_progress=not args.quiet, command=args.command_line)
    print(f"trained on {result.training['groups']} groups, {result.steps} steps in {result.seconds:.0f} s; "
          f"model in {result.model_dir}"
          + (f" (best dev nDCG@10 {result.best_dev:.4f})" if result.best_dev is not None else ""))
    if "interpolation" in result.training:
        choice = result.training["interpolation"]
        print(f"interpolation with the first stage chosen on dev: alpha={choice['alpha']} "
              f"(dev nDCG@10 by alpha: {', '.join(f'{a:g}={v:.4f}' for a, v in choice['dev_by_alpha'])})")
    return 0


def _quiet_libraries() -> None:
    """No third-party noise on the console: transformers' load reports and progress bars, hub bars."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers is first imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' own bars follow this too
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
                       help="inference precision of both models (auto: bf16 where the CPU has it, as the engine)")
    bench.add_argument("--batch-size", type=int, default=32, help="encoding batch size")
    bench.set_defaults(func=_bench)

    # Training flags default to None: the value then comes from the recipe dataclasses (TrainSettings, the same
    # recipe bench --train-split trains), so the defaults live in one place.
    recipe = " (default: the measured recipe's, see `twostage.eval.train_models.TrainSettings`)"
    tr = sub.add_parser("train-retriever", help="fine-tune a bi-encoder with contrastive loss on a BEIR split")
    tr.add_argument("--data", required=True, type=Path, help="BEIR directory")
    tr.add_argument("--split", default="train", help="qrels split to train on (default: train)")
    tr.add_argument("--base", default=None, help="base model name or directory (default: all-MiniLM-L6-v2)")
    tr.add_argument("--out", required=True, type=Path, help="where the trained model goes")
    tr.add_argument("--epochs", type=int, default=None, help="epochs" + recipe)
    tr.add_argument("--batch-size", type=int, default=None)
    tr.add_argument("--lr", type=float, default=None)
    tr.add_argument("--warmup-ratio", type=float, default=None)
    tr.add_argument("--seed", type=int, default=None)
    tr.add_argument("--scale", type=float, default=None, help="MNRL scale (inverse temperature)")
    tr.add_argument("--symmetric", action=argparse.BooleanOptionalAction, default=None,
                    help="add the document-to-query InfoNCE term")
    tr.add_argument("--negatives", type=int, default=None, help="hard negatives per query (0: in-batch only)")
    tr.add_argument("--mine-from", default=None, choices=["bm25", "dense"])
    tr.add_argument("--mine-depth", type=int, default=None)
    tr.add_argument("--mine-skip-top", type=int, default=None)
    tr.add_argument("--mine-max-ratio", type=float, default=None, help="false-negative guard: drop candidates "
                    "scoring above this fraction of the positive's score")
    tr.add_argument("--mine-with", default=None, help="a trained bi-encoder to mine the dense negatives with "
                    "(a second round; needs --mine-from dense)")
    tr.add_argument("--title-pairs", type=int, default=None, help="add this many (title, text) pairs of the corpus")
    tr.add_argument("--nli", type=Path, nargs="*", default=[], help="NLI jsonl files (SNLI or SICK rows) added as "
                    "(premise, entailed, contradiction) triplets")
    tr.add_argument("--nli-pairs", type=int, default=None, help="at most this many NLI triplets (0: all)")
    tr.add_argument("--teacher", default=None, help="a trained cross-encoder: distil its score margins on the "
                    "(query, positive, hard negative) triples (MarginMSE, plus MNRL)")
    tr.add_argument("--margin-rank-weight", type=float, default=None, help="weight of MNRL next to MarginMSE "
                    "(0: distillation alone)")
    tr.add_argument("--mini-batch-size", type=int, default=None, help="GradCache mini-batch (0: off)")
    tr.add_argument("--dev-fraction", type=float, default=None, help="train queries held out to pick the best epoch")
    tr.add_argument("--max-length", type=int, default=None)
    tr.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (fp32 weights)")
    tr.set_defaults(func=_train_retriever)

    dl = sub.add_parser("download", help="download a public BEIR dataset zip and unpack it")
    dl.add_argument("name", help="BEIR dataset name, e.g. scifact, nfcorpus, arguana")
    dl.add_argument("--dest", type=Path, default=Path("datasets"), help="parent directory (default: ./datasets)")
    dl.add_argument("--base-url", default=None, help="mirror to download from instead of the BEIR host")
    dl.add_argument("--sha256", default=None, help="expected sha256 of the zip")
    dl.set_defaults(func=_download)

    rr = sub.add_parser("train-reranker", help="train a cross-encoder reranker on a BEIR split" + recipe)
    rr.add_argument("--data", required=True, type=Path)
    rr.add_argument("--split", default="train")
    rr.add_argument("--base", default=None, help="base model, a new one-output head is added (default: "
                    "all-MiniLM-L6-v2)")
    rr.add_argument("--out", required=True, type=Path)
    rr.add_argument("--epochs", type=int, default=None, help="epochs" + recipe)
    rr.add_argument("--groups-per-batch", type=int, default=None)
    rr.add_argument("--negatives", type=int, default=None, help="mined negatives per (query, positive) group")
    rr.add_argument("--loss", default=None, choices=["listwise", "bce"])
    rr.add_argument("--lr", type=float, default=None)
    rr.add_argument("--max-length", type=int, default=None)
    rr.add_argument("--seed", type=int, default=None)
    rr.add_argument("--dev-fraction", type=float, default=None, help="train queries held out to pick the best "
                    "epoch and the interpolation with the first stage")
    rr.add_argument("--dev-depth", type=int, default=None, help="candidates reranked on dev")
    rr.add_argument("--mine-from", default=None, help="first stages to mine negatives from: bm25, dense or "
                    "bm25,dense (dense uses --retriever-model, else the base model)")
    rr.add_argument("--mine-depth", type=int, default=None, help="negatives come from this many top candidates")
    rr.add_argument("--mine-max-ratio", type=float, default=None, help="false-negative guard: drop candidates "
                    "scoring above this fraction of the positive's score")
    rr.add_argument("--retriever-model", default=None, help="bi-encoder for dense-mined negatives and dev")
    rr.add_argument("--title-groups", type=int, default=None, help="(title, text) weak-supervision groups")
    rr.add_argument("--no-resume", action="store_true", help="ignore a checkpoint in OUT.train/last")
    rr.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (fp32 weights)")
    rr.set_defaults(func=_train_reranker)

    from twostage.eval import cli_engine, cli_index

    cli_engine.add_commands(sub)
    cli_index.add_commands(sub)

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
