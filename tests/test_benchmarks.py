"""Every benchmark script imports and answers --help; the top level keeps the few a user runs."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

# Runs each script as __main__ with --help in one process (the libraries load once), one JSON line back.
RUNNER = r'''
import contextlib, io, json, runpy, sys
from pathlib import Path

results = {}
for path in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [path, "--help"]
    sys.path.insert(0, str(Path(path).parent))
    code = "returned without exiting"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = exc.code or 0
    except BaseException as exc:
        code = f"{type(exc).__name__}: {exc}"
    finally:
        sys.path.pop(0)
    results[path] = {"code": code, "usage": "usage:" in out.getvalue()}
print(json.dumps(results))
'''


def scripts(suffix: str) -> list[Path]:
    return sorted(p for p in BENCH.rglob(f"*{suffix}") if "results" not in p.relative_to(BENCH).parts)


def test_top_level_holds_the_canonical_few():
    top = [p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")]
    assert len(top) <= 8, f"benchmarks/ holds {len(top)} scripts: move one-off experiments to benchmarks/experiments/"


def test_every_python_script_prints_help():
    paths = scripts(".py")
    assert len(paths) >= 8
    done = subprocess.run([sys.executable, "-c", RUNNER, *map(str, paths)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    bad = {Path(k).relative_to(ROOT).as_posix(): v for k, v in results.items() if v["code"] != 0 or not v["usage"]}
    assert not bad, bad


def test_every_shell_script_prints_help():
    for path in scripts(".sh"):
        done = subprocess.run(["bash", str(path), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert done.returncode == 0 and "usage" in done.stdout, (path, done.stdout, done.stderr)


def test_tests_import_no_benchmark_script():
    """#45: what tests and benchmarks share lives in tests/harness/; no test loads a benchmark file."""
    tests = Path(__file__).resolve().parent
    for path in tests.rglob("*.py"):
        text = path.read_text()
        for pattern in ("spec_from_file_location", 'ROOT / "benchmarks")', "import_module("):
            if path.name != "test_benchmarks.py":
                assert pattern not in text, f"{path.relative_to(ROOT)} loads a script with {pattern}"


def test_scripts_are_few_and_every_result_names_what_reproduces_it():
    """Benchmarks are results, not code (#64): at most 14 scripts; every committed result names a command (a script
    that is here, a `twostage` command) or the commit that holds the script it came from."""
    import re

    assert len(scripts(".py") + scripts(".sh")) <= 14
    results = sorted((BENCH / "results").rglob("*.md"))
    assert len(results) > 50
    for md in results:
        text = md.read_text(encoding="utf-8")
        assert re.search(r"twostage (?:-{1,2}[\w-]+ )*\w+|python3? benchmarks/|git (show|checkout) [0-9a-f]{7}", text), md
        gone = [m for m in re.findall(r"benchmarks/(?:experiments/)?[\w-]+\.(?:py|sh)", text)
                if not (ROOT / m).is_file()]
        assert not gone or re.search(r"\b(?:at|commit|show|checkout) [0-9a-f]{7,40}\b", text), (md, gone)
