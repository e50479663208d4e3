"""Token vectors on disk, and MaxSim over them: the late-interaction part of an engine version (``late/``).

Each row (a document, or a passage) keeps its tokens' vectors as codes with one float16 scale a token: ``bits`` 8,
int8 codes (``v ~ codes * scale``, scale = max |v_i| / 127: ``dim + 2`` bytes a token), or 4, two signed 4-bit codes a
byte (levels -7..7: ``dim / 2 + 2`` bytes). A part may first project the model's vectors to fewer dimensions
(``projection.npy``, (model dim, dim): the top principal directions of a sample of the corpus's tokens, uncentred,
which keep inner products best); a query's token vectors are then projected the same way. The rows of a segment of
the dense part (:mod:`twostage.indexer.index`) are stored in three ``.npy`` files named after it, memory-mapped
when read::

    late/manifest.json          format, dim, bits, model_dim, segments (name, rows, tokens), files' sizes and sha256
    late/projection.npy         float32 (model dim, dim), when the part projects
    late/<segment>.codes.npy    int8 (tokens, dim) or uint8 (tokens, ceil(dim / 2))
    late/<segment>.scales.npy   float16 (tokens,)
    late/<segment>.offsets.npy  int64 (rows + 1,): row r's tokens are codes[offsets[r]:offsets[r + 1]]

A new version hard-links the segments it keeps; files are untrusted input: shapes, dtypes and offsets are checked
when a version is opened, sizes always and checksums when asked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.atomic import load_npy
from twostage.indexer.blas import one_blas_thread
from twostage.indexer.errors import IndexFormatError
from twostage.indexer.manifest import check_file_entries, describe_files, verify_files

FORMAT, FORMAT_VERSION = "twostage.tokens", 1
PART = "late"


BITS = (8, 4)


def code_width(dim: int, bits: int) -> int:
    return dim if bits == 8 else (dim + 1) // 2


def quantise(vectors: np.ndarray, bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(codes, float16 scales) of float vectors (tokens, dim): each token's largest component maps to the highest
    level (127 in int8; 7 in 4 bits, two codes a byte, the even dimension in the low half)."""
    v = np.asarray(vectors, dtype=np.float32)
    top = 127.0 if bits == 8 else 7.0
    peak = np.abs(v).max(axis=1) if v.size else np.zeros(len(v), dtype=np.float32)
    scales = (np.maximum(peak, 1e-12) / top).astype(np.float16).astype(np.float32)
    codes = np.clip(np.rint(v / scales[:, None]), -top, top).astype(np.int8) if len(v) else \
        np.zeros((0, v.shape[1] if v.ndim == 2 else 0), dtype=np.int8)
    if bits == 4:
        if codes.shape[1] % 2:
            codes = np.concatenate([codes, np.zeros((len(codes), 1), dtype=np.int8)], axis=1)
        low, high = (codes[:, 0::2] + 8).astype(np.uint8), (codes[:, 1::2] + 8).astype(np.uint8)
        codes = (low | (high << 4)).astype(np.uint8)
    return codes, scales.astype(np.float16)


def code_values(codes: np.ndarray, bits: int = 8, dim: int | None = None) -> np.ndarray:
    """Float32 (tokens, dim) levels of :func:`quantise`'s codes, before their scales."""
    if bits == 4:
        packed = np.asarray(codes, dtype=np.uint8)
        values = np.empty((len(packed), 2 * packed.shape[1]), dtype=np.float32)
        values[:, 0::2] = (packed & 0x0F).astype(np.float32) - 8.0
        values[:, 1::2] = (packed >> 4).astype(np.float32) - 8.0
        return values[:, :dim] if dim is not None else values
    return np.asarray(codes, dtype=np.float32)


def dequantise(codes: np.ndarray, scales: np.ndarray, bits: int = 8, dim: int | None = None) -> np.ndarray:
    """Float32 vectors (tokens, dim) from :func:`quantise`'s codes and scales."""
    return code_values(codes, bits, dim) * np.asarray(scales, dtype=np.float32)[:, None]


def fit_projection(sample: np.ndarray, dim: int) -> np.ndarray:
    """(model dim, dim): the ``dim`` directions that keep most of the sample's inner products (the top eigenvectors
    of its uncentred second moment)."""
    x = np.asarray(sample, dtype=np.float64)
    values, vectors = np.linalg.eigh(x.T @ x)
    return np.ascontiguousarray(vectors[:, np.argsort(values)[::-1][:dim]], dtype=np.float32)


@dataclass(frozen=True)
class TokenCodec:
    """How a part stores token vectors: ``bits`` a dimension (8 or 4), and the projection applied first (None: the
    model's own dimensions)."""

    bits: int = 8
    projection: np.ndarray | None = None

    def stored_dim(self, model_dim: int) -> int:
        return model_dim if self.projection is None else int(self.projection.shape[1])

    def project(self, vectors: np.ndarray) -> np.ndarray:
        v = np.asarray(vectors, dtype=np.float32)
        return v if self.projection is None else v @ self.projection


def maxsim(query: np.ndarray, tokens: np.ndarray, bounds: np.ndarray, scales: np.ndarray | None = None) -> np.ndarray:
    """MaxSim of one query against many documents: for each document, the sum over the query's token vectors of
    their highest inner product with the document's token vectors, ``sum_i max_j q_i . d_j``.

    ``query``: (q, dim); ``tokens``: the documents' token vectors one after another (T, dim); ``bounds``: (n + 1,)
    where each document's tokens start, then T; ``scales``: (T,) each token vector's scale when ``tokens`` holds
    codes (applied to the inner products, q values a token, not to the dim values of its vector). A document
    without tokens scores 0. The product runs on one BLAS thread (:func:`~twostage.indexer.blas.one_blas_thread`:
    BLAS threads left spinning after it slowed the next model's forward pass)."""
    n = len(bounds) - 1
    out = np.zeros(n, dtype=np.float32)
    lengths = np.diff(bounds)
    full = np.flatnonzero(lengths > 0)
    if len(full) == 0 or len(query) == 0:
        return out
    # (T, q): the tokens' rows stay contiguous, which BLAS and reduceat run about 20% faster than (q, T)
    with one_blas_thread():
        sims = np.asarray(tokens, dtype=np.float32) @ np.asarray(query, dtype=np.float32).T
    if scales is not None:
        sims *= np.asarray(scales, dtype=np.float32)[:, None]
    out[full] = np.maximum.reduceat(sims, np.asarray(bounds[:-1])[full], axis=0).sum(axis=1)
    return out


@dataclass(frozen=True)
class TokenSegment:
    name: str
    rows: int
    tokens: int


class TokenPart:
    """The token vectors of one engine version, memory-mapped, by global row number (the dense part's rows)."""

    def __init__(self, directory: Path, model_dim: int, segments: Sequence[TokenSegment], starts: Sequence[int],
                 codec: TokenCodec = TokenCodec()) -> None:
        self.directory, self.model_dim, self.segments, self.codec = directory, model_dim, tuple(segments), codec
        self.dim = codec.stored_dim(model_dim)  # the width MaxSim runs at
        self.starts = np.asarray(starts, dtype=np.int64)  # each segment's first global row
        self._rows = np.asarray([seg.rows for seg in self.segments], dtype=np.int64)
        self._arrays: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._code_dtype = dtype = np.dtype(np.int8 if codec.bits == 8 else np.uint8)
        self._code_width = width = code_width(self.dim, codec.bits)
        for seg in self.segments:
            codes = load_npy(directory / f"{seg.name}.codes.npy", mmap=True)
            scales = load_npy(directory / f"{seg.name}.scales.npy", mmap=True)
            offsets = np.asarray(load_npy(directory / f"{seg.name}.offsets.npy"))
            where = directory / seg.name
            if codes.dtype != dtype or codes.ndim != 2 or codes.shape != (seg.tokens, width):
                raise IndexFormatError(f"{where}.codes.npy: {codes.dtype} {codes.shape}, expected "
                                       f"{np.dtype(dtype).name} ({seg.tokens}, {width}); restore or rebuild the engine")
            if scales.dtype != np.float16 or scales.shape != (seg.tokens,):
                raise IndexFormatError(f"{where}.scales.npy: {scales.dtype} {scales.shape}, expected float16 "
                                       f"({seg.tokens},); restore or rebuild the engine")
            if offsets.dtype != np.int64 or offsets.shape != (seg.rows + 1,) or offsets[0] != 0 \
                    or offsets[-1] != seg.tokens or (np.diff(offsets) < 0).any():
                raise IndexFormatError(f"{where}.offsets.npy: not {seg.rows + 1} rising offsets from 0 to "
                                       f"{seg.tokens}; restore or rebuild the engine")
            self._arrays.append((codes, scales, offsets))

    @classmethod
    def open(cls, directory: Path, segment_rows: Sequence[tuple[str, int, int]], *, verify: bool = False) -> TokenPart:
        """The part in ``directory`` for the dense part's segments ``(name, start, rows)``, checked against them."""
        manifest = read_manifest(directory)
        verify_files(directory, manifest["files"], checksums=verify)
        segments = manifest["segments"]
        expected = [(name, rows) for name, _, rows in segment_rows]
        if [(s.name, s.rows) for s in segments] != expected:
            raise IndexFormatError(f"{directory / 'manifest.json'}: its segments do not match the dense part's; "
                                   "restore or rebuild the engine")
        projection = None
        if manifest["projected"]:
            projection = np.asarray(load_npy(directory / "projection.npy"))
            if projection.dtype != np.float32 or projection.shape != (manifest["model_dim"], manifest["dim"]) \
                    or not np.isfinite(projection).all():
                raise IndexFormatError(f"{directory / 'projection.npy'}: {projection.dtype} {projection.shape}, "
                                       f"expected finite float32 ({manifest['model_dim']}, {manifest['dim']}); "
                                       "restore or rebuild the engine")
        return cls(directory, manifest["model_dim"], segments, [start for _, start, _ in segment_rows],
                   TokenCodec(manifest["bits"], projection))

    def codes_of(self, rows: Iterable[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The stored codes of ``rows`` (int8, or uint8 packed 4-bit), their float16 scales, one row after another,
        and where each row's start (n + 1 bounds). The rows' spans are found with array operations and each
        segment's tokens read with one gather from its memory map straight into their place."""
        wanted = np.fromiter((int(r) for r in rows), dtype=np.int64)
        if len(wanted) == 0:
            return (np.zeros((0, self._code_width), dtype=self._code_dtype), np.zeros(0, dtype=np.float16),
                    np.zeros(1, dtype=np.int64))
        if not self.segments:
            raise IndexError(f"row {int(wanted[0])} is not in the token vectors")
        seg = np.searchsorted(self.starts, wanted, side="right") - 1
        at = np.maximum(seg, 0)
        local = wanted - self.starts[at]
        bad = (seg < 0) | (local >= self._rows[at])
        if bad.any():
            raise IndexError(f"row {int(wanted[np.argmax(bad)])} is not in the token vectors")
        first, end = np.empty_like(wanted), np.empty_like(wanted)
        used = np.unique(seg)
        for s in used:
            mine = seg == s
            offsets = self._arrays[s][2]
            first[mine], end[mine] = offsets[local[mine]], offsets[local[mine] + 1]
        lengths = end - first
        bounds = np.zeros(len(wanted) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        # token t of the output, in row i's span, is token first[i] + (t - bounds[i]) of row i's segment
        source = np.arange(int(bounds[-1]), dtype=np.int64) + np.repeat(first - bounds[:-1], lengths)
        if len(used) == 1:
            codes, scales, _ = self._arrays[int(used[0])]
            return np.asarray(codes[source]), np.asarray(scales[source]), bounds
        token_seg = np.repeat(seg, lengths)
        out_codes = np.empty((len(source), self._code_width), dtype=self._code_dtype)
        out_scales = np.empty(len(source), dtype=np.float16)
        for s in used:
            mine = token_seg == s
            codes, scales, _ = self._arrays[s]
            out_codes[mine], out_scales[mine] = codes[source[mine]], scales[source[mine]]
        return out_codes, out_scales, bounds

    def gather(self, rows: Iterable[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The token codes of ``rows`` as float32 (unscaled: a token's vector is its codes times its scale), their
        float32 scales, one after another, and where each row's start (n + 1 bounds): :meth:`codes_of`, the codes
        converted to float once."""
        codes, scales, bounds = self.codes_of(rows)
        return code_values(codes, self.codec.bits, self.dim), scales.astype(np.float32), bounds

    def scores(self, query: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        """MaxSim of ``query`` (q, the model's dim; projected as the part projects) against each of ``rows``."""
        values, scales, bounds = self.gather(rows)
        return maxsim(self.codec.project(query), values, bounds, scales)

    @property
    def bytes(self) -> int:
        return sum(int(meta["bytes"]) for meta in read_manifest(self.directory)["files"].values())


def read_manifest(directory: Path) -> dict[str, Any]:
    """``late/manifest.json``, checked (format, dim, segments, files)."""
    path = directory / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexFormatError(f"{path}: unreadable ({exc}); restore or rebuild the engine") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("format_version"), int):
        raise IndexFormatError(f"{path}: not a token-vector manifest; restore or rebuild the engine")
    if data["format_version"] > FORMAT_VERSION:
        raise IndexFormatError(f"{path}: format version {data['format_version']} is newer than this library reads "
                               f"({FORMAT_VERSION}); upgrade twostage")
    dim, segments = data.get("dim"), data.get("segments")
    model_dim, bits, projected = data.get("model_dim", dim), data.get("bits", 8), bool(data.get("projected", False))
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (dim, model_dim)) \
            or not isinstance(segments, list) or bits not in BITS:
        raise IndexFormatError(f"{path}: dim and model_dim must be positive integers, bits 8 or 4 and segments a "
                               "list; restore or rebuild the engine")
    parsed = []
    for s in segments:
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or not all(
                isinstance(s.get(k), int) and not isinstance(s.get(k), bool) and s[k] >= 0 for k in ("rows", "tokens")):
            raise IndexFormatError(f"{path}: each segment needs a name and integer rows and tokens; restore or "
                                   "rebuild")
        parsed.append(TokenSegment(s["name"], s["rows"], s["tokens"]))
    files = check_file_entries(path, data.get("files"))
    names = {f"{s.name}.{kind}.npy" for s in parsed for kind in ("codes", "scales", "offsets")}
    if set(files) != names | ({"projection.npy"} if projected else set()):
        raise IndexFormatError(f"{path}: its files do not match its segments; restore or rebuild the engine")
    return {"dim": dim, "model_dim": model_dim, "bits": bits, "projected": projected, "segments": parsed,
            "files": files}


def write_segment(directory: Path, name: str, vectors: Sequence[np.ndarray], dim: int,
                  codec: TokenCodec = TokenCodec()) -> TokenSegment:
    """Write one segment's rows (each a (tokens, dim) float array, ``dim`` the model's) as codes, scales and
    offsets, projected and quantised by ``codec``."""
    return write_coded(directory, name, code_rows(vectors, dim, codec))


@dataclass(frozen=True)
class CodedTokens:
    """Rows' token vectors already projected and quantised by one codec: what a write holds in memory while it
    waits to commit (a float32 token vector takes 4 x dim bytes, its code dim or dim / 2 bytes and a 2-byte
    scale). ``codec_key``: which codec made them (:func:`codec_key`)."""

    codes: np.ndarray
    scales: np.ndarray
    lengths: tuple[int, ...]
    codec_key: str

    def __len__(self) -> int:
        return len(self.lengths)


def codec_key(codec: TokenCodec, model_dim: int) -> str:
    """A codec's identity: its bits, the model's dimensions and a digest of its projection."""
    import hashlib

    projection = "none" if codec.projection is None else \
        hashlib.sha256(np.ascontiguousarray(codec.projection, dtype=np.float32).tobytes()).hexdigest()[:16]
    return f"{codec.bits}:{model_dim}:{projection}"


def code_rows(vectors: Sequence[np.ndarray], dim: int, codec: TokenCodec) -> CodedTokens:
    """Rows' float token vectors (each (tokens, ``dim``), ``dim`` the model's) as ``codec``'s codes."""
    allv = np.concatenate([np.asarray(v, dtype=np.float32).reshape(-1, dim) for v in vectors]) if vectors else \
        np.zeros((0, dim), dtype=np.float32)
    codes, scales = quantise(codec.project(allv), codec.bits)
    return CodedTokens(codes, scales, tuple(len(v) for v in vectors), codec_key(codec, dim))


def join_coded(parts: Sequence[CodedTokens]) -> CodedTokens:
    """Pieces coded one after another (at least one), as one."""
    if len({p.codec_key for p in parts}) != 1:
        raise ValueError("token pieces coded by different codecs cannot be joined")
    return CodedTokens(np.concatenate([p.codes for p in parts]), np.concatenate([p.scales for p in parts]),
                       tuple(n for p in parts for n in p.lengths), parts[0].codec_key)


def write_coded(directory: Path, name: str, coded: CodedTokens) -> TokenSegment:
    """Write one segment from rows already coded (:func:`code_rows`)."""
    return _save(directory, name, coded.codes, coded.scales, coded.lengths)


def copy_rows(directory: Path, name: str, part: TokenPart, rows: Sequence[int] | np.ndarray) -> TokenSegment:
    """Write a segment holding ``rows`` of ``part`` (a compaction), their codes copied as they are."""
    codes, scales, bounds = part.codes_of(rows)
    return _save(directory, name, codes, scales, np.diff(bounds).tolist())


def _save(directory: Path, name: str, codes: np.ndarray, scales: np.ndarray, lengths: Sequence[int]) -> TokenSegment:
    directory.mkdir(parents=True, exist_ok=True)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    np.save(directory / f"{name}.codes.npy", codes, allow_pickle=False)
    np.save(directory / f"{name}.scales.npy", scales, allow_pickle=False)
    np.save(directory / f"{name}.offsets.npy", offsets, allow_pickle=False)
    return TokenSegment(name, len(lengths), int(offsets[-1]))


def write_manifest(directory: Path, dim: int, segments: Sequence[TokenSegment],
                   codec: TokenCodec = TokenCodec()) -> None:
    """``late/manifest.json`` (``dim``: the model's; the projection, when the codec has one, written beside)."""
    names = [f"{s.name}.{kind}.npy" for s in segments for kind in ("codes", "scales", "offsets")]
    if codec.projection is not None:
        if not (directory / "projection.npy").is_file():
            np.save(directory / "projection.npy", np.asarray(codec.projection, dtype=np.float32), allow_pickle=False)
        names.append("projection.npy")
    data = {"format": FORMAT, "format_version": FORMAT_VERSION, "dim": codec.stored_dim(dim), "model_dim": dim,
            "bits": codec.bits, "projected": codec.projection is not None,
            "segments": [{"name": s.name, "rows": s.rows, "tokens": s.tokens} for s in segments],
            "files": describe_files(directory, names)}
    (directory / "manifest.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def write_part(directory: Path, previous: TokenPart, segments: Sequence[tuple[str, int]],
               make: Callable[[str], TokenSegment], link: Callable[[Path, Path], None]) -> None:
    """Write a version's ``late/`` in ``previous``'s codec: each segment ``(name, rows)`` ``previous`` has, hard-linked;
    any other made by ``make(name)`` (which writes its files into ``directory``)."""
    directory.mkdir(parents=True, exist_ok=True)
    kept = {s.name: s for s in previous.segments}
    if previous.codec.projection is not None:
        link(previous.directory / "projection.npy", directory / "projection.npy")
    written = []
    for name, rows in segments:
        if name in kept and kept[name].rows == rows:
            for kind in ("codes", "scales", "offsets"):
                link(previous.directory / f"{name}.{kind}.npy", directory / f"{name}.{kind}.npy")
            written.append(kept[name])
        else:
            written.append(make(name))
    write_manifest(directory, previous.model_dim, written, previous.codec)
