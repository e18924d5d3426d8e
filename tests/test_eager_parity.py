"""Models eager Gluon runs, batched: eager's result, or eager's error named.

Each model here is written as users write them and runs eagerly one sample
at a time.  Batched, it must give eager's values and gradients; where eager
MXNet raises, the batched run raises a clear error naming the sample, the
user's block and the call.
"""
import contextlib
import inspect
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
# Bound when the module is collected, before any scope of the session opens.
from mxnet.autograd import set_recording, set_training
from mxnet.gluon import rnn

import gluon_dynbatch as gdb
import idiom_models as im
from gluon_dynbatch.ir.rules import rule_for
from dynbatch_testing import (DenseTanh, Tree, assert_same, check_all_strategies, make_model,
                              output_of_script, outputs_of, run_model)

H = 4


def _states(count, seed=0, rows=1):
    rng = np.random.RandomState(seed)
    return [nd.array(rng.uniform(-1, 1, (rows, H))) for _ in range(count)]


# --------------------------------------------------------------------------
# A learned start vector as the input of a Gluon rnn cell
# --------------------------------------------------------------------------

class LearnedStart(gdb.DynBatchBlock):
    """A decoder's first steps: its own ``go`` parameter (1, H) is the input of an
    rnn cell whose state is each sample's encoding (``scaled``: ``go * 1``)."""

    def __init__(self, cell="lstm", scaled=False, **kwargs):
        super().__init__(**kwargs)
        self.kind, self.scaled = cell, scaled
        with self.name_scope():
            self.go = self.params.get("go", shape=(1, H))
            self.cell = rnn.LSTMCell(H, input_size=H) if cell == "lstm" \
                else rnn.GRUCell(H, input_size=H)

    def hybrid_forward(self, F, encoding, go):
        state = [encoding, encoding] if self.kind == "lstm" else [encoding]
        x = go * 1 if self.scaled else go
        outs = []
        for _ in range(2):
            x, state = self.cell(x, state)
            outs.append(x)
        return F.concat(*outs, dim=0)


@pytest.mark.parametrize("cell, scaled", [("lstm", False), ("gru", False), ("lstm", True)])
def test_learned_start_vector_into_an_rnn_cell_equals_eager(cell, scaled):
    model = make_model(LearnedStart, cell=cell, scaled=scaled)
    check_all_strategies(model, _states(5), [], strategies=("depth", "agenda"))


@pytest.mark.parametrize("compiled", [False, "step"])
def test_a_step_mxnet_refuses_names_its_first_sample_and_block(monkeypatch, compiled):
    # As if elemwise_add broadcast a one-row input: MXNet refuses the batched call
    # (run as written, not as the broadcast_add that equal shapes run as).
    from gluon_dynbatch.ir import rules
    monkeypatch.setattr(rule_for("elemwise_add"), "broadcasts", True)
    monkeypatch.setattr(rules, "SAME_SHAPE_ADDS", frozenset())
    model = make_model(LearnedStart)
    with pytest.raises(gdb.BatchingError, match=r"failed at a step of 5 calls of elemwise_add, "
                                                r"the first sample 0, in learnedstart\d+ > "
                                                r"learnedstart\d+_lstm0: .*Incompatible"):
        with gdb.batching(compiled=compiled):
            held = [model(h) for h in _states(5)]   # values nobody holds are never computed
    assert len(held) == 5


# --------------------------------------------------------------------------
# A character CNN over each word
# --------------------------------------------------------------------------

class CharCNN(gdb.DynBatchBlock):
    """Each word's characters embedded (1, C, E), laid out (C, 1, E) and encoded
    by gluonnlp's ConvolutionalEncoder (convolutions over the characters, a
    highway layer), or transposed to (1, E, C) for one ``nn.Conv1D``."""

    def __init__(self, gluonnlp_encoder=True, **kwargs):
        super().__init__(**kwargs)
        self.gluonnlp_encoder = gluonnlp_encoder
        with self.name_scope():
            self.embed = gluon.nn.Embedding(20, 8)
            if gluonnlp_encoder:
                import gluonnlp
                self.encode = gluonnlp.model.ConvolutionalEncoder(
                    embed_size=8, num_filters=(8, 8), ngram_filter_sizes=(1, 2),
                    conv_layer_activation="tanh", num_highway=1, output_size=None)
            else:
                self.conv = gluon.nn.Conv1D(8, 2, in_channels=8, activation="tanh")
            self.out = gluon.nn.Dense(3)

    def hybrid_forward(self, F, words):
        vectors = []
        for chars in words:
            x = self.embed(F.array([chars]))                     # (1, C, E)
            if self.gluonnlp_encoder:
                vectors.append(self.encode(F.transpose(x, axes=(1, 0, 2))))
            else:
                x = F.expand_dims(F.transpose(F.reshape(x, (-1, 8))), axis=0)
                vectors.append(F.max(self.conv(x), axis=2))
        return self.out(F.concat(*vectors, dim=0))


def _spelled(seed, count=5):
    rng = np.random.RandomState(seed)
    return [[list(rng.randint(0, 20, rng.randint(2, 6))) for _ in range(rng.randint(1, 4))]
            for _ in range(count)]


@pytest.mark.parametrize("gluonnlp_encoder", [True, False], ids=["gluonnlp", "conv1d"])
def test_character_cnn_trains_and_equals_eager(gluonnlp_encoder):
    model = make_model(CharCNN, gluonnlp_encoder=gluonnlp_encoder)
    check_all_strategies(model, _spelled(0), [], strategies=("depth",))
    trainer = gluon.Trainer(model.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        with gdb.batching(compiled=True):
            loss = sum(model(words).sum() for words in _spelled(1))
    loss.backward()
    trainer.step(1)


# --------------------------------------------------------------------------
# nn.HybridLambda given an operator by name
# --------------------------------------------------------------------------

class Lambdas(gdb.DynBatchBlock):
    """``nn.HybridLambda("tanh")`` and a HybridLambda of a function, in a sequence."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = gluon.nn.HybridSequential()
            self.body.add(gluon.nn.Dense(H), gluon.nn.HybridLambda("tanh"),
                          gluon.nn.HybridLambda(lambda F, x: F.LeakyReLU(x, slope=0.1)))

    def hybrid_forward(self, F, x):
        return self.body(x)


def test_hybrid_lambda_by_name_equals_eager():
    check_all_strategies(make_model(Lambdas), _states(5, rows=2), [], strategies=("depth",))


# --------------------------------------------------------------------------
# Output shapes that depend on the data; empty arrays
# --------------------------------------------------------------------------

class Masked(gdb.DynBatchBlock):
    """The states of a sentence's odd words kept by ``F.contrib.boolean_mask``
    (as many rows as the sample has odd words), summed, beside the mean state."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(20, H)
            self.proj = gluon.nn.Dense(H, flatten=False)
            self.out = gluon.nn.Dense(2)

    def hybrid_forward(self, F, words):
        h = F.tanh(self.proj(self.embed(F.array(words))))
        kept = F.contrib.boolean_mask(h, F.array([w % 2 for w in words]))
        return self.out(F.sum(kept, axis=0, keepdims=True) + F.mean(h, axis=0, keepdims=True))


def test_output_shape_that_depends_on_the_data_runs_alone_exactly(recwarn):
    sentences = [[1, 2, 3], [2, 5], [5], [7, 8, 9, 11], [3, 4]]
    check_all_strategies(make_model(Masked), sentences, [], strategies=("depth", "agenda"))
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)
                and "Cannot decide shape" in str(w.message)]


class Picked(gdb.DynBatchBlock):
    """Rows of a sample's states picked by a list of its own: ``F.take(h, F.array(idx))``,
    or each word of a sentence embedded (``embed``)."""

    def __init__(self, embed=False, **kwargs):
        super().__init__(**kwargs)
        self.embed_words = embed
        with self.name_scope():
            self.embed = gluon.nn.Embedding(20, H)
            self.proj = gluon.nn.Dense(H)

    def hybrid_forward(self, F, sample):
        if self.embed_words:
            return F.sum(self.embed(F.array(sample)), axis=0, keepdims=True)
        x, idx = sample
        return F.take(self.proj(x), F.array(idx))


def _eager_error(model, samples):
    with pytest.raises(Exception) as eager:
        for sample in samples:
            model(sample)
    return str(eager.value)


@pytest.mark.parametrize("strategy", ["depth", "reference"])
def test_take_by_an_empty_index_list_raises_eager_error_naming_sample_and_call(strategy):
    model = make_model(Picked)
    samples = [(x, idx) for x, idx in zip(_states(3, rows=3), [[0, 2], [], [1]])]
    assert "inferring shapes failed" in _eager_error(model, samples)
    with pytest.raises(gdb.BatchingError, match=r"sample 1, in picked\d+ > take: .*\(0,\).*"
                                                r"inferring shapes failed"):
        with gdb.batching(strategy=strategy):
            [model(s) for s in samples]        # pylint: disable=expression-not-assigned
    with gdb.batching(strategy=strategy):      # the next scope works
        out = model(samples[0])
    assert out.shape == (2, H)


def test_an_empty_sentence_raises_eager_error_naming_sample_and_call():
    model = make_model(Picked, embed=True)
    sentences = [[1, 2], [], [3]]
    assert "inferring shapes failed" in _eager_error(model, sentences)
    with pytest.raises(gdb.BatchingError, match=r"sample 1, in picked\d+ > picked\d+_embedding0 "
                                                r"> Embedding: .*inferring shapes failed"):
        with gdb.batching():
            [model(s) for s in sentences]      # pylint: disable=expression-not-assigned


# --------------------------------------------------------------------------
# Python lists where arrays are expected
# --------------------------------------------------------------------------

class ListArgument(gdb.DynBatchBlock):
    """A Python list passed where an operator, a child block or arithmetic takes an
    array (or a child block called with nothing)."""

    def __init__(self, where, **kwargs):
        super().__init__(**kwargs)
        self.where = where
        with self.name_scope():
            self.dense = gluon.nn.Dense(H)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        bias = [1.0, 2.0, 3.0, 4.0]
        if self.where == "operator":
            return F.broadcast_add(h, bias)
        if self.where == "block":
            return self.dense([[0.5, 1.0, 2.0]])
        if self.where == "concat":
            return F.concat(h, [bias], dim=0)
        if self.where == "nothing":
            return self.dense()
        return h + bias


@pytest.mark.parametrize("where, error", [
    ("operator", r"sample 0, in listargument\d+ > broadcast_add: .*Argument rhs must have "
                 r"NDArray type, but got \[1\.0"),
    ("concat", r"sample 0, in listargument\d+ > concat: .*Positional arguments must have "
               r"NDArray type"),
])
def test_a_list_where_an_array_is_expected_names_sample_block_and_call(where, error):
    model = make_model(ListArgument, where=where)
    x = nd.ones((1, 3))
    model.dense(x)                                  # its shapes known, as after a first batch
    with pytest.raises(gdb.BatchingError, match=error):
        with gdb.batching():
            model(x)
            model(x)


@pytest.mark.parametrize("where, error, match", [
    ("block", ValueError, "one NDArray or one Symbol"),      # Gluon refuses a call without one
    ("arithmetic", TypeError, "not supported"),
    ("nothing", TypeError, "missing 1 required positional argument"),
])
def test_a_child_block_or_arithmetic_given_no_array_raises_eager_error(where, error, match):
    """Eager's own error, with a note naming the sample."""
    model = make_model(ListArgument, where=where)
    x = nd.ones((1, 3))
    with pytest.raises(error, match=match) as eager:
        model(x)
    with pytest.raises(error) as batched:
        with gdb.batching():
            model(x)
            model(x)
    assert str(batched.value) == str(eager.value)
    assert "sample 0, in listargument" in "".join(getattr(batched.value, "__notes__", []))


# --------------------------------------------------------------------------
# Reads inside a block that runs as a black box
# --------------------------------------------------------------------------

class Reading(gluon.HybridBlock):
    """A block with its own ``forward`` (a black box) that reads its input, as
    gluonnlp's one-step decoders do through ``arange_like``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(H)

    def forward(self, x):  # pylint: disable=arguments-differ
        steps = nd.contrib.arange_like(x, axis=1)
        return self.dense(x) + 0 * steps.sum().asscalar()


class CallsBlackBox(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = gluon.nn.Dense(H)
            self.box = Reading()

    def hybrid_forward(self, F, x):
        return self.box(self.inp(x))      # the line the warning names


def test_a_read_inside_a_black_box_waits_with_its_sample():
    model = make_model(CallsBlackBox)
    xs = _states(8)
    want = [model(x).asnumpy() for x in xs]
    with gdb.batching() as scope:
        outs = [model(x) for x in xs]
    for out, ref in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), ref, rtol=1e-5, atol=1e-6)
    # One read per sample, made by every sample at the same point: the first
    # call alone, then the other seven together, then the rest.
    assert scope.stats.reads == 8 and scope.stats.flushes <= 3
    assert scope.stats.eager_samples == 0


# --------------------------------------------------------------------------
# Deep recursion
# --------------------------------------------------------------------------

def _chain(depth):
    """A tree that is a chain of ``depth`` nodes."""
    tree = Tree(0)
    for k in range(depth - 1):
        tree = Tree(k % 7, [tree])
    return tree


@contextlib.contextmanager
def _recursion_limit(limit):
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


# Each model with a recursion limit its eager run needs at depth 600: a closure
# or a helper method takes one or two frames a level, ``self(child)`` several.
@pytest.mark.parametrize("model_class, limit", [(im.ClosureTree, 1400), (im.MethodTree, 1400),
                                                (im.FeedbackTree, 4500)],
                         ids=["closure", "helper", "self"])
def test_a_chain_600_deep_records_where_eager_runs(model_class, limit):
    model = make_model(model_class, hidden=H, classes=3)
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (7, H)))
    tree = _chain(600)
    with _recursion_limit(limit):
        eager = run_model(model, [tree], [table], "eager")
        batched = run_model(model, [tree], [table], "depth")
    assert_same(batched, eager)


def test_eager_calls_after_a_scope_take_no_more_stack_than_before():
    """``Block.__call__`` stayed replaced after the first scope: a level of the
    dispatcher in every eager recursion, so a tree that ran eagerly before any
    scope hit the recursion limit after one."""
    from gluon_dynbatch.record import dispatch
    model = make_model(im.ClosureTree, hidden=H, classes=3)
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (7, H)))
    with gdb.batching():
        assert gluon.Block.__call__ is not dispatch._ORIGINAL_CALL  # pylint: disable=W0212
        model(_chain(3), table)
    assert gluon.Block.__call__ is dispatch._ORIGINAL_CALL  # pylint: disable=W0212
    depth = len(inspect.stack(0))
    with _recursion_limit(depth + 2 * 150 + 60):     # a closure level: two frames
        model(_chain(150), table)


def test_recursion_deeper_than_the_limit_raises_a_short_error():
    model = make_model(im.ClosureTree, hidden=H, classes=3)
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (7, H)))
    limit = sys.getrecursionlimit()
    with pytest.raises(RecursionError) as caught:
        with gdb.batching():
            model(_chain(6 * limit), table)
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "recursion limit" in notes and "sample 0, in closuretree" in notes
    assert len(str(caught.value)) + len(notes) < 400
    assert sys.getrecursionlimit() == limit
    with gdb.batching():                         # the next scope records as usual
        out = model(_chain(3), table)
    assert out.shape == (1, 3)


_DEEP_CHAIN = r"""
import sys
import mxnet as mx
from mxnet import gluon, nd
import gluon_dynbatch as gdb

class Node:
    def __init__(self, word, children=()):
        self.word, self.children = word, list(children)

class Chain(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)
    def hybrid_forward(self, F, tree, emb):
        x = emb[tree.word:tree.word + 1]
        for child in tree.children:
            x = x + self(child, emb)
        return F.tanh(self.dense(x))

model = Chain()
model.initialize()
tree = Node(0)
for k in range(7999):
    tree = Node(k % 7, [tree])
sys.setrecursionlimit(10000)
try:
    with gdb.batching():
        model(tree, nd.ones((7, 4))).asnumpy()
    print("recorded")
except RecursionError:
    print("RecursionError")
"""


def test_a_raised_recursion_limit_is_raised_no_further_than_the_stack_allows():
    # Eager raises RecursionError on this chain; recording raised the limit
    # four times over, and the C stack overflowed (a segfault).
    assert output_of_script(_DEEP_CHAIN).split() == ["RecursionError"]


# --------------------------------------------------------------------------
# Constants in two scopes' graphs, each graph's backward run on its own
# --------------------------------------------------------------------------

class AddsZeros(gdb.DynBatchBlock):
    """Constants (``F.zeros``) added to an embedding row and given to a Dense."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.emb = gluon.nn.Embedding(10, H)
            self.gate = gluon.nn.Dense(H, in_units=H)
            self.out = gluon.nn.Dense(1, in_units=H)

    def hybrid_forward(self, F, word):
        x = self.emb(F.array([word])) + F.zeros((1, H))
        return self.out(self.gate(F.zeros((1, H))) * F.tanh(x))


@pytest.mark.parametrize("settings", [{}, {"compiled": "step"}, {"compiled": True},
                                      {"granularity": "op"}, {"strategy": "reference"}],
                         ids=["default", "step", "compiled", "op", "reference"])
def test_two_scopes_whose_losses_each_run_backward_equal_eager(settings):
    """Eager makes a new array at each ``F.zeros``; the scopes reuse one
    per thread, which the first backward left without autograd's entry for
    the second graph (MXNet: "The any container is empty")."""
    grads = []
    for batched in (False, True):
        model = make_model(AddsZeros, seed=0)
        for param in model.collect_params().values():
            param.grad_req = "add"
        losses = []
        with autograd.record():
            for words in ([1, 2, 3], [4, 5, 1]):
                with gdb.batching(**settings) if batched else contextlib.nullcontext():
                    outs = [model(w) for w in words]
                losses.append(nd.add_n(*outs))
        for loss in losses:
            loss.backward()
        grads.append([p.grad().asnumpy() for p in model.collect_params().values()])
    for got, want in zip(grads[1], grads[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# An mx.np function on a sample's value
# --------------------------------------------------------------------------

class NumpyCumsum(gdb.DynBatchBlock):
    """``F.np.cumsum`` of a sample's hidden row (an mx.np array), back to a legacy one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(H, in_units=H, activation="tanh")

    def hybrid_forward(self, F, row, table):
        h = self.dense(table[row:row + 1])
        return F.np.cumsum(h.as_np_ndarray()).as_nd_ndarray() * 1.0


def test_an_mx_np_function_of_a_samples_value_equals_eager():
    """The function runs on the value read (it is not an operator of the
    graph); its mx.np result was made a leaf of the graph, which legacy
    operators refused in the batched plan."""
    model = make_model(NumpyCumsum)
    check_all_strategies(model, [0, 3, 1, 2], [nd.array(np.random.RandomState(0)
                                                        .uniform(-1, 1, (4, H)))])


# --------------------------------------------------------------------------
# The variance of moments alone, in whole compiled plans
# --------------------------------------------------------------------------

class Variance(gdb.DynBatchBlock):
    """The variance of a sample's hidden row, its mean unused."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(8, in_units=8, activation="tanh")

    def hybrid_forward(self, F, x):
        return F.moments(self.dense(x), axes=(1,))[1]


def test_a_variance_whose_mean_goes_unused_equals_eager_in_whole_plans():
    """MXNet's CachedOp gave NaN or wrong variances when the graph did not use
    the mean (in inference), as a hybridized Gluon block does; whole plans
    keep both."""
    mx.random.seed(0)
    model = Variance()
    model.initialize(mx.init.Xavier(magnitude=3))
    xs = [nd.array(np.random.RandomState(k).randn(1, 8)) for k in range(4)]
    want = [model(x).asnumpy() for x in xs]
    for strategy in ("depth", "agenda"):
        with gdb.batching(strategy=strategy, compiled="plan"):
            got = [model(x) for x in xs]
        for out, expected in zip(got, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    check_all_strategies(model, xs, [], compiled=(False, "plan", "step"))


class _HybridizedParent(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inner = DenseTanh()
            self.head = gluon.nn.Dense(2, in_units=H)

    def hybrid_forward(self, F, x):
        return self.head(self.inner(x))


@pytest.mark.parametrize("scope", [None, "depth", "reference"])
def test_a_hybridized_parent_traces_its_dynbatch_child_as_a_hybrid_block(scope):
    parent = make_model(_HybridizedParent)
    xs = [x[:, :3] for x in _states(4, rows=2)]

    def run(hybridized):
        if hybridized:
            parent.hybridize()
        with autograd.record():
            with (gdb.batching(strategy=scope) if scope and hybridized
                  else contextlib.nullcontext()):
                outs = [parent(x) for x in xs]
            loss = nd.add_n(*[(o * o).sum() for o in outs])
        loss.backward()
        return ([o.asnumpy() for o in outs],
                [p.grad().asnumpy().copy() for p in parent.collect_params().values()])

    want, got = run(False), run(True)
    for a, b in zip(want[0] + want[1], got[0] + got[1]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_exporting_a_dynbatch_block_says_why_not_and_its_children_export(tmp_path):
    """Gluon's error asked to hybridize and run forward first, which the user
    had done; a hybridized parent exports a DynBatchBlock child as a hybrid block."""
    parent = make_model(_HybridizedParent)
    parent.hybridize()
    parent.inner.hybridize()
    x = _states(1, rows=2)[0][:, :3]
    parent(x)
    with pytest.raises(RuntimeError, match="no one symbol to export.*save_parameters.*dense"):
        parent.inner.export(str(tmp_path / "inner"))
    parent.export(str(tmp_path / "parent"))
    assert (tmp_path / "parent-symbol.json").exists()


class _EncodedSum(gdb.DynBatchBlock):
    """``sum(enc(x))`` over a sample's rows, ``enc`` a Dense the user hybridizes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.enc = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x):
        return F.sum(self.enc(x), axis=0, keepdims=True)


@pytest.mark.parametrize("batching", [{}, {"compiled": True}, {"strategy": "reference"}, "map"],
                         ids=str)
def test_a_hybridized_child_run_only_in_scopes_exports(tmp_path, batching):
    """The advice of ``DynBatchBlock.export`` (export the hybridized children)
    failed where the child only ever ran in scopes: Gluon builds the graph
    ``export`` writes at a first eager call.  The exported graph computes the
    child's values."""
    model = make_model(_EncodedSum)
    model.enc.hybridize()
    xs = [nd.array(np.arange(4 * n).reshape(n, 4) / 10.0) for n in (1, 2, 3)]
    with autograd.record():
        outs = outputs_of(model, xs, batching)
        loss = nd.add_n(*[o.sum() for o in outs])
    loss.backward()
    model.enc.export(str(tmp_path / "enc"))
    loaded = gluon.SymbolBlock.imports(str(tmp_path / "enc-symbol.json"), ["data"],
                                       str(tmp_path / "enc-0000.params"))
    np.testing.assert_allclose(loaded(xs[2]).asnumpy(), model.enc(xs[2]).asnumpy(), rtol=1e-6)


# --------------------------------------------------------------------------
# autograd's modes switched by functions the user imported by name
# --------------------------------------------------------------------------

class SwitchesModes(gdb.DynBatchBlock):
    """Pauses recording for a score and training for a dropout, function style."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(H, in_units=3)
            self.score = gluon.nn.Dense(1, in_units=H)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        was_recording = set_recording(False)
        s = F.sigmoid(self.score(h))            # no gradient flows through s
        set_recording(was_recording)
        was_training = set_training(False)
        h = F.Dropout(h, p=0.5)                 # predict mode: h as it is
        set_training(was_training)
        return h * s


def test_modes_switched_by_functions_imported_by_name_equal_eager():
    # Bound before the first scope installed its counting of mode changes,
    # the functions were MXNet's own: the switches went unseen, and calls
    # were recorded (and run) in the modes before them.
    model = make_model(SwitchesModes)
    xs = [nd.array(np.random.RandomState(k).randn(1, 3)) for k in range(4)]
    check_all_strategies(model, xs, [], strategies=("depth", "agenda"))
