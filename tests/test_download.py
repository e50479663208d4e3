"""The downloader against a web server on loopback (never the internet)."""

import hashlib
import http.server
import io
import threading
import zipfile

import pytest

from twostage.indexer.beir import BeirDataset
from twostage.indexer.download import download_beir
from twostage.indexer.errors import ConfigError, DownloadError


def beir_zip(name: str, extra: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{name}/corpus.jsonl", '{"_id": "d1", "title": "", "text": "hello world"}\n')
        zf.writestr(f"{name}/queries.jsonl", '{"_id": "q1", "text": "hello"}\n')
        zf.writestr(f"{name}/qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\n")
        for path, text in (extra or {}).items():
            zf.writestr(path, text)
    return buf.getvalue()


@pytest.fixture
def server():
    files: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield files, f"http://127.0.0.1:{httpd.server_address[1]}/beir"
    httpd.shutdown()


def test_download_and_unpack(tmp_path, server):
    files, url = server
    files["/beir/toy.zip"] = beir_zip("toy")
    digest = hashlib.sha256(files["/beir/toy.zip"]).hexdigest()
    path = download_beir("toy", tmp_path, base_url=url, sha256=digest)
    assert path == tmp_path / "toy"
    assert BeirDataset(path).split("test").qrels.relevant("q1") == {"d1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy"]  # no partial files left
    files.clear()  # a second call finds the directory and does not download
    assert download_beir("toy", tmp_path, base_url=url) == path


def test_http_error_and_no_server(tmp_path, server):
    _, url = server
    with pytest.raises(DownloadError, match="HTTP 404"):
        download_beir("missing", tmp_path, base_url=url)
    with pytest.raises(DownloadError, match="cannot download"):
        download_beir("toy", tmp_path, base_url="http://127.0.0.1:9/beir", timeout=2)
    assert list(tmp_path.iterdir()) == []


def test_checksum_mismatch_leaves_nothing(tmp_path, server):
    files, url = server
    files["/beir/toy.zip"] = beir_zip("toy")
    with pytest.raises(DownloadError, match="does not match"):
        download_beir("toy", tmp_path, base_url=url, sha256="0" * 64)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("body,message", [(b"not a zip", "not a valid zip"),
                                          (beir_zip("toy", {"../evil.txt": "x"}), "unsafe path")])
def test_bad_archives(tmp_path, server, body, message):
    files, url = server
    files["/beir/toy.zip"] = body
    with pytest.raises(DownloadError, match=message):
        download_beir("toy", tmp_path / "d", base_url=url)
    assert not (tmp_path / "d" / "toy").exists() and not (tmp_path / "evil.txt").exists()


def test_bad_name(tmp_path):
    with pytest.raises(ConfigError):
        download_beir("../etc", tmp_path)
