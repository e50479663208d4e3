"""The ``twostage`` command line. Errors print one line (``-v`` shows the traceback) and exit non-zero."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from twostage.indexer.errors import TwostageError

logger = logging.getLogger("twostage")
SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"  # package data in a wheel (twostage/data)


def _download(args: argparse.Namespace) -> int:
    from twostage.indexer.download import download_beir

    path = download_beir(args.name, args.dest, base_url=args.base_url, sha256=args.sha256, show_progress=not args.quiet)
    print(path)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from twostage.app.demo import run_demo

    print(f"twostage demo on {args.data}: train both stages, index, evaluate every system against BM25\n")
    run_demo(args.data, args.out, base=args.base, command=args.command_line, show_progress=not args.quiet)
    return 0


def _quiet_libraries() -> None:
    """No third-party noise on the console: transformers' load reports and progress bars, hub bars."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers is first imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' own bars follow this too
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a broken PDF is our one line, not pypdf's warnings
    if "transformers" in sys.modules:  # already imported (main called from Python)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twostage", description="Retrieve, then rerank: build, train and benchmark search.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more and show tracebacks on errors")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="cmd", required=True)

    dl = sub.add_parser("download", help="download a public BEIR dataset zip and unpack it")
    dl.add_argument("name", help="BEIR dataset name, e.g. scifact, nfcorpus, arguana")
    dl.add_argument("--dest", type=Path, default=Path("datasets"), help="parent directory (default: ./datasets)")
    dl.add_argument("--base-url", default=None, help="mirror to download from instead of the BEIR host")
    dl.add_argument("--sha256", default=None, help="expected sha256 of the zip")
    dl.set_defaults(func=_download)

    from twostage.app import cli_engine, cli_eval, cli_index, cli_train

    cli_eval.add_commands(sub)
    cli_engine.add_commands(sub)
    cli_index.add_commands(sub)
    cli_train.add_commands(sub)
    cli_train.add_adapt_command(sub)

    demo = sub.add_parser("demo", help="run the demo on the bundled sample collection")
    demo.add_argument("--data", type=Path, default=SAMPLE, help=argparse.SUPPRESS)
    demo.add_argument("--base", default="all-MiniLM-L6-v2", help=argparse.SUPPRESS)
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="where the report goes (default: out/demo)")
    demo.set_defaults(func=_demo)
    return parser


def _metrics_as_python() -> None:
    """Run ranx (the metrics) as Python in this process unless the user chose otherwise (NUMBA_DISABLE_JIT=0).

    ranx compiles its metrics with numba on first use. `twostage eval` of a SciFact BM25 run (300 queries) took 80 s
    right after installing and 13-18 s every later time (loading numba's cache), as Python 7.6-8.3 s with the same
    numbers (docs/cli.md). The library leaves numba alone; the command line owns its process.
    """
    if "numba" not in sys.modules:
        os.environ.setdefault("NUMBA_DISABLE_JIT", "1")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    _metrics_as_python()
    args.command_line = "twostage " + " ".join(shlex.quote(a) for a in argv)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # some libraries (bm25s) set their own loggers to DEBUG
        handler.setLevel(level)
    if not args.verbose:
        _quiet_libraries()
    try:
        return int(args.func(args))
    except TwostageError as exc:
        if args.verbose:
            raise
        print(f"twostage: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("twostage: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # the disk, not the library: say which file and what to do
        import errno

        if args.verbose or exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EMFILE):
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        hint = "free some space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "check the permissions"
        print(f"twostage: error: {exc.strerror}{where}; {hint} and run the command again (nothing was committed)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
