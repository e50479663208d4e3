from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# ranx compiles its metrics with numba on first use, and its cache lives in site-packages: on a fresh install (CI)
# that was ~2 minutes of the 20 (tests/test_metrics.py 30 s -> 3 s here). The tests check what is computed, so they
# run ranx's Python as written (numba reads this when first imported; subprocesses inherit it). Benchmarks compile.
os.environ.setdefault("NUMBA_DISABLE_JIT", "1")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"


@pytest.fixture
def sample_dir() -> Path:
    return ROOT / "data" / "sample"


def shared_dataset(name: str) -> Path:
    path = SHARED / name
    if not (path / "corpus.jsonl").is_file():
        pytest.skip(f"{path} is not here (the shared data sits beside the repository)")
    return path


@pytest.fixture
def make_beir(tmp_path: Path):
    """Write a small BEIR directory: make_beir(corpus=[...], queries=[...], qrels={"test": [(q, d, g)]})."""

    def make(corpus: list[dict], queries: list[dict], qrels: dict[str, list[tuple[str, str, int]]], name: str = "toy") -> Path:
        root = tmp_path / name
        (root / "qrels").mkdir(parents=True)
        (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus), encoding="utf-8")
        (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
        for split, rows in qrels.items():
            lines = ["query-id\tcorpus-id\tscore"] + ["\t".join(map(str, r)) for r in rows]
            (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return root

    return make


@pytest.fixture
def toy(make_beir):
    corpus = [
        {"_id": "d1", "title": "Cats", "text": "Cats purr when they are content."},
        {"_id": "d2", "title": "Dogs", "text": "Dogs pant to cool down on hot days."},
        {"_id": "d3", "title": "Rain", "text": "Rain forms when water vapour condenses into droplets."},
        {"_id": "d4", "title": "Snow", "text": "Snowflakes are ice crystals with six arms."},
    ]
    queries = [{"_id": "q1", "text": "why do cats purr"}, {"_id": "q2", "text": "how does rain form"},
               {"_id": "q3", "text": "dogs panting heat"}]
    return make_beir(corpus, queries, {"test": [("q1", "d1", 1), ("q2", "d3", 2), ("q2", "d4", 1)],
                                       "train": [("q3", "d2", 1)]})


def build_tiny_bert(path: Path, seed: int = 0) -> Path:
    """A 2-layer, 32-dim random BERT with a word-level vocabulary from the sample corpus, built offline."""
    import re

    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = set()
    for line in (ROOT / "data" / "sample" / "corpus.jsonl").read_text().splitlines():
        words.update(re.findall(r"[a-z]+", line.lower()))
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars), *sorted(words)]
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(dict.fromkeys(vocab))}, do_lower_case=True)
    assert len(tokenizer) > 1000, "the tokenizer must hold the whole word list"
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_bert_dir):
    """A tiny bi-encoder and a tiny cross-encoder (random weights, head marked trained)."""
    from twostage.reranker.cross_encoder import CrossEncoder

    root = tmp_path_factory.mktemp("models")
    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True  # and, as training records it, the blend "chosen on dev": 0.5 (twostage.engine.knobs)
    ce.save(root / "ce", training={"interpolation": {"alpha": 0.5, "dev_by_alpha": [], "by_first_stage": []}})
    return tiny_bert_dir, root / "ce"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Tests never reach a hub; model names resolve from local directories or the wheel cache only."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
