"""gluon_dynbatch.distributed.checkpoint: atomic files and manifests."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gluon_dynbatch.distributed import checkpoint


def writer(text):
    return lambda path: Path(path).write_text(text)


def test_atomic_write_leaves_no_temporary(tmp_path):
    path = checkpoint.atomic_write(tmp_path / "a.txt", writer("one"))
    assert path.read_text() == "one"
    checkpoint.atomic_write(path, writer("two"))
    assert path.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = checkpoint.atomic_write(tmp_path / "a.txt", writer("old"))

    def broken(temp):
        Path(temp).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoint.atomic_write(path, broken)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_commit_latest_and_clean_up(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    checkpoint.commit(tmp_path, {"w": ("w1.bin", writer("1"))},
                      {"epoch": 1, "step": 4})
    first = checkpoint.latest(tmp_path)
    assert first["epoch"] == 1 and first["files"]["w"] == tmp_path / "w1.bin"
    assert checkpoint.describe(first) == "checkpoint of epoch 1, step 4"
    checkpoint.commit(tmp_path, {"w": ("w2.bin", writer("2")),
                                 "keep": ("w1.bin", None)},
                      {"epoch": 2, "step": 8})
    checkpoint.commit(tmp_path, {"w": ("w3.bin", writer("3"))},
                      {"epoch": 3, "step": 12})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.json", "w3.bin"]
    assert checkpoint.latest(tmp_path)["files"]["w"].read_text() == "3"


def test_a_manifest_naming_a_missing_file_is_an_error(tmp_path):
    checkpoint.commit(tmp_path, {"w": ("w1.bin", writer("1"))}, {})
    (tmp_path / "w1.bin").unlink()
    with pytest.raises(checkpoint.CheckpointError, match="w1.bin"):
        checkpoint.latest(tmp_path)
    (tmp_path / checkpoint.MANIFEST).write_text("{not json")
    with pytest.raises(checkpoint.CheckpointError, match="not a checkpoint"):
        checkpoint.latest(tmp_path)


KILLED_SAVE = """
import sys
from pathlib import Path
from gluon_dynbatch.distributed import checkpoint
for step in (1, 2):
    checkpoint.commit(sys.argv[1], {"w": (f"w{step}.bin", lambda p, s=step:
                      Path(p).write_text(str(s)))}, {"step": step})
"""


@pytest.mark.parametrize("pattern", ["w*.bin", "checkpoint.json"])
def test_killed_between_write_and_rename(tmp_path, pattern):
    env = {**os.environ, checkpoint.HOOK_ENV: f"kill:{pattern}:2"}
    proc = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(tmp_path)],
                          env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9, proc.stderr
    manifest = checkpoint.latest(tmp_path)
    assert manifest["step"] == 1
    assert manifest["files"]["w"].read_text() == "1"
    assert json.loads((tmp_path / "checkpoint.json").read_text())[
        "files"] == {"w": "w1.bin"}


def test_server_side_states_saved_and_restored(tmp_path):
    """What a parameter server runs for server_state, here in-process."""
    import runpy

    import mxnet as mx
    import numpy as np

    from gluon_dynbatch.distributed import server_state
    server = runpy.run_path(server_state._SERVER_SIDE)  # noqa: SLF001
    first = server["on_server"]("track", mx.optimizer.AdaGrad(), [])
    weight = mx.nd.ones((2, 3))
    state = first.create_state_multi_precision(0, weight)
    first.update_multi_precision(0, weight, mx.nd.ones((2, 3)), state)
    assert first.create_state_multi_precision(0, weight) is state
    assert server["on_server"]("save", str(tmp_path / "c")) is first
    saved = tmp_path / "c.server0.states"
    again = runpy.run_path(server_state._SERVER_SIDE)  # noqa: SLF001
    second = again["on_server"]("track", mx.optimizer.AdaGrad(),
                                [str(saved)])
    restored = second.create_state_multi_precision(0, weight)
    np.testing.assert_array_equal(restored.asnumpy(), state.asnumpy())
    assert np.abs(state.asnumpy()).max() > 0
    fresh = second.create_state_multi_precision(1, weight)
    assert np.abs(fresh.asnumpy()).max() == 0
    assert second.num_update == first.num_update == 1
