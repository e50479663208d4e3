"""The one way in: an engine directory opened as what it is, a single engine or a sharded one.

The command line, the HTTP server and the harness all open engines here, so each of them serves and measures
sharded engines (local shards or Ray actors) the same way as single ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from twostage.engine.on_disk import SHARDED_FORMAT, WHAT, format_of
from twostage.engine.search_engine import SearchEngine
from twostage.engine.settings import check_replicas
from twostage.indexer.errors import ConfigError
from twostage.indexer.versions import current_version

if TYPE_CHECKING:
    from twostage.engine.sharded import ShardedEngine


def open_engine(path: str | Path, *, verify: bool = True, ray: bool = False, device: str = "auto",
                address: str | None = None, replicas: int = 1) -> SearchEngine | ShardedEngine:
    """The engine at ``path``: a :class:`ShardedEngine` when its live version is a sharded manifest, else a
    :class:`SearchEngine` (``ray``, ``address`` and ``replicas`` apply to sharded engines only: an ``address``
    or more than one replica implies ``ray``; ``device`` to single engines: a sharded one runs its models on the
    CPU).

    Raises:
        IndexFormatError: no engine at ``path``, or a part of it is missing, altered or of a newer format.
        ConfigError: a device or replica count that cannot be used here.
    """
    ray = ray or address is not None or check_replicas(replicas) > 1
    root = Path(path)
    if (root / "CURRENT").is_file() and format_of(current_version(root, WHAT)) == SHARDED_FORMAT:
        from twostage.engine.sharded import ShardedEngine
        from twostage.models.device import resolve_device

        if resolve_device(device) != "cpu" and device != "auto":
            raise ConfigError(f"{root}: a sharded engine runs its models on the CPU; leave out --device {device}")
        return ShardedEngine.load(root, verify=verify, ray=ray, address=address, replicas=replicas)
    if ray:
        raise ConfigError(f"{root}: --ray serves the shards of a sharded engine; this is a single engine")
    return SearchEngine.load(root, verify=verify, device=device)


__all__ = ["open_engine"]
