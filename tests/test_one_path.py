"""One path from training to serving: the reranker's epoch and blend are chosen through the engine's own search,
the choice is written into the engine's manifest as numbers, and the engine then serves exactly what was chosen."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from twostage.engine.search_engine import SearchEngine
from twostage.engine.settings import EngineSettings
from twostage.engine.training import select_blend
from twostage.eval.metrics import ndcg10_by_query
from twostage.eval.workflows import train
from twostage.indexer.beir import BeirDataset
from twostage.indexer.corpus_sketch import corpus_sketch
from twostage.indexer.errors import ConfigError

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


@pytest.fixture(scope="module")
def engine(tiny_bert_dir, tmp_path_factory):
    built = SearchEngine.build(SAMPLE, tmp_path_factory.mktemp("one-path") / "e", retriever=tiny_bert_dir,
                               settings=EngineSettings(precision="fp32"))
    yield built
    built.close()


class Oracle:
    """A deterministic reranker: scores a pair by how many of the query's words its text holds."""

    def predict(self, pairs, batch_size=32):
        return np.array([len(set(q.lower().split()) & set(t.lower().split())) for q, t in pairs], np.float32)


def dev_split(sample_dir):
    ds = BeirDataset(sample_dir)
    sp = ds.split("train")
    queries = list(sp.queries)[:12]
    return queries, sp.qrels.subset(q.id for q in queries)


def served(engine, reranker, queries, qrels, first_stage, depth, blend=None):
    """nDCG@10 of the engine's answers (a view with ``reranker``, or the engine's own when None)."""
    view = engine if reranker is None else engine.with_reranker(reranker)
    view = view.with_settings(first_stage=first_stage, rerank_depth=depth,
                              **({} if reranker is None else {"rerank_blend": blend}))
    lists = view.as_retriever().search_batch([q.text for q in queries], depth)
    return float(np.mean(ndcg10_by_query(qrels, dict(zip([q.id for q in queries], lists)))))


def test_the_chosen_blend_served_by_the_engine_scores_what_the_selection_saw(engine, sample_dir):
    queries, qrels = dev_split(sample_dir)
    choice = select_blend(engine, Oracle(), queries, qrels, 20, ndcg10_by_query)
    assert {name for name, _, _ in choice.by_first_stage} == {"hybrid", "dense", "bm25"}
    for first_stage, alpha, curve in choice.by_first_stage:
        for a, value in curve:  # every point of every curve is the engine's own answer at that blend
            assert served(engine, Oracle(), queries, qrels, first_stage, 20, a) == value
        assert alpha in dict(curve)
    assert engine.settings.rerank_blend == "auto" and not engine.read_only  # views left the engine as it was


def test_choosing_the_blend_shows_one_progress_bar_when_asked(engine, sample_dir, capsys):
    """Every weight searches every dev query again (minutes on a CPU): the choice says how far it is."""
    queries, qrels = dev_split(sample_dir)
    quiet = select_blend(engine, Oracle(), queries, qrels, 20, ndcg10_by_query, ("hybrid",), (0.0, 0.5, 1.0))
    assert "choose blend" not in capsys.readouterr().err
    shown = select_blend(engine, Oracle(), queries, qrels, 20, ndcg10_by_query, ("hybrid",), (0.0, 0.5, 1.0),
                         show_progress=True)
    err = capsys.readouterr().err
    assert "choose blend" in err and "3/3" in err
    assert shown == quiet  # the bar changes nothing chosen


def test_trained_reranker_blend_is_resolved_into_the_manifest_and_served(sample_dir, tiny_bert_dir, tmp_path):
    from twostage.reranker.training import RerankerConfig
    from twostage.retriever.mining import MiningConfig

    config = RerankerConfig(epochs=1, lr=1e-3, max_length=48, negatives=2, title_groups=10, bf16=False,
                            mining=MiningConfig(num_negatives=2, depth=20))
    result = train(config, sample_dir, "train", tmp_path / "ce", base=str(tiny_bert_dir), dev_fraction=0.2,
                   retriever=tiny_bert_dir, settings=EngineSettings(precision="fp32"))  # nDCG@10 by default
    choice = result.training["interpolation"]
    chosen = {name: alpha for name, alpha, _ in choice["by_first_stage"]}
    home = BeirDataset(sample_dir).corpus  # the corpus the dev queries searched, kept with the choice
    assert result.training["home"] == {"documents": len(home), "sketch": list(corpus_sketch(home.ids))}
    built = SearchEngine.build(sample_dir, tmp_path / "e", retriever=tiny_bert_dir, reranker=tmp_path / "ce",
                               settings=EngineSettings(precision="fp32"))
    saved = json.loads((built.version_dir / "manifest.json").read_text())
    assert saved["format_version"] == 2
    assert saved["settings"]["rerank_blend"] == chosen["hybrid"]  # numbers, not "auto"
    assert saved["settings"]["rerank_blend_by_first_stage"] == chosen
    ds = BeirDataset(sample_dir)
    sp = ds.split("train")
    dev = [q for q in sp.queries if q.id in set(result.training["dev_queries"])]
    qrels = sp.qrels.subset(q.id for q in dev)
    for name, alpha, curve in choice["by_first_stage"]:
        assert served(built, None, dev, qrels, name, 20) == pytest.approx(dict(map(tuple, curve))[alpha], abs=1e-12)
    built.close()


def test_views_are_read_only_and_share_the_models(engine):
    view = engine.with_settings(first_stage="bm25", rerank_depth=5)
    assert view.settings.first_stage == "bm25" and engine.settings.first_stage == "hybrid"
    assert view.shares_models(engine) and view.version == engine.version
    with pytest.raises(ConfigError, match="read-only view"):
        view.configure(first_stage="dense")
    with pytest.raises(ConfigError, match="read-only view"):
        view.delete([engine.document_ids()[0]])
    view.close()  # releases nothing: the engine still searches
    assert engine.search("cats", 3).hits


def test_old_names_still_work_with_a_warning(engine):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = engine.search("why do cats purr", 5, k_retrieve=7, depth=50)
    new = engine.search("why do cats purr", 5, rerank_depth=7, first_stage_depth=50)
    assert [h.doc_id for h in old.hits] == [h.doc_id for h in new.hits]
    assert any(issubclass(w.category, DeprecationWarning) and "rerank_depth" in str(w.message) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        view = engine.with_settings(k_retrieve=9, interpolation=0.3)
    assert (view.settings.rerank_depth, view.settings.rerank_blend) == (9, 0.3)
    with pytest.raises(ConfigError, match="rerank_depth only"):
        engine.with_settings(k_retrieve=9, rerank_depth=9)
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.server import create_app

    client = TestClient(create_app(engine))  # HTTP's old field names: the same one rename table
    body = {"query": "why do cats purr", "k": 5}
    got = client.post("/search", json={**body, "k_retrieve": 7, "depth": 50}).json()
    assert [h["id"] for h in got["hits"]] == [h.doc_id for h in new.hits]
    both = client.post("/search", json={**body, "k_retrieve": 7, "rerank_depth": 7})
    assert both.status_code == 400 and "rerank_depth only" in both.json()["error"]


def test_training_calls_the_rerank_depth_by_its_one_name(tmp_path, capsys):
    """TrainSettings.rerank_depth (was dev_depth): config.json files with the old name load, --dev-depth still works."""
    import argparse

    from twostage.app import cli_train
    from twostage.engine.train_models import TrainSettings, load_settings

    (tmp_path / "old.json").write_text(json.dumps({"dev_depth": 7, "seed": 3}))
    assert load_settings(tmp_path / "old.json") == TrainSettings(rerank_depth=7, seed=3)
    parser = argparse.ArgumentParser()
    cli_train.add_commands(parser.add_subparsers())
    args = parser.parse_args(["train-reranker", "--data", "d", "--out", "o", "--dev-depth", "9"])
    assert cli_train.settings_from_flags(args, cli_train.RERANKER).rerank_depth == 9
    assert "--dev-depth" in capsys.readouterr().err


def test_a_format_1_engine_opens_and_answers_identically(engine, tmp_path):
    """The manifest of format 1 (written here from the current one: old names, "auto" blend) is read with its old
    names mapped; the engine answers as the format-2 engine with the same settings does."""
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(engine.root, copy, ignore=shutil.ignore_patterns("LOCK"))
    version = copy / engine.version
    manifest = json.loads((version / "manifest.json").read_text())
    settings = dict(manifest["settings"])
    settings.pop("rerank_blend_by_first_stage")
    names = {"first_stage_depth": "depth", "rerank_depth": "k_retrieve", "rerank_blend": "interpolation"}
    old = {names.get(k, k): v for k, v in settings.items()}
    old["k_retrieve"], old["depth"] = 7, 60
    (version / "manifest.json").write_text(json.dumps({**manifest, "format_version": 1, "settings": old}))
    opened = SearchEngine.load(copy)
    assert (opened.settings.rerank_depth, opened.settings.first_stage_depth, opened.settings.rerank_blend) == \
        (7, 60, "auto")
    same = engine.with_settings(rerank_depth=7, first_stage_depth=60)
    for q in ("why do cats purr", "rain", "snow and ice"):
        a, b = opened.search(q, 10), same.search(q, 10)
        assert [(h.doc_id, h.score) for h in a.hits] == [(h.doc_id, h.score) for h in b.hits]
    opened.close()


def test_every_old_name_comes_from_the_one_rename_table(capsys):
    """CLI flags, HTTP fields, search knobs and rerank_run map exactly the old names of RENAMES, each to its new
    name: a rename added to the table reaches them all, and none is written by hand beside it."""
    import argparse

    from twostage.app import cli_engine, cli_eval, cli_train
    from twostage.app.server import SearchOptions
    from twostage.engine.settings import RENAMES, renames

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    for module in (cli_engine, cli_eval, cli_train):
        module.add_commands(sub)
    hidden = {name: {a.option_strings[0]: a.new for a in p._actions if isinstance(a, cli_engine._Renamed)}
              for name, p in sub.choices.items()}
    places = {"build": "settings", "search": "settings", "rerank": "rerank", "bench": "bench",
              "train-reranker": "train"}
    for command, place in places.items():
        flag = {"--" + o.replace("_", "-"): "--" + n.replace("_", "-") for o, n in renames(place).items()}
        assert hidden[command] == flag and flag, (command, hidden[command], flag)
        assert all(n in sub.choices[command]._option_string_actions for n in flag.values()), command
    assert not any(hidden[c] for c in hidden if c not in places), {c: hidden[c] for c in hidden if c not in places}
    deprecated = {n for n, f in SearchOptions.model_fields.items() if (f.json_schema_extra or {}).get("deprecated")}
    assert deprecated == set(renames("settings"))
    assert {p for _, _, places in RENAMES for p in places} == set(places.values())
    args = parser.parse_args(["rerank", "--run", "r", "--data", "d", "--reranker", "m", "--out", "o", "--depth", "7"])
    assert args.rerank_depth == 7 and "--depth is now --rerank-depth" in capsys.readouterr().err
    args = parser.parse_args(["search", "e", "q", "--depth", "7", "--interpolation", "0.2"])
    assert (args.first_stage_depth, args.rerank_blend) == (7, "0.2")
