"""The search page of `twostage serve` in a real browser: type a query, wait for the reranked hits, screenshot.

Usage (from the repository root; Debian's chromium and `pip install playwright` needed, no browser download):
    python benchmarks/experiments/serve_browser.py ENGINE_DIR [--query "..."] [--out benchmarks/results/serve_passage.png]

Starts `twostage serve ENGINE_DIR` on a free localhost port, opens `/` in headless Chromium (/usr/bin/chromium)
driven by Playwright, types the query into the search box, presses Enter, waits until the hits are shown, checks
that every hit shows a title, its best passage and its first-stage and rerank scores, that every term marked in a
passage (<mark>) is one of the query's words up to stemming and at least one hit has some, that no markup from a
document's text was rendered as HTML, and that the status line gives the time of each stage, and saves a
screenshot of the page.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # serve_load.py, one folder up
from serve_load import Server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--query", default="vitamin D deficiency and the risk of bone fractures")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve_passage.png")
    args = parser.parse_args()
    import httpx
    from playwright.sync_api import sync_playwright

    server = Server(args.engine)
    try:  # one search first, so that the page shows a warm server's timings
        httpx.post(f"{server.url}/search", json={"query": "warm up"}, timeout=120).raise_for_status()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1000, "height": 1300})
            page.goto(f"{server.url}/")
            page.wait_for_selector("#engine:not(:empty)")
            page.fill("#q", args.query)
            page.press("#q", "Enter")
            page.wait_for_selector("#status[data-done='1']", timeout=120_000)
            hits = page.locator("li.hit")
            n = hits.count()
            status = page.inner_text("#status")
            problems = []
            marked = 0
            for i in range(n):
                hit = hits.nth(i)
                text = hit.inner_text()
                if not hit.locator(".title").inner_text().strip() or not hit.locator(".passage").inner_text().strip():
                    problems.append(f"hit {i + 1} lacks a title or passage")
                marks = [m.lower() for m in hit.locator(".passage mark").all_inner_texts()]
                words = [w.lower() for w in args.query.split()]
                if not all(any(m[:4] == w[:4] for w in words) for m in marks):
                    problems.append(f"hit {i + 1}: marked terms {marks} are not the query's")
                marked += bool(marks)
                if "first stage" not in text or "rerank" not in text:
                    problems.append(f"hit {i + 1} lacks its stage scores")
            for stage in ("encode", "rerank"):
                if stage not in status:
                    problems.append(f"the status line lacks the {stage} time: {status!r}")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=False)
            first = hits.nth(0).locator(".title").inner_text() if n else ""
            if not marked:
                problems.append("no hit shows a marked query term")
            injected = page.locator("#hits script, #hits img, #hits iframe").count()
            if injected:
                problems.append(f"{injected} elements from documents' text were rendered as HTML")
            browser.close()
    finally:
        server.stop()
    print(f"query {args.query!r}: {n} hits shown; status: {status}")
    print(f"first hit: {first}; hits with marked query terms: {marked} of {n}")
    print(f"screenshot: {args.out}")
    for problem in problems:
        print(f"problem: {problem}")
    return 0 if n and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
