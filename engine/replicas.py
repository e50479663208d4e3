"""The shards of a sharded engine on a Ray cluster: each held by R actors spread over the nodes, calls balanced
over the live ones, a lost one replaced.

:class:`ReplicatedShards` starts ``replicas`` actors per shard, each opening the shard at the version the sharded
engine pins, placed on different nodes where the cluster has enough (node affinity, soft: a replica still starts
when its node is gone). A call (one per shard, e.g. ``candidates``) goes to one live replica of each shard, in
turn, so the load is balanced. When a replica's actor or node dies, or it does not answer within
``call_timeout`` seconds, the call is sent again to another live replica of that shard: a search fails only when
no replica of a shard is left, with one error naming the shard. A dead replica is replaced in the background by a
new actor on a live node that holds no other replica of the shard, opening the same pinned version; so every
search, answered by whichever replicas, merges shards of that one version only.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

from twostage.indexer.errors import ConfigError, IndexFormatError, ShardUnavailableError

logger = logging.getLogger(__name__)


class ReplicatedShards:
    """``replicas`` Ray actors (checked by :func:`twostage.engine.settings.check_replicas`) for each (shard root, version) in ``specs``;
    ``actor_class.options(...).remote(root, version, verify)`` starts one (the caller's Ray actor class)."""

    def __init__(self, ray: Any, actor_class: Any, specs: list[tuple[str, str]], *, verify: bool, replicas: int = 1,
                 num_cpus: float = 1.0, call_timeout: float = 30.0) -> None:
        self.ray, self.actor_class, self.specs, self.verify = ray, actor_class, specs, verify
        self.num_cpus, self.call_timeout, self.count = num_cpus, call_timeout, replicas
        self.lock = threading.Lock()
        self.turn = itertools.count()
        self.closed = False
        self.events: list[tuple[float, str]] = []  # (time, what): replicas lost and replaced, for reports
        self.actors: list[list[Any]] = []
        self.nodes: list[list[str | None]] = []  # the node each replica was placed on
        nodes = self.live_nodes()
        for s in range(len(specs)):
            row = [self.start(s, nodes[(s + r) % len(nodes)] if nodes else None) for r in range(replicas)]
            self.actors.append([a for a, _ in row])
            self.nodes.append([n for _, n in row])
        self.check_open()

    # ---- placing -------------------------------------------------------------------------------
    def live_nodes(self) -> list[str]:
        """The ids of the cluster's live nodes with CPUs, in a fixed order."""
        return sorted(n["NodeID"] for n in self.ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU"))

    def start(self, shard: int, node: str | None) -> tuple[Any, str | None]:
        """A new actor for ``shard`` on ``node`` (soft affinity: elsewhere when that node cannot take it)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_concurrency": 4}
        if node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
        root, version = self.specs[shard]
        return self.actor_class.options(**options).remote(root, version, self.verify), node

    def check_open(self, timeout: float = 300.0, replace_for: float = 60.0) -> None:
        """Wait until every replica has opened its shard (a damaged shard, or one no node has room for: one error
        naming it). A replica whose actor died for another reason than its shard (placed on a node that was just
        lost, before Ray marked it dead) is started again on another live node, for up to ``replace_for``
        seconds."""
        deadline = time.monotonic() + timeout
        for s, row in enumerate(self.actors):
            for r in range(len(row)):
                avoid: set[str] = set()
                started = time.monotonic()
                while True:
                    try:
                        self.ray.get(self.actors[s][r].size.remote(), timeout=max(1.0, deadline - time.monotonic()))
                        break
                    except self.ray.exceptions.GetTimeoutError:
                        self.close()
                        raise ConfigError(f"{self.specs[s][0]}: a replica did not start within {timeout:.0f} s: no "
                                          f"node has {self.num_cpus:g} free CPUs for it; lower cpus_per_shard or the "
                                          "replicas, or add nodes") from None
                    except self.ray.exceptions.RayError as exc:
                        cause = next((line for line in reversed(str(exc).splitlines()) if "Error" in line), str(exc))
                        if "creation task" in str(exc) or time.monotonic() - started > replace_for:
                            self.close()
                            raise IndexFormatError(f"{self.specs[s][0]}: a shard could not be opened by its Ray "
                                                   f"actor: {cause.strip()}") from None
                        placed = self.nodes[s][r]
                        if placed is not None:
                            avoid.add(placed)
                        self.events.append((time.time(), f"restarted shard {s} replica {r} while opening "
                                                         f"({type(exc).__name__})"))
                        logger.warning("shard %s replica %d died while opening (%s); starting it on another node",
                                       self.specs[s][0], r, type(exc).__name__)
                        time.sleep(1.0)
                        nodes = [n for n in self.live_nodes() if n not in avoid] or self.live_nodes()
                        self.actors[s][r], self.nodes[s][r] = self.start(s, nodes[(s + r) % len(nodes)] if nodes
                                                                         else None)

    # ---- calling -------------------------------------------------------------------------------
    def call(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on one live replica of every shard (sent together), each shard's answer in shard
        order; a replica that fails or does not answer in time is left for the next live one."""
        turn = next(self.turn)
        sent = [self.send(s, turn, method, args, set()) for s in range(len(self.specs))]
        out = []
        for s, (replica, ref) in enumerate(sent):
            tried = {replica}
            while True:
                try:
                    out.append(self.ray.get(ref, timeout=self.call_timeout))
                    break
                except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError,
                        self.ray.exceptions.GetTimeoutError) as exc:
                    if not isinstance(exc, self.ray.exceptions.GetTimeoutError):
                        self.lost(s, replica, type(exc).__name__)
                    replica, ref = self.send(s, turn, method, args, tried)
                    tried.add(replica)
        return out

    def send(self, shard: int, turn: int, method: str, args: tuple[Any, ...], tried: set[int]) -> tuple[int, Any]:
        with self.lock:
            live = [r for r, a in enumerate(self.actors[shard]) if a is not None and r not in tried]
        if not live:
            raise ShardUnavailableError(f"shard {self.specs[shard][0]}: no live replica answered ({self.count} "
                                        "held it); its replacements are starting, try again shortly")
        replica = live[turn % len(live)]
        return replica, getattr(self.actors[shard][replica], method).remote(*args)

    # ---- losing and replacing ------------------------------------------------------------------
    def lost(self, shard: int, replica: int, why: str) -> None:
        """Mark a replica dead and start its replacement in the background (once)."""
        with self.lock:
            if self.closed or self.actors[shard][replica] is None:
                return
            self.actors[shard][replica] = None
            self.events.append((time.time(), f"lost shard {shard} replica {replica} ({why})"))
        logger.warning("shard %s replica %d lost (%s); starting a replacement", self.specs[shard][0], replica, why)
        threading.Thread(target=self.replace, args=(shard, replica), daemon=True).start()

    def replace(self, shard: int, replica: int, attempts: int = 20) -> None:
        """Start a replica again, first on a live node that neither holds another replica of the shard nor is the
        node the lost one ran on (Ray may list a lost node as alive for a while), then anywhere live."""
        with self.lock:
            avoid = {self.nodes[shard][replica]} - {None}
        for _ in range(attempts):
            with self.lock:
                if self.closed:
                    return
                taken = {n for r, n in enumerate(self.nodes[shard]) if r != replica and
                         self.actors[shard][r] is not None}
            nodes = self.live_nodes()
            free = ([n for n in nodes if n not in taken and n not in avoid] or
                    [n for n in nodes if n not in avoid] or nodes)
            actor, node = self.start(shard, free[(shard + replica) % len(free)] if free else None)
            try:
                self.ray.get(actor.size.remote(), timeout=120)
            except self.ray.exceptions.RayError as exc:
                logger.warning("replacement for shard %d replica %d failed (%s); trying again", shard, replica,
                               type(exc).__name__)
                if node is not None:
                    avoid.add(node)
                time.sleep(1.0)
                continue
            with self.lock:
                if self.closed:
                    self.ray.kill(actor)
                    return
                self.actors[shard][replica], self.nodes[shard][replica] = actor, node
                self.events.append((time.time(), f"replaced shard {shard} replica {replica}"))
            return
        logger.error("shard %d replica %d could not be replaced after %d attempts", shard, replica, attempts)

    def health(self) -> list[int]:
        """How many live replicas each shard has now."""
        with self.lock:
            return [sum(a is not None for a in row) for row in self.actors]

    def placement(self) -> list[list[str | None]]:
        """The node each replica of each shard was placed on (None: a dead replica)."""
        with self.lock:
            return [[n if a is not None else None for a, n in zip(row, nodes)]
                    for row, nodes in zip(self.actors, self.nodes)]

    def close(self) -> None:
        """Stop every replica (no replacement starts after this)."""
        with self.lock:
            self.closed = True
            actors = [a for row in self.actors for a in row if a is not None]
            self.actors = [[None] * len(row) for row in self.actors]
        for a in actors:
            self.ray.kill(a)
