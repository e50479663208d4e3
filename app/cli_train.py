"""``twostage train-retriever`` and ``twostage train-reranker``.

Their recipe flags are generated from one table: each flag names the :class:`TrainSettings` field(s) it sets (the
same settings ``bench --train-split`` trains), defaults to None, and shows the recipe's value as its default. A
command given no flag trains exactly the recipe's defaults.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from twostage.app.cli import help_of
from twostage.engine.train_models import TrainSettings


@dataclass(frozen=True)
class Flag:
    name: str  # "--batch-size"
    paths: tuple[str, ...]  # the TrainSettings fields it sets, dotted: "retriever.train.batch_size"
    help: str = ""
    type: Any = None  # when the recipe's default is None
    choices: tuple[str, ...] | None = None


BF16_HELP = ("bf16 autocast, fp32 weights (default: on where the device computes bf16 in hardware, a CUDA GPU or an "
             "AMX CPU; elsewhere torch emulates it, about 20x slower)")


def _flags(*rows: tuple[Any, ...]) -> tuple[Flag, ...]:
    return tuple(Flag(name, (paths,) if isinstance(paths, str) else paths, *rest) for name, paths, *rest in rows)


COMMON = _flags(("--base", "base", "base model name or directory"),
                ("--seed", "seed", "seed of every random choice (both models share it)"))
RETRIEVER = COMMON + _flags(
    ("--epochs", "retriever.train.epochs"), ("--batch-size", "retriever.train.batch_size"),
    ("--lr", "retriever.train.lr"), ("--warmup-ratio", "retriever.train.warmup_ratio"),
    ("--scale", "retriever.train.scale", "MNRL scale (inverse temperature)"),
    ("--symmetric", "retriever.train.symmetric", "add the document-to-query InfoNCE term"),
    ("--negatives", "retriever.negatives", "hard negatives per query (0: in-batch only)"),
    ("--mine-from", "retriever.mine_from", "", None, ("bm25", "dense")),
    ("--mine-depth", "retriever.mining.depth"), ("--mine-skip-top", "retriever.mining.skip_top"),
    ("--mine-max-ratio", "retriever.mining.max_ratio",
     "false-negative guard: drop candidates scoring above this fraction of the positive's score"),
    ("--mine-with", "retriever.mine_with", "a trained bi-encoder to mine the dense negatives with (a second round; "
     "needs --mine-from dense)", str),
    ("--title-pairs", "retriever.title_pairs", "add this many (title, text) pairs of the corpus"),
    ("--nli", "retriever.nli", "NLI jsonl files (SNLI or SICK rows) added as (premise, entailed, contradiction)"),
    ("--nli-pairs", "retriever.nli_pairs", "at most this many NLI triplets (0: all)"),
    ("--margin-rank-weight", "retriever.train.margin_rank_weight", "weight of MNRL next to MarginMSE (0: "
     "distillation alone)"),
    ("--mini-batch-size", "retriever.train.mini_batch_size", "GradCache mini-batch (0: off)"),
    ("--late", "retriever.late", "train a late-interaction model (MaxSim over token vectors; for `twostage late`) "
     "instead of a bi-encoder: the same pairs, negatives and loop"),
    ("--query-augmentation", "retriever.query_augmentation", "with --late: pad queries to this many tokens with mask "
     "tokens whose vectors MaxSim keeps (ColBERT's query augmentation; 0: off)"),
    ("--maxsim-temperature", "retriever.train.maxsim_temperature", "with --late: the softmax over MaxSim scores "
     "divided by this (a score sums up to one cosine a query token)"),
    ("--dev-fraction", "dev_fraction", "train queries held out to pick the best epoch"),
    ("--max-length", "retriever.max_length", "token limit (none: the model's)", int),
    ("--bf16", "retriever.train.bf16", BF16_HELP, bool),
    ("--device", "retriever.train.device", "where it trains: cpu, cuda, cuda:N or auto (a CUDA GPU when there is one)",
     str))
RERANKER = COMMON + _flags(
    ("--epochs", "reranker.epochs"), ("--groups-per-batch", "reranker.groups_per_batch"),
    ("--groups-per-pass", "reranker.groups_per_pass", "groups per forward pass (0: the whole batch); fewer use less "
     "memory, the gradient is the same"),
    ("--negatives", ("reranker.negatives", "reranker.mining.num_negatives"),
     "mined negatives per (query, positive) group"),
    ("--loss", "reranker.loss", "", None, ("listwise", "bce")), ("--lr", "reranker.lr"),
    ("--max-length", "reranker.max_length"),
    ("--dev-fraction", "dev_fraction", "train queries held out to pick the best epoch and the blend with the first "
     "stage"),
    ("--rerank-depth", "rerank_depth", "candidates the reranker reads on dev (the engine's rerank_depth)"),
    ("--mine-from", "reranker.mine_from", "first stages to mine negatives from: bm25, dense or both (dense uses "
     "--retriever-model, else the base model)"),
    ("--mine-depth", "reranker.mining.depth", "negatives come from this many top candidates"),
    ("--mine-max-ratio", "reranker.mining.max_ratio",
     "false-negative guard: drop candidates scoring above this fraction of the positive's score"),
    ("--title-groups", "reranker.title_groups", "(title, text) weak-supervision groups"),
    ("--bf16", "reranker.bf16", BF16_HELP, bool),
    ("--device", "reranker.device", "where it trains: cpu, cuda, cuda:N or auto (a CUDA GPU when there is one)", str))


def setting_at(record: Any, path: str) -> Any:
    for part in path.split("."):
        record = getattr(record, part)
    return record


def _set(record: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    return replace(record, **{head: _set(getattr(record, head), rest, value) if rest else value})


def _dest(flag: Flag) -> str:
    return flag.name[2:].replace("-", "_")


def add_flags(parser: argparse.ArgumentParser, flags: tuple[Flag, ...]) -> None:
    recipe = TrainSettings().aligned()
    for f in flags:
        default = setting_at(recipe, f.paths[0])
        kind = f.type or type(default)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        text = f.help if "(default:" in f.help else \
            f"{f.help} (default: {shown if shown not in ('', None) else 'none'})".lstrip()
        if kind is bool:
            parser.add_argument(f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif kind is tuple:
            parser.add_argument(f.name, nargs="+", default=None, help=text + "; several: a,b or a b")
        else:
            parser.add_argument(f.name, type=kind, default=None, choices=f.choices, help=text)


def settings_from_flags(args: argparse.Namespace, flags: tuple[Flag, ...]) -> TrainSettings:
    """TrainSettings with the flags given on top of the recipe's defaults (one seed and dev split for both)."""
    settings = TrainSettings()
    for f in flags:
        value = getattr(args, _dest(f))
        if value is None:
            continue
        if isinstance(value, list):  # tuple fields: "a,b" or "a b"
            value = tuple(part.strip() for v in value for part in str(v).split(",") if part.strip())
        for path in f.paths:
            settings = _set(settings, path, value)
    from twostage.models.device import resolve_device

    resolve_device(settings.retriever.train.device)  # cuda on a machine without it: one line, before any work
    resolve_device(settings.reranker.device)
    return settings.aligned()


def _train_retriever(args: argparse.Namespace) -> int:
    from twostage.engine.train_models import teacher_of
    from twostage.engine.training import train_retriever_on
    from twostage.eval.metrics import ndcg10_by_query

    settings = settings_from_flags(args, RETRIEVER)
    recipe = settings.retriever
    teacher = teacher_of(args.teacher, recipe, not args.quiet) if args.teacher else None
    result = train_retriever_on(args.data, args.split, settings.base, args.out, recipe, dev_metric=ndcg10_by_query,
                                teacher=teacher, teacher_name=str(args.teacher or ""), show_progress=not args.quiet)
    print(f"trained {result.steps} steps in {result.seconds:.0f} s; model in {result.model_dir}"
          + (f" (best dev nDCG@10 {result.best_dev:.4f})" if result.best_dev is not None else ""))
    return 0


def _train_reranker(args: argparse.Namespace) -> int:
    from twostage.engine.training import train_reranker_on
    from twostage.eval.metrics import ndcg10_by_query

    settings = settings_from_flags(args, RERANKER)
    config = settings.reranker
    result = train_reranker_on(args.data, args.split, settings.base, args.out, config,
                               dev_fraction=settings.dev_fraction, rerank_depth=settings.rerank_depth,
                               retriever=args.retriever_model or None,
                               resume=not args.no_resume, dev_metric=ndcg10_by_query, show_progress=not args.quiet,
                               command=args.command_line)
    print(f"trained on {result.training['groups']} groups, {result.steps} steps in {result.seconds:.0f} s; "
          f"model in {result.model_dir}"
          + (f" (best dev nDCG@10 {result.best_dev:.4f})" if result.best_dev is not None else ""))
    if "interpolation" in result.training:
        choice = result.training["interpolation"]
        for name, alpha, curve in [("mean", choice["alpha"], choice["dev_by_alpha"]), *choice["by_first_stage"]]:
            print(f"blend with the first stage ({name}) chosen on dev: alpha={alpha} "
                  f"(dev nDCG@10 by alpha: {', '.join(f'{a:g}={v:.4f}' for a, v in curve)})")
    return 0


def add_commands(sub: Any, only: str | None = None) -> None:
    from twostage.app.cli_engine import add_renamed_flags

    tr = sub.add_parser("train-retriever", help=help_of("train-retriever"))
    tr.add_argument("--data", required=True, type=Path, help="BEIR directory")
    tr.add_argument("--split", default="train", help="qrels split to train on (default: train)")
    tr.add_argument("--out", required=True, type=Path, help="where the trained model goes")
    tr.add_argument("--teacher", default=None, help="a trained cross-encoder: distil its score margins on the "
                    "(query, positive, hard negative) triples (MarginMSE, plus MNRL)")
    add_flags(tr, RETRIEVER)
    tr.set_defaults(func=_train_retriever)

    rr = sub.add_parser("train-reranker", help=help_of("train-reranker"))
    rr.add_argument("--data", required=True, type=Path, help="BEIR directory")
    rr.add_argument("--split", default="train", help="qrels split to train on (default: train)")
    rr.add_argument("--out", required=True, type=Path, help="where the trained model goes")
    rr.add_argument("--retriever-model", default=None, help="bi-encoder for dense-mined negatives and dev")
    rr.add_argument("--no-resume", action="store_true", help="ignore a checkpoint in OUT.train/last")
    add_flags(rr, RERANKER)
    add_renamed_flags(rr, "train")
    rr.set_defaults(func=_train_reranker)


def _adapt(args: argparse.Namespace) -> int:
    from twostage.app.cli_engine import corpus_of
    from twostage.engine.adapt import AdaptRecipe
    from twostage.eval.workflows import adapt

    recipe = AdaptRecipe()
    if args.max_documents is not None:
        recipe = replace(recipe, max_documents=args.max_documents)
    if args.seed is not None:
        recipe = replace(recipe, queries=replace(recipe.queries, seed=args.seed))
    if args.query_kinds is not None:
        kinds = tuple(k.strip() for k in args.query_kinds.split(",") if k.strip())
        recipe = replace(recipe, queries=replace(recipe.queries, kinds=kinds))  # ConfigError names a bad kind
    if args.no_reranker:
        recipe = replace(recipe, reranker=None)
    result = adapt(corpus_of(args), args.out, base=args.base, recipe=recipe, show_progress=not args.quiet,
                   device=args.device, keep_checkpoints=args.keep_checkpoints)
    took = sum(result.seconds.values())
    print(f"adapted in {took / 60:.1f} min: retriever {result.retriever}"
          + (f", reranker {result.reranker}" if result.reranker else "")
          + f"; search settings in {Path(args.out) / 'adapt.json'}"
          + (f"; training checkpoints removed ({result.checkpoints_removed_mb:.0f} MB)"
             if result.checkpoints_removed_mb else ""))
    for note in result.notes:
        print(note)
    return 0


def add_adapt_command(sub: Any) -> None:
    from twostage.app.cli_engine import add_device_flag, add_field_flags
    from twostage.retriever.pseudo_queries import DEFAULT_KINDS, KINDS

    ad = sub.add_parser("adapt", help=help_of("adapt"))
    ad.add_argument("--corpus", required=True, type=Path, help="a folder of .txt, .md, .html or .pdf files, a BEIR directory, or a .jsonl, "
                    ".parquet, .csv or .tsv file")
    ad.add_argument("--out", required=True, type=Path, help="models directory: OUT/retriever, OUT/reranker")
    ad.add_argument("--base", default="all-MiniLM-L6-v2", help="base model name or directory "
                    "(default: all-MiniLM-L6-v2)")
    ad.add_argument("--max-documents", type=int, default=None,
                    help="pseudo-queries come from at most this many documents (default: the recipe's)")
    ad.add_argument("--seed", type=int, default=None, help="seed of every random choice")
    ad.add_argument("--query-kinds", default=None, metavar="KINDS",
                    help=f"comma-separated pseudo-query kinds, some of {', '.join(KINDS)} (default: "
                         f"{','.join(DEFAULT_KINDS)}; passage suits queries that are themselves passages)")
    ad.add_argument("--no-reranker", action="store_true", help="adapt the bi-encoder only")
    ad.add_argument("--keep-checkpoints", action="store_true",
                    help="keep OUT/*.train (the training checkpoints, ~600 MB) after the models are saved")
    add_field_flags(ad)
    add_device_flag(ad)
    ad.set_defaults(func=_adapt)
