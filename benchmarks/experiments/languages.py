"""Every language (#62): a mixed-language engine against one-language engines, and what detection costs SciFact.

    python benchmarks/experiments/languages.py [--data ../shared/data] [--languages de,ru,zh,en] [--repeats 3]

1. **Mixed engine**: the test documents of XQuAD-R in ``--languages`` in one engine (ids prefixed by language),
   the default build (``language`` auto, hybrid with all-MiniLM-L6-v2, no reranker), against one engine per
   language built the same way; each language's test queries in both, nDCG@10 of BM25 and of hybrid.
2. **SciFact cost**: the engine built with ``language`` auto and with the analysis of engines before languages
   (``legacy``): the full build once each (the encoding, the same for both, is most of it), then ``--repeats``
   rounds, in turn, of a BM25-only build (where the analysis is all the work) and the search p50 / p95 of every
   test query, one at a time, hybrid without reranker; nDCG@10 of each.

With ``--analyzers SPLIT``: instead, BM25 of each analysis variant (stopwords, word length, accent folding, the
legacy English analysis) on every language set's SPLIT; the defaults were chosen with ``--analyzers dev``.

The language matrix itself is one ``twostage bench`` call (the command in benchmarks/results/languages.md).
Writes benchmarks/results/languages_mixed.md (+ .json), or languages_analyzers_SPLIT.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def mixed(data: Path, languages: list[str], work: Path) -> dict[str, Any]:
    from twostage import Document, SearchEngine
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.records import Judgment, Qrels

    sets = {lang: BeirDataset(data / "xquad-r" / lang) for lang in languages}
    splits = {lang: ds.split("test") for lang, ds in sets.items()}
    everything = [Document(f"{lang}:{d.id}", d.text, d.title) for lang, ds in sets.items() for d in ds.corpus]

    def measure(engine: Any, lang: str, prefix: str) -> dict[str, float]:
        split = splits[lang]
        qrels = Qrels.from_judgments(Judgment(f"{lang}:{j.query_id}", f"{prefix}{j.doc_id}", j.grade)
                                     for j in split.qrels)
        out = {}
        for stage in ("bm25", "hybrid"):
            run = {f"{lang}:{q.id}": engine.ranked(q.text, 10, first_stage=stage, rerank=False)
                   for q in split.queries}
            out[stage] = mean_ndcg10(qrels, run)
        return out

    t = time.perf_counter()
    engine = SearchEngine.build(everything, work / "mixed", retriever="all-MiniLM-L6-v2")
    built = time.perf_counter() - t
    result: dict[str, Any] = {"documents": len(everything), "build_s": built, "language": engine.language,
                              "dense_languages": engine.settings.dense_languages, "mixed": {}, "alone": {}}
    for lang in languages:
        result["mixed"][lang] = measure(engine, lang, f"{lang}:")
    engine.close()
    for lang in languages:
        alone = SearchEngine.build(sets[lang].root, work / lang, retriever="all-MiniLM-L6-v2")
        result["alone"][lang] = measure(alone, lang, "")
        result.setdefault("alone_language", {})[lang] = alone.language
        alone.close()
    return result


def scifact_cost(data: Path, work: Path, repeats: int) -> dict[str, Any]:
    from twostage import SearchEngine
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.engine_dir import EngineSettings

    ds = BeirDataset(data / "scifact")
    split = ds.split("test")
    variants = (("auto", "auto"), ("legacy", None))
    out: dict[str, Any] = {name: {"bm25_build_s": [], "build_s": [], "p50_ms": [], "p95_ms": []} for name, _ in variants}
    engines = {}
    for name, language in variants:  # the full build once each: the encoding, the same for both, dominates it
        t = time.perf_counter()
        engines[name] = SearchEngine.build(ds.root, work / f"scifact-{name}", retriever="all-MiniLM-L6-v2",
                                           settings=EngineSettings(language=language))
        out[name]["build_s"].append(time.perf_counter() - t)
        out[name]["language"] = engines[name].language
        engines[name].ranked(split.queries[0].text, 10)  # models loaded before timing
    for _ in range(repeats):
        for name, language in variants:
            path = work / f"scifact-bm25-{name}"
            shutil.rmtree(path, ignore_errors=True)
            t = time.perf_counter()
            SearchEngine.build(ds.root, path, retriever=None, settings=EngineSettings(language=language)).close()
            out[name]["bm25_build_s"].append(time.perf_counter() - t)
            times, run = [], {}
            for q in split.queries:
                t = time.perf_counter()
                run[q.id] = engines[name].ranked(q.text, 10, rerank=False)
                times.append((time.perf_counter() - t) * 1000)
            out[name]["p50_ms"].append(float(np.percentile(times, 50)))
            out[name]["p95_ms"].append(float(np.percentile(times, 95)))
            out[name]["ndcg10"] = mean_ndcg10(split.qrels, run)
    for engine in engines.values():
        engine.close()
    ratios = {key: float(np.median([a / b for a, b in zip(out["auto"][key], out["legacy"][key])]))
              for key in ("bm25_build_s", "build_s", "p50_ms", "p95_ms")}
    return {**out, "ratios": ratios, "repeats": repeats}


SETS = [f"xquad-r/{lang}" for lang in "ar de el en es hi ru th tr vi zh".split()] + ["cmrc2018"]
ENGLISH = ["scifact", "nfcorpus"]  # English must rank as before (where the split exists)


def analyzers(data: Path, split: str) -> dict[str, dict[str, float]]:
    """BM25 nDCG@10 of each analysis variant on every language set's ``split`` (the choices were made on dev)."""
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.beir import BeirDataset
    from twostage.retriever.analyzer import AnalyzerConfig
    from twostage.retriever.bm25 import BM25Config, BM25Retriever

    variants = {"legacy": AnalyzerConfig(), "auto": AnalyzerConfig(language="auto"),
                "no stopwords": AnalyzerConfig(language="auto", drop_stopwords=False),
                "single characters kept (en too)": AnalyzerConfig(language="auto", min_chars=1),
                "words of 2+ characters": AnalyzerConfig(language="auto", min_chars=2),
                "accents folded": AnalyzerConfig(language="auto", fold_accents=True)}
    out: dict[str, dict[str, float]] = {}
    for name in SETS + ENGLISH:
        ds = BeirDataset(data / name)
        if split not in ds.splits:
            continue
        part, docs = ds.split(split), list(ds.corpus)
        for label, config in variants.items():
            bm25 = BM25Retriever.build(docs, BM25Config(analyzer=config))
            run = {q.id: bm25.search(q.text, 10) for q in part.queries}
            out.setdefault(label, {})[name.split("/")[-1]] = mean_ndcg10(part.qrels, run)
    return out


def analyzers_report(result: dict[str, dict[str, float]], split: str, command: str) -> str:
    names = [n.split("/")[-1] for n in SETS + ENGLISH if n.split("/")[-1] in next(iter(result.values()))]
    lines = [f"# The lexical analysis per language: BM25 variants on {split}", "", f"Command: `{command}`", "",
             "BM25 (bm25s, k1 1.5, b 0.75) nDCG@10 over each set's whole corpus. `legacy`: the English analysis "
             "of engines built before languages; `auto`: the default now (each text's language detected among the "
             "corpus's; English keeps words of 2+ characters). The other rows change one thing of `auto`.", "",
             "| analysis | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, row in result.items():
        lines.append(f"| {label} | " + " | ".join(f"{row[n]:.3f}" for n in names) + " |")
    return "\n".join(lines + [""])


def report(result: dict[str, Any], command: str) -> str:
    m, s = result["mixed"], result["scifact"]
    lines = ["# Every language: a mixed engine, and what detection costs SciFact", "",
             f"Command: `{command}`", "",
             "Machine: 2 cores; one run, alone on the machine. Engines: the default build (language auto, hybrid, "
             "all-MiniLM-L6-v2, no reranker); nDCG@10 on each language's XQuAD-R test queries.", "",
             "## A mixed engine against one engine per language", "",
             f"{m['documents']} documents of {len(m['mixed'])} languages in one engine (built in {m['build_s']:.0f} s; "
             f"its analysis: {m['language']}; the dense model's card lists {m['dense_languages']}, so a query in "
             "another language is searched by BM25 alone).", "",
             "| language | BM25 alone | BM25 mixed | difference | hybrid alone | hybrid mixed | difference |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for lang, got in m["mixed"].items():
        alone = m["alone"][lang]
        lines.append(f"| {lang} | {alone['bm25']:.3f} | {got['bm25']:.3f} | {got['bm25'] - alone['bm25']:+.3f} | "
                     f"{alone['hybrid']:.3f} | {got['hybrid']:.3f} | {got['hybrid'] - alone['hybrid']:+.3f} |")
    worst = min(min(got[k] - m["alone"][lang][k] for k in ("bm25", "hybrid")) for lang, got in m["mixed"].items())
    lines += ["", f"Largest loss in the mixed engine: **{worst:+.3f}** (the goal: within 0.02).", "",
              "## SciFact: language auto against the analysis of engines before languages", "",
              f"The full build once each; {s['repeats']} rounds of the BM25-only build and the search, in turn (auto, "
              "legacy, auto, ...); ratios are medians of the pairs.", "",
              "| | auto | legacy | auto / legacy |", "|---|---:|---:|---:|"]
    for key, label in (("bm25_build_s", "BM25-only build, s"), ("build_s", "full build (MiniLM), s"),
                       ("p50_ms", "search p50, ms (hybrid, no reranker)"), ("p95_ms", "search p95, ms")):
        lines.append(f"| {label} | {np.median(s['auto'][key]):.2f} | {np.median(s['legacy'][key]):.2f} | "
                     f"{s['ratios'][key]:.2f}x |")
    lines += ["", f"nDCG@10 (hybrid, test): auto {s['auto']['ndcg10']:.4f}, legacy {s['legacy']['ndcg10']:.4f}; "
              f"analysis: {s['auto']['language']} / {s['legacy']['language']}.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--languages", default="de,ru,zh,en")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--analyzers", default=None, metavar="SPLIT",
                        help="instead: BM25 of each analysis variant on SPLIT (dev: how the defaults were chosen) of "
                             "every language set; writes benchmarks/results/languages_analyzers_SPLIT.md")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "languages_mixed.md")
    args = parser.parse_args()
    command = "python benchmarks/experiments/languages.py " + " ".join(sys.argv[1:])
    if args.analyzers:
        out = ROOT / "benchmarks" / "results" / f"languages_analyzers_{args.analyzers}.md"
        out.write_text(analyzers_report(analyzers(args.data, args.analyzers), args.analyzers, command.strip()),
                       encoding="utf-8")
        print(out.read_text())
        return 0
    with tempfile.TemporaryDirectory(prefix="twostage-languages-") as tmp:
        work = Path(tmp)
        result = {"mixed": mixed(args.data, args.languages.split(","), work),
                  "scifact": scifact_cost(args.data, work, args.repeats)}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    args.out.write_text(report(result, command.strip()), encoding="utf-8")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
