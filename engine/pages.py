"""Page tokens: a result's ``next_page``, signed by the engine that gave it.

A token names the engine version it pins, the next offset, ``k``, a digest of the request (query, filter, knobs)
and when it was issued; it is base64 of that JSON followed by an HMAC-SHA256 tag over it (first 16 bytes), keyed
by a 32-byte secret kept in the engine directory (``ENGINE_DIR/PAGE_KEY``, made on first use, mode 0600) together
with the directory's inode, so a copied engine's tokens are its own. A token whose tag does not verify (compared in
constant time), whose digest belongs to another request, that is older than :data:`TTL_S` or dated in the future
is refused: nobody without the key can make one, so nobody can pin a version the engine did not
hand out. What a valid token may still show: the version it pinned, while that version is on disk (docs/trust.md).

A directory the process cannot write gets a key that lives as long as the process: its tokens then work only in
that process (a warning says so once).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twostage.indexer.errors import ConfigError, IndexFormatError, PageExpiredError
from twostage.indexer.filters import CheckedFilter, Where
from twostage.indexer.versions import VERSION

logger = logging.getLogger(__name__)
KEY_FILE = "PAGE_KEY"
TTL_S = 3600  # a token pages for an hour after its first page was searched
MAX_TOKEN_CHARS = 200
CLOCK_SKEW_S = 300  # a token dated further ahead than this is refused (clocks of processes sharing a key may differ)
_TAG_BYTES = 16
_DOMAIN = b"twostage page token v1\0"
_ephemeral: dict[str, bytes] = {}
_ephemeral_lock = threading.Lock()


@dataclass(frozen=True)
class PageToken:
    """What a ``next_page`` token holds: the version it pins, the next offset, k, the request it belongs to and
    when it was issued (seconds since the epoch)."""

    version: str
    offset: int
    k: int
    fingerprint: str
    issued: int


def fingerprint(query: str, where: Where, knobs: Mapping[str, Any]) -> str:
    """A digest of what a page token may only be used with: the query, the filter and the knobs."""
    if isinstance(where, CheckedFilter):
        where = where.filter
    text = where if isinstance(where, str) else repr(where) if not isinstance(where, Mapping) else \
        json.dumps(where, sort_keys=True, default=str)
    parts = json.dumps([query, text, {k: v for k, v in sorted(knobs.items()) if v is not None}], default=str)
    return hashlib.sha256(parts.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def page_key(root: Path) -> bytes:
    """The engine directory's page-token secret, made (atomically, once) when it has none, bound to the directory.

    The key tokens are signed with is derived from the secret and the directory's inode: a copy of the engine
    (``cp -a``, a restored backup) is another directory, so tokens of the original never page the copy (nor the
    other way round), though the two files hold the same secret. Moving the directory within its file system keeps
    its tokens."""
    path = root / KEY_FILE
    try:
        inode = os.stat(root).st_ino
    except OSError as exc:
        raise IndexFormatError(f"{root}: cannot be read ({exc.strerror}); check the engine directory") from None
    for _ in range(3):
        key = _read_key(path)
        if key is not None:
            return hashlib.sha256(_DOMAIN + key + str(inode).encode("ascii")).digest()
        tmp = root / f".{KEY_FILE}.tmp-{secrets.token_hex(4)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # fails if another process made one first: then theirs is read
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as exc:  # read-only directory: a key for this process only
            return _process_key(root, exc)
    raise IndexFormatError(f"{path}: could not be read after it was made; check the directory's permissions")


def _read_key(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(200)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot be read ({exc.strerror}); fix its permissions") from None
    text = raw.decode("ascii", "replace").strip()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise IndexFormatError(f"{path}: not a page-token key (64 hex digits); delete it and a new one is made "
                               "(page tokens given so far then stop working)")
    return bytes.fromhex(text)


def _process_key(root: Path, exc: OSError) -> bytes:
    name = str(root.resolve())
    with _ephemeral_lock:
        if name not in _ephemeral:
            logger.warning("%s: cannot store a page-token key (%s); page tokens work only in this process",
                           root, exc.strerror or exc)
            _ephemeral[name] = secrets.token_bytes(32)
        return _ephemeral[name]


def _tag(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, _DOMAIN + payload, hashlib.sha256).digest()[:_TAG_BYTES]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_page_token(token: PageToken, key: bytes) -> str:
    """``token`` as the text a result's ``next_page`` holds, signed with ``key``."""
    payload = json.dumps([token.version, token.offset, token.k, token.fingerprint, token.issued],
                         separators=(",", ":")).encode("ascii")
    return f"{_b64(payload)}.{_b64(_tag(key, payload))}"


def decode_page_token(text: Any, key: bytes, *, now: float | None = None) -> PageToken:
    """The token a result's ``next_page`` gave, its signature checked (anything else: one ConfigError; an expired
    one: PageExpiredError)."""
    bad = ConfigError("page_token: not a token this engine gave (pass a result's next_page unchanged)")
    if not isinstance(text, str) or len(text) > MAX_TOKEN_CHARS or text.count(".") != 1:
        raise bad
    body, tag = text.split(".")
    try:
        payload, given = _unb64(body), _unb64(tag)
    except ValueError:
        raise bad from None
    if not hmac.compare_digest(given, _tag(key, payload)):
        raise bad
    try:
        version, offset, k, digest, issued = json.loads(payload)
    except (ValueError, TypeError):
        raise bad from None
    if not (isinstance(version, str) and VERSION.match(version) and type(offset) is int and offset >= 0
            and type(k) is int and k > 0 and isinstance(digest, str) and type(issued) is int):
        raise bad
    age = (time.time() if now is None else now) - issued
    if age < -CLOCK_SKEW_S:  # signed with this engine's key, yet dated in the future: never honoured
        raise bad
    if age > TTL_S:
        raise PageExpiredError(f"page_token: it was given {age / 60:.0f} minutes ago; tokens page for "
                               f"{TTL_S // 60} minutes: search again for the first page")
    return PageToken(version, offset, k, digest, issued)
