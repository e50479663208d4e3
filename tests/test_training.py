import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from tests.harness.gradients import assert_same_step
from twostage.engine.settings import EngineSettings
from twostage.eval.sts import sts_spearman
from twostage.indexer.beir import BeirDataset
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import Document, Judgment, Qrels
from twostage.retriever.biencoder import BiEncoder
from twostage.retriever.bm25 import BM25Retriever
from twostage.retriever.dense import DenseRetriever
from twostage.retriever.gradcache import CachedMultipleNegativesRankingLoss
from twostage.retriever.losses import MultipleNegativesRankingLoss
from twostage.retriever.mining import MiningConfig, load_negatives, mine_hard_negatives, save_negatives
from twostage.retriever.trainer import TrainConfig, train
from twostage.retriever.training_data import (
    PairExample,
    ScoredPair,
    TrainingSet,
    nli_triplets,
    no_duplicate_batches,
    pairs_from_qrels,
    pairs_from_titles,
    round_robin,
    scored_pairs,
)


@pytest.fixture(scope="module")
def sample():
    from pathlib import Path

    ds = BeirDataset(Path(__file__).resolve().parent.parent / "data" / "sample")
    return ds, ds.split("train")


def test_batches_have_no_duplicate_texts_and_cover_everything():
    examples = [PairExample(f"q{i % 7}", f"d{i % 5}") for i in range(40)]
    batches = no_duplicate_batches(examples, 4, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(40))
    for b in batches:
        texts = [t for i in b for t in examples[i].texts()]
        assert len(texts) == len(set(texts))
    assert batches == no_duplicate_batches(examples, 4, seed=1) != no_duplicate_batches(examples, 4, seed=2)


def test_round_robin_alternates_sets():
    plan = round_robin([[[0], [1], [2]], [[0]]])
    assert [s for s, _ in plan] == [0, 1, 0, 0]


def test_training_set_checks():
    with pytest.raises(DataError, match="empty"):
        TrainingSet("x", "mnrl", ())
    with pytest.raises(DataError, match="not a PairExample"):
        TrainingSet("x", "mnrl", (ScoredPair("a", "b", 1.0),))
    with pytest.raises(DataError, match="needs a negative"):
        TrainingSet("x", "triplet", (PairExample("a", "b"),))
    with pytest.raises(ConfigError, match="unknown objective"):
        TrainingSet("x", "hinge", (PairExample("a", "b"),))


def test_pairs_from_qrels_counts_missing_documents(sample, caplog):
    ds, split = sample
    qrels = Qrels([*split.qrels, Judgment(split.queries[0].id, "ghost", 1)])
    ts = pairs_from_qrels(ds.corpus, split.queries, qrels)
    assert len(ts.examples) == sum(len(split.qrels.relevant(q.id)) for q in split.queries)
    assert "1 relevant documents are not in the corpus" in caplog.text
    with pytest.raises(DataError, match="no known document"):
        pairs_from_qrels(ds.corpus, split.queries, Qrels([Judgment(split.queries[0].id, "ghost", 1)]))


def test_nli_and_sts_readers(tmp_path):
    (tmp_path / "nli.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"premise": "A man sleeps.", "hypothesis": "A person rests.", "label": "entailment"},
        {"premise": "A man sleeps.", "hypothesis": "A man runs.", "label": "contradiction"},
        {"premise": "A man sleeps.", "hypothesis": "A man dreams.", "label": "neutral"}]) + "\n")
    ts = nli_triplets([tmp_path / "nli.jsonl"])
    assert ts.examples == (PairExample("A man sleeps.", "A person rests.", ("A man runs.",)),)
    (tmp_path / "sts.jsonl").write_text('{"sentence1": "a", "sentence2": "b", "score": 2.5}\n{"sentence1": "a"}\n')
    with pytest.raises(DataError, match=r"sts\.jsonl:2"):
        scored_pairs(tmp_path / "sts.jsonl")


def test_title_pairs(sample):
    ts = pairs_from_titles(sample[0].corpus, min_chars=5)
    assert len(ts.examples) > 150 and ts.examples[0].anchor == sample[0].corpus[0].title


def test_mining_excludes_positives_skips_top_and_guards(sample, tmp_path):
    ds, split = sample
    bm25 = BM25Retriever.build(ds.corpus)
    config = MiningConfig(num_negatives=3, depth=30, skip_top=1, max_ratio=0.95, sample="top")
    frame = mine_hard_negatives(split.queries, split.qrels, ds.corpus.ids, bm25.scores, config)
    assert len(frame) > 0 and frame["rank"].min() >= 2
    for row in frame.itertuples():
        assert row.doc_id not in split.qrels.relevant(row.query_id)
        if row.positive_score > 0:  # the guard needs a positive the retriever scores at all
            assert row.score <= 0.95 * row.positive_score + 1e-6
    save_negatives(frame, tmp_path / "neg.parquet")
    loaded = load_negatives(tmp_path / "neg.parquet")
    assert sum(len(v) for v in loaded.values()) == len(frame)
    with pytest.raises(ConfigError):
        load_negatives_bad = pd.DataFrame({"x": [1]})
        load_negatives_bad.to_parquet(tmp_path / "bad.parquet")
        load_negatives(tmp_path / "bad.parquet")


@pytest.mark.parametrize("dropout", [False, True])
def test_gradcache_equals_the_plain_loss(tiny_bert_dir, dropout):
    """Same loss and parameter gradients as the plain loss. With dropout, the reference embeds the same
    mini-batches in the same order from the same seed, so GradCache must replay each mask exactly."""
    anchors = ["why do cats purr", "how does rain form", "dogs panting heat", "six arms of ice"]
    positives = ["cats purr when content", "rain forms from vapour", "dogs pant to cool", "snowflakes have arms"]
    negatives = [["dogs bark"], ["snow falls"], ["cats sleep"], ["rain drops"]]

    def embed_in_chunks(model, texts, kind):
        return torch.cat([model(model.tokenize(texts[i:i + 3], kind)) for i in range(0, len(texts), 3)])

    def run(cached: bool):
        model = BiEncoder.load(tiny_bert_dir)
        model.train(dropout)
        torch.manual_seed(0)
        if cached:
            return model, CachedMultipleNegativesRankingLoss(model, mini_batch_size=3)(anchors, positives, negatives)
        a = embed_in_chunks(model, anchors, "query")
        p = embed_in_chunks(model, positives, "document")
        n = embed_in_chunks(model, [x[0] for x in negatives], "document").reshape(4, 1, -1)
        return model, MultipleNegativesRankingLoss()(a, p, n)

    assert_same_step(run)


def _ndcg_on(model, ds, split):
    from twostage.eval.metrics import evaluate

    dense = DenseRetriever.build(ds.corpus, model)
    lists = dense.search_batch([q.text for q in split.queries], 10)
    return float(evaluate(split.qrels, dict(zip([q.id for q in split.queries], lists)), ["ndcg@10"]).mean().iloc[0])


def test_training_fits_the_training_queries(tmp_path, tiny_bert_dir, sample):
    ds, split = sample
    before = _ndcg_on(BiEncoder.load(tiny_bert_dir), ds, split)
    ts = pairs_from_qrels(ds.corpus, split.queries, split.qrels)
    result = train(BiEncoder.load(tiny_bert_dir), [ts], TrainConfig(epochs=6, batch_size=16, lr=2e-3, seed=1),
                   tmp_path / "m", dev=lambda m: _ndcg_on(m, ds, split))
    after = _ndcg_on(BiEncoder.load(tmp_path / "m"), ds, split)
    assert after > before + 0.1, (before, after)  # a fit on seen queries, not a quality claim
    assert result.best_dev == pytest.approx(after, abs=1e-6)  # the kept model is the best epoch's
    meta = json.loads((tmp_path / "m" / "twostage.json").read_text())
    assert meta["training"]["steps"] == result.steps and len(meta["training"]["history"]) == 6


@pytest.mark.parametrize("objective,examples,extra", [
    ("triplet", [PairExample(f"anchor {i}", f"positive {i}", (f"negative {i}",)) for i in range(6)], {}),
    ("cosine", [ScoredPair(f"left {i}", f"right {i}", i / 6) for i in range(6)], {}),
    ("contrastive", [ScoredPair(f"left {i}", f"right {i}", i % 2) for i in range(6)], {}),
    ("softmax", [ScoredPair(f"left {i}", f"right {i}", i % 3) for i in range(6)], {"num_labels": 3}),
])
def test_every_objective_trains(tmp_path, tiny_bert_dir, objective, examples, extra):
    ts = TrainingSet(objective, objective, tuple(examples), **extra)
    result = train(BiEncoder.load(tiny_bert_dir), [ts], TrainConfig(epochs=1, batch_size=3, checkpoint_every=1),
                   tmp_path / "m")
    assert result.steps == 2 and (tmp_path / "m" / "model.safetensors").is_file()


def test_empty_training_input(tmp_path, tiny_bert_dir):
    with pytest.raises(ConfigError, match="no training set"):
        train(BiEncoder.load(tiny_bert_dir), [], TrainConfig(), tmp_path / "m")


class KeywordEncoder:
    """A fake encoder: one dimension per keyword, so similarities are known exactly."""

    words = ("cat", "dog", "rain", "snow")

    def encode(self, texts, batch_size=32, kind="document", **kw):
        v = np.array([[t.lower().count(w) for w in self.words] for t in texts], dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True).clip(1e-9)


def test_sts_spearman_with_a_known_encoder(tmp_path):
    rows = [("cat", "cat", 5), ("cat", "cat dog", 3), ("cat", "dog", 0), ("rain snow", "rain snow snow", 4)]
    (tmp_path / "sts.jsonl").write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in rows))
    assert sts_spearman(KeywordEncoder(), tmp_path / "sts.jsonl") == pytest.approx(100.0)


def test_dense_retriever_with_a_keyword_encoder():
    docs = [Document("d1", "a cat"), Document("d2", "rain and snow"), Document("d3", "dog")]
    dense = DenseRetriever.build(docs, KeywordEncoder())
    assert list(dense.search("snow", 2).ids)[0] == "d2"
    assert [r.ids[0] for r in dense.search_batch(["dog", "cat"], 1)] == ["d3", "d1"]
    with pytest.raises(DataError, match="NaN"):
        DenseRetriever(KeywordEncoder(), ["a"], np.array([[math.nan, 0, 0, 0]], dtype=np.float32))


def test_with_margins_scores_each_pair_once_and_subtracts(sample):
    from twostage.retriever.training_data import with_margins

    ds, split = sample
    docs = list(ds.corpus)
    negatives = {q.id: [docs[0].id, docs[1].id] for q in split.queries}
    ts = pairs_from_qrels(ds.corpus, split.queries, split.qrels, negatives=negatives, num_negatives=2)
    calls = []

    def teacher(pairs):
        calls.append(len(pairs))
        return np.array([len(d) / 100 for _, d in pairs])

    distilled = with_margins(ts, teacher)
    assert distilled.objective == "margin_mse" and len(distilled.examples) == len(ts.examples)
    unique = {(e.anchor, t) for e in ts.examples for t in e.texts()[1:]}
    assert calls == [len(unique)]  # one call, every distinct pair once
    e = distilled.examples[0]
    assert e.margins == pytest.approx(tuple((len(e.positive) - len(n)) / 100 for n in e.negatives))
    with pytest.raises(DataError, match="distillation needs"):
        with_margins(pairs_from_qrels(ds.corpus, split.queries, split.qrels), teacher)
    with pytest.raises(DataError, match="teacher returned"):
        with_margins(ts, lambda pairs: np.zeros(len(pairs) - 1))
    with pytest.raises(DataError, match="one teacher margin per negative"):
        TrainingSet("m", "margin_mse", (PairExample("a", "b", ("c",), ()),))


def test_distillation_moves_the_student_toward_the_teacher(tmp_path, tiny_bert_dir, sample):
    from twostage.retriever.losses import MarginMSELoss
    from twostage.retriever.training_data import with_margins

    ds, split = sample
    docs = list(ds.corpus)
    negatives = {q.id: [d.id for d in docs if d.id not in split.qrels.relevant(q.id)][:2] for q in split.queries}
    ts = with_margins(pairs_from_qrels(ds.corpus, split.queries, split.qrels, negatives=negatives, num_negatives=2),
                      lambda pairs: np.array([5.0 if (len(d) % 2) else -5.0 for _, d in pairs]))

    def margin_loss(model):
        with torch.no_grad():
            emb = lambda texts: torch.tensor(model.encode(texts))  # noqa: E731
            n = emb([t for e in ts.examples for t in e.negatives]).reshape(len(ts.examples), 2, -1)
            return MarginMSELoss()(emb([e.anchor for e in ts.examples]), emb([e.positive for e in ts.examples]), n,
                                   torch.tensor([e.margins for e in ts.examples])).item()

    before = margin_loss(BiEncoder.load(tiny_bert_dir))
    train(BiEncoder.load(tiny_bert_dir), [ts], TrainConfig(epochs=4, batch_size=8, lr=2e-3, seed=1,
                                                           margin_rank_weight=0.0), tmp_path / "m")
    after = margin_loss(BiEncoder.load(tmp_path / "m"))
    assert after < 0.8 * before, (before, after)


def test_recipe_second_round_nli_and_teacher(tmp_path, tiny_bert_dir, sample):
    from twostage.retriever.recipe import RetrieverRecipe, train_retriever

    ds, _ = sample
    nli = tmp_path / "nli.jsonl"
    nli.write_text("\n".join(json.dumps({"premise": f"p{i} a cat", "hypothesis": h, "label": lab})
                             for i in range(5) for h, lab in (("an animal", "entailment"), ("no cat", "contradiction"))))
    recipe = RetrieverRecipe(train=TrainConfig(epochs=1, batch_size=8), negatives=1, mine_from="dense",
                             mine_with=str(tiny_bert_dir), nli=(str(nli),), nli_pairs=3,
                             mining=MiningConfig(max_ratio=10.0))  # a random BERT scores everything alike
    result = train_retriever(ds, "train", str(tiny_bert_dir), tmp_path / "m", recipe,
                             teacher=lambda pairs: np.arange(len(pairs), dtype=float), teacher_name="counting")
    meta = json.loads((tmp_path / "m" / "twostage.json").read_text())["training"]
    assert meta["teacher"] == "counting" and meta["recipe"]["mine_with"] == str(tiny_bert_dir)
    assert meta["sets"]["nli"] == 3 and any(name.endswith("+margins") for name in meta["sets"])
    assert result.steps > 0 and (tmp_path / "m.negatives.parquet").is_file()
    with pytest.raises(DataError, match="no query kept a hard negative"):
        train_retriever(ds, "train", str(tiny_bert_dir), tmp_path / "g", replace(recipe, mining=MiningConfig(max_ratio=0.0)))
    with pytest.raises(ConfigError, match="mine_from='dense'"):
        RetrieverRecipe(mine_with="x")
    with pytest.raises(ConfigError, match="needs hard negatives"):
        train_retriever(ds, "train", str(tiny_bert_dir), tmp_path / "n", RetrieverRecipe(negatives=0),
                        teacher=lambda pairs: np.zeros(len(pairs)))


def test_recipe_draws_its_negatives_with_the_training_seed(tmp_path, tiny_bert_dir, sample, monkeypatch):
    """`--seed` changes every random choice, the bi-encoder's hard-negative draw included (it stayed at the mining
    config's own 42 before)."""
    import twostage.retriever.recipe as recipe_mod

    seen = []

    def capture(queries, qrels, ids, scorer, config):
        seen.append(config.seed)
        raise RuntimeError("stop after mining")

    monkeypatch.setattr(recipe_mod, "mine_hard_negatives", capture)
    ds, _ = sample
    for seed in (7, 43):
        recipe = recipe_mod.RetrieverRecipe(train=TrainConfig(epochs=1, batch_size=8, seed=seed), negatives=1)
        with pytest.raises(RuntimeError, match="stop after mining"):
            recipe_mod.train_retriever(ds, "train", str(tiny_bert_dir), tmp_path / f"m{seed}", recipe)
    assert seen == [7, 43]


def test_training_commands_with_no_flags_train_the_recipe_bench_trains(tmp_path, tiny_bert_dir, sample_dir):
    """One source of defaults: `train-retriever` / `train-reranker` with no recipe flags record exactly the settings
    of `TrainSettings().aligned()`, which is what `bench --train-split` trains and records."""
    from dataclasses import asdict

    from twostage.app.cli import main
    from twostage.engine.train_models import TrainSettings
    from twostage.reranker.training import RerankerConfig
    from twostage.retriever.recipe import RetrieverRecipe

    settings = TrainSettings().aligned()
    bench_records = json.loads(json.dumps(asdict(settings), default=str))  # what train_models records
    assert settings.retriever == replace(RetrieverRecipe(), dev_fraction=settings.dev_fraction,
                                         max_pairs=settings.max_pairs)
    assert settings.reranker == replace(RerankerConfig(), max_pairs=settings.max_pairs)

    base = str(tiny_bert_dir)
    assert main(["-q", "train-retriever", "--data", str(sample_dir), "--base", base, "--out", str(tmp_path / "bi")]) == 0
    recorded = json.loads((tmp_path / "bi" / "twostage.json").read_text())["training"]["recipe"]
    assert recorded == bench_records["retriever"]

    assert main(["-q", "train-reranker", "--data", str(sample_dir), "--base", base, "--out", str(tmp_path / "ce"),
                 "--retriever-model", str(tmp_path / "bi")]) == 0
    recorded = json.loads((tmp_path / "ce" / "twostage.json").read_text())["training"]["config"]
    assert recorded == bench_records["reranker"]

    # a flag changes only its own field
    assert main(["-q", "train-reranker", "--data", str(sample_dir), "--base", base, "--out", str(tmp_path / "ce2"),
                 "--epochs", "1", "--no-bf16", "--mine-from", "bm25", "--title-groups", "10"]) == 0
    recorded = json.loads((tmp_path / "ce2" / "twostage.json").read_text())["training"]["config"]
    assert {k for k in recorded if recorded[k] != bench_records["reranker"][k]} == {"epochs", "bf16", "mine_from",
                                                                                     "title_groups"}


def test_positives_prefer_the_highest_grades_and_cap_per_query():
    """NFCorpus judges ~43 documents a query on average (grades 1-2): a cap keeps the grade-2 ones first, a seeded
    draw among equals; no cap keeps every judgment in id order (what SciFact's recipe trains on)."""
    from twostage.indexer.records import Judgment, Qrels
    from twostage.retriever.training_data import positives

    qrels = Qrels([Judgment("q", d, g) for d, g in [("a", 1), ("b", 2), ("c", 2), ("d", 1), ("e", 2), ("z", 0)]])
    assert positives(qrels, "q") == ["a", "b", "c", "d", "e"]
    two = positives(qrels, "q", 2)
    assert len(two) == 2 and set(two) <= {"b", "c", "e"} and positives(qrels, "q", 2) == two
    assert set(positives(qrels, "q", 4)) == {"b", "c", "e"} | (set(positives(qrels, "q", 4)) & {"a", "d"})
    assert len(positives(qrels, "q", 4)) == 4 and positives(qrels, "q", 9) == positives(qrels, "q")
    assert {tuple(positives(qrels, "q", 1, seed=s)) for s in range(20)} == {("b",), ("c",), ("e",)}


def test_held_out_dev_queries_need_a_dev_metric(tmp_path, tiny_bert_dir, sample):
    """Queries held out for model selection with nothing to select by would be training data thrown away."""
    from twostage.engine.training import train_retriever_on
    from twostage.retriever.recipe import RetrieverRecipe, train_retriever

    ds, _ = sample
    with pytest.raises(ConfigError, match="dev_fraction 0.2 holds queries out.*give dev_metric"):
        train_retriever_on(ds, "train", str(tiny_bert_dir), tmp_path / "m", RetrieverRecipe(dev_fraction=0.2))
    with pytest.raises(ConfigError, match="dev_fraction 0.2 holds queries out.*twostage.train "):
        train_retriever(ds, "train", str(tiny_bert_dir), tmp_path / "m", RetrieverRecipe(dev_fraction=0.2))
    assert not (tmp_path / "m").exists()


def test_the_retrievers_epoch_is_chosen_by_the_engines_own_dense_search(tmp_path, tiny_bert_dir, sample):
    """One path: a checkpoint's dev score is the metric of the dense lists an engine built with it answers over the
    dev pool (each query's BM25 top 3 and its relevant documents), passages as served; a training run records one
    such score per epoch."""
    from twostage.engine.search_engine import SearchEngine
    from twostage.engine.training import retriever_dev
    from twostage.eval.metrics import ndcg10_by_query
    from twostage.eval.workflows import train as train_model
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.recipe import RetrieverRecipe

    ds, _ = sample
    sp = ds.split("train")
    queries = list(sp.queries)[:4]
    qrels = sp.qrels.subset(q.id for q in queries)
    settings = EngineSettings(passage_words=8, passage_stride=4)  # the sample's documents become passages
    score = retriever_dev(ds.corpus, ndcg10_by_query, 3, settings)(queries, qrels, None)
    got = score(BiEncoder.load(tiny_bert_dir))
    bm25 = BM25Retriever.build(ds.corpus)
    pool = sorted({d for q in queries for d in [*bm25.search(q.text, 3).ids, *qrels.relevant(q.id)]})
    assert 0 < len(pool) < len(ds.corpus.ids)
    engine = SearchEngine.build([ds.corpus.get(d) for d in pool], tmp_path / "e", retriever=str(tiny_bert_dir),
                                settings=replace(settings, precision="fp32"), first_stage="dense")
    lists = engine.as_retriever().search_batch([q.text for q in queries], 10)
    want = float(np.mean(ndcg10_by_query(qrels, dict(zip([q.id for q in queries], lists)))))
    assert got == pytest.approx(want, abs=1e-9) and got > 0
    recipe = RetrieverRecipe(train=TrainConfig(epochs=2, batch_size=8), negatives=0, dev_fraction=0.3)
    result = train_model(recipe, ds, "train", tmp_path / "m", base=str(tiny_bert_dir), dev_fraction=0.3)  # nDCG@10 default
    assert [h["epoch"] for h in result.history] == [1, 2] and all(0 <= h["dev"] <= 1 for h in result.history)


def test_one_training_entry_takes_either_recipe_and_nothing_else(tmp_path, tiny_bert_dir, sample):
    """twostage.train: the recipe says which model; a retriever to mine with belongs to a reranker's training only;
    anything else is one clear error, before any work."""
    import twostage
    from twostage.eval.workflows import train as train_model
    from twostage.retriever.recipe import RetrieverRecipe

    ds, _ = sample
    assert twostage.train is train_model
    with pytest.raises(ConfigError, match="RetrieverRecipe or a RerankerConfig, got TrainConfig"):
        train_model(TrainConfig(), ds, "train", tmp_path / "m", base=str(tiny_bert_dir))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="retriever= names the bi-encoder a reranker mines with"):
        train_model(RetrieverRecipe(), ds, "train", tmp_path / "m", base=str(tiny_bert_dir), retriever=tiny_bert_dir)
    assert not (tmp_path / "m").exists()


def test_train_keeps_the_recipe_s_dev_fraction(monkeypatch, tmp_path):
    """#82: twostage.train(RetrieverRecipe(dev_fraction=...)) used to overwrite it with its own default 0.1."""
    from twostage.engine import train_models
    from twostage.eval import workflows
    from twostage.retriever.recipe import RetrieverRecipe

    seen = []
    monkeypatch.setattr(train_models, "train_retriever_on", lambda *a, **kw: seen.append(a[4].dev_fraction))
    workflows.train(RetrieverRecipe(dev_fraction=0.3), tmp_path, "train", tmp_path / "out")
    workflows.train(RetrieverRecipe(), tmp_path, "train", tmp_path / "out")
    workflows.train(RetrieverRecipe(), tmp_path, "train", tmp_path / "out", dev_fraction=0.0)
    workflows.train(RetrieverRecipe(dev_fraction=0.3), tmp_path, "train", tmp_path / "out", dev_fraction=0.3)
    assert seen == [0.3, 0.1, 0.0, 0.3]
    with pytest.raises(ConfigError, match="disagree"):
        workflows.train(RetrieverRecipe(dev_fraction=0.3), tmp_path, "train", tmp_path / "out", dev_fraction=0.2)


def test_a_training_budget_keeps_fewer_positives_then_samples_queries():
    """NFCorpus-like qrels (many positives a query) come down to the budget: first one positive a query (the highest
    grade), then a seeded sample of the queries; a split within the budget is left whole; a given max_positives is
    kept and only the queries sampled."""
    from twostage.indexer.records import Query
    from twostage.retriever.training_data import positives, within_budget

    queries = [Query(f"q{i}", f"query {i}") for i in range(10)]
    qrels = Qrels([Judgment(f"q{i}", f"d{i}-{j}", 2 if j == 3 else 1) for i in range(10) for j in range(5)])
    assert within_budget(queries, qrels, 0) == (queries, 0, None)
    assert within_budget(queries, qrels, 50) == (queries, 0, None)  # 50 pairs: all fit
    kept, cap, sampled = within_budget(queries, qrels, 20, seed=3)
    assert (len(kept), cap, sampled.pairs, sampled.of_queries) == (10, 2, 20, 10)
    kept, cap, sampled = within_budget(queries, qrels, 6, seed=3)
    assert (len(kept), cap, sampled.queries, sampled.pairs) == (6, 1, 6, 6)
    assert kept == sorted(kept, key=lambda q: int(q.id[1:]))  # order kept
    assert within_budget(queries, qrels, 6, seed=3)[0] == kept and within_budget(queries, qrels, 6, seed=4)[0] != kept
    # a named number of positives a query is kept: the budget samples the queries instead
    kept, cap, sampled = within_budget(queries, qrels, 6, max_positives=2, seed=3)
    assert (len(kept), cap, sampled.queries, sampled.pairs) == (3, 2, 3, 6)
    assert all(len(positives(qrels, q.id, cap, 3)) == 2 for q in kept)
    with pytest.raises(ConfigError, match="max_pairs"):
        within_budget(queries, qrels, -1)
