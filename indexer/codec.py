"""The one codec between settings dataclasses and JSON.

Every settings record (engine settings, BM25 and analyzer settings, training recipes) is a frozen dataclass whose
fields all have defaults. :func:`to_json_dict` turns one into plain JSON values (nested records become objects,
tuples lists); :func:`from_json_dict` reads such an object back onto the defaults: a key left out keeps its
default, nested objects fill nested records, lists become tuples, and an unknown key is an error that names it
and lists the known ones. The record's own ``__post_init__`` checks the values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields, is_dataclass, replace
from typing import Any, TypeVar

from twostage.indexer.errors import ConfigError

T = TypeVar("T")


def to_json_dict(record: Any) -> dict[str, Any]:
    """``record`` (a dataclass instance) as JSON values: nested records as objects, tuples and paths as lists and
    strings."""
    return json.loads(json.dumps(asdict(record), default=str))


def from_json_dict(kind: type[T], data: Any, where: str) -> T:
    """A ``kind`` record (a dataclass whose fields all have defaults) from a JSON object.

    ``where`` names the file or field in error messages, e.g. ``"manifest.json: settings"``.
    """
    return _onto(kind(), data, where)


def _onto(current: T, data: Any, where: str) -> T:
    """``current`` (a dataclass instance) with the values of the JSON object ``data``, nested records filled."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object of settings, got {type(data).__name__}")
    known = [f.name for f in fields(current)]  # type: ignore[arg-type]  # T is a dataclass by contract
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        default = getattr(current, name)
        if is_dataclass(default) and not isinstance(default, type):
            values[name] = _onto(default, value, f"{where}.{name}")
        else:
            values[name] = tuple(value) if isinstance(value, list) else value
    try:
        return replace(current, **values)  # type: ignore[type-var]
    except (TypeError, ValueError) as exc:  # a record's own check, or a value of the wrong shape
        raise ConfigError(f"{where}: {exc}") from None
