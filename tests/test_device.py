"""--device: cpu, cuda, cuda:N or auto; a machine without CUDA asked for cuda gets one line, nothing changed."""

from __future__ import annotations

import pytest
import torch

from twostage.app.cli import main
from twostage.indexer.errors import ConfigError
from twostage.models.device import precision_on, resolve_device

NO_CUDA = not torch.cuda.is_available()


def test_auto_and_cpu():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cpu" if NO_CUDA else "cuda")
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        resolve_device("tpu")


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
def test_cuda_without_cuda_is_one_clear_error():
    with pytest.raises(ConfigError, match="no CUDA GPU here.*--device cpu"):
        resolve_device("cuda")


def test_cpu_only_precisions_are_refused_on_a_gpu():
    assert precision_on("cuda", "auto") == "fp32" and precision_on("cuda", "bf16") == "bf16"
    assert precision_on("cpu", "openvino-int8") == "openvino-int8"
    with pytest.raises(ConfigError, match="openvino-int8 runs on the CPU only"):
        precision_on("cuda", "openvino-int8")


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
def test_cli_commands_refuse_cuda_in_one_line(tmp_path, sample_dir, models, capsys):
    retriever, reranker = models
    cases = [
        ["build", "--corpus", str(sample_dir), "--out", str(tmp_path / "eng"), "--retriever", str(retriever),
         "--device", "cuda"],
        ["bench", "--data", str(sample_dir), "--systems", "bm25,bm25+rerank", "--reranker-model", str(reranker),
         "--out", str(tmp_path / "b"), "--device", "cuda"],
        ["train-reranker", "--data", str(sample_dir), "--base", str(retriever), "--out", str(tmp_path / "ce"),
         "--epochs", "1", "--device", "cuda"],
        ["adapt", "--corpus", str(sample_dir), "--base", str(retriever), "--out", str(tmp_path / "adapted"),
         "--device", "cuda"],
    ]
    for argv in cases:
        capsys.readouterr()
        assert main(["-q", *argv]) == 2, argv[0]
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no CUDA GPU here" in err[0], (argv[0], err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written
    assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(tmp_path / "eng"), "--retriever",
                 str(retriever), "--device", "cpu", "--backend", "flat"]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "eng"), "why do cats purr", "--device", "cuda"]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err
    assert main(["search", str(tmp_path / "eng"), "why do cats purr", "--device", "cpu", "--k", "3"]) == 0


def test_ray_encoding_refuses_a_gpu_device_in_one_line(tmp_path, sample_dir, capsys):
    # Ray's encoder actors run on CPUs: a GPU asked for with ray_actors would be ignored, so it is refused (any
    # machine, before the device is looked for)
    from twostage.engine.search_engine import SearchEngine

    with pytest.raises(ConfigError, match="ray_actors encode on CPU actors, not on cuda"):
        SearchEngine.build(sample_dir, tmp_path / "eng", retriever="unused", ray_actors=2, device="cuda:0")
    argv = ["-q", "build", "--corpus", str(sample_dir), "--out", str(tmp_path / "eng"), "--ray-actors", "2",
            "--shards", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ray-actors" in err[0] and "--shards" in err[0], err
    assert list(tmp_path.iterdir()) == []
