"""Every language (#62), one question: in a mixed-language BM25 index, which documents should a document's length be
compared with? One average for the corpus, one per length unit (CJK characters, Thai-like syllables, words), or one
per language (CJK pooled)?

    python benchmarks/experiments/length_groups.py [--data ../shared/data]

XQuAD-R de + ru + zh + en documents in one BM25 index (the default analysis, language auto), each language's dev
and test queries, nDCG@10 against its one-language index. Writes benchmarks/results/languages_length_groups.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LANGS = ["de", "ru", "zh", "en"]


def main() -> int:
    from twostage import Document
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.records import Judgment, Qrels
    from twostage.retriever import languages as lang
    from twostage.retriever.analyzer import AnalyzerConfig
    from twostage.retriever.bm25 import BM25Config, BM25Retriever

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    args = parser.parse_args()
    sets = {code: BeirDataset(args.data / "xquad-r" / code) for code in LANGS}
    everything = [Document(f"{code}:{d.id}", d.text, d.title) for code, ds in sets.items() for d in ds.corpus]
    auto = BM25Config(analyzer=AnalyzerConfig(language="auto"))

    def score(bm25: BM25Retriever, code: str, split: str, prefix: str) -> float:
        part = sets[code].split(split)
        qrels = Qrels.from_judgments(Judgment(j.query_id, f"{prefix}{j.doc_id}", j.grade) for j in part.qrels)
        return mean_ndcg10(qrels, {q.id: bm25.search(q.text, 10) for q in part.queries})

    alone = {code: BM25Retriever.build(sets[code].corpus, auto) for code in LANGS}
    base = {(code, split): score(alone[code], code, split, "") for code in LANGS for split in ("dev", "test")}
    variants = {"one average for the corpus": lambda code: "all", "one per length unit": lang.length_unit,
                "one per language (CJK pooled)": lang.length_group}
    lines = ["# In a mixed-language index, which documents a document's length is compared with", "",
             "Command: `python benchmarks/experiments/length_groups.py`", "",
             "BM25 (bm25s, k1 1.5, b 0.75, language auto) over the XQuAD-R de + ru + zh + en documents in one index; "
             "each language's queries; nDCG@10 minus that of the language's own index. One run, 2-core CPU.", "",
             "| lengths compared with | split | de | ru | zh | en | worst | mean |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    chosen = lang.length_group
    try:
        for name, group in variants.items():
            lang.length_group = group  # read by Postings.weights at every build
            mixed = BM25Retriever.build(everything, auto)
            for split in ("dev", "test"):
                d = {code: score(mixed, code, split, f"{code}:") - base[(code, split)] for code in LANGS}
                lines.append(f"| {name} | {split} | " + " | ".join(f"{d[c]:+.3f}" for c in LANGS)
                             + f" | {min(d.values()):+.3f} | {sum(d.values()) / len(d):+.4f} |")
    finally:
        lang.length_group = chosen
    lines += ["", "One-language indexes: " + ", ".join(f"{c} {s} {v:.3f}" for (c, s), v in base.items()), ""]
    out = ROOT / "benchmarks" / "results" / "languages_length_groups.md"
    out.write_text("\n".join(lines), encoding="utf-8")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
