"""Tests of the BiLSTM tagger and of scripts/bench_dynet.py (fast).

* the tagger batched by gluon_dynbatch equals the tagger run eagerly (loss
  and every gradient), for several batching settings;
* the DyNet tagger of bench_dynet's DyNet worker computes the same losses as
  the Gluon tagger from the same weights, over a few Adam steps (skipped
  without dynet);
* a tiny ``--quick`` run of the whole benchmark writes its tables and plot
  and reports matching losses across systems (skipped without SST).
"""
import csv
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO_ROOT, "scripts")
for _path in (REPO_ROOT, SCRIPTS):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from mxnet import autograd, gluon  # noqa: E402

import gluon_dynbatch as gdb  # noqa: E402
import bench_dynet  # noqa: E402
from examples import bilstm_tagger  # noqa: E402
from examples.sst_data import default_sst_dir  # noqa: E402

BENCH = os.path.join(SCRIPTS, "bench_dynet.py")
HAVE_DYNET = importlib.util.find_spec("dynet") is not None
SST_DIR = default_sst_dir()

TREES = [
    "(3 (2 The) (4 (3 good) (2 film)))",
    "(1 (2 (2 A) (1 dull)) (2 (2 film) (2 .)))",
    "(4 (4 great) (2 .))",
    "(2 film)",
    "(0 (1 (0 (1 awful) (2 ,)) (1 (2 dull) (2 film))) (2 .))",
]


@pytest.fixture
def sst_dir(tmp_path):
    """A folder with a tiny SST-format train.txt."""
    (tmp_path / "train.txt").write_text("\n".join(TREES) + "\n")
    return str(tmp_path)


def sensitive_model(vocab_size, embed=6, hidden=4, seed=5):
    """A tagger with large random weights (small ones hide wrong gates)."""
    model = bilstm_tagger.make_model(vocab_size, embed, hidden, seed=seed)
    rng = np.random.RandomState(seed)
    weights = {}
    for name, value in bilstm_tagger.get_weights(model).items():
        scale = 1.0 if value.ndim == 1 or name == "embedding" \
            else 1.5 / np.sqrt(value.shape[1])
        weights[name] = rng.normal(0, scale, value.shape).astype(np.float32)
    bilstm_tagger.set_weights(model, weights)
    return model


def loss_and_grads(model, sentences, config):
    """Summed loss and every gradient; eager when ``config`` is None."""
    ids = [s for s, _ in sentences]
    tags = [t for _, t in sentences]
    with autograd.record():
        emb = model.embedding.data()
        if config is None:
            logits = [model.tagger(s, emb) for s in ids]
        else:
            with gdb.batching(**bench_dynet.parse_config(config)):
                logits = [model.tagger(s, emb) for s in ids]
        loss = bilstm_tagger.tagger_loss(logits, tags)
    loss.backward()
    grads = {name: p.grad().asnumpy().copy()
             for name, p in model.collect_params().items()}
    return float(loss.asscalar()), grads


def test_tagged_sentences_and_stream(sst_dir):
    trees, vocab = bench_dynet.load_sst_trees(sst_dir)
    sentences = bench_dynet.tagged_sentences(trees)
    assert sentences[0] == ((vocab["The"], vocab["good"], vocab["film"]),
                            (2, 3, 2))
    assert sentences[3] == ((vocab["film"],), (2,))
    first = bench_dynet.batch_stream(sentences, 2, seed=7)
    second = bench_dynet.batch_stream(sentences, 2, seed=7)
    drawn = [next(first) for _ in range(4)]
    assert drawn == [next(second) for _ in range(4)]
    assert all(len(b) == 2 for b in drawn)
    assert bench_dynet.parse_config("agenda:step") == {
        "strategy": "agenda", "compiled": "step"}
    with pytest.raises(ValueError):
        bench_dynet.parse_config("depth:fast")


@pytest.mark.parametrize("config", ["depth:imperative", "agenda:imperative",
                                    "depth:step", "agenda:compiled"])
def test_tagger_batched_equals_eager(sst_dir, config):
    trees, vocab = bench_dynet.load_sst_trees(sst_dir)
    sentences = bench_dynet.tagged_sentences(trees)
    model = sensitive_model(len(vocab))
    eager_loss, eager_grads = loss_and_grads(model, sentences, None)
    loss, grads = loss_and_grads(model, sentences, config)
    assert np.isfinite(eager_loss) and eager_loss > 0
    assert loss == pytest.approx(eager_loss, rel=1e-4)
    for name, grad in eager_grads.items():
        assert np.abs(grad).sum() > 0 or "embedding" in name, name
        np.testing.assert_allclose(grads[name], grad, rtol=1e-4, atol=1e-5,
                                   err_msg=name)


def test_tagger_loss_rejects_wrong_tags():
    model = bilstm_tagger.make_model(10, 4, 3, seed=1)
    logits = model([[1, 2, 3]], False)
    with pytest.raises(ValueError, match="logit rows"):
        bilstm_tagger.tagger_loss(logits, [[0, 1]])


def test_dynet_weights_fold_forget_bias():
    model = bilstm_tagger.make_model(10, 4, 3, seed=1)
    weights = bilstm_tagger.get_weights(model)
    folded = bilstm_tagger.dynet_weights(weights)
    hid = 3
    np.testing.assert_allclose(folded["fwd_bias"][hid:2 * hid],
                               weights["fwd_bias"][hid:2 * hid] - 1.0)
    np.testing.assert_array_equal(folded["bwd_bias"][:hid],
                                  weights["bwd_bias"][:hid])


@pytest.mark.skipif(not HAVE_DYNET, reason="dynet not installed "
                    "(pip install dynet38)")
def test_dynet_tagger_matches_gluon(sst_dir, tmp_path):
    trees, vocab = bench_dynet.load_sst_trees(sst_dir)
    sentences = bench_dynet.tagged_sentences(trees)
    model = sensitive_model(len(vocab), embed=6, hidden=4)
    weights_file = str(tmp_path / "tagger.npz")
    np.savez(weights_file, **bilstm_tagger.dynet_weights(
        bilstm_tagger.get_weights(model)))
    trainer = gluon.Trainer(model.collect_params(), "adam")
    steps = 3
    gluon_losses = [bilstm_tagger.train_step(
        model, trainer, [s for s, _ in sentences], [t for _, t in sentences],
        batched=True) for _ in range(steps)]
    assert gluon_losses[-1] < gluon_losses[0]
    job = {"name": "tagger test", "workload": "tagger", "seed": 1,
           "threads": None, "warmup": 0, "batches": steps,
           "modes": ["train"], "system_timeout": 60, "max_trees": None,
           "data_dir": sst_dir, "embed": 6, "hidden": 4,
           "batch_size": len(sentences), "autobatch": 1,
           "weights": weights_file}
    job_file, result_file = tmp_path / "job.json", tmp_path / "result.json"
    job_file.write_text(json.dumps(job))
    done = subprocess.run([sys.executable, BENCH, "--worker", "dynet",
                           "--job", str(job_file), "--result",
                           str(result_file)], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(result_file.read_text())
    dynet_losses = result["systems"][0]["losses"]
    np.testing.assert_allclose(dynet_losses, gluon_losses, rtol=1e-4)


def test_help_lists_flags():
    done = subprocess.run([sys.executable, BENCH, "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for flag in ("--workloads", "--sizes", "--batches", "--threads",
                 "--quick", "--skip-dynet", "--profile", "--out-dir", "--no-hand"):
        assert flag in done.stdout


@pytest.mark.skipif(SST_DIR is None, reason="SST data not found "
                    "(expected ../shared/data/sst)")
def test_quick_smoke_run(tmp_path):
    out_dir = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, BENCH, "--quick", "--workloads",
         "treelstm,tagger,batchsize", "--max-trees", "60", "--dims", "8/8",
         "--tagger-dims", "8/8", "--sizes", "2,4", "--tree-batch", "4",
         "--tagger-batch", "4", "--batches", "1", "--configs",
         "depth:imperative", "--out-dir", str(out_dir)],
        capture_output=True, text=True, timeout=180, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("bench_dynet.md", "bench_dynet.csv", "bench_dynet.json",
                 "batch_size.png"):
        assert (out_dir / name).is_file(), name
    report = json.loads((out_dir / "bench_dynet.json").read_text())
    assert set(report["workloads"]) == {"treelstm 8/8", "tagger 8/8"}
    for rows in report["workloads"].values():
        systems = {row["system"]: row for row in rows}
        for name in ("eager Gluon", "gluon_dynbatch default"):
            assert systems[name]["train"] > 0 and systems[name]["infer"] > 0
        if HAVE_DYNET:
            dynet = systems["DyNet autobatch=1"]
            assert dynet["train"] > 0 and dynet["infer"] > 0
            assert systems["gluon_dynbatch default"]["train_x_dynet"] > 0
        for row in rows:
            for mode in ("train", "infer"):
                gap = row[mode + "_loss_gap"]
                assert gap is None or gap < 1e-3, (row["system"], mode, gap)
                first = row[mode + "_loss_gap_first"]
                assert first is None or first < 1e-4, (row["system"], mode)
    hand = {row["system"]: row for row in report["workloads"]["treelstm 8/8"]}[
        "hand-batched MXNet (no per-node Python)"]
    assert hand["train"] > 0 and hand["infer"] > 0
    assert hand["train_loss_gap_first"] < 1e-4      # the same model as eager
    sizes = {row["size"] for row in report["sweep"]}
    assert sizes == {2, 4}
    with open(out_dir / "bench_dynet.csv") as handle:
        tables = {row["table"] for row in csv.DictReader(handle)}
    assert tables == {"summary", "settings", "batch_size"}
    text = (out_dir / "bench_dynet.md").read_text()
    assert "## treelstm 8/8" in text and "## Batch size" in text
    if not HAVE_DYNET:
        assert "skipped: dynet38 not installed" in text


def test_dynet_worker_without_dynet_says_skipped(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "dynet_config.py").write_text("raise ImportError('no dynet')\n")
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({"name": "x", "threads": None}))
    env = dict(os.environ, PYTHONPATH=str(fake))
    done = subprocess.run([sys.executable, BENCH, "--worker", "dynet",
                           "--job", str(job_file), "--result",
                           str(tmp_path / "r.json")], capture_output=True,
                          text=True, timeout=60, env=env, cwd=REPO_ROOT)
    assert done.returncode == bench_dynet.DYNET_MISSING
    assert "skipped: dynet38 not installed" in done.stderr
