"""``twostage bench|eval|rerank``: benchmark systems, score any TREC run, rerank someone else's candidates."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from twostage.app.cli import help_of
from twostage.app.cli_engine import add_device_flag, add_renamed_flags, blend_setting, parse_blend
from twostage.engine.settings import EngineSettings
from twostage.indexer.errors import ConfigError, DataError
from twostage.models.device import PRECISIONS


def _bench(args: argparse.Namespace) -> int:
    import time

    from twostage.eval.harness import run_bench
    from twostage.eval.report import markdown_table, write_outputs
    from twostage.eval.significance import check_test
    from twostage.eval.systems import NEEDS_LATE, NEEDS_MODEL, NEEDS_RERANKER, SYSTEMS, SystemOptions, resolve_systems
    from twostage.indexer.beir import BeirDataset

    if args.language != "legacy":
        from twostage.retriever.languages import check_language

        check_language(args.language)
    retriever_model, reranker_model, late_model = args.retriever_model, args.reranker_model, args.late_model
    trained = None
    collections = list(args.data)
    if len(collections) > 1 and (args.train_split or args.engine):
        raise ConfigError("--train-split and --engine apply to one collection: bench each with its own --data, or "
                          "give the suite --retriever-model / --reranker-model")
    if len({Path(d).name for d in collections}) < len(collections):
        raise ConfigError("two --data directories have the same name; the suite names each collection by its folder")
    identical = _identical_ids(args.ignore_identical_ids, collections)
    args.data = collections[0]
    if args.train_split:
        from twostage.engine.train_models import TrainSettings, load_settings, train_models
        from twostage.eval.metrics import ndcg10_by_query

        names = list(SYSTEMS) if args.systems.strip() == "all" else resolve_systems(args.systems)
        settings = load_settings(args.train_settings) if args.train_settings else TrainSettings()
        if args.base:
            settings = replace(settings, base=args.base)
        trained = train_models(args.data, args.train_split, args.split,
                               args.models_dir or Path(f"{args.out}.models"), settings, dev_metric=ndcg10_by_query,
                               retriever=retriever_model or None,
                               need_retriever=any(n in NEEDS_MODEL for n in names) and not args.engine,
                               need_reranker=any(n in NEEDS_RERANKER for n in names) and not reranker_model,
                               need_late=any(n in NEEDS_LATE for n in names) and not late_model,
                               show_progress=not args.quiet)
        retriever_model, reranker_model = trained.retriever or retriever_model, trained.reranker or reranker_model
        late_model = trained.late or late_model
    elif args.train_settings or args.base:
        raise ConfigError("--train-settings and --base only apply with --train-split")
    options = SystemOptions(retriever_model=retriever_model, engine=args.engine, precision=args.precision,
                            backend=args.backend,
                            reranker_model=reranker_model, rerank_depth=args.rerank_depth, late_model=late_model,
                            rerank_blend=blend_setting(args.rerank_blend),
                            maxsim_blend=bench_maxsim_blend(args.maxsim_blend),
                            batch_size=args.batch_size, show_progress=not args.quiet, device=args.device,
                            language=None if args.language == "legacy" else args.language)
    check_test(args.test, args.correction)
    systems = list(SYSTEMS) if args.systems.strip() == "all" else resolve_systems(args.systems)
    if len(systems) > 1 and args.baseline not in resolve_systems(args.systems, options):
        raise ConfigError(f"--baseline {args.baseline}: not among --systems {args.systems}; add it there or pick "
                          "one of them")
    if len(collections) > 1:
        return _suite(args, collections, identical, options, retriever_model, reranker_model)
    t = time.perf_counter()
    dataset, stages = BeirDataset(args.data), []
    if (trained is not None and late_model and settings.dev_fraction and options.maxsim_blend == "auto"
            and any(n in NEEDS_LATE for n in systems)):
        # the dev rule, as for the reranker: MaxSim served only where the held-out train queries show a gain
        from twostage.eval.workflows import choose_maxsim, record_maxsim_choice

        choice = choose_maxsim(dataset, args.train_split, settings.dev_fraction, settings.seed, options)
        options, stages = replace(options, maxsim_blend=choice.weight, maxsim_depth=choice.depth), [choice.line]
        if trained.late:  # kept with the model: an engine built with it serves the same choice over this corpus
            record_maxsim_choice(trained.late, choice, dataset.corpus)
    if trained and trained.reranker:
        from twostage.eval.workflows import reranker_choice

        chosen = reranker_choice(trained.reranker)
        stages += [chosen.line] if chosen is not None else []
    elif not stages:  # given models: what their own training chose on its dev queries, as this run serves it
        stages = _recorded_stages(systems, late_model, reranker_model, options, dataset.corpus)
    result = run_bench(dataset, args.split, args.systems, k=args.k, ignore_identical_ids=identical[0],
                       options=options, rel_level=args.rel_level, show_progress=not args.quiet)
    phases = {**(trained.seconds if trained else {}), "evaluate_s": time.perf_counter() - t}
    config = _config(args, args.data, result, identical[0], retriever_model, reranker_model, phases,
                     trained.settings if trained else None, late_model)
    config["stages"] = stages
    out = write_outputs(result, args.out, config)
    print(markdown_table(result.table()))
    print("phases: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    print(f"wrote {out}/report.md, metrics.json, per_query.csv, significance.csv, runs/, recall_at_k.png, "
          "config.json")
    return 0




def bench_maxsim_blend(value: str) -> float | str:
    """A bench's --maxsim-blend: auto or a number in [0, 1]."""
    blend = parse_blend(value, "--maxsim-blend")
    if blend == "none":
        raise ConfigError("bench --maxsim-blend must be auto or a number in [0, 1] (1: MaxSim's order alone), "
                          "got 'none'")
    return blend  # type: ignore[return-value]  # auto or a number: parse_blend checked it


def _recorded_stages(systems: list[str], late_model: str | None, reranker_model: str | None,
                     options: Any, corpus: Any) -> list[str]:
    """The stage weights given models carry from the dev queries of their own training (another collection's, for a
    model used zero-shot: MaxSim's weight for another corpus, served over ``corpus``), in words, for the report's
    "Stages chosen on dev"."""
    from twostage.eval.systems import NEEDS_LATE, NEEDS_RERANKER
    from twostage.eval.workflows import recorded_maxsim_choice, reranker_choice

    lines = []
    maxsim = recorded_maxsim_choice(late_model, corpus) if any(n in NEEDS_LATE for n in systems) else None
    if maxsim is not None and options.maxsim_blend == "auto":
        lines.append(f"{maxsim.line} (recorded with {late_model} by its training)")
    rerank = (reranker_choice(reranker_model, corpus=corpus)
              if reranker_model and any(n in NEEDS_RERANKER for n in systems) else None)
    if rerank is not None and options.rerank_blend == "auto":
        lines.append(f"{rerank.line} (recorded with {reranker_model} by its training)")
    return lines


def add_significance_flags(parser: argparse.ArgumentParser, baseline: str | None = "bm25") -> None:
    parser.add_argument("--baseline", default=baseline, help="the system (or run) every other one is tested against"
                        + (f" (default: {baseline})" if baseline else " (default: the first --run)"))
    parser.add_argument("--test", default="t", choices=["t", "fisher"], help="paired significance test: t (Student) "
                        "or fisher (randomization: 10,000 permutations, seed 42); default t")
    parser.add_argument("--correction", default="none", choices=["none", "holm", "bonferroni"],
                        help="adjust p-values for comparing several systems to the baseline (default: none)")
    parser.add_argument("--rel-level", type=int, default=1, metavar="N",
                        help="lowest relevant grade, as trec_eval -l (default 1; graded qrels such as TREC DL use 2)")


def _eval(args: argparse.Namespace) -> int:
    from twostage.eval.metrics import DEFAULT_METRICS, evaluate
    from twostage.eval.report import markdown_table
    from twostage.eval.run import Run
    from twostage.eval.significance import check_test, compare
    from twostage.indexer.beir import BeirDataset

    check_test(args.test, args.correction)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else list(DEFAULT_METRICS)
    runs = [Run.from_trec(path) for path in args.run]
    names = [r.name for r in runs]
    if len(set(names)) < len(names):  # two files with one tag: name them by file
        runs = [Run(str(path), dict(r)) for path, r in zip(args.run, runs)]
        names = [r.name for r in runs]
    qrels = BeirDataset(args.data).split(args.split).qrels  # the queries bench evaluates: judged, with a relevant one
    judged = set(qrels.query_ids)
    tables, rows = {}, {}
    for path, run in zip(args.run, runs):
        if not judged & set(run):
            raise DataError(f"{path}: none of its {len(run)} queries has judgments in {args.data} split "
                            f"{args.split!r}; is it a run of this collection and split?")
        tables[run.name] = evaluate(qrels, run, metrics, rel_level=args.rel_level,
                                    ignore_identical_ids=args.ignore_identical_ids)
        own = 0 if args.ignore_identical_ids else \
            sum(1 for q, ranked in run.items() if q in judged and q in {str(d) for d in ranked.ids})
        if own:
            print(f"note: {own} queries of {path.name} retrieve a document with their own id; a collection whose "
                  "queries are in its corpus (ArguAna, Quora) is scored with --ignore-identical-ids, as BEIR and "
                  "bench do", file=sys.stderr)
        rows[run.name] = {m: float(tables[run.name][m].mean()) for m in metrics}
        rows[run.name]["queries"] = len(tables[run.name])
        rows[run.name]["missing"] = sum(1 for q in tables[run.name].index if q not in run)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        import pandas as pd

        table = pd.DataFrame(rows).T.rename_axis("run")
        table[["queries", "missing"]] = table[["queries", "missing"]].astype(int)  # counts, not 225.0000
        print(markdown_table(table, digits=4))
        missing = {n: r["missing"] for n, r in rows.items() if r["missing"]}
        if missing:
            print("queries with judgments the run does not list count as 0 (trec_eval -c): "
                  + ", ".join(f"{n} {c}" for n, c in missing.items()))
    if len(runs) > 1:
        baseline = args.baseline or names[0]
        sig = compare(tables, baseline, metrics, test=args.test, correction=args.correction)
        if not args.json:
            print(f"\nagainst {baseline} ({args.test}" + (f", {args.correction}" if args.correction != "none" else "")
                  + "):")
            for r in sig.itertuples():
                print(f"  {r.system} {r.metric}: {r.delta:+.4f} [{r.ci_low:+.4f}, {r.ci_high:+.4f}] "
                      f"p={r.p_value:.3g}" + (f" adjusted {r.p_adjusted:.3g}" if args.correction != "none" else ""))
    return 0


def _rerank(args: argparse.Namespace) -> int:
    from twostage.eval.rerank_run import rerank_run
    from twostage.eval.run import Run

    run = Run.from_trec(args.run)
    reranked = rerank_run(run, args.data, args.reranker, rerank_depth=args.rerank_depth,
                          rerank_blend=blend_setting(args.rerank_blend), precision=args.precision,
                          batch_size=args.batch_size, source=str(args.run), show_progress=not args.quiet,
                          device=args.device)
    reranked.to_trec(args.out)
    print(f"reranked the top {args.rerank_depth} of {len(run)} queries with {args.reranker}: wrote {args.out}")
    return 0


def _config(args: argparse.Namespace, data: Path, result: Any, ignore: bool, retriever_model: str | None,
            reranker_model: str | None, phases: dict[str, float],
            train_settings: dict[str, Any] | None = None, late_model: str | None = None) -> dict[str, Any]:
    """What a bench run records in config.json (and its report): the command, the data and every setting."""
    return {"command": args.command_line, "data": str(data), "split": args.split,
            "systems": [s.name for s in result.systems], "k": args.k, "ignore_identical_ids": ignore,
            "retriever_model": retriever_model, "reranker_model": reranker_model,
            "late_model": late_model, "rerank_depth": args.rerank_depth,
            "rerank_blend": args.rerank_blend, "precision": args.precision, "train_split": args.train_split,
            "train_settings": train_settings, "baseline": args.baseline, "test": args.test,
            "correction": args.correction, "rel_level": args.rel_level, "phase_seconds": phases,
            "reading": list(result.notes)}


def _identical_ids(given: list[str] | None, collections: list[Path]) -> list[bool]:
    """Per collection: whether to drop a hit whose id is the query's (the flag alone: every collection; with names:
    those collections, named by folder)."""
    if given is None:
        return [False] * len(collections)
    if not given:
        return [True] * len(collections)
    names = {Path(d).name for d in collections}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ConfigError(f"--ignore-identical-ids {' '.join(unknown)}: no such --data collection (the names are the "
                          f"folders: {', '.join(sorted(names))})")
    return [Path(d).name in given for d in collections]


def _suite(args: argparse.Namespace, collections: list[Path], identical: list[bool], options: Any,
           retriever_model: str | None, reranker_model: str | None) -> int:
    """Bench every collection into OUT/<name>/, then the matrix report OUT/suite.md (twostage.eval.suite)."""
    import time

    from twostage.eval.harness import run_bench
    from twostage.eval.report import significance_of, write_outputs
    from twostage.eval.suite import CollectionScores, read_anchors, suite_report
    from twostage.indexer.atomic import write_json

    anchors = read_anchors(args.anchors)
    args.out.mkdir(parents=True, exist_ok=True)
    scores, seconds = [], {}
    for data, ignore in zip(collections, identical):
        t = time.perf_counter()
        result = run_bench(data, args.split, args.systems, k=args.k, ignore_identical_ids=ignore, options=options,
                           rel_level=args.rel_level, show_progress=not args.quiet)
        seconds[data.name] = time.perf_counter() - t
        config = _config(args, data, result, ignore, retriever_model, reranker_model,
                         {"evaluate_s": seconds[data.name]}, late_model=options.late_model)
        write_outputs(result, args.out / data.name, config)
        table = result.table()
        sig = significance_of(result, config)
        scores.append(CollectionScores(
            data.name, len(result.split.queries),
            {str(name): {m: float(row[m]) for m in ("ndcg@10", "recall@100") if m in row} for name, row in
             table.iterrows()},
            {(str(r.system), str(r.metric)): (float(r.delta), float(r.p_value)) for r in sig.itertuples()},
            result.notes))
        print(f"{data.name}: " + ", ".join(f"{n} {v['ndcg@10']:.3f}" for n, v in scores[-1].means.items()),
              flush=True)
    report = suite_report(scores, anchors, command=args.command_line or "twostage bench", baseline=args.baseline)
    (args.out / "suite.md").write_text(report, encoding="utf-8")
    write_json(args.out / "suite.json", {"collections": {c.name: {"queries": c.queries, "means": c.means}
                                                         for c in scores}, "seconds": seconds})
    print(report)
    print(f"wrote {args.out}/suite.md, suite.json and one folder per collection")
    return 0


def add_commands(sub: Any, only: str | None = None) -> None:
    bench = sub.add_parser("bench", help=help_of("bench"))
    bench.add_argument("--data", required=True, type=Path, action="append",
                       help="BEIR directory (corpus.jsonl, queries.jsonl, qrels/); repeat it for a suite: each "
                            "collection into OUT/<folder name>/ and the matrix report OUT/suite.md")
    bench.add_argument("--anchors", default=None, type=Path, help="a suite's published numbers (tab-separated: "
                       "collection, system, ndcg@10, recall@100, source; default: the package's anchors.tsv)")
    bench.add_argument("--split", default="test", help="qrels split to evaluate (default: test)")
    bench.add_argument("--systems", default="bm25", help="comma-separated system names, or 'all' (default: bm25)")
    bench.add_argument("--out", required=True, type=Path, help="output directory (replaced atomically)")
    bench.add_argument("--k", type=int, default=100, help="depth of every run (default: 100)")
    bench.add_argument("--ignore-identical-ids", nargs="*", default=None, metavar="NAME",
                       help="drop retrieved documents whose id equals the query id (ArguAna, Quora); in a suite, "
                            "only for the collections named (folder names), or every one when none is named")
    bench.add_argument("--language", default=EngineSettings().language, metavar="CODE",
                       help="the lexical analysis: auto (default: each text's language detected), a language code, "
                            "or legacy (the English analysis of engines built before languages)")
    bench.add_argument("--retriever-model", default=None, help="bi-encoder name or directory (dense systems)")
    bench.add_argument("--engine", default=None, help="an engine directory built from this corpus (twostage build): "
                       "the dense, hybrid and +rerank systems search it with its models")
    bench.add_argument("--backend", default=EngineSettings().backend, help="ANN backend of the engine the dense "
                       "systems search (default: the engine's default)")
    bench.add_argument("--reranker-model", default=None, help="cross-encoder name or directory (+rerank systems)")
    bench.add_argument("--late-model", default=None, help="late-interaction model for the +maxsim systems: a ColBERT "
                       "checkpoint (PyLate or Stanford layout), or a bi-encoder read token by token (zero-shot)")
    bench.add_argument("--rerank-depth", type=int, default=None,
                       help=f"candidates the cross-encoder reads (default: an --engine's own, else "
                            f"{EngineSettings().rerank_depth})")
    bench.add_argument("--train-split", default=None, help="train the missing models on this split first (a dev "
                       "part is held out of it; the evaluated split is never used), e.g. train")
    bench.add_argument("--base", default=None, help="base model for --train-split (default all-MiniLM-L6-v2)")
    bench.add_argument("--train-settings", default=None, help="JSON file of training settings for --train-split "
                       "(the shape config.json records; missing fields keep their defaults)")
    bench.add_argument("--models-dir", type=Path, default=None, help="where --train-split puts the models "
                       "(default: OUT.models)")
    bench.add_argument("--rerank-blend", default="auto",
                       help="the reranker's weight against the first stage: auto (an --engine's own setting, else "
                            "the value the reranker chose on dev, if any), none (reranker alone) or a number in [0, 1]")
    bench.add_argument("--maxsim-blend", default="auto",
                       help="MaxSim's weight against the first stage in the +maxsim systems: auto (with --train-split "
                            "chosen on dev, else the one the --late-model's training recorded, else the engine's "
                            "setting) or a number in [0, 1]")
    bench.add_argument("--precision", default=None, choices=list(PRECISIONS),
                       help="inference precision of both models (default: an --engine's own, else auto: with the "
                       "openvino extra "
                       "the retriever in openvino-fp32 and the reranker in openvino-int8; else bf16 on AMX CPUs, "
                       "else fp32)")
    bench.add_argument("--batch-size", type=int, default=None,
                       help=f"encoding batch size (default: an --engine's own, else {EngineSettings().batch_size})")
    add_significance_flags(bench)
    add_device_flag(bench)
    add_renamed_flags(bench, "bench")
    bench.set_defaults(func=_bench)



    ev = sub.add_parser("eval", help=help_of("eval"))
    ev.add_argument("--run", required=True, type=Path, action="append",
                    help="a TREC run file (qid Q0 docid rank score tag); repeat to compare several")
    ev.add_argument("--data", required=True, type=Path, help="BEIR directory whose qrels judge the run")
    ev.add_argument("--split", default="test", help="qrels split (default: test)")
    ev.add_argument("--metrics", default=None, help="comma-separated, e.g. ndcg@10,mrr@10,recall@100 (default: "
                    "ndcg@10, mrr@10, recall@10, recall@100, map@100)")
    ev.add_argument("--json", action="store_true", help="print the means as JSON")
    ev.add_argument("--ignore-identical-ids", action="store_true",
                    help="drop retrieved documents whose id equals the query id (ArguAna, Quora), as bench does")
    add_significance_flags(ev, baseline=None)
    ev.set_defaults(func=_eval)

    rr = sub.add_parser("rerank", help=help_of("rerank"))
    rr.add_argument("--run", required=True, type=Path, help="the TREC run to rerank (any system's)")
    rr.add_argument("--data", required=True, type=Path, help="BEIR directory holding the run's queries and documents")
    rr.add_argument("--reranker", required=True, help="cross-encoder directory or name")
    rr.add_argument("--out", required=True, type=Path, help="the reranked TREC run to write")
    rr.add_argument("--rerank-depth", type=int, default=EngineSettings().rerank_depth,
                    help=f"candidates per query the reranker reads (default {EngineSettings().rerank_depth}); the rest "
                         "follow in the run's order")
    rr.add_argument("--rerank-blend", default="auto",
                    help="the reranker's weight against the run's scores: auto (the value the reranker chose on dev "
                         "for the run's first stage, from its tag), none or a number in [0, 1]")
    rr.add_argument("--precision", default=EngineSettings().precision, choices=list(PRECISIONS),
                    help="inference precision of the reranker (default: auto, as the engine)")
    rr.add_argument("--batch-size", type=int, default=32, help="pairs per batch")
    add_device_flag(rr)
    add_renamed_flags(rr, "rerank")
    rr.set_defaults(func=_rerank)
