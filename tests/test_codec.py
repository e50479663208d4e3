"""The one dataclass <-> JSON codec: round trips, defaults for missing keys, unknown keys named."""

from __future__ import annotations

import json

import pytest

from twostage.engine.settings import EngineSettings
from twostage.indexer.atomic import from_json_dict, to_json_dict
from twostage.indexer.errors import ConfigError
from twostage.retriever.analyzer import AnalyzerConfig
from twostage.retriever.bm25 import BM25Config


def test_round_trips_through_json_text():
    from twostage.engine.train_models import TrainSettings

    for record in (EngineSettings(rerank_depth=7, rerank_blend=None), BM25Config(k1=0.9, analyzer=AnalyzerConfig(
            stopwords=("the", "a"))), TrainSettings(dev_fraction=0.2)):
        data = json.loads(json.dumps(to_json_dict(record)))
        assert from_json_dict(type(record), data, "x") == record


def test_missing_keys_keep_defaults_and_nested_records_fill_in():
    bm25 = from_json_dict(BM25Config, {"b": 0.5, "analyzer": {"stemmer": None}}, "BM25 settings")
    assert bm25.b == 0.5 and bm25.k1 == BM25Config().k1
    assert bm25.analyzer == AnalyzerConfig(stemmer=None)


@pytest.mark.parametrize(("data", "message"), [
    ({"depht": 50}, "settings: unknown setting(s) depht; known: backend"),
    ({"rerank_depth": 0}, "settings: rerank_depth must be a positive integer"),
    ([1, 2], "settings: expected an object of settings, got list"),
])
def test_errors_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_json_dict(EngineSettings, data, "settings")


def test_nested_unknown_key_is_named_with_its_path():
    from twostage.engine.train_models import TrainSettings

    with pytest.raises(ConfigError, match=r"f.json.reranker: unknown setting\(s\) epocs"):
        from_json_dict(TrainSettings, {"reranker": {"epocs": 3}}, "f.json")
    with pytest.raises(ConfigError, match=r"BM25 settings.analyzer: unknown setting\(s\) stem"):
        from_json_dict(BM25Config, {"analyzer": {"stem": "english"}}, "BM25 settings")


def test_every_setting_is_in_one_group_by_concern():
    from twostage.engine import settings

    groups = (settings.INDEX_SHAPE, settings.SEARCH_POLICY, settings.MODEL_FACTS, settings.RUNTIME)
    names = [n for g in groups for n in g]
    assert sorted(names) == sorted(EngineSettings.__dataclass_fields__) and len(names) == len(set(names))
    # the dataclass reads in that order: one concern after another
    assert list(EngineSettings.__dataclass_fields__) == names
