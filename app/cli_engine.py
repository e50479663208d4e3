"""``twostage build|search|add|upsert|delete|compact|info``: the search engine from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twostage.app.cli import help_of
from twostage.engine.settings import ANN_PARAMS, FIRST_STAGES, FUSION_NAMES, EngineSettings, check_ann_params
from twostage.indexer.errors import ConfigError
from twostage.indexer.vectors import BACKENDS, METRICS
from twostage.models.device import PRECISIONS

if TYPE_CHECKING:
    from twostage.engine.search_engine import SearchEngine
    from twostage.engine.sharded import ShardedEngine

BATCH = 32  # queries searched together when reading them from a file


_COMPARISONS = (("!=", "$ne"), (">=", "$gte"), ("<=", "$lte"), (">", "$gt"), ("<", "$lt"), ("=", "$eq"))


def parse_where(items: list[str] | None) -> dict[str, Any] | None:
    """``--where`` flags as one filter (several flags: all must hold).

    A flag is a JSON filter object (``'{"year": {"$gte": 2020}}'``, the language of
    :mod:`twostage.indexer.filters`) or one comparison ``KEY OP VALUE`` with OP one of ``= != > >= < <=``; VALUE
    is read as JSON when it is (``year>=2015`` a number, ``ok=true`` a boolean), else as a plain string
    (``published>2021-06-01`` a date, ``lang=en``).
    """
    from twostage.indexer.filters import load_filter_json

    if not items:
        return None
    parts: list[dict[str, Any]] = []
    for item in items:
        shown = item if len(item) <= 60 else item[:57] + "..."
        if item.lstrip().startswith("{"):
            parts.append(load_filter_json(item, f"--where {shown!r}"))
            continue
        at = min(((item.find(sym), -len(sym), sym, op) for sym, op in _COMPARISONS if item.find(sym) > 0),
                 default=None)
        if at is None:
            raise ConfigError(f"--where {shown!r}: expected KEY=VALUE (or != > >= < <=, or a JSON filter), e.g. "
                              "--where year>=2020")
        pos, _, sym, op = at
        key, raw = item[:pos].strip(), item[pos + len(sym):]
        try:
            value = load_filter_json(raw)
        except ConfigError:
            value = raw
        if isinstance(value, (dict, list)):
            raise ConfigError(f"--where {shown!r}: the value must be a number, string, true, false or null; for "
                              "$in and the rest write a JSON filter")
        parts.append({key: value if op == "$eq" else {op: value}})
    return parts[0] if len(parts) == 1 else {"$and": parts}


class _Renamed(argparse.Action):
    """An old flag name: sets the new flag's value and says on stderr, in one line, that the name changed."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"twostage: {option_string} is now {self.new}; the old name goes in the next release", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed_flags(parser: argparse.ArgumentParser, place: str = "settings") -> None:
    """The old names of ``place`` (:data:`twostage.engine.settings.RENAMES`), each a hidden flag setting its new
    flag (which the command has: tests/test_one_path.py checks), with a one-line notice when used."""
    from twostage.engine.settings import renames

    for old, new in renames(place).items():
        parser.add_argument("--" + old.replace("_", "-"), dest=new, type=int if new.endswith("_depth") else str,
                            action=_Renamed, new="--" + new.replace("_", "-"), help=argparse.SUPPRESS,
                            default=argparse.SUPPRESS)


def add_ray_flags(parser: argparse.ArgumentParser) -> None:
    """--ray, --ray-address and --replicas: a sharded engine's shards as Ray actors, on a cluster."""
    parser.add_argument("--ray", action="store_true", help="a sharded engine: serve each shard from Ray actors "
                        "(a local Ray instance unless --ray-address)")
    parser.add_argument("--ray-address", default=None, metavar="ADDR",
                        help="join the Ray cluster at ADDR (auto, host:port, ray://host:10001); implies --ray")
    parser.add_argument("--replicas", type=int, default=1, metavar="R",
                        help="Ray actors holding each shard, on different nodes (default 1); implies --ray")


def parse_blend(value: str | None, flag: str = "--rerank-blend") -> float | str | None:
    """A --rerank-blend value: auto, none (the reranker alone) or a number in [0, 1] (None: not given)."""
    if value is None or value in ("auto", "none"):
        return value
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number <= 1:
        raise ConfigError(f"{flag} must be auto, none or a number in [0, 1], got {value!r}")
    return number


def blend_setting(value: str) -> float | str | None:
    """A --rerank-blend value as the setting it sets: auto, None (``none``: the reranker alone) or a number."""
    blend = parse_blend(value)
    return None if blend == "none" else blend


def add_search_option_flags(parser: argparse.ArgumentParser) -> None:
    """The ``twostage search`` flags of the search options, made from their one description
    (:data:`twostage.engine.options.SEARCH_OPTIONS`): ``--no-NAME`` for a switch, a number, or a choice."""
    from twostage.engine.options import SEARCH_OPTIONS

    for option in SEARCH_OPTIONS:
        if option.kind == "bool":
            parser.add_argument(option.flag, action="store_true", help=option.help)
        else:
            parser.add_argument(option.flag, default=None, help=option.help,
                                type={"int": int, "float": float}.get(option.kind, str),
                                choices=option.choices or None)


def search_options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The search options the flags of :func:`add_search_option_flags` give (None: the engine's)."""
    from twostage.engine.options import SEARCH_OPTIONS

    out: dict[str, Any] = {}
    for option in SEARCH_OPTIONS:
        value = getattr(args, option.flag[2:].replace("-", "_"))
        if option.kind == "bool":
            out[option.name] = False if value else None
        elif option.kind == "blend":
            out[option.name] = parse_blend(value, option.flag)
        else:
            out[option.name] = value
    return out


def maxsim_blend(value: str | None, default: float | None) -> float | None:
    """A build's --maxsim-blend: none (MaxSim alone) or a number in [0, 1] (None: not given, the default)."""
    if value is None:
        return default
    blend = parse_blend(value, "--maxsim-blend")
    if blend == "auto":
        raise ConfigError("--maxsim-blend must be none or a number in [0, 1], got 'auto'")
    return None if blend == "none" else float(blend)  # type: ignore[arg-type]  # a number: checked above


def maxsim_stage_line(settings: EngineSettings, name: str) -> str:
    """The MaxSim stage of an engine with token vectors, in words: on (depth, weight) or off."""
    if not settings.maxsim:
        return (f"token vectors of {name}, off by default (the weight chosen on dev was 0.0, or the maxsim "
                "setting is false); a search may still ask for it with maxsim")
    weight = "by its own scores" if settings.maxsim_blend is None else f"weight {settings.maxsim_blend:g}"
    return f"token vectors of {name} reorder the top {settings.maxsim_depth} ({weight} against the first stage)"


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="where the models run: cpu, cuda, cuda:N or auto (default: "
                        "a CUDA GPU when torch sees one, else the CPU)")


def add_field_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--id-field", default=None, help="the corpus column holding the id (default: _id, id, doc_id)")
    parser.add_argument("--text-field", default=None, help="the column holding the text (default: text, contents, body)")
    parser.add_argument("--title-field", default=None, help="the column holding the title (default: title)")


def add_folder_flags(parser: argparse.ArgumentParser) -> None:
    from twostage.indexer.files import MAX_FILE_BYTES

    parser.add_argument("--follow-symlinks", action="store_true",
                        help="a folder corpus: also read symbolic links that point outside the folder (default: skip "
                             "them, say so)")
    parser.add_argument("--max-file-mb", type=float, default=MAX_FILE_BYTES / 1e6, metavar="MB",
                        help=f"a folder corpus: skip files larger than this (default {MAX_FILE_BYTES / 1e6:.0f} MB)")


def corpus_of(args: argparse.Namespace) -> Any:
    """The corpus path, wrapped with the column names the flags give; a folder of files (no corpus.jsonl) as a
    FolderCorpus."""
    from twostage.indexer.corpus import CorpusFields
    from twostage.indexer.files import MAX_FILE_BYTES, FolderCorpus, is_folder_corpus

    if is_folder_corpus(Path(args.corpus)):
        max_mb = getattr(args, "max_file_mb", MAX_FILE_BYTES / 1e6)
        if not max_mb > 0:
            raise ConfigError(f"--max-file-mb must be a positive number, got {max_mb}")
        return FolderCorpus(Path(args.corpus), strict=getattr(args, "strict", False), show_progress=not args.quiet,
                            follow_symlinks=getattr(args, "follow_symlinks", False), max_file_bytes=int(max_mb * 1e6))
    if args.id_field or args.text_field or args.title_field:
        return CorpusFields(args.corpus, args.id_field, args.text_field, args.title_field)
    return args.corpus


def parse_ann_params(items: Sequence[str]) -> dict[str, int]:
    """``--ann-param KEY=VALUE`` items as the engine's ``ann_params``, checked before any encoding starts."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--ann-param {item!r}: expected KEY=VALUE, e.g. --ann-param M=32")
        try:
            params[key] = int(raw)
        except ValueError:
            raise ConfigError(f"--ann-param {item!r}: {key} must be an integer") from None
    return check_ann_params(params, "--ann-param")


def _settings(args: argparse.Namespace) -> EngineSettings:
    defaults = EngineSettings()
    return EngineSettings(first_stage=args.first_stage, rerank_depth=args.rerank_depth, precision=args.precision,
                          backend=args.backend, metric=args.metric, ann_params=parse_ann_params(args.ann_param),
                          batch_size=args.batch_size, first_stage_depth=args.first_stage_depth,
                          passage_words=args.passage_words, passage_stride=args.passage_stride,
                          passage_title=not args.no_passage_title, passage_whole_up_to=args.passage_whole_up_to,
                          rerank_whole_up_to=args.rerank_whole_up_to, rerank_blend=blend_setting(args.rerank_blend),
                          fusion=args.fusion if args.fusion is not None else defaults.fusion,
                          dense_weight=args.dense_weight if args.dense_weight is not None else defaults.dense_weight,
                          language=args.language,
                          maxsim_depth=args.maxsim_depth if args.maxsim_depth is not None else defaults.maxsim_depth,
                          maxsim_blend=maxsim_blend(args.maxsim_blend, defaults.maxsim_blend))


def _build(args: argparse.Namespace) -> int:
    from twostage.engine.search_engine import SearchEngine
    from twostage.models.weights import check_model_name

    settings = _settings(args)
    retriever, reranker = args.retriever, args.reranker
    if args.adapt is not None and args.reranker:
        raise ConfigError("--adapt trains the reranker: give --adapt or --reranker, not both")
    for model in (retriever, reranker, args.late_interaction):  # before the corpus is read or a model loads
        if model is not None and str(model).lower() not in ("none", "auto", ""):
            check_model_name(model)
    if str(retriever).lower() == "none":  # BM25 only (with --reranker: BM25's candidates reranked)
        if args.adapt is not None or args.shards:
            raise ConfigError("--retriever none builds one BM25-only engine: leave out --adapt and --shards")
        retriever = None
    adapted: Any = None
    served: Any = None  # the MaxSim weight a late model's record serves here (engine.knobs.served_maxsim)
    if args.adapt is not None:
        from dataclasses import replace

        from twostage.engine.writes import choose_retriever
        from twostage.eval.workflows import adapt

        corpus = corpus_of(args)  # `--retriever auto` (the default): adapt the model the build would choose
        base = choose_retriever(args.retriever, corpus, settings)
        adapted = adapt(corpus, args.adapt, base=str(base), show_progress=not args.quiet)
        retriever, reranker = adapted.retriever, adapted.reranker
        if args.fusion is None and args.dense_weight is None:  # flags given on the command line win
            settings = replace(settings, fusion=adapted.settings.fusion, dense_weight=adapted.settings.dense_weight)
    common = {"retriever": retriever, "reranker": reranker, "settings": settings,
              "chunk_size": args.chunk_size, "show_progress": not args.quiet}
    if args.late_interaction is not None:
        if args.shards:
            raise ConfigError("--late-interaction: a sharded engine is built without token vectors for now; leave "
                              "out --shards")
        common["late_interaction"] = args.late_interaction
        if args.maxsim_blend is None:  # the weight the one command chose on dev for this model, when it chose one
            from twostage.engine.knobs import served_maxsim, with_maxsim
            from twostage.indexer.corpus_sketch import corpus_ids

            # over its dev corpus; over another (ids read only for a record that names its corpus), its weight there
            served = served_maxsim(args.late_interaction, corpus_ids(corpus_of(args)))
            common["settings"] = with_maxsim(settings, served)
            if args.maxsim_depth is not None:  # the flag wins over the depth chosen on dev
                from dataclasses import replace

                common["settings"] = replace(common["settings"], maxsim_depth=args.maxsim_depth)
    if args.ray_actors:
        if args.shards:
            raise ConfigError("--ray-actors encodes one engine's corpus; leave out --shards")
        common["ray_actors"], common["ray_address"] = args.ray_actors, args.ray_address
    if args.shards and args.device not in ("auto", "cpu"):
        raise ConfigError(f"--device {args.device}: a sharded engine encodes on the CPU; leave out --device")
    if not args.shards:
        common["device"] = args.device
    if args.trust_remote_code:
        if args.shards:
            raise ConfigError("--trust-remote-code: a sharded engine loads only models without code of their own")
        common["trust_remote_code"] = True
    if args.shards is not None and args.shards < 1:
        raise ConfigError(f"--shards must be a positive integer, got {args.shards}")
    corpus = corpus_of(args)
    engine: Any
    if args.shards:  # only then: a single engine's build imports nothing sharded (#82)
        from twostage.engine.sharded import ShardedEngine

        engine = ShardedEngine.build(corpus, args.out, shards=args.shards, **common)
    else:
        engine = SearchEngine.build(corpus, args.out, **common)
    from twostage.engine.knobs import second_stage

    s = engine.settings
    shards = f" in {args.shards} shards" if args.shards else ""
    rr = engine.manifest.reranker
    print(f"built {args.out}: {len(engine)} documents{shards}, version {engine.version}; first stage {s.first_stage}, "
          f"{s.backend} index; language {engine.language}")
    print(f"second stage: {second_stage(s, rr.name if rr else None)}")
    if engine.manifest.late is not None:
        print(f"MaxSim: {maxsim_stage_line(s, engine.manifest.late.name)}")
        if served is not None:
            print(f"MaxSim's weight: {served.line}")
    for note in adapted.notes if adapted is not None else ():
        print(f"adapt: {note}")
    _print_reading(engine, corpus)
    return 0


def _print_reading(engine: SearchEngine | ShardedEngine, corpus: Any) -> None:
    """What the engine did with long documents, and the files a folder corpus skipped."""
    from twostage.indexer.files import FolderCorpus

    reading = engine.reading() if hasattr(engine, "reading") else None
    if reading is not None:
        print(f"long documents: {reading['summary']}")
    if isinstance(corpus, FolderCorpus):
        print(f"files: {corpus.summary()}")


def _queries(args: argparse.Namespace) -> Iterator[str]:
    if args.query is not None and args.queries is not None:
        raise ConfigError("give either a query or --queries FILE, not both")
    if args.query is not None:
        yield args.query
        return
    if args.queries is None:
        raise ConfigError("no query: give one (twostage search DIR \"my query\") or --queries FILE (- for stdin)")
    if args.queries == "-":
        lines: Any = sys.stdin
    else:
        path = Path(args.queries)
        if not path.is_file():
            raise ConfigError(f"--queries {path}: no such file")
        lines = path.open(encoding="utf-8")
    for line in lines:
        if line.strip():
            yield line.rstrip("\r\n")


def timings_line(timings: Mapping[str, float]) -> str:
    """Seconds by stage (``encode_s``) as one line in milliseconds (``encode 3.1 ms``)."""
    return ", ".join(f"{k.removesuffix('_s')} {v * 1000:.1f} ms" for k, v in timings.items())


def _print_result(result: Any, as_json: bool, timings: bool = True) -> None:
    if as_json:
        print(json.dumps(result.to_dict(), ensure_ascii=False), flush=True)
        return
    print(f"query: {one_line(result.query)}")
    for hit in result.hits:
        label = one_line(hit.title or " ".join(hit.text[:80].split()))
        group = f" ({one_line(str(hit.group))})" if hit.group is not None else ""
        print(f"{hit.rank:3d}. [{hit.score:.4f}] {one_line(hit.id)}{group}: {label}")
        if hit.passage is not None:
            print(f"       {passage_line(hit.passage)}")
        if hit.explanation is not None:
            for line in hit.explanation.lines():
                print(f"       | {one_line(line)}")
    if timings:
        print(f"    {timings_line(result.timings)}", flush=True)
    if result.next_page:
        print(f"    next page: --page-token {result.next_page}", flush=True)


def one_line(text: str) -> str:
    """``text`` safe to print on one terminal line: newlines, tabs and other control characters escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def passage_line(passage: Any, width: int = 200, marks: tuple[str, str] | None = None) -> str:
    """A hit's best passage on one line, about ``width`` characters around its first query term (cut at a sentence
    or word boundary), the terms between ``marks``: :func:`term_marks` by default."""
    from twostage.indexer.passages import snippet

    open_mark, close_mark = marks if marks is not None else term_marks()
    text, spans = passage.text, list(passage.spans)
    lo, hi = snippet(text, spans, width)
    out, at = [], lo
    for start, end in spans:
        if start >= at and end <= hi:
            out += [_words(text[at:start]), open_mark, _words(text[start:end]), close_mark]
            at = end
    out.append(_words(text[at:hi]))
    line = "".join(out).strip()
    return ("... " if lo else "") + line + (" ..." if hi < len(text) else "")


def _words(text: str) -> str:
    """``text`` with each run of white space one space (kept at either end), safe on one line (:func:`one_line`)."""
    core = " ".join(text.split())
    lead = " " if text[:1].isspace() else ""
    return one_line(lead + core + (" " if core and text[-1].isspace() else ""))


def term_marks() -> tuple[str, str]:
    """How the CLI marks a query's terms: bold on a terminal (unless ``NO_COLOR`` is set), else ⟦ and ⟧, which
    a document's own brackets (Markdown links, citations, code) do not use."""
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb":
        return "\x1b[1m", "\x1b[0m"
    return "\u27e6", "\u27e7"


def _search(args: argparse.Namespace) -> int:
    from twostage.engine.door import open_engine

    where = parse_where(args.where)
    if args.k <= 0:
        raise ConfigError(f"--k must be a positive integer, got {args.k}")
    if args.offset < 0:
        raise ConfigError(f"--offset must be an integer >= 0, got {args.offset}")
    if args.page_token is not None and (args.queries is not None or args.offset):
        raise ConfigError("--page-token continues one query: give the query, not --queries or --offset")
    if args.similar is not None and (args.query is not None or args.queries is not None or args.like):
        raise ConfigError("--similar ID: the document is the query; give no query, --queries or --like with it")
    engine = open_engine(args.engine, verify=not args.fast, ray=args.ray, device=args.device,
                         address=args.ray_address, replicas=args.replicas)
    kw = {"where": where, **search_options_of(args), "like": args.like, "unlike": args.unlike, "diversity": args.diversity, "group_by": args.group_by,
          "group_size": args.group_size, "explain": args.explain or None}
    if args.similar is not None:
        kw.pop("rerank")
        result = engine.similar(args.similar, args.k, page_token=args.page_token, offset=args.offset, **kw)
        _print_result(result, args.json)
        return 0
    if args.page_token is not None:
        query = next(_queries(args))
        _print_result(engine.search(query, args.k, page_token=args.page_token, **kw), args.json)
        return 0
    kw["offset"] = args.offset
    batch: list[str] = []
    for query in _queries(args):
        batch.append(query)
        if len(batch) == BATCH:
            _run(engine, batch, args, kw)
            batch = []
    if batch:
        _run(engine, batch, args, kw)
    return 0


def _run(engine: SearchEngine | ShardedEngine, batch: list[str], args: argparse.Namespace, kw: dict[str, Any]) -> None:
    results = engine.search_batch(batch, args.k, **kw)
    for r in results:
        _print_result(r, args.json, timings=len(results) == 1)
        if not r.hits and not args.json:
            print(f"    (no hit at or above min_relevance {args.min_relevance}: nothing relevant)"
                  if args.min_relevance else "    (no hits)")
    if len(results) > 1 and not args.json:  # one batch, searched together: its timings once, per query
        print(f"{len(results)} queries searched together, per query: {timings_line(results[0].timings)}", flush=True)


def _calibrate(args: argparse.Namespace) -> int:
    from twostage.engine.calibration import calibrate
    from twostage.engine.search_engine import SearchEngine

    engine, fitted, said = calibrate(SearchEngine.load(args.engine, verify=False, device=args.device), args.data,
                                     args.split)
    print(f"calibrated {args.engine} on {said}: {fitted.pairs} reranked pairs ({fitted.positives} relevant), "
          f"p = sigmoid({fitted.a:.3f} * logit(score) + {fitted.b:.3f}), log loss {fitted.log_loss:.4f}; "
          f"version {engine.version}. Search with --min-relevance P to drop hits below P.")
    return 0


def _add(args: argparse.Namespace) -> int:
    from twostage.engine.door import open_engine

    engine = open_engine(args.engine, verify=False)
    before = len(engine)
    corpus = corpus_of(args)
    new = (engine.upsert if args.upsert else engine.add)(corpus, show_progress=not args.quiet)
    print(f"{'upserted' if args.upsert else 'added'}: {len(new)} documents (was {before}), version {new.version}")
    _print_reading(new, corpus)
    return 0


def ids_to_delete(given: list[str], ids_file: str | None, usage: str) -> list[str]:
    """The ids given on the command line and those in ``ids_file`` (one per line, blank lines skipped); a missing
    file, or no id at all (``usage`` says how to give them), is a ConfigError."""
    ids = list(given)
    if ids_file:
        path = Path(ids_file)
        if not path.is_file():
            raise ConfigError(f"--ids-file {path}: no such file")
        ids += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not ids:
        raise ConfigError(f"no ids given: {usage}")
    return ids


def _delete(args: argparse.Namespace) -> int:
    from twostage.engine.door import open_engine

    ids = ids_to_delete(args.ids, args.ids_file, "twostage delete DIR ID [ID ...] or --ids-file FILE")
    new = open_engine(args.engine, verify=False).delete(ids)
    print(f"deleted {len(ids)}: {len(new)} documents, version {new.version}")
    return 0


def _compact(args: argparse.Namespace) -> int:
    from twostage.engine.door import open_engine

    new = open_engine(args.engine, verify=False).compact()
    print(f"compacted: {len(new)} documents, version {new.version}")
    return 0


def _late(args: argparse.Namespace) -> int:
    from twostage.engine.search_engine import SearchEngine

    engine = SearchEngine.load(args.engine, verify=False, device=args.device)
    new = engine.late_interaction(args.model, dim=args.dim, bits=args.bits, show_progress=not args.quiet,
                                  trust_remote_code=args.trust_remote_code, serve_choice=not args.keep_settings)
    assert new.tokens is not None
    tokens = sum(s.tokens for s in new.tokens.segments)
    name = new.manifest.late.name if new.manifest.late else args.model
    print(f"token vectors of {name}: {new.tokens.dim}-d, {tokens:,} tokens, {new.tokens.bytes / 1e6:.1f} MB; "
          f"version {new.version}")
    print(f"MaxSim: {maxsim_stage_line(new.settings, name)}")
    if not args.keep_settings:
        from twostage.engine.knobs import served_maxsim

        served = served_maxsim(args.model, new.document_ids())
        if served is not None:
            print(f"MaxSim's weight: {served.line}")
    return 0


def _swap(args: argparse.Namespace) -> int:
    from twostage.eval.swap import swap

    decision = swap(args.engine, retriever=args.retriever, reranker=args.reranker, qrels=args.qrels,
                    split=args.split, pseudo_queries=args.pseudo_queries, metric=args.metric,
                    min_gain=args.min_gain, force=args.force, test=args.test, show_progress=not args.quiet)
    print(decision.line())
    if not decision.promoted:
        print("the engine is unchanged; --force promotes the candidate anyway")
    return 0 if decision.promoted else 1


def _info(args: argparse.Namespace) -> int:
    from twostage.engine.door import open_engine

    print(json.dumps(open_engine(args.engine, verify=not args.fast).info(), indent=2))
    return 0


def _serve(args: argparse.Namespace) -> int:
    import os
    import socket

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, "")
        if not api_key:
            raise ConfigError(f"--api-key-env {args.api_key_env}: that environment variable is unset or empty; "
                              f"export {args.api_key_env}=<a secret> first")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {args.port}")
    if args.max_wait_ms < 0:
        raise ConfigError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")
    try:  # a port in use is one line here, not uvicorn's exit later
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((args.host, args.port))
    except OSError as exc:
        raise ConfigError(f"--host {args.host} --port {args.port}: cannot listen there ({exc.strerror}); "
                          "choose another --port") from None
    from twostage.app.server import create_app

    if args.protect_reads and api_key is None:
        raise ConfigError("--protect-reads puts /stats and /metrics behind the API key: give --api-key-env VAR too")
    from twostage.app.budgets import HELP, Budgets
    from twostage.app.server import allowed_hosts_for

    budgets = Budgets(**{name: getattr(args, f"max_{name}") for name in HELP})
    if args.request_timeout is not None and not args.request_timeout > 0:
        raise ConfigError(f"--request-timeout must be a positive number of seconds, got {args.request_timeout}")
    hosts = allowed_hosts_for(args.host, args.allowed_hosts)
    app = create_app(args.engine, api_key=api_key, read_only=args.read_only, batching=not args.no_batching,
                     max_wait_ms=args.max_wait_ms, verify=not args.fast, device=args.device, ray=args.ray,
                     ray_address=args.ray_address, replicas=args.replicas, metrics=not args.no_metrics,
                     budgets=budgets, protect_reads=args.protect_reads, request_timeout=args.request_timeout,
                     allowed_hosts=hosts, max_expensive=args.max_expensive, expensive_wait_s=args.expensive_wait,
                     max_searches=args.max_searches)
    if not args.no_access_log:  # one JSON line a request on stderr (the library only logs it)
        import logging

        from twostage.app.observe import access_log

        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        access_log.addHandler(handler)
        access_log.setLevel(logging.INFO)
        access_log.propagate = False
    engine = app.state.holder.engine
    mode = "read-only" if args.read_only else ("writes need the API key" if api_key else "writes open to anyone")
    print(f"serving {args.engine} ({len(engine)} documents, version {engine.version}) at "
          f"http://{args.host}:{args.port}/ ({mode}; API docs at /docs); Ctrl-C stops", flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1") and api_key is None and not args.read_only:
        print("twostage: warning: listening beyond this machine with writes open; use --api-key-env or --read-only",
              file=sys.stderr)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


def add_commands(sub: Any, only: str | None = None) -> None:
    """Every engine command's parser; with ``only`` (the command being run), the flags that import more than this
    module (folder corpora, the server's budgets) are added to that command alone."""
    d = EngineSettings()
    b = sub.add_parser("build", help=help_of("build"))
    b.add_argument("--corpus", required=True, type=Path,
                   help="BEIR directory, .jsonl, .parquet, .csv, .tsv, or a folder of .txt, .md, .html and .pdf files "
                        "(id: the path in the folder; the pdf extra reads PDFs)")
    b.add_argument("--out", required=True, type=Path, help="the engine directory")
    b.add_argument("--retriever", default="auto",
                   help="bi-encoder name or directory; auto (default): all-MiniLM-L6-v2, or multilingual-e5-small "
                        "for a corpus not all in English when it is downloaded; none: a BM25-only engine (first "
                        "stage bm25, nothing encoded)")
    b.add_argument("--reranker", default=None, help="cross-encoder directory (trained by twostage train-reranker)")
    b.add_argument("--late-interaction", default=None, metavar="MODEL",
                   help="store every passage's token vectors for a MaxSim stage between the first stage and the "
                        "reranker: a ColBERT model (PyLate or Stanford layout) or a bi-encoder read token by token")
    b.add_argument("--maxsim-depth", type=int, default=None,
                   help=f"candidates MaxSim reads (default: the depth the one command chose on dev for the "
                        f"--late-interaction model over this corpus, else {d.maxsim_depth})")
    b.add_argument("--maxsim-blend", default=None,
                   help=f"MaxSim's weight against the first stage: none (MaxSim alone) or a number in [0, 1] "
                        f"(default {d.maxsim_blend})")
    b.add_argument("--adapt", type=Path, default=None, metavar="MODELS_DIR",
                   help="first adapt --retriever and a reranker to this corpus without labels (as twostage adapt "
                   "--out MODELS_DIR; resumed if interrupted), then build with them")
    b.add_argument("--first-stage", default=d.first_stage, choices=FIRST_STAGES)
    b.add_argument("--rerank-depth", type=int, default=d.rerank_depth,
                   help=f"candidates the reranker reads (default {d.rerank_depth})")
    b.add_argument("--first-stage-depth", type=int, default=d.first_stage_depth,
                   help=f"candidates each first stage gives the fusion (default {d.first_stage_depth})")
    b.add_argument("--rerank-blend", default="auto",
                   help="the reranker's weight against the first stage: auto (the blend the reranker chose on dev, "
                        "written into the engine as numbers), none (the reranker alone) or a number in [0, 1]")
    b.add_argument("--fusion", default=None, choices=FUSION_NAMES,
                   help=f"how hybrid fuses BM25 and dense: rrf (reciprocal rank) or wsum (a weighted sum of normalised "
                   f"scores; blend: its old name) (default {d.fusion}; --adapt chooses it on its dev pseudo-queries)")
    b.add_argument("--dense-weight", type=float, default=None,
                   help=f"dense's weight in the wsum fusion, BM25's is 1 minus it (default {d.dense_weight})")
    b.add_argument("--precision", default=d.precision, choices=PRECISIONS,
                   help="model precision at search time (auto: with the openvino extra, the retriever in "
                   "openvino-fp32 and the reranker in openvino-int8; else bf16 on AMX CPUs, else fp32)")
    b.add_argument("--backend", default=d.backend, help=", ".join(BACKENDS))
    b.add_argument("--metric", default=d.metric, choices=METRICS,
                   help=f"the dense similarity: cosine, inner product or L2 distance (default {d.metric})")
    b.add_argument("--ann-param", action="append", default=[], metavar="KEY=VALUE",
                   help="an ANN backend parameter, e.g. --ann-param M=32 --ann-param ef_search=512 (known: "
                        f"{', '.join(ANN_PARAMS)}; each one left out is sized from the corpus)")
    b.add_argument("--batch-size", type=int, default=d.batch_size)
    b.add_argument("--chunk-size", type=int, default=4096, help="documents encoded per resumable chunk")
    b.add_argument("--language", default=d.language, metavar="CODE",
                   help="the language of the corpus's text for BM25 (stemmer, stopwords): auto (default: each "
                        "document's detected among the corpus's languages, each query's too) or a code such as en, "
                        "de, zh (docs/languages.md)")
    b.add_argument("--passage-words", type=int, default=d.passage_words,
                   help=f"search documents as passages of this many words (default {d.passage_words}; 0: whole "
                        "documents, read only as far as each model reads)")
    b.add_argument("--passage-stride", type=int, default=d.passage_stride,
                   help=f"a new passage every this many words (default {d.passage_stride}: passages overlap by half)")
    b.add_argument("--no-passage-title", action="store_true", help="the title in front of the first passage only")
    add_device_flag(b)
    b.add_argument("--trust-remote-code", action="store_true",
                   help="let the models run Python code shipped with them (only for models you trust; recorded in "
                        "the engine's manifest; default off)")
    b.add_argument("--passage-whole-up-to", type=int, default=d.passage_whole_up_to, metavar="WORDS",
                   help=f"a document of at most this many words stays one passage (default {d.passage_whole_up_to}; "
                        "0: at most --passage-words)")
    b.add_argument("--rerank-whole-up-to", type=int, default=d.rerank_whole_up_to, metavar="WORDS",
                   help=f"the reranker reads a document of at most this many words whole, a longer one by its best "
                        f"passage in each first stage, the higher score counting (default {d.rerank_whole_up_to}; "
                        "0: every document so)")
    b.add_argument("--strict", action="store_true",
                   help="a folder corpus: stop at the first file that cannot be read (default: skip it, say so)")
    if only in (None, "build"):
        add_folder_flags(b)
    b.add_argument("--shards", type=int, default=None,
                   help="split the engine into N shards searched as one (BM25 with the whole corpus's statistics)")
    b.add_argument("--ray-actors", type=int, default=0, metavar="N",
                   help="encode the corpus with N Ray actors on CPU (pip install 'twostage-search[ray]')")
    b.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --ray-actors: join this Ray cluster instead of starting a local one")
    add_field_flags(b)
    add_renamed_flags(b)
    b.set_defaults(func=_build)

    s = sub.add_parser("search", help=help_of("search"))
    add_device_flag(s)
    s.add_argument("engine", type=Path, help="the engine directory")
    s.add_argument("query", nargs="?", default=None, help="the query (or --queries FILE, or --similar ID)")
    s.add_argument("--queries", default=None, help="a file with one query per line, or - for stdin")
    s.add_argument("--k", type=int, default=10)
    s.add_argument("--where", action="append", metavar="FILTER",
                   help="metadata filter: KEY=VALUE, KEY!=VALUE, KEY>=VALUE (> < <= too) or a JSON filter such as "
                        "'{\"tags\": {\"$in\": [\"a\", \"b\"]}}' (repeatable: all must hold; docs/filters.md)")
    s.add_argument("--offset", type=int, default=0, help="skip this many hits (a page: --offset 10 --k 10)")
    s.add_argument("--page-token", default=None, help="the next page of one query (printed as 'next page')")
    add_search_option_flags(s)
    s.add_argument("--like", action="append", default=None, metavar="ID",
                   help="more like this document (repeatable): the query moves towards it (left out of the hits)")
    s.add_argument("--unlike", action="append", default=None, metavar="ID",
                   help="less like this document (repeatable): the query moves away from it (left out of the hits)")
    s.add_argument("--similar", default=None, metavar="ID", help="the documents most like this one (no query)")
    s.add_argument("--diversity", type=float, nargs="?", const=True, default=None, metavar="L",
                   help="diverse hits: maximal marginal relevance with weight L in [0, 1] (alone: the default weight, "
                        "chosen on dev; docs/steering.md)")
    s.add_argument("--group-by", default=None, metavar="FIELD",
                   help="at most --group-size hits per value of this metadata field; --k counts groups")
    s.add_argument("--group-size", type=int, default=None, metavar="N", help="hits per group (default 1)")
    s.add_argument("--explain", action="store_true", help="print how each hit's score was made")
    s.add_argument("--json", action="store_true", help="one JSON object per query, one per line")
    s.add_argument("--fast", action="store_true", help="check file sizes only, not checksums")
    add_ray_flags(s)
    add_renamed_flags(s)
    s.set_defaults(func=_search)

    for name, upsert in (("add", False), ("upsert", True)):
        a = sub.add_parser(name, help=help_of(name))
        a.add_argument("engine", type=Path)
        a.add_argument("corpus", type=Path, help="BEIR directory, .jsonl, .parquet, .csv, .tsv or a folder of "
                       ".txt, .md, .html and .pdf files")
        a.add_argument("--strict", action="store_true", help="a folder: stop at a file that cannot be read")
        if only in (None, name):
            add_folder_flags(a)
        add_field_flags(a)
        a.set_defaults(func=_add, upsert=upsert)
    de = sub.add_parser("delete", help=help_of("delete"))
    de.add_argument("engine", type=Path)
    de.add_argument("ids", nargs="*", default=[])
    de.add_argument("--ids-file", default=None, help="a file with one id per line")
    de.set_defaults(func=_delete)
    c = sub.add_parser("compact", help=help_of("compact"))
    c.add_argument("engine", type=Path)
    c.set_defaults(func=_compact)
    la = sub.add_parser("late", help=help_of("late"))
    la.add_argument("engine", type=Path)
    la.add_argument("--model", required=True, help="a ColBERT model (PyLate or Stanford layout) or a bi-encoder, by "
                    "name or directory")
    la.add_argument("--dim", type=int, default=0, help="store the token vectors projected to this many dimensions "
                    "(fitted on the corpus; default 0: the model's own)")
    la.add_argument("--bits", type=int, default=8, choices=(8, 4), help="bits a dimension (default 8)")
    la.add_argument("--trust-remote-code", action="store_true", help="let the model run Python code shipped with it")
    la.add_argument("--keep-settings", action="store_true", help="leave the engine's MaxSim settings as they are "
                    "(default: serve the weight the model's training chose on dev, when it recorded one)")
    add_device_flag(la)
    la.set_defaults(func=_late)
    sw = sub.add_parser("swap", help=help_of("swap"))
    sw.add_argument("engine", type=Path)
    sw.add_argument("--retriever", default=None, help="the new bi-encoder (name or directory)")
    sw.add_argument("--reranker", default=None, help="the new cross-encoder (name or directory)")
    sw.add_argument("--qrels", type=Path, default=None, help="a BEIR directory whose queries and --split judgments "
                    "judge the two (never a test split you report)")
    sw.add_argument("--split", default="dev", help="the qrels split (default: dev)")
    sw.add_argument("--pseudo-queries", type=int, default=0, metavar="N",
                    help="judge by N pseudo-queries made from the engine's documents instead of qrels")
    sw.add_argument("--metric", default="ndcg@10", help="the metric compared (default ndcg@10)")
    sw.add_argument("--min-gain", type=float, default=0.0, help="promote when the candidate's mean is at least the "
                    "current one's plus this (default 0: not worse; negative: allow that much loss)")
    sw.add_argument("--test", default="t", choices=["t", "fisher"], help="the paired test reported (default t)")
    sw.add_argument("--force", action="store_true", help="promote whatever the comparison says (it is still "
                    "reported)")
    sw.set_defaults(func=_swap)

    cal = sub.add_parser("calibrate", help=help_of("calibrate"))
    cal.add_argument("engine", type=Path)
    cal.add_argument("--data", required=True, type=Path, help="BEIR directory of the engine's collection")
    cal.add_argument("--split", default="dev", help="judged queries to fit on (default dev; the reranker's training "
                     "split means only the queries it held out)")
    add_device_flag(cal)
    cal.set_defaults(func=_calibrate)

    i = sub.add_parser("info", help=help_of("info"))
    i.add_argument("engine", type=Path)
    i.add_argument("--fast", action="store_true", help="check file sizes only, not checksums")
    i.set_defaults(func=_info)

    sv = sub.add_parser("serve", help=help_of("serve"))
    add_device_flag(sv)
    sv.add_argument("engine", type=Path, help="the engine directory")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--api-key-env", default=None, metavar="VAR",
                    help="the environment variable holding the API key that writes must send")
    sv.add_argument("--read-only", action="store_true", help="refuse every write")
    sv.add_argument("--no-batching", action="store_true", help="each request runs the models on its own")
    sv.add_argument("--max-wait-ms", type=float, default=5.0,
                    help="how long a model batch waits for requests already in flight (default 5)")
    sv.add_argument("--fast", action="store_true", help="check file sizes only, not checksums, when loading")
    add_ray_flags(sv)
    sv.add_argument("--no-metrics", action="store_true", help="no GET /metrics (Prometheus)")
    sv.add_argument("--no-access-log", action="store_true", help="no JSON access-log line a request on stderr")
    sv.add_argument("--protect-reads", action="store_true", help="/stats and /metrics need the API key too")
    sv.add_argument("--allowed-hosts", default=None, metavar="NAMES",
                    help="comma-separated Host names the server answers, and the sites a browser's write may come "
                         "from ('*': any; default: the loopback names when listening on loopback, else any)")
    sv.add_argument("--request-timeout", type=float, default=300.0, metavar="S",
                    help="a request still running after S seconds stops at its next stage boundary and gets a 503 "
                         "(default 300); a request whose client disconnects stops there too")
    sv.add_argument("--max-expensive", type=int, default=1, metavar="N",
                    help="expensive requests (a batch, a bulk write, a rerank or embeddings of over 64 items) run N at "
                         "a time (default 1); searches never wait for them")
    sv.add_argument("--expensive-wait", type=float, default=10.0, metavar="S",
                    help="how long an expensive request waits for its turn before a 503 with Retry-After (default 10)")
    sv.add_argument("--max-searches", type=int, default=32, metavar="N",
                    help="with N or more searches in flight, expensive requests get a 503 with Retry-After at once "
                         "(default 32)")
    if only in (None, "serve"):
        from twostage.app.budgets import HELP, Budgets, flag

        budget = sv.add_argument_group("budgets", "what one request may make the server do; over a budget: 413 naming "
                                       "it")
        for name, text in HELP.items():
            default = getattr(Budgets(), name)
            budget.add_argument(flag(name), type=int, default=default, metavar="N", help=f"{text} (default {default:,})")
    sv.set_defaults(func=_serve)
