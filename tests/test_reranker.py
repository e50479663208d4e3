import numpy as np
import pytest

from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import Document, RankedList
from twostage.reranker.cross_encoder import CrossEncoder, UntrainedHeadError
from twostage.reranker.pipeline import Pipeline
from twostage.retriever.bm25 import BM25Retriever
from twostage.retriever.hybrid import HybridRetriever, rrf

PAIRS = [("why do cats purr", "cats purr when they are content"), ("rain", "snow is ice " * 60),
         ("how does rain form", "rain forms when water vapour condenses")]


@pytest.fixture(scope="module")
def trained_dir(tiny_bert_dir, tmp_path_factory):
    """The tiny BERT with a one-output head, saved as if trained (its head is random but marked trained)."""
    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True
    return ce.save(tmp_path_factory.mktemp("ce") / "model")


def test_a_new_head_is_refused_unless_asked(tiny_bert_dir):
    ce = CrossEncoder.load(tiny_bert_dir)
    assert not ce.head_trained
    with pytest.raises(UntrainedHeadError, match="randomly initialised"):
        ce.score("q", ["d"])
    assert CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True).score("q", ["d"]).shape == (1,)


def test_an_untrained_head_stays_refused_after_saving(tmp_path, tiny_bert_dir):
    CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True).save(tmp_path / "m")
    with pytest.raises(UntrainedHeadError):
        CrossEncoder.load(tmp_path / "m").score("q", ["d"])


def test_scores_order_and_truncation(trained_dir):
    ce = CrossEncoder.load(trained_dir)
    batch = ce.predict(PAIRS)
    one_by_one = np.array([ce.predict([p])[0] for p in PAIRS])
    np.testing.assert_allclose(batch, one_by_one, atol=1e-5)  # sorted batches keep input order
    assert np.all((batch > 0) & (batch < 1))
    logits = ce.predict(PAIRS, activation=None)
    np.testing.assert_allclose(1 / (1 + np.exp(-logits)), batch, atol=1e-5)
    ids = ce.tokenize(["why do cats purr"], ["snow " * 500])["input_ids"][0].tolist()
    assert len(ids) == ce.max_length == 128  # capped at the model's positions; only the document was cut
    assert ce.tokenizer.decode(ids).startswith("[CLS] why do cats purr [SEP]")


def test_sentence_transformers_reads_ours(trained_dir):
    st = pytest.importorskip("sentence_transformers")
    theirs = st.CrossEncoder(str(trained_dir), device="cpu").predict(PAIRS)
    np.testing.assert_allclose(CrossEncoder.load(trained_dir).predict(PAIRS), theirs, atol=1e-5)


@pytest.mark.parametrize("pairs,message", [([], "empty"), ([("", "d")], "empty"), ([("q", None)], "NoneType")])
def test_bad_pairs(trained_dir, pairs, message):
    with pytest.raises(DataError, match=message):
        CrossEncoder.load(trained_dir).predict(pairs)


def test_rrf_by_hand():
    a = RankedList(np.array(["x", "y", "z"], dtype=object), np.array([3.0, 2.0, 1.0]))
    b = RankedList(np.array(["y", "w"], dtype=object), np.array([9.0, 1.0]))
    fused = rrf([a, b], k_rrf=60)
    assert list(fused.ids) == ["y", "x", "w", "z"]
    assert fused.scores[0] == pytest.approx(1 / 62 + 1 / 61)
    assert fused.scores[2] == pytest.approx(1 / 62) and fused.scores[3] == pytest.approx(1 / 63)


def test_pipeline_reranks_first_stage_candidates(trained_dir, sample_dir):
    from twostage.indexer.corpus import load_corpus

    corpus = load_corpus(sample_dir)
    bm25 = BM25Retriever.build(corpus)
    hybrid = HybridRetriever([bm25, BM25Retriever.build(corpus)], depth=20)
    ce = CrossEncoder.load(trained_dir)
    pipe = Pipeline(hybrid, reranker=ce, texts=lambda i: corpus.get(i).full_text, k_retrieve=20, k=5)
    result = pipe.search("why do cats purr")
    first = hybrid.search("why do cats purr", 20)
    assert len(result.hits) == 5 and {h.doc_id for h in result.hits} <= set(first.ids)
    assert [h.rank for h in result.hits] == [1, 2, 3, 4, 5]
    assert all(h.first_stage_score is not None and h.text for h in result.hits)
    assert np.all(np.diff([h.score for h in result.hits]) <= 0)
    expected = ce.score("why do cats purr", [corpus.get(d).full_text for d in first.ids])
    assert result.hits[0].score == pytest.approx(float(expected.max()), abs=1e-6)
    assert set(result.timings) == {"first_stage_s", "rerank_s"}
    plain = Pipeline(bm25, texts=lambda i: corpus.get(i).full_text, k=3).search("why do cats purr")
    assert [h.doc_id for h in plain.hits] == list(bm25.search("why do cats purr", 3).ids)
    with pytest.raises(ConfigError, match="k_retrieve"):
        Pipeline(bm25, texts={}, k_retrieve=5, k=10)


def test_hybrid_needs_two(sample_dir):
    with pytest.raises(ConfigError):
        HybridRetriever([BM25Retriever.build([Document("a", "text")])])


def test_group_losses_by_hand():
    import math

    import torch

    from twostage.reranker.training import group_loss

    s = torch.tensor([[2.0, 0.0, 1.0]])
    assert group_loss(s, "listwise").item() == pytest.approx(-2 + math.log(math.exp(2) + 1 + math.exp(1)), abs=1e-6)
    sig = lambda x: 1 / (1 + math.exp(-x))
    expected = -(math.log(sig(2.0)) + math.log(1 - sig(0.0)) + math.log(1 - sig(1.0))) / 3
    assert group_loss(s, "bce").item() == pytest.approx(expected, abs=1e-6)


def test_training_fits_the_training_queries(tmp_path, tiny_bert_dir, sample_dir):
    from twostage.indexer.beir import BeirDataset
    from twostage.reranker.training import RerankerConfig, groups_from_split, train_reranker

    ds = BeirDataset(sample_dir)
    config = RerankerConfig(epochs=4, groups_per_batch=8, negatives=3, lr=2e-3, max_length=64, mine_from=("bm25",),
                            bf16=False)
    groups = groups_from_split(ds, "train", config)
    assert len(groups) == sum(len(ds.split("train").qrels.relevant(q.id)) for q in ds.split("train").queries)

    def accuracy(model):  # how often the positive outscores every negative of its group
        return float(np.mean([np.argmax(model.score(g.anchor, [g.positive, *g.negatives])) == 0 for g in groups]))

    model = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    before = accuracy(model)
    result = train_reranker(model, groups, config, tmp_path / "ce", dev=accuracy)
    trained = CrossEncoder.load(tmp_path / "ce")
    assert trained.head_trained and accuracy(trained) == pytest.approx(result.best_dev)
    assert result.best_dev > before + 0.2, (before, result.best_dev)  # a fit on seen groups


def test_mixed_groups_titles_and_dense_mining(tiny_bert_dir, sample_dir):
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.errors import ConfigError as CE
    from twostage.reranker.training import RerankerConfig, groups_from_split, title_groups

    ds = BeirDataset(sample_dir)
    config = RerankerConfig(negatives=4, mine_from=("bm25", "dense"))
    with pytest.raises(CE, match="retriever-model"):
        groups_from_split(ds, "train", config)
    dense_scores = BM25Retriever.build(ds.corpus).scores  # any scorer stands in for the dense one
    groups = groups_from_split(ds, "train", config, scorers={"dense": lambda q: -dense_scores(q)})
    sp = ds.split("train")
    for g in groups:
        assert len(g.negatives) == 4 and len(set(g.negatives)) == 4 and g.positive not in g.negatives
    q0 = next(q for q in sp.queries if q.text == groups[0].anchor)
    assert not {ds.corpus.get(d).full_text for d in sp.qrels.relevant(q0.id)} & set(groups[0].negatives)
    titled = title_groups(ds.corpus, 30, RerankerConfig(title_negatives=2))
    assert len(titled) == 30 and all(len(g.negatives) == 2 and g.positive not in g.negatives for g in titled)
    by_title = {d.title: d for d in ds.corpus}
    assert all(by_title[g.anchor].text == g.positive for g in titled)
    with pytest.raises(CE, match="mine_from"):
        RerankerConfig(mine_from=("splade",))


def test_interpolation_by_hand():
    from twostage.reranker.interpolation import interpolate, minmax

    first, rerank = np.array([10.0, 8.0, 6.0]), np.array([0.1, 0.9, 0.5])
    np.testing.assert_allclose(minmax(first), [1, 0.5, 0])
    np.testing.assert_allclose(interpolate(first, rerank, 0.5), [0.5 * 0 + 0.5 * 1, 0.5 * 1 + 0.5 * 0.5, 0.5 * 0.5 + 0])
    np.testing.assert_allclose(interpolate(first, rerank, None), rerank)
    assert np.argmax(interpolate(first, rerank, 0.0)) == 0 and np.argmax(interpolate(first, rerank, 1.0)) == 1
    with pytest.raises(ConfigError):
        interpolate(first, rerank, 1.5)


def test_a_tokenizer_of_another_model_is_refused(tmp_path, tiny_bert_dir):
    import shutil

    from transformers import BertConfig, BertForSequenceClassification

    from twostage.retriever.biencoder import BiEncoder

    small = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=64, num_labels=1)
    BertForSequenceClassification(small).save_pretrained(tmp_path / "m", safe_serialization=True)
    for f in tiny_bert_dir.iterdir():  # the tiny BERT's tokenizer (1000+ tokens) next to a 64-token model
        if "token" in f.name or f.name == "vocab.txt":
            shutil.copy(f, tmp_path / "m" / f.name)
    with pytest.raises(ConfigError, match="tokenizer belongs to another model"):
        CrossEncoder.load(tmp_path / "m")
    with pytest.raises(ConfigError, match="tokenizer belongs to another model"):
        BiEncoder.load(tmp_path / "m")


def test_blend_choice_is_the_smallest_within_one_standard_error():
    """A best alpha ahead by less than the per-query noise gives way to the smallest alpha within one standard
    error of it; one ahead by a consistent margin is kept."""
    from twostage.reranker.interpolation import one_se_blend

    first, middle = (0.0, np.array([0.5, 0.5, 0.5, 0.5])), (0.5, np.array([0.6, 0.6, 0.6, 0.6]))
    assert one_se_blend([first, middle, (1.0, np.array([1.0, 0.2, 1.0, 0.3]))]) == 0.0  # best mean, but by noise
    assert one_se_blend([first, middle, (1.0, np.array([0.9, 0.9, 0.9, 0.91]))]) == 1.0  # best on every query
    assert one_se_blend([first, (0.5, np.array([0.6, 0.6, 0.6, 0.62])), (1.0, np.array([0.9, 0.2, 0.9, 0.3]))]) == 0.5


def test_blend_is_chosen_for_each_first_stage():
    """A reranker that is right over one first stage and wrong over another gets the smallest alpha that lets it fix
    the first and alpha 0 on the second; the overall choice is made on their mean."""
    from twostage.eval.metrics import ndcg10_by_query
    from twostage.indexer.records import Judgment, Qrels, Query, RankedList
    from twostage.reranker.interpolation import blend_for, select_interpolation

    docs = ["good", "bad1", "bad2"]

    class Fixed:  # a first stage returning the candidates in a fixed order
        def __init__(self, order):
            self.order = order

        def search(self, query, k):
            return RankedList(np.array(self.order[:k], dtype=object), np.array([3.0, 2.0, 1.0][:k], np.float32))

    class Oracle:  # scores "good" highest
        def score(self, query, texts):
            return np.array([1.0 if t == "good" else 0.0 for t in texts], np.float32)

    queries = [Query("q1", "anything")]
    qrels = Qrels([Judgment("q1", "good", 1)])
    texts = {d: d for d in docs}
    # over "low" the first stage ranks the relevant document last: the reranker fixes it from alpha 0.6 on (at 0.5
    # the two are tied and the first stage's order stays); over "top" the first stage is already right and the
    # oracle agrees: every alpha ties, and ties keep the first stage (alpha 0)
    choice = select_interpolation(Oracle(), {"low": Fixed(["bad1", "bad2", "good"]), "top": Fixed(docs)},
                                  queries, qrels, texts, 3, ndcg10_by_query)
    curves = {name: dict(curve) for name, _, curve in choice.by_first_stage}
    assert curves["low"][0.5] < curves["low"][0.6] == curves["low"][1.0] == 1.0
    assert set(curves["top"].values()) == {1.0}
    assert choice.alphas() == {"low": 0.6, "top": 0.0}
    assert dict(choice.dev_by_alpha)[0.0] == pytest.approx((curves["low"][0.0] + 1.0) / 2)

    class Wrong:  # scores "good" lowest: only alpha 0 keeps the right first stage right
        def score(self, query, texts):
            return np.array([0.0 if t == "good" else 1.0 for t in texts], np.float32)

    choice = select_interpolation(Wrong(), {"top": Fixed(docs)}, queries, qrels, texts, 3, ndcg10_by_query)
    assert choice.alphas() == {"top": 0.0} and choice.by_first_stage[0][2][-1][1] < 1.0

    class Model:
        interpolation, blends = 0.4, {"hybrid": 0.2}

    assert blend_for(Model(), "hybrid") == 0.2 and blend_for(Model(), "bm25") == 0.4
    assert blend_for(object(), "hybrid") is None


def test_per_first_stage_blends_are_saved_and_checked(tmp_path, tiny_bert_dir):
    import json

    from twostage.reranker.cross_encoder import CrossEncoder

    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained, ce.interpolation, ce.blends = True, 0.4, {"hybrid": 0.2, "bm25": 0.6}
    ce.save(tmp_path / "ce")
    back = CrossEncoder.load(tmp_path / "ce")
    assert (back.interpolation, back.blends) == (0.4, {"hybrid": 0.2, "bm25": 0.6})
    meta_file = tmp_path / "ce" / "twostage.json"
    meta = json.loads(meta_file.read_text())
    meta["settings"]["interpolation_by_first_stage"]["hybrid"] = 7
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"interpolation_by_first_stage\.hybrid must be a number in \[0, 1\]"):
        CrossEncoder.load(tmp_path / "ce")
    meta["settings"]["interpolation_by_first_stage"] = [0.2]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="interpolation_by_first_stage must be an object"):
        CrossEncoder.load(tmp_path / "ce")
    meta["settings"].pop("interpolation_by_first_stage")
    meta["settings"]["interpolation"] = "high"
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="interpolation must be a number"):
        CrossEncoder.load(tmp_path / "ce")
