"""Tests of the SST benchmark pieces: tree parsing, vocabulary, the Gluon
Tree-LSTM model and its equivalence with the DyNet implementation in
scripts/dynet_treelstm.py (same weights -> same loss, before and after Adam).

Tests on the real SST files skip where ../shared/data/sst is absent; tests of
the DyNet side skip where dynet is not installed.
"""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import gluon_dynbatch as gdb  # noqa: E402
from examples import sst_model  # noqa: E402
from examples.sst_data import (  # noqa: E402
    UNK, SSTFormatError, SSTTree, assign_ids, build_vocab, default_sst_dir,
    load_sst, parse_sst_line)

DYNET_SCRIPT = os.path.join(REPO_ROOT, "scripts", "dynet_treelstm.py")
SST_DIR = default_sst_dir()
HAVE_DYNET = importlib.util.find_spec("dynet") is not None

needs_sst = pytest.mark.skipif(SST_DIR is None, reason="SST data not found "
                               "(expected ../shared/data/sst)")
needs_dynet = pytest.mark.skipif(not HAVE_DYNET, reason="dynet not installed "
                                 "(pip install dynet38)")

SMALL_TREES = [
    "(3 (2 The) (4 (3 good) (2 film)))",
    "(1 (2 (2 A) (1 dull)) (2 (2 film) (2 .)))",
    "(4 (4 great) (2 .))",
    "(2 film)",
    "(0 (1 (0 (1 awful) (2 ,)) (1 (2 dull) (2 film))) (2 .))",
]


def small_trees():
    """The synthetic trees, with ids from a vocabulary built from them."""
    trees = [parse_sst_line(line, "small:%d" % i)
             for i, line in enumerate(SMALL_TREES, 1)]
    return assign_ids(trees, build_vocab(trees))


# --------------------------------------------------------------------- parser

def test_parse_good_tree():
    tree = parse_sst_line("(3 (2 The) (4 (3 good) (2 film)))", "x.txt:1")
    assert tree.label == 3 and tree.word is None and len(tree.children) == 2
    left, right = tree.children
    assert left.is_preterminal and left.word == "The" and left.children == []
    assert [n.label for n in tree.postorder()] == [2, 3, 2, 4, 3]
    assert tree.words() == ["The", "good", "film"]
    assert tree.depth() == 3 and tree.is_binary()
    assert tree.to_string() == "(3 (2 The) (4 (3 good) (2 film)))"


def test_parse_single_preterminal_and_spacing():
    tree = parse_sst_line("  (2   film )\n", "x.txt:2")
    assert tree.is_preterminal and tree.word == "film" and tree.label == 2
    assert tree.postorder() == [tree]


def test_no_break_space_stays_inside_a_word():
    tree = parse_sst_line("(2 (2 8\u00a01\\/2) (2 .))", "x.txt:3")
    assert tree.words() == ["8\u00a01\\/2", "."]


@pytest.mark.parametrize("line, message", [
    ("(3 (2 a) (2 b)", "not closed"),
    ("(3 (2 a) (2 b)))", "after the end of the tree"),
    ("(3 (2 a)) (2 b)", "after the end of the tree"),
    ("(x a)", "expected a label"),
    ("(7 a)", "outside 0-4"),
    ("(2 )", "no word and no children"),
    ("(2 a b)", "more than one child"),
    ("(2 (2 a) b)", "more than one child"),
    ("(2 a (2 b))", "mixes the word"),
    ("a (2 b)", "must start with '('"),
    ("", "empty line"),
    ("(3 (2 a) (", "line ends after"),
    ("(2", "not closed"),
])
def test_malformed_lines_raise_with_source(line, message):
    with pytest.raises(SSTFormatError) as info:
        parse_sst_line(line, "bad.txt:17")
    text = str(info.value)
    assert text.startswith("bad.txt:17: ") and message in text


def test_load_names_file_and_line(tmp_path):
    lines = SMALL_TREES[:2] + ["", "(3 (2 a) (2 b)"]
    (tmp_path / "dev.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(SSTFormatError, match=r"dev\.txt:4: unbalanced"):
        load_sst(str(tmp_path), "dev")


def test_load_skips_blank_lines(tmp_path):
    path = tmp_path / "test.txt"
    path.write_text("\n" + SMALL_TREES[0] + "\n\n" + SMALL_TREES[2] + "\n")
    trees = load_sst(str(tmp_path), "test")
    assert [t.to_string() for t in trees] == [SMALL_TREES[0], SMALL_TREES[2]]


def test_load_missing_file_and_bad_split(tmp_path):
    with pytest.raises(FileNotFoundError, match="train.txt"):
        load_sst(str(tmp_path), "train")
    with pytest.raises(ValueError, match="unknown SST split"):
        load_sst(str(tmp_path), "validation")


_WORDS = st.text(alphabet="abcXYZ.,'`-\\/\u00a0", min_size=1, max_size=4)
_LABELS = st.integers(0, 4)
_TREES = st.recursive(
    st.builds(lambda label, word: SSTTree(label, word=word), _LABELS, _WORDS),
    lambda kids: st.builds(lambda label, a, b: SSTTree(label, children=[a, b]),
                           _LABELS, kids, kids),
    max_leaves=12)


@settings(deadline=None)
@given(_TREES)
def test_roundtrip_random_trees(tree):
    text = tree.to_string()
    parsed = parse_sst_line(text, "gen")
    assert parsed.to_string() == text
    assert [n.label for n in parsed.postorder()] == \
        [n.label for n in tree.postorder()]


# ---------------------------------------------------------------- vocabulary

def test_vocab_ids_and_unknown_words():
    trees = small_trees()
    vocab = build_vocab(trees)
    assert vocab[UNK] == 0
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert set(vocab) == {UNK, "The", "good", "film", "A", "dull", "great",
                          ".", "awful", ","}
    assert build_vocab(list(reversed(trees))) == vocab
    unseen = assign_ids([parse_sst_line("(2 (2 film) (2 zebra))", "u")], vocab)
    ids = [n.word_id for n in unseen[0].postorder() if n.is_preterminal]
    assert ids == [vocab["film"], vocab[UNK]]


@pytest.fixture(scope="module")
def sst_train():
    if SST_DIR is None:
        pytest.skip("SST data not found (expected ../shared/data/sst)")
    return load_sst(SST_DIR, "train")


@needs_sst
def test_real_sst_files(sst_train):
    assert len(sst_train) == 8544
    assert len(load_sst(SST_DIR, "dev")) == 1101
    assert all(tree.is_binary() for tree in sst_train)
    labels = {node.label for tree in sst_train[:500]
              for node in tree.postorder()}
    assert labels == {0, 1, 2, 3, 4}
    vocab = build_vocab(sst_train)
    assert len(vocab) > 15000 and vocab[UNK] == 0


# --------------------------------------------------------------- Gluon model


def make(vocab_size, embed=7, hidden=5, seed=3, encoder="cell"):
    return sst_model.make_model(vocab_size, embed, hidden, seed=seed,
                                encoder=encoder)


def make_sensitive(vocab_size, embed, hidden, seed=4, encoder="cell"):
    """A model with large random weights and biases.

    With the default small initialisation the states stay near zero and a
    wrong gate or weight changes the loss by less than the tolerance.
    """
    model = make(vocab_size, embed, hidden, encoder=encoder)
    rng = np.random.RandomState(seed)
    weights = {}
    for name, value in sst_model.get_weights(model).items():
        fan_in = value.shape[1] if value.ndim == 2 else 1
        scale = 1.0 if name == "embedding" else 1.5 / np.sqrt(fan_in)
        weights[name] = rng.normal(0, scale, value.shape).astype(np.float32)
    sst_model.set_weights(model, weights)
    return model


def loss_and_grads(model, trees, batched):
    with autograd.record():
        loss = sst_model.sst_loss(model(trees, batched), trees)
    loss.backward()
    grads = {name: p.grad().asnumpy()
             for name, p in model.collect_params().items()}
    return float(loss.asscalar()), grads


def test_gluon_loss_finite_and_gradients_exist():
    trees = small_trees()
    vocab = build_vocab(trees)
    model = make(len(vocab))
    outputs = model(trees, False)
    assert len(outputs) == len(trees)
    for h, c, tree_loss in outputs:
        assert h.shape == (1, 5) and c.shape == (1, 5) and tree_loss.shape == (1,)
    loss, grads = loss_and_grads(model, trees, batched=False)
    n_nodes = sum(len(t.postorder()) for t in trees)
    assert np.isfinite(loss) and 0.5 * n_nodes < loss < 3 * n_nodes
    for name, grad in grads.items():
        assert np.all(np.isfinite(grad)), name
        assert np.abs(grad).sum() > 0, "no gradient for %s" % name
    emb_grad = grads[model.embedding.name]
    assert np.abs(emb_grad[vocab[UNK]]).sum() == 0  # UNK row is never used
    assert np.abs(emb_grad[vocab["film"]]).sum() > 0


def test_gluon_loss_matches_numpy_reference():
    tree = parse_sst_line("(1 (3 good) (0 bad))", "ref")
    vocab = build_vocab([tree])
    assign_ids([tree], vocab)
    model = make_sensitive(len(vocab), embed=4, hidden=3)
    w = sst_model.get_weights(model)

    def sig(x):
        return 1 / (1 + np.exp(-x))

    def gates(z):
        return sig(z[:3]), sig(z[3:6]), np.tanh(z[6:])

    def leaf(word):
        i, o, u = gates(w["leaf_iou_weight"] @ w["embedding"][vocab[word]]
                        + w["leaf_iou_bias"])
        c = i * u
        return o * np.tanh(c), c

    def nll(h, label):
        z = w["out_weight"] @ h
        return np.log(np.exp(z).sum()) - z[label]

    (h1, c1), (h2, c2) = leaf("good"), leaf("bad")
    i, o, u = gates(w["iou_weight"] @ np.concatenate([h1, h2]) + w["iou_bias"])
    f1 = sig(w["forget_left_weight"] @ h1 + w["forget_bias"])
    f2 = sig(w["forget_right_weight"] @ h2 + w["forget_bias"])
    c = i * u + f1 * c1 + f2 * c2
    h = o * np.tanh(c)
    expected = nll(h1, 3) + nll(h2, 0) + nll(h, 1)
    got = sst_model.batch_loss(model, [tree], batched=False)
    assert got == pytest.approx(expected, rel=1e-5)


def test_batched_scope_matches_eager():
    trees = small_trees()
    vocab = build_vocab(trees)
    model = make(len(vocab))
    eager_loss, eager_grads = loss_and_grads(model, trees, batched=False)
    batched_loss, batched_grads = loss_and_grads(model, trees, batched=True)
    assert batched_loss == pytest.approx(eager_loss, rel=1e-5)
    for name, grad in eager_grads.items():
        np.testing.assert_allclose(batched_grads[name], grad, rtol=1e-4,
                                   atol=1e-6, err_msg=name)


def test_sst_loss_rejects_wrong_trees():
    trees = small_trees()
    model = make(len(build_vocab(trees)))
    outputs = model(trees[:2], False)
    with pytest.raises(ValueError, match="outputs"):
        sst_model.sst_loss(outputs, trees[:3])


def test_weights_roundtrip(tmp_path):
    trees = small_trees()
    vocab = build_vocab(trees)
    source, target = make(len(vocab), seed=1), make(len(vocab), seed=2)
    before = sst_model.batch_loss(target, trees, batched=False)
    weights = sst_model.get_weights(source)
    assert set(weights) == set(sst_model.WEIGHT_NAMES)
    sst_model.set_weights(target, weights)
    after = sst_model.batch_loss(target, trees, batched=False)
    assert after == pytest.approx(sst_model.batch_loss(source, trees, False))
    assert after != pytest.approx(before)
    path = str(tmp_path / "w.npz")
    sst_model.save_weights(source, path, vocab)
    with np.load(path) as data:
        assert list(data["vocab"]) == sorted(vocab, key=vocab.get)
        np.testing.assert_array_equal(data["out_weight"],
                                      weights["out_weight"])
    weights["out_weight"] = weights["out_weight"][:, :-1]
    with pytest.raises(ValueError, match="out_weight"):
        sst_model.set_weights(target, weights)


# ---------------------------------------------------- op-by-op encoder

def grads_by_weight_name(model):
    """Gradients keyed by :data:`sst_model.WEIGHT_NAMES` (model-independent)."""
    params = {name: getattr(model.tree_lstm, name)
              for name in sst_model.WEIGHT_NAMES[1:]}
    params["embedding"] = model.embedding
    return {name: p.grad().asnumpy() for name, p in params.items()}


def encoder_loss_and_grads(model, trees, **scope):
    """Loss and gradients by weight name; batched when ``scope`` is given."""
    with autograd.record():
        emb = model.embedding.data()
        if scope:
            with gdb.batching(**scope):
                outs = [model.tree_lstm(t, emb) for t in trees]
        else:
            outs = [model.tree_lstm(t, emb) for t in trees]
        loss = sst_model.sst_loss(outs, trees)
    loss.backward()
    return float(loss.asscalar()), grads_by_weight_name(model)


def mixed_trees():
    """The small trees plus deeper random binary ones, with ids."""
    rng = np.random.RandomState(11)
    words = ["The", "good", "film", "A", "dull", "great", ".", "awful", ","]

    def grow(leaves):
        if leaves == 1:
            return SSTTree(int(rng.randint(5)), word=words[rng.randint(len(words))])
        left = int(rng.randint(1, leaves))
        return SSTTree(int(rng.randint(5)), children=[grow(left), grow(leaves - left)])

    trees = [parse_sst_line(line, "small:%d" % i)
             for i, line in enumerate(SMALL_TREES, 1)]
    trees += [grow(n) for n in (7, 12, 3)]
    return assign_ids(trees, build_vocab(trees))


def test_opbyop_encoder_has_the_cell_encoders_parameters():
    trees = small_trees()
    vocab = build_vocab(trees)
    cell, op = make(len(vocab)), make(len(vocab), encoder="op")
    assert isinstance(op.tree_lstm, sst_model.OpByOpBinaryTreeLSTM)
    assert not op.tree_lstm._children          # no child blocks
    assert set(cell.tree_lstm._children) == {"leaf_cell", "internal_cell"}
    short = {name[len(cell.tree_lstm.prefix):]
             for name in cell.tree_lstm.collect_params()}
    assert short == {name[len(op.tree_lstm.prefix):]
                     for name in op.tree_lstm.collect_params()}
    # The same seed draws the same weights.
    for name, value in sst_model.get_weights(cell).items():
        np.testing.assert_array_equal(sst_model.get_weights(op)[name], value)
    with pytest.raises(ValueError, match="unknown encoder"):
        sst_model.SSTSentimentModel(10, 4, 3, encoder="opbyop")


def test_opbyop_equals_cell_model_eagerly(tmp_path):
    trees = mixed_trees()
    vocab = build_vocab(trees)
    cell = make_sensitive(len(vocab), embed=6, hidden=4)
    op = make(len(vocab), embed=6, hidden=4, seed=9, encoder="op")
    sst_model.set_weights(op, sst_model.get_weights(cell))
    cell_loss, cell_grads = encoder_loss_and_grads(cell, trees)
    op_loss, op_grads = encoder_loss_and_grads(op, trees)
    assert np.isfinite(cell_loss) and cell_loss > 0
    assert op_loss == pytest.approx(cell_loss, rel=1e-6)
    for name, grad in cell_grads.items():
        assert np.abs(grad).sum() > 0, name
        np.testing.assert_allclose(op_grads[name], grad, rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    # Parameter files load into either encoder.
    path = str(tmp_path / "cell.params")
    cell.save_parameters(path)
    other = make(len(vocab), embed=6, hidden=4, seed=5, encoder="op")
    other.load_parameters(path)
    assert sst_model.batch_loss(other, trees, batched=False) == \
        pytest.approx(cell_loss, rel=1e-6)


def test_opbyop_shares_a_cell_encoders_parameters():
    trees = small_trees()
    vocab = build_vocab(trees)
    cell = make_sensitive(len(vocab), embed=6, hidden=4)
    base = cell.tree_lstm
    shared = sst_model.OpByOpBinaryTreeLSTM(6, 4, prefix=base.prefix,
                                            params=base.collect_params())
    assert shared.out_weight is base.out_weight
    emb = cell.embedding.data()
    got = sst_model.sst_loss([shared(t, emb) for t in trees], trees)
    want = sst_model.sst_loss([base(t, emb) for t in trees], trees)
    assert float(got.asscalar()) == pytest.approx(float(want.asscalar()), rel=1e-6)


@pytest.mark.parametrize("strategy", ["depth", "agenda"])
@pytest.mark.parametrize("compiled", [False, True, "step"])
def test_opbyop_batched_equals_eager(strategy, compiled):
    trees = mixed_trees()
    vocab = build_vocab(trees)
    model = make_sensitive(len(vocab), embed=6, hidden=4, encoder="op")
    eager_loss, eager_grads = encoder_loss_and_grads(model, trees)
    loss, grads = encoder_loss_and_grads(model, trees, strategy=strategy,
                                         compiled=compiled)
    assert loss == pytest.approx(eager_loss, rel=1e-5)
    for name, grad in eager_grads.items():
        assert np.abs(grad).sum() > 0, name
        np.testing.assert_allclose(grads[name], grad, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


# ------------------------------------------------------ Gluon == DyNet check

def run_dynet(args):
    done = subprocess.run([sys.executable, DYNET_SCRIPT] + args,
                          capture_output=True, text=True, timeout=120)
    return done


def gluon_and_dynet_losses(tmp_path, trees, vocab, embed=7, hidden=5, steps=3):
    """Losses of ``steps`` Adam steps on the same batch, Gluon and DyNet."""
    model = make_sensitive(len(vocab), embed, hidden)
    weights_file = str(tmp_path / "weights.npz")
    trees_file = str(tmp_path / "trees.txt")
    sst_model.save_weights(model, weights_file, vocab)
    with open(trees_file, "w") as handle:
        handle.write("\n".join(t.to_string() for t in trees) + "\n")
    trainer = gluon.Trainer(model.collect_params(), "adam")
    gluon_losses = [sst_model.train_step(model, trainer, trees, batched=False)
                    for _ in range(steps)]
    done = run_dynet(["--trees", trees_file, "--weights", weights_file,
                      "--embed", str(embed), "--hidden", str(hidden),
                      "--batch-size", str(len(trees)), "--warmup", "0",
                      "--train-batches", str(steps), "--mode", "train",
                      "--no-shuffle", "--autobatch", "1"])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["first_batch_loss"] == result["train"]["losses"][0]
    return gluon_losses, result["train"]["losses"]


@needs_dynet
def test_dynet_matches_gluon_on_small_trees(tmp_path):
    trees = small_trees()
    vocab = build_vocab(trees[:3])  # later trees hold unknown words
    assign_ids(trees, vocab)
    gluon_losses, dynet_losses = gluon_and_dynet_losses(tmp_path, trees, vocab)
    assert gluon_losses[0] > gluon_losses[-1]  # Adam steps do something
    np.testing.assert_allclose(dynet_losses, gluon_losses, rtol=1e-4)


@needs_dynet
@needs_sst
def test_dynet_matches_gluon_on_sst_trees(tmp_path, sst_train):
    vocab = build_vocab(sst_train)
    trees = load_sst(SST_DIR, "dev")[:2] + sst_train[:3]
    assign_ids(trees, vocab)
    gluon_losses, dynet_losses = gluon_and_dynet_losses(
        tmp_path, trees, vocab, embed=9, hidden=6, steps=2)
    np.testing.assert_allclose(dynet_losses, gluon_losses, rtol=1e-4)


def test_dynet_script_help():
    done = run_dynet(["--help"])
    assert done.returncode == 0
    for option in ("--autobatch", "--mode", "--weights", "--json-out"):
        assert option in done.stdout


@needs_dynet
def test_dynet_script_rejects_mismatched_weights(tmp_path):
    trees = small_trees()
    vocab = build_vocab(trees)
    weights_file = str(tmp_path / "w.npz")
    trees_file = str(tmp_path / "t.txt")
    sst_model.save_weights(make(len(vocab), 7, 5), weights_file, vocab)
    with open(trees_file, "w") as handle:
        handle.write("\n".join(SMALL_TREES) + "\n")
    done = run_dynet(["--trees", trees_file, "--weights", weights_file,
                      "--embed", "7", "--hidden", "6", "--batch-size", "5",
                      "--warmup", "0", "--train-batches", "1"])
    assert done.returncode != 0 and "shape" in done.stderr


# ------------------------------------------------------------- hand-batched

def test_handbatched_sst_equals_eager_loss_and_gradients():
    """The benchmark's hand-batched SST model is the same model as the per-node one."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
    from handbatched_sst import HandBatchedSST, SSTLevelPlan
    trees = small_trees()
    vocab = build_vocab(trees)
    model = make_sensitive(len(vocab), embed=6, hidden=4)
    eager_loss, eager_grads = loss_and_grads(model, trees, batched=False)
    hand = HandBatchedSST(model.tree_lstm, 4, 5, mx.cpu())
    with autograd.record():
        loss = hand(trees, model.embedding.data())
    loss.backward()
    assert float(loss.asscalar()) == pytest.approx(eager_loss, rel=1e-5)
    for name, param in model.collect_params().items():
        np.testing.assert_allclose(param.grad().asnumpy(), eager_grads[name],
                                   rtol=1e-4, atol=1e-5, err_msg=name)
    plan = SSTLevelPlan(trees)
    assert plan.num_nodes == sum(len(t.postorder()) for t in trees)
    assert plan.num_levels == max(t.depth() for t in trees)


def test_handbatched_sst_sparse_equals_eager_loss_and_gradients():
    """Rows looked up outside the CachedOp (row_sparse gradient): the same
    loss and gradients as the per-node model; lazy Adam moves only used rows."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
    from handbatched_sst import HandBatchedSST, sparse_embedding
    trees = mixed_trees()
    vocab = build_vocab(trees)
    vocab["unused"] = len(vocab)
    model = make_sensitive(len(vocab), embed=6, hidden=4)
    eager_loss, eager_grads = loss_and_grads(model, trees, batched=False)
    table = sparse_embedding(model.embedding.data())
    hand = HandBatchedSST(model.tree_lstm, 4, 5, mx.cpu(), embedding=table)
    with autograd.record():
        loss = hand(trees)
    loss.backward()
    assert float(loss.asscalar()) == pytest.approx(eager_loss, rel=1e-5)
    for name in sst_model.CELL_WEIGHT_NAMES:
        param = getattr(model.tree_lstm, name)
        np.testing.assert_allclose(param.grad().asnumpy(), eager_grads[param.name],
                                   rtol=1e-4, atol=1e-5, err_msg=name)
    grad = table.weight.grad()
    assert grad.stype == "row_sparse"
    used = sorted({n.word_id for t in trees for n in t.postorder() if n.is_preterminal})
    assert sorted(grad.indices.asnumpy().tolist()) == used
    np.testing.assert_allclose(grad.tostype("default").asnumpy(),
                               eager_grads[model.embedding.name], rtol=1e-4, atol=1e-5)
    before = table.weight.data().asnumpy()
    params = model.tree_lstm.collect_params()
    params.update(table.collect_params())
    trainer = gluon.Trainer(params, "adam", {"lazy_update": True})
    trainer.step(1)
    moved = np.abs(table.weight.data().asnumpy() - before).sum(axis=1) > 0
    assert moved.nonzero()[0].tolist() == used


def test_handbatched_sst_rejects_non_binary_trees():
    sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
    from handbatched_sst import SSTLevelPlan
    tree = parse_sst_line("(2 (2 a) (2 b) (2 c))", "ternary")
    assign_ids([tree], build_vocab([tree]))
    with pytest.raises(ValueError, match="binary"):
        SSTLevelPlan([tree])


def test_the_recording_floor_runs_as_many_operator_calls_as_a_scope_records():
    """``scripts/profile_recording.py`` compares recording with the model's own
    Python run on operators that do nothing: the same calls, one for one."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
    import profile_recording

    calls = [0]

    class Counted(profile_recording._Nothing):
        def _same(self, *_):
            calls[0] += 1
            return self

        __getitem__ = __add__ = __radd__ = __sub__ = __mul__ = __rmul__ = __neg__ = _same

    trees = small_trees()
    encoder = sst_model.OpByOpBinaryTreeLSTM(4, 4)
    encoder.initialize()
    floor = profile_recording._FloorEncoder(encoder)
    value = Counted()
    floor.F.value, floor.params = value, {name: value for name in floor.params}
    for name in profile_recording.FLOOR_OPERATORS:
        setattr(floor.F, name, lambda *args, **kwargs: value._same())
    for tree in trees:
        floor(tree, value)
    table = mx.nd.random.uniform(shape=(20, 4))
    with gdb.batching() as scope:
        outs = [encoder(tree, table) for tree in trees]  # noqa: F841
    assert calls[0] == scope.stats.calls > 0
