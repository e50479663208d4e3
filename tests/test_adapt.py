"""Label-free adaptation: pseudo-queries, score-blend fusion (checked against ranx), ``adapt`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from twostage.engine.fusion import fuse, wsum
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import Document, RankedList
from twostage.retriever.pseudo_queries import (PseudoQueryConfig, as_queries_and_qrels, make_pseudo_queries, sentences,
                                                words)

DOCS = [
    Document("a", "Vitamin D deficiency weakens bone mineral density in older adults. Supplements restored "
                  "density within two years of daily intake. Calcium alone had no measurable effect.",
             "Vitamin D and bone density in the elderly"),
    Document("b", "Aspirin lowers the risk of stroke after surgery. The trial enrolled nine hundred patients "
                  "across four hospitals.", "Aspirin after cardiac surgery"),
    Document("c", "graphene conducts heat better than copper . thin sheets were measured at room temperature .",
             "heat conduction in graphene sheets"),
    Document("d", "Short"),
]


def test_pseudo_queries_cut_their_words_out_of_the_positive():
    pq = make_pseudo_queries(DOCS, PseudoQueryConfig(per_document=3))
    by_kind = {(p.doc_id, p.kind): p for p in pq}
    assert {"title", "sentence", "keywords"} <= {k for _, k in by_kind}
    title = by_kind[("a", "title")]
    assert title.text == DOCS[0].title and DOCS[0].title not in title.positive
    sentence = by_kind[("a", "sentence")]
    assert sentence.text in DOCS[0].text and sentence.text not in sentence.positive
    assert sentence.positive.startswith(DOCS[0].title)  # the title stays with the rest of the text
    keywords = by_kind[("a", "keywords")]
    assert 3 <= len(words(keywords.text)) <= 6 and keywords.positive == DOCS[0].full_text
    assert all(w.lower() in DOCS[0].full_text.lower() for w in words(keywords.text))
    # lowercase text whose sentences end with " ." (Cranfield) still splits into sentences
    assert ("c", "sentence") in by_kind
    # "Short" has no title and a single word: it gives nothing
    assert not any(p.doc_id == "d" for p in pq)
    assert len({p.id for p in pq}) == len(pq)


def test_passage_pseudo_queries_are_one_half_of_the_text_and_the_positive_the_other():
    long = Document("p", " ".join(f"Sentence {i} says that the harbour bridge needed new cables in spring." for i in
                                  range(7)), "harbour bridge repairs")
    config = PseudoQueryConfig(kinds=("passage",))
    assert config.kinds == ("passage",) and "passage" not in PseudoQueryConfig().kinds  # asked for, not default
    seen_first = set()
    for seed in range(12):
        (p,) = make_pseudo_queries([long, *DOCS], PseudoQueryConfig(kinds=("passage",), seed=seed))
        assert p.doc_id == "p" and p.id == "p#passage"  # DOCS' texts are too short to halve (15 words a half)
        assert p.positive.startswith(long.title) and p.text not in p.positive
        rest = p.positive[len(long.title):].strip()
        assert sorted(sentences(p.text) + sentences(rest)) == sorted(sentences(long.text))  # halves, no overlap
        assert min(len(words(p.text)), len(words(rest))) >= 15
        seen_first.add(long.text.startswith(p.text))
    assert seen_first == {True, False}  # either half can be the query


def test_pseudo_queries_are_seeded_and_one_per_document_by_default():
    one = make_pseudo_queries(DOCS, PseudoQueryConfig(seed=1))
    assert [p.doc_id for p in one] == ["a", "b", "c"]
    assert one == make_pseudo_queries(DOCS, PseudoQueryConfig(seed=1))
    kinds = {tuple(p.kind for p in make_pseudo_queries(DOCS, PseudoQueryConfig(seed=s))) for s in range(8)}
    assert len(kinds) > 1  # the seed picks the kinds
    queries, qrels = as_queries_and_qrels(one)
    assert [qrels.relevant(q.id) for q in queries] == [frozenset({p.doc_id}) for p in one]


def test_pseudo_query_errors():
    with pytest.raises(ConfigError, match="kinds must be some of"):
        PseudoQueryConfig(kinds=("questions",))
    with pytest.raises(DataError, match="no document gave a pseudo-query"):
        make_pseudo_queries([Document("x", "one")])
    with pytest.raises(DataError, match="empty corpus"):
        make_pseudo_queries([])


def _random_lists(rng: np.random.Generator, n_docs: int = 40) -> list[RankedList]:
    lists = []
    for scale in (12.0, 0.8):  # a BM25-like and a cosine-like score range
        ids = rng.choice(n_docs, size=int(rng.integers(1, 25)), replace=False)
        scores = np.sort(rng.random(len(ids)) * scale)[::-1].astype(np.float32)
        lists.append(RankedList(np.array([f"d{i}" for i in ids], dtype=object), scores))
    return lists


def test_blend_equals_ranx_wsum_of_min_max_norm():
    from ranx import Run
    from ranx import fuse as ranx_fuse

    rng = np.random.default_rng(0)
    queries = {f"q{i}": _random_lists(rng) for i in range(30)}
    for w in (0.0, 0.3, 0.5, 0.8):
        runs = [Run({q: {str(d): float(s) for d, s in zip(ls[j].ids, ls[j].scores)} for q, ls in queries.items()})
                for j in range(2)]
        ref = ranx_fuse(runs, norm="min-max", method="wsum", params={"weights": [1 - w, w]}).to_dict()
        for q, ls in queries.items():
            ours = wsum(ls, [1 - w, w])
            expected = ref[q]
            assert set(map(str, ours.ids)) == set(expected)
            for d, s in zip(ours.ids, ours.scores):
                assert s == pytest.approx(expected[str(d)], abs=1e-6)
            assert np.all(np.diff(ours.scores) <= 0)


def test_blend_weights_move_the_ranking():
    bm25 = RankedList(np.array(["x", "y"], dtype=object), np.array([10.0, 2.0], dtype=np.float32))
    dense = RankedList(np.array(["y", "x"], dtype=object), np.array([0.9, 0.5], dtype=np.float32))
    assert list(fuse([bm25, dense], "wsum", weights=[0.8, 0.2]).ids) == ["x", "y"]
    assert list(fuse([bm25, dense], "wsum", weights=[0.2, 0.8]).ids) == ["y", "x"]
    # a one-document list normalises to 0, as does each list's lowest score; ties keep the first appearance
    one = RankedList(np.array(["z"], dtype=object), np.array([3.0], dtype=np.float32))
    fused = fuse([one, dense], "wsum", weights=[0.5, 0.5])
    assert list(fused.ids) == ["y", "z", "x"] and list(fused.scores) == [0.5, 0.0, 0.0]
    with pytest.raises(ConfigError, match="one weight per list"):
        wsum([bm25, dense], [1.0])
    with pytest.raises(ConfigError, match="fusion must be rrf or wsum"):
        fuse([bm25, dense], "max")


def test_adapt_trains_both_models_from_the_corpus_alone(tmp_path, tiny_bert_dir, sample_dir):
    from twostage.engine.adapt import AdaptRecipe
    from twostage.eval.workflows import adapt
    from twostage.reranker.cross_encoder import CrossEncoder
    from twostage.reranker.training import RerankerConfig
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.mining import MiningConfig
    from twostage.retriever.trainer import TrainConfig

    recipe = AdaptRecipe(max_documents=80, dev_queries=16, retriever=TrainConfig(epochs=1, batch_size=8, bf16=False),
                         reranker=RerankerConfig(epochs=1, groups_per_batch=4, negatives=2, bf16=False, title_groups=0,
                                                 mining=MiningConfig(num_negatives=2, depth=20, skip_top=0)),
                         reranker_groups=24)
    result = adapt(sample_dir / "corpus.jsonl", tmp_path / "models", base=str(tiny_bert_dir), recipe=recipe,
                   keep_checkpoints=True)
    assert sorted(p.name for p in (tmp_path / "models").glob("*.train")) == ["reranker.train", "retriever.train"]
    enc, ce = BiEncoder.load(tmp_path / "models" / "retriever"), CrossEncoder.load(tmp_path / "models" / "reranker")
    base = BiEncoder.load(tiny_bert_dir)
    # what is kept is what the dev pseudo-queries scored no worse than what it replaces, and the notes say so
    dev = result.dev
    assert result.retriever == (str(tmp_path / "models" / "retriever") if dev["retriever"] >= dev["retriever_base"]
                                else str(tiny_bert_dir))
    assert (result.reranker is None) == (dev["reranker_blend"] == 0.0)
    assert [n.split(":")[0] for n in result.notes] == ["retriever", "reranker"]
    assert ("kept" in result.notes[1]) and (("not kept" in result.notes[1]) == (result.reranker is None))
    assert enc.config.max_length == base.config.max_length  # trained at 128 tokens, saved with the base's limit
    moved = [not torch.equal(a, b) for a, b in zip(enc.model.state_dict().values(), base.model.state_dict().values())]
    assert any(moved)
    from twostage.engine.knobs import dev_choice

    assert ce.head_trained and dev_choice(str(tmp_path / "models" / "reranker")).blend is not None  # chosen on dev
    record = json.loads((tmp_path / "models" / "adapt.json").read_text())
    assert record["pseudo_queries"] + record["dev_queries"] <= 80 and record["dev_queries"] == 16
    assert {"retriever_base", "retriever"} <= set(record["dev"])
    assert record["settings"]["fusion"] in ("rrf", "wsum")
    # a second run finds both models trained: it resumes from the finished checkpoints and trains no step; then,
    # by default, the checkpoints go
    again = adapt(sample_dir / "corpus.jsonl", tmp_path / "models", base=str(tiny_bert_dir), recipe=recipe)
    assert again.seconds["train_retriever_s"] < result.seconds["train_retriever_s"]
    assert not list((tmp_path / "models").glob("*.train")) and again.checkpoints_removed_mb > 0
    assert json.loads((tmp_path / "models" / "adapt.json").read_text())["checkpoints_removed_mb"] > 0


def test_engine_wsum_fusion_and_its_tuning(tmp_path, models, sample_dir, monkeypatch):
    from twostage import SearchEngine
    from twostage.engine.settings import EngineSettings
    from twostage.eval.tune import tune_engine, tune_fusion
    from twostage.indexer.beir import BeirDataset

    retriever, _ = models
    engine = SearchEngine.build(sample_dir, tmp_path / "e", retriever=retriever,
                                settings=EngineSettings(precision="fp32", backend="flat", fusion="rrf"))
    queries = ["why do cats purr", "snow and rain", "music for the piano"]
    blended = engine.configure(fusion="wsum", dense_weight=0.3)
    for q in queries:
        b, d = (engine.search(q, k=100, first_stage=fs, rerank=False) for fs in ("bm25", "dense"))
        lists = [RankedList(np.array(r.ids, dtype=object), np.array([h.score for h in r.hits], dtype=np.float32))
                 for r in (b, d)]
        assert blended.search(q, k=10, rerank=False).ids == list(wsum(lists, [0.7, 0.3]).ids[:10])
        assert engine.search(q, k=10, rerank=False).ids == list(fuse(lists, "rrf").ids[:10])
    with pytest.raises(ConfigError, match="dense_weight must be a number in \\[0, 1\\]"):
        EngineSettings(dense_weight=1.5)
    # the fusion's old name "blend" (#82: the word names the rerank and MaxSim weights too) still works, with a notice,
    # in settings and search options; a manifest on disk that holds it reads as wsum, silently
    with pytest.warns(DeprecationWarning, match="fusion 'blend' is now called 'wsum'"):
        assert EngineSettings(fusion="blend").fusion == "wsum"
    with pytest.warns(DeprecationWarning, match="'wsum'"):
        old = blended.search(queries[0], k=10, rerank=False, fusion="blend", dense_weight=0.3)
    assert old.ids == blended.search(queries[0], k=10, rerank=False).ids
    manifest = blended.version_dir / "manifest.json"
    data = json.loads(manifest.read_text())
    assert data["settings"]["fusion"] == "wsum"
    manifest.write_text(json.dumps({**data, "settings": {**data["settings"], "fusion": "blend"}}))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reread = SearchEngine.load(tmp_path / "e", verify=False)
    assert reread.settings.fusion == "wsum" and reread.search(queries[0], k=10, rerank=False).ids == old.ids
    reread.close()

    ds = BeirDataset(sample_dir)
    sp = ds.split("train")
    qs = list(sp.queries)
    texts = [q.text for q in qs]
    bm25 = engine.as_retriever(first_stage="bm25", rerank=False).search_batch(texts, 100)
    dense = engine.as_retriever(first_stage="dense", rerank=False).search_batch(texts, 100)
    choice = tune_fusion(qs, sp.qrels, bm25, dense)
    assert [(f, w) for f, w, _ in choice.scores][:2] == [("rrf", 0.5), ("wsum", 0.1)] and len(choice.scores) == 10
    best = max(v for _, _, v in choice.scores)
    assert dict(((f, w), v) for f, w, v in choice.scores)[(choice.fusion, choice.dense_weight)] == best
    # tune_engine applies it (enough dev queries) or leaves the fusion alone (too few)
    import twostage.eval.tune as tune_module

    monkeypatch.setattr(tune_module, "MIN_FUSION_QUERIES", 20)  # the sample has 42 train queries
    tuned, result = tune_engine(engine, qs, sp.qrels, apply=False)
    assert result.fusion is not None and result.settings.fusion == choice.fusion
    assert engine.settings.fusion == "rrf"  # apply=False wrote nothing
    _, few = tune_engine(engine, qs[:5], sp.qrels, apply=False)
    assert few.fusion is None and few.settings.fusion == "rrf"


def test_adapt_never_keeps_a_retriever_its_dev_scores_worse_than_the_base(tmp_path, tiny_bert_dir, sample_dir,
                                                                          monkeypatch):
    """#81: the dev pseudo-queries scored the adapted retriever 0.866 against the base's 0.901, and the engine was
    built with the adapted one, without a word."""
    from twostage.engine import adapt as adapt_module
    from twostage.engine.adapt import AdaptRecipe
    from twostage.eval.workflows import adapt
    from twostage.retriever.trainer import TrainConfig

    def rigged(*_: object, **__: object):
        def scorer(*_: object):
            return lambda model: 0.9 if Path(str(getattr(model, "path", ""))) == Path(tiny_bert_dir) else 0.8
        return scorer

    monkeypatch.setattr(adapt_module, "retriever_dev", rigged)
    recipe = AdaptRecipe(max_documents=40, dev_queries=8, retriever=TrainConfig(epochs=1, batch_size=8, bf16=False),
                         reranker=None)
    result = adapt(sample_dir / "corpus.jsonl", tmp_path / "m", base=str(tiny_bert_dir), recipe=recipe)
    assert result.retriever == str(tiny_bert_dir) and result.dev == {"retriever_base": 0.9, "retriever": 0.8}
    assert result.notes == (f"retriever: the base {tiny_bert_dir} kept: on the dev pseudo-queries it scored 0.900, "
                            f"the adapted one 0.800 (left unused in {tmp_path / 'm' / 'retriever'})",)
    assert json.loads((tmp_path / "m" / "adapt.json").read_text())["kept"]["retriever"] == str(tiny_bert_dir)
