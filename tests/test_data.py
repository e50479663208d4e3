import json
import logging

import pandas as pd
import pytest

from twostage.indexer.beir import BeirDataset, load_qrels, load_queries
from twostage.indexer.corpus import Corpus, iter_documents, load_corpus
from twostage.indexer.errors import ConfigError, DataError, DataNotFoundError
from twostage.indexer.records import Document


def write(path, text: str | bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def test_sample_collection_is_big_enough(sample_dir):
    ds = BeirDataset(sample_dir)
    assert len(ds.corpus) >= 200
    assert set(ds.splits) == {"train", "test"}
    train, test = ds.split("train"), ds.split("test")
    assert len(train.queries) + len(test.queries) >= 40
    assert not {q.id for q in train.queries} & {q.id for q in test.queries}
    assert train.check.ok and test.check.ok


def test_reads_beir_fields_and_metadata(tmp_path):
    p = write(tmp_path / "c.jsonl", json.dumps({"_id": 5, "title": "T", "text": "x", "metadata": {"year": 2020}, "lang": "en"}) + "\n")
    (doc,) = load_corpus(p)
    assert doc == Document("5", "x", "T", {"year": 2020, "lang": "en"})


def test_malformed_json_names_file_and_line(tmp_path):
    p = write(tmp_path / "corpus.jsonl", '{"_id": "a", "text": "x"}\n{"_id": "b", "text": \n')
    with pytest.raises(DataError, match=r"corpus\.jsonl:2: malformed JSON"):
        load_corpus(p)


def test_duplicate_document_id_names_both_lines(tmp_path):
    p = write(tmp_path / "corpus.jsonl", '{"_id": "a", "text": "x"}\n{"_id": "b", "text": "y"}\n{"_id": "a", "text": "z"}\n')
    with pytest.raises(DataError, match=r"corpus\.jsonl:3: duplicate document id 'a' \(first seen at .*corpus\.jsonl:1\)"):
        load_corpus(p)


def test_non_utf8_bytes_name_line_and_column(tmp_path):
    p = write(tmp_path / "corpus.jsonl", b'{"_id": "a", "text": "ok"}\n{"_id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"corpus\.jsonl:2: byte 0xe9 at column 26 is not UTF-8"):
        load_corpus(p)


def test_empty_corpus_is_an_error(tmp_path):
    with pytest.raises(DataError, match="no documents"):
        load_corpus(write(tmp_path / "corpus.jsonl", "\n\n"))


def test_missing_corpus_file(tmp_path):
    with pytest.raises(DataNotFoundError, match="nothing.jsonl"):
        load_corpus(tmp_path / "nothing.jsonl")


def test_empty_documents_are_kept_and_counted(tmp_path, caplog):
    p = write(tmp_path / "corpus.jsonl", '{"_id": "a", "text": "x"}\n{"_id": "b", "title": "", "text": "  "}\n')
    with caplog.at_level(logging.WARNING):
        corpus = load_corpus(p)
    assert len(corpus) == 2 and "1 documents have neither title nor text" in caplog.text and "b" in caplog.text


def test_streaming_yields_before_reading_the_whole_file(tmp_path):
    p = write(tmp_path / "corpus.jsonl", '{"_id": "a", "text": "x"}\nnot json\n')
    it = iter_documents(p)
    assert next(it).id == "a"  # the bad second line is only read when asked for
    with pytest.raises(DataError, match=":2:"):
        next(it)


def test_parquet_csv_and_dataframe_sources(tmp_path):
    frame = pd.DataFrame({"id": ["a", "b"], "title": ["A", "B"], "text": ["one", "two"], "source": ["x", "y"]})
    frame.to_parquet(tmp_path / "c.parquet")
    frame.to_csv(tmp_path / "c.csv", index=False)
    for source in (frame, tmp_path / "c.parquet", tmp_path / "c.csv"):
        corpus = Corpus.load(source)
        assert corpus.ids == ["a", "b"] and corpus.get("b").text == "two" and corpus.get("a").metadata == {"source": "x"}


def test_dataframe_without_id_column_names_the_row():
    with pytest.raises(DataError, match="DataFrame: row 1: no id field"):
        load_corpus(pd.DataFrame({"text": ["x"]}))


def test_unknown_corpus_format(tmp_path):
    with pytest.raises(DataError, match="unknown corpus format '.xml'"):
        load_corpus(write(tmp_path / "c.xml", "<x/>"))


def test_empty_query_names_file_line_and_id(tmp_path):
    p = write(tmp_path / "queries.jsonl", '{"_id": "q1", "text": "fine"}\n{"_id": "q2", "text": "   "}\n')
    with pytest.raises(DataError, match=r"queries\.jsonl:2: query 'q2' has empty text"):
        load_queries(p)


def test_duplicate_query_id(tmp_path):
    p = write(tmp_path / "queries.jsonl", '{"_id": "q1", "text": "a"}\n{"_id": "q1", "text": "b"}\n')
    with pytest.raises(DataError, match="duplicate query id 'q1' .*line 1"):
        load_queries(p)


def test_qrels_header_columns_and_grades(tmp_path):
    ok = load_qrels(write(tmp_path / "a.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\n"))
    assert ok.grades("q1") == {"d1": 1, "d2": 0}
    trec = load_qrels(write(tmp_path / "b.txt", "q1 0 d1 2\n"))
    assert trec.grades("q1") == {"d1": 2}
    with pytest.raises(DataError, match=r"c\.tsv:2: expected 3 tab-separated columns"):
        load_qrels(write(tmp_path / "c.tsv", "q\td\ts\nq1\td1\n"))
    with pytest.raises(DataError, match=r"d\.tsv:3: score 'high' of query 'q1', document 'd2'"):
        load_qrels(write(tmp_path / "d.tsv", "q\td\ts\nq1\td1\t1\nq1\td2\thigh\n"))
    with pytest.raises(DataError, match=r"e\.tsv:3: .*judged 2 here but 1 at line 2"):
        load_qrels(write(tmp_path / "e.tsv", "q\td\ts\nq1\td1\t1\nq1\td1\t2\n"))


def test_unknown_split_lists_the_known_ones(toy):
    with pytest.raises(ConfigError, match="unknown split 'dev'.*splits here: test, train"):
        BeirDataset(toy).split("dev")


def test_qrels_naming_unknown_docs_and_queries_are_counted_not_fatal(make_beir, caplog):
    root = make_beir(
        [{"_id": "d1", "text": "a"}, {"_id": "d2", "text": "b"}],
        [{"_id": "q1", "text": "a"}, {"_id": "q2", "text": "b"}],
        {"test": [("q1", "d1", 1), ("q1", "ghost", 1), ("q9", "d2", 1), ("q2", "d2", 0)]},
    )
    with caplog.at_level(logging.WARNING):
        split = BeirDataset(root).split("test")
    assert [q.id for q in split.queries] == ["q1"]
    assert split.check.unknown_documents == (("q1", "ghost"),)
    assert split.check.unknown_queries == ("q9",)
    assert split.check.queries_without_relevant == ("q2",)
    assert "ghost" in caplog.text and "q9" in caplog.text
    assert split.qrels.grades("q1") == {"d1": 1, "ghost": 1}  # kept: a missing relevant doc counts as missed


def test_not_a_beir_directory(tmp_path):
    with pytest.raises(DataNotFoundError, match="missing corpus.jsonl"):
        BeirDataset(tmp_path)
