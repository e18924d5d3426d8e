"""Replay of traced child-block calls: same results as tracing every call."""
import collections
import contextlib
import enum
import functools
import math
import random
import sys
import types
import warnings

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd

import gluon_dynbatch as gdb
from gluon_dynbatch.templates.programs import Program
from dynbatch_testing import (ChildSumCell, ChildSumTreeLSTM, DenseTanh, TanhDense, assert_same,
                              make_model, random_tree, reference_run, rng, run_model)


class Mixer(gluon.HybridBlock):
    """Uses its two inputs differently, so swapping them changes the result."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, a, b):
        return F.tanh(self.dense(a)) * 2 + b


class UsesMixer(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.mixer = Mixer()

    def hybrid_forward(self, F, k, x):
        a = x[k:k + 1]
        b = a if k % 2 == 0 else x[k + 1:k + 2]     # aliased on even samples
        return self.mixer(a, b)


def test_aliased_arguments_do_not_share_a_template_with_distinct_ones():
    """Regression: a template traced with a == b served a call with a != b."""
    model = UsesMixer()
    model.initialize(mx.init.Uniform(0.5))
    x = nd.random.uniform(shape=(8, 3))
    with gdb.batching() as scope:
        outs = [model(k, x) for k in range(6)]
    for k, out in enumerate(outs):
        np.testing.assert_allclose(out.asnumpy(), model(k, x).asnumpy(), rtol=1e-5, atol=1e-6)
    assert scope.stats.nodes > 0


def test_replay_runs_a_childs_code_once_per_call_shape_with_the_same_results():
    r = rng(11)
    trees = [random_tree(r, 12, max_depth=3) for _ in range(6)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(12, 3))
    run_model(model, trees[:1], [emb], "depth")         # deferred shapes known
    calls = []
    traced = model.cell.hybrid_forward

    def counting(*args, **kwargs):
        calls.append(1)
        return traced(*args, **kwargs)
    model.cell.hybrid_forward = counting
    counts = {}
    for replay in (False, True):
        del calls[:]
        with gdb.batching(replay=replay) as scope:
            outs = [model(t, emb) for t in trees]
        counts[replay] = (len(calls), scope.stats.steps)
        for (h, _), t in zip(outs, trees):
            np.testing.assert_allclose(h.asnumpy(), model(t, emb)[0].asnumpy(), rtol=1e-5,
                                       atol=1e-6)
    nodes = sum(1 for t in trees for _ in t.nodes())
    assert counts[False][0] == nodes                    # traced at every tree node
    assert counts[True][0] < nodes / 4                  # once per call shape at most
    assert counts[True][1] == counts[False][1]          # batched alike
    expected = reference_run(model, trees, [emb])
    assert_same(run_model(model, trees, [emb], "depth", "step"), expected)


class ReadsOutside(gluon.HybridBlock):
    """Reads a value recorded outside the call: must never be templated."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.extra = None

    def hybrid_forward(self, F, a):
        return a * 2 if self.extra is None else a + self.extra


class UsesOutside(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = ReadsOutside()

    def hybrid_forward(self, F, k, x):
        self.child.extra = x[k:k + 1] * k
        return self.child(x[0:1])


def test_calls_reading_values_from_outside_are_not_templated():
    model = UsesOutside()
    x = nd.random.uniform(shape=(5, 2))
    with gdb.batching():
        outs = [model(k, x) for k in range(4)]
    for k, out in enumerate(outs):
        want = x[0:1] + x[k:k + 1] * k
        np.testing.assert_allclose(out.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)


def test_replaced_child_is_traced_again():
    r = rng(12)
    trees = [random_tree(r, 10, max_depth=2) for _ in range(3)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(10, 3))
    with gdb.batching():
        [model(t, emb) for t in trees]
    from dynbatch_testing import ChildSumCell
    with model.name_scope():
        model.cell = ChildSumCell(4)
    model.cell.initialize(mx.init.Uniform(0.9))
    with gdb.batching():
        outs = [model(t, emb) for t in trees]
    for (h, _), t in zip(outs, trees):
        np.testing.assert_allclose(h.asnumpy(), model(t, emb)[0].asnumpy(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("training", [False, True])
def test_modes_are_part_of_the_call_shape(training):
    """Dropout behaves differently in training: templates must not mix modes."""
    class Dropping(gdb.DynBatchBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.drop = gluon.nn.Dropout(0.5)

        def hybrid_forward(self, F, k, x):
            return self.drop(x[k:k + 1])
    model = Dropping()
    x = nd.ones((4, 50))
    from mxnet import autograd
    with gdb.batching():
        eval_outs = [model(k, x) for k in range(3)]
    with autograd.record(train_mode=training):
        with gdb.batching():
            outs = [model(k, x) for k in range(3)]
    for out in eval_outs:
        np.testing.assert_array_equal(out.asnumpy(), 1.0)
    zeros = sum(int((o.asnumpy() == 0).sum()) for o in outs)
    assert (zeros > 0) == training


class RowOf(gdb.DynBatchBlock):
    def hybrid_forward(self, F, k, x):
        return x[k:k + 1] * 1


def test_child_calls_outside_frames_are_program_nodes_traced_once_per_shape():
    """Child-block calls in the scope's own code (on outputs of DynBatchBlock
    calls) are frames of their own: one program node each, the block's Python
    code run once per call shape."""
    cell = ChildSumCell(4)
    cell.initialize(mx.init.Uniform(0.5))
    traced = []
    original = cell.hybrid_forward

    def counting(*args, **kwargs):
        traced.append(1)
        return original(*args, **kwargs)
    cell.hybrid_forward = counting
    x = nd.random.uniform(shape=(12, 3))
    states = nd.random.uniform(shape=(12, 4))
    rows, reads = RowOf(), RowOf()
    with gdb.batching(keep_plan=True) as scope:
        outs = [cell(rows(k, x), reads(k, states), reads(k + 1, states)) for k in range(10)]
    assert len(traced) == 1
    last = scope.last_plan.steps[-1]                     # the cell's calls: one step
    assert isinstance(last.nodes[0].op, Program) and len(last.nodes) == 10
    for k, (h, _) in enumerate(outs):
        want = original(nd, x[k:k + 1], states[k:k + 1], states[k + 1:k + 2],
                        **{name: p.data() for name, p in cell._reg_params.items()})[0]
        np.testing.assert_allclose(h.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)


def _nodes(tree):
    yield tree
    for child in tree.children:
        yield from _nodes(child)


def test_a_hook_added_inside_a_scope_runs_for_every_later_call():
    """Known call shapes must not skip hooks registered after they were filed."""
    model = UsesMixer()
    model.initialize(mx.init.Uniform(0.5))
    x = nd.random.uniform(shape=(12, 3))
    seen = []
    with gdb.batching():
        first = [model(k, x) for k in range(1, 6, 2)]
        model.mixer.register_forward_hook(lambda block, args, out: seen.append(out))
        later = [model(k, x) for k in range(1, 10, 2)]
    assert len(seen) == len(later)
    for k, out in zip(list(range(1, 6, 2)) + list(range(1, 10, 2)), first + later):
        np.testing.assert_allclose(out.asnumpy(), model(k, x).asnumpy(), rtol=1e-5,
                                   atol=1e-6)


class _SumsACell(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = TanhDense()

    def hybrid_forward(self, F, x):
        return F.sum(self.cell(x), axis=0, keepdims=True)


def test_a_hook_added_later_on_a_block_inside_a_child_runs_as_eager_runs_it():
    """The child's calls learned in an earlier scope were replayed without
    running the hook put on its Dense since: no hook call, and an in-place
    hook's change was lost."""
    mx.random.seed(0)
    model = _SumsACell()
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(1)

    def batch():
        return [nd.array(rs.uniform(-1, 1, (rs.randint(1, 4), 4))) for _ in range(4)]

    with gdb.batching():
        outs = [model(x) for x in batch()]
    [out.asnumpy() for out in outs]     # pylint: disable=expression-not-assigned
    calls = []

    def hook(block, args, out):
        calls.append(1)
        out *= -0.5                     # in place: allowed outside autograd.record()
    model.cell.dense.register_forward_hook(hook)
    xs = batch()
    want = [model(x).asnumpy() for x in xs]
    with gdb.batching():
        outs = [model(x) for x in xs]
    assert len(calls) == 2 * len(xs)
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class Stacks(gdb.DynBatchBlock):
    """Row concatenations of values of this graph, of a flushed graph and of inputs."""

    def hybrid_forward(self, F, k, x, y):
        a = x[k:k + 1] * 2
        b = F.tanh(x[k + 1:k + 3])
        if k == 2:
            b.asnumpy()                  # runs what is pending: b is of an older graph
        rows = F.concat(a, b, a, dim=0)
        mixed = F.concat(rows, y, dim=0)                 # y is a plain input array
        wide = F.concat(a, a, dim=1)
        return F.sum(mixed * mixed, axis=1, keepdims=True), wide, b


def test_row_concatenations_equal_eager_for_every_kind_of_input():
    model = Stacks()
    x = nd.random.uniform(shape=(8, 3))
    y = nd.random.uniform(shape=(2, 3))
    samples = list(range(5))
    expected = run_model(model, samples, [x, y], "eager")
    for strategy, compiled in (("depth", False), ("agenda", True), ("depth", "step")):
        assert_same(run_model(model, samples, [x, y], strategy, compiled), expected)


def test_stacking_a_value_of_a_failed_scope_raises_a_clear_error():
    model = Stacks()
    x = nd.random.uniform(shape=(8, 3))
    held = []
    with pytest.raises(KeyError):
        with gdb.batching():
            held.append(model(0, x, nd.ones((2, 3)))[2])
            raise KeyError("stop")
    with pytest.raises(gdb.BatchingError, match="scope that failed"):
        with gdb.batching():
            model(1, x, nd.ones((2, 3)))
            model(0, x, held[0])


class Pads(gdb.DynBatchBlock):
    """Constants of several shapes in one graph, before and after a flush."""

    def hybrid_forward(self, F, k, x):
        row = x[k:k + 1]
        if k == 2:
            row.asnumpy()                       # a flush: later calls start a new graph
        return F.concat(row, F.zeros((1, 3)), F.zeros((k + 1, 3)) + 1, F.ones((1, 3)), dim=0)


def test_constants_of_different_arguments_stay_apart_within_a_graph():
    model = Pads()
    x = nd.random.uniform(shape=(5, 3))
    with gdb.batching():
        outs = [model(k, x) for k in range(5)]
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out.asnumpy(), model(k, x).asnumpy())


class Tempered(gluon.HybridBlock):
    """A softmax with a temperature the training loop anneals (``self.tau``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tau = 1.0
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, x):
        return F.softmax(self.dense(x) / self.tau, axis=1)


class UsesTempered(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = Tempered()

    def hybrid_forward(self, F, word, emb):
        return self.cell(emb[word:word + 1])


@pytest.mark.parametrize("number", [float, np.float32, np.float64, np.float16])
@pytest.mark.parametrize("compiled", [False, True])
def test_a_child_whose_attribute_changed_is_not_replayed_as_before(compiled, number):
    """Python's numbers and numpy's (a temperature annealed with numpy)."""
    model = make_model(UsesTempered)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    for tau in (1.0, 0.1, 2.5, 1.0):
        model.cell.tau = number(tau)
        expected = run_model(model, [1, 2, 3], [emb], "eager")
        assert_same(run_model(model, [1, 2, 3], [emb], "depth", compiled=compiled), expected)


class Squashing(gluon.HybridBlock):
    """A child whose code a user swaps between scopes (in a notebook, say)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


class UsesSquashing(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = Squashing()

    def hybrid_forward(self, F, word, emb):
        return self.cell(emb[word:word + 1])


def _sigmoid_times_three(self, F, x):
    return F.sigmoid(self.dense(x)) * 3


@pytest.mark.parametrize("where", ["instance", "class", "grandchild"])
@pytest.mark.parametrize("compiled", [False, True])
def test_a_childs_code_replaced_after_its_calls_were_learned_runs_as_replaced(
        where, compiled, monkeypatch):
    """The child's calls, learned from its old code, were replayed: outputs and
    gradients silently those of the old code."""
    model = make_model(UsesSquashing)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    assert_same(run_model(model, [1, 2, 3], [emb], "depth", compiled=compiled),
                run_model(model, [1, 2, 3], [emb], "eager"))
    if where == "instance":
        model.cell.hybrid_forward = types.MethodType(_sigmoid_times_three, model.cell)
    elif where == "class":
        monkeypatch.setattr(Squashing, "hybrid_forward", _sigmoid_times_three)
    else:       # a Dense inside the child: its code is Gluon's own, set on the instance
        monkeypatch.setattr(model.cell.dense, "hybrid_forward", types.MethodType(
            lambda self, F, x, weight, bias=None: F.FullyConnected(
                x, weight, bias, num_hidden=4) * 2, model.cell.dense))
    expected = run_model(model, [1, 2, 3], [emb], "eager")
    assert_same(run_model(model, [1, 2, 3], [emb], "depth", compiled=compiled), expected)


_SQUASHINGS = ["return F.tanh(self.dense(x))", "return F.relu(self.dense(x)) * 3",
               "return F.sigmoid(self.dense(x)) - 1", "return F.tanh(self.dense(x)) * 5"]


def _defined(body, module="notebook"):
    """``hybrid_forward`` as a notebook's cell defines it, edited and run again
    (``module`` None: made by ``exec`` with no module name at all)."""
    space = {} if module is None else {"__name__": module}
    exec("def hybrid_forward(self, F, x):\n    " + body, space)  # pylint: disable=exec-used
    return space["hybrid_forward"]


@pytest.mark.parametrize("module", ["notebook", None])
def test_a_childs_code_defined_anew_before_each_scope_runs_as_defined(module, monkeypatch):
    """A new function could take a freed one's id, which keyed its calls: the old
    code's recorded calls ran (and code made by ``exec`` with no module name
    failed to record)."""
    model = make_model(UsesSquashing)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    for k in range(8):
        monkeypatch.setattr(Squashing, "hybrid_forward", _defined(_SQUASHINGS[k % 4], module))
        expected = run_model(model, [1, 2, 3], [emb], "eager")
        assert_same(run_model(model, [1, 2, 3], [emb], "depth"), expected)


def test_a_child_whose_attributes_change_at_every_scope_is_told_once_and_stays_exact(caplog):
    from gluon_dynbatch.record import trie
    model = make_model(UsesTempered)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    with caplog.at_level("WARNING", logger="gluon_dynbatch"):
        for step in range(trie.MAX_SETTINGS + 4):
            model.cell.tau = 1.0 + step
            expected = run_model(model, [1, 2, 3], [emb], "eager")
            assert_same(run_model(model, [1, 2, 3], [emb], "depth"), expected)
    told = [r for r in caplog.records if "took more than" in r.getMessage()
            and "(tau" in r.getMessage()]
    assert len(told) == 1
    assert len(trie.store().settings[id(model.cell)]) == trie.MAX_SETTINGS + 1


class SequenceOfDynBatchBlocks(gdb.DynBatchBlock):
    """Calls a container child holding a DynBatchBlock (used alone elsewhere)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.seq = gluon.nn.HybridSequential()
            self.seq.add(DenseTanh())

    def hybrid_forward(self, F, k, x):
        return self.seq(x[k:k + 1]) * 2


def test_a_blocks_own_timings_are_not_settings_its_container_is_keyed_by(caplog):
    """Each scope of a DynBatchBlock notes how long its flush ran, on the block:
    a container holding it must not take that for a setting that changed (its
    calls would be learned anew per scope, then run its code every time)."""
    from gluon_dynbatch.record import trie
    model = make_model(SequenceOfDynBatchBlocks)
    inner = model.seq[0]
    x = nd.random.uniform(-1, 1, shape=(6, 3))
    with caplog.at_level("WARNING", logger="gluon_dynbatch"):
        for _ in range(trie.MAX_SETTINGS + 4):
            rows = [nd.random.uniform(-1, 1, shape=(1, 3)) for _ in range(3)]
            expected = run_model(inner, rows, [], "eager")
            assert_same(run_model(inner, rows, [], "depth"), expected)
            expected = run_model(model, [3, 4, 5], [x], "eager")
            assert_same(run_model(model, [3, 4, 5], [x], "depth"), expected)
    assert inner.recent_execute_s is not None
    assert not [r for r in caplog.records if "took more than" in r.getMessage()]
    assert len(trie.store().settings.get(id(model.seq), ())) <= 1


class ScaledPerCall(gdb.DynBatchBlock):
    """Sets its child's attribute before each call: more values than the cap in one scope."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = Tempered()

    def hybrid_forward(self, F, words, emb):
        outs = []
        for word in words:
            self.cell.tau = 0.1 * (word + 1)
            outs.append(self.cell(emb[word:word + 1]))
        return F.concat(*outs, dim=0)


@pytest.mark.parametrize("compiled", [False, True, "step"])
def test_a_child_attribute_set_per_call_with_more_values_than_the_cap_stays_exact(compiled):
    from gluon_dynbatch.record import trie
    model = make_model(ScaledPerCall)
    vocab = trie.MAX_SETTINGS * 2 + 8
    emb = nd.random.uniform(-1, 1, shape=(vocab, 3))
    r = np.random.RandomState(0)
    samples = [list(r.randint(0, vocab, size=n)) for n in (12, 9, 15, 7)]
    expected = run_model(model, samples, [emb], "eager")
    assert_same(run_model(model, samples, [emb], "depth", compiled=compiled), expected)


class Switched(gluon.HybridBlock):
    """Computes one of two functions, by a setting its caller changes per sample."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.mode = "tanh"
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, x):
        return getattr(F, self.mode)(self.dense(x))


class SwitchesPerSample(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = Switched()

    def hybrid_forward(self, F, sample, emb):
        word, mode = sample
        self.cell.mode = mode
        return self.cell(emb[word:word + 1])


@pytest.mark.parametrize("compiled", [False, True])
def test_a_child_setting_changed_between_its_calls_in_one_scope_equals_eager(compiled):
    model = make_model(SwitchesPerSample)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    samples = [(1, "tanh"), (2, "sigmoid"), (3, "tanh"), (4, "relu"), (5, "sigmoid")]
    for _ in range(2):
        expected = run_model(model, samples, [emb], "eager")
        assert_same(run_model(model, samples, [emb], "depth", compiled=compiled), expected)


class ActivatedCell(gluon.HybridBlock):
    """A Dense layer, then an activation block (``act``) and an optional
    ``(scale, shift)`` (``weights``, None by default) its caller may replace."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)
            self.act = gluon.nn.Activation("tanh")
        self.weights = None

    def hybrid_forward(self, F, x):
        h = self.act(self.dense(x))
        if self.weights is not None:
            h = h * self.weights[0] + self.weights[1]
        return h


_ACTIVATIONS = tuple(gluon.nn.Activation(a) for a in ("tanh", "relu", "sigmoid"))


class PicksPerSample(gdb.DynBatchBlock):
    """Gives its cell the activation block or the weights of each sample."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = ActivatedCell()

    def hybrid_forward(self, F, sample, emb):
        word, act, weights = sample
        self.cell.act = _ACTIVATIONS[act]
        self.cell.weights = weights
        return self.cell(emb[word:word + 1])


@pytest.mark.parametrize("compiled", [False, "step"])
def test_a_child_block_or_list_given_to_a_child_per_sample_equals_eager(compiled):
    """A child block put in another's place (``cell.act = relu``), or a list given
    to an attribute that was None, inside a scope: calls of the same shapes
    replayed what the cell recorded with the first block, or without the list."""
    model = make_model(PicksPerSample)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    samples = [(1, 0, None), (2, 1, None), (3, 2, [10.0, 1.0]), (4, 0, [-10.0, 5.0]),
               (5, 1, None)]
    for _ in range(2):
        expected = run_model(model, samples, [emb], "eager")
        assert_same(run_model(model, samples, [emb], "depth", compiled=compiled), expected)


class ScaledAfterARead(gdb.DynBatchBlock):
    """Reads a value (a data-dependent check), then scales by ``self.scale``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)
        self.scale = 1.0

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        if float(h.sum().asscalar()) > 100:
            return h
        return h * self.scale


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "reference"}])
def test_a_setting_the_scopes_code_changes_while_samples_wait_is_seen_as_eager_sees_it(
        options):
    """``model.scale = 10`` between two loops: the first loop's samples, waiting at
    their reads, resumed after it and scaled by 10, where eager's had finished."""
    model = make_model(ScaledAfterARead)
    xs = [nd.ones((1, 3)) * k for k in (1, 2, 3)]
    runs = []
    for batched in (False, True):
        model.scale = 1.0
        with gdb.batching(**options) if batched else contextlib.nullcontext():
            first = [model(x) for x in xs]
            model.scale = 10.0
            second = [model(x) for x in xs]
        runs.append([o.asnumpy() for o in first + second])
    for got, want in zip(runs[1], runs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class KeepsItsLastState(gdb.DynBatchBlock):
    """Keeps the state of its last step in an attribute, reset per sample to
    ``reset`` (None, a number) as ``rnn.ZoneoutCell`` resets its last output."""

    def __init__(self, reset, **kwargs):
        super().__init__(**kwargs)
        self.reset, self.last = reset, None
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, x):
        self.last = self.reset
        for t in range(x.shape[0]):
            h = F.tanh(self.dense(x[t:t + 1]))
            self.last = h if self.last is None or isinstance(self.last, float) \
                else h + self.last
        return self.last


@pytest.mark.parametrize("reset", [None, 0.0])
def test_an_attribute_holding_an_array_set_back_to_a_setting_equals_eager(reset):
    """``self.last = None`` where it held a value (``Block.__setattr__`` inside a
    scope compares settings only with settings: an array's ``!=`` raised)."""
    model = make_model(KeepsItsLastState, reset=reset)
    xs = [nd.random.uniform(-1, 1, shape=(t, 3)) for t in (2, 3, 1)]
    expected = run_model(model, xs, [], "eager")
    assert_same(run_model(model, xs, [], "depth"), expected)


SCALE = 1.0             # set by ``SetsState`` per sample (see ``ReadsState``)


class ReadsState(gluon.HybridBlock):
    """A child reading state its token does not hold, by ``how``: a module
    global, a dict attribute changed in place, a counter of its calls kept in a
    list; or storing its last output on itself (``"stores"``)."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how, self.cfg, self.calls, self.last = how, {"scale": 1.0}, [0], None
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        if self.how == "global":
            return h * SCALE
        if self.how == "dict":
            return h * self.cfg["scale"]
        if self.how == "counter":
            self.calls[0] += 1
            return h * float(self.calls[0])
        self.last = h
        return h


class SetsState(gdb.DynBatchBlock):
    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = ReadsState(how)

    def hybrid_forward(self, F, word, emb):
        global SCALE
        SCALE = 1.0 + word
        self.child.cfg["scale"] = 2.0 - word
        out = self.child(emb[word:word + 1])
        return out + self.child.last if self.child.how == "stores" else out


@pytest.mark.parametrize("how", ["global", "dict", "counter", "stores"])
@pytest.mark.parametrize("strategy, compiled", [("depth", False), ("agenda", "plan"),
                                               ("depth", "step")])
def test_a_child_reading_state_its_token_does_not_hold_equals_eager(how, strategy, compiled):
    """Such a child's code runs at every call (``record/purity.py``); a replay of
    its first call gave every sample the first sample's scale, or its stored
    output; a plain global it reads is part of its key instead."""
    model = make_model(SetsState, how=how)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    for words in ([1, 2, 3], [4, 2, 5, 1]):
        model.child.calls[0] = 0
        expected = run_model(model, words, [emb], "eager")
        model.child.calls[0] = 0
        assert_same(run_model(model, words, [emb], strategy, compiled), expected)


class Pure(gluon.HybridBlock):
    """Computes from its arguments, parameters and settings only (a helper
    method, a module-level function, a constant global, a nested function)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.width = 3
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def _gate(self, F, x):
        return F.sigmoid(x) * SCALE

    def hybrid_forward(self, F, x):
        def squash(y):
            return F.tanh(y) * self.width
        return squash(_scaled(F, self.dense(x))) + self._gate(F, x)


def _scaled(F, x):
    return F.relu(x) * np.float32(0.5)


class Prints(Pure):
    def hybrid_forward(self, F, x):
        print("called")
        return super().hybrid_forward(F, x)


class Scales(gluon.HybridBlock):
    """A block with a helper method its owner calls (not its ``hybrid_forward``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cfg = {"scale": 2.0}

    def scaled(self, x):
        return x * self.cfg["scale"]

    def hybrid_forward(self, F, x):
        return x


class UsesHelperOfChild(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.scales = Scales()

    def hybrid_forward(self, F, x):
        return self.scales.scaled(F.tanh(x))


def test_which_children_replay_without_running_their_code():
    """Gluon's blocks and code computing from what the token holds replay (a
    constant global read is guarded by its value); code acting besides
    computing (``print``) or reading changing state runs at every call."""
    from gluon_dynbatch.record.purity import replay_guards
    assert replay_guards(gluon.nn.Dense(3)) == ()
    assert replay_guards(gluon.rnn.LSTMCell(3)) == ()
    guards = replay_guards(Pure())
    assert [name for _, name in guards] == ["SCALE"]
    assert replay_guards(Prints()) is None
    for how in ("dict", "counter", "stores"):
        assert replay_guards(ReadsState(how)) is None
    # A dict of settings read through a child's method: its content is guarded.
    assert [name for _, name in replay_guards(UsesHelperOfChild())] == ["cfg"]


class ScalesThroughItsChild(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = UsesHelperOfChild()

    def hybrid_forward(self, F, word, emb):
        self.child.scales.cfg["scale"] = 1.0 + word % 3     # changed in place per sample
        return self.child(emb[word:word + 1])


@pytest.mark.parametrize("compiled", [False, "plan"])
def test_a_dict_of_settings_changed_in_place_is_part_of_the_key(compiled):
    model = make_model(ScalesThroughItsChild)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    for words in ([1, 2, 3], [4, 2, 5, 1, 6]):
        expected = run_model(model, words, [emb], "eager")
        assert_same(run_model(model, words, [emb], "depth", compiled), expected)


class ScalesByGlobal(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x)) * SCALE


class SetsGlobal(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = ScalesByGlobal()

    def hybrid_forward(self, F, word, emb):
        global SCALE
        SCALE = 1.0 + word % 3
        return self.child(emb[word:word + 1])


@pytest.mark.parametrize("compiled", [False, "plan"])
def test_a_replayed_child_reading_a_global_is_keyed_by_its_value(compiled):
    """The child replays (its code only computes), once learned per value of
    the global its parent sets per sample."""
    from gluon_dynbatch.record.purity import replay_guards
    model = make_model(SetsGlobal)
    assert [name for _, name in replay_guards(model.child)] == ["SCALE"]
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    for words in ([1, 2, 3], [4, 2, 5, 1, 6]):
        expected = run_model(model, words, [emb], "eager")
        assert_same(run_model(model, words, [emb], "depth", compiled), expected)


class Draws(gluon.HybridBlock):
    """Word dropout in a child: a Python draw decides at every call."""

    def __init__(self, source, **kwargs):
        super().__init__(**kwargs)
        self.source = source
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        keep = (np.random.rand() if self.source == "numpy" else random.random()) < 0.5
        return F.tanh(self.dense(x)) * (1.0 if keep else 0.0)


class DropsWords(gdb.DynBatchBlock):
    def __init__(self, source, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = Draws(source)

    def hybrid_forward(self, F, words, emb):
        return F.concat(*[self.child(emb[w:w + 1]) for w in words], dim=0)


@pytest.mark.parametrize("source", ["numpy", "python"])
def test_a_child_drawing_random_numbers_runs_at_every_call(source):
    """Its draws come in eager's order, one per call: the same seed, the same
    words dropped."""
    model = make_model(DropsWords, source=source)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    samples = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    runs = []
    for strategy in ("eager", "depth"):
        random.seed(5)
        np.random.seed(5)
        runs.append(run_model(model, samples, [emb], strategy))
    assert_same(runs[1], runs[0])


KNOBS = types.ModuleType("knobs")       # a module of settings a model changes
KNOBS.SCALE = 1.0


class _Scaler:
    def __init__(self):
        self.value = 1.0

    def get(self):
        return self.value


def _closing_over(state):
    class ClosesOver(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.dense = gluon.nn.Dense(3, in_units=3)

        def hybrid_forward(self, F, x):
            return F.tanh(self.dense(x)) * state["scale"]
    return ClosesOver()


class ReadsElsewhere(gluon.HybridBlock):
    """A child reading a setting ``how``: through ``type(self)``, a module's
    attribute, the length of a list its owner appends to, a bound method of
    another object."""

    scale = 1.0

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how, self.items, self.scaler = how, [], _Scaler()
        self.get = self.scaler.get
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        if self.how == "class":
            return h * type(self).scale
        if self.how == "module":
            return h * KNOBS.SCALE
        if self.how == "length":
            return h * float(len(self.items))
        return h * self.get()


def _knob(how, child, word):
    value = 1.0 + word % 3
    if how == "class":
        type(child).scale = value
    elif how == "module":
        KNOBS.SCALE = value
    elif how == "length":
        child.items.append(word)
    elif how == "bound":
        child.scaler.value = value
    else:
        child.state["scale"] = value


class TurnsAKnob(gdb.DynBatchBlock):
    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            if how == "closure":
                state = {"scale": 1.0}
                self.child = _closing_over(state)
                self.child.state = state
            else:
                self.child = ReadsElsewhere(how)

    def hybrid_forward(self, F, word, emb):
        _knob(self.how, self.child, word)
        return self.child(emb[word:word + 1])


@pytest.mark.parametrize("how", ["class", "module", "length", "bound", "closure"])
def test_a_child_reading_settings_held_elsewhere_equals_eager(how):
    """Settings a child reads besides its own attributes: guarded by their
    values (a class or module attribute, a list's content, a closure's dict),
    or its code runs at every call (a bound method of another object)."""
    model = make_model(TurnsAKnob, how=how)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    for words in ([1, 2, 3], [4, 2, 5, 1, 6]):
        if how == "length":
            model.child.items.clear()
        expected = run_model(model, words, [emb], "eager")
        if how == "length":
            model.child.items.clear()
        assert_same(run_model(model, words, [emb], "depth", "plan"), expected)


class Temperature(gluon.HybridBlock):
    """Holds a setting that other blocks read."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tau = 1.0

    def hybrid_forward(self, F, x):
        return x / self.tau


class ScaledByAPeer(gluon.HybridBlock):
    """Reads the setting of a block it keeps in a list or dict (not its child)."""

    def __init__(self, temperature, how, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)
        self.how = how
        with warnings.catch_warnings():     # (Gluon's: blocks kept so are not children)
            warnings.simplefilter("ignore")
            self.peers = [temperature] if how == "list" else {"t": temperature}

    def hybrid_forward(self, F, x):
        peer = self.peers[0] if self.how == "list" else self.peers["t"]
        return self.dense(x) * peer.tau


class SetsAPeersSetting(gdb.DynBatchBlock):
    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.temperature = Temperature()
            self.cell = ScaledByAPeer(self.temperature, how)

    def hybrid_forward(self, F, sample, emb):
        word, tau = sample
        self.temperature.tau = tau
        return self.cell(emb[word:word + 1])


@pytest.mark.parametrize("how", ["list", "dict"])
def test_a_child_reading_a_setting_of_a_block_it_keeps_in_a_list_equals_eager(how):
    """The settings of a block kept in a list or dict are no part of the reader's
    token (``trie.settings`` walks registered children): the template learned
    with the first sample's ``tau`` was replayed for the others."""
    model = make_model(SetsAPeersSetting, how=how)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    samples = [(1, 1.0), (2, 2.0), (3, 3.0), (4, 2.0)]
    for _ in range(2):
        expected = run_model(model, samples, [emb], "eager")
        assert_same(run_model(model, samples, [emb], "depth"), expected)


class TilesBySlots(gluon.HybridBlock):
    """Repeats its output once per row of an array attribute (``slots``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)
        self.slots = nd.zeros((1, 2))

    def hybrid_forward(self, F, x):
        return F.tile(F.tanh(self.dense(x)), reps=(self.slots.shape[0], 1))


class GivesSlots(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = TilesBySlots()

    def hybrid_forward(self, F, sample, emb):
        word, count = sample
        self.cell.slots = nd.zeros((count, 2))
        return self.cell(emb[word:word + 1])


def test_a_child_reading_the_shape_of_an_array_attribute_equals_eager():
    """Array attributes were no part of a child's token: given arrays of other
    row counts per sample, its calls replayed the first one's shape."""
    model = make_model(GivesSlots)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    samples = [(1, 1), (2, 2), (3, 3), (4, 2)]
    for _ in range(2):
        expected = run_model(model, samples, [emb], "eager")
        assert_same(run_model(model, samples, [emb], "depth"), expected)


def test_code_the_analysis_cannot_read_runs_at_every_call(monkeypatch):
    """An error inside the analysis never reaches recording: the child's code
    then runs at every call, as eager."""
    from gluon_dynbatch.record import purity

    def unreadable(cls):
        raise ValueError("unreadable bytecode")
    monkeypatch.setattr(purity, "_CLASSES", {})
    monkeypatch.setattr(purity, "_class_facts", unreadable)
    assert purity.replay_guards(Pure()) is None
    model = make_model(SetsGlobal)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    expected = run_model(model, [1, 2, 3], [emb], "eager")
    assert_same(run_model(model, [1, 2, 3], [emb], "depth"), expected)



LOG = []


def _logged(method):
    @functools.wraps(method)
    def wrapper(self, *args):
        return method(self, *args)
    return wrapper


class _HasHelper(gluon.HybridBlock):
    scale = 1.0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cfg = {"scale": 1.0}

    def helper(self, x):
        return x * self.cfg["scale"]


class Decorated(_HasHelper):
    @_logged
    def hybrid_forward(self, F, x):
        return x * self.cfg["scale"]


class LoopsOverLayers(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.layers = gluon.nn.HybridSequential()
            self.layers.add(Scales())

    def hybrid_forward(self, F, x):
        for layer in self.layers:
            x = layer.scaled(x)
        return x


class CallsSuperHelper(_HasHelper):
    def helper(self, x):
        return x

    def hybrid_forward(self, F, x):
        return super(CallsSuperHelper, self).helper(x)


class ReadsThroughClassMethod(_HasHelper):
    @classmethod
    def _scale(cls):
        return cls.scale

    def hybrid_forward(self, F, x):
        return x * self._scale()


class AppendsToGlobal(gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        LOG.append(1)
        return x


@pytest.mark.parametrize("cls, guarded", [
    (Decorated, {"cfg"}), (LoopsOverLayers, {"cfg"}), (CallsSuperHelper, {"cfg"}),
    (ReadsThroughClassMethod, {"scale"}), (AppendsToGlobal, None)])
def test_state_reached_through_decorators_loops_super_and_class_methods_is_seen(cls, guarded):
    """A read is guarded, so that a change is seen at every call; code appending
    to a global list runs at every call."""
    from gluon_dynbatch.record.purity import replay_guards
    found = replay_guards(cls())
    if guarded is None:
        assert found is None
    else:
        assert guarded <= {name for _, name in found}


class Pooling(enum.Enum):
    SUM = 1
    MAX = 2


Config = collections.namedtuple("Config", ["scale", "act"])
SCALED_WORDS = {1, 4}        # a global set of settings a model changes


class ReadsConfigs(gluon.HybridBlock):
    """A child configured by an enumeration member, a named tuple, a global set
    or an ordered dict, the way models are often configured."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how, self.pooling = how, Pooling.SUM
        self.config = Config(1.0, "tanh")
        self.scales = collections.OrderedDict([("a", 1.0), ("b", 2.0)])
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x, word):
        h = self.dense(x)
        if self.how == "enum":
            return F.tanh(h) if self.pooling is Pooling.SUM else F.relu(h)
        if self.how == "namedtuple":
            return F.Activation(h * self.config.scale, act_type=self.config.act)
        if self.how == "set":
            return F.tanh(h) * (2.0 if word in SCALED_WORDS else 1.0)
        return F.tanh(h) * self.scales["b"]


class SetsConfigs(gdb.DynBatchBlock):
    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.child = ReadsConfigs(how)

    def hybrid_forward(self, F, word, emb):
        child = self.child
        if self.how == "enum":
            child.pooling = Pooling.MAX if word % 2 else Pooling.SUM
        elif self.how == "namedtuple":
            child.config = Config(1.0 + word % 3, "relu" if word % 2 else "tanh")
        elif self.how == "set":
            SCALED_WORDS.symmetric_difference_update({word})     # changed in place
        else:
            child.scales["b"] = 1.0 + word % 3
        return child(emb[word:word + 1], word)


@pytest.mark.parametrize("how", ["enum", "namedtuple", "set", "ordered"])
def test_children_configured_by_enums_named_tuples_sets_and_ordered_dicts(how):
    """Such settings are read through guards (the child's code need not run at
    every call), and a change between calls is seen as eager sees it."""
    from gluon_dynbatch.record.purity import replay_guards
    model = make_model(SetsConfigs, how=how)
    assert replay_guards(model.child) is not None
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    for words in ([1, 2, 3], [4, 2, 5, 1, 6, 4]):
        SCALED_WORDS.clear()
        SCALED_WORDS.update({1, 4})
        expected = run_model(model, words, [emb], "eager")
        SCALED_WORDS.clear()
        SCALED_WORDS.update({1, 4})
        assert_same(run_model(model, words, [emb], "depth", "plan"), expected)


class ReadsVocabulary(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary = {"w%d" % k: k for k in range(1000)}

    def hybrid_forward(self, F, x):
        return x * float(len(self.vocabulary))


def test_a_large_container_read_by_a_child_makes_its_code_run():
    """Copying a vocabulary at every call to key a replay costs more than
    running the code: such a child runs at every call."""
    from gluon_dynbatch.record.purity import replay_guards
    assert replay_guards(ReadsVocabulary()) is None


class Scale(enum.Enum):
    """A member whose value is a dict the model changes (a bad idea, but eager's)."""
    ONLY = {"scale": 1.0}


KNOB = None     # what ``ReadsAKnob`` reads, set by ``_turn`` per sample


class ReadsAKnob(gluon.HybridBlock):
    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how, self.sign = how, 0.0
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        if self.how == "enum":
            return h * Scale.ONLY.value["scale"]
        if self.how == "set":
            return F.concat(*[h * k for k in KNOB], dim=1)
        if self.how == "zero":
            return h * math.copysign(1.0, KNOB)
        if self.how == "objects":
            return h * KNOB[0][0]
        return h * math.copysign(1.0, self.sign)


def _turn(how, child, word):
    global KNOB
    odd = word % 2 == 1
    if how == "enum":
        Scale.ONLY.value["scale"] = 1.0 + word % 3
    elif how == "set":
        KNOB = {1, 9} if odd else set([9, 1])       # the same items, iterated 1, 9 and 9, 1
    elif how == "zero":
        KNOB = -0.0 if odd else 0.0
    elif how == "objects":          # a plain list, then arrays of Python objects
        KNOB = [[1.0]] if word == 1 else np.array([[[1.0 + word % 3]]], dtype=object)[0]
    else:
        child.sign = -0.0 if odd else 0.0


class TurnsAKnobBeforeItsChild(gdb.DynBatchBlock):
    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.child = ReadsAKnob(how)

    def hybrid_forward(self, F, word, emb):
        _turn(self.how, self.child, word)
        return self.child(emb[word:word + 1])


@pytest.mark.parametrize("how", ["enum", "set", "zero", "objects", "attribute"])
def test_settings_that_compare_equal_but_compute_differently_are_told_apart(how):
    """An enumeration member's value, a set's order, -0.0 against 0.0 (a global or
    the child's attribute), a global that becomes an array of Python objects: the
    replay of the first call served calls computing otherwise."""
    model = make_model(TurnsAKnobBeforeItsChild, how=how)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    for words in ([1, 2, 3], [4, 2, 5, 1, 6]):
        expected = run_model(model, words, [emb], "eager")
        assert_same(run_model(model, words, [emb], "depth", "plan"), expected)


PER_CALL = {"t": 1.0}


class LambdaChild(gdb.DynBatchBlock):
    """A ``HybridLambda`` child whose function reads what the parent sets per call."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.temp = 1.0
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)
            if kind == "closure":
                self.f = gluon.nn.HybridLambda(lambda F, x: F.tanh(x * self.temp))
            elif kind == "global":
                self.f = gluon.nn.HybridLambda(lambda F, x: F.tanh(x * PER_CALL["t"]))
            else:
                self.f = gluon.nn.HybridLambda("tanh")

    def hybrid_forward(self, F, words, emb):
        h = F.zeros((1, 4))
        for word in words:
            self.temp = PER_CALL["t"] = 0.1 * (word + 1)
            h = self.f(self.dense(emb[word:word + 1])) + h
        return h


@pytest.mark.parametrize("kind", ["closure", "global", "named"])
@pytest.mark.parametrize("compiled", [False, "step"])
def test_a_hybrid_lambda_reading_per_call_state_is_not_replayed_stale(kind, compiled):
    model = make_model(LambdaChild, kind=kind)
    emb = nd.random.uniform(-1, 1, shape=(6, 3))
    r = np.random.RandomState(2)
    samples = [list(r.randint(0, 6, size=n)) for n in (4, 2, 5, 3)]
    expected = run_model(model, samples, [emb], "eager")
    assert_same(run_model(model, samples, [emb], "depth", compiled=compiled), expected)


SETTINGS = types.ModuleType("gdb_test_settings")    # a user's settings module
SETTINGS.scale = 1.0
sys.modules[SETTINGS.__name__] = SETTINGS


class Knobs:
    scale = 1.0


class _Scaled(gluon.HybridBlock):
    """A Dense whose output a setting scales, read in another way by each subclass."""

    scale = 1.0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)


class GetattrOfAClass(_Scaled):
    def hybrid_forward(self, F, x):
        return self.dense(x) * getattr(Knobs, "scale")


class GetattrOfAModule(_Scaled):
    def hybrid_forward(self, F, x):
        return self.dense(x) * getattr(SETTINGS, "scale", 1.0)


class ModuleAliased(_Scaled):
    def hybrid_forward(self, F, x):
        settings = SETTINGS
        return self.dense(x) * settings.scale


class ModuleImportedInside(_Scaled):
    def hybrid_forward(self, F, x):
        from gdb_test_settings import scale     # pylint: disable=import-outside-toplevel
        return self.dense(x) * scale


class OwnTypeAliased(_Scaled):
    def hybrid_forward(self, F, x):
        cls = type(self)
        return self.dense(x) * cls.scale


class GetattrOfOwnType(_Scaled):
    def hybrid_forward(self, F, x):
        return self.dense(x) * getattr(type(self), "scale")


class SettingPerWord(gdb.DynBatchBlock):
    """Sets every form of the setting per word, then calls the child."""

    def __init__(self, child, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = child
            self.carry = gluon.nn.Dense(4, in_units=4, use_bias=False)

    def hybrid_forward(self, F, words, table):
        h = F.zeros((1, 4))
        for w in words:
            SETTINGS.scale = Knobs.scale = type(self.child).scale = 0.5 + 0.1 * w
            h = F.tanh(self.child(table[w:w + 1]) + self.carry(h))
        return h


@pytest.mark.parametrize("child", [GetattrOfAClass, GetattrOfAModule, ModuleAliased,
                                   ModuleImportedInside, OwnTypeAliased, GetattrOfOwnType])
def test_settings_a_child_reads_indirectly_are_read_at_every_call(child):
    # Read through getattr, a local alias, an import inside the code or
    # ``type(self)`` kept in a local, the setting went unkeyed: the child's
    # first call was replayed for every word (other words' scales).
    mx.random.seed(0)
    model = SettingPerWord(child())
    model.initialize(mx.init.Uniform(0.3))
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (10, 3)))
    for sentences in ([[1, 2, 3], [4, 5]], [[6, 7, 8, 9], [2]]):
        want = [model(s, table).asnumpy() for s in sentences]
        with gdb.batching():
            got = [model(s, table) for s in sentences]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.asnumpy(), w, rtol=1e-5, atol=1e-6)


class DoublesItsArgument(gluon.HybridBlock):
    """``x *= 2`` on its argument: the caller's array changes (outside
    ``autograd.record()``), an act a replay of its first call would skip."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        y = self.dense(x)
        x *= 2
        return F.tanh(y)


class ScalesThroughAChild(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)
            self.child = DoublesItsArgument()

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        y = self.child(h)
        return h + 0, y


@pytest.mark.parametrize("compiled", [False, True])
def test_a_child_updating_its_argument_in_place_runs_at_every_call(compiled):
    # A replay of its first call left the caller's array as it was.
    model = make_model(ScalesThroughAChild)
    for seed in range(3):
        r = np.random.RandomState(seed)
        xs = [nd.array(r.uniform(-1, 1, (k % 2 + 2, 4))) for k in range(5)]
        want = [[v.asnumpy() for v in model(x)] for x in xs]
        with gdb.batching(compiled=compiled):
            outs = [model(x) for x in xs]
        for got, expected in zip(outs, want):
            for value, eager in zip(got, expected):
                np.testing.assert_allclose(value.asnumpy(), eager, rtol=1e-5, atol=1e-6)


class Signed(gluon.HybridBlock):
    """Tells a number's sign apart, zeros too."""

    def hybrid_forward(self, F, x, c):
        return x * math.copysign(1.0, c)


class PassesSigns(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.signed = Signed()

    def hybrid_forward(self, F, x, c):
        return self.signed(x, c)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_childs_argument_of_minus_zero_is_told_from_zero(compiled):
    """0.0 == -0.0 as Python keys: the first call of the child was replayed
    for the other zero, whose code gives another result."""
    model = PassesSigns()
    model.initialize()
    x, signs = nd.ones((1, 2)), [0.0, -0.0, 0.0, -0.0]
    want = [model(x, c).asnumpy() for c in signs]
    for _ in range(2):
        with gdb.batching(compiled=compiled):
            got = [model(x, c) for c in signs]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.asnumpy(), b)
