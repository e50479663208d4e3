"""``twostage index build|info|add|delete|upsert|compact`` and ``twostage search``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from twostage.app.commands import help_of
from twostage.indexer.errors import ConfigError
from twostage.indexer.vectors import BACKENDS


def _encoder(model: str, device: str, precision: str = "fp32") -> Any:
    """The bi-encoder ``model`` on ``device`` (resolved: cpu or cuda[:N])."""
    from twostage.retriever.biencoder import BiEncoder

    return BiEncoder.load(model, precision=precision, device=device)


def _open(path: Path, with_encoder: bool = True, device: str = "auto") -> Any:
    from twostage.indexer.index import Index
    from twostage.models.device import resolve_device

    where = resolve_device(device)  # cuda on a machine without it: one line, before the index is read
    index = Index.load(path)
    if with_encoder:
        index.attach_encoder(_encoder(index.manifest.encoder.name, where))
    return index


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``--param KEY=VALUE``: numbers for the known numeric parameters, checked before any encoding starts."""
    numeric = {"M", "ef_construction", "ef_search", "nlist", "nprobe", "pq_m", "pq_bits", "seed", "build_threads",
               "search_threads", "rescore"}
    params: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r}: expected KEY=VALUE, e.g. --param M=32")
        if key not in numeric:
            raise ConfigError(f"--param {key}: unknown parameter; known: {', '.join(sorted(numeric))}")
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"--param {item!r}: {key} must be a positive integer") from None
        if value <= 0 and key not in ("seed", "rescore"):
            raise ConfigError(f"--param {item!r}: {key} must be a positive integer")
        params[key] = value
    return params


def _build(args: argparse.Namespace) -> int:
    from twostage.app.cli_engine import corpus_of
    from twostage.indexer.build import build_index
    from twostage.indexer.vectors import BackendConfig
    from twostage.models.device import resolve_device

    params = parse_params(args.param)
    backend = BackendConfig(args.backend, args.metric, params)
    if args.ray and args.device not in ("auto", "cpu"):
        raise ConfigError(f"--ray encodes on CPU actors (--ray-cpus-per-actor), not on --device {args.device}; "
                          "drop --ray to encode on the GPU here")
    device = resolve_device(args.device)  # cuda on a machine without it: one line, nothing written
    args.corpus = corpus_of(args)
    if args.ray and not isinstance(args.corpus, Path):
        raise ConfigError("--id-field, --text-field and --title-field do not apply with --ray; rename the columns")
    if args.ray:
        from twostage.retriever.distributed import build_index_ray

        index = build_index_ray(args.corpus, args.model, args.out, backend=backend, num_actors=args.ray_actors,
                                cpus_per_actor=args.ray_cpus_per_actor, chunk_size=args.chunk_size,
                                batch_size=args.batch_size, address=args.ray_address, show_progress=not args.quiet)
    else:
        index = build_index(args.corpus, _encoder(args.model, device), args.out, backend=backend,
                            chunk_size=args.chunk_size, batch_size=args.batch_size, show_progress=not args.quiet)
    print(json.dumps(index.info(), indent=2))
    return 0


def _info(args: argparse.Namespace) -> int:
    from twostage.indexer.index import Index

    print(json.dumps(Index.load(args.index, verify=not args.fast).info(), indent=2))
    return 0


def _add(args: argparse.Namespace) -> int:
    index = _open(args.index, device=args.device)
    from twostage.app.cli_engine import corpus_of
    from twostage.indexer.corpus import iter_documents

    docs = list(iter_documents(corpus_of(args)))
    index = index.upsert(docs) if args.upsert else index.add(docs)
    print(f"{len(docs)} documents {'upserted' if args.upsert else 'added'}; {len(index)} live documents")
    return 0


def _delete(args: argparse.Namespace) -> int:
    from twostage.app.cli_engine import ids_to_delete

    ids = ids_to_delete([i for i in (args.ids or "").split(",") if i], args.ids_file,
                        "use --ids a,b,c or --ids-file FILE")
    index = _open(args.index, with_encoder=False).delete(ids)
    print(f"{len(ids)} documents deleted; {len(index)} live documents")
    return 0


def _compact(args: argparse.Namespace) -> int:
    index = _open(args.index, with_encoder=False).compact()
    print(f"compacted: {len(index)} documents in one segment")
    return 0


def _search(args: argparse.Namespace) -> int:
    from twostage.app.cli_engine import parse_where

    where = parse_where(args.where)
    index = _open(args.index, device=args.device)
    result = index.search(args.query, args.k, where=where)
    docs = index.documents(list(result.ids))
    for rank, (doc, score) in enumerate(zip(docs, result.scores), 1):
        print(f"{rank:3d}. [{score:.4f}] {doc.id}: {doc.title or doc.text[:80]}")
    return 0


def add_commands(sub: Any, only: str | None = None) -> None:
    idx = sub.add_parser("index", help=help_of("index"))
    isub = idx.add_subparsers(dest="index_cmd", required=True)
    b = isub.add_parser("build", help="encode a corpus and build an index directory")
    b.add_argument("--corpus", required=True, type=Path, help="BEIR directory, corpus.jsonl, .parquet or .csv")
    b.add_argument("--model", required=True, help="bi-encoder name or directory")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--backend", default="hnswlib", help=", ".join(BACKENDS))
    b.add_argument("--metric", default="cosine", choices=["cosine", "ip", "l2"])
    b.add_argument("--param", action="append", help="backend parameter KEY=VALUE (M, ef_construction, nlist...)")
    b.add_argument("--chunk-size", type=int, default=4096)
    b.add_argument("--batch-size", type=int, default=32)
    b.add_argument("--ray", action="store_true", help="encode with Ray Data (pip install 'twostage-search[ray]')")
    b.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting a local one")
    b.add_argument("--ray-actors", type=int, default=2, help="encoder actors (default 2)")
    b.add_argument("--ray-cpus-per-actor", type=float, default=1.0)
    from twostage.app.cli_engine import add_device_flag, add_field_flags

    add_field_flags(b)
    add_device_flag(b)
    b.set_defaults(func=_build)
    i = isub.add_parser("info", help="what an index holds")
    i.add_argument("index", type=Path)
    i.add_argument("--fast", action="store_true", help="check file sizes only, not checksums")
    i.set_defaults(func=_info)
    for name, upsert in (("add", False), ("upsert", True)):
        a = isub.add_parser(name, help=f"{name} documents from a corpus file")
        a.add_argument("--index", required=True, type=Path)
        a.add_argument("--corpus", required=True, type=Path)
        add_field_flags(a)
        add_device_flag(a)
        a.set_defaults(func=_add, upsert=upsert)
    d = isub.add_parser("delete", help="delete documents by id")
    d.add_argument("--index", required=True, type=Path)
    d.add_argument("--ids", default="", help="comma-separated ids")
    d.add_argument("--ids-file", default=None, help="a file with one id per line")
    d.set_defaults(func=_delete)
    c = isub.add_parser("compact", help="rewrite without deleted documents")
    c.add_argument("--index", required=True, type=Path)
    c.set_defaults(func=_compact)
    s = isub.add_parser("search", help="search a bare dense index directory (a sharded engine: twostage search)")
    s.add_argument("--index", required=True, type=Path, help="an index directory")
    s.add_argument("--k", type=int, default=10)
    s.add_argument("--where", action="append", metavar="FILTER", help="metadata filter: KEY=VALUE, KEY>=VALUE ... or "
                   "a JSON filter (repeatable: all must hold; docs/filters.md)")
    s.add_argument("query")
    add_device_flag(s)
    s.set_defaults(func=_search)
