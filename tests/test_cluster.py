"""A sharded engine on a Ray cluster of several nodes: replicas spread over nodes answer as one engine, a lost node
costs no query, and its replicas come back on the live nodes at the same version."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from twostage.engine.sharded import ShardedEngine
from twostage.indexer.errors import ConfigError

SAMPLE = Path(__file__).parent.parent / "data" / "sample"
QUERIES = [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_ray_start_launcher_joins_separate_nodes_and_stops_them():
    """`ray start --head` + `ray start --address` processes (token auth made for the cluster). First in this file:
    it runs before the module's cluster connects this process to Ray."""
    pytest.importorskip("ray")
    import os
    import subprocess
    import sys

    from twostage.indexer.ray_util import LocalCluster, descendants

    before = os.environ.get("RAY_AUTH_MODE")
    with pytest.raises(ConfigError, match="launcher"):
        LocalCluster(workers=1, launcher="ray-up")
    c = LocalCluster(workers=2, cpus_per_node=1, launcher="ray-start")
    try:
        assert os.environ["RAY_AUTH_MODE"] == "token"
        ids = [c.worker_node_id(0), c.worker_node_id(1)]
        probe = (f"import json, ray; ray.init(address={c.address!r}, logging_level='ERROR'); "
                 "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))")
        alive = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        nodes = json.loads(alive.stdout.strip().splitlines()[-1])
        assert len(nodes) == 3 and set(ids) <= set(nodes) and ids[0] != ids[1]
        roots = [p.pid for p in c._started.procs]
        killed = c.kill_worker(0)
        assert roots[1] in killed and len(killed) > 1  # the node's `ray start` and the raylet under it
        time.sleep(1)
        assert not [pid for pid in killed if Path(f"/proc/{pid}").exists()
                    and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]
        others = [*descendants(roots[2]), roots[2]]
    finally:
        c.shutdown()
    assert all(p.poll() is not None for p in c._started.procs)
    assert not [pid for pid in others if Path(f"/proc/{pid}").exists()
                and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]
    assert os.environ.get("RAY_AUTH_MODE") == before and not c._started.dir.exists()


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    import ray

    from twostage.indexer.ray_util import LocalCluster

    with LocalCluster(workers=2, cpus_per_node=1) as c:
        ray.init(address=c.address, log_to_driver=False)
        try:
            yield c
        finally:
            ray.shutdown()


@pytest.mark.slow
def test_replicas_spread_answer_as_local_shards_and_survive_a_lost_node(cluster, tmp_path, models):
    import ray

    retriever, _ = models
    local = ShardedEngine.build(SAMPLE, tmp_path / "e", shards=2, retriever=retriever, backend="flat")
    remote = ShardedEngine.load(local.root, ray=True, replicas=2)  # 4 actors on 3 one-CPU nodes: 0.25 CPU each
    try:
        assert len(ray.nodes()) == 3 and [s["live_replicas"] for s in remote.info()["shards"]] == [2, 2]
        for row in remote.replicas.placement():
            assert len(set(row)) == 2, "a shard's two replicas share a node"
        want = {q: local.ranked(q, 10, first_stage="hybrid", rerank=False) for q in QUERIES[:8]}
        for q in QUERIES[:8]:  # every replica is used (in turn): each answer equals the local shards'
            got = remote.ranked(q, 10, first_stage="hybrid", rerank=False)
            assert list(got.ids) == list(want[q].ids) and got.scores.tolist() == want[q].scores.tolist()
        killed = cluster.kill_worker(0)
        assert killed
        failures, answered = 0, 0
        deadline = time.time() + 90
        while time.time() < deadline:
            q = QUERIES[answered % 8]
            try:
                got = remote.ranked(q, 10, first_stage="hybrid", rerank=False)
                assert list(got.ids) == list(want[q].ids)
                answered += 1
            except Exception:  # noqa: BLE001 - counted: the assertion below says there were none
                failures += 1
            if answered >= 16 and remote.replicas.health() == [2, 2]:
                break
        assert failures == 0 and answered >= 16
        assert remote.replicas.health() == [2, 2], remote.replicas.events  # replaced on live nodes
        dead = cluster.worker_node_id(0)
        assert all(dead not in row for row in remote.replicas.placement())
    finally:
        remote.close()
        local.close()


def test_replicas_need_ray(tmp_path):
    with pytest.raises(ConfigError, match="replicas need ray=True"):
        ShardedEngine.load(tmp_path, replicas=2)


def test_open_engine_checks_replicas_and_a_single_engine_refuses_them(tmp_path):
    from twostage.engine.door import open_engine

    with pytest.raises(ConfigError, match="--replicas must be an integer >= 1"):
        open_engine(tmp_path, replicas=0)
    with pytest.raises(ConfigError, match="serves the shards of a sharded engine"):
        open_engine(tmp_path, replicas=2)
