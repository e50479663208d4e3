"""The doors a hostile user tried (#44): signed page tokens, folders that stay inside themselves, bounded files,
filters that never crash, and the small things a user reads (info, stats, printed hits)."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

import pytest

from twostage import Document, SearchEngine
from twostage.app.cli import main
from twostage.engine import pages
from twostage.engine.pages import KEY_FILE, PageToken, encode_page_token, fingerprint
from twostage.indexer.errors import ConfigError, DataError, FilterError, IndexFormatError, PageExpiredError
from twostage.indexer.files import FolderCorpus
from twostage.indexer.filters import MAX_DEPTH, MetadataTable, parse_filter

WORDS = "cat dog rain snow cook garden music history money star".split()


def docs(n: int) -> list[Document]:
    return [Document(f"d{i:03d}", " ".join(WORDS[(i * j) % len(WORDS)] for j in range(1, 8)),
                     metadata={"year": 1990 + i % 30, "lang": "en" if i % 2 else "fr", "d": f"20{i % 30:02d}-01-05"})
            for i in range(n)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, models):
    retriever, _ = models
    root = tmp_path_factory.mktemp("doors")
    eng = SearchEngine.build(docs(80), root / "e", retriever=retriever, backend="flat")
    yield eng
    eng.close()


def forge(version: str, offset: int, k: int, digest: str, issued: int) -> str:
    """A token as the old, unsigned format wrote it, and the same payload with a made-up tag."""
    raw = json.dumps([version, offset, k, digest, issued], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=") + ".AAAAAAAAAAAAAAAAAAAAAA"


# ---- page tokens ---------------------------------------------------------------------------------------
def test_a_forged_token_for_an_older_version_is_refused(tmp_path, models):
    retriever, _ = models
    v1 = SearchEngine.build(docs(40), tmp_path / "e", retriever=retriever, backend="flat")
    first = v1.search("cat", 10, first_stage="bm25")
    victim = first.ids[0]
    v2 = v1.delete([victim])  # v1 stays on disk: this process still holds it
    assert (tmp_path / "e" / v1.version).is_dir() and victim not in v2
    digest = fingerprint("cat", None, {"first_stage": "bm25"})
    token = pages.decode_page_token(first.next_page, pages.page_key(tmp_path / "e"))
    for text in (forge(v1.version, 0, 10, digest, token.issued),  # anyone can recompute the digest
                 first.next_page.replace(".", "x.", 1),  # the payload altered
                 first.next_page[:-2] + ("AA" if not first.next_page.endswith("AA") else "BB"),  # the tag altered
                 encode_page_token(PageToken(v1.version, 0, 10, digest, token.issued), b"k" * 32)):  # another key
        with pytest.raises(ConfigError, match="not a token this engine gave"):
            v2.search("cat", 10, first_stage="bm25", page_token=text)
    # the genuine token, given before the delete, pages the version it pinned while that version is on disk
    page = v2.search("cat", 10, first_stage="bm25", page_token=first.next_page)
    assert page.ids == v1.search("cat", 20, first_stage="bm25").ids[10:]
    v1.close()
    v3 = v2.add([Document("new", "dog")])  # v1 no longer held: this commit removes it
    with pytest.raises(PageExpiredError, match="no longer on disk"):
        v3.search("cat", 10, first_stage="bm25", page_token=first.next_page)
    v2.close()
    v3.close()


def test_tokens_expire_and_belong_to_one_engine(engine, tmp_path, models, monkeypatch):
    first = engine.search("cat", 5, first_stage="bm25")
    key = pages.page_key(engine.root)
    assert len(key) == 32 and oct((engine.root / KEY_FILE).stat().st_mode & 0o777) == "0o600"
    assert engine.search("cat", 5, first_stage="bm25", page_token=first.next_page).hits
    monkeypatch.setattr(pages, "TTL_S", 0)  # every token given is already too old
    with pytest.raises(PageExpiredError, match="tokens page for 0 minutes"):
        engine.search("cat", 5, first_stage="bm25", page_token=first.next_page)
    monkeypatch.undo()
    other = SearchEngine.build(docs(20), tmp_path / "other", retriever=models[0], backend="flat")
    with pytest.raises(ConfigError, match="not a token this engine gave"):
        other.search("cat", 5, first_stage="bm25", page_token=first.next_page)
    other.close()


def test_a_damaged_key_file_is_named_and_a_missing_one_is_made(tmp_path, models):
    eng = SearchEngine.build(docs(30), tmp_path / "e", retriever=models[0], backend="flat")
    first = eng.search("cat", 5, first_stage="bm25")
    (tmp_path / "e" / KEY_FILE).write_text("not hex\n")
    with pytest.raises(IndexFormatError, match="PAGE_KEY: not a page-token key"):
        eng.search("cat", 5, first_stage="bm25", page_token=first.next_page)
    (tmp_path / "e" / KEY_FILE).unlink()
    again = eng.search("cat", 5, first_stage="bm25")  # a new key: old tokens stop working, new ones work
    with pytest.raises(ConfigError, match="not a token this engine gave"):
        eng.search("cat", 5, first_stage="bm25", page_token=first.next_page)
    assert eng.search("cat", 5, first_stage="bm25", page_token=again.next_page).hits
    eng.close()


def test_a_directory_that_cannot_hold_a_key_pages_within_the_process(tmp_path, models, monkeypatch, caplog):
    eng = SearchEngine.build(docs(30), tmp_path / "e", retriever=models[0], backend="flat")
    (tmp_path / "e" / KEY_FILE).unlink(missing_ok=True)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(pages.os, "link", refuse)  # as on a read-only directory
    first = eng.search("cat", 5, first_stage="bm25")
    assert eng.search("cat", 5, first_stage="bm25", page_token=first.next_page).hits
    assert not (tmp_path / "e" / KEY_FILE).exists() and not list((tmp_path / "e").glob(".PAGE_KEY*"))
    assert any("work only in this process" in r.getMessage() for r in caplog.records)
    eng.close()


def test_http_refuses_a_forged_token(engine):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.server import create_app

    digest = fingerprint("cat", None, {})
    with TestClient(create_app(engine, batching=False), raise_server_exceptions=False) as client:
        r = client.post("/search", json={"query": "cat", "page_token": forge(engine.version, 0, 10, digest, 2 ** 40)})
        assert r.status_code == 400 and "not a token this engine gave" in r.json()["error"]
        stats = client.get("/stats").json()["engine"]
        assert stats["rerank"] is False and "reranker" not in stats["precision"]


# ---- folders ----------------------------------------------------------------------------------------------
def test_a_link_out_of_the_folder_is_skipped_unless_followed(tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("the password is swordfish")
    (outside / "more").mkdir()
    (outside / "more" / "a.txt").write_text("outside folder text")
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("inside text")
    (folder / "sub" / "b.md").write_text("# B\n\ninside too")
    os.symlink(outside / "secret.txt", folder / "link_outside.txt")
    os.symlink(outside / "more", folder / "linked_dir")
    os.symlink(folder / "a.txt", folder / "sub" / "alias.txt")  # inside: read
    os.symlink(folder, folder / "sub" / "loop")  # a loop: read once
    os.symlink(tmp_path / "nothing.txt", folder / "dangling.txt")
    corpus = FolderCorpus(folder)
    got = {d.id: d.text for d in corpus}
    assert set(got) == {"a.txt", "sub/alias.txt", "sub/b.md"}
    assert all("swordfish" not in t for t in got.values())
    why = dict(corpus.skipped)
    assert "outside the folder" in why["link_outside.txt"] and "--follow-symlinks" in why["linked_dir"]
    assert "link to nothing" in why["dangling.txt"] and "already read" in why["sub/loop"]
    lines = [r.getMessage() for r in caplog.records if r.name == "twostage.indexer.files"]
    assert len(lines) == 4 and all("\n" not in m for m in lines)
    followed = {d.id: d.text for d in FolderCorpus(folder, follow_symlinks=True)}
    assert "swordfish" in followed["link_outside.txt"] and followed["linked_dir/a.txt"] == "outside folder text"
    with pytest.raises(DataError, match="dangling.txt: a symbolic link to nothing"):
        list(FolderCorpus(folder, strict=True))


def test_a_file_over_the_limit_and_a_pdf_without_pypdf_are_skipped(tmp_path, monkeypatch):
    (tmp_path / "big.txt").write_text("word " * 30_000)  # 150 kB
    (tmp_path / "small.txt").write_text("a small file")
    (tmp_path / "paper.pdf").write_bytes(b"%PDF-1.4 whatever")
    monkeypatch.setitem(sys.modules, "pypdf", None)  # the base install: no pypdf
    corpus = FolderCorpus(tmp_path, max_file_bytes=100_000)
    assert [d.id for d in corpus] == ["small.txt"]
    why = dict(corpus.skipped)
    assert "over the limit of 0.1 MB" in why["big.txt"] and "pip install 'twostage-search[pdf]'" in why["paper.pdf"]
    assert corpus.summary() == "1 files read, 2 skipped (each named above)"
    with pytest.raises(DataError, match="paper.pdf: PDF files need pypdf"):
        list(FolderCorpus(tmp_path, strict=True))
    with pytest.raises(ConfigError, match="max_file_bytes"):
        FolderCorpus(tmp_path, max_file_bytes=0)


def test_cli_build_names_each_skipped_file_and_the_size_flag(tmp_path, models, capsys, caplog):
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "ok.txt").write_text("cats and dogs")
    (folder / "big.txt").write_text("word " * 1000)
    os.symlink(Path("/etc/hostname") if Path("/etc/hostname").exists() else Path("/etc/passwd"),
               folder / "host.txt")
    assert main(["-q", "build", "--corpus", str(folder), "--out", str(tmp_path / "e"), "--retriever",
                 str(models[0]), "--max-file-mb", "0.001"]) == 0
    out = capsys.readouterr()
    assert "files: 1 files read, 2 skipped" in out.out
    named = " ".join(r.getMessage() for r in caplog.records if r.name == "twostage.indexer.files")
    assert "big.txt" in named and "host.txt" in named and "Traceback" not in out.err
    assert main(["-q", "build", "--corpus", str(folder), "--out", str(tmp_path / "e2"), "--retriever",
                 str(models[0]), "--max-file-mb", "-1"]) == 2
    assert "--max-file-mb must be a positive number" in capsys.readouterr().err
    assert not (tmp_path / "e2").exists()


# ---- filters -------------------------------------------------------------------------------------------
def deep_dict(levels: int) -> dict:
    f: dict = {"year": 1}
    for _ in range(levels):
        f = {"$not": f}
    return f


ROWS = [{"year": 2020, "s": "x", "d": "2020-01-05"}, {"year": 1999, "s": "y", "d": "1999-12-31"}, {}]


@pytest.mark.parametrize(("f", "words"), [
    (deep_dict(990), "nested more than 32 levels deep"),
    (deep_dict(100_000), "nested more than 32 levels deep"),
    ("{\"$not\": " * 990 + "{\"year\": 1}" + "}" * 990, "nest"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ({"year": {"$gt": 10 ** 400}}, "a number of 401 digits is out of range"),
    ({"year": {"$in": [1, -(10 ** 400)]}}, "out of range"),
    ({"d": {"$gt": "9999-12-31T23:59:59-23:59"}}, "outside the years 1-9999"),
    ({"d": {"$lt": "0001-01-01T00:00:00+23:59"}}, "outside the years 1-9999"),
    ({"x" * 1_000_000: 1}, "a field name of 1,000,000 characters"),
    ({"s": {"$gt": "a"}}, "ranges compare numbers and ISO dates, not strings"),
    ({"s": "\ud800"}, "not valid Unicode"),
    ({"$or": [{"year": i} for i in range(20_000)]}, "over 10,000 conditions"),
])
def test_hostile_filters_are_one_bounded_filter_error(f, words):
    with pytest.raises(FilterError) as err:
        MetadataTable(ROWS).mask(parse_filter(f))
    assert words in str(err.value) and len(str(err.value)) < 400


def test_filters_at_the_limits_still_work():
    nested: dict = {"year": 2020}
    for _ in range(MAX_DEPTH // 2 - 1):  # each $not adds two levels (its object and its operand)
        nested = {"$not": {"$not": nested}}
    assert MetadataTable(ROWS).mask(parse_filter(nested)).tolist() == [True, False, False]
    assert MetadataTable(ROWS).mask(parse_filter({"year": {"$lt": 1e308}})).tolist() == [True, True, False]
    dated = MetadataTable([{"d": "2020-01-05"}, {"d": "2020-99-99"}])  # one is no date: the field is strings
    assert dated.kinds == {"d": "string"} and dated.mask(parse_filter({"d": "2020-99-99"})).tolist() == [False, True]


def test_cli_hostile_filters_are_one_line_exit_2(engine, capsys):
    deep = "{\"$not\": " * 990 + "{\"year\": 1}" + "}" * 990
    for where, words in ((deep, "nested"), ('{"year": {"$gt": ' + "9" * 400 + "}}", "out of range"),
                         ("d>9999-12-31T23:59:59-23:59", "outside the years"), ("x" * 1_000_000 + "=1", "field name"),
                         ("lang>a", "not strings")):
        assert main(["search", str(engine.root), "cat", "--fast", "--where", where]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and "Traceback" not in err and len(err) < 500, err[:300]


def test_info_and_printed_hits(tmp_path, models, capsys):
    eng = SearchEngine.build([Document("a\nb.txt", "cats\x1b[31m purr", "two\nlines")], tmp_path / "e",
                             retriever=models[0], backend="flat")
    assert eng.info()["settings"]["rerank"] is False and eng.precision in ("fp32", "bf16", "openvino-fp32")
    assert main(["search", str(tmp_path / "e"), "cats", "--fast"]) == 0
    out = capsys.readouterr().out
    assert "a\\nb.txt: two\\nlines" in out and "\x1b" not in out
    eng.close()
