"""Ray, optional: one place that imports it, connects, and says how to install it when it is missing."""

from __future__ import annotations

import logging
from typing import Any

from twostage.indexer.errors import MissingDependencyError

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'twostage-search[ray]'"


def require_ray() -> Any:
    """The ``ray`` module, or a MissingDependencyError telling how to install the extra."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(f"this feature runs on Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def connect(address: str | None = None, num_cpus: int | None = None) -> Any:
    """Join the cluster at ``address`` ("auto", "ray://host:10001"), or start a local Ray (``num_cpus``).

    Reuses the connection when Ray is already initialised (e.g. by the caller or a test fixture).
    """
    ray = require_ray()
    if ray.is_initialized():
        return ray
    if address:
        logger.info("connecting to the Ray cluster at %s", address)
        ray.init(address=address, log_to_driver=False)
    else:
        logger.info("starting a local Ray instance (%s CPUs)", num_cpus or "all")
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return ray
