"""The filter language: which documents a search may return, by their metadata.

A filter is a JSON object, the same in Python, on the command line (``--where``) and over HTTP::

    {"year": 2020}                                  equality (on a list field: the list holds the value)
    {"year": {"$gte": 2015, "$lt": 2020}}           several operators on one field: all must hold
    {"source": {"$in": ["arxiv", "pubmed"]}}        $in / $nin: one of / none of the values
    {"author": {"$ne": "smith"}}                    $ne: not equal (a document without the field passes)
    {"published": {"$gt": "2021-06-01"}}            ranges on numbers and on ISO dates (not on strings)
    {"doi": {"$exists": true}}                      the field is present (and not null)
    {"$or": [{"year": 2020}, {"$not": {"tags": "retracted"}}]}     $and / $or / $not nest
    {"year": 2020, "lang": "en"}                    several keys in one object: all must hold

A field's type comes from the corpus (:class:`MetadataTable`): ``number``, ``bool``, ``string``, ``date`` (a
string field whose every value is an ISO 8601 date or date-time), a ``list`` of strings or of numbers, or
``mixed`` (values of several types: only ``$exists`` applies). An operand of the wrong type, an operator the type
has not, a field no document has, a malformed filter: a :class:`~twostage.indexer.errors.FilterError` naming the
field and the operator. ``$ne`` and ``$nin`` keep documents without the field (as MongoDB does); every other
operator needs the field. Filters are evaluated on Arrow columns with ``pyarrow.compute``, never row by row.

A filter is untrusted input (it arrives over HTTP): its size is checked before anything else reads it, without
recursion (at most :data:`MAX_DEPTH` levels of nesting, :data:`MAX_ITEMS` objects, lists and values in all,
field names of at most :data:`MAX_NAME` characters, numbers a float can hold), and every error message is
bounded in length whatever the filter holds.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
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
OPS_OF = {"number": FIELD_OPS, "date": FIELD_OPS, "string": _MEMBER, "bool": _MEMBER, "list[string]": _MEMBER,
          "list[number]": _MEMBER, "mixed": ("$exists",)}
MAX_DEPTH = 32  # nesting of objects and lists
MAX_ITEMS = 10_000  # objects, lists and values in one filter
MAX_NAME = 256  # characters of a field name
MAX_TEXT = 1 << 20  # characters of a filter given as JSON text
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
        spec = load_filter_json(spec, where)
    if isinstance(spec, (Condition, And, Or, Not)):
        check_size(spec, where)
        return spec
    check_size(spec, where)
    return _parse(spec, where)


def load_filter_json(text: str, where: str = "where") -> Any:
    """A filter's JSON text as Python objects (no check of its meaning); a FilterError when it is not JSON, too
    long or nested too deeply."""
    if len(text) > MAX_TEXT:
        raise FilterError(f"{where}: {len(text):,} characters of JSON; a filter has at most {MAX_TEXT:,}")
    try:
        return json.loads(text)
    except RecursionError:
        raise FilterError(f"{where}: nested too deeply; a filter nests at most {MAX_DEPTH} levels") from None
    except ValueError as exc:
        detail = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)[:80]
        raise FilterError(f"{where}: not JSON ({detail}); write e.g. '{{\"year\": {{\"$gte\": 2020}}}}'") from None


def check_size(spec: Any, where: str = "where") -> None:
    """Refuse a filter (JSON objects, or a parsed tree) nested deeper than :data:`MAX_DEPTH` or holding more than
    :data:`MAX_ITEMS` items, walking it without recursion (so no filter can exhaust the stack)."""
    stack: list[tuple[Any, int]] = [(spec, 1)]
    items = 0
    while stack:
        node, depth = stack.pop()
        items += 1
        if items > MAX_ITEMS:
            raise FilterError(f"{where}: over {MAX_ITEMS:,} conditions and values; split the filter or use fewer "
                              "$in values")
        if depth > MAX_DEPTH:
            raise FilterError(f"{where}: nested more than {MAX_DEPTH} levels deep; flatten it ($and and $or take "
                              "lists)")
        if isinstance(node, Mapping):
            for key, value in node.items():
                if isinstance(key, str) and len(key) > MAX_NAME:
                    raise FilterError(f"{where}: a field name of {len(key):,} characters ({_name(key)}); names have "
                                      f"at most {MAX_NAME}")
                stack.append((value, depth + 1))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, (And, Or)):
            stack.extend((p, depth + 1) for p in node.parts)
        elif isinstance(node, Not):
            stack.append((node.part, depth + 1))
        elif isinstance(node, Condition):
            if not isinstance(node.field, str) or not node.field or len(node.field) > MAX_NAME:
                raise FilterError(f"{where}: field names are strings of 1 to {MAX_NAME} characters, got "
                                  f"{_show(node.field)}")
            stack.append((node.value, depth + 1))


def _parse(spec: Any, where: str) -> Filter:
    if not isinstance(spec, Mapping):
        raise FilterError(f"{where}: a filter is a JSON object, got {type(spec).__name__} {_show(spec)}")
    parts: list[Filter] = []
    for key, value in spec.items():
        if not isinstance(key, str) or not key:
            raise FilterError(f"{where}: field names are non-empty strings, got {_show(key)}")
        _text(key, where)
        at = f"{where}.{_name(key)}"
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise FilterError(f"{at}: takes a non-empty list of filters, got {_show(value)}")
            subs = tuple(_parse(v, f"{at}[{i}]") for i, v in enumerate(value))
            parts.append(And(subs) if key == "$and" else Or(subs))
        elif key == "$not":
            parts.append(Not(_parse(value, at)))
        elif key.startswith("$"):
            raise FilterError(f"{at}: unknown operator {_show(key)} at the top of a filter; use $and, $or, $not, or a "
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
        raise FilterError(f"{at}: unknown operator {_show(op)}; one of {', '.join(FIELD_OPS)}")
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
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            raise FilterError(f"{where}: a number of {len(str(abs(value)))} digits is out of range; numbers are "
                              "compared as 64-bit floats (at most about 1.8e308)") from None
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise FilterError(f"{where}: takes a number, string, true, false or null, got {type(value).__name__}")
    if isinstance(value, str):
        _text(value, where)


def _text(value: str, where: str) -> None:
    """A string that can be stored (UTF-8: no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FilterError(f"{where}: {_show(value)} is not valid Unicode ({exc.reason} at character {exc.start})"
                          ) from None


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 3, 60, 60, 6, 4


def _show(value: Any) -> str:
    """A value for an error message: at most about 80 characters, however large or deep it is."""
    text = _REPR.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _op(op: Any) -> str:
    return op if isinstance(op, str) and op in FIELD_OPS else _show(op)


def _name(name: str) -> str:
    """A field name for an error message (a long one cut)."""
    return name if len(name) <= 60 else name[:57] + "..."


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
    try:
        return parsed.astimezone(timezone.utc)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-23:59 is past the last representable instant
        raise ValueError(f"{value!r} is outside the years 1-9999 in UTC") from None


def _dates(values: list[Any]) -> list[datetime | None] | None:
    """Every value as a UTC datetime (None stays None), or None when one is not a valid date."""
    cache: dict[str, datetime] = {}
    out: list[datetime | None] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        if v not in cache:
            try:
                cache[v] = to_datetime(v)
            except ValueError:
                return None
        out.append(cache[v])
    return out


class MetadataTable:
    """Every row's metadata as one typed Arrow column a field (built once per index version).

    ``index`` maps each row of the index to one of ``rows`` (None: one each): the passages of a document, which
    share its metadata, share one entry, so the table's size grows with the distinct metadata, not with fields x
    passages."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], index: np.ndarray | None = None) -> None:
        import pyarrow as pa

        self.rows = len(rows)
        self.index = index
        names = sorted({k for m in rows for k in m if m.get(k) is not None})
        self.kinds: dict[str, str] = {}
        self.columns: dict[str, Any] = {}
        for name in names:
            values = [m.get(name) for m in rows]
            kind = kind_of(values)
            dates = _dates(values) if kind == "date" else None
            if kind == "date" and dates is None:  # looks like dates, one is not a valid one: strings
                kind = "string"
            self.kinds[name] = kind
            if dates is not None:
                self.columns[name] = pa.array(dates, type=pa.timestamp("us", tz="UTC"))
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
        out = np.asarray(self._eval(f), dtype=bool)
        return out if self.index is None else out[self.index]

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
        known = ", ".join(sorted(kinds)[:50]) or "none"
        raise FilterError(f"where: no document has the field {_show(f.field)} (operator {_op(f.op)}); metadata "
                          f"fields: {known}")
    if f.op not in OPS_OF[kind]:
        raise FilterError(f"where.{_name(f.field)}: {_op(f.op)} does not apply to a {kind} field"
                          + (" (its values have several types; fix the metadata)" if kind == "mixed" else
                             "; ranges compare numbers and ISO dates, not strings: use $eq or $in" if kind == "string"
                             and f.op in COMPARE else ""))
    if f.op == "$exists":
        return
    for v in f.value if f.op in ("$in", "$nin") else (f.value,):
        if v is None and f.op in ("$eq", "$ne", "$in", "$nin"):
            continue
        _check_operand(f, kind, v)


def _check_operand(f: Condition, kind: str, v: Any) -> None:
    where = f"where.{_name(f.field)}" + (f".{f.op}" if f.op != "$eq" else "")
    _scalar(v, where)
    given = "a number" if _is_number(v) else "a bool" if isinstance(v, bool) else f"the string {_show(v)}"
    if kind == "date":
        if not isinstance(v, str) or not _ISO.match(v):
            raise FilterError(f"{where}: {_show(f.field)} holds dates; compare it with an ISO date like "
                              f"\"2020-01-31\", not {given}")
        try:
            to_datetime(v)
        except ValueError as exc:
            raise FilterError(f"{where}: {_show(v)} is not a valid date ({str(exc)[:80]})") from None
    elif kind == "number" and not _is_number(v):
        raise FilterError(f"{where}: {_show(f.field)} holds numbers; got {given}")
    elif kind == "string" and not isinstance(v, str):
        raise FilterError(f"{where}: {_show(f.field)} holds strings; got {given}")
    elif kind == "bool" and not isinstance(v, bool):
        raise FilterError(f"{where}: {_show(f.field)} holds true/false; got {given}")
    elif kind == "list[string]" and not isinstance(v, str):
        raise FilterError(f"{where}: {_show(f.field)} holds lists of strings; match one string, got {given}")
    elif kind == "list[number]" and not _is_number(v):
        raise FilterError(f"{where}: {_show(f.field)} holds lists of numbers; match one number, got {given}")


def merge_kinds(many: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The field types of several shards together (a field typed differently in two shards is ``mixed``)."""
    out: dict[str, str] = {}
    for kinds in many:
        for name, kind in kinds.items():
            out[name] = kind if out.get(name, kind) == kind else "mixed"
    return out
