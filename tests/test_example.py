"""Tests of the SICK Tree-LSTM example: model, training, batching, CLI."""
import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import gluon_dynbatch as gdb  # noqa: E402
from examples import tree_lstm_sick as script  # noqa: E402
from examples.sick_data import (Tree, load_split, parse_parents,  # noqa: E402
                                random_corpus, write_split)
from examples.sick_model import (ChildSumLSTMCell,  # noqa: E402
                                 ChildSumTreeLSTM, SimilarityHead,
                                 SimilarityModel, batch_targets, make_loss,
                                 predict_scores)

SICK_DIR = Path(__import__("os").environ.get("GDB_TEST_SICK_DIR", REPO_ROOT.parent / "shared" / "data" / "sick"))
EMBED_DIM = 50


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_cell(params, x, child_h, child_c, output_gate=True):
    """Reference Child-Sum Tree-LSTM node update in numpy (float64)."""
    w_x, b_x, u_iou, u_f = (params[k].astype(np.float64) for k in
                            ("x_weight", "x_bias", "h_iou_weight",
                             "h_f_weight"))
    hid = u_f.shape[0]
    n_iou = 3 if output_gate else 2
    x_all = x @ w_x.T + b_x
    iou = (x_all[:, :n_iou * hid]
           + child_h.sum(axis=0, keepdims=True) @ u_iou.T)
    i = sigmoid(iou[:, :hid])
    u = np.tanh(iou[:, (n_iou - 1) * hid:])
    f = sigmoid(child_h @ u_f.T + x_all[:, n_iou * hid:])
    c = i * u + (f * child_c).sum(axis=0, keepdims=True)
    if not output_gate:
        return np.tanh(c), c
    o = sigmoid(iou[:, hid:2 * hid])
    return o * np.tanh(c), c


def numpy_tree(params, tree, table):
    """Reference encoder: recursion over children with numpy_cell."""
    hid = params["h_f_weight"].shape[0]
    states = [numpy_tree(params, child, table) for child in tree.children]
    if states:
        child_h = np.concatenate([h for h, _ in states])
        child_c = np.concatenate([c for _, c in states])
    else:
        child_h = child_c = np.zeros((1, hid))
    return numpy_cell(params, table[tree.word:tree.word + 1], child_h,
                      child_c)


def cell_params(cell):
    return {name: getattr(cell, name).data().asnumpy()
            for name in ("x_weight", "x_bias", "h_iou_weight", "h_f_weight")}


@pytest.fixture(scope="module")
def pairs():
    """Twelve pairs with word ids: real SICK dev pairs, else random ones."""
    if (SICK_DIR / "dev").is_dir():
        data = load_split(SICK_DIR, "dev")[:12]
    else:
        data = random_corpus(12, seed=5)
    vocab = script.build_vocab(data)
    script.attach_vocab(data, vocab)
    return data


@pytest.fixture(scope="module")
def embeddings(pairs):
    n_words = 1 + max(n.word for p in pairs
                      for t in (p.a_tree, p.b_tree) for n in t)
    rng = np.random.RandomState(0)
    return mx.nd.array(rng.uniform(-0.5, 0.5, (n_words, EMBED_DIM)))


def new_model(memory=30, hidden=20, seed=0, dynbatch=True):
    mx.random.seed(seed)
    model = SimilarityModel(EMBED_DIM, memory, hidden, dynbatch=dynbatch)
    model.initialize()
    return model


def test_cell_matches_numpy_reference():
    mx.random.seed(1)
    cell = ChildSumLSTMCell(8, 6)
    cell.initialize(init=mx.init.Uniform(0.5))
    cell.x_bias.set_data(mx.nd.random.uniform(-0.5, 0.5, (32,)))
    rng = np.random.RandomState(1)
    x = rng.randn(1, 6)
    child_h, child_c = rng.randn(3, 8), rng.randn(3, 8)
    h, c = cell(*(mx.nd.array(a) for a in (x, child_h, child_c)))
    assert h.shape == (1, 8) and c.shape == (1, 8)
    ref_h, ref_c = numpy_cell(cell_params(cell), x, child_h, child_c)
    np.testing.assert_allclose(c.asnumpy(), ref_c, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h.asnumpy(), ref_h, rtol=1e-4, atol=1e-5)
    # Each child has its own forget gate: swapping one child's memory
    # between two children changes c unless their gates agree.
    swapped = child_c[[1, 0, 2]]
    _, c2 = cell(*(mx.nd.array(a) for a in (x, child_h, swapped)))
    assert np.abs(c2.asnumpy() - c.asnumpy()).max() > 1e-4


def test_cell_without_output_gate_matches_numpy_reference():
    mx.random.seed(6)
    cell = ChildSumLSTMCell(8, 6, output_gate=False)
    cell.initialize(init=mx.init.Uniform(0.5))
    assert cell.x_weight.shape == (24, 6)
    assert cell.h_iou_weight.shape == (16, 8)
    cell.x_bias.set_data(mx.nd.random.uniform(-0.5, 0.5, (24,)))
    rng = np.random.RandomState(6)
    x = rng.randn(1, 6)
    child_h, child_c = rng.randn(2, 8), rng.randn(2, 8)
    h, c = cell(*(mx.nd.array(a) for a in (x, child_h, child_c)))
    ref_h, ref_c = numpy_cell(cell_params(cell), x, child_h, child_c,
                              output_gate=False)
    np.testing.assert_allclose(c.asnumpy(), ref_c, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h.asnumpy(), ref_h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h.asnumpy(), np.tanh(c.asnumpy()),
                               rtol=1e-5, atol=1e-6)


def test_encoder_matches_numpy_recursion(pairs, embeddings):
    mx.random.seed(2)
    encoder = ChildSumTreeLSTM(16, EMBED_DIM)
    encoder.initialize(init=mx.init.Uniform(0.3))
    params = cell_params(encoder.cell)
    table = embeddings.asnumpy().astype(np.float64)
    for tree in (pairs[0].a_tree, pairs[3].b_tree):
        h, c = encoder(tree, embeddings)
        ref_h, ref_c = numpy_tree(params, tree, table)
        np.testing.assert_allclose(h.asnumpy(), ref_h, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(c.asnumpy(), ref_c, rtol=1e-4, atol=1e-5)


def test_encoder_leaf_uses_zero_children(embeddings):
    encoder = ChildSumTreeLSTM(16, EMBED_DIM)
    encoder.initialize()
    leaf = Tree(0, word=3)
    h, c = encoder(leaf, embeddings)
    zeros = mx.nd.zeros((1, 16))
    h2, c2 = encoder.cell(embeddings[3:4], zeros, zeros)
    np.testing.assert_array_equal(h.asnumpy(), h2.asnumpy())
    np.testing.assert_array_equal(c.asnumpy(), c2.asnumpy())
    with pytest.raises(ValueError, match="no word id"):
        encoder(parse_parents([0]), embeddings)


def test_head_returns_log_probabilities():
    head = SimilarityHead(16, 10)
    head.initialize()
    h_a, h_b = mx.nd.random.normal(shape=(4, 16)), mx.nd.random.normal(
        shape=(4, 16))
    out = head(h_a, h_b)
    assert out.shape == (4, 5)
    np.testing.assert_allclose(np.exp(out.asnumpy()).sum(axis=1), 1.0,
                               rtol=1e-5)
    # Symmetric in its two inputs: features are h_a*h_b and |h_a-h_b|.
    np.testing.assert_allclose(head(h_b, h_a).asnumpy(), out.asnumpy(),
                               rtol=1e-6)


def test_loss_is_kl_divergence(pairs):
    targets = batch_targets(pairs[:4])
    logits = np.random.RandomState(3).randn(4, 5)
    log_q = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    p = targets.asnumpy().astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = np.where(p > 0, p * (np.log(p) - log_q), 0.0).sum(axis=1)
    loss = make_loss()(mx.nd.array(log_q), targets)
    np.testing.assert_allclose(loss.asnumpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predict_scores(targets.log()),
                               [p.score for p in pairs[:4]], rtol=1e-5)


def test_model_owns_trainable_embeddings(pairs, embeddings):
    mx.random.seed(7)
    model = SimilarityModel(EMBED_DIM, 16, 8, num_words=embeddings.shape[0])
    model.initialize()
    model.embedding.set_data(embeddings)
    assert model.embedding.wd_mult == 0.0
    assert "embedding" in "".join(model.collect_params().keys())
    batch = pairs[:4]
    np.testing.assert_allclose(model(batch).asnumpy(),
                               model(batch, embeddings).asnumpy(),
                               rtol=1e-6)
    loss, grads = loss_and_grads(model, batch, None)
    assert loss.shape == (4,)
    grad = grads[model.embedding.name]
    used = sorted({n.word for p in batch for t in (p.a_tree, p.b_tree)
                   for n in t})
    assert np.abs(grad[used]).max() > 0
    unused = np.setdiff1d(np.arange(grad.shape[0]), used)
    assert np.all(grad[unused] == 0)
    with pytest.raises(ValueError, match="no embedding table"):
        new_model()(batch)


def test_add_l2_matches_tai_penalty(pairs, embeddings):
    mx.random.seed(8)
    model = SimilarityModel(EMBED_DIM, 16, 8, num_words=embeddings.shape[0])
    model.initialize()
    model.embedding.set_data(embeddings)
    batch = pairs[:4]
    _, before = loss_and_grads(model, batch, None)
    script.add_l2(model, 1e-3, len(batch))
    scale = 1e-3 * model.num_classes * len(batch)
    for name, param in model.collect_params().items():
        after = param.grad().asnumpy()
        if param is model.embedding:
            np.testing.assert_array_equal(after, before[name])
        else:
            np.testing.assert_allclose(
                after, before[name] + scale * param.data().asnumpy(),
                rtol=1e-5, atol=1e-8, err_msg=name)
    script.add_l2(model, 0.0, len(batch))  # a no-op


def test_vocab_adds_pretrained_eval_words():
    train = random_corpus(6, seed=20, vocab_size=30)
    held_out = random_corpus(6, seed=21, vocab_size=60)
    glove = {f"w{i}" for i in range(45)}  # stands in for TokenEmbedding
    extra = script.pretrained_eval_tokens(held_out, glove)
    assert extra and extra <= glove
    vocab = script.build_vocab(train, extra)
    assert script.build_vocab(train, sorted(extra)).idx_to_token == \
        vocab.idx_to_token
    assert all(tok in vocab for tok in extra)
    assert script.attach_vocab(train, vocab) == 0
    unknown = sum(1 for p in held_out for t in p.a_tokens + p.b_tokens
                  if t not in glove and t not in vocab)
    assert script.attach_vocab(held_out, vocab) == unknown
    assert script.pretrained_eval_tokens(held_out, None) == set()


def test_forward_shapes_and_one_batching_scope(pairs, embeddings,
                                               monkeypatch):
    entered = []
    real = gdb.batching

    def counting(*args, **kwargs):
        entered.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gdb, "batching", counting)
    model = new_model()
    out = model(pairs[:5], embeddings)
    assert out.shape == (5, 5)
    assert len(entered) == 1
    model.dynbatch = False
    model(pairs[:5], embeddings)
    assert len(entered) == 1


def test_training_loss_falls(pairs, embeddings):
    batch = pairs[:10]
    model = new_model()
    trainer = gluon.Trainer(model.collect_params(), "adagrad",
                            {"learning_rate": 0.1})
    loss_fn = make_loss()
    losses = [script.train_step(model, trainer, loss_fn, batch,
                                embeddings).asscalar() / len(batch)
              for _ in range(10)]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.7 * losses[0], losses
    assert min(losses[-3:]) < min(losses[:3])


def loss_and_grads(model, batch, embeddings):
    targets = batch_targets(batch)
    with autograd.record():
        loss = make_loss()(model(batch, embeddings), targets)
    loss.backward()
    grads = {name: p.grad().asnumpy().copy()
             for name, p in model.collect_params().items()}
    return loss.asnumpy(), grads


def test_dynbatch_matches_eager(pairs, embeddings):
    model = new_model(memory=40, hidden=20, seed=4)
    batch = pairs[:8]
    model.dynbatch = False
    loss_e, grads_e = loss_and_grads(model, batch, embeddings)
    pred_e = model(batch, embeddings).asnumpy()
    model.dynbatch = True
    loss_b, grads_b = loss_and_grads(model, batch, embeddings)
    pred_b = model(batch, embeddings).asnumpy()
    assert loss_b.shape == (8,)
    np.testing.assert_allclose(loss_b, loss_e, rtol=1e-5)
    np.testing.assert_allclose(pred_b, pred_e, rtol=1e-5, atol=1e-6)
    assert grads_b.keys() == grads_e.keys()
    for name, grad in grads_e.items():
        assert np.abs(grad).max() > 0, f"zero gradient for {name}"
        np.testing.assert_allclose(grads_b[name], grad, rtol=1e-4,
                                   atol=1e-6, err_msg=name)


# ---------------------------------------------------------------------------
# The command-line script


@pytest.fixture(scope="module")
def tiny_sick(tmp_path_factory):
    """A small SICK-layout directory built from the random corpus."""
    root = tmp_path_factory.mktemp("sick")
    for split, n, seed in (("train", 16, 10), ("dev", 8, 11),
                           ("test", 8, 12)):
        write_split(random_corpus(n, seed=seed), root, split)
    return root


def run_script(data_dir, save_dir, *extra):
    argv = ["--data-dir", str(data_dir), "--save-dir", str(save_dir),
            "--epochs", "2", "--batch-size", "8", "--memory", "20",
            "--hidden", "10", "--log-interval", "1", "--glove", "random",
            *extra]
    return script.main(argv)


def read_summary(save_dir):
    with open(Path(save_dir) / "summary.json", encoding="utf-8") as handle:
        return json.load(handle)


def test_help_lists_flags(capsys):
    with pytest.raises(SystemExit) as info:
        script.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--data-dir", "--glove", "--offline", "--synthetic",
                 "--epochs", "--batch-size", "--lr",
                 "--wd", "--hidden", "--max-pairs", "--seed", "--strategy",
                 "--no-dynbatch", "--compare", "--resume", "--save-dir",
                 "--log-interval", "--l2", "--tune-embeddings",
                 "--embed-lr", "--no-output-gate", "--ensemble",
                 "--full", "--encoder"):
        assert flag in text


def test_full_preset_and_explicit_flags():
    args = script.parse_args(["--full"])
    for key, value in script.FULL_PRESET.items():
        assert getattr(args, key) == value, key
    args = script.parse_args(["--full", "--epochs", "3", "--seed", "1"])
    assert args.epochs == 3 and args.seed == 1
    assert script.parse_args([]).epochs == 2


@pytest.mark.parametrize("flag", ["--memory", "--hidden"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_layer_sizes_below_one_are_refused_by_the_parser(flag, value, capsys):
    with pytest.raises(SystemExit) as info:
        script.parse_args([flag, value])
    assert info.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--l2", "--embed-lr"])
def test_script_rejects_negative_rates(tmp_path, capsys, flag):
    assert run_script(tmp_path / "nowhere", tmp_path / "run", flag,
                      "-1") == 2
    assert "must not be negative" in capsys.readouterr().err


def test_script_tuned_embeddings_l2_no_output_gate(tiny_sick, tmp_path):
    extra = ("--tune-embeddings", "--embed-lr", "0.02", "--l2", "1e-4",
             "--wd", "0", "--no-output-gate")
    run_a = tmp_path / "a"
    assert run_script(tiny_sick, run_a, *extra) == 0
    summary = read_summary(run_a)
    assert summary["args"]["tune_embeddings"] is True
    assert summary["args"]["l2"] == 1e-4
    assert summary["unknown_tokens"]["train"] == 0
    saved = mx.nd.load(str(run_a / "best.params"))
    assert any(key.endswith("embedding") for key in saved)
    assert script.main(["--evaluate", str(run_a / "best.params")]) == 0
    scores = json.loads((run_a / "best.evaluation.json").read_text())
    for key, value in summary["test"].items():
        assert scores["test"][key] == pytest.approx(value, abs=1e-6)


def test_script_end_to_end_resume_and_eager(tiny_sick, tmp_path, capsys):
    run_a = tmp_path / "a"
    assert run_script(tiny_sick, run_a) == 0
    summary = read_summary(run_a)
    assert summary["data"] == "sick"
    assert set(summary["test"]) == {"pearson", "spearman", "mse"}
    assert summary["train_pairs_per_s"] > 0
    assert summary["args"]["epochs"] == 2
    assert summary["best_dev"]["epoch"] in (1, 2)
    assert (run_a / "best.params").is_file()
    assert "pearson" in capsys.readouterr().out

    assert script.main(["--evaluate", str(run_a)]) == 0
    scores = json.loads((run_a / "best.evaluation.json").read_text())
    for key, value in summary["test"].items():
        assert scores["test"][key] == pytest.approx(value, abs=1e-6)
    assert scores["dev"]["pearson"] == pytest.approx(
        summary["best_dev"]["pearson"], abs=1e-6)

    run_c = tmp_path / "c"
    assert run_script(tiny_sick, run_c, "--no-dynbatch") == 0
    for key, value in summary["test"].items():
        assert read_summary(run_c)["test"][key] == pytest.approx(value,
                                                                 abs=1e-3)


def test_script_opbyop_encoder_batched_and_eager(tiny_sick, tmp_path):
    run_a = tmp_path / "a"
    assert run_script(tiny_sick, run_a, "--encoder", "opbyop",
                      "--epochs", "1") == 0
    summary = read_summary(run_a)
    assert summary["args"]["encoder"] == "opbyop"
    saved = mx.nd.load(str(run_a / "best.params"))
    assert "encoder.f_h.weight" in saved
    assert not any(key.endswith("h_f_weight") for key in saved)
    run_b = tmp_path / "b"
    assert run_script(tiny_sick, run_b, "--encoder", "opbyop",
                      "--epochs", "1", "--no-dynbatch") == 0
    for key, value in summary["test"].items():
        assert np.isfinite(value)
        assert read_summary(run_b)["test"][key] == pytest.approx(value,
                                                                 abs=1e-3)


def test_script_ensemble(tiny_sick, tmp_path, capsys):
    single = tmp_path / "single"
    assert run_script(tiny_sick, single, "--tune-embeddings") == 0
    run = tmp_path / "ens"
    assert run_script(tiny_sick, run, "--tune-embeddings", "--ensemble",
                      "2") == 0
    summary = read_summary(run)
    members = summary["members"]
    assert [m["seed"] for m in members] == [42, 43]
    assert len(summary["best_dev"]["epochs"]) == 2
    for k in (1, 2):
        assert (run / f"member{k}" / "best.params").is_file()
    # The first member is the model of the run without --ensemble.
    first = read_summary(single)
    assert members[0]["best_dev"] == first["best_dev"]
    assert members[0]["test"] == pytest.approx(first["test"], abs=1e-6)
    assert "member 2 test" in capsys.readouterr().err
    assert run_script(tiny_sick, tmp_path / "bad", "--ensemble", "2",
                      "--resume", str(run / "member1" / "best.params")) == 2
    assert run_script(tiny_sick, tmp_path / "bad", "--ensemble", "0") == 2


def test_script_malformed_data_exits_2(tiny_sick, tmp_path, capsys):
    bad = tmp_path / "bad"
    for split in ("train", "dev", "test"):
        write_split(load_split(tiny_sick, split), bad, split)
    parents = bad / "dev" / "b.parents"
    lines = parents.read_text().splitlines()
    heads = [int(x) for x in lines[4].split()]
    root = heads.index(0)
    heads[root] = (root + 1) % len(heads) + 1  # no root, or a self-loop
    lines[4] = " ".join(map(str, heads))
    parents.write_text("\n".join(lines) + "\n")
    assert run_script(bad, tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert f"{parents}:5:" in err
    assert "root" in err or "cycle" in err


def test_script_missing_data_dir_exits_2(tmp_path, capsys):
    code = run_script(tmp_path / "nowhere", tmp_path / "run",
                      "--max-pairs", "16", "--epochs", "1")
    assert code == 2
    err = capsys.readouterr().err
    assert "nowhere is not a directory" in err and "a.parents" in err
    assert "--synthetic" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "summary.json").exists()


def test_script_synthetic_smoke_run(tmp_path, capsys):
    code = script.main(["--synthetic", "--save-dir", str(tmp_path / "run"),
                        "--max-pairs", "16", "--max-eval-pairs", "8",
                        "--epochs", "1", "--memory", "10", "--hidden", "6"])
    assert code == 0
    assert "MEAN NOTHING" in capsys.readouterr().err
    summary = read_summary(tmp_path / "run")
    assert summary["data"] == "synthetic" and summary["glove"] is None


def test_script_unknown_glove_exits_2(tiny_sick, tmp_path, capsys):
    assert run_script(tiny_sick, tmp_path / "run", "--glove",
                      "glove.7B.51d") == 2
    err = capsys.readouterr().err
    assert "glove.7B.51d" in err and "glove.840B.300d" in err


def test_script_compare(tiny_sick, tmp_path, capsys):
    assert run_script(tiny_sick, tmp_path / "run", "--compare", "2") == 0
    out = capsys.readouterr().out
    assert "speedup x" in out and "eager" in out
    assert not (tmp_path / "run" / "summary.json").exists()
