"""The filter language: which documents a search may return, by their metadata.

A filter is a JSON object, the same in Python, on the command line (``--where``) and over HTTP::

    {"year": 2020}                                  equality (on a list field: the list holds the value)
    {"year": {"$gte": 2015, "$lt": 2020}}           several operators on one field: all must hold
    {"source": {"$in": ["arxiv", "pubmed"]}}        $in / $nin: one of / none of the values
    {"author": {"$ne": "smith"}}                    $ne: not equal (a document without the field passes)
    {"published": {"$gt": "2021-06-01"}}            ranges on numbers and on ISO dates
    {"doi": {"$exists": true}}                      the field is present (and not null)
    {"$or": [{"year": 2020}, {"$not": {"tags": "retracted"}}]}     $and / $or / $not nest
    {"year": 2020, "lang": "en"}                    several keys in one object: all must hold

A field's type comes from the corpus (:class:`MetadataTable`): ``number``, ``bool``, ``string``, ``date`` (a
string field whose every value is an ISO 8601 date or date-time), a ``list`` of strings or of numbers, or
``mixed`` (values of several types: only ``$exists`` applies). An operand of the wrong type, an operator the type
has not, a field no document has, a malformed filter: a :class:`~twostage.indexer.errors.FilterError` naming the
field and the operator. ``$ne`` and ``$nin`` keep documents without the field (as MongoDB does); every other
operator needs the field. Filters are evaluated on Arrow columns with ``pyarrow.compute``, never row by row.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np

from twostage.indexer.errors import FilterError

COMPARE = ("$gt", "$gte", "$lt", "$lte")
FIELD_OPS = ("$eq", "$ne", "$in", "$nin", *COMPARE, "$exists")
LOGIC = ("$and", "$or", "$not")
KINDS = ("number", "bool", "string", "date", "list[string]", "list[number]", "mixed")
_MEMBER = ("$eq", "$ne", "$in", "$nin", "$exists")
OPS_OF = {"number": FIELD_OPS, "date": FIELD_OPS, "string": FIELD_OPS, "bool": _MEMBER, "list[string]": _MEMBER,
          "list[number]": _MEMBER, "mixed": ("$exists",)}
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}:?\d{2})?$")


# ---- the parsed filter ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Condition:
    """``field op value`` (``$in``/``$nin``: a tuple of values; ``$exists``: a bool)."""

    field: str
    op: str
    value: Any


@dataclass(frozen=True)
class And:
    parts: tuple[Filter, ...]


@dataclass(frozen=True)
class Or:
    parts: tuple[Filter, ...]


@dataclass(frozen=True)
class Not:
    part: Filter


Filter = Condition | And | Or | Not


@dataclass(frozen=True)
class CheckedFilter:
    """A filter already checked against the fields of every part of an engine (each shard then evaluates it
    without checking again: a field only some shards have is simply absent in the others)."""

    filter: Filter


# what ``where=`` takes: a filter (JSON object, JSON text, parsed), a function of a Document, or None
Where = Mapping[str, Any] | str | Condition | And | Or | Not | CheckedFilter | Callable[[Any], bool] | None


def parse_filter(spec: Any, where: str = "where") -> Filter:
    """The filter a JSON object spells (a string is read as JSON first); a FilterError says what is wrong."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise FilterError(f"{where}: not JSON ({exc}); write e.g. '{{\"year\": {{\"$gte\": 2020}}}}'") from None
    if isinstance(spec, (Condition, And, Or, Not)):
        return spec
    return _parse(spec, where)


def _parse(spec: Any, where: str) -> Filter:
    if not isinstance(spec, Mapping):
        raise FilterError(f"{where}: a filter is a JSON object, got {type(spec).__name__} {_show(spec)}")
    parts: list[Filter] = []
    for key, value in spec.items():
        if not isinstance(key, str) or not key:
            raise FilterError(f"{where}: field names are non-empty strings, got {key!r}")
        at = f"{where}.{key}"
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise FilterError(f"{at}: takes a non-empty list of filters, got {_show(value)}")
            subs = tuple(_parse(v, f"{at}[{i}]") for i, v in enumerate(value))
            parts.append(And(subs) if key == "$and" else Or(subs))
        elif key == "$not":
            parts.append(Not(_parse(value, at)))
        elif key.startswith("$"):
            raise FilterError(f"{at}: unknown operator {key!r} at the top of a filter; use $and, $or, $not, or a "
                              "field name")
        elif isinstance(value, Mapping) and any(isinstance(op, str) and op.startswith("$") for op in value):
            if not value:
                raise FilterError(f"{at}: empty operator object")
            for op, operand in value.items():
                parts.append(_condition(key, op, operand, at))
        else:
            parts.append(_condition(key, "$eq", value, at))
    if not parts:
        return And(())
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _condition(name: str, op: Any, operand: Any, at: str) -> Condition:
    if op not in FIELD_OPS:
        raise FilterError(f"{at}: unknown operator {op!r}; one of {', '.join(FIELD_OPS)}")
    where = f"{at}.{op}" if op != "$eq" else at
    if op in ("$in", "$nin"):
        if not isinstance(operand, list):
            raise FilterError(f"{where}: takes a list of values, got {_show(operand)}")
        for v in operand:
            _scalar(v, where)
        return Condition(name, op, tuple(operand))
    if op == "$exists":
        if not isinstance(operand, bool):
            raise FilterError(f"{where}: takes true or false, got {_show(operand)}")
        return Condition(name, op, operand)
    _scalar(operand, where)
    if op in COMPARE and (operand is None or isinstance(operand, bool)):
        raise FilterError(f"{where}: compares numbers or ISO dates, got {_show(operand)}")
    return Condition(name, op, operand)


def _scalar(value: Any, where: str) -> None:
    if isinstance(value, (dict, list, tuple, Mapping)):
        raise FilterError(f"{where}: takes a number, string, true, false or null, got {_show(value)}"
                          + ("; to match any of several values use $in" if isinstance(value, list) else ""))
    if isinstance(value, float) and not math.isfinite(value):
        raise FilterError(f"{where}: {value} is not a finite number")
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise FilterError(f"{where}: takes a number, string, true, false or null, got {type(value).__name__}")


def _show(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def fields_of(f: Filter) -> list[str]:
    """The fields a filter names, in order of appearance."""
    if isinstance(f, Condition):
        return [f.field]
    parts = (f.part,) if isinstance(f, Not) else f.parts
    return list(dict.fromkeys(name for p in parts for name in fields_of(p)))


# ---- metadata as typed Arrow columns -------------------------------------------------------------
def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def kind_of(values: Iterable[Any]) -> str:
    """The type of one field from its values (None: absent)."""
    seen = set()
    list_items = set()
    all_iso = True
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            seen.add("bool")
        elif _is_number(v):
            seen.add("number")
        elif isinstance(v, str):
            seen.add("string")
            all_iso = all_iso and bool(_ISO.match(v))
        elif isinstance(v, list):
            seen.add("list")
            for item in v:
                list_items.add("number" if _is_number(item) else "string" if isinstance(item, str) else "other")
        else:
            seen.add("other")
        if len(seen) > 1:
            return "mixed"
    kind = seen.pop() if seen else "other"
    if kind == "other" or "other" in list_items or len(list_items) > 1:
        return "mixed"
    if kind == "list":
        return "list[number]" if list_items == {"number"} else "list[string]"
    return "date" if kind == "string" and all_iso else kind


def to_datetime(value: str) -> datetime:
    """An ISO date or date-time as an aware UTC datetime (a naive one is taken as UTC)."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


class MetadataTable:
    """Every row's metadata as one typed Arrow column a field (built once per index version)."""

    def __init__(self, rows: list[Mapping[str, Any]]) -> None:
        import pyarrow as pa

        self.rows = len(rows)
        names = sorted({k for m in rows for k in m if m.get(k) is not None})
        self.kinds: dict[str, str] = {}
        self.columns: dict[str, Any] = {}
        for name in names:
            values = [m.get(name) for m in rows]
            kind = kind_of(values)
            self.kinds[name] = kind
            if kind == "date":
                cache: dict[str, datetime] = {}
                values = [None if v is None else cache.setdefault(v, to_datetime(v)) for v in values]
                self.columns[name] = pa.array(values, type=pa.timestamp("us", tz="UTC"))
            elif kind == "mixed":
                self.columns[name] = pa.array([v is not None for v in values])  # presence only
            elif kind.startswith("list"):
                item = pa.float64() if kind == "list[number]" else pa.string()
                self.columns[name] = pa.array([None if v is None else [float(x) if _is_number(x) else x for x in v]
                                               for v in values], type=pa.list_(item))
            elif kind == "number":
                self.columns[name] = pa.array([None if v is None else float(v) for v in values], type=pa.float64())
            else:
                self.columns[name] = pa.array(values)

    def check(self, f: Filter) -> None:
        """Raise a FilterError when ``f`` names a field no document has or uses an operator its type has not."""
        check_filter(f, self.kinds)

    def mask(self, f: Filter, *, checked: bool = False) -> np.ndarray:
        """A boolean mask over rows: true where the metadata passes ``f`` (checked first unless ``checked``)."""
        if not checked:
            self.check(f)
        return np.asarray(self._eval(f), dtype=bool)

    def _eval(self, f: Filter) -> np.ndarray:
        if isinstance(f, And):
            out = np.ones(self.rows, dtype=bool)
            for p in f.parts:
                out &= self._eval(p)
            return out
        if isinstance(f, Or):
            out = np.zeros(self.rows, dtype=bool)
            for p in f.parts:
                out |= self._eval(p)
            return out
        if isinstance(f, Not):
            return ~self._eval(f.part)
        return self._condition(f)

    def _condition(self, c: Condition) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.compute as pc

        col = self.columns.get(c.field)
        if col is None:  # a field this shard lacks (another has it): nothing here has it
            present = np.zeros(self.rows, dtype=bool)
            return ~present if c.op in ("$ne", "$nin") or (c.op == "$exists" and not c.value) else present
        kind = self.kinds[c.field]
        if c.op == "$exists":
            present = col.to_numpy(zero_copy_only=False) if kind == "mixed" else ~_null(col)
            return present if c.value else ~present
        op, value = c.op, c.value
        if value is None and op in ("$eq", "$ne"):  # null: the field is absent (or null)
            return _null(col) if op == "$eq" else ~_null(col)
        negate = op in ("$ne", "$nin")
        op = {"$ne": "$eq", "$nin": "$in"}.get(op, op)
        values = [convert(kind, v) for v in (value if op == "$in" else (value,)) if v is not None]
        if kind.startswith("list"):
            flat, parents = pc.list_flatten(col), pc.list_parent_indices(col)
            flat_values = pa.array(values, type=flat.type)
            hit = _filled(pc.is_in(flat, value_set=flat_values))
            out = np.zeros(self.rows, dtype=bool)
            out[parents.to_numpy()[hit]] = True
        elif op == "$in":
            out = _filled(pc.is_in(col, value_set=pa.array(values, type=col.type)))
        else:
            scalar = pa.scalar(values[0], type=col.type)
            fn = {"$eq": pc.equal, "$gt": pc.greater, "$gte": pc.greater_equal, "$lt": pc.less,
                  "$lte": pc.less_equal}[op]
            out = _filled(fn(col, scalar))
        if op == "$in" and value and any(v is None for v in value):
            out |= _null(col)
        return ~out if negate else out


def _filled(result: Any) -> np.ndarray:
    import pyarrow.compute as pc

    return np.asarray(pc.fill_null(result, False).to_numpy(zero_copy_only=False), dtype=bool)


def _null(col: Any) -> np.ndarray:
    return np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def convert(kind: str, value: Any) -> Any:
    """An operand as its column stores it (numbers as floats, ISO dates as UTC datetimes)."""
    if kind == "date":
        return to_datetime(value)
    if _is_number(value):
        return float(value)
    return value


def check_filter(f: Filter, kinds: Mapping[str, str]) -> None:
    """Each condition against the field's type (``kinds``: field -> one of :data:`KINDS`)."""
    if isinstance(f, (And, Or)):
        for p in f.parts:
            check_filter(p, kinds)
        return
    if isinstance(f, Not):
        check_filter(f.part, kinds)
        return
    kind = kinds.get(f.field)
    if kind is None:
        known = ", ".join(sorted(kinds)) or "none"
        raise FilterError(f"where: no document has the field {f.field!r} (operator {f.op}); metadata fields: {known}")
    if f.op not in OPS_OF[kind]:
        raise FilterError(f"where.{f.field}: {f.op} does not apply to a {kind} field"
                          + ("" if kind != "mixed" else " (its values have several types; fix the metadata)"))
    if f.op == "$exists":
        return
    for v in f.value if f.op in ("$in", "$nin") else (f.value,):
        if v is None and f.op in ("$eq", "$ne", "$in", "$nin"):
            continue
        _check_operand(f, kind, v)


def _check_operand(f: Condition, kind: str, v: Any) -> None:
    where = f"where.{f.field}" + (f".{f.op}" if f.op != "$eq" else "")
    given = "a number" if _is_number(v) else "a bool" if isinstance(v, bool) else f"the string {v!r}"
    if kind == "date":
        if not isinstance(v, str) or not _ISO.match(v):
            raise FilterError(f"{where}: {f.field!r} holds dates; compare it with an ISO date like \"2020-01-31\", "
                              f"not {given}")
        try:
            to_datetime(v)
        except ValueError:
            raise FilterError(f"{where}: {v!r} is not a valid date") from None
    elif kind == "number" and not _is_number(v):
        raise FilterError(f"{where}: {f.field!r} holds numbers; got {given}")
    elif kind == "string" and not isinstance(v, str):
        raise FilterError(f"{where}: {f.field!r} holds strings; got {given}")
    elif kind == "bool" and not isinstance(v, bool):
        raise FilterError(f"{where}: {f.field!r} holds true/false; got {given}")
    elif kind == "list[string]" and not isinstance(v, str):
        raise FilterError(f"{where}: {f.field!r} holds lists of strings; match one string, got {given}")
    elif kind == "list[number]" and not _is_number(v):
        raise FilterError(f"{where}: {f.field!r} holds lists of numbers; match one number, got {given}")


def merge_kinds(many: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The field types of several shards together (a field typed differently in two shards is ``mixed``)."""
    out: dict[str, str] = {}
    for kinds in many:
        for name, kind in kinds.items():
            out[name] = kind if out.get(name, kind) == kind else "mixed"
    return out
