"""LangChain, LlamaIndex and PyTerrier, each run for real through an engine built on the bundled sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from twostage import SearchEngine
from twostage.eval.metrics import evaluate
from twostage.indexer.beir import BeirDataset
from twostage.indexer.records import RankedList

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"


@pytest.fixture(scope="module")
def engine(tmp_path_factory, models):
    retriever, reranker = models
    return SearchEngine.build(SAMPLE, tmp_path_factory.mktemp("integrations") / "eng", retriever=retriever,
                              reranker=reranker)


@pytest.fixture(scope="module")
def split():
    return BeirDataset(SAMPLE).split("test")


def reranked_ids(engine, query, texts_and_ids, top_n):
    scores = engine.reranker.predict([(query, t) for t, _ in texts_and_ids])
    return [texts_and_ids[i][1] for i in np.argsort(-scores, kind="stable")[:top_n]]


def test_langchain_chain(engine, split):
    pytest.importorskip("langchain_core")
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough

    from twostage.app.langchain_adapter import TwostageReranker, TwostageRetriever

    retriever = TwostageRetriever(engine=engine, k=8)
    compressor = TwostageReranker.from_engine(engine, top_n=3)
    ids_chain = retriever | RunnableLambda(lambda docs: [d.metadata["id"] for d in docs])
    rerank_chain = {"docs": retriever, "query": RunnablePassthrough()} | RunnableLambda(
        lambda x: compressor.compress_documents(x["docs"], x["query"]))
    for q in split.queries[:5]:
        expected = engine.search(q.text, k=8)
        assert ids_chain.invoke(q.text) == [h.id for h in expected.hits]
        docs = retriever.invoke(q.text)
        assert docs[0].page_content == expected.hits[0].text and docs[0].id == expected.hits[0].id
        assert docs[0].metadata["stage_scores"] == dict(expected.hits[0].stage_scores)
        kept = rerank_chain.invoke(q.text)
        assert [d.id for d in kept] == reranked_ids(engine, q.text, [(h.text, h.id) for h in expected.hits], 3)
        assert [d.metadata["rerank_score"] for d in kept] == sorted((d.metadata["rerank_score"] for d in kept),
                                                                    reverse=True)
    mmr = TwostageRetriever(engine=engine, k=5, search_type="mmr", lambda_mult=0.6, fetch_k=40)
    q = split.queries[1].text
    assert [d.id for d in mmr.invoke(q)] == [h.id for h in engine.search(q, 5, diversity=0.4,
                                                                          first_stage_depth=40).hits]
    default_mmr = TwostageRetriever(engine=engine, k=5, search_type="mmr")
    assert [d.id for d in default_mmr.invoke(q)] == [h.id for h in engine.search(q, 5, diversity=True).hits]
    filtered = TwostageRetriever(engine=engine, k=3, search_options={"first_stage": "bm25", "rerank": False})
    q = split.queries[0].text
    assert [d.id for d in filtered.invoke(q)] == [h.id for h in engine.search(q, 3, first_stage="bm25",
                                                                               rerank=False).hits]


def test_llamaindex_query_engine(engine, split, monkeypatch):
    pytest.importorskip("llama_index.core")
    from llama_index.core import Settings
    from llama_index.core.llms.mock import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine

    from twostage.app.llamaindex_adapter import TwostageLlamaRetriever, TwostageNodeReranker

    monkeypatch.setattr(Settings, "_llm", MockLLM())  # no answer is written ("no_text"); never reach a hub's LLM
    retriever = TwostageLlamaRetriever(engine, k=8)
    query_engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM(), response_mode="no_text",
                                                  node_postprocessors=[TwostageNodeReranker.from_engine(engine, 3)])
    for q in split.queries[:5]:
        expected = engine.search(q.text, k=8)
        nodes = retriever.retrieve(q.text)
        assert [n.node.node_id for n in nodes] == [h.id for h in expected.hits]
        assert [n.score for n in nodes] == pytest.approx([h.score for h in expected.hits])
        response = query_engine.query(q.text)
        assert [n.node.node_id for n in response.source_nodes] == reranked_ids(
            engine, q.text, [(h.text, h.id) for h in expected.hits], 3)
    mmr = TwostageLlamaRetriever(engine, k=5, vector_store_query_mode="mmr", mmr_threshold=0.7)
    q = split.queries[2].text
    assert [n.node.node_id for n in mmr.retrieve(q)] == [h.id for h in engine.search(q, 5, diversity=0.3).hits]


def test_pyterrier_experiment(engine, split):
    pt = pytest.importorskip("pyterrier")
    from twostage.app.pyterrier_adapter import TwostageRerank, TwostageRetrieve

    topics = pd.DataFrame({"qid": [q.id for q in split.queries], "query": [q.text for q in split.queries]})
    qrels = pd.DataFrame([(j.query_id, j.doc_id, j.grade) for j in split.qrels], columns=["qid", "docno", "label"])
    retrieve = TwostageRetrieve(engine, k=20)
    bm25_then_ours = TwostageRetrieve(engine, k=20, first_stage="bm25", rerank=False) >> TwostageRerank(engine)
    frame = retrieve.transform(topics)
    for q in split.queries:
        assert frame[frame.qid == q.id].docno.tolist() == [h.id for h in engine.search(q.text, k=20).hits]
    # both evaluators read the run checked above in its own order: its scores replaced by -rank, as the tiny random
    # models can tie two scores exactly, which trec_eval breaks by docno and ranx by its own rule
    frame = frame.assign(score=-frame["rank"].astype(np.float64))
    table = pt.Experiment([frame, bm25_then_ours], topics, qrels, eval_metrics=["ndcg_cut_10", "recall_20"],
                          names=["twostage", "bm25>>rerank"])
    ours = {qid: RankedList(np.array(rows.docno.tolist(), dtype=object), rows.score.to_numpy(dtype=np.float64))
            for qid, rows in frame.groupby("qid")}
    means = evaluate(split.qrels, ours, ["ndcg@10", "recall@20"]).mean()
    row = table.set_index("name").loc["twostage"]
    assert row["ndcg_cut_10"] == pytest.approx(means["ndcg@10"], abs=1e-9)
    assert row["recall_20"] == pytest.approx(means["recall@20"], abs=1e-9)
    reranked = bm25_then_ours.transform(topics[:1])
    q = split.queries[0]
    bm25_hits = engine.search(q.text, k=20, first_stage="bm25", rerank=False).hits
    full = {d.id: d.full_text for d in engine.documents([h.id for h in bm25_hits])}  # title in front, as the engine
    assert reranked.docno.tolist() == reranked_ids(engine, q.text, [(full[h.id], h.id) for h in bm25_hits], 20)
    assert reranked["rank"].tolist() == list(range(len(reranked)))


def test_adapters_name_what_is_missing(engine):
    pytest.importorskip("pyterrier")
    from twostage.app.pyterrier_adapter import TwostageRerank
    from twostage.indexer.errors import ConfigError

    with pytest.raises(ConfigError, match="lacks column.*docno"):
        TwostageRerank(engine).transform(pd.DataFrame({"qid": ["1"], "query": ["x"]}))
