"""The crash loop (benchmarks/concurrency.py --kind crash runs it): an operation run to the end on a copy
to learn the new state, then on the real directory in a subprocess SIGKILLed after a random delay; afterwards
the directory must answer exactly as before or exactly as after."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def worker(script: str, path: Path, op: dict, kill_after: float | None = None) -> float:
    """Run ``python SCRIPT PATH OP`` (the harness's worker entry); kill it ``kill_after`` seconds after it says
    it is ready (its imports done), else wait for it: the seconds the operation took."""
    proc = subprocess.Popen([sys.executable, script, str(path), json.dumps(op)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":  # imports are done: the operation starts now
        raise RuntimeError("the worker did not start")
    t0 = time.perf_counter()
    if kill_after is None:
        if proc.wait() != 0:
            raise RuntimeError(f"the operation {op['kind']} failed")
        return time.perf_counter() - t0
    time.sleep(kill_after)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return kill_after


def worker_main(apply: Callable[[Path, dict], None]) -> None:
    """The subprocess side of :func:`worker`, called once the harness has imported what the operation needs (so
    that a kill lands inside the operation): say "ready", then ``apply(PATH, OP)`` from the command line."""
    print("ready", flush=True)
    apply(Path(sys.argv[1]), json.loads(sys.argv[2]))


def crash_rounds(target: Path, workdir: Path, rounds: int, rng: random.Random, script: str,
                 random_op: Callable[[random.Random, int], dict], answers: Callable[[Path], list]) -> dict:
    """``rounds`` random operations on ``target``, each killed at a random moment: how many left the old state
    and how many the new one (an AssertionError for anything in between; ``answers`` raises if it cannot load)."""
    outcomes = {"old": 0, "new": 0}
    ops: dict[str, int] = {}
    for n in range(rounds):
        op = random_op(rng, n)
        ops[op["kind"]] = ops.get(op["kind"], 0) + 1
        old = answers(target)
        trial = workdir / "trial"
        shutil.rmtree(trial, ignore_errors=True)
        shutil.copytree(target, trial, symlinks=True)
        duration = worker(script, trial, op)  # the same subprocess path, run to the end: the new state, its time
        new = answers(trial)
        worker(script, target, op, kill_after=rng.uniform(0, duration * 1.2))
        got = answers(target)
        if got == old:
            outcomes["old"] += 1
        elif got == new:
            outcomes["new"] += 1
        else:
            raise AssertionError(f"round {n} ({op['kind']}): {target.name} answers neither as before nor as after")
    return {"rounds": rounds, "outcomes": outcomes, "operations": ops}
