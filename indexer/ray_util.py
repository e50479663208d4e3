"""Ray, optional: one place that imports it, connects, and says how to install it when it is missing."""

from __future__ import annotations

import logging
from typing import Any

from twostage.indexer.errors import ConfigError, MissingDependencyError

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


class LocalCluster:
    """A Ray cluster of separate nodes on this machine: a head and ``workers`` worker nodes, each its own raylet
    with its own CPUs and object store (Ray's ``cluster_utils``), for tests and benchmarks of what a real cluster
    does: placement over nodes, a node lost. A real cluster is started with ``ray start`` on each machine
    (docs/serving.md)."""

    def __init__(self, workers: int = 2, cpus_per_node: float = 1.0, object_store_mb: int = 128) -> None:
        require_ray()
        from ray.cluster_utils import Cluster

        if workers < 0:
            raise ConfigError(f"workers must be >= 0, got {workers}")
        memory = object_store_mb << 20
        head = {"num_cpus": cpus_per_node, "include_dashboard": False, "object_store_memory": memory}
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.workers = [self.cluster.add_node(num_cpus=cpus_per_node, object_store_memory=memory)
                        for _ in range(workers)]
        self.cluster.wait_for_nodes()

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def worker_node_id(self, i: int) -> str:
        return str(self.workers[i].node_id)

    def kill_worker(self, i: int) -> list[int]:
        """SIGKILL worker node ``i``: its raylet and every process under it (its Ray workers, the shard actors);
        the pids killed."""
        import os
        import signal

        raylet = self.workers[i].all_processes["raylet"][0].process.pid
        pids = [*_descendants(raylet), raylet]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def shutdown(self) -> None:
        """Stop every node (and this process's connection to them first)."""
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (Linux /proc), children first."""
    from pathlib import Path

    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out[::-1]
