"""Ray, optional: one place that imports it, connects, and says how to install it when it is missing."""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
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
        # "local": a new instance even when `ray start` left a cluster's address on this machine
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return ray


LAUNCHERS = ("cluster_utils", "ray-start")


class LocalCluster:
    """A Ray cluster of separate nodes on this machine: a head and ``workers`` worker nodes, each its own raylet
    with its own CPUs and object store, for tests and benchmarks of what a real cluster does: placement over
    nodes, a node lost.

    ``launcher``: ``"cluster_utils"`` (Ray's test helper, in this process) or ``"ray-start"`` (``ray start --head``
    and one ``ray start --address`` per worker, as separate process trees, the way machines join a real cluster;
    token authentication with a token made for this cluster, set in this process's environment so that
    ``ray.init(address=cluster.address)`` joins it). A real cluster is started with ``ray start`` on each machine
    (docs/serving.md).
    """

    def __init__(self, workers: int = 2, cpus_per_node: float = 1.0, object_store_mb: int = 128,
                 launcher: str = "cluster_utils") -> None:
        require_ray()
        if workers < 0:
            raise ConfigError(f"workers must be >= 0, got {workers}")
        if launcher not in LAUNCHERS:
            raise ConfigError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        nodes = _RayStart if launcher == "ray-start" else _ClusterUtils
        self._started = nodes(workers, cpus_per_node, object_store_mb << 20)

    @property
    def address(self) -> str:
        return self._started.address

    def worker_node_id(self, i: int) -> str:
        return self._started.node_ids[i]

    def kill_worker(self, i: int) -> list[int]:
        """SIGKILL worker node ``i``: its raylet and every process under it (its Ray workers, the shard actors);
        the pids killed."""
        root = self._started.worker_root(i)
        pids = [*descendants(root), root]
        _signal(pids, signal.SIGKILL)
        return pids

    def shutdown(self) -> None:
        """Stop every node (and this process's connection to them first)."""
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self._started.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class _ClusterUtils:
    """Ray's ``cluster_utils``: a head and the workers started from this process."""

    def __init__(self, workers: int, cpus: float, memory: int) -> None:
        from ray.cluster_utils import Cluster

        head = {"num_cpus": cpus, "include_dashboard": False, "object_store_memory": memory}
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.workers = [self.cluster.add_node(num_cpus=cpus, object_store_memory=memory) for _ in range(workers)]
        self.cluster.wait_for_nodes()
        self.address = str(self.cluster.address)
        self.node_ids = [str(w.node_id) for w in self.workers]

    def worker_root(self, i: int) -> int:
        """The pid of worker ``i``'s raylet."""
        return int(self.workers[i].all_processes["raylet"][0].process.pid)

    def stop(self) -> None:
        self.cluster.shutdown()


_MARK = "twostage_local_worker_"


class _RayStart:
    """``ray start --head --block`` and ``ray start --address --block`` per worker, each in its own session; the
    node ids read from the cluster once every node has joined."""

    def __init__(self, workers: int, cpus: float, memory: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="twostage-ray-"))
        token = self.dir / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        # every node and the driver must present the same token (ray start on one machine refuses an
        # unauthenticated second raylet: InvalidAuthToken)
        self.saved_env = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
        _auth_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        ray_exe = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray") or "ray"
        common = [f"--num-cpus={cpus:g}", f"--object-store-memory={memory}", "--disable-usage-stats", "--block"]
        # its own temp dir: `ray start` records the cluster's address there (not in /tmp/ray, where any plain
        # ray.init() on this machine would find it and join this cluster instead of starting its own)
        commands = [[ray_exe, "start", "--head", f"--port={port}", "--include-dashboard=false",
                     f"--temp-dir={self.dir / 'ray'}", *common]]
        # a marker resource a worker: how its node id is found once it has joined
        commands += [[ray_exe, "start", f"--address={self.address}", f'--resources={{"{_MARK}{i}": 1}}', *common]
                     for i in range(workers)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []
        try:
            for n, cmd in enumerate(commands):
                self.logs.append(open(self.dir / f"node{n}.log", "wb"))  # noqa: SIM115 - closed by stop()
                self.procs.append(subprocess.Popen(cmd, stdout=self.logs[-1], stderr=subprocess.STDOUT,
                                                   start_new_session=True))
                _wait_started(self.procs[-1], self.dir / f"node{n}.log")  # one at a time: together they time out
            self.node_ids = self._node_ids(workers, time.time() + 120)
        except BaseException:
            self.stop(keep_logs=True)
            raise

    def _node_ids(self, workers: int, deadline: float) -> list[str]:
        """The worker nodes' ids, in the order they were started (found by their marker resources)."""
        probe = (f"import json, ray; ray.init(address={self.address!r}, logging_level='ERROR'); "
                 "print(json.dumps([[n['NodeID'], sorted(n['Resources']), n['Alive']] for n in ray.nodes()]))")
        while True:
            out = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True)
            nodes = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout else []
            marked = {r: node for node, resources, ok in nodes if ok for r in resources if r.startswith(_MARK)}
            if len(marked) == workers:
                return [marked[f"{_MARK}{i}"] for i in range(workers)]
            if time.time() > deadline:
                raise ConfigError(f"the local Ray cluster did not come up: {len(marked)} of {workers} worker nodes "
                                  f"after 120 s; see the logs in {self.dir}")
            time.sleep(1)

    def worker_root(self, i: int) -> int:
        """The pid of worker ``i``'s ``ray start`` (its raylet and Ray workers run under it)."""
        return self.procs[i + 1].pid

    def stop(self, keep_logs: bool = False) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                _signal([*descendants(proc.pid), proc.pid], signal.SIGTERM)
        deadline = time.time() + 15
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except Exception:  # noqa: BLE001 - it did not stop in time: kill what is left
                _signal([*descendants(proc.pid), proc.pid], signal.SIGKILL)
                proc.wait()
        for log in self.logs:
            log.close()
        _auth_env(self.saved_env)
        if not keep_logs:
            shutil.rmtree(self.dir, ignore_errors=True)


def _auth_env(values: dict[str, str | None]) -> None:
    """Set (or, for None, unset) Ray's authentication variables in this process, and make an imported Ray read
    them again: Ray caches its configuration and token when it is imported."""
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if "ray" in sys.modules:
        from ray._private.authentication.authentication_token_setup import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def _wait_started(proc: Any, log: Path, seconds: float = 180) -> None:
    """Until ``ray start --block`` says its node is up (it then blocks), or a clear error."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise ConfigError(f"ray start exited with status {proc.returncode}; see {log}")
        if b"block forever" in log.read_bytes():
            return
        time.sleep(0.2)
    raise ConfigError(f"a Ray node did not start in {seconds:g} s; see {log}")


def _signal(pids: list[int], sig: int) -> None:

    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (Linux /proc), children first."""
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
