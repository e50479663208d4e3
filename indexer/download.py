"""Downloading public BEIR dataset zips (for users with internet; nothing here runs in tests but on loopback)."""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path, PurePosixPath

from twostage.indexer.atomic import atomic_directory
from twostage.indexer.errors import ConfigError, DownloadError

logger = logging.getLogger(__name__)

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _fetch(url: str, part: Path, timeout: float, show_progress: bool) -> str:
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as fh:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=Path(url).name, disable=not show_progress) as bar:
                while block := resp.read(1 << 20):
                    fh.write(block)
                    digest.update(block)
                    bar.update(len(block))
    except urllib.error.HTTPError as exc:
        raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}; check the dataset name") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(f"{url}: cannot download ({reason}); download the zip elsewhere, unzip it and pass "
                            "the directory with --data") from None
    return digest.hexdigest()


def _extract(zip_path: Path, name: str, into: Path) -> None:
    """Unpack the dataset's files into ``into``, refusing paths that leave it."""
    try:
        with zipfile.ZipFile(zip_path) as zf:
            members = [m for m in zf.infolist() if not m.is_dir()]
            for m in members:
                p = PurePosixPath(m.filename)
                if p.is_absolute() or ".." in p.parts:
                    raise DownloadError(f"{zip_path}: unsafe path {m.filename!r} in the archive; not extracted")
            prefix = f"{name}/" if any(m.filename.startswith(f"{name}/") for m in members) else ""
            if not any(m.filename == f"{prefix}corpus.jsonl" for m in members):
                raise DownloadError(f"{zip_path}: no {prefix}corpus.jsonl inside; not a BEIR dataset zip")
            for m in members:
                if not m.filename.startswith(prefix):
                    continue
                dest = into / m.filename[len(prefix):]
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(m) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
    except zipfile.BadZipFile:
        raise DownloadError(f"{zip_path}: not a valid zip file (truncated download?); try again") from None


def download_beir(
    name: str,
    dest: str | Path = "datasets",
    *,
    base_url: str | None = None,
    sha256: str | None = None,
    overwrite: bool = False,
    timeout: float = 60.0,
    show_progress: bool = False,
) -> Path:
    """Download ``{base_url}/{name}.zip`` and unpack it as ``dest/name``; returns that directory.

    An existing ``dest/name`` with a ``corpus.jsonl`` is returned as is unless ``overwrite``. The
    directory appears only once fully unpacked (atomic rename); a failed download leaves nothing behind.
    """
    if not _NAME.match(name):
        raise ConfigError(f"dataset name {name!r} is not a plain name like 'scifact' or 'nfcorpus'")
    dest = Path(dest)
    target = dest / name
    if (target / "corpus.jsonl").is_file() and not overwrite:
        logger.info("%s already exists; not downloading", target)
        return target
    url = f"{(base_url or BEIR_URL).rstrip('/')}/{name}.zip"
    dest.mkdir(parents=True, exist_ok=True)
    part = dest / f".{name}.zip.part-{uuid.uuid4().hex[:8]}"
    try:
        logger.info("downloading %s", url)
        digest = _fetch(url, part, timeout, show_progress)
        if sha256 and digest != sha256.lower():
            raise DownloadError(f"{url}: sha256 {digest} does not match the expected {sha256}; not unpacked")
        with atomic_directory(target) as tmp:
            _extract(part, name, tmp)
    finally:
        part.unlink(missing_ok=True)
    return target
