"""Engine updates killed with SIGKILL leave an engine that loads and answers as before or after."""

import pytest

from tests.harness import engine_crash


@pytest.mark.slow
@pytest.mark.parametrize("passages", [0, 6])  # whole documents; passages of 6 words (several rows a document), with
# token vectors (late interaction) as a third part to keep in step
def test_killed_engine_updates_leave_every_part_in_step(tmp_path, passages):
    result = engine_crash.run(rounds=4, seed=3, workdir=tmp_path, passages=passages,
                              late=passages > 0)  # raises on any other outcome
    assert sum(result["outcomes"].values()) == 4
