"""Training runs of the SICK example: checkpoints, resuming, curves, scoring.

Tiny runs on a generated corpus in the SICK layout: a run of 3 epochs is
the reference; runs cut short (after an epoch, killed while saving, killed
at a random moment) and resumed must end with the same parameters, curves
and scores.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from scipy import stats

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples import curves, run_state  # noqa: E402
from examples import tree_lstm_sick as script  # noqa: E402
from examples.sick_data import (load_split, random_corpus,  # noqa: E402
                                write_split)
from gluon_dynbatch.distributed import checkpoint  # noqa: E402

SCRIPT = str(REPO_ROOT / "examples" / "tree_lstm_sick.py")
TRAIN_PAIRS, BATCH = 30, 4          # 8 batches an epoch, the last of 2
EPOCHS = 3


@pytest.fixture(scope="module")
def sick_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sick")
    for split, n, seed in (("train", TRAIN_PAIRS, 30), ("dev", 10, 31),
                           ("test", 10, 32)):
        write_split(random_corpus(n, seed=seed), root, split)
    return root


def flags(sick_dir, run_dir, *extra, epochs=EPOCHS):
    return ["--data-dir", str(sick_dir), "--save-dir", str(run_dir),
            "--epochs", str(epochs), "--batch-size", str(BATCH),
            "--memory", "12", "--hidden", "6", "--glove", "random",
            "--checkpoint-every", "3", "--log-interval", "0",
            "--tune-embeddings", *extra]


@pytest.fixture(scope="module")
def reference(sick_dir, tmp_path_factory):
    """A run of 3 epochs, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("reference")
    assert script.main(flags(sick_dir, run_dir)) == 0
    return run_dir


def final_params(run_dir):
    """The parameters of a run's last checkpoint, as numpy arrays."""
    manifest = checkpoint.latest(run_dir)
    saved = mx.nd.load(str(manifest["files"]["params"]))
    return {k: v.asnumpy() for k, v in saved.items()}, manifest


def summary_of(run_dir):
    return json.loads((Path(run_dir) / "summary.json").read_text())


def assert_same_run(run_dir, reference):
    """Same final parameters (to float32 rounding), curves and scores."""
    got, manifest = final_params(run_dir)
    want, want_manifest = final_params(reference)
    assert manifest["epoch"] == want_manifest["epoch"] == EPOCHS + 1
    assert manifest["step"] == want_manifest["step"]
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5,
                                   atol=1e-6, err_msg=name)
    ours, theirs = summary_of(run_dir), summary_of(reference)
    np.testing.assert_allclose(ours["curves"][0]["train_loss"],
                               theirs["curves"][0]["train_loss"], rtol=1e-5)
    assert [d["epoch"] for d in ours["curves"][0]["dev"]] == \
        list(range(1, EPOCHS + 1))
    assert ours["best_dev"]["epoch"] == theirs["best_dev"]["epoch"]
    for key, value in theirs["test"].items():
        assert ours["test"][key] == pytest.approx(value, abs=1e-5)


def test_reference_run_directory(reference):
    names = {p.name for p in reference.iterdir()}
    assert {"run.json", "vocab.json", "embeddings.params", "best.params",
            "checkpoint.json", "summary.json", "curves.png"} <= names
    manifest = checkpoint.latest(reference)
    assert sorted(manifest["files"]) == ["params", "states"]
    # Only the last checkpoint's files are kept, and no temporary file.
    assert sorted(n for n in names if n.startswith("ckpt-")) == sorted(
        p.name for p in manifest["files"].values())
    assert not [n for n in names if n.endswith(".tmp")]
    progress = manifest["progress"]
    assert progress["step"] == EPOCHS * 8 and progress["batch"] == 0
    assert len(progress["train_loss"]) == EPOCHS * 8


def test_one_epoch_then_resume_for_two_equals_three(sick_dir, reference,
                                                    tmp_path, caplog):
    run_dir = tmp_path / "run"
    assert script.main(flags(sick_dir, run_dir, epochs=1)) == 0
    assert checkpoint.latest(run_dir)["epoch"] == 2
    assert script.main(["--resume", str(run_dir), "--epochs",
                        str(EPOCHS)]) == 0
    assert "resuming" in caplog.text and "epoch 2, batch 0" in caplog.text
    assert_same_run(run_dir, reference)
    assert summary_of(run_dir)["args"]["memory"] == 12  # the run's own


def run_example(argv, env=None, **kwargs):
    """Start the example in a new process."""
    return subprocess.Popen([sys.executable, SCRIPT, *argv], cwd=REPO_ROOT,
                            env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


@pytest.mark.parametrize("pattern", ["ckpt-*.params", "checkpoint.json"])
def test_kill_during_a_save_keeps_the_previous_checkpoint(
        sick_dir, reference, tmp_path, pattern):
    run_dir = tmp_path / "run"
    proc = run_example(flags(sick_dir, run_dir),
                       {checkpoint.HOOK_ENV: f"kill:{pattern}:2"})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    assert "killing this process before renaming" in err
    manifest = checkpoint.latest(run_dir)  # the first checkpoint, whole
    assert (manifest["epoch"], manifest["batch"], manifest["step"]) == \
        (1, 3, 3)
    params = mx.nd.load(str(manifest["files"]["params"]))
    assert params and all(np.isfinite(v.asnumpy()).all()
                          for v in params.values())
    assert list(run_dir.glob(".*.tmp"))  # the torn write, never renamed
    assert script.main(["--resume", str(run_dir)]) == 0  # mid-epoch
    assert_same_run(run_dir, reference)


def test_killed_at_a_random_moment_then_resumed(sick_dir, reference,
                                                tmp_path):
    run_dir = tmp_path / "run"
    # Each checkpoint (every 3 batches) pauses, so that the run lasts
    # several seconds; the kill lands anywhere in it.
    proc = run_example(flags(sick_dir, run_dir),
                       {checkpoint.HOOK_ENV: "sleep=0.4:checkpoint.json"})
    try:
        start = time.monotonic()
        while not (run_dir / "checkpoint.json").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - start < 60
            time.sleep(0.05)
        delay = random.Random().uniform(0.0, 1.5)
        time.sleep(delay)
        assert proc.poll() is None, "the run ended before the kill"
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    killed_at = checkpoint.latest(run_dir)
    assert killed_at["epoch"] <= EPOCHS, (delay, killed_at["step"])
    assert script.main(["--resume", str(run_dir)]) == 0, delay
    assert_same_run(run_dir, reference)


def test_resume_refuses_other_settings(sick_dir, reference, tmp_path,
                                       capsys):
    assert script.main(["--resume", str(reference), "--memory", "30"]) == 2
    err = capsys.readouterr().err
    assert "--memory 30 (the run's: 12)" in err
    assert script.main(["--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert script.main(["--resume", str(reference), "--save-dir",
                        str(tmp_path)]) == 2


def read_png_text(path):
    from PIL import Image
    with Image.open(path) as image:
        image.load()
        return image.size, dict(image.text), np.asarray(image.convert("L"))


def test_curves_png_shows_the_summarys_series(reference):
    size, text, pixels = read_png_text(reference / "curves.png")
    assert size == (int(curves.FIGSIZE[0] * curves.DPI),
                    int(curves.FIGSIZE[1] * curves.DPI))
    series = json.loads(text[curves.SERIES_KEY])
    assert series == summary_of(reference)["curves"]
    (member,) = series
    assert len(member["train_loss"]) == EPOCHS * 8  # every batch
    assert [d["epoch"] for d in member["dev"]] == [1, 2, 3]
    assert all(np.isfinite(member["train_loss"]))
    assert pixels.std() > 10  # something was drawn


def test_evaluate_scores_and_writes_predictions(sick_dir, reference,
                                                capsys):
    assert script.main(["--evaluate", str(reference)]) == 0
    out = capsys.readouterr().out
    assert "dev: pearson" in out and "test: pearson" in out
    result = json.loads((reference / "best.evaluation.json").read_text())
    summary = summary_of(reference)
    for split in ("dev", "test"):
        predictions = np.loadtxt(reference / f"best.{split}.predictions.txt")
        gold = [p.score for p in load_split(sick_dir, split)]
        assert predictions.shape == (len(gold),)
        assert result[split]["pearson"] == pytest.approx(
            stats.pearsonr(predictions, gold)[0], abs=1e-5)
    for key, value in summary["test"].items():
        assert result["test"][key] == pytest.approx(value, abs=1e-6)
    assert result["dev"]["pearson"] == pytest.approx(
        summary["best_dev"]["pearson"], abs=1e-6)


def test_evaluate_of_a_file_that_does_not_fit(sick_dir, reference,
                                              tmp_path, capsys):
    lone = tmp_path / "lone.params"
    lone.write_bytes((reference / "best.params").read_bytes())
    code = script.main(["--evaluate", str(lone), "--data-dir", str(sick_dir),
                        "--glove", "random", "--memory", "20"])
    assert code == 2
    assert "does not fit the model" in capsys.readouterr().err


def test_ensemble_resumes_member_by_member(sick_dir, tmp_path):
    extra = ("--ensemble", "2")
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert script.main(flags(sick_dir, straight, *extra, epochs=2)) == 0
    assert script.main(flags(sick_dir, cut, *extra, epochs=1)) == 0
    assert script.main(["--resume", str(cut), "--epochs", "2"]) == 0
    for member in ("member1", "member2"):
        got, manifest = final_params(cut / member)
        want, _ = final_params(straight / member)
        assert manifest["epoch"] == 3
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5,
                                       atol=1e-6, err_msg=name)
    assert summary_of(cut)["test"] == pytest.approx(
        summary_of(straight)["test"], abs=1e-5)
    assert len(summary_of(cut)["curves"]) == 2


def test_a_new_run_replaces_an_old_one(sick_dir, reference, tmp_path,
                                       caplog):
    run_dir = tmp_path / "run"
    assert script.main(flags(sick_dir, run_dir, epochs=1)) == 0
    first = {p.name for p in run_dir.glob("ckpt-*")}
    assert script.main(flags(sick_dir, run_dir, epochs=1)) == 0
    assert "held an earlier run" in caplog.text
    assert {p.name for p in run_dir.glob("ckpt-*")} == first
    assert run_state.Progress.from_json(
        checkpoint.latest(run_dir)["progress"]).epoch == 2
