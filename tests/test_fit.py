"""The one training loop (twostage.models.fit) as both models use it."""

import json

import pytest
import torch

from twostage.indexer.beir import BeirDataset
from twostage.models.fit import NO_DECAY, linear_schedule
from twostage.reranker.cross_encoder import CrossEncoder
from twostage.reranker.training import RerankerConfig, RerankerTask, groups_from_split, train_reranker
from twostage.retriever.biencoder import BiEncoder
from twostage.retriever.trainer import RetrieverTask, TrainConfig, train
from twostage.retriever.training_data import pairs_from_qrels


def _retriever_run(tiny_bert_dir, sample_dir):
    split = BeirDataset(sample_dir).split("train")
    sets = [pairs_from_qrels(BeirDataset(sample_dir).corpus, split.queries, split.qrels)]
    config = TrainConfig(epochs=2, batch_size=8, lr=1e-3, seed=3, checkpoint_every=2, bf16=False)
    return RetrieverTask, lambda: BiEncoder.load(tiny_bert_dir), lambda model, out: train(model, sets, config, out)


def _reranker_run(tiny_bert_dir, sample_dir):
    config = RerankerConfig(epochs=2, groups_per_batch=8, negatives=2, lr=1e-3, max_length=48, checkpoint_every=2,
                            mine_from=("bm25",), bf16=False)
    groups = groups_from_split(BeirDataset(sample_dir), "train", config)

    def model():  # the new head is drawn from torch's RNG: the same draw for every run
        torch.manual_seed(0)
        return CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)

    return RerankerTask, model, lambda m, out: train_reranker(m, groups, config, out)


@pytest.mark.parametrize("kind", ["retriever", "reranker"])
def test_a_killed_run_resumes_to_the_same_weights(kind, tmp_path, tiny_bert_dir, sample_dir, monkeypatch):
    task_type, fresh, run = (_retriever_run if kind == "retriever" else _reranker_run)(tiny_bert_dir, sample_dir)
    straight = run(fresh(), tmp_path / "straight")
    per_epoch = straight.steps // 2
    kill_at = per_epoch + 3  # the third step of epoch 2: one step past the checkpoint at every 2 steps
    calls, real = {"n": 0}, task_type.loss

    def crashing(self, batch):
        calls["n"] += 1
        if calls["n"] == kill_at:
            raise KeyboardInterrupt("simulated kill")
        return real(self, batch)

    monkeypatch.setattr(task_type, "loss", crashing)
    with pytest.raises(KeyboardInterrupt):
        run(fresh(), tmp_path / "resumed")
    monkeypatch.setattr(task_type, "loss", real)
    state = json.loads((tmp_path / "resumed.train" / "last" / "trainer_state.json").read_text())
    assert state["epoch"] == 1 and state["step"] == max(per_epoch, (kill_at - 1) // 2 * 2)  # the last checkpoint
    resumed = run(fresh(), tmp_path / "resumed")
    assert resumed.steps == straight.steps
    load = BiEncoder.load if kind == "retriever" else CrossEncoder.load
    a, b = load(tmp_path / "straight").state_dict(), load(tmp_path / "resumed").state_dict()
    untrained = fresh().state_dict()
    assert a.keys() == b.keys()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst <= 1e-6, f"{kind}: resumed weights differ by {worst}"
    assert max((a[k].float() - untrained[k].float()).abs().max().item() for k in a) > 1e-4  # training moved them
    assert [h["epoch"] for h in resumed.history] == [1, 2]


@pytest.mark.parametrize("kind", ["retriever", "reranker"])
def test_both_models_train_with_the_same_optimizer_groups(kind, tiny_bert_dir, sample_dir):
    from twostage.models.fit import build_optimizer

    _, fresh, _ = (_retriever_run if kind == "retriever" else _reranker_run)(tiny_bert_dir, sample_dir)
    model = fresh()
    optimizer = build_optimizer(model, [], TrainConfig(weight_decay=0.05))
    decay, no_decay, extra = optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0 and not extra["params"]
    assert all(not any(x in names[id(p)] for x in NO_DECAY) for p in decay["params"])
    assert no_decay["params"] and all(any(x in names[id(p)] for x in NO_DECAY) for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(names)


def test_linear_schedule():
    f = linear_schedule(10, 2)
    assert [round(f(s), 3) for s in range(11)] == [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0]


def test_both_model_types_write_one_twostage_json_schema(tmp_path, tiny_bert_dir):
    BiEncoder.load(tiny_bert_dir).save(tmp_path / "bi", training={"steps": 1})
    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True
    ce.save(tmp_path / "ce", training={"steps": 2})
    bi, cross = (json.loads((tmp_path / d / "twostage.json").read_text()) for d in ("bi", "ce"))
    assert bi.keys() == cross.keys() == {"format", "format_version", "kind", "base", "settings", "training", "versions"}
    assert (bi["kind"], cross["kind"]) == ("bi-encoder", "cross-encoder")
    assert cross["settings"] == {"max_length": ce.max_length, "head_trained": True}  # no search policy


def test_model_json_written_before_the_schema_still_loads_and_bad_ones_are_named(tmp_path, tiny_bert_dir):
    from twostage.indexer.errors import ConfigError

    BiEncoder.load(tiny_bert_dir).save(tmp_path / "bi")
    f = tmp_path / "bi" / "twostage.json"
    f.write_text(json.dumps({"kind": "bi-encoder", "encoder": {"pooling": "cls", "max_length": 40}, "training": {}}))
    assert BiEncoder.load(tmp_path / "bi").config.pooling == "cls"
    f.write_text(json.dumps({"format": "twostage.model", "format_version": 1, "kind": "bi-encoder",
                             "settings": {"pooling": "mean", "colour": 1}}))
    with pytest.raises(ConfigError, match="colour"):
        BiEncoder.load(tmp_path / "bi")
    f.write_text(json.dumps({"format": "twostage.model", "format_version": 7, "kind": "bi-encoder", "settings": {}}))
    with pytest.raises(ConfigError, match="newer than this library"):
        BiEncoder.load(tmp_path / "bi")
    CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True).save(tmp_path / "ce")
    (tmp_path / "ce" / "twostage.json").write_text(json.dumps({"kind": "cross-encoder", "head_trained": True,
                                                               "interpolation": 0.7, "max_length": 33}))
    legacy = CrossEncoder.load(tmp_path / "ce")
    assert (legacy.max_length, legacy.head_trained) == (33, True)
    from twostage.engine.knobs import dev_choice

    assert dev_choice(tmp_path / "ce").blend == 0.7  # its old blend, read where the engine reads policy
    with pytest.raises(ConfigError, match="not a bi-encoder"):
        BiEncoder.load(tmp_path / "ce")


@pytest.mark.parametrize("amx,choice,expected", [(False, None, False), (True, None, True), (False, True, True),
                                                 (True, False, False)])
def test_bf16_autocast_only_where_the_cpu_computes_it_unless_told(tiny_bert_dir, sample_dir, tmp_path, monkeypatch,
                                                                  amx, choice, expected):
    # without AMX torch emulates bf16: a MiniLM step took 122.8 s under autocast, 5.7 s in fp32 (bf16_train_step.md)
    from dataclasses import replace

    import twostage.models.device as device_module
    from twostage.models.device import bf16_for

    monkeypatch.setattr(device_module, "cpu_has_amx", lambda: amx)
    assert bf16_for(choice, "cpu") is expected
    seen = []
    real = torch.autocast

    def spy(device_type, *args, enabled=True, **kwargs):
        seen.append(enabled)
        return real(device_type, *args, enabled=False, **kwargs)  # the spy never makes the test slow

    monkeypatch.setattr(torch, "autocast", spy)
    split = BeirDataset(sample_dir).split("train")
    sets = [pairs_from_qrels(BeirDataset(sample_dir).corpus, split.queries, split.qrels)]
    config = replace(TrainConfig(epochs=1, batch_size=32, device="cpu", checkpoint_every=0), bf16=choice)
    train(BiEncoder.load(tiny_bert_dir), sets, config, tmp_path / "m")
    assert seen and set(seen) == {expected}
    assert TrainConfig().bf16 is None and RerankerConfig().bf16 is None  # the recipe's default: decided per device


def test_a_reranker_step_split_into_passes_has_the_gradient_of_one_pass(tiny_bert_dir, sample_dir):
    from dataclasses import replace

    _, fresh, _ = _reranker_run(tiny_bert_dir, sample_dir)
    config = RerankerConfig(groups_per_batch=8, negatives=2, max_length=48, mine_from=("bm25",), bf16=False)
    groups = groups_from_split(BeirDataset(sample_dir), "train", config)[:7]

    def gradient(groups_per_pass):
        model = fresh().eval()  # no dropout: the two ways see the same forward
        task = RerankerTask(model, groups, replace(config, groups_per_pass=groups_per_pass))
        passes = task.passes(list(range(len(groups))))
        for part, weight in passes:
            (task.loss(part) * weight).backward()
        return len(passes), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (one, whole), (three, split) = gradient(0), gradient(3)
    assert (one, three) == (1, 3)  # 7 groups, 3 a pass: 3 + 3 + 1
    assert whole.keys() == split.keys() and whole
    worst = max((whole[n] - split[n]).abs().max().item() for n in whole)
    assert worst <= 1e-3 * max(w.abs().max().item() for w in whole.values()), worst
    with pytest.raises(Exception, match="groups_per_pass"):
        RerankerConfig(groups_per_pass=-1)
