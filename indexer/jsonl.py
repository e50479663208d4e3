"""Line-by-line reading of JSONL and TSV files with errors that name the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from twostage.indexer.errors import DataError, DataNotFoundError


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for every non-blank line, decoding strictly as UTF-8.

    A byte sequence that is not UTF-8 raises :class:`DataError` naming the file, line and column.
    """
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(f"{path}: no such file")
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{number}: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} is not UTF-8; "
                    "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            line = line.rstrip("\r\n")
            if line.strip():
                yield number, line


def parse_object(line: str, where: str) -> dict[str, Any]:
    """One JSON object from one line; anything else is a DataError naming ``where``."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: malformed JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for every JSON object of a JSONL file."""
    for number, line in iter_lines(path):
        yield number, parse_object(line, f"{path}:{number}")


def require_string_id(obj: dict[str, Any], keys: tuple[str, ...], where: str) -> str:
    """The record's id under the first of ``keys`` present, as a string (integers are accepted)."""
    for key in keys:
        if key in obj:
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise DataError(f"{where}: id field {key!r} must be a string, got {value!r}")
            value = str(value)
            if not value.strip():
                raise DataError(f"{where}: empty id in field {key!r}")
            return value
    raise DataError(f"{where}: no id field (expected one of {', '.join(keys)})")


def optional_string(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    return value
