"""The languages a model says it knows, from its model card.

A Hugging Face model card (``README.md``) starts with YAML front matter whose ``language`` field lists ISO 639-1
codes (``language: en``, or a list); ``multilingual`` or no field at all means "not said". A model trained here
records its base model's languages in ``twostage.json`` (``languages``), or names its base, whose card is read.
The card is untrusted input: its first 64 kB are read, parsed with YAML's safe loader, and anything unexpected
reads as "not said".
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

CARD_BYTES = 64 * 1024


def model_languages(path: str | Path, depth: int = 2) -> tuple[str, ...] | None:
    """The language codes the model at ``path`` covers, or None when its card does not say (or says
    multilingual): read as covering every language."""
    path = Path(path)
    said = _card_languages(path / "README.md")
    if said is not None or depth <= 0:
        return said or None
    own = _twostage_json(path)
    recorded = own.get("languages")
    if isinstance(recorded, list) and recorded and all(isinstance(c, str) for c in recorded):
        return tuple(recorded)
    training = own.get("training")
    for base in (own.get("base"), training.get("base") if isinstance(training, dict) else None):
        if isinstance(base, str) and base and base != str(path):
            found = base_languages(base, depth - 1)
            if found is not None:
                return found
    return None


def base_languages(base: str, depth: int = 1) -> tuple[str, ...] | None:
    """:func:`model_languages` of a base model given by name or path, when it is on this machine."""
    found = _local_base(base)
    return model_languages(found, depth) if found is not None else None


def _card_languages(card: Path) -> tuple[str, ...] | None:
    """The card's ``language`` codes; () when it says multilingual; None when there is no card or no field."""
    try:
        with open(card, "rb") as f:
            head = f.read(CARD_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    from twostage.indexer.files import front_matter

    value = front_matter(head, str(card))[0].get("language")
    codes = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    if not codes or not all(isinstance(c, str) and 0 < len(c) <= 16 for c in codes):
        return None
    if any(c.lower() in ("multilingual", "mul", "xx") for c in codes):
        return ()
    return tuple(dict.fromkeys(c.lower().split("-")[0].split("_")[0] for c in codes))


def _twostage_json(path: Path) -> dict[str, object]:
    try:
        with open(path / "twostage.json", "rb") as f:
            data = json.loads(f.read(CARD_BYTES * 4))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _local_base(name: str) -> Path | None:
    """A base model's directory when it is on this machine: a path, or twostage's model cache (never the hub)."""
    candidate = Path(name).expanduser()
    if candidate.is_dir():
        return candidate
    try:
        from twostage.models.weights import cache_dir
    except ImportError:  # pragma: no cover
        return None
    cached = cache_dir() / "models" / name.split("/")[-1]
    return cached if cached.is_dir() else None
