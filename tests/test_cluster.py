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


@pytest.mark.slow
def test_ray_replicas_answer_exactly_as_one_engine_on_a_corpus_of_several_languages(cluster, tmp_path, models):
    """#84: the queries' analysis in Ray mode is the shards' own (the corpus's languages included). Before, it was
    one of the engine's language alone, which read "ADAR1 binds to Dicer to cleave pre-miRNA." (a SciFact test
    query) as Latin: with a retriever whose card says English, that query was searched by BM25 alone."""
    import shutil

    from twostage import Document, SearchEngine
    from twostage.indexer.beir import BeirDataset

    retriever, _ = models
    english = tmp_path / "bi"
    shutil.copytree(retriever, english)
    (english / "README.md").write_text("---\nlanguage: en\n---\n# a tiny English bi-encoder\n")
    corpus = list(BeirDataset(SAMPLE).corpus) + [
        Document("x-adar", "ADAR1 binds to Dicer to cleave pre-miRNA and edits double-stranded RNA.", "ADAR1"),
        Document("x-azt", "N348I mutations cause resistance to zidovudine (AZT) in HIV reverse transcriptase."),
        *[Document(f"x-de{i}", f"Der Rhein fließt durch viele Städte und mündet in die Nordsee, Abschnitt {i}.")
          for i in range(6)],
        *[Document(f"x-zh{i}", f"长江是中国最长的河流，流经许多城市，第{i}段。") for i in range(6)]]
    single = SearchEngine.build(corpus, tmp_path / "one", retriever=str(english), backend="flat", passage_words=0)
    local = ShardedEngine.build(corpus, tmp_path / "e", shards=2, retriever=str(english), backend="flat")
    remote = ShardedEngine.load(local.root, ray=True, replicas=1)
    try:
        assert remote.analyzer().config == single.analyzer().config and remote.language == single.language
        queries = [*QUERIES[:12], "ADAR1 binds to Dicer to cleave pre-miRNA.",
                   "N348I mutations cause resistance to zidovudine (AZT).", "Wohin fließt der Rhein?", "中国最长的河流"]
        for q in queries:
            for stage in ("bm25", "hybrid"):
                got, want = remote.ranked(q, 10, first_stage=stage, rerank=False), single.ranked(
                    q, 10, first_stage=stage, rerank=False)
                assert list(got.ids) == list(want.ids) and got.scores.tolist() == want.scores.tolist(), (q, stage)
    finally:
        remote.close()
        local.close()
        single.close()


def test_replicas_need_ray(tmp_path):
    with pytest.raises(ConfigError, match="replicas need ray=True"):
        ShardedEngine.load(tmp_path, replicas=2)


def test_open_engine_checks_replicas_and_a_single_engine_refuses_them(tmp_path):
    from twostage.engine.door import open_engine

    with pytest.raises(ConfigError, match="--replicas must be an integer >= 1"):
        open_engine(tmp_path, replicas=0)
    with pytest.raises(ConfigError, match="serves the shards of a sharded engine"):
        open_engine(tmp_path, replicas=2)


class _FakeRay:
    """Just enough of Ray for ReplicatedShards: actors that die on a lost node, or for their shard, on opening."""

    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        class RayError(Exception):
            pass

        class GetTimeoutError(RayError):
            pass

        class RayActorError(RayError):
            pass

        class ActorUnavailableError(RayError):
            pass

    def __init__(self, lost: set[str], broken: bool = False) -> None:
        self.lost, self.broken, self.placed = lost, broken, []

    def nodes(self):
        return [{"NodeID": n, "Alive": True, "Resources": {"CPU": 1}} for n in ("a", "b", "c")]

    def get(self, ref, timeout=None):
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if isinstance(ref, Exception):
            raise ref
        return ref

    def kill(self, actor):
        pass


def _fake_shards(fake: _FakeRay, monkeypatch):
    from twostage.engine import replicas as rep

    class Actor:
        def __init__(self, node):
            self.node = node

        @property
        def size(self):
            class Call:
                @staticmethod
                def remote(node=self.node):
                    if fake.broken:
                        return fake.exceptions.RayActorError("ActorDiedError: an error raised in its creation task: "
                                                             "IndexFormatError: damaged")
                    if node in fake.lost:
                        return fake.exceptions.RayActorError("ActorDiedError: The actor died unexpectedly")
                    return 205
            return Call()

    def start(self, shard, node):
        fake.placed.append(node)
        return Actor(node), node

    monkeypatch.setattr(rep.ReplicatedShards, "start", start)
    monkeypatch.setattr(rep.time, "sleep", lambda s: None)
    return rep.ReplicatedShards


def test_a_replica_placed_on_a_just_lost_node_is_opened_elsewhere(monkeypatch):
    """Ray still lists a node it has lost: the replica placed there dies while opening, and is started again on
    another live node instead of failing the load (#61, the cluster script's write phase)."""
    fake = _FakeRay(lost={"b"})
    shards = _fake_shards(fake, monkeypatch)(fake, object, [("s0", "v1"), ("s1", "v1")], verify=False, replicas=2)
    assert all(n != "b" for row in shards.nodes for n in row) and shards.health() == [2, 2]
    assert "b" in fake.placed and any("restarted" in what for _, what in shards.events)


def test_a_damaged_shard_still_fails_the_load_at_once(monkeypatch):
    from twostage.indexer.errors import IndexFormatError

    fake = _FakeRay(lost=set(), broken=True)
    with pytest.raises(IndexFormatError, match="could not be opened by its Ray actor"):
        _fake_shards(fake, monkeypatch)(fake, object, [("s0", "v1")], verify=False, replicas=2)
    assert len(fake.placed) == 2  # not started again: the shard itself is bad


def test_a_lost_replica_is_replaced_away_from_the_node_it_was_lost_on(monkeypatch):
    """Ray lists a lost node as alive for a while: the replacement must not be started there again (the cluster
    script's node-lost phase once left a replica unreplaced because of it)."""
    fake = _FakeRay(lost=set())
    shards = _fake_shards(fake, monkeypatch)(fake, object, [("s0", "v1")], verify=False, replicas=2)
    gone, other = shards.nodes[0]
    fake.lost.add(gone)
    shards.actors[0][0] = None
    fake.placed.clear()
    shards.replace(0, 0)
    assert shards.health() == [2] and shards.nodes[0][0] not in {gone, other}
    assert fake.placed == [shards.nodes[0][0]]  # the first try already went elsewhere
