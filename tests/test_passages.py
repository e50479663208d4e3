"""Long documents: passages inside the engine, the matching passage in every hit, folders of files as a corpus."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from twostage import Document, SearchEngine
from twostage.app.cli import main
from twostage.errors import ConfigError, DataError
from twostage.indexer.files import FolderCorpus
from twostage.indexer.passages import (PassageShape, by_document, hit_passage, join, passage_count, sentence_bounds,
                                       split, split_id)
from twostage.indexer.records import RankedList
from twostage.retriever.analyzer import Analyzer

WORDS = ("cat", "dog", "rain", "snow", "cook", "rice", "garden", "piano", "music", "star", "water", "sleep")


# ---- cutting and joining -----------------------------------------------------------------------------
def random_text(rng: random.Random, words: int) -> str:
    seps = [" ", "  ", "\n", "\n\n", "\t", " , "]
    return rng.choice(["", " ", "\n"]) + "".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(words))


@pytest.mark.parametrize("seed", range(30))
def test_passages_join_back_to_the_document_exactly(seed):
    rng = random.Random(seed)
    words = rng.randint(1, 12)
    shape = PassageShape(words, rng.randint(1, words), rng.random() < 0.5)
    doc = Document("d", random_text(rng, rng.randint(0, 60)), "A title", {"year": 2020})
    passages = split(doc, shape)
    n_words = len(doc.text.split())
    assert len(passages) == passage_count(n_words, shape)
    assert [split_id(p.id) for p in passages] == [("d", i) for i in range(len(passages))]
    back, starts = join(passages, shape)
    assert back.text == doc.text and back.id == "d" and back.title == "A title" and back.metadata == doc.metadata
    for p, start in zip(passages, starts):
        assert doc.text[start:start + len(p.text)] == p.text
        assert len(p.text.split()) <= shape.words and p.metadata == doc.metadata
        assert p.title == ("A title" if shape.title_in_front or start == 0 else "")
    covered = [w for p in passages for w in p.text.split()]  # every word is in some passage
    assert set(doc.text.split()) <= set(covered)


def test_a_short_document_is_one_passage_and_bad_shapes_are_refused():
    doc = Document("x", "three little words")
    assert [p.text for p in split(doc, PassageShape(3, 2))] == ["three little words"]
    assert [p.text for p in split(doc, PassageShape(2, 1))] == ["three little ", "little words"]
    for words, stride in ((5, 0), (5, 6), (-1, 1)):
        with pytest.raises(ConfigError, match="passage_"):
            PassageShape(words, stride)
    with pytest.raises(DataError, match="U\\+001F"):
        split(Document("a\x1fb", "text"), PassageShape(3, 2))


def test_whole_up_to_keeps_short_documents_whole():
    shape = PassageShape(10, 5, whole_up_to=30)
    short, long = Document("s", " ".join(f"w{i}" for i in range(30))), Document("l", " ".join(f"w{i}" for i in range(31)))
    assert [p.text for p in split(short, shape)] == [short.text] and passage_count(30, shape) == 1
    assert len(split(long, shape)) == passage_count(31, shape) == 6  # longer: cut as usual
    assert join(split(long, shape), shape)[0].text == long.text
    with pytest.raises(ConfigError, match="passage_whole_up_to"):
        PassageShape(10, 5, whole_up_to=-1)


def test_by_document_keeps_each_stage_order_and_reads_each_stage_best_passage():
    import numpy as np

    dense = [RankedList(np.array(["a\x1f2", "b\x1f0"], dtype=object), np.array([0.9, 0.8], dtype=np.float32))]
    bm25 = [RankedList(np.array(["b\x1f1", "a\x1f0"], dtype=object), np.array([7.0, 3.0], dtype=np.float32))]
    lists, reads = by_document({"dense": dense, "bm25": bm25})
    assert list(lists["dense"][0].ids) == ["a", "b"] and list(lists["bm25"][0].ids) == ["b", "a"]
    # every stage's best passage, the one of the stage that ranked the document higher first (the hit shows it)
    assert reads == [{"a": ("a\x1f2", "a\x1f0"), "b": ("b\x1f1", "b\x1f0")}]
    _, tied = by_document({"dense": dense, "bm25": [RankedList(bm25[0].ids[::-1], bm25[0].scores)]})
    assert tied == [{"a": ("a\x1f2", "a\x1f0"), "b": ("b\x1f0", "b\x1f1")}]  # the same rank: the first stage listed
    same = [RankedList(np.array(["a\x1f2", "a\x1f1"], dtype=object), np.array([2.0, 1.0], dtype=np.float32))]
    assert by_document({"dense": dense, "bm25": same})[1] == [{"a": ("a\x1f2",), "b": ("b\x1f0",)}]  # once each


def test_term_spans_and_the_window_a_whole_document_shows():
    analyzer = Analyzer()
    text = "The Runner was running. Runs are fun; the end."
    spans = analyzer.term_spans(text, "run")
    assert [text[a:b] for a, b in spans] == ["Runner", "running", "Runs"][1:] or \
        [text[a:b] for a, b in spans] == ["running", "Runs"]
    assert analyzer.term_spans(text, "the") == []  # a stopword marks nothing
    long = " ".join(["filler"] * 200) + " zebra crossing here " + " ".join(["tail"] * 200)
    p = hit_passage("zebra crossing", Document("d", long), [Document("d", long)], [0], None, analyzer)
    assert "zebra crossing" in p.text and long[p.start:p.end] == p.text and len(p.text.split()) <= 60
    assert [p.text[a:b] for a, b in p.spans] == ["zebra", "crossing"]


@pytest.mark.parametrize("language", [None, "auto"])
def test_a_shown_passage_marks_what_analysing_it_again_would(language):
    """The shown passage is trimmed to sentences after its terms are found; the spans it keeps (shifted, not found
    again) are the ones its own text gives, in English, across a CJK run's sentence end, and cut mid-word."""
    from twostage.retriever.analyzer import AnalyzerConfig

    analyzer = Analyzer(AnalyzerConfig(language=language))
    rng = random.Random(3)
    words = ["zebra", "crossings", "striped", "road", "the", "walker", "cars", "stop", "light", "Zebras"]
    texts = [" ".join(rng.choice(words) + ("." if rng.random() < 0.03 else "") for _ in range(300)) for _ in range(5)]
    texts.append("斑马线是条纹的。行人在斑马线上行走。汽车必须停下。红灯亮了。斑马在草原上奔跑。" * 4)
    trimmed = 0
    for text in texts:
        for query in ("zebra crossing", "striped road walker", "斑马线 行人"):
            for _ in range(40):
                a = rng.randrange(len(text))
                b = min(len(text), a + rng.randrange(20, 400))
                p = hit_passage(query, Document("d", text), [Document("d", text[a:b])], [a], 0, analyzer)
                assert text[p.start:p.end] == p.text
                assert p.spans == tuple(analyzer.term_spans(p.text, query)), (text[a:b], query)
                s0, e0 = sentence_bounds(text, a, b)
                trimmed += len(p.text) < len(text[s0:e0].strip())
    assert trimmed > 30  # the trims were exercised


# ---- the engine with passages -------------------------------------------------------------------------
def long_corpus() -> list[Document]:
    rng = random.Random(0)
    docs = [Document(f"d{i}", " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 90))), f"Doc {i}",
                     {"n": i}) for i in range(40)]
    needle = " ".join(["filler"] * 150) + " the zebra crossing is striped " + " ".join(["tail"] * 150)
    return docs + [Document("needle", needle, "Long one", {"n": 99})]


@pytest.fixture(scope="module")
def chunked(tmp_path_factory, models):
    retriever, reranker = models
    path = tmp_path_factory.mktemp("chunked") / "eng"
    return SearchEngine.build(long_corpus(), path, retriever=retriever, reranker=reranker, passage_words=20,
                              passage_stride=10)


def test_a_passage_engine_returns_documents_once_with_their_best_passage(chunked):
    assert len(chunked) == 41 and chunked.manifest.passages > 41
    assert chunked.reading()["documents_cut"] >= 30 and "passages" in chunked.info()["reading"]["summary"]
    for first_stage in ("bm25", "dense", "hybrid"):
        for rerank in (False, True):
            r = chunked.search("zebra crossing", k=20, first_stage=first_stage, rerank=rerank)
            assert len(set(r.ids)) == len(r.ids) and all("\x1f" not in i for i in r.ids)
            for hit in r.hits:
                assert hit.text[hit.passage.start:hit.passage.end] == hit.passage.text
                assert all(0 <= a < b <= len(hit.passage.text) for a, b in hit.passage.spans)
    bm25 = chunked.search("zebra crossing", k=3, first_stage="bm25", rerank=False)
    top = bm25.hits[0]
    assert top.id == "needle" and "zebra crossing" in top.passage.text  # BM25 reads page three
    assert [top.passage.text[a:b] for a, b in top.passage.spans] == ["zebra", "crossing"]
    assert top.text == long_corpus()[-1].text  # the whole document comes back, joined from its passages
    assert json.loads(json.dumps(bm25.to_dict()))["hits"][0]["passage"]["text"] == top.passage.text


def test_passage_engine_filters_pages_and_batches(chunked):
    r = chunked.search("rain snow", k=5, where={"n": {"$lt": 10}}, rerank=False)
    assert r.ids and all(h.metadata["n"] < 10 for h in r.hits) and len(set(r.ids)) == len(r.ids)
    whole = chunked.search("rain snow", k=20).ids
    pages = chunked.search("rain snow", k=10).ids + chunked.search("rain snow", k=10, offset=10).ids
    assert pages == whole
    batch = chunked.search_batch(["rain snow", "zebra"], k=5)
    assert [b.ids for b in batch] == [chunked.search(q, k=5).ids for q in ("rain snow", "zebra")]


def test_updates_act_on_whole_documents(chunked, tmp_path):
    import shutil

    shutil.copytree(chunked.root, tmp_path / "e")
    engine = SearchEngine.load(tmp_path / "e")
    rows = engine.manifest.passages
    with pytest.raises(DataError, match="'needle' is already in the engine"):
        engine.add([Document("needle", "again")])
    shorter = engine.upsert([Document("needle", "now only a few words about zebras", "Short")])
    assert len(shorter) == 41 and shorter.manifest.passages < rows
    assert shorter.documents(["needle"])[0].text == "now only a few words about zebras"
    live = [str(i) for i in shorter.index.doc_ids[~shorter.index.deleted]]
    assert sum(i.startswith("needle\x1f") for i in live) == 1 and [str(i) for i in shorter.bm25.doc_ids] == live
    gone = shorter.delete(["needle", "d3"])
    assert len(gone) == 39 and "needle" not in gone and "d3" not in gone
    assert not any(str(i).startswith(("needle\x1f", "d3\x1f")) for i in gone.bm25.doc_ids)
    with pytest.raises(DataError, match="'nope'"):
        gone.delete(["nope"])
    with pytest.raises(ConfigError, match="passage_words is part of the index.s shape"):
        gone.configure(passage_words=50)
    with pytest.raises(ConfigError, match="language is part of the index.s shape"):  # BM25 was analysed in it
        gone.configure(language="de")
    assert SearchEngine.load(tmp_path / "e").manifest.passages == gone.manifest.passages  # all committed


def test_an_engine_from_before_passages_opens_as_whole_documents(tmp_path, models):
    retriever, _ = models
    engine = SearchEngine.build(long_corpus()[:5], tmp_path / "old", retriever=retriever, passage_words=0)
    manifest = engine.version_dir / "manifest.json"
    data = json.loads(manifest.read_text())
    del data["settings"]["passage_words"], data["counts"]["passages"]
    manifest.write_text(json.dumps(data))
    old = SearchEngine.load(tmp_path / "old", verify=False)
    assert old.settings.passage_words == 0 and old.search("rain", k=2).hits[0].passage is not None


def test_a_passage_engine_from_before_whole_up_to_keeps_its_cut(tmp_path, models):
    retriever, _ = models
    engine = SearchEngine.build(long_corpus()[:5], tmp_path / "e", retriever=retriever, passage_whole_up_to=0)
    manifest = engine.version_dir / "manifest.json"
    data = json.loads(manifest.read_text())
    del data["settings"]["passage_whole_up_to"]
    manifest.write_text(json.dumps(data))
    old = SearchEngine.load(tmp_path / "e", verify=False)
    assert old.settings.passage_whole_up_to == 0 and old.settings.passage_words > 0
    with pytest.raises(ConfigError, match="passage_whole_up_to is part of the index.s shape"):
        old.configure(passage_whole_up_to=500)


def test_rerank_whole_up_to_reads_short_documents_whole(tmp_path, models, monkeypatch):
    """The reranker reads a candidate of at most rerank_whole_up_to words whole (title and text), a longer one by
    its best passage; 0 reads every one by its best passage. A search-time setting: configure changes it, an engine
    from before it reads by passages."""
    from twostage.reranker.cross_encoder import CrossEncoder

    retriever, reranker = models
    read: list[str] = []
    predict = CrossEncoder.predict

    def spy(self, pairs, **kw):
        read.extend(d for _, d in pairs)
        return predict(self, pairs, **kw)

    monkeypatch.setattr(CrossEncoder, "predict", spy)
    docs = {d.id: d for d in long_corpus()}
    engine = SearchEngine.build(list(docs.values()), tmp_path / "e", retriever=retriever, reranker=reranker,
                                passage_words=20, passage_stride=10)
    assert engine.settings.rerank_whole_up_to == 300  # the default, chosen on dev
    for value in (0, 50, 10**6):
        engine = engine.configure(rerank_whole_up_to=value)
        read.clear()
        r = engine.search("zebra crossing rain", k=41, first_stage="bm25", rerank_depth=41)
        assert len(read) == len(r.ids) >= 30 and r.hits[0].passage is not None
        for doc in (docs[i] for i in r.ids):
            n = len(doc.text.split())
            whole = doc.full_text in read
            assert whole == (n <= value or n <= 20), (value, doc.id, n)  # a doc of <= 20 words is one passage
            if not whole:
                assert any(text.startswith(doc.title) and text in ("", *[p.full_text for p in split(doc, engine.shape)])
                           for text in read)
    # hybrid: a long candidate is read by its best passage in each first stage, and scores the higher one
    scored: dict[str, float] = {}

    def spy_scores(self, pairs, **kw):
        out = predict(self, pairs, **kw)
        scored.update(zip((d for _, d in pairs), out.tolist()))
        return out

    monkeypatch.setattr(CrossEncoder, "predict", spy_scores)
    engine = engine.configure(rerank_whole_up_to=0)
    twice = 0
    for query in ("zebra crossing rain", "striped tail", "filler sun"):
        scored.clear()
        r = engine.search(query, k=41, first_stage="hybrid", rerank_depth=41)
        for hit in r.hits:
            texts = [p.full_text for p in split(docs[hit.id], engine.shape) if p.full_text in scored]
            assert texts and hit.stage_scores["rerank"] == pytest.approx(max(scored[t] for t in texts), abs=1e-6)
            twice += len(texts) > 1
    assert twice > 0  # some document had a different best passage in BM25 and in dense
    manifest = engine.version_dir / "manifest.json"
    data = json.loads(manifest.read_text())
    del data["settings"]["rerank_whole_up_to"]
    manifest.write_text(json.dumps(data))
    assert SearchEngine.load(tmp_path / "e", verify=False).settings.rerank_whole_up_to == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="rerank_whole_up_to"):
            engine.configure(rerank_whole_up_to=bad)


# ---- folders of files ---------------------------------------------------------------------------------
def pdf_bytes(text: str, title: str) -> bytes:
    """A one-page PDF with ``text`` in Helvetica and ``title`` in its metadata (written by hand: no PDF library
    writes text)."""
    esc = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    content = f"BT /F1 12 Tf 72 720 Td ({esc}) Tj ET".encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>", b"<< /Title (%s) >>" % title.encode()]
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 6 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return out


def make_folder(root: Path, n: int = 200) -> dict[str, str]:
    """``n`` good files of four kinds in nested folders, plus three bad ones; the words each good file holds."""
    rng = random.Random(1)
    words = {}
    for i in range(n):
        kind = ("txt", "md", "html", "pdf")[i % 4]
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) + f" token{i}"
        path = root / f"part{i % 5}" / f"file{i:03d}.{kind}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "txt":
            path.write_text(body)
        elif kind == "md":
            path.write_text(f"# Note {i}\n\n{body}\n")
        elif kind == "html":
            path.write_text(f"<html><head><title>Page {i}</title><style>p{{}}</style></head><body><h1>Page {i}"
                            f"</h1><p>{body}</p><script>var secret{i} = 1;</script></body></html>")
        else:
            path.write_bytes(pdf_bytes(body, f"Paper {i}"))
        words[path.relative_to(root).as_posix()] = body
    (root / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n<< /Type /Catal")  # a corrupt PDF
    (root / "binary.txt").write_bytes(bytes(range(256)) * 4)  # a binary file renamed .txt
    (root / "empty.md").write_text("")
    (root / "notes.csv").write_text("ignored,file\n")
    (root / ".hidden.txt").write_text("never read")
    return words


def test_folder_corpus_reads_each_kind_and_names_each_bad_file(tmp_path, caplog):
    words = make_folder(tmp_path, 8)
    corpus = FolderCorpus(tmp_path)
    docs = {d.id: d for d in corpus}
    assert set(docs) == set(words)
    assert docs["part1/file001.md"].title == "Note 1" and docs["part2/file002.html"].title == "Page 2"
    assert docs["part3/file003.pdf"].title == "Paper 3" and docs["part0/file000.txt"].title == ""
    assert "secret2" not in docs["part2/file002.html"].text and words["part2/file002.html"] in docs[
        "part2/file002.html"].text
    assert " ".join(docs["part3/file003.pdf"].text.split()) == words["part3/file003.pdf"]
    meta = docs["part0/file000.txt"].metadata
    assert meta["path"] == "part0/file000.txt" and meta["type"] == "text" and meta["modified"].endswith("Z")
    assert meta["folder"] == meta["section"] == "part0"  # what --group-by folder groups by
    assert [p for p, _ in corpus.skipped] == ["binary.txt", "broken.pdf", "empty.md"] and corpus.ignored == 1
    why = dict(corpus.skipped)
    assert "binary" in why["binary.txt"] and "PDF" in why["broken.pdf"] and "empty" in why["empty.md"]
    named = [r.getMessage() for r in caplog.records if r.name == "twostage.indexer.files"]
    assert len(named) == 3 and all("\n" not in m for m in named)
    with pytest.raises(DataError, match="binary.txt: a binary file"):
        list(FolderCorpus(tmp_path, strict=True))


def test_markdown_front_matter_is_metadata_and_heading_attributes_leave_titles(tmp_path):
    """Files shaped as mkdocs, Jekyll, Hugo and pandoc write them (the FastAPI docs' release notes and index among
    them): the front matter is metadata, never text or a title; ``{ #anchor }`` blocks leave titles and text."""
    files = {
        "release-notes.md": "---\nhide:\n  - navigation\n---\n\n# Release Notes\n\n## Latest Changes\n\n* Fix.\n",
        "index.md": "---\ninclude_yaml:\n  sponsors: data/sponsors.yml\n---\n\n# FastAPI { #fastapi }\n\nFast to code.\n",
        "post.md": "---\nlayout: post\ntitle: \"Snow in July\"\ndate: 2024-07-01\ntags: [weather, snow]\n"
                   "draft: false\n---\nIt snowed.\n\n## Why { #why .note }\n\nCold air.\n",
        "hugo.md": "+++\ntitle = 'Rain'\nweight = 3\n[params]\nx = 1\n+++\n\nRain falls.\n",
        "pandoc.md": "Setext title {#top}\n=================\n\nBody text.\n",
        "rule.md": "---\n\nNot front matter: a rule above a paragraph.\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    docs = {d.id: d for d in FolderCorpus(tmp_path)}
    assert {i: d.title for i, d in docs.items()} == {
        "release-notes.md": "Release Notes", "index.md": "FastAPI", "post.md": "Snow in July", "hugo.md": "Rain",
        "pandoc.md": "Setext title", "rule.md": ""}
    assert docs["release-notes.md"].metadata["hide"] == ["navigation"]
    assert "navigation" not in docs["release-notes.md"].text and "sponsors" not in docs["index.md"].text
    assert "include_yaml" not in docs["index.md"].metadata  # a nested table is left out
    post = docs["post.md"]
    assert post.metadata["date"] == "2024-07-01" and post.metadata["tags"] == ["weather", "snow"]
    assert post.metadata["draft"] is False and post.metadata["path"] == "post.md" and "layout:" not in post.text
    assert post.metadata["folder"] == post.metadata["section"] == "."
    assert "\nWhy\n" in post.text and "#" not in post.text and "{ #fastapi }" not in docs["index.md"].text
    assert docs["hugo.md"].metadata["weight"] == 3 and "params" not in docs["hugo.md"].metadata
    assert docs["rule.md"].text == "Not front matter: a rule above a paragraph."  # a rule, not fields: its text kept


@pytest.mark.slow
def test_cli_builds_searches_updates_and_deletes_a_folder_of_200_files(tmp_path, models, capsys, caplog):
    retriever, reranker = models
    folder = tmp_path / "docs"
    words = make_folder(folder, 200)
    eng = str(tmp_path / "eng")
    assert main(["-q", "build", "--corpus", str(folder), "--out", eng, "--retriever", str(retriever),
                 "--reranker", str(reranker), "--passage-words", "12", "--passage-stride", "6"]) == 0
    out = capsys.readouterr()
    assert "built" in out.out and "200 documents" in out.out and "long documents:" in out.out
    assert "files: 200 files read, 3 skipped" in out.out
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped")]  # one line each
    assert len(skipped) == 3 and {"binary.txt", "broken.pdf", "empty.md"} == {
        next(n for n in ("binary.txt", "broken.pdf", "empty.md") if n in line) for line in skipped}
    for name in ("part3/file003.pdf", "part2/file042.html", "part1/file101.md", "part0/file140.txt"):
        token = words[name].split()[-1]
        assert main(["search", eng, token, "--k", "3", "--json", "--first-stage", "bm25"]) == 0
        hit = json.loads(capsys.readouterr().out)["hits"][0]
        assert hit["id"] == name and token in hit["passage"]["text"]
        assert any(hit["passage"]["text"][a:b] == token for a, b in hit["passage"]["spans"])
    (folder / "part0" / "file000.txt").write_text("an updated text about zeppelins")
    os.remove(folder / "binary.txt")
    assert main(["-q", "upsert", eng, str(folder)]) == 0
    assert "200 documents" in capsys.readouterr().out
    assert main(["search", eng, "zeppelins", "--k", "1", "--json", "--first-stage", "bm25"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "part0/file000.txt"
    assert main(["-q", "delete", eng, "part0/file000.txt", "part3/file003.pdf"]) == 0
    assert "198 documents" in capsys.readouterr().out
    assert main(["search", eng, "zeppelins", "--k", "3", "--json", "--first-stage", "bm25"]) == 0
    assert "part0/file000.txt" not in [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]]
    before = sorted(p.name for p in Path(eng).iterdir())
    assert main(["-q", "build", "--corpus", str(folder), "--out", str(tmp_path / "strict"), "--retriever",
                 str(retriever), "--strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.pdf" in err[0] and "--strict" in err[0]
    assert not (tmp_path / "strict" / "CURRENT").exists() and sorted(p.name for p in Path(eng).iterdir()) == before


def test_markdown_is_indexed_as_the_text_a_reader_sees():
    """#81: no HTML comments, tags, template directives or link syntax in a folder's text; code kept as code."""
    from twostage.indexer.markdown_text import markdown_text

    source = """<!-- Old headings. Do not remove or links may break. -->
<a id="the-match-control-flow-construct"></a>

## The `match` Control Flow Construct

Rust has an extremely powerful control flow construct called [`match`][match] that
lets you compare a value against a series of patterns. See <https://example.org/guide>.

<Listing number="6-3" file-name="src/main.rs" caption="An enum and a `match` expression">

```rust
{{#rustdoc_include ../listings/ch06/listing-06-03/src/main.rs:here}}
# enum Coin { Penny }
#
#[derive(Debug)]
fn value_in_cents(coin: Coin) -> u8 {
    match coin { Coin::Penny => 1 }
}
```

</Listing>

<span class="filename">Filename: src/main.rs</span>

| Pattern | Meaning |
|---|---|
| `_` | anything |

![a ferris crab](img/ferris.svg) ~~old~~ text<br>next line
{% include note.html %}

[match]: ../std/keyword.match.html
"""
    title, text = markdown_text(source)
    assert title == "The match Control Flow Construct"
    for raw in ("<!--", "<a id", "</Listing>", "<span", "{{#", "{%", "[match]", "](", "```", "keyword.match.html",
                "|---|", "~~"):
        assert raw not in text, raw
    lines = text.splitlines()
    assert lines[0] == "The match Control Flow Construct"
    assert "Rust has an extremely powerful control flow construct called match that lets you compare a value " \
           "against a series of patterns. See https://example.org/guide." in lines
    assert "Listing 6-3: An enum and a match expression" in lines  # mdBook shows the caption above the code
    assert "# enum Coin { Penny }" not in text and "#" not in lines and "#[derive(Debug)]" in lines  # hidden lines
    assert "fn value_in_cents(coin: Coin) -> u8 {" in lines and "    match coin { Coin::Penny => 1 }" in lines
    assert "Filename: src/main.rs" in lines and "Pattern | Meaning" in lines and "_ | anything" in lines
    assert "a ferris crab old text next line" in lines
    assert markdown_text("Setext\n======\n\nBody.") == ("Setext", "Setext\nBody.")
    assert markdown_text("<script>alert(1)</script>\n\nshown") == ("", "shown")


def test_a_table_of_contents_page_is_left_out_of_a_folder(tmp_path):
    """#81: mdBook's SUMMARY.md (all links) matched every question and outranked the chapters it lists."""
    from twostage.indexer.files import FolderCorpus

    chapters = [f"ch{i:02d}.md" for i in range(12)]
    (tmp_path / "SUMMARY.md").write_text("# Summary\n\n" + "".join(
        f"- [Chapter {i}: ownership, borrowing and slices]({c})\n" for i, c in enumerate(chapters)))
    for i, c in enumerate(chapters):
        (tmp_path / c).write_text(f"# Chapter {i}\n\nOwnership rules and borrowing, with a [link](ch00.md) or two.\n")
    corpus = FolderCorpus(tmp_path)
    ids = [d.id for d in corpus]
    assert ids == chapters and corpus.contents == ["SUMMARY.md"] and "1 table of contents left out (SUMMARY.md)" in \
        corpus.summary()
    assert "SUMMARY.md" in [d.id for d in FolderCorpus(tmp_path, keep_contents=True)]


def test_a_shown_passage_starts_and_ends_at_sentences_and_a_snippet_at_words():
    """#81: 59 of 80 passages a newcomer saw started mid-sentence, and the CLI's line cut words in two
    ("... r half is dropped"); its [brackets] collided with Markdown's."""
    from twostage.app.cli_engine import passage_line
    from twostage.indexer.passages import sentence_bounds, sentence_trim, snippet
    from twostage.indexer.records import Passage

    text = ("of the last one. Rust moves the value here, and the first variable is no longer valid. The other half "
            "is dropped at the end. And then it")
    lo, hi = sentence_trim(text, [])
    assert text[lo:hi] == ("Rust moves the value here, and the first variable is no longer valid. The other half "
                           "is dropped at the end.")
    at = text.index("last")
    assert sentence_trim(text, [(at, at + 4)])[0] == 0  # a marked term in the lead keeps it
    at = text.index("then")
    assert sentence_trim(text, [(at, at + 4)])[1] == len(text)
    assert sentence_trim("no boundary in these words at all", []) == (0, 33)
    zh = "结尾。这里是第二句话，里面有答案，还有很多很多的文字。然后"
    assert zh[slice(*sentence_trim(zh, []))] == "这里是第二句话，里面有答案，还有很多很多的文字。"

    doc = "First one here. The value moves to s2 when it is assigned, so s1 is no longer valid. Then more."
    at = doc.index("moves")
    assert doc[slice(*sentence_bounds(doc, at, doc.index("s1 is")))] == \
        "The value moves to s2 when it is assigned, so s1 is no longer valid."  # grown to the sentence
    assert sentence_bounds(doc, at, doc.index("s1 is"), reach=3) == (at, doc.index("s1 is"))  # too far: as it is
    long = "Some words here. " * 8 + "The other half is dropped when the owner goes out of scope. " + "tail words " * 40
    at = long.index("dropped")
    lo, hi = snippet(long, [(at, at + 7)], 80)
    assert long[lo:].startswith("The other half") and long[hi - 1] != " " and long[hi] == " "
    plain = "abcdefgh " * 40
    lo, hi = snippet(plain, [(180, 188)], 100)
    assert plain[lo - 1] == " " and plain[hi] == " " and lo <= 180 < 188 <= hi
    line = passage_line(Passage(long, 0, len(long), ((at, at + 7),)), 80, marks=("\u27e6", "\u27e7"))
    assert line.startswith("... The other half is \u27e6dropped\u27e7 when") and line.endswith(" ...")
    assert "[" not in line and "  " not in line


def test_mkdocs_extensions_are_rendered_as_text():
    """#81: an mkdocs site's admonitions, tabs, icons, attribute lists, footnotes and snippets (Python-Markdown's
    extensions, as squidfunk/mkdocs-material's own docs use them) as a reader sees them."""
    from twostage.indexer.markdown_text import markdown_text

    source = """# Setting up search

!!! warning "Search needs JavaScript"

    The index is built *offline*. See [the guide](guide.md){ .md-button } :smile:

    ??? tip
        A nested tip :material-check:

=== ":octicons-file-code-16: `mkdocs.yml`"

    ``` yaml
    plugins:
      - search
    ```

--8<-- "includes/abbreviations.md"
*[HTML]: Hyper Text Markup Language

Browsers differ[^1] a lot. Posts live in the [`docs/posts` folder][config.post_dir], a[i][j] stays.

  [^1]:
    Measured in January
    on caniuse.com.

<div class="result" markdown>
</div>
  [Demo]: https://example.org/demo
"""
    title, text = markdown_text(source)
    assert title == "Setting up search"
    for raw in ("!!!", "???", "===", ":smile:", ":material", ":octicons", "{ .md-button }", "--8<--", "*[HTML]",
                "[^1]", "[Demo]", "example.org"):
        assert raw not in text, raw
    lines = text.splitlines()
    for shown in ("Search needs JavaScript", "The index is built offline. See the guide", "A nested tip",
                  "mkdocs.yml", "plugins:", "  - search",
                  "Browsers differ a lot. Posts live in the docs/posts folder, a[i][j] stays.",
                  "Measured in January on caniuse.com."):
        assert shown in lines, shown
