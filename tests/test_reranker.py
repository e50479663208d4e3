import numpy as np
import pytest

from twostage.engine.fusion import rrf
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import RankedList
from twostage.reranker.cross_encoder import CrossEncoder, UntrainedHeadError
from twostage.retriever.bm25 import BM25Retriever

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


def test_rerank_lists_reorders_the_head_and_keeps_the_rest(trained_dir, sample_dir):
    from twostage.engine.fusion import rerank_lists
    from twostage.indexer.corpus import load_corpus

    corpus = load_corpus(sample_dir)
    ce = CrossEncoder.load(trained_dir)
    query = "why do cats purr"
    ids = [d.id for d in corpus][:30]
    first = RankedList(np.array(ids, dtype=object), np.linspace(3.0, 1.0, 30).astype(np.float32))
    out = rerank_lists(ce, [query], [first], lambda i: corpus.get(i).full_text, k=25, rerank_depth=10, blend=None)[0]
    assert set(out.ranked.ids[:10]) == set(first.ids[:10]) and list(out.ranked.ids[10:]) == list(first.ids[10:25])
    expected = ce.score(query, [corpus.get(d).full_text for d in first.ids[:10]])
    assert out.ranked.scores[0] == pytest.approx(float(expected.max()), abs=1e-6)
    assert np.all(np.diff(out.ranked.scores) <= 0) and len(out.rerank_scores) == 10
    kept = rerank_lists(ce, [query], [first], lambda i: corpus.get(i).full_text, k=5, rerank_depth=10, blend=0.0)[0]
    assert list(kept.ranked.ids) == list(first.ids[:5]) and kept.rerank_scores == {}  # blend 0: nothing scored


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
    from twostage.engine.fusion import interpolate, minmax

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
    from twostage.engine.fusion import one_se_blend

    first, middle = (0.0, np.array([0.5, 0.5, 0.5, 0.5])), (0.5, np.array([0.6, 0.6, 0.6, 0.6]))
    assert one_se_blend([first, middle, (1.0, np.array([1.0, 0.2, 1.0, 0.3]))]) == 0.0  # best mean, but by noise
    assert one_se_blend([first, middle, (1.0, np.array([0.9, 0.9, 0.9, 0.91]))]) == 1.0  # best on every query
    assert one_se_blend([first, (0.5, np.array([0.6, 0.6, 0.6, 0.62])), (1.0, np.array([0.9, 0.2, 0.9, 0.3]))]) == 0.5


def test_gated_best_blend_keeps_the_best_only_when_it_beats_the_first_stage():
    """The gated rule keeps the best weight (not the smallest near it) when its gain over the first stage alone is
    beyond one standard error, and switches the stage off when the gain is noise."""
    from twostage.engine.fusion import BLEND_RULES, gated_best_blend, maxsim_rule, one_se_blend

    first, middle = (0.0, np.array([0.5, 0.5, 0.5, 0.5])), (0.5, np.array([0.6, 0.6, 0.6, 0.6]))
    assert gated_best_blend([(1.0, np.array([0.7, 0.7, 0.7, 0.71])), middle, first]) == 1.0  # order does not matter
    assert gated_best_blend([first, middle, (1.0, np.array([1.0, 0.2, 1.0, 0.3]))]) == 0.5  # best mean, noisy: next
    assert gated_best_blend([first, (0.5, np.array([0.9, 0.1, 0.9, 0.1]))]) == 0.0  # a noisy gain: off
    assert gated_best_blend([first, (0.5, first[1].copy())]) == 0.0  # a tie: the first stage alone
    assert set(BLEND_RULES) == {"one_se", "gated_best"}
    rising = [first, (0.5, np.array([0.7, 0.6, 0.7, 0.6])), (1.0, np.array([0.9, 0.5, 0.9, 0.5]))]
    assert one_se_blend(rising) == 0.5 and maxsim_rule(rising) == 1.0  # MaxSim's weight: the gated rule's


def test_maxsim_weight_for_another_corpus_is_one_se_and_never_above_the_dev_choice_nor_half():
    """#83: MaxSim's weight for a corpus its dev queries did not search is the one-SE weight of the same curve,
    capped by the gated rule's (off where that is off: a noisy best gives 0.0, not one-SE's weight) and by 0.5, where
    MaxSim weighs as much as the first stage (a steep curve's one-SE weight, 0.9 here, is not served elsewhere)."""
    from twostage.engine.fusion import ELSEWHERE_MAX, maxsim_elsewhere, maxsim_rule, one_se_blend

    assert ELSEWHERE_MAX == 0.5
    first = (0.0, np.array([0.5, 0.5, 0.5, 0.5]))
    rising = [first, (0.3, np.array([0.7, 0.6, 0.7, 0.6])), (1.0, np.array([0.9, 0.5, 0.9, 0.5]))]
    assert maxsim_elsewhere(rising) == 0.3 < maxsim_rule(rising)
    steady = [first, (0.5, np.array([0.6, 0.6, 0.6, 0.6])), (1.0, np.array([0.7, 0.7, 0.7, 0.71]))]
    assert maxsim_rule(steady) == 1.0 and maxsim_elsewhere(steady) == 0.5  # better on every query, still level
    steep = [first, (0.5, np.array([0.6, 0.6, 0.6, 0.6])), (0.9, np.array([0.78, 0.81, 0.78, 0.81])),
             (1.0, np.array([0.8, 0.8, 0.8, 0.8]))]
    assert one_se_blend(steep) == 0.9 and maxsim_elsewhere(steep) == 0.5
    noisy = [first, (0.5, np.array([0.9, 0.1, 0.9, 0.1])), (1.0, np.array([0.95, 0.1, 0.95, 0.1]))]
    assert one_se_blend(noisy) == 0.0 and maxsim_rule(noisy) == 0.0 and maxsim_elsewhere(noisy) == 0.0
    best_noise = [first, (0.5, np.array([0.5, 0.5, 0.5, 0.51])), (1.0, np.array([0.9, 0.2, 0.9, 0.3]))]
    assert one_se_blend(best_noise) == 0.0 and maxsim_elsewhere(best_noise) == 0.0


def test_maxsim_depth_is_the_engines_unless_another_scores_higher_at_its_own_weight():
    """#83: MaxSim's depth is chosen on dev with its weight: each depth's curve gives its weight by the gated rule,
    and a depth other than the first (the engine's) is kept only where its dev mean at that weight is higher; a tie,
    or a gain the gate calls noise, keeps the first."""
    from twostage.engine.fusion import maxsim_depth_rule

    first = (0.0, np.array([0.5, 0.5, 0.5, 0.5]))
    shallow = [first, (0.5, np.array([0.6, 0.6, 0.6, 0.6])), (1.0, np.array([0.55, 0.55, 0.55, 0.56]))]
    deeper = [first, (0.5, np.array([0.6, 0.6, 0.6, 0.6])), (1.0, np.array([0.65, 0.65, 0.65, 0.66]))]
    assert maxsim_depth_rule([(50, shallow), (100, deeper)]) == 100
    assert maxsim_depth_rule([(50, deeper), (100, shallow)]) == 50
    assert maxsim_depth_rule([(50, shallow), (100, shallow)]) == 50  # a tie: the engine's (first) depth
    noisy = [first, (0.5, np.array([0.95, 0.1, 0.95, 0.1]))]  # the best mean at 100, but off by the gate
    assert maxsim_depth_rule([(50, shallow), (100, noisy)]) == 50
    with pytest.raises(ValueError):
        maxsim_depth_rule([])


def test_search_policy_is_the_engines_not_the_models(tmp_path, tiny_bert_dir, sample_dir):
    """#64: a saved cross-encoder's settings hold no search policy (blend, calibration); what training chose on dev is
    its training record, which an engine built with ``rerank_blend="auto"`` writes into its own manifest as numbers.
    A model saved before (the choice in its settings) gives the same engine, and an engine built before (its manifest
    still saying "auto") answers exactly as one with the numbers: ids and scores. Bad values are one line naming the
    key."""
    import json

    from twostage.engine.knobs import dev_choice
    from twostage.engine.search_engine import SearchEngine
    from twostage.engine.settings import FIRST_STAGES
    from twostage.reranker.cross_encoder import CrossEncoder

    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True
    record = {"interpolation": {"alpha": 0.4, "dev_by_alpha": [[0.4, 0.5]],
                                "by_first_stage": [["hybrid", 0.2, []], ["bm25", 0.6, []]]},
              "calibration": {"a": 1.5, "b": -0.5, "pairs": 10, "positives": 3, "log_loss": 0.4}}
    ce.save(tmp_path / "new", training=record)
    meta = json.loads((tmp_path / "new" / "twostage.json").read_text())
    assert set(meta["settings"]) == {"max_length", "head_trained"}
    choice = dev_choice(tmp_path / "new")
    assert (choice.blend, dict(choice.by_first_stage), choice.calibration) == (0.4, {"hybrid": 0.2, "bm25": 0.6},
                                                                               (1.5, -0.5))
    assert choice.blend_for("dense") == 0.4 and choice.blend_for("hybrid") == 0.2
    ce.save(tmp_path / "old")  # a model saved before this step: the choice in its settings
    old_meta = json.loads((tmp_path / "old" / "twostage.json").read_text())
    old_meta["settings"].update(interpolation=0.4, interpolation_by_first_stage={"hybrid": 0.2, "bm25": 0.6},
                                calibration=[1.5, -0.5])
    (tmp_path / "old" / "twostage.json").write_text(json.dumps(old_meta))
    assert dev_choice(tmp_path / "old") == choice
    engines = [SearchEngine.build(sample_dir, tmp_path / f"e-{m}", retriever=str(tiny_bert_dir), reranker=str(tmp_path / m),
                                  backend="flat") for m in ("new", "old")]
    for e in engines:
        assert e.settings.rerank_blend == 0.2 and e.settings.rerank_calibration == (1.5, -0.5)
        assert e.settings.rerank_blend_by_first_stage == {fs: choice.blend_for(fs) for fs in FIRST_STAGES}
    manifest = engines[1].version_dir / "manifest.json"  # an engine from before blends were resolved: "auto"
    data = json.loads(manifest.read_text())
    data["settings"]["rerank_blend"] = "auto"
    del data["settings"]["rerank_blend_by_first_stage"]
    manifest.write_text(json.dumps(data))
    auto = SearchEngine.load(engines[1].root, verify=False)
    assert auto.settings.rerank_blend == "auto"
    queries = [json.loads(line)["text"] for line in (sample_dir / "queries.jsonl").read_text().splitlines()[:8]]
    for q in queries:
        for fs in ("hybrid", "bm25"):
            a, b = engines[0].search(q, k=10, first_stage=fs), auto.search(q, k=10, first_stage=fs)
            assert a.ids == b.ids and np.allclose([h.score for h in a.hits], [h.score for h in b.hits], atol=1e-6)
    for e in (*engines, auto):
        e.close()
    for key, value, message in (("interpolation_by_first_stage", {"hybrid": 7}, r"interpolation_by_first_stage\.hybrid "
                                 r"must be a number in \[0, 1\]"),
                                ("interpolation_by_first_stage", [0.2], "must be an object"),
                                ("interpolation", "high", "interpolation must be a number"),
                                ("calibration", [1, "x"], "calibration must be two finite numbers")):
        bad = json.loads(json.dumps(old_meta))
        bad["settings"][key] = value
        (tmp_path / "old" / "twostage.json").write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=message):
            dev_choice(tmp_path / "old")

def test_a_reranker_is_served_off_over_a_corpus_its_dev_queries_did_not_search(tmp_path, tiny_bert_dir, sample_dir):
    """#83: a reranker whose training record names the corpus its dev queries searched serves its dev choice over
    that corpus and weight 0.0 (off) over another one: built, configured again with "auto", and in the bench's words;
    a search may still ask for it. A bad record of that corpus is one line naming the key."""
    import json

    from twostage.engine.knobs import dev_choice, reranker_elsewhere, second_stage
    from twostage.engine.search_engine import SearchEngine
    from twostage.eval.workflows import record_reranker_home, reranker_choice
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.corpus import load_corpus
    from twostage.indexer.corpus_sketch import corpus_sketch

    rows = [json.loads(line) for line in (sample_dir / "corpus.jsonl").read_text().splitlines()]
    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True
    curve = [[0.0, 0.5], [0.4, 0.6]]
    record = {"interpolation": {"alpha": 0.4, "dev_by_alpha": curve, "by_first_stage": [["hybrid", 0.4, curve]]},
              "dev_queries": ["q1", "q2"]}
    ce.save(tmp_path / "ce", training=record)  # as trained before the record named its corpus: served everywhere
    assert dev_choice(tmp_path / "ce").home == () and reranker_elsewhere(tmp_path / "ce", ["x-1", "x-2"]) is None
    record_reranker_home(tmp_path / "ce", BeirDataset(sample_dir).corpus)  # as training now records it
    assert dev_choice(tmp_path / "ce").home == corpus_sketch(r["_id"] for r in rows)
    assert dev_choice(tmp_path / "ce").home_documents == len(rows)
    ce.save(tmp_path / "no-dev")
    with pytest.raises(ConfigError, match="no blend chosen on dev"):
        record_reranker_home(tmp_path / "no-dev", BeirDataset(sample_dir).corpus)
    other = tmp_path / "other.jsonl"  # the same texts under other ids: another corpus
    other.write_text("".join(json.dumps({**r, "_id": f"x-{r['_id']}"}) + "\n" for r in rows))
    home = SearchEngine.build(sample_dir, tmp_path / "home", retriever=str(tiny_bert_dir), reranker=str(tmp_path / "ce"),
                              backend="flat")
    away = SearchEngine.build(other, tmp_path / "away", retriever=str(tiny_bert_dir), reranker=str(tmp_path / "ce"),
                              backend="flat")
    assert home.settings.rerank_blend == 0.4 and "weight 0.4 against hybrid" in second_stage(home.settings, "ce",
                                                                                            home.reranker)
    assert away.settings.rerank_blend == 0.0 and set(away.settings.rerank_blend_by_first_stage.values()) == {0.0}
    said = second_stage(away.settings, "ce", away.reranker)
    assert "over another corpus a reranker is served off" in said and "--rerank-blend 0.4 forces it on" in said
    query = rows[0]["title"]
    plain, asked = away.search(query, k=5), away.search(query, k=5, rerank_blend=0.4)
    assert [h.score for h in plain.hits] != pytest.approx([h.score for h in asked.hits])  # reranked when asked
    again = away.configure(rerank_blend="auto")
    assert again.settings.rerank_blend == 0.0  # still not its dev corpus
    assert "Here: weight 0 (off): this corpus shares 0% of the" in reranker_choice(tmp_path / "ce",
                                                                                   corpus=load_corpus(other)).line
    assert "Here:" not in reranker_choice(tmp_path / "ce", corpus=BeirDataset(sample_dir).corpus).line
    for e in (home, away, again):
        e.close()
    meta = json.loads((tmp_path / "ce" / "twostage.json").read_text())
    meta["training"]["home"] = {"documents": 3, "sketch": ["not-a-hash"]}
    (tmp_path / "ce" / "twostage.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"training\.home must hold the dev corpus's documents"):
        dev_choice(tmp_path / "ce")


def test_rerank_lists_scores_a_document_read_by_several_texts_by_the_best():
    """A reader may give several texts for a document (a long one by each first stage's best passage): the document
    scores the highest of them, with a CrossEncoder-like ``predict`` and with a plain ``score``."""
    import numpy as np

    from twostage.engine.fusion import rerank_lists
    from twostage.indexer.errors import ConfigError
    from twostage.indexer.records import RankedList

    class ByLength:
        def score(self, query, texts):
            return [float(len(t)) for t in texts]

    class Predicting:
        def predict(self, pairs, batch_size=32):
            return np.array([float(len(t)) for _, t in pairs])

    texts = {"a": ["xx", "xxxxxxxx"], "b": "xxxxx", "c": ("x",)}
    first = RankedList(np.array(["c", "b", "a"], dtype=object), np.array([3.0, 2.0, 1.0], dtype=np.float32))
    for reranker in (ByLength(), Predicting()):
        out = rerank_lists(reranker, ["q", "q2"], [first, first], texts.__getitem__, k=3, rerank_depth=3, blend=None)
        for r in out:
            assert list(r.ranked.ids) == ["a", "b", "c"] and dict(r.rerank_scores) == {"a": 8.0, "b": 5.0, "c": 1.0}
    with pytest.raises(ConfigError, match="no text"):
        rerank_lists(ByLength(), ["q"], [first], {"a": [], "b": "x", "c": "y"}.__getitem__, k=3, rerank_depth=3,
                     blend=None)
