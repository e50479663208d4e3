import json
from pathlib import Path

import pytest

from twostage.app.cli import main


def test_bench_writes_outputs(tmp_path, sample_dir, capsys):
    rc = main(["-q", "bench", "--data", str(sample_dir), "--split", "test", "--systems", "bm25", "--out", str(tmp_path / "o")])
    assert rc == 0
    assert "| bm25 |" in capsys.readouterr().out
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["command"].startswith("twostage -q bench --data") and config["systems"] == ["bm25"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--split", "dev"], "unknown split 'dev'"),
        (["--systems", "nope"], "unknown system"),
        (["--k", "0"], "k must be a positive integer"),
    ],
)
def test_errors_are_one_line(tmp_path, sample_dir, capsys, args, message):
    rc = main(["-q", "bench", "--data", str(sample_dir), "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.startswith("twostage: error:") and err.count("\n") == 1
    assert "Traceback" not in err


def test_missing_data_dir(tmp_path, capsys):
    assert main(["bench", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "no such dataset directory" in capsys.readouterr().err


def test_verbose_shows_the_traceback_and_keeps_the_exit_status(tmp_path, capsys):
    """#81: -v adds the traceback; the exit status stays 2 (bad input), not 1."""
    assert main(["-v", "bench", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "DataNotFoundError" in err and "no such dataset directory" in err.splitlines()[-1]


def test_a_misspelled_flag_says_the_closest_one_in_one_line(tmp_path, capsys):
    assert main(["search", str(tmp_path), "a query", "--kk", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--kk (did you mean --k?)" in err and "twostage search --help" in err
    assert main(["search", str(tmp_path), "q", "--zzzzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_help_and_argument_errors_import_neither_torch_nor_the_models():
    """Commands register lazily: `twostage --help` lists every command from a table without importing its module;
    a command's own flags import that command's module only (never torch, for the engine's commands)."""
    import subprocess
    import sys

    from twostage.app.cli import COMMANDS, build_parser

    code = ("import sys\nfrom twostage.app.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'numpy' in sys.modules, 'transformers' in sys.modules)")
    for argv, numpy in ((["--help"], False), (["build", "--no-such-flag"], True), (["search", "--help"], True),
                        (["info"], True)):
        run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
        assert run.stdout.splitlines()[-1] == f"False {numpy} False", (argv, run.stdout, run.stderr)
        if argv == ["--help"]:
            assert all(name in run.stdout for name in COMMANDS)
    # the full parser (argv None) and the lazy one agree on every command's help line
    full = build_parser()._subparsers._group_actions[0]  # noqa: SLF001 - argparse keeps them there
    assert [a.dest for a in full._choices_actions] == list(COMMANDS)  # noqa: SLF001
    assert [a.help for a in full._choices_actions] == [h for _, h in COMMANDS.values()]  # noqa: SLF001


def test_a_slow_one_time_step_is_announced_even_when_quiet():
    """An OpenVINO export or a model fetch logs one line first (extra=ONE_TIME): the command line shows it even
    though it shows no other INFO line; running main again does not stack its filters."""
    import logging
    import subprocess
    import sys

    from twostage.app.cli import Shown
    from twostage.models.weights import ONE_TIME

    record = logging.LogRecord("twostage.models.runtime", logging.INFO, "", 0, "exporting", None, None)
    assert not Shown(logging.WARNING).filter(record) and Shown(logging.INFO).filter(record)
    record.__dict__.update(ONE_TIME)
    assert Shown(logging.WARNING).filter(record)
    code = ("import logging\nfrom twostage.app.cli import Shown, main\nfrom twostage.models.weights import ONE_TIME\n"
            "for _ in range(2):\n    main(['-q', 'bench', '--data', '/no/such/dir', '--out', '/tmp/x'])\n"
            "log = logging.getLogger('twostage.models.runtime')\n"
            "log.info('exporting a model once', extra=ONE_TIME)\nlog.info('a plain INFO line')\n"
            "print(sum(isinstance(f, Shown) for h in logging.getLogger().handlers for f in h.filters))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "1", run.stderr
    assert "exporting a model once" in run.stderr and "a plain INFO line" not in run.stderr


def test_demo_runs_on_the_sample(tmp_path, capsys, tiny_bert_dir):
    assert main(["-q", "demo", "--out", str(tmp_path / "demo"), "--base", str(tiny_bert_dir)]) == 0
    out = capsys.readouterr().out
    assert "| bm25 |" in out and "| hybrid+rerank |" in out and out.count("\nquery ") == 3
    assert "first stage" in out and "(the engine)" in out and "settings chosen on the 8 dev queries" in out
    assert "nDCG@10" in out and "best first stage" in out  # the demo says how the default compares
    config = json.loads((tmp_path / "demo" / "config.json").read_text())
    assert {"weights_s", "train_retriever_s", "train_reranker_s", "engine_s", "evaluate_s"} == set(config["phase_seconds"])
    assert (tmp_path / "demo.models" / "engine" / "CURRENT").is_file()
    assert "Loading weights" not in out and "LOAD REPORT" not in out
    said = [line for line in out.splitlines() if line.startswith(("The reranker", "The engine has no reranker"))]
    assert len(said) == 1, said  # one sentence on what the reranker did
    assert not list((tmp_path / "demo.models").glob("*.train")) and "training checkpoints removed" in out


def test_the_demo_says_what_the_reranker_did():
    from types import SimpleNamespace

    import pandas as pd

    from twostage.app.demo import reranker_sentence
    from twostage.engine.settings import EngineSettings

    table = pd.DataFrame({"ndcg@10": [0.70, 0.75, 0.80, 0.80]}, index=["dense", "dense+rerank", "hybrid",
                                                                       "hybrid+rerank"])

    def engine(rerank: bool, blends: dict | None, first_stage: str = "dense"):
        reranker = None if blends is None else SimpleNamespace(path=None)
        settings = EngineSettings(first_stage=first_stage, rerank=rerank, rerank_blend=0.5,
                                  rerank_blend_by_first_stage=blends or {})  # as a build writes them
        return SimpleNamespace(settings=settings, reranker=reranker)

    assert "reorders the top 20 of dense with weight 0.3 (chosen on dev): +0.050" in \
        reranker_sentence(engine(True, {"dense": 0.3}), table, 8)
    off = reranker_sentence(engine(True, {"hybrid": 0.0}, "hybrid"), table, 8)
    assert "switched off by its dev selection" in off and "weight 0.0 after hybrid" in off
    off = reranker_sentence(engine(False, {"dense": 0.3}), table, 8)
    assert "switched off by the dev selection" in off and "dense+rerank on the test queries: +0.050" in off
    assert "no reranker" in reranker_sentence(engine(True, None), table, 8)


def test_train_retriever_then_bench_dense(tmp_path, sample_dir, tiny_bert_dir, capsys):
    model = tmp_path / "model"
    rc = main(["-q", "train-retriever", "--data", str(sample_dir), "--split", "train", "--base", str(tiny_bert_dir),
               "--out", str(model), "--epochs", "2", "--batch-size", "16", "--lr", "1e-3", "--negatives", "1",
               "--dev-fraction", "0.2", "--title-pairs", "32", "--mini-batch-size", "8"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "best dev nDCG@10" in out
    meta = json.loads((model / "twostage.json").read_text())
    assert meta["training"]["dev_queries"] == 8 and meta["training"]["train_queries"] == 34
    assert set(meta["training"]["sets"]) >= {"sample/train+negatives", "title-text"}
    assert (tmp_path / "model.negatives.parquet").is_file()
    rc = main(["-q", "bench", "--data", str(sample_dir), "--systems", "bm25,dense", "--retriever-model", str(model),
               "--out", str(tmp_path / "bench")])
    assert rc == 0
    metrics = json.loads((tmp_path / "bench" / "metrics.json").read_text())
    assert set(metrics) == {"bm25", "dense"} and 0 <= metrics["dense"]["ndcg@10"] <= 1


def test_train_retriever_second_round_nli_and_distillation_flags(tmp_path, sample_dir, tiny_bert_dir):
    from twostage.reranker.cross_encoder import CrossEncoder

    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True
    teacher = ce.save(tmp_path / "teacher")
    nli = tmp_path / "nli.jsonl"
    nli.write_text("\n".join(json.dumps({"premise": f"p{i}", "hypothesis": h, "label": lab}) for i in range(4)
                             for h, lab in (("yes", "entailment"), ("no", "contradiction"))))
    model = tmp_path / "model"
    rc = main(["-q", "train-retriever", "--data", str(sample_dir), "--base", str(tiny_bert_dir), "--out", str(model),
               "--epochs", "1", "--batch-size", "16", "--mine-from", "dense", "--mine-with", str(tiny_bert_dir),
               "--mine-max-ratio", "10", "--nli", str(nli), "--nli-pairs", "2", "--teacher", str(teacher),
               "--margin-rank-weight", "0.5"])
    assert rc == 0
    meta = json.loads((model / "twostage.json").read_text())["training"]
    assert meta["teacher"] == str(teacher) and meta["config"]["margin_rank_weight"] == 0.5
    assert meta["sets"]["nli"] == 2 and meta["recipe"]["mine_with"] == str(tiny_bert_dir)


def test_dense_without_a_model_takes_the_build_s_choice(tmp_path, sample_dir, capsys, monkeypatch):
    """#80: no --retriever-model means the build's `auto` (twostage.engine.writes.choose_retriever)."""
    from twostage import errors as twostage_errors
    from twostage.engine.search_engine import SearchEngine

    asked = []

    def build(*args, **kwargs):
        asked.append(kwargs.get("retriever"))
        raise twostage_errors.ConfigError("stop here")

    monkeypatch.setattr(SearchEngine, "build", build)
    assert main(["-q", "bench", "--data", str(sample_dir), "--systems", "dense", "--out", str(tmp_path / "o")]) == 2
    assert asked == ["auto"] and "stop here" in capsys.readouterr().err


def test_unresolvable_model_name(tmp_path, sample_dir, capsys, monkeypatch):
    monkeypatch.setenv("TWOSTAGE_CACHE", str(tmp_path / "cache"))
    rc = main(["-q", "bench", "--data", str(sample_dir), "--systems", "dense", "--retriever-model", "nobody/nothing",
               "--out", str(tmp_path / "o")])
    assert rc == 2 and "cannot be reached" in capsys.readouterr().err


def test_every_system_through_the_harness(tmp_path, sample_dir, tiny_bert_dir):
    from twostage.reranker.cross_encoder import CrossEncoder

    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True  # stands in for a trained reranker
    ce.save(tmp_path / "ce")
    rc = main(["-q", "bench", "--data", str(sample_dir), "--systems", "all", "--retriever-model", str(tiny_bert_dir),
               "--reranker-model", str(tmp_path / "ce"), "--rerank-depth", "20", "--out", str(tmp_path / "o")])
    assert rc == 0
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert set(metrics) == {"bm25", "rank-bm25", "dense", "hybrid", "bm25+rerank", "dense+rerank", "hybrid+rerank"}
    # the reranker reorders bm25's top 20; below them bm25's list continues unchanged
    from twostage.eval.run import Run

    bm25, reranked = Run.from_trec(tmp_path / "o" / "runs" / "bm25.trec"), Run.from_trec(tmp_path / "o" / "runs" / "bm25+rerank.trec")
    for q in bm25:
        assert set(reranked[q].ids[:20]) == set(bm25[q].ids[:20])
        assert list(reranked[q].ids[20:]) == list(bm25[q].ids[20:100])
    assert any(list(reranked[q].ids[:20]) != list(bm25[q].ids[:20]) for q in bm25)
    assert metrics["bm25+rerank"]["recall@100"] == metrics["bm25"]["recall@100"]


def test_rerank_without_a_model(tmp_path, sample_dir, capsys):
    assert main(["-q", "bench", "--data", str(sample_dir), "--systems", "bm25+rerank", "--out", str(tmp_path / "o")]) == 2
    assert "--reranker-model" in capsys.readouterr().err


def test_train_reranker_cli(tmp_path, sample_dir, tiny_bert_dir, capsys):
    rc = main(["-q", "train-reranker", "--data", str(sample_dir), "--base", str(tiny_bert_dir), "--out",
               str(tmp_path / "ce"), "--epochs", "2", "--lr", "1e-3", "--max-length", "64", "--dev-fraction", "0.2"])
    assert rc == 0 and "best dev nDCG@10" in capsys.readouterr().out
    meta = json.loads((tmp_path / "ce" / "twostage.json").read_text())
    assert meta["settings"]["head_trained"] and len(meta["training"]["dev_queries"]) == 8
    chosen = meta["training"]["interpolation"]  # what dev chose: the training record, not the model's settings
    tried = dict(chosen["dev_by_alpha"])
    assert len(tried) == 11 and chosen["alpha"] in tried and "interpolation" not in meta["settings"]
    assert tried[chosen["alpha"]] == max(tried.values())


def test_rerank_interpolation_flag(tmp_path, sample_dir, tiny_bert_dir, capsys):
    from twostage.eval.run import Run
    from twostage.reranker.cross_encoder import CrossEncoder

    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True
    ce.save(tmp_path / "ce")
    args = ["-q", "bench", "--data", str(sample_dir), "--systems", "bm25,bm25+rerank", "--reranker-model",
            str(tmp_path / "ce"), "--rerank-depth", "20"]
    assert main([*args, "--rerank-blend", "0", "--out", str(tmp_path / "o")]) == 0
    runs = tmp_path / "o" / "runs"
    bm25, blended = Run.from_trec(runs / "bm25.trec"), Run.from_trec(runs / "bm25+rerank.trec")
    assert all(list(blended[q].ids) == list(bm25[q].ids) for q in bm25)  # alpha 0: the first stage's order
    assert main([*args, "--rerank-blend", "lots", "--out", str(tmp_path / "p")]) == 2
    assert "--rerank-blend" in capsys.readouterr().err
    capsys.readouterr()
    assert main([*args, "--rerank-interpolation", "0", "--out", str(tmp_path / "q")]) == 0  # the old name, one notice
    assert "--rerank-interpolation is now --rerank-blend" in capsys.readouterr().err


def test_bench_trains_both_models_on_the_train_split(tmp_path, sample_dir, tiny_bert_dir, capsys):
    settings = {"retriever": {"train": {"epochs": 1, "batch_size": 8, "bf16": False}},
                # a random tiny BERT scores every document alike: no candidate passes the false-negative guard
                "late": {"train": {"epochs": 1, "batch_size": 8, "bf16": False}, "mining": {"max_ratio": 10.0}},
                "reranker": {"epochs": 1, "negatives": 2, "max_length": 48, "title_groups": 10, "bf16": False,
                             "mining": {"num_negatives": 2, "depth": 20}}}
    (tmp_path / "s.json").write_text(json.dumps(settings))
    args = ["-q", "bench", "--data", str(sample_dir), "--split", "test", "--systems", "all", "--base", str(tiny_bert_dir),
            "--train-settings", str(tmp_path / "s.json"), "--rerank-depth", "10", "--out", str(tmp_path / "o")]
    assert main([*args, "--train-split", "train"]) == 0
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert set(config["phase_seconds"]) == {"train_retriever_s", "train_reranker_s", "train_late_s", "evaluate_s"}
    report = (tmp_path / "o" / "report.md").read_text()
    assert "## Time of each phase" in report and "| train_reranker |" in report and "| total |" in report
    assert config["train_settings"]["reranker"]["title_groups"] == 10 and config["train_split"] == "train"
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert {"dense", "hybrid", "bm25+rerank", "dense+rerank", "hybrid+rerank", "hybrid+maxsim+rerank"} <= set(metrics)
    models = tmp_path / "o.models"
    reranker = json.loads((models / "reranker" / "twostage.json").read_text())
    test_ids = {line.split("\t")[0]
                for line in (sample_dir / "qrels" / "test.tsv").read_text().splitlines()[1:]}
    assert reranker["training"]["split"] == "train" and not set(reranker["training"]["dev_queries"]) & test_ids
    assert reranker["training"]["config"]["mine_from"] == ["bm25", "dense"]  # dense negatives from the new model
    capsys.readouterr()
    assert main([*args, "--train-split", "test", "--out", str(tmp_path / "p")]) == 2
    assert "never see the test" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(json.dumps({"reranker": {"epoch": 1}}))
    assert main([*args[:-6], "--train-settings", str(tmp_path / "bad.json"), "--train-split", "train", "--out",
                 str(tmp_path / "q")]) == 2
    assert "unknown setting(s) epoch" in capsys.readouterr().err


def test_bench_trains_a_maxsim_model_for_the_maxsim_systems(tmp_path, sample_dir, tiny_bert_dir, capsys):
    """--train-split with a +maxsim system trains a late-interaction model on the train split (its dev queries held
    out of it) and the MaxSim row searches with it, at the weight and depth dev chose; a given --late-model is used
    as is."""
    import pandas as pd

    from twostage import BeirDataset
    from twostage.engine.training import MAXSIM_DEPTHS
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.dense import DenseRetriever

    settings = {"retriever": {"train": {"epochs": 1, "batch_size": 8, "bf16": False}},
                # a random tiny BERT scores every document alike: no candidate passes the false-negative guard
                "late": {"train": {"epochs": 1, "batch_size": 8, "lr": 1e-3, "bf16": False},
                         "mining": {"max_ratio": 10.0}}}
    (tmp_path / "s.json").write_text(json.dumps(settings))
    args = ["-q", "bench", "--data", str(sample_dir), "--split", "test", "--systems", "hybrid,hybrid+maxsim",
            "--baseline", "hybrid", "--base", str(tiny_bert_dir), "--train-settings", str(tmp_path / "s.json")]
    assert main([*args, "--train-split", "train", "--out", str(tmp_path / "o")]) == 0
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert set(config["phase_seconds"]) == {"train_retriever_s", "train_late_s", "evaluate_s"}
    late = tmp_path / "o.models" / "late"
    assert config["late_model"] == str(late) and config["train_settings"]["late"]["late"] is True
    meta = json.loads((late / "twostage.json").read_text())
    train_ids = {line.split("\t")[0] for line in (sample_dir / "qrels" / "train.tsv").read_text().splitlines()[1:]}
    assert meta["kind"] == "late-interaction" and meta["training"]["split"] == "train"
    assert meta["training"]["base"] == str(tmp_path / "o.models" / "retriever")  # from the bi-encoder just trained
    assert meta["training"]["recipe"]["max_length"] == 180 and meta["training"]["dev_queries"] > 0
    assert meta["training"]["train_queries"] + meta["training"]["dev_queries"] == len(train_ids)
    recipe = meta["training"]["recipe"]  # hard negatives from the bi-encoder just trained: 3 of its top 30
    assert (recipe["negatives"], recipe["mine_from"], recipe["mining"]["depth"]) == (3, "dense", 30)
    assert recipe["train"]["maxsim_temperature"] == 0.5  # the recipe's, kept under a settings file that names epochs
    mined = pd.read_parquet(tmp_path / "o.models" / "late.negatives.parquet")
    assert len(mined) and mined["rank"].max() <= 30 and mined.groupby("query_id").size().max() <= 3
    data = BeirDataset(sample_dir)  # the mined scores are that bi-encoder's, not the base model's
    miner = BiEncoder.load(str(tmp_path / "o.models" / "retriever"), max_length=180)
    dense = DenseRetriever.build(data.corpus, miner)
    texts, row_of = {q.id: q.text for q in data.split("train").queries}, {d: i for i, d in enumerate(data.corpus.ids)}
    for row in mined.head(3).itertuples():
        assert abs(float(dense.scores(texts[row.query_id])[row_of[row.doc_id]]) - row.score) < 1e-4
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert set(metrics) == {"hybrid", "hybrid+maxsim"}
    (line,) = config["stages"]  # the dev rule: MaxSim's weight chosen on the held-out train queries, 0.0 = off
    assert line.startswith("MaxSim: ") and "Stages chosen on dev" in (tmp_path / "o" / "report.md").read_text()
    quality = {s: {m: v for m, v in metrics[s].items() if "@" in m} for s in metrics}
    assert (quality["hybrid+maxsim"] == quality["hybrid"]) == line.startswith("MaxSim: off")
    chosen = json.loads((late / "twostage.json").read_text())["training"]["maxsim_choice"]  # kept with the model
    assert (chosen["weight"] == 0.0) == line.startswith("MaxSim: off") and chosen["first_stage"] == "hybrid"
    assert chosen["depth"] in MAXSIM_DEPTHS and [d for d, _, _ in chosen["dev_by_depth"]] == list(MAXSIM_DEPTHS)
    capsys.readouterr()
    assert main([*args, "--train-split", "train", "--late-model", str(late), "--retriever-model",
                 str(tmp_path / "o.models" / "retriever"), "--out", str(tmp_path / "p")]) == 0
    config2 = json.loads((tmp_path / "p" / "config.json").read_text())
    assert set(config2["phase_seconds"]) == {"evaluate_s"} and config2["late_model"] == str(late)
    assert config2["stages"] == config["stages"]  # the same dev queries, the same choice
    again = json.loads((tmp_path / "p" / "metrics.json").read_text())
    for system in metrics:  # the same models, the same quality (latency aside)
        assert {m: v for m, v in again[system].items() if "@" in m} == {
            m: v for m, v in metrics[system].items() if "@" in m}
    assert main([*args[:10], "--late-model", str(late), "--retriever-model", str(tmp_path / "o.models" / "retriever"),
                 "--out", str(tmp_path / "q")]) == 0  # no training: the weight recorded with the model, said so
    config3 = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config3["stages"] == [f"{line} (recorded with {late} by its training)"]
    served = json.loads((tmp_path / "q" / "metrics.json").read_text())["hybrid+maxsim"]  # the same weight served
    assert {m: v for m, v in served.items() if "@" in m} == {m: v for m, v in again["hybrid+maxsim"].items() if "@" in m}
    given = [*args[:10], "--late-model", str(late), "--retriever-model", str(tmp_path / "o.models" / "retriever")]
    assert main([*given, "--maxsim-blend", "1", "--out", str(tmp_path / "r")]) == 0  # a given weight: no recorded one
    assert json.loads((tmp_path / "r" / "config.json").read_text())["stages"] == []
    alone = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert {m: v for m, v in alone["hybrid"].items() if "@" in m} == {
        m: v for m, v in again["hybrid"].items() if "@" in m}
    capsys.readouterr()
    for bad in ("none", "1.5"):
        assert main([*given, "--maxsim-blend", bad, "--out", str(tmp_path / "s")]) == 2
        assert "--maxsim-blend must be auto" in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_training_flags_are_generated_from_the_recipe_table():
    from twostage.app.cli import build_parser
    from twostage.app.cli_train import RERANKER, RETRIEVER, setting_at, settings_from_flags
    from twostage.engine.train_models import TrainSettings

    recipe = TrainSettings().aligned()
    for flag in RETRIEVER + RERANKER:
        for path in flag.paths:
            setting_at(recipe, path)  # every flag names real settings
    parser = build_parser()
    base = ["--data", "d", "--out", "o"]
    args = parser.parse_args(["train-reranker", *base])
    assert settings_from_flags(args, RERANKER) == recipe  # no flag: exactly the recipe
    args = parser.parse_args(["train-reranker", *base, "--negatives", "3", "--mine-from", "bm25,dense",
                              "--no-bf16", "--seed", "5", "--dev-fraction", "0.2"])
    got = settings_from_flags(args, RERANKER)
    assert (got.reranker.negatives, got.reranker.mining.num_negatives) == (3, 3)
    assert got.reranker.mine_from == ("bm25", "dense") and got.reranker.bf16 is False
    assert got.reranker.seed == got.retriever.train.seed == 5 and got.retriever.dev_fraction == 0.2
    args = parser.parse_args(["train-retriever", *base, "--nli", "a.jsonl", "b.jsonl", "--max-length", "64"])
    got = settings_from_flags(args, RETRIEVER)
    assert got.retriever.nli == ("a.jsonl", "b.jsonl") and got.retriever.max_length == 64
    assert "(default: 3)" in parser._subparsers._group_actions[0].choices["train-retriever"].format_help()


def test_build_adapt_trains_on_the_corpus_then_builds(tmp_path, sample_dir, tiny_bert_dir, capsys):
    models, engine_dir = tmp_path / "models", tmp_path / "engine"
    rc = main(["-q", "build", "--corpus", str(sample_dir), "--out", str(engine_dir), "--retriever", str(tiny_bert_dir),
               "--adapt", str(models), "--precision", "fp32"])
    assert rc == 0, capsys.readouterr().err
    record = json.loads((models / "adapt.json").read_text())
    manifest = json.loads(next(engine_dir.glob("v*/manifest.json")).read_text())
    # the engine is built with what adapt kept (each stage no worse than what it replaces on the dev queries)
    assert manifest["retriever"]["path"] == str(Path(record["kept"]["retriever"]).resolve())
    kept_reranker = record["kept"]["reranker"]
    assert (manifest["reranker"] or {}).get("path") == (str(Path(kept_reranker).resolve()) if kept_reranker else None)
    assert [n.split(":")[0] for n in record["notes"]] == ["retriever", "reranker"]
    assert manifest["settings"]["fusion"] == record["settings"]["fusion"]
    assert manifest["settings"]["dense_weight"] == record["settings"]["dense_weight"]
    assert main(["-q", "search", str(engine_dir), "cats purr", "--json"]) == 0


@pytest.mark.parametrize("argv,message", [
    (["adapt", "--corpus", "{tmp}/nothing.jsonl", "--out", "{tmp}/m"], "nothing.jsonl"),
    (["adapt", "--corpus", "{sample}", "--out", "{tmp}/m", "--query-kinds", "title,questions"], "got questions"),
    (["build", "--corpus", "{sample}", "--out", "{tmp}/e", "--adapt", "{tmp}/m", "--reranker", "x"],
     "give --adapt or --reranker, not both"),
])
def test_adapt_errors(tmp_path, sample_dir, capsys, argv, message):
    argv = [a.format(tmp=tmp_path, sample=sample_dir) for a in argv]
    assert main(["-q", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "m").exists() and not (tmp_path / "e").exists()


def test_the_program_ends_a_search_at_once_with_its_whole_answer(tmp_path, sample_dir):
    """`twostage search` (the console script's `run`) ends its process without unloading the modules (a read-only
    command): the whole answer is printed, the exit status is kept, and an error is still one line with status 2."""
    import subprocess
    import sys

    engine = tmp_path / "e"
    assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(engine), "--retriever", "none"]) == 0
    program = [sys.executable, "-m", "twostage"]
    done = subprocess.run([*program, "search", str(engine), "why do cats purr", "--k", "3"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.count("\n  ") >= 3 and "total" in done.stdout, done.stdout
    assert done.stdout.rstrip().splitlines()[-1].lstrip().startswith(("next page", "bm25", "total", "analyse"))
    bad = subprocess.run([*program, "search", str(tmp_path / "none"), "cats"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such engine directory" in bad.stderr


def test_build_takes_the_ann_backends_parameters_and_metric(tmp_path, sample_dir, tiny_bert_dir, capsys):
    """`build --ann-param KEY=VALUE --metric`: the dense part is built with them (the others sized from the corpus),
    an added document keeps them, and a bad one is one line naming it, exit 2, before anything is written."""
    engine = tmp_path / "e"
    rc = main(["-q", "build", "--corpus", str(sample_dir), "--out", str(engine), "--retriever", str(tiny_bert_dir),
               "--precision", "fp32", "--ann-param", "M=8", "--ann-param", "ef_search=40", "--metric", "ip"])
    assert rc == 0, capsys.readouterr().err

    def dense() -> dict:
        version = (engine / "CURRENT").read_text().strip()
        return json.loads((engine / version / "dense" / "manifest.json").read_text())

    first = dense()
    assert first["metric"] == "ip" and first["backend"]["params"]["M"] == 8
    assert first["backend"]["params"]["ef_search"] == 40 and first["backend"]["params"]["ef_construction"] == 100
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"_id": "new-1", "title": "Owls", "text": "Owls hunt at night."}) + "\n")
    assert main(["-q", "add", str(engine), str(new)]) == 0
    assert dense()["backend"] == first["backend"] and dense()["metric"] == "ip"
    capsys.readouterr()
    for flags, message in ((["--ann-param", "M=x"], "--ann-param 'M=x': M must be an integer"),
                           (["--ann-param", "bogus=3"], "unknown ANN parameter 'bogus'"),
                           (["--ann-param", "M=0"], "M must be a positive integer"),
                           (["--ann-param", "M"], "expected KEY=VALUE")):
        out = tmp_path / "bad"
        code = main(["-q", "build", "--corpus", str(sample_dir), "--out", str(out), "--retriever", str(tiny_bert_dir),
                     *flags])
        err = capsys.readouterr().err
        assert code == 2 and message in err and not out.exists(), err
    with pytest.raises(SystemExit) as exit_:
        main(["-q", "build", "--corpus", str(sample_dir), "--out", str(tmp_path / "bad"), "--metric", "dot"])
    assert exit_.value.code == 2 and "invalid choice: 'dot'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_build_adapt_without_a_retriever_adapts_the_model_the_build_would_choose(tmp_path, sample_dir, monkeypatch):
    """#81: `build --adapt M` with the default `--retriever auto` read the corpus, then asked the hub for a model
    named "auto"."""
    import twostage.engine.writes as writes
    import twostage.eval.workflows as adapt_module
    from twostage.indexer.errors import ConfigError

    seen = {}
    monkeypatch.setattr(writes, "choose_retriever", lambda retriever, corpus, settings: "the-chosen-model")

    def fake_adapt(corpus, out, base, show_progress):
        seen["base"] = base
        raise ConfigError("stopped here by the test")

    monkeypatch.setattr(adapt_module, "adapt", fake_adapt)
    assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(tmp_path / "e"), "--adapt",
                 str(tmp_path / "m")]) == 2
    assert seen == {"base": "the-chosen-model"}


def test_a_single_engine_build_imports_nothing_sharded(tmp_path, sample_dir, tiny_bert_dir):
    """`twostage build` of one engine never imports the sharded engine or its replicas (#82): only --shards does."""
    import subprocess
    import sys

    code = ("import sys\nfrom twostage.app.cli import main\nrc = main(sys.argv[1:])\n"
            "print(rc, sorted(m for m in sys.modules if m.startswith('twostage') and ('shard' in m or 'replica' in m)))")
    for extra, expected in (([], "0 []"), (["--shards", "2"], "0 ['twostage.engine.replicas', 'twostage.engine.sharded']")):
        out = tmp_path / f"e{len(extra)}"
        argv = ["-q", "build", "--corpus", str(sample_dir), "--out", str(out), "--retriever", str(tiny_bert_dir),
                "--precision", "fp32", *extra]
        run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
        assert run.stdout.splitlines()[-1] == expected, (extra, run.stdout, run.stderr[-2000:])
