import numpy as np
import pytest

from twostage.indexer.errors import DataError
from twostage.indexer.records import Document, Judgment, Qrels, Query, RankedList


def test_document_requires_id_and_string_fields():
    with pytest.raises(DataError, match="non-empty string"):
        Document(id="", text="x")
    with pytest.raises(DataError, match="'d1'"):
        Document(id="d1", text=None)  # type: ignore[arg-type]
    assert Document("d", "body", "Title").full_text == "Title body"
    assert Document("d", "", "Title").full_text == "Title"


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_blank_query_is_an_error_naming_the_id(text):
    with pytest.raises(DataError, match="'q7'"):
        Query("q7", text)


def test_qrels_views():
    q = Qrels([Judgment("a", "d1", 1), Judgment("a", "d2", 0), Judgment("b", "d3", 2)])
    assert len(q) == 2 and q.num_judgments == 3
    assert q.relevant("a") == {"d1"}
    assert q.grades("a") == {"d1": 1, "d2": 0}
    assert q.relevant("missing") == frozenset()
    assert q.subset(["b"]).query_ids == ("b",)
    frame = q.to_frame()
    assert list(frame.columns) == ["query_id", "doc_id", "grade"] and len(frame) == 3


def test_ranked_list_checks_lengths_and_makes_hits():
    with pytest.raises(ValueError):
        RankedList(np.array(["a"], dtype=object), np.array([1.0, 2.0]))
    hits = RankedList(np.array(["a", "b"], dtype=object), np.array([2.0, 1.0])).hits()
    assert [(h.doc_id, h.rank) for h in hits] == [("a", 1), ("b", 2)]
