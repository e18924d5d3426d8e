"""Tests of the BiLSTM tagger and of scripts/bench_dynet.py (fast).

* the tagger batched by gluon_dynbatch equals the tagger run eagerly (loss
  and every gradient), for several batching settings;
* the DyNet tagger of bench_dynet's DyNet worker computes the same losses as
  the Gluon tagger from the same weights, over a few Adam steps (skipped
  without dynet);
* the driver's pieces: the systems of each workload, the rotating rounds,
  timing blocks without a wait per batch, the worker's request loop;
* tiny ``--quick`` runs of the whole benchmark (a process per system, and
  one shared Gluon process with one thread) write their tables and plot,
  report a row for every system and matching losses across systems
  (skipped without SST).
"""
import csv
import importlib.util
import io
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
import bench_dynet_common  # noqa: E402
import bench_dynet_worker  # noqa: E402
from examples import bilstm_tagger  # noqa: E402
from examples.sst_data import default_sst_dir  # noqa: E402

BENCH = os.path.join(SCRIPTS, "bench_dynet.py")
WORKER = os.path.join(SCRIPTS, "bench_dynet_worker.py")
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
            with gdb.batching(**bench_dynet_common.parse_config(config)):
                logits = [model.tagger(s, emb) for s in ids]
        loss = bilstm_tagger.tagger_loss(logits, tags)
    loss.backward()
    grads = {name: p.grad().asnumpy().copy()
             for name, p in model.collect_params().items()}
    return float(loss.asscalar()), grads


def test_tagged_sentences_and_stream(sst_dir):
    trees, vocab = bench_dynet_common.load_sst_trees(sst_dir)
    sentences = bench_dynet_common.tagged_sentences(trees)
    assert sentences[0] == ((vocab["The"], vocab["good"], vocab["film"]),
                            (2, 3, 2))
    assert sentences[3] == ((vocab["film"],), (2,))
    first = bench_dynet_common.batch_stream(sentences, 2, seed=7)
    second = bench_dynet_common.batch_stream(sentences, 2, seed=7)
    drawn = [next(first) for _ in range(4)]
    assert drawn == [next(second) for _ in range(4)]
    assert all(len(b) == 2 for b in drawn)
    assert bench_dynet_common.parse_config("agenda:step") == {
        "strategy": "agenda", "compiled": "step"}
    with pytest.raises(ValueError):
        bench_dynet_common.parse_config("depth:fast")


@pytest.mark.parametrize("config", ["depth:imperative", "agenda:imperative",
                                    "depth:step", "agenda:compiled"])
def test_tagger_batched_equals_eager(sst_dir, config):
    trees, vocab = bench_dynet_common.load_sst_trees(sst_dir)
    sentences = bench_dynet_common.tagged_sentences(trees)
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
    trees, vocab = bench_dynet_common.load_sst_trees(sst_dir)
    sentences = bench_dynet_common.tagged_sentences(trees)
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
    job = {"workload": "tagger", "seed": 1, "data_dir": sst_dir,
           "max_trees": None, "embed": 6, "hidden": 4,
           "batch_size": len(sentences), "weights": weights_file}
    spec = bench_dynet.system_spec("dynet", "DyNet autobatch=1", side="dynet",
                                   autobatch=1)
    worker = bench_dynet.WorkerProcess("dynet", "test", None, 1, autobatch=1)
    try:
        worker.call("setup", 120, job=job, specs=[spec])
        worker.call("prepare", 60, key=spec["key"], mode="train",
                    size=len(sentences), warmup=0)
        block = worker.call("run", 60, key=spec["key"], count=steps, each=True)
    finally:
        worker.close()
    assert worker.proc.returncode == 0
    assert len(block["batch_ms"]) == steps
    np.testing.assert_allclose(block["losses"], gluon_losses, rtol=1e-4)


def test_help_lists_flags():
    done = subprocess.run([sys.executable, BENCH, "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for flag in ("--workloads", "--sizes", "--batches", "--threads",
                 "--quick", "--skip-dynet", "--profile", "--out-dir", "--no-hand",
                 "--round-batches", "--encoders", "--gluon-processes",
                 "--no-eager", "--train-back-to-back"):
        assert flag in done.stdout


# ------------------------------------------------------------ the driver

def _args(*extra):
    return bench_dynet.parse_args(["--configs", "depth:imperative,agenda:step"]
                                  + list(extra))


def test_every_system_of_each_workload():
    keys = {w: [s["key"] for s in bench_dynet.workload_systems(w, _args())]
            for w in bench_dynet.WORKLOADS}
    assert keys["treelstm"] == [
        "eager", "gdb-cell-depth:imperative", "gdb-cell-agenda:step",
        "gdb-op-depth:imperative", "gdb-op-agenda:step", "hand", "hand-sparse",
        "dynet-0", "dynet-1"]
    assert keys["tagger"] == ["eager", "gdb-depth:imperative", "gdb-agenda:step",
                              "dynet-0", "dynet-1"]
    assert keys["sick"] == ["eager", "gdb-depth:imperative", "gdb-agenda:step"]
    assert keys["batchsize"] == ["gdb-cell-depth:imperative", "gdb-op-depth:imperative",
                                 "hand-sparse", "dynet-1"]
    fewer = bench_dynet.workload_systems("treelstm", _args(
        "--no-eager", "--no-hand", "--skip-dynet", "--encoders", "op"))
    assert [s["key"] for s in fewer] == ["gdb-op-depth:imperative", "gdb-op-agenda:step"]
    labels = [s["label"] for s in bench_dynet.workload_systems("treelstm", _args())]
    assert len(set(labels)) == len(labels)
    assert "gluon_dynbatch op-by-op depth:imperative (default)" in labels


class _FakeEntry(bench_dynet.Entry):
    def __init__(self, name, fail_at=None):
        super().__init__(bench_dynet.system_spec("gdb", name, config=name))
        self.name, self.fail_at = name, fail_at


def test_rounds_rotate_and_a_failure_drops_only_its_system():
    log = []

    def run(entry, first, count):
        if first == entry.fail_at:
            raise RuntimeError("boom")
        log.append((entry.name, first, count))
        return {"block_ms": 1.0}

    entries = [_FakeEntry("a"), _FakeEntry("b", fail_at=4), _FakeEntry("c")]
    bench_dynet.time_in_rounds(entries, total=7, block=2, run=run)
    assert log == [("a", 0, 2), ("b", 0, 2), ("c", 0, 2),
                   ("b", 2, 2), ("c", 2, 2), ("a", 2, 2),
                   ("c", 4, 2), ("a", 4, 2),
                   ("a", 6, 1), ("c", 6, 1)]
    assert [len(e.blocks) for e in entries] == [4, 2, 4]
    assert entries[1].failure is not None and "boom" in entries[1].failure
    assert entries[0].failure is None and not entries[0].cut


def test_rounds_stop_a_system_past_its_timeout():
    entries = [_FakeEntry("slow"), _FakeEntry("fast")]
    cost = {"slow": 5000.0, "fast": 1.0}
    bench_dynet.time_in_rounds(entries, total=4, block=1, timeout=3.0,
                               run=lambda e, first, count: {"block_ms": cost[e.name]})
    assert [len(e.blocks) for e in entries] == [1, 4]
    assert entries[0].cut and not entries[1].cut


def test_run_block_waits_once_unless_each_batch_is_timed():
    events = []

    def step(batch):
        events.append("step")
        return batch[0], {"nodes": 1}

    def value(loss):
        events.append("read")
        return float(loss)

    block = bench_dynet_common.run_block(step, [[1, 2], [3]], lambda: events.append("sync"),
                                         each=False, value=value)
    assert events == ["sync", "step", "step", "sync", "read", "read"]
    assert block["sentences"] == [2, 1] and block["losses"] == [1.0, 3.0]
    assert block["batch_ms"] == [] and block["block_ms"] > 0
    events.clear()
    block = bench_dynet_common.run_block(step, [[1, 2], [3]], lambda: events.append("sync"),
                                         each=True, value=value)
    assert events == ["sync", "step", "sync", "step", "sync", "sync", "read", "read"]
    assert len(block["batch_ms"]) == 2


def test_summaries_per_batch_and_per_block():
    entry = _FakeEntry("a")
    entry.warmup = {"losses": [9.0]}
    entry.blocks = [{"block_ms": 100.0, "batch_ms": [40.0, 60.0], "sentences": [4, 4],
                     "losses": [1.0, 2.0], "stats": []},
                    {"block_ms": 50.0, "batch_ms": [50.0], "sentences": [2],
                     "losses": [3.0], "stats": []}]
    each = bench_dynet.summarize(entry, each=True)
    assert each["sentences_per_s"] == pytest.approx(66.666, rel=1e-3)   # of 100, 66.7, 40
    assert each["losses"] == [9.0, 1.0, 2.0, 3.0] and each["batches"] == 3
    blocks = bench_dynet.summarize(entry, each=False)
    assert blocks["sentences_per_s"] == pytest.approx(60.0)           # of 80 and 40
    assert blocks["mean_sentences_per_s"] == pytest.approx(10000 / 150)
    assert blocks["rounds"] == 2 and blocks["timing"] == "block"


def test_worker_request_loop_answers_errors_and_goes_on():
    class Fake:
        def double(self, x):
            return 2 * x

        def broken(self):
            raise ValueError("no")

    requests = io.StringIO("\n".join(json.dumps(m) for m in [
        {"cmd": "double", "args": {"x": 4}}, {"cmd": "broken"},
        {"cmd": "double", "args": {"x": 1}}, {"cmd": "quit"},
        {"cmd": "double", "args": {"x": 7}}]) + "\n")
    answers = io.StringIO()
    bench_dynet_worker.serve(Fake(), requests, answers)
    replies = [json.loads(line) for line in answers.getvalue().splitlines()]
    assert replies == [{"ok": True, "result": 8},
                       {"ok": False, "error": "ValueError: no"},
                       {"ok": True, "result": 2}, {"ok": True, "result": None}]


def _smoke(out_dir, *extra):
    done = subprocess.run(
        [sys.executable, BENCH, "--quick", "--max-trees", "60", "--dims", "8/8",
         "--tagger-dims", "8/8", "--tree-batch", "4", "--tagger-batch", "4",
         "--configs", "depth:imperative", "--out-dir", str(out_dir)] + list(extra),
        capture_output=True, text=True, timeout=400, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("bench_dynet.md", "bench_dynet.csv", "bench_dynet.json"):
        assert (out_dir / name).is_file(), name
    return json.loads((out_dir / "bench_dynet.json").read_text()), \
        (out_dir / "bench_dynet.md").read_text()


def _check_rows(report, name, keys):
    """Every system has a row with both figures and matching losses."""
    rows = report["workloads"][name]
    assert [row["key"] for row in rows] == keys
    for row in rows:
        if row["kind"] == "dynet" and not HAVE_DYNET:
            assert "not installed" in row["note"]
            continue
        assert row["train"] > 0 and row["infer"] > 0, row["system"]
        assert row["train_batches"] == 2 and row["infer_batches"] == 2
        assert row["train_rounds"] == 2 and row["infer_rounds"] == 2
        for mode in ("train", "infer"):
            first = row[mode + "_loss_gap_first"]
            assert (first is None) == (row["key"] == "eager")
            assert first is None or first < 1e-4, (row["system"], mode)
            gap = row[mode + "_loss_gap"]
            assert gap is None or gap < 1e-3, (row["system"], mode, gap)
    for row in report["processes"][name]:
        if row["pid"] is not None:         # it ran
            assert (row["train_timing"], row["infer_timing"]) == ("batch", "block")
            assert row["train_warmup"] == 1 and row["max_rss_mb"] > 0


@pytest.mark.skipif(SST_DIR is None, reason="SST data not found "
                    "(expected ../shared/data/sst)")
def test_quick_smoke_run_a_process_per_system(tmp_path):
    report, text = _smoke(tmp_path, "--workloads", "treelstm")
    keys = ["eager", "gdb-cell-depth:imperative", "gdb-op-depth:imperative",
            "hand", "hand-sparse", "dynet-0", "dynet-1"]
    _check_rows(report, "treelstm 8/8", keys)
    procs = report["processes"]["treelstm 8/8"]
    pids = [row["pid"] for row in procs if HAVE_DYNET or "dynet" not in row["key"]]
    assert len(set(pids)) == len(pids)               # one process each
    assert all(row["hosted"] == 1 for row in procs if row["pid"])
    assert {row["infer_timing"] for row in procs if row["pid"]} == {"block"}
    rows = {row["key"]: row for row in report["workloads"]["treelstm 8/8"]}
    assert rows["hand-sparse"]["train_x_hand_sparse"] == pytest.approx(1.0)
    assert rows["gdb-op-depth:imperative"]["train_x_eager"] > 0
    for label in ("eager Gluon", "cell-written depth:imperative", "op-by-op",
                  "dense embedding gradient", "sparse embedding gradient",
                  "DyNet autobatch=1", "How each system ran", "rounds of 1"):
        assert label in text, label
    with open(tmp_path / "bench_dynet.csv") as handle:
        tables = {row["table"] for row in csv.DictReader(handle)}
    assert tables == {"summary", "processes", "gluon_dynbatch"}
    if not HAVE_DYNET:
        assert "skipped: dynet38 not installed" in text


@pytest.mark.skipif(SST_DIR is None, reason="SST data not found "
                    "(expected ../shared/data/sst)")
def test_quick_smoke_run_shared_process_one_thread(tmp_path):
    report, text = _smoke(tmp_path, "--workloads", "tagger,batchsize",
                          "--sizes", "2,4", "--threads", "1",
                          "--gluon-processes", "shared")
    _check_rows(report, "tagger 8/8", ["eager", "gdb-depth:imperative",
                                       "dynet-0", "dynet-1"])
    procs = report["processes"]["tagger 8/8"]
    gluon = [row for row in procs if not row["key"].startswith("dynet")]
    assert len({row["pid"] for row in gluon}) == 1 and gluon[0]["hosted"] == 2
    for row in procs:
        if row["pid"]:
            assert row["cores"] == [row["cores"][0]]
            assert row["OMP_NUM_THREADS"] == "1"
    assert "--threads 1" in report["env"]["threads"]
    sweep = report["sweep"]
    assert {row["size"] for row in sweep} == {2, 4}
    systems = {row["key"] for row in sweep if row["train"]}
    assert {"gdb-cell-depth:imperative", "gdb-op-depth:imperative",
            "hand-sparse"} <= systems
    assert (tmp_path / "batch_size.png").is_file()
    assert "## Batch size" in text


def test_dynet_worker_without_dynet_says_skipped(tmp_path, monkeypatch):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "dynet_config.py").write_text("raise ImportError('no dynet')\n")
    env = dict(os.environ, PYTHONPATH=str(fake))
    done = subprocess.run([sys.executable, WORKER, "dynet"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=REPO_ROOT)
    assert done.returncode == bench_dynet.DYNET_MISSING
    assert "skipped: dynet38 not installed" in done.stderr
    monkeypatch.setenv("PYTHONPATH", str(fake))
    worker = bench_dynet.WorkerProcess("dynet", "test", None, 1, autobatch=1)
    with pytest.raises(bench_dynet.WorkerError) as info:
        worker.call("env", timeout=60)
    worker.close()
    assert info.value.skipped and "not installed" in str(info.value)
