"""Code written the way users write it: containers, aliases, in-place updates, kept values."""
import collections
import contextlib
import functools
import gc
import re

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.base import MXNetError

import gluon_dynbatch as gdb
from gluon_dynbatch import logs
from gluon_dynbatch.scope import READS_BEFORE_EAGER
from dynbatch_testing import (DenseForms, DenseTanh, Tree, assert_batched_equals_eager,
                              assert_same, check_all_strategies, outputs_of, run_model)


def _inputs(n, seed=0):
    mx.random.seed(seed)
    return [nd.random.uniform(shape=(1, 4)) for _ in range(n)]


class ReturnsTwice(gluon.HybridBlock):
    """Returns one array twice, as Gluon's RNNCell does (``output, [output]``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        return h, h


class UsesFirst(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = ReturnsTwice()

    def hybrid_forward(self, F, x):
        first, second = self.cell(x)
        assert first is second          # one value, one object, as in eager code
        return first


@pytest.mark.parametrize("compiled", [False, True, "step"])
def test_child_returning_one_array_twice(compiled):
    model = UsesFirst()
    model.initialize()
    xs = _inputs(2)
    with gdb.batching(compiled=compiled):
        outs = [model(x) for x in xs]
    for out, x in zip(outs, xs):
        np.testing.assert_allclose(out.asnumpy(), model(x).asnumpy(), rtol=1e-5, atol=1e-7)


class Stack(gdb.DynBatchBlock):
    def hybrid_forward(self, F, x, n):
        rows = F.tanh(F.concat(*[x * (k + 1) for k in range(n)], dim=0))
        return F.concat(*[rows[k:k + 1] for k in range(n)], dim=0)


@pytest.mark.parametrize("n", [1, 32, 33, 34, 130])
def test_row_concatenations_of_any_length(n):
    model = Stack()
    x = _inputs(1)[0]
    with gdb.batching():
        out = model(x, n)
    np.testing.assert_allclose(out.asnumpy(), model(x, n).asnumpy(), rtol=1e-6)


class InPlace(gdb.DynBatchBlock):
    def hybrid_forward(self, F, x):
        c = F.tanh(x)
        alias = c
        c += x
        return alias


def test_in_place_update_under_record_raises_as_eager():
    x = _inputs(1)[0]
    x.attach_grad()
    with pytest.raises(MXNetError):
        with autograd.record():
            InPlace()(x)                 # eager MXNet refuses
    model = InPlace()
    with pytest.raises(MXNetError, match="sample 0, in .*in-place update"):
        with autograd.record():
            with gdb.batching():
                model(x)
    with gdb.batching():                 # the next scope works
        out = model(x)
    np.testing.assert_allclose(out.asnumpy(), model(x).asnumpy(), rtol=1e-5, atol=1e-7)


class AssignIntoZeros(gdb.DynBatchBlock):
    """``t = F.zeros(...); t[0, k] = 1``: F.zeros is one constant per graph."""

    def hybrid_forward(self, F, k, x):
        target = F.zeros((1, 4))
        target[0, k] = 1
        return x * target


class ZerosTimes(gdb.DynBatchBlock):
    def hybrid_forward(self, F, k, x):
        return x * F.zeros((1, 4)) + k


def test_item_assignment_into_a_recorded_value_is_refused_and_nothing_is_corrupted():
    x = nd.ones((1, 4))
    want = [AssignIntoZeros()(k, x).asnumpy() for k in (1, 2)]      # eager works
    assert want[0][0, 1] == 1 and want[1][0, 1] == 0
    model = AssignIntoZeros()
    with pytest.raises(gdb.BatchingError, match="sample 1, in .*item assignment"):
        with gdb.batching():
            ZerosTimes()(0, x)
            model(1, x)
    with gdb.batching():                 # the shared zeros are still zeros
        outs = [ZerosTimes()(k, x) for k in (1, 2)]
    for k, out in zip((1, 2), outs):
        np.testing.assert_array_equal(out.asnumpy(), np.full((1, 4), k, dtype=np.float32))
    computed = outs[0]
    computed[0, 0] = 7                   # a computed value is an ordinary array
    assert computed.asnumpy()[0, 0] == 7


def test_in_place_update_outside_record_updates_aliases():
    x = _inputs(1)[0]
    want = InPlace()(x).asnumpy()        # eager: the alias sees the update
    np.testing.assert_allclose(want, np.tanh(x.asnumpy()) + x.asnumpy(), rtol=1e-6)
    with gdb.batching():
        out = InPlace()(x)
    np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-6)


class CountingScale(gdb.DynBatchBlock):
    """Scales its output by a counter kept in a dict other code shares, then
    writes it in place: one added (``how`` "count"), or the output stored into
    it (``"set"``: ``count[:] = out``, ``"copyto"``: ``out.copyto(count)``)."""

    def __init__(self, shared, how, **kwargs):
        super().__init__(**kwargs)
        self.shared, self.how = shared, how
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        out = F.tanh(self.dense(x)) * self.shared["count"]
        if self.how == "count":
            self.shared["count"] += 1.0
        elif self.how == "set":
            self.shared["count"][:] = out + 1
        else:
            (out + 1).copyto(self.shared["count"])
        return out


@pytest.mark.parametrize("how", ["count", "set", "copyto"])
@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"},
                                     {"granularity": "op"}, "map"])
def test_an_array_each_sample_reads_then_writes_reaches_the_next_sample_as_eager(options, how):
    """Each sample waited at its write (a read, or the pending value written)
    while the next one started and read the counter: samples 2 and 3 were
    scaled by 2 where eager has 3 and 4."""
    shared = {"count": nd.ones((1, 3))}
    model = CountingScale(shared, how)
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array([[k, 1 - k, 0.5 * k]]) for k in range(4)]
    want = [model(x).asnumpy() for x in xs]
    shared["count"][:] = 1
    if options == "map":
        outs = gdb.map(model, xs)
    else:
        with gdb.batching(**options):
            outs = [model(x) for x in xs]
    final = shared["count"].asnumpy()
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(final, want[-1] + 1 if how != "count" else np.full((1, 3), 5.0),
                               rtol=1e-5)


@pytest.mark.parametrize("how", ["set", "copyto"])
def test_samples_writing_their_own_buffers_made_before_the_scope_still_batch(how):
    """Each sample of a ``gdb.map`` stores its result into a buffer of its own:
    nothing reads the buffers before, so the samples' writes wait together and
    their calls batch (a flush at each write ran a step per call)."""
    model = DenseTanh()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array(np.random.RandomState(k).uniform(-1, 1, (2, 3))) for k in range(16)]
    buffers = [nd.zeros((2, 4)) for _ in xs]

    def store(k):
        if how == "set":
            buffers[k][:] = model(xs[k])
        else:
            model(xs[k]).copyto(buffers[k])
        return k
    with gdb.batching() as scope:
        gdb.map(store, list(range(len(xs))))
    for x, buffer in zip(xs, buffers):
        np.testing.assert_allclose(buffer.asnumpy(), model(x).asnumpy(), rtol=1e-5, atol=1e-6)
    assert scope.stats.steps <= 2


class PausedMask(gdb.DynBatchBlock):
    """Refills a mask kept on the model from its input under ``autograd.pause()``,
    then reads it: the state every sample shares, written before it is read."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)
        self.mask = nd.zeros((1, 3))

    def hybrid_forward(self, F, x):
        with autograd.pause():
            self.mask[:] = F.tanh(x)
        return F.sum(self.dense(x) * self.mask)


@pytest.mark.parametrize("options", [{}, {"compiled": True}, "map"])
def test_a_mask_each_sample_writes_before_reading_it_is_its_own_as_eager(options):
    """Each sample waited at the change of modes after its write; the next
    samples then wrote the mask, and the first read the last sample's mask
    (outputs and the weight's gradient off)."""
    model = PausedMask()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array(np.random.RandomState(k).randn(1, 3)) for k in range(4)]
    weight = model.dense.weight
    with autograd.record():
        want = [model(x) for x in xs]
        total = nd.add_n(*want)
    total.backward()
    want_grad = weight.grad().asnumpy().copy()
    model.mask[:] = 0
    with autograd.record():
        if options == "map":
            outs = gdb.map(model, xs)
        else:
            with gdb.batching(**options):
                outs = [model(x) for x in xs]
        total = nd.add_n(*outs)
    total.backward()
    _assert_outputs_equal(outs, want)
    np.testing.assert_allclose(weight.grad().asnumpy(), want_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.mask.asnumpy(), np.tanh(xs[-1].asnumpy()), rtol=1e-6)


class Prepared(gdb.DynBatchBlock):
    """Overrides ``forward``: scales its input (by an optional argument it
    passes on) before ``super().forward``; ``child``: a Prepared inside."""

    def __init__(self, child=False, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)
            self.child = Prepared() if child else None

    def forward(self, x, scale=2.0):
        return super().forward(x * scale, scale)

    def hybrid_forward(self, F, x, scale, **params):
        h = F.tanh(self.dense(x)) * scale
        return h if self.child is None else self.child(h, 0.5)


class OnlyForward(gdb.DynBatchBlock):
    """Writes ``forward`` alone, as a plain Block would."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def forward(self, x):
        return nd.sigmoid(self.dense(x * 3.0))


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}, "map"])
@pytest.mark.parametrize("make", [Prepared, lambda: Prepared(child=True), OnlyForward])
def test_a_dynbatch_blocks_own_forward_runs_in_a_scope_as_eagerly(make, options):
    """The scope called ``hybrid_forward`` directly: the override's scaling was
    lost (outputs and gradients off), the optional argument it passes on went
    missing (TypeError), and a block writing ``forward`` alone raised
    ``NotImplementedError``."""
    model = make()
    model.initialize(mx.init.Uniform(0.5))
    for seed in range(2):       # a second batch replays what the first learned
        rng = np.random.RandomState(seed)
        samples = [(nd.array(rng.uniform(-1, 1, (1 + k % 2, 3))),) for k in range(5)]
        assert_batched_equals_eager(model, samples, options)


class ScalesItsInput(gdb.DynBatchBlock):
    """Doubles the array it is given in place (``how``: ``x[:] = x * 2``, ``x *= 2``,
    or after a call read it first), under ``autograd.pause()``, then reads it."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, x):
        before = self.dense(x) if self.how == "read first" else 0
        with autograd.pause():
            if self.how == "iadd":
                x *= 2
            elif self.how == "iadd pending":
                x += F.tanh(x)
            elif self.how == "out":
                F.broadcast_mul(x, F.ones_like(x) * 2, out=x)
            elif self.how == "copyto":
                (x * 2).copyto(x)
            else:
                x[:] = x * 2
        return F.sum(self.dense(x) + before, axis=1)


def _summed_and_differentiated(model, xs, options, training=True):
    """``model``'s outputs on ``xs`` (``outputs_of`` with ``options``), their sum
    differentiated when ``training``."""
    with autograd.record(training):
        outs = outputs_of(model, xs, options)
        total = nd.add_n(*[out.sum() for out in outs])
    if training:
        total.backward()
    return outs


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}, "map"])
@pytest.mark.parametrize("how", ["setitem", "iadd", "iadd pending", "out", "copyto",
                                 "read first"])
@pytest.mark.parametrize("training", [False, True])
def test_a_sample_writing_the_array_it_was_given_writes_the_callers_array(how, options,
                                                                          training):
    """The write went to the scope's stand-in for the array: ``x[:] = ...``
    raised a BatchingError and ``x *= 2`` another, or, once a flush had
    computed the stand-in (a call had read it, or the sample waited at the
    change of modes), the caller's array kept its old values (``+=``,
    ``out=``, ``copyto``)."""
    model = ScalesItsInput(how)
    model.initialize(mx.init.Uniform(0.5))
    base = [np.random.RandomState(k).uniform(-1, 1, (1 + k % 2, 3)) for k in range(4)]
    runs = []
    for batched in (False, True, True):     # the second scope replays the first's
        xs = [nd.array(b) for b in base]
        outs = _summed_and_differentiated(model, xs, options if batched else None,
                                          training)
        runs.append(([out.asnumpy() for out in outs], [x.asnumpy() for x in xs],
                     model.dense.weight.grad().asnumpy().copy() if training else None))
    want_outs, want_xs, want_grad = runs[0]
    for outs, xs, grad in runs[1:]:
        for got, want in zip(outs + xs, want_outs + want_xs):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        if training and how != "read first":
            # (eager's pass reads the first call's input as written after it: documented)
            np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


class WritesIntoZeros(gdb.DynBatchBlock):
    """``y = F.zeros(x.shape)`` filled by ``out=`` or ``copyto``, as a buffer."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, flatten=False)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        y = F.zeros(x.shape)
        if self.how == "out":
            F.relu(h, out=y)
        else:
            h.copyto(y)
        return y + h


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "reference"}, "map"])
@pytest.mark.parametrize("how", ["out", "copyto"])
def test_samples_writing_into_arrays_of_zeros_they_made_equal_eager(how, options):
    """Every call of ``F.zeros`` of one shape returned one LazyArray: a later
    sample's ``out=`` (or ``copyto``) write reached an earlier sample's array,
    whose output was the later sample's (once the block's templates were
    learned; under ``gdb.map`` at once)."""
    model = WritesIntoZeros(how)
    model.initialize(mx.init.Uniform(0.5))
    base = [np.random.RandomState(k).uniform(-1, 1, (1 + k % 2, 3)) for k in range(4)]
    runs = []
    for batched in (False, True, True):     # the second scope replays the first's
        xs = [nd.array(b) for b in base]
        outs = _summed_and_differentiated(model, xs, options if batched else None)
        runs.append(([out.asnumpy() for out in outs], model.dense.weight.grad().asnumpy().copy()))
    for outs, grad in runs[1:]:
        for got, want in zip(outs, runs[0][0]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad, runs[0][1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["setitem", "iadd", "iadd pending", "out", "copyto"])
@pytest.mark.parametrize("training", [False, True])
def test_samples_given_one_array_that_each_write_it_equal_eager_or_are_refused(how, training):
    """Each of three samples given the same array doubles it: eager's sample k
    reads it doubled k + 1 times.  The writes took turns in another order (a
    later sample's write reached an earlier sample's read, the last write was
    lost); where other samples that hold the array have not finished, the
    write is refused, naming the sample."""
    model = ScalesItsInput(how)
    model.initialize(mx.init.Uniform(0.5))
    start = np.random.RandomState(0).uniform(-1, 1, (2, 3))
    x = nd.array(start)
    with autograd.record(training):
        want = [model(x).asnumpy() for _ in range(3)]
    want_x = x.asnumpy()
    x = nd.array(start)
    try:
        with autograd.record(training):
            with gdb.batching():
                outs = [model(x) for _ in range(3)]
        got = [out.asnumpy() for out in outs]
    except gdb.BatchingError as err:
        assert re.search(r"sample \d, in .*other samples that have not finished", str(err))
        return
    for out, expected in zip(got, want):
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.asnumpy(), want_x, rtol=1e-5, atol=1e-6)


class WritesItsInputTwice(gdb.DynBatchBlock):
    """Doubles its input in place, reads it, then updates it again (``how``)."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how

    def hybrid_forward(self, F, x):
        x[:] = x * 2
        h = F.tanh(x)
        if self.how == "+=":
            x += 1
        elif self.how == "*=":
            x *= 3
        elif self.how == "out":
            F.broadcast_add(x, F.ones_like(x), out=x)
        else:
            x[:] = x + 1
        return h


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "reference"}])
@pytest.mark.parametrize("how", ["+=", "*=", "out", "setitem"])
def test_a_call_reading_a_given_array_between_two_writes_reads_the_first(how, options):
    """The first write ran what was pending (a flush): the sample's stand-in
    for its input stayed a leaf of the graph before, which the second write
    did not see read, so the call between the writes read the second."""
    model = WritesItsInputTwice(how)
    start = np.array([[0.1, -0.2, 0.3]], dtype=np.float32)
    x = nd.array(start)
    want, want_x = model(x).asnumpy(), x.asnumpy()
    xs = [nd.array(start) for _ in range(3)]
    with gdb.batching(**options):
        outs = [model(x) for x in xs]
    for out, x in zip(outs, xs):
        np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-6)
        np.testing.assert_allclose(x.asnumpy(), want_x, rtol=1e-6)


def test_asking_where_an_output_lies_while_its_operator_runs_leaves_it_the_values():
    """Where an array's memory lies (asked before a write in place, to find the
    pending calls reading it) allocated an output not allocated yet, racing
    MXNet's engine thread doing the same for the operator computing it: about
    one output in a thousand (a sample's copy of an input it writes with
    ``out=``) kept memory the operator never wrote."""
    from gluon_dynbatch.record import aliases
    source = nd.ones((1, 3))
    wrong = 0
    for _ in range(20000):
        out = nd.identity(source)
        aliases._span(out)      # pylint: disable=protected-access
        wrong += not (out.asnumpy() == 1).all()
    assert wrong == 0


@pytest.mark.parametrize("how", ["setitem", "out", "copyto"])
def test_a_write_into_a_given_array_with_a_gradient_is_refused_and_the_next_scope_works(how):
    """Written as the caller's array, the later calls read a copy of it and its
    gradient came back zeros for every sample but the first; written through
    ``out=`` or ``copyto``, the caller's array kept its old values."""
    model = ScalesItsInput(how)
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array(np.random.RandomState(k).uniform(-1, 1, (2, 3))) for k in range(3)]
    for x in xs:
        x.attach_grad()
    with pytest.raises(gdb.BatchingError, match="sample 0, in .*a gradient attached"):
        with autograd.record():
            with gdb.batching():
                [model(x) for x in xs]
    want = [model(nd.array(x.asnumpy())).asnumpy() for x in xs]
    with gdb.batching():
        outs = [model(nd.array(x.asnumpy())) for x in xs]
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class DenseAnd(gdb.DynBatchBlock):
    """A Dense layer of 4 units and ``how``: what a subclass does with its output."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)


def _assert_outputs_equal(outs, want):
    """Each sample's outputs (an array, or a list or tuple of them) equal eager's."""
    for got, expected in zip(outs, want):
        got = got if isinstance(got, (list, tuple)) else [got]
        expected = expected if isinstance(expected, (list, tuple)) else [expected]
        for value, eager in zip(got, expected):
            np.testing.assert_allclose(value.asnumpy(), eager.asnumpy(), rtol=1e-5, atol=1e-6)


class ViewsThenUpdate(DenseAnd):
    """Views of a value (reshape, rows, a row, detach, a view of a view, a
    column slice: eager copies that one) taken before it is updated in place;
    with ``how`` true, the value is read between the views and the update."""

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        views = [h.reshape((-1,)), h[0:1], h[0], h.detach(), h[:, 1:3]]
        views.append(views[0][2:4])
        if self.how:
            views.append(h.sum().asscalar() * F.ones((1,)))
        h += x
        h *= 2
        return [h] + views


def _views_updated(model, xs):
    """Every sample's outputs, and a row view of a value of the caller's code
    updated in place after the view was taken."""
    outs = [model(x) for x in xs]
    top = outs[0][0] * 3
    row = top[1]
    top += 1
    return outs, row


@pytest.mark.parametrize("read", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_views_taken_before_an_update_in_place_see_it_as_in_eager(read, compiled):
    # The views kept the value from before the update (eager's share memory).
    model = ViewsThenUpdate(read)
    model.initialize(mx.init.Uniform(0.5))
    for seed in range(3):
        xs = [nd.array(np.random.RandomState(seed * 10 + k).uniform(-1, 1, (k % 3 + 2, 4)))
              for k in range(5)]
        want, want_row = _views_updated(model, xs)
        with gdb.batching(compiled=compiled):
            outs, row = _views_updated(model, xs)
        _assert_outputs_equal(outs + [row], want + [want_row])
        # eager's column slice is a copy, its row a view
        assert not np.allclose(want[1][5].asnumpy(), want[1][0][:, 1:3].asnumpy())
        np.testing.assert_array_equal(want[1][2].asnumpy().ravel(),
                                      want[1][0][0].asnumpy().ravel())


class WritesAfterViews(DenseAnd):
    """Views of a value, then the value written by another route than ``+=`` on
    a pending value: ``+=`` after a read, ``x[:] = v`` after a read, an
    operator's ``out=``, ``copyto``."""

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        if self.how in ("read_then_views", "views_read_setitem"):
            early = [h.reshape((-1,)), h[0:1]] if self.how == "views_read_setitem" else []
            h.sum().asscalar()
            views = early or [h[0:1], h.reshape((-1,)), h[1]]
            if self.how == "views_read_setitem":
                h[:] = 2
            else:
                h += 1
        else:
            views = [h[0:1], h.reshape((-1,)), h.detach()]
            if self.how == "out":
                F.elemwise_add(x, x, out=h)
            else:
                (x * 3).copyto(h)
        return [h + 0] + views


@pytest.mark.parametrize("how", ["read_then_views", "views_read_setitem", "out", "copyto"])
def test_views_see_writes_by_every_route_as_in_eager(how):
    model = WritesAfterViews(how)
    model.initialize(mx.init.Uniform(0.5))
    for seed in range(3):
        r = np.random.RandomState(seed)
        xs = [nd.array(r.uniform(-1, 1, (k % 3 + 2, 4))) for k in range(4)]
        want = [model(x) for x in xs]
        with gdb.batching():
            outs = [model(x) for x in xs]
        _assert_outputs_equal(outs, want)


class UpdatesAfterViews(DenseAnd):
    """A view taken, used or not, then its base updated in place, inside the
    call, whose frame makes the samples' values provisional objects."""

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        if self.how == "reshape_returned":
            v = h.reshape((-1,))
            h *= 3
            return v
        if self.how == "rows_returned":
            v = h[0:1]
            h *= 3
            return v
        v = h[0] if self.how == "row_summed" else h.detach() if self.how == "detach_summed" \
            else h[0:1]
        before = F.sum(v)
        h *= 2
        return before, F.sum(v), v + 0


@pytest.mark.parametrize("how", ["reshape_returned", "rows_returned", "row_summed",
                                 "detach_summed", "rows_summed"])
def test_updates_after_views_inside_calls_of_samples_of_several_sizes(how):
    # Objects of dead values are reused for later values of a call; one that was
    # a view was reused while its base still listed it: values of other
    # samples, "never given a value", endless recursion.
    model = UpdatesAfterViews(how)
    model.initialize(mx.init.Uniform(0.5))
    for seed in range(3):
        r = np.random.RandomState(seed)
        xs = [nd.array(r.uniform(-1, 1, (r.randint(1, 5), 4))) for _ in range(6)]
        want = [model(x) for x in xs]
        for compiled in (False, True):
            with gdb.batching(compiled=compiled):
                outs = [model(x) for x in xs]
            _assert_outputs_equal(outs, want)


class UpdatesASquareProduct(gdb.DynBatchBlock):
    """A sample's own square matrix ``x x^T`` (recorded as a reshape of a
    column), updated in place as Sinkhorn's row normalisation is written:
    ``how`` says whether a view is taken first, the value read before the
    update, or the view reshaped back and added in place."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how

    def hybrid_forward(self, F, x):
        s = F.dot(x, x, transpose_b=True)
        flat = s.reshape((-1,))
        if self.how == "read":
            s.sum().asscalar()
        s *= 2.0
        s /= s.sum(axis=1, keepdims=True)
        if self.how == "view_added":
            s += flat.reshape(s.shape)
        return s.sum(axis=1), flat.sum()


@pytest.mark.parametrize("how", ["plain", "read", "view_added"])
@pytest.mark.parametrize("batching", [{}, {"compiled": True}, {"granularity": "op"}])
def test_a_square_product_updated_in_place_keeps_the_update(how, batching):
    # The update was lost (the value's rows read from the column it reshapes),
    # or, with a view reshaped back, followed views without end.
    model = UpdatesASquareProduct(how)
    for seed in range(3):
        r = np.random.RandomState(seed)
        xs = [nd.array(r.uniform(0.1, 1, (r.randint(1, 5), 4))) for _ in range(5)]
        want = [model(x) for x in xs]
        with gdb.batching(**batching):
            outs = [model(x) for x in xs]
        _assert_outputs_equal(outs, want)


class HalvesItsChildren(gdb.DynBatchBlock):
    """``c = self(child); c *= 0.5``: in place on a recursive call's result (a
    forward hook doing ``out *= 0.5`` does the same at every call)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, depth, x):
        h = x
        for _ in range(depth % 3):
            c = self(depth - 1, x)
            c *= 0.5
            h = h + c
        return F.tanh(self.dense(h))


@pytest.mark.parametrize("how", [{}, {"strategy": "agenda"}, {"compiled": "step"}])
def test_in_place_update_of_a_child_calls_result_equals_eager(how):
    """It raised AttributeError ('Frame' object has no attribute 'outs')."""
    model = HalvesItsChildren()
    model.initialize(mx.init.Uniform(0.5))
    xs = _inputs(4)
    want = [model(k + 2, x).asnumpy() for k, x in enumerate(xs)]
    for _ in range(2):                   # learned, then matched
        with gdb.batching(**how):
            outs = [model(k + 2, x) for k, x in enumerate(xs)]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class Memoised(gdb.DynBatchBlock):
    """Keeps an intermediate in a dict that outlives the batch (a forgotten cache)."""

    def __init__(self, memo, **kwargs):
        super().__init__(**kwargs)
        self.memo = memo
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x, key):
        if key not in self.memo:
            self.memo[key] = F.tanh(self.dense(x)) * 2
        return self.dense(self.memo[key]).sum() + self.dense(x).sum()


def _train_memoised(batched):
    mx.random.seed(3)
    model = Memoised({})
    model.initialize(mx.init.Uniform(0.5))
    xs = _inputs(3, seed=4)
    grads = []
    for _ in range(2):
        with autograd.record():
            if batched:
                with gdb.batching():
                    outs = [model(x, k) for k, x in enumerate(xs)]
            else:
                outs = [model(x, k) for k, x in enumerate(xs)]
            loss = nd.add_n(*outs)
        loss.backward()
        grads.append(model.dense.weight.grad().asnumpy().copy())
    return grads


def test_value_kept_from_an_earlier_batch_after_backward():
    eager = _train_memoised(False)
    batched = _train_memoised(True)
    for got, want in zip(batched, eager):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class Branching(gdb.DynBatchBlock):
    """Branches at every call on a value it computes (a read of a lazy value)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        y = F.tanh(self.dense(x))
        if float(y.sum().asscalar()) > 0:
            return y * 2
        return y - 1


def test_reads_in_every_sample_wait_and_batch(caplog):
    model = Branching()
    model.initialize(mx.init.Uniform(0.5))
    xs = [x * (1 if k % 2 else -1) for k, x in enumerate(_inputs(30, seed=5))]
    with caplog.at_level("WARNING", logger="gluon_dynbatch.scope"):
        with autograd.record():
            with gdb.batching() as scope:
                outs = [model(x) for x in xs]       # each waits at its read
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
    grad = model.dense.weight.grad().asnumpy().copy()
    stats = scope.stats
    # The model's first call runs to its end (it shows the form of the results:
    # one flush at its read); the others wait at their reads: one flush for all
    # of them, one for what follows.
    assert (stats.reads, stats.flushes, stats.eager_samples) == (len(xs), 3, 0)
    assert not [r for r in caplog.records if "read while recording" in r.getMessage()]
    with autograd.record():
        want = [model(x) for x in xs]
        loss = nd.add_n(*[o.sum() for o in want])
    loss.backward()
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got.asnumpy(), ref.asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, model.dense.weight.grad().asnumpy(), rtol=1e-5, atol=1e-6)


class Plain(gdb.DynBatchBlock):
    """``tanh(Wx)``: no read inside."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


def test_reads_after_every_sample_switch_the_scope_to_eager(caplog):
    model = Plain()
    model.initialize(mx.init.Uniform(0.5))
    xs = _inputs(30, seed=5)
    with caplog.at_level("WARNING", logger="gluon_dynbatch.scope"):
        with gdb.batching() as scope:
            # The scope's own code reads each output: every read runs what is pending.
            signs = [float(model(x).sum().asscalar()) > 0 for x in xs]
    stats = scope.stats
    assert stats.reads >= READS_BEFORE_EAGER and 0 < stats.eager_samples < len(xs)
    warnings = [r.getMessage() for r in caplog.records if "read while recording" in r.getMessage()]
    assert len(warnings) == 1 and "test_user_code.py" in warnings[0]
    assert signs == [float(model(x).sum().asscalar()) > 0 for x in xs]
    caplog.clear()
    with caplog.at_level("WARNING", logger="gluon_dynbatch.scope"):
        with gdb.batching() as scope:         # the model's next scope gives up at once
            outs = [model(xs[0])]
            float(outs[0].sum().asscalar())
            outs += [model(x) for x in xs[1:3]]
    assert scope.stats.reads == 1 and scope.stats.eager_samples == 2
    assert not [r for r in caplog.records if "read while recording" in r.getMessage()]
    for got, x in zip(outs, xs[:3]):
        np.testing.assert_allclose(got.asnumpy(), model(x).asnumpy(), rtol=1e-5, atol=1e-6)


class Refusing(Plain):
    """``Plain`` that raises on an input of all zeros."""

    def hybrid_forward(self, F, x):
        if not x.abs().sum().asscalar():
            raise ValueError("an empty input")
        return super().hybrid_forward(F, x)


def test_an_error_of_a_sample_run_eagerly_after_reads_names_the_sample():
    model = Refusing()
    model.initialize(mx.init.Uniform(0.5))
    xs = _inputs(12, seed=5)
    xs[9] = nd.zeros_like(xs[9])
    for _ in range(2):                        # the first scope and a next one
        with pytest.raises(ValueError, match="an empty input") as info:
            with gdb.batching() as scope:
                for x in xs:
                    float(model(x).sum().asscalar())
        assert scope.stats.eager_samples > 0
        notes = " ".join(getattr(info.value, "__notes__", []))
        assert "raised while running eagerly" in notes and "sample 9, in refusing" in notes
    with gdb.batching():                      # the next batch works
        out = model(xs[0])
    np.testing.assert_allclose(out.asnumpy(), model(xs[0]).asnumpy(), rtol=1e-5, atol=1e-6)


def test_values_after_the_scope_take_views_like_ndarrays():
    # NDArray.reshape and basic indexing build ``self.__class__(handle=...)``.
    plain = Plain()
    plain.initialize(mx.init.Uniform(0.5))
    xs = _inputs(3, seed=2)

    def loss_of(outs):
        return nd.add_n(*[(o.reshape((-1,)) * 2).sum() + o[0].sum() + o[0:1].sum()
                          for o in outs])

    with autograd.record():
        with gdb.batching():
            outs = [plain(x) for x in xs]
        loss = loss_of(outs)
    loss.backward()
    grad = plain.dense.weight.grad().asnumpy().copy()
    with autograd.record():
        loss_eager = loss_of([plain(x) for x in xs])
    loss_eager.backward()
    np.testing.assert_allclose(loss.asnumpy(), loss_eager.asnumpy(), rtol=1e-6)
    np.testing.assert_allclose(grad, plain.dense.weight.grad().asnumpy(), rtol=1e-5, atol=1e-7)


class DirectCalls(gdb.DynBatchBlock):
    """Calls ``mx.nd`` operators directly on the values it is given, as Gluon's
    own helpers do (``RecurrentCell.unroll`` splits with ``ndarray.split``)."""

    def __init__(self, biasless=False, **kwargs):
        super().__init__(**kwargs)
        self.biasless = biasless
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        a, b = mx.nd.split(mx.nd.concat(h, x, dim=0), num_outputs=2, axis=0)
        if self.biasless:
            # The bias left out: arrays go by position, so this call cannot be
            # recorded; its arrays are read and the answer is the same.
            b = mx.nd.FullyConnected(b, self.dense.weight.data(), no_bias=True, num_hidden=4)
        # Operators whose last registered name is a numpy alias (_npx_...).
        a = mx.nd.Activation(mx.nd.FullyConnected(a, self.dense.weight.data(),
                                                  self.dense.bias.data(), num_hidden=4),
                             act_type="softrelu")
        return mx.nd.tanh(a) * mx.nd.sigmoid(b)


class DirectPReLU(gdb.DynBatchBlock):
    """``mx.nd.LeakyReLU(..., act_type="prelu")`` called directly, twice, with a
    slope Parameter after a layer."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)
            self.slope = self.params.get("slope", shape=(1,), init=mx.init.Constant(0.25))

    def hybrid_forward(self, F, x, slope):
        h = mx.nd.LeakyReLU(self.dense(x), gamma=slope, act_type="prelu")
        return h + mx.nd.LeakyReLU(self.dense(h), gamma=slope, act_type="prelu")


@pytest.mark.parametrize("compiled", [False, True, "step"])
def test_direct_prelu_calls_keep_the_slope_gradient(compiled):
    model = DirectPReLU()
    model.initialize(mx.init.Uniform(1.0))
    xs = _inputs(5, seed=3)
    expected = run_model(model, xs, [], "eager")
    got = run_model(model, xs, [], "depth", compiled)
    assert_same(got, expected)
    assert got[2].reads == 0


class Detaching(gdb.DynBatchBlock):
    """``detach()`` and ``copyto(context)`` of pending values."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        return h * h.detach() + h.copyto(h.context) * 2


@pytest.mark.parametrize("compiled", [False, True])
def test_detach_and_copyto_of_pending_values_record_without_reading(compiled):
    model = Detaching()
    model.initialize(mx.init.Uniform(1.0))
    xs = _inputs(4, seed=6)
    expected = run_model(model, xs, [], "eager")
    got = run_model(model, xs, [], "depth", compiled)
    assert_same(got, expected)
    assert got[2].reads == 0 and got[2].mean_batch_size > 1


def _eager_and_batched(model, xs, compiled):
    with autograd.record():
        expected = [model(x) for x in xs]
    with autograd.record():
        with gdb.batching(compiled=compiled) as scope:
            got = [model(x) for x in xs]
    for g, e in zip(got, expected):
        assert np.allclose(g.asnumpy(), e.asnumpy(), rtol=1e-5, atol=1e-6)
    return scope.stats


@pytest.mark.parametrize("compiled", [False, True])
def test_direct_mx_nd_calls_on_pending_values_are_recorded(compiled):
    model = DirectCalls()
    model.initialize()
    stats = _eager_and_batched(model, _inputs(5), compiled)
    assert stats.reads == 0 and stats.eager_samples == 0
    assert stats.mean_batch_size > 1


def test_direct_call_leaving_an_optional_array_out_is_recorded():
    # mx.nd.FullyConnected(x, w, no_bias=True): the arrays given go by position.
    model = DirectCalls(biasless=True)
    model.initialize()
    stats = _eager_and_batched(model, _inputs(5), False)
    assert stats.reads == 0 and stats.mean_batch_size > 1


def test_direct_call_with_out_argument_reads_and_stays_exact():
    class WithOut(gdb.DynBatchBlock):
        def hybrid_forward(self, F, x):
            y = F.tanh(x)
            buffer = mx.nd.zeros(y.shape)
            mx.nd.sigmoid(y, out=buffer)
            return buffer * 2

    model = WithOut()
    xs = _inputs(3)
    expected = [model(x).asnumpy() for x in xs]
    with gdb.batching() as scope:
        got = [model(x) for x in xs]
    assert scope.stats.reads >= 1
    for g, e in zip(got, expected):
        assert np.allclose(g.asnumpy(), e, rtol=1e-6)


class TransposedWeight(gdb.DynBatchBlock):
    """Transposes its weight in every call (the same value for every sample)."""

    def __init__(self, drop=False, **kwargs):
        super().__init__(**kwargs)
        self.drop = drop
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(4, 4))

    def hybrid_forward(self, F, x, weight):
        w = F.transpose(weight) * 2
        if self.drop:
            w = F.Dropout(w, p=0.5)
        return F.tanh(F.dot(x, w))


def _plan_nodes(scope, name):
    return [n for s in scope.last_plan.steps for n in s.nodes if n.op.name == name]


@pytest.mark.parametrize("granularity", ["call", "op"])
def test_calls_on_weights_only_are_one_node_and_gradients_match(granularity):
    model = TransposedWeight()
    model.initialize(mx.init.Uniform(0.5))
    xs = _inputs(5)
    with autograd.record():
        loss = nd.add_n(*[model(x).sum() for x in xs])
    loss.backward()
    expected = model.weight.grad().asnumpy().copy()
    with autograd.record():
        with gdb.batching(keep_plan=True, granularity=granularity) as scope:
            outs = [model(x) for x in xs]
        nd.add_n(*[o.sum() for o in outs]).backward()
    assert len(_plan_nodes(scope, "transpose")) == 1
    assert len(_plan_nodes(scope, "_mul_scalar")) == 1      # ``* 2`` on the weight too
    assert np.allclose(model.weight.grad().asnumpy(), expected, rtol=1e-5, atol=1e-6)


def test_random_calls_on_weights_draw_for_each_sample():
    model = TransposedWeight(drop=True)
    model.initialize(mx.init.Uniform(0.5))
    x = nd.ones((1, 4))
    with autograd.record():
        with gdb.batching(keep_plan=True) as scope:
            outs = [model(x) for _ in range(4)]
    assert len(_plan_nodes(scope, "transpose")) == 1
    # As in eager code, each call draws its own mask (equal masks: odds 2**-16).
    values = [o.asnumpy() for o in outs]
    assert any(not np.array_equal(values[0], v) for v in values[1:])


class SparseLookup(gdb.DynBatchBlock):
    """Word vectors from an ``nn.Embedding(sparse_grad=True)``, summed over a sentence."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(50, 4, sparse_grad=True)
            self.out = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, words):
        total = 0
        for word in words:
            total = total + F.tanh(self.embed(F.array([word])))
        return self.out(total)


@pytest.mark.parametrize("compiled", [False, True, "step"])
def test_sparse_embedding_gradients_stay_row_sparse_and_match_eager(compiled):
    model = SparseLookup()
    model.initialize(mx.init.Uniform(0.5))
    sentences = [[1, 2, 3], [4, 5], [1, 7, 9, 11]]

    def gradient(batching):
        with autograd.record():
            if batching is None:
                outs = [model(s) for s in sentences]
            else:
                with gdb.batching(**batching):
                    outs = [model(s) for s in sentences]
            nd.add_n(*[o.sum() for o in outs]).backward()
        grad = model.embed.weight.grad()
        return grad.stype, grad.tostype("default").asnumpy().copy()

    stype, expected = gradient(None)
    got_stype, got = gradient({"compiled": compiled})
    assert stype == got_stype == "row_sparse"
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-6)
    used = sorted({w for s in sentences for w in s})
    assert np.flatnonzero(np.abs(got).sum(axis=1)).tolist() == used


class StatesSeen(gdb.DynBatchBlock):
    """Keeps the begin_state arrays of every call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []
        with self.name_scope():
            self.cell = gluon.rnn.LSTMCell(4, input_size=4)

    def hybrid_forward(self, F, x):
        states = self.cell.begin_state(batch_size=1)
        self.seen.append(states)
        out, _ = self.cell(x, states)
        return out


def test_begin_state_in_a_model_is_one_shared_constant_per_graph():
    x = _inputs(1)[0]
    model = StatesSeen()
    model.initialize()
    want = model(x).asnumpy()
    assert all(type(s) is nd.NDArray for s in model.seen[-1])    # eager: Gluon's zeros
    model.seen.clear()
    with gdb.batching():
        outs = [model(x) for _ in range(3)]
        outside = model.cell.begin_state(batch_size=1)     # not in a model: Gluon's own
        nodes = [s._node for states in model.seen for s in states]
        assert len(nodes) == 6 and len({id(n) for n in nodes}) == 1
        assert nodes[0] is not None and nodes[0].kind == "leaf"
    assert all(type(s) is nd.NDArray for s in outside)
    for out in outs:
        np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-6)
    # ``func=None`` is Gluon's TypeError, after a scope as before one.
    with pytest.raises(TypeError):
        model.cell.begin_state(batch_size=1, func=None)


class SeenLSTM(gluon.rnn.LSTM):
    """A fused LSTM layer that keeps the states it makes when called without any."""

    seen = []

    def begin_state(self, *args, **kwargs):     # pylint: disable=arguments-differ
        states = super().begin_state(*args, **kwargs)
        self.seen.append(states)
        return states


class FusedSentence(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.rnn = SeenLSTM(4, input_size=4)

    def hybrid_forward(self, F, x):
        return self.rnn(x.expand_dims(1))[-1]


def test_a_fused_rnn_layers_zero_states_are_one_shared_constant_per_graph():
    xs = [nd.array(np.random.RandomState(k).uniform(-1, 1, (k + 2, 4))) for k in range(3)]
    model = FusedSentence()
    model.initialize()
    want = [model(x).asnumpy() for x in xs]
    assert all(type(s) is nd.NDArray for s in SeenLSTM.seen[-1])
    SeenLSTM.seen.clear()
    with gdb.batching():
        outs = [model(x) for x in xs]
        nodes = [s._node for states in SeenLSTM.seen for s in states]
        assert len(nodes) == 6 and len({id(n) for n in nodes}) == 1
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class SplitTokens(gdb.DynBatchBlock):
    """A sentence's (T, 4) matrix split into tokens along axis 0, squeezed to 1-d
    vectors, each multiplied by a weight as ``F.dot(W, x)``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(3, 4))

    def hybrid_forward(self, F, x, weight):
        tokens = F.split(F.tanh(x), num_outputs=x.shape[0], axis=0, squeeze_axis=True)
        tokens = tokens if isinstance(tokens, list) else [tokens.reshape((-1,))]
        h = F.zeros((3,))
        for token in tokens:
            h = F.tanh(F.dot(weight, token) + h)
        halves = F.concat(h, h * 2, dim=0).split(num_outputs=2, axis=0)
        return halves[0] * halves[1]


@pytest.mark.parametrize("compiled", [False, True])
def test_split_along_rows_and_vector_products_batch(compiled):
    model = SplitTokens()
    model.initialize()
    mx.random.seed(1)
    xs = [nd.random.uniform(shape=(t, 4)) for t in (1, 3, 2, 3)]
    stats = _eager_and_batched(model, xs, compiled)
    # Token t of every sentence is one step: no split or product runs per sentence
    # (the one-token sentence is one program, the product of the halves two steps).
    assert stats.steps <= 7


class VectorProducts(gdb.DynBatchBlock):
    """DyNet-style 1-d vectors: ``F.dot(W, x)``, ``F.dot(x, V)`` and
    ``F.dot(U, h, transpose_a=True)`` of weights, a (3,) bias, per token."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.w = self.params.get("w", shape=(3, 4))
            self.u = self.params.get("u", shape=(3, 3))
            self.v = self.params.get("v", shape=(3, 2))
            self.b = self.params.get("b", shape=(3,))

    def hybrid_forward(self, F, sentence, table, w, u, v, b):
        h = F.zeros((3,))
        for word in sentence:
            h = F.tanh(F.dot(w, table[word]) + F.dot(u, h, transpose_a=True) + b)
        return F.log_softmax(F.dot(h, v))


def _vector_plan(cls):
    """Check ``cls`` against eager everywhere; its plan's steps and the names of
    the operators its programs run."""
    from dynbatch_testing import check_all_strategies, make_model
    model = make_model(cls)
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, size=(7, 4)))
    sentences = [[1, 5, 2], [3], [6, 0, 4, 2], [2, 2]]
    check_all_strategies(model, sentences, [table])
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(sentence, table) for sentence in sentences]
    assert all(out.shape == (2,) for out in outs)
    steps = scope.last_plan.steps
    return steps, [e.op.name for s in steps if s.nodes[0].op.path is None
                   for e in s.nodes[0].op.entries]


def test_vector_products_are_one_call_each_and_exact():
    steps, names = _vector_plan(VectorProducts)
    # Each product is one call on the vector, with no reshapes to a row and back
    # (the one reshape a step is the lookup's, ``table[word]``), and token t of
    # every sentence is one step (the one-token sentence's scores in its step).
    assert len(steps) == 6
    assert names.count("FullyConnected") == 5 and names.count("dot") == 7, names
    assert names.count("reshape") == 5, names


class DerivedVectorProducts(VectorProducts):
    """The same with a weight made from a parameter in the call: ``F.dot(U.T, h)``."""

    def hybrid_forward(self, F, sentence, table, w, u, v, b):
        h = F.zeros((3,))
        for word in sentence:
            h = F.tanh(F.dot(w, table[word]) + F.dot(F.transpose(u), h) + b)
        return F.log_softmax(F.dot(h, v))


def test_vector_products_with_a_weight_made_in_the_call_are_one_call_each():
    _, names = _vector_plan(DerivedVectorProducts)
    # Both products of a token are FullyConnected calls on the vector.
    assert names.count("FullyConnected") == 10 and names.count("reshape") == 5, names


class StatesAndLast(gdb.DynBatchBlock):
    """An encoder's usual return: every state stacked, and the last one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.lin = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, words, emb):
        states = [F.tanh(self.lin(emb[w:w + 1])) for w in words]
        return F.concat(*states, dim=0), states[-1]


@pytest.mark.parametrize("strategy,compiled,granularity",
                         [("depth", False, None), ("agenda", False, None),
                          ("depth", True, None), ("depth", "step", None),
                          ("depth", False, "op")])
def test_a_concatenation_of_one_value_returned_with_it_equals_eager(strategy, compiled,
                                                                      granularity):
    # A one-word sentence stacks one state: the stacked value is that state,
    # and both must be handed out (each used, or not).
    mx.random.seed(0)
    model = StatesAndLast()
    model.initialize()
    emb = nd.random.uniform(shape=(10, 3))
    for batch in ([[5], [2, 7]], [[1], [3], [4, 6, 8]], [[9]]):
        expected = run_model(model, batch, [emb], "eager")
        got = run_model(model, batch, [emb], strategy, compiled=compiled,
                        granularity=granularity)
        assert_same(got, expected)


class ArrayIndexed(gdb.DynBatchBlock):
    """Rows or columns of a sentence's states picked by an array of indices."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        self.given = nd.array([0, 1], dtype="int32")   # made outside, a constant
        with self.name_scope():
            self.lin = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, words, emb):
        h = self.lin(F.concat(*[emb[w:w + 1] for w in words], dim=0))     # (k, 4)
        if self.form == "ends":
            return h[F.array([0, len(words) - 1], dtype="int32")]
        if self.form == "float":
            return h[F.array([len(words) - 1, 0, len(words) - 1])]
        if self.form == "given":
            return h[self.given] * 2
        if self.form == "computed":
            return h[F.argmax(h, axis=0).astype("int32")]
        if self.form == "columns":
            return h[:, F.array([1, 3], dtype="int32")]
        if self.form == "pairs":
            return h[F.array([len(words) - 1, 0]), F.array([2, 1])]
        raise ValueError(self.form)


@pytest.mark.parametrize("form", ["ends", "float", "given", "computed", "columns", "pairs"])
def test_indexing_by_an_array_equals_eager(form):
    mx.random.seed(1)
    model = ArrayIndexed(form)
    model.initialize()
    emb = nd.random.uniform(shape=(10, 3))
    for batch in ([[1, 2, 3], [4, 5]], [[6, 7], [8, 9, 1, 2], [3, 4]]):
        check_all_strategies(model, batch, [emb], strategies=("depth",))


class BroadcastsTrailing(gdb.DynBatchBlock):
    """A score (1, 1) broadcast to a row (1, H) with ``broadcast_to``/``broadcast_axis``."""

    def hybrid_forward(self, F, k, x):
        score = F.sigmoid(x[k:k + 1, 0:1])
        wide = F.broadcast_to(score, shape=(1, 3)) * x[k:k + 1, :3]
        return wide + F.broadcast_axis(score, axis=1, size=3)


def test_broadcast_to_over_trailing_axes_batches_and_equals_eager():
    model = BroadcastsTrailing()
    model.initialize()
    x = nd.random.uniform(shape=(6, 4))
    stats = check_all_strategies(model, list(range(5)), [x], strategies=("depth",))
    assert stats["depth"].steps < 5


class TwoLosses(gdb.DynBatchBlock):
    """Gluon's CosineEmbeddingLoss and L1Loss on a sample's rows: both reshape
    their label like their prediction (``reshape_like``, whose second input
    passes no gradient back)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4)
            self.cosine = gluon.loss.CosineEmbeddingLoss()
            self.l1 = gluon.loss.L1Loss()

    def hybrid_forward(self, F, rows, x):
        h = self.dense(F.tile(x, reps=(rows, 1)))
        return self.cosine(h, h * 0.5 + 1, F.ones((rows,))), self.l1(h, h * 0.3)


@pytest.mark.parametrize("granularity", ["op", None])
def test_inputs_read_only_for_their_shape_are_gathered_without_gradient(granularity):
    # Their gathers reach backward with a zero gradient only, which MXNet 1.9's
    # imperative backward does not survive (segfault).
    mx.random.seed(0)
    model = TwoLosses()
    model.initialize()
    x = nd.random.uniform(-1, 1, shape=(1, 3))
    expected = run_model(model, [1, 2, 3], [x], "eager")
    for strategy in ("depth", "agenda"):
        assert_same(run_model(model, [1, 2, 3], [x], strategy, granularity=granularity),
                    expected)


class _Square(mx.autograd.Function):
    """``x * x`` with its own backward, from the saved input."""

    def forward(self, x):  # pylint: disable=arguments-differ
        self.save_for_backward(x)
        return x * x

    def backward(self, dy):  # pylint: disable=arguments-differ
        x, = self.saved_tensors
        return 2 * x * dy


class _SquaredChild(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, flatten=False, in_units=4)

    def hybrid_forward(self, F, x):
        return _Square()(self.dense(x))


class SquaredByFunction(gdb.DynBatchBlock):
    """An ``mx.autograd.Function`` applied to a child's output, in the block or
    inside a child block."""

    def __init__(self, in_child, **kwargs):
        super().__init__(**kwargs)
        self.in_child = in_child
        with self.name_scope():
            self.child = _SquaredChild()

    def hybrid_forward(self, F, x):
        if self.in_child:
            return F.sum(self.child(x))
        return F.sum(_Square()(self.child.dense(x)))


@pytest.mark.parametrize("in_child", [False, True])
@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"compiled": "step"},
                                     {"granularity": "op"}, {"strategy": "reference"},
                                     "map"])
def test_an_autograd_function_in_the_samples_code_equals_eager(in_child, options):
    model = SquaredByFunction(in_child)
    model.initialize(mx.init.Xavier())
    for scope in range(3):          # templates learned in the first are replayed after
        rs = np.random.RandomState(scope)
        samples = [(nd.array(rs.randn(n, 4)),) for n in (2, 3, 1)]
        assert_batched_equals_eager(model, samples, options)


class _Holder:
    def __init__(self, gate):
        self.gate = gate


class _SlotHolder:
    __slots__ = ("gate",)

    def __init__(self, gate):
        self.gate = gate


class _ScaleBy(mx.autograd.Function):
    """``x * gate`` with its own backward; the gate (computed by the sample) given
    to the constructor and held alone, in a list, in a dict, in a list of
    tuples, or by another object."""

    def __init__(self, gate, how):
        super().__init__()
        self.how = how
        shared = [gate]
        self.held = {"alone": gate, "list": [gate], "dict": {"gate": gate},
                     "nested": [[[[[(gate, 1.0)]]]]], "object": _Holder(gate),
                     "slots": _SlotHolder(gate), "deque": collections.deque([gate]),
                     "shared": (shared, shared)}[how]

    def _gate(self):
        held = self.held
        return {"alone": lambda: held, "list": lambda: held[0], "dict": lambda: held["gate"],
                "nested": lambda: held[0][0][0][0][0][0], "object": lambda: held.gate,
                "slots": lambda: held.gate, "deque": lambda: held[0],
                "shared": lambda: held[1][0]}[self.how]()

    def forward(self, x):  # pylint: disable=arguments-differ
        return x * self._gate()

    def backward(self, dy):  # pylint: disable=arguments-differ
        return dy * self._gate()


def _scale_by_closure(gate):
    """A Function class whose methods read ``gate`` from their closure."""
    class ScaleBy(mx.autograd.Function):
        def forward(self, x):  # pylint: disable=arguments-differ
            return x * gate

        def backward(self, dy):  # pylint: disable=arguments-differ
            return dy * gate
    return ScaleBy()


class GatedByFunction(gdb.DynBatchBlock):
    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, flatten=False, in_units=4)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        gate = F.sigmoid(h).detach()
        scale = _scale_by_closure(gate) if self.how == "closure" else _ScaleBy(gate, self.how)
        return F.sum(scale(h))


@pytest.mark.parametrize("how", ["alone", "list", "dict", "nested", "object", "slots", "deque",
                                 "shared", "closure"])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"granularity": "op"},
                                     {"strategy": "reference"}])
def test_an_autograd_function_holding_values_the_sample_computed_equals_eager(how, options):
    """What the sample recorded runs first and the Function's code runs with the
    recorder set aside (calls on the held values were recorded: wrong weight
    gradients, then MXNet's 'not in a computational graph' from the second
    scope), wherever it holds them."""
    model = GatedByFunction(how)
    model.initialize(mx.init.Xavier())
    for scope in range(3):
        rs = np.random.RandomState(scope)
        samples = [(nd.array(rs.randn(n, 4)),) for n in (2, 3, 1)]
        assert_batched_equals_eager(model, samples, options)


class Chain(gdb.DynBatchBlock):
    """``f(k) = tanh(W f(k - 1))``, ``f(0) = x``: a call of the block per level."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, depth, x):
        if depth == 0:
            return x
        return F.tanh(self.dense(self(depth - 1, x)))


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"},
                                     "map"])
def test_forward_hooks_of_the_batched_block_run_at_each_call_as_eager(options):
    """Hooks on the DynBatchBlock itself run at every (recursive) call, in
    eager's order within each sample, given the call's output; a hook reading
    its value reads eager's (the sample waits there while the others go on)."""
    model = Chain()
    model.initialize()
    logs = []           # per run: id(the sample's x, passed down) -> its calls in order

    def log(entry, x):
        logs[-1].setdefault(id(x), []).append(entry)

    model.register_forward_pre_hook(lambda block, args: log(("pre", args[0]), args[1]))
    model.register_forward_hook(lambda block, args, out: log(
        ("post", args[0], out, float(out.sum().asscalar())), args[1]))
    samples = [(depth, x) for depth, x in zip((1, 3, 2), _inputs(3))]
    for batched in (False, True):
        logs.append({})
        if batched and options == "map":
            gdb.map(lambda s: model(*s), samples)
        elif batched:
            with gdb.batching(**options):
                outs = [model(*s) for s in samples]  # noqa: F841
        else:
            outs = [model(*s) for s in samples]  # noqa: F841
    eager, batched = [list(run.values()) for run in logs]     # samples in order of start
    assert [len(calls) for calls in eager] == [len(calls) for calls in batched] == [4, 8, 6]
    for mine, theirs in zip(batched, eager):
        assert [entry[:2] for entry in mine] == [entry[:2] for entry in theirs]
        for a, b in zip(mine, theirs):
            if a[0] == "post":
                np.testing.assert_allclose(a[2].asnumpy(), b[2].asnumpy(), rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(a[3], b[3], rtol=1e-5, atol=1e-6)


class IndexedWrites(gdb.DynBatchBlock):
    """Index arrays computed per sample: ``scatter_nd`` of row sums at
    (row, the sample's own column), or ``take`` of the flat array at
    ``ravel_multi_index`` of (row, row % 6), of the layer's output or of its
    ``tanh``."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.dense = gluon.nn.Dense(6, flatten=False)

    def hybrid_forward(self, F, x, column):
        h = self.dense(x)
        if self.form == "ravel_take_tanh":
            h = F.tanh(h)
        n = h.shape[0]
        if self.form == "scatter_nd":
            rows = F.arange(n).astype("int32")
            return F.scatter_nd(F.sum(h, axis=1), F.stack(rows, column, axis=0),
                                shape=(n, 6)) + h
        flat = F.ravel_multi_index(F.stack(F.arange(n), F.arange(n) % 6), shape=h.shape)
        return F.take(F.reshape(h, (-1,)), flat)


@pytest.mark.parametrize("form", ["scatter_nd", "ravel_take", "ravel_take_tanh"])
@pytest.mark.parametrize("options", [{}, {"strategy": "agenda"}, {"compiled": True},
                                     {"granularity": "op"}, {"strategy": "reference"}])
def test_index_arrays_computed_per_sample_equal_eager(form, options):
    """Their gradient is zero; MXNet's imperative backward crashed the process
    when that zero was all that reached the gather of them."""
    model = IndexedWrites(form)
    model.initialize()
    rs = np.random.RandomState(0)
    for lengths in [(2, 3, 5), (4, 1, 6, 3)]:       # learned, then replayed
        samples = [(nd.array(rs.uniform(-1, 1, (n, 4))),
                    nd.array(rs.randint(0, 6, n), dtype="int32")) for n in lengths]
        assert_batched_equals_eager(model, samples, options, atol=1e-6)


@pytest.mark.parametrize("where", ["inside", "after"])
def test_outputs_assigned_into_an_array_equal_eager(where):
    """``buf[i:i + 1] = out`` (predictions gathered into a preallocated array),
    inside the scope or after it."""
    model = Chain()
    model.initialize()
    samples = list(zip((1, 3, 2), _inputs(3)))
    eager = nd.zeros((3, 4))
    for i, s in enumerate(samples):
        eager[i:i + 1] = model(*s)
    buf = nd.zeros((3, 4))
    with gdb.batching():
        outs = [model(*s) for s in samples]
        if where == "inside":
            for i, out in enumerate(outs):
                buf[i:i + 1] = out
    if where == "after":
        for i, out in enumerate(outs):
            buf[i] = out[0]
    np.testing.assert_allclose(buf.asnumpy(), eager.asnumpy(), rtol=1e-5, atol=1e-6)


def test_a_generator_closed_inside_its_scope_keeps_what_it_yielded():
    """A consumer taking the first outputs of a generator that yields them from
    inside a scope, then closing it (``GeneratorExit`` leaves the scope)."""
    import itertools

    model = Chain()
    model.initialize()
    samples = list(zip((1, 3, 2, 2), _inputs(4)))

    def outputs():
        with gdb.batching():
            for s in samples:
                yield model(*s)

    gen = outputs()
    first = list(itertools.islice(gen, 2))
    gen.close()
    for out, s in zip(first, samples):
        np.testing.assert_allclose(out.asnumpy(), model(*s).asnumpy(), rtol=1e-5, atol=1e-6)
    with gdb.batching():                # the next scope works
        out = model(*samples[2])
    np.testing.assert_allclose(out.asnumpy(), model(*samples[2]).asnumpy(), rtol=1e-5)


class AsksItsF(gluon.HybridBlock):
    """A child whose code asks which ``F`` it got, as gluonnlp's blocks do: by
    identity (``F is mx.nd``) or by equality (``F == nd``, AWDRNN's states)."""

    def __init__(self, test, **kwargs):
        super().__init__(**kwargs)
        self.test = test
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, flatten=False, in_units=4)

    def hybrid_forward(self, F, x):
        imperative = F is mx.nd if self.test == "is" else F == nd
        if imperative:
            shift = nd.ones((x.shape[0], 3)) * x.shape[0]
        else:                           # the symbolic branch: no shapes
            shift = F.zeros((0, 3))
        return self.dense(x) + shift


class CallsAsksItsF(gdb.DynBatchBlock):
    def __init__(self, test, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = AsksItsF(test)

    def hybrid_forward(self, F, x):
        return F.sum(self.child(x))


@pytest.mark.parametrize("test", ["is", "=="])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "reference"}])
def test_a_child_asking_whether_its_F_is_nd_takes_the_imperative_branch(test, options):
    model = CallsAsksItsF(test)
    model.initialize()
    for lengths in [(2, 3, 5), (4, 1)]:
        assert_batched_equals_eager(
            model, [(nd.random.uniform(shape=(n, 4)),) for n in lengths], options)


class Reversed(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, flatten=False, in_units=4)

    def hybrid_forward(self, F, x):
        return F.sum(self.dense(x[::-1]) * F.arange(x.shape[0]).reshape((-1, 1)))


def test_a_reversed_one_word_sentence_is_no_read():
    """``x[::-1]`` of one row takes that row: recorded, not NDArray's view of a
    computed value (a read, which sent the rest of the scope eager)."""
    model = Reversed()
    model.initialize()
    xs = [nd.random.uniform(shape=(n, 4)) for n in (1, 3, 1, 2)]
    with gdb.batching() as scope:
        total = sum(model(x) for x in xs)
    assert scope.stats.reads == 0
    np.testing.assert_allclose(total.asnumpy(), sum(model(x) for x in xs).asnumpy(),
                               rtol=1e-5, atol=1e-6)


class ZeroGradientOutputs(gdb.DynBatchBlock):
    """Outputs computed through zero-gradient operators only: the predicted class
    (``argmax``) of a layer in the sample's own call or of a child call's
    output, or a comparison's mask, scaled."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.dense = gluon.nn.Dense(5, in_units=3)
            self.out = gluon.nn.Dense(4, in_units=5)

    def hybrid_forward(self, F, depth, x, top=True):
        h = F.tanh(self.dense(x))
        if depth > 0:
            h = h + self(depth - 1, x, False)
        if not top:
            return h
        if self.form == "argmax":
            return F.argmax(self.out(h), axis=1)
        if self.form == "child_argmax":
            return F.argmax(self.out(self(depth, x, False)), axis=1)
        return (self.out(h) > 0) * 2


@pytest.mark.parametrize("form", ["argmax", "child_argmax", "mask"])
@pytest.mark.parametrize("options", [{}, {"strategy": "agenda"}, {"granularity": "op"},
                                     {"compiled": "step"}, {"compiled": True},
                                     {"granularity": "op", "compiled": "step"}])
def test_a_loss_of_zero_gradient_outputs_alone_gives_zero_gradients_as_eager(form, options):
    """Eager MXNet records ``argmax`` and comparisons (their gradient zero): a
    loss of such outputs alone differentiates, writing zeros into the weights'
    gradients.  Batched, those steps run outside autograd, and such a loss was
    not in any graph ("Cannot differentiate node ...")."""
    model = ZeroGradientOutputs(form)
    model.initialize()
    rs = np.random.RandomState(1)
    for depths in [(0, 2, 1), (1, 0, 3, 2)]:        # learned, then replayed
        samples = [(d, nd.array(rs.uniform(-1, 1, (1 + d % 2, 3)))) for d in depths]
        runs = []
        for batched in (False, True):
            for param in model.collect_params().values():
                param.grad()[:] = 7.0               # a backward must overwrite these
            with autograd.record():
                if batched:
                    with gdb.batching(**options):
                        outs = [model(*s) for s in samples]
                else:
                    outs = [model(*s) for s in samples]
                loss = nd.add_n(*[o.sum() for o in outs])
            loss.backward()
            runs.append((loss.asscalar(), [p.grad().asnumpy().copy()
                                           for p in model.collect_params().values()]))
        assert runs[1][0] == pytest.approx(runs[0][0])
        for batched_grad, eager_grad in zip(runs[1][1], runs[0][1]):
            np.testing.assert_array_equal(batched_grad, eager_grad)


class RanksChildren(gdb.DynBatchBlock):
    """A tree node adding a term of the ranks of its children's outputs
    (``topk`` returning indices or a mask, zero-gradient outputs)."""

    def __init__(self, call, **kwargs):
        super().__init__(**kwargs)
        self.call = call
        with self.name_scope():
            self.dense = gluon.nn.Dense(8, flatten=False, in_units=6)

    def hybrid_forward(self, F, tree, emb):
        x = F.tanh(self.dense(emb[tree.word:tree.word + 1]))
        if not tree.children:
            return x
        hs = F.concat(*[self(child, emb) for child in tree.children], dim=0)
        return x + F.sum(self.call(F, hs) * 0.01)


@pytest.mark.parametrize("call", [
    lambda F, hs: F.topk(hs, axis=1, k=2, ret_typ="indices"),
    lambda F, hs: F.topk(hs, axis=1, k=2, ret_typ="mask"),
    lambda F, hs: F.topk(hs, axis=0, k=1),                  # indices by default
    lambda F, hs: F.topk(hs, 1, 2, "mask"),                 # ret_typ positional
    lambda F, hs: F.topk(hs, axis=1, k=2, ret_typ="both")[1]],
    ids=["indices", "mask", "default", "positional", "both"])
@pytest.mark.parametrize("options", [{"granularity": "op"},
                                     {"granularity": "op", "strategy": "agenda"}, {}])
def test_ranks_of_children_by_topk_equal_eager(call, options):
    """``topk``'s indices and masks have zero gradient: batched, their steps run
    outside autograd, as ``argmax``'s do (recorded over the executor's gather,
    MXNet 1.9.1's backward crashed the process)."""
    model = RanksChildren(call)
    model.initialize(mx.init.Uniform(0.5))
    emb = nd.random.normal(shape=(30, 6))
    trees = [Tree(1, [Tree(2, [Tree(3), Tree(4)]), Tree(5)]), Tree(6, [Tree(7), Tree(8)])]
    for samples in (trees[:1], trees):              # learned, then replayed
        assert_batched_equals_eager(model, [(t, emb) for t in samples], options, atol=1e-6)


class SteppedVariationalDropout(gdb.DynBatchBlock):
    """A ``VariationalDropoutCell`` stepped over a sentence: it keeps its masks
    between calls until ``reset()``, so it runs on concrete values."""

    def __init__(self, reset, **kwargs):
        super().__init__(**kwargs)
        self.reset = reset
        with self.name_scope():
            self.cell = gluon.contrib.rnn.VariationalDropoutCell(
                gluon.rnn.GRUCell(5, input_size=4), drop_inputs=0.5, drop_states=0.5,
                drop_outputs=0.5)

    def hybrid_forward(self, F, x):
        if self.reset:
            self.cell.reset()
        state = self.cell.begin_state(batch_size=1, func=F.zeros)
        outs = []
        for t in range(x.shape[0]):
            h, state = self.cell(x[t:t + 1], state)
            outs.append(h)
        return F.concat(*outs, dim=0)


@pytest.mark.parametrize("hybridized", [False, True])
@pytest.mark.parametrize("reset", [False, True])
def test_a_variational_dropout_cell_keeps_its_masks_as_eager(hybridized, reset):
    """In predict mode its masks are ones: outputs and gradients as eager.  A
    hybridized cell's eager call left a Symbol in its masks, which a trace of
    its code then multiplied by (``TypeError``)."""
    model = SteppedVariationalDropout(reset)
    model.initialize(mx.init.Uniform(0.3))
    if hybridized:
        model.cell.hybridize()
    rs = np.random.RandomState(0)
    for _ in range(2):
        xs = [nd.array(rs.randn(rs.randint(1, 5), 4)) for _ in range(3)]
        runs = []
        for batched in (False, True):
            with autograd.record(train_mode=False):
                if batched:
                    with gdb.batching():
                        outs = [model(x) for x in xs]
                else:
                    outs = [model(x) for x in xs]
                loss = nd.add_n(*[(o * o).sum() for o in outs])
            loss.backward()
            runs.append(([o.asnumpy() for o in outs],
                         [p.grad().asnumpy().copy() for p in model.collect_params().values()]))
        for got, want in zip(runs[1][0] + runs[1][1], runs[0][0] + runs[0][1]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_generators_yielding_from_scopes_of_their_own_consumed_in_turn_equal_eager():
    """The second scope opens inside the first (it joins it); the first ends
    before the second: what both recorded runs at its end, as eager."""
    model = Chain()
    model.initialize()
    samples = list(zip((1, 3, 2, 2, 1), _inputs(5)))

    def produce(part, batched):
        if not batched:
            yield from (model(*s) for s in part)
            return
        with gdb.batching():
            for s in part:
                yield model(*s)

    runs = []
    for batched in (False, True):
        first, second = produce(samples[:2], batched), produce(samples[2:], batched)
        pairs = [(next(first), next(second)) for _ in range(2)]
        first.close()
        rest = list(second)
        runs.append([a.asnumpy() for pair in pairs for a in pair] + [a.asnumpy() for a in rest])
    for got, want in zip(runs[1], runs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class DividesByItsNumber(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x, k):
        h = self.dense(x)
        return h / k + k * h


@pytest.mark.parametrize("how", [{}, {"compiled": "step"}, {"granularity": "op"}])
def test_a_number_of_minus_zero_is_not_taken_for_zero(how):
    """``-0.0 == 0.0`` in Python, but ``h / -0.0`` is ``-inf`` where ``h / 0.0`` is
    ``inf``: calls keyed, batched or compiled by their numbers kept them apart
    only by equality (one sample's sign served the others)."""
    model = DividesByItsNumber()
    model.initialize(mx.init.Uniform(0.5))
    xs = _inputs(4)
    for ks in ([-0.0] * 4, [0.0, -0.0, 0.0, -0.0], [0.0] * 4, [-0.0, 2.0, 0.0, -0.0]):
        want = [model(x, k).asnumpy() for x, k in zip(xs, ks)]
        with gdb.batching(**how):
            outs = [model(x, k) for x, k in zip(xs, ks)]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


def _template_states(trie):
    """Template states of every block alive in this thread.  Blocks of earlier
    tests are collected first: dropped between two counts, their states would
    leave the count."""
    gc.collect()
    return sum(root.counter[0] for root in trie.store().roots.values())


def test_a_number_of_nan_is_learned_once():
    """A NaN equals no other NaN: each call's was a new key, learned anew at every
    call (a scope took ten times as long, and memory grew scope after scope)."""
    from gluon_dynbatch.record import trie
    model = DividesByItsNumber()
    model.initialize(mx.init.Uniform(0.5))
    xs = _inputs(4)
    want = [model(x, float("nan")).asnumpy() for x in xs]
    states = []
    for _ in range(3):
        with gdb.batching():
            outs = [model(x, float("nan")) for x in xs]
        states.append(_template_states(trie))
        for out, expected in zip(outs, want):
            np.testing.assert_array_equal(np.isnan(out.asnumpy()), np.isnan(expected))
    assert states[1] == states[2]


class StepsByItsNumbers(gdb.DynBatchBlock):
    """Euler steps of a sample's own sizes: each number in ``*``, ``/``, ``+``
    and ``-`` on both sides of an array."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.f = gluon.nn.Dense(4, in_units=4, activation="tanh")

    def hybrid_forward(self, F, sample):
        h, dts = sample
        for dt in dts:
            h = h + self.f(h) * dt
            h = (dt - h) / (1.0 + dt) + dt / (h * h + 1.0) - dt
        return h


@pytest.mark.parametrize("strategy, compiled", [("depth", False), ("agenda", False),
                                               ("depth", "step"), ("depth", True)])
def test_numbers_of_each_sample_learn_one_path_and_equal_eager(strategy, compiled):
    """A number is part of a call's key: each sample's own step size learned a
    path of its own at every call, forever.  Past a few numbers at one point
    of the code they come as literal arrays, on one path."""
    states = _states_over_batches(StepsByItsNumbers(), strategy, compiled, 3, 2)
    assert states[1] == states[2]


class SignedPath(gdb.DynBatchBlock):
    """A hierarchical softmax's path: a score per node of a sample's path, its
    sign the code bit there (``score * (2 * bit - 1)``), summed."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.f = gluon.nn.Dense(4, in_units=4, activation="tanh")

    def hybrid_forward(self, F, sample):
        h, bits = sample
        total = 0
        for bit in bits:
            h = self.f(h)
            total = total + F.log(F.sigmoid(F.sum(h, axis=1) * (2 * bit - 1)))
        return total


def test_two_numbers_at_a_place_in_every_combination_stop_learning_paths():
    """Two numbers at one place of a loop (a code bit's sign) make a path per
    combination: nearly every sample of every batch learned templates anew.
    Past ``VARYING_PATHS`` paths learned there they come as literal arrays."""
    from gluon_dynbatch.record import trie
    model = SignedPath()
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(0)
    states = []
    for _ in range(5):
        samples = [(nd.array(rs.uniform(-1, 1, (1, 4))), tuple(rs.randint(0, 2, 8).tolist()))
                   for _ in range(8)]
        eager = run_model(model, samples, [], "eager")
        assert_same(run_model(model, samples, [], "depth"), eager)
        states.append(_template_states(trie))
    assert states[-2] == states[-1]


def _states_over_batches(model, strategy, compiled, batches, steps):
    """Template states after each of ``batches`` batches of samples ``(x, dts)``
    with ``steps`` numbers each, every batch equal to eager."""
    from gluon_dynbatch.record import trie
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(0)
    states = []
    for _ in range(batches):
        xs = [nd.array(rs.uniform(-1, 1, (1, 4))) for _ in range(8)]
        samples = [(x, tuple(rs.uniform(0.05, 0.5, steps).tolist())) for x in xs]
        eager = run_model(model, samples, [], "eager")
        assert_same(run_model(model, samples, [], strategy, compiled), eager)
        states.append(_template_states(trie))
    return states


class EulerStep(gluon.HybridBlock):
    """One step of a sample's own size, the size a float argument that also
    chooses the step's form."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.f = gluon.nn.Dense(4, in_units=4, activation="tanh")

    def hybrid_forward(self, F, h, dt):
        if dt > 0.3:
            h = F.sigmoid(h)
        return h + self.f(h) * dt


class StepsThroughAChild(gdb.DynBatchBlock):
    """Euler steps made by a child block given each step's size."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.step = EulerStep()

    def hybrid_forward(self, F, sample):
        h, dts = sample
        for dt in dts:
            h = self.step(h, dt)
        return h


@pytest.mark.parametrize("strategy, compiled", [("depth", False), ("agenda", False),
                                               ("depth", "step"), ("depth", True)])
def test_numbers_given_to_a_child_learn_one_path_and_equal_eager(strategy, compiled):
    """A child block's float argument is part of the call's key: each sample's
    own step size learned the child's calls again at every call, forever.  Past
    a few numbers at one place of the code the child's code runs at each call
    on one path (its branch on the number taken as eager takes it)."""
    states = _states_over_batches(StepsThroughAChild(), strategy, compiled, 4, 3)
    assert states[2] == states[3]


class ScalesByItsFlag(gluon.HybridBlock):
    """Doubles ``x`` when given ``True``, triples it for any other flag."""

    def hybrid_forward(self, F, x, flag):
        return x * 2 if flag is True else x * 3


class PassesFlags(gdb.DynBatchBlock):
    """Calls a child with 1, then 1.0, then True: equal Python keys."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = ScalesByItsFlag()

    def hybrid_forward(self, F, x):
        return [self.child(F.tanh(x), flag) for flag in (1, 1.0, True)]


def test_a_childs_constants_equal_in_python_but_of_other_types_are_told_apart():
    """``1 == 1.0 == True``: a child's call given ``True`` replayed what its call
    given ``1`` had recorded."""
    model = PassesFlags()
    xs = _inputs(3)
    eager = [[o.asnumpy() for o in model(x)] for x in xs]
    with gdb.batching():
        outs = [model(x) for x in xs]
    for got, want in zip(outs, eager):
        for o, w in zip(got, want):
            np.testing.assert_allclose(o.asnumpy(), w, rtol=1e-6)


class _DagNode:
    def __init__(self, word, children=()):
        self.word, self.children = word, list(children)


class CombinesMemoisedChildren(gdb.DynBatchBlock):
    """A recursive net over a DAG, memoised per sample, combining its children
    with ``F.add_n`` or a product of the first and last one."""

    def __init__(self, combine, **kwargs):
        super().__init__(**kwargs)
        self.combine = combine
        with self.name_scope():
            self.wx = gluon.nn.Dense(4, in_units=4)
            self.wh = gluon.nn.Dense(4, in_units=4, use_bias=False)

    def hybrid_forward(self, F, node, table, memo=None):
        memo = {} if memo is None else memo
        if id(node) in memo:
            return memo[id(node)]
        hs = [self(child, table, memo) for child in node.children]
        h = self.wx(table[node.word:node.word + 1])
        if hs and self.combine == "add_n":
            h = h + self.wh(F.add_n(*hs))
        elif hs:
            h = h * F.dot(hs[0], hs[-1], transpose_b=True)
        memo[id(node)] = out = F.tanh(h)
        return out


def _dag(spec):
    nodes = []
    for k, children in enumerate(spec):
        nodes.append(_DagNode(k % 5, [nodes[c] for c in children]))
    return nodes[-1]


@pytest.mark.parametrize("combine", ["add_n", "dot"])
@pytest.mark.parametrize("options", [{}, {"strategy": "agenda"}, {"compiled": "step"}])
def test_a_call_reading_one_outside_value_twice_is_not_taken_for_one_reading_two(combine,
                                                                                   options):
    """``add_n(h, h)`` of a value read from outside the frame for the first time
    had the key of ``add_n(a, b)`` of two such values: a DAG node whose two
    children are one node (read from the memo) taught the path its parent,
    which reads two, then replayed (it summed one child twice)."""
    model = CombinesMemoisedChildren(combine)
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (5, 4)))
    dags = [_dag([[], [0, 0], [0, 1]]), _dag([[], [0, 0], [1, 0]]), _dag([[], [0], [0, 1]])]
    eager = run_model(model, dags, [table], "eager")
    assert_same(run_model(model, dags, [table], options.get("strategy", "depth"),
                          options.get("compiled", False)), eager)


class WeighsItsEdges(gdb.DynBatchBlock):
    """Messages weighed by each edge's own number, summed per node (``+ 0`` for
    a node without any): numbers as literals, sums rewritten at the flush."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = gluon.nn.Dense(4, in_units=3, activation="tanh")
            self.out = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, sample):
        x, edges = sample
        h = self.inp(x)
        rows = []
        for i in range(x.shape[0]):
            inc = [h[s:s + 1] * (0.5 + 0.1 * k) for k, (s, t) in enumerate(edges) if t == i]
            rows.append(h[i:i + 1] + (F.add_n(*inc) if inc else 0))
        return F.sum(self.out(F.concat(*rows, dim=0)), axis=0, keepdims=True)


def test_literals_read_after_a_flush_renumbers_nodes_are_their_own():
    """Literals were found by node id, which the flush's rewrite of sums renumbers:
    a take's index read another literal's rows (numbers of each edge), and the
    plan failed ("all the input arrays must have same number of dimensions")."""
    r = np.random.RandomState(0)
    samples = []
    for n in (2, 17, 17):
        edges = [(s, t) for s in range(n) for t in range(n) if s != t and r.rand() < 0.2]
        samples.append((nd.array(r.uniform(-1, 1, (n, 3))), edges if n > 2 else []))
    model = WeighsItsEdges()
    model.initialize(mx.init.Uniform(0.3))
    eager = run_model(model, samples, [], "eager")
    for _ in range(3):
        assert_same(run_model(model, samples, [], "depth"), eager, rtol=1e-4, atol=1e-5)


class SparseAdjacency(gdb.DynBatchBlock):
    """A graph convolution by each sample's adjacency, a CSR matrix."""

    def __init__(self, sparse_dot, **kwargs):
        super().__init__(**kwargs)
        self.sparse_dot = sparse_dot
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, sample):
        x, adjacency = sample
        h = F.sparse.dot(adjacency, x) if self.sparse_dot else F.dot(adjacency, x)
        return F.sum(self.dense(h), axis=0, keepdims=True)


@pytest.mark.parametrize("sparse_dot", [True, False])
@pytest.mark.parametrize("granularity", [None, "op"])
def test_a_sparse_adjacency_of_one_node_is_multiplied_as_eager_multiplies_it(sparse_dot,
                                                                              granularity):
    """A (1, 1) CSR matrix times a row was recorded as ``broadcast_mul``, which
    keeps only the CSR's stored entries: the row's other entries became 0."""
    r = np.random.RandomState(0)
    samples = []
    for n in (1, 3, 2, 1):
        a = np.eye(n) + (r.rand(n, n) < 0.3)
        samples.append((nd.array(r.uniform(-1, 1, (n, 3))),
                        nd.array(a / a.sum(1, keepdims=True)).tostype("csr")))
    model = SparseAdjacency(sparse_dot)
    model.initialize(mx.init.Uniform(0.3))
    eager = run_model(model, samples, [], "eager")
    assert_same(run_model(model, samples, [], "depth", granularity=granularity), eager)


class CopiesItsValue(gdb.DynBatchBlock):
    """Copies of a recorded value, as eager glue code makes them."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        if self.how == "nd.array":
            copy = nd.array(h)
        elif self.how == "F.array":
            copy = F.array(h, dtype="float64").astype("float32")
        elif self.how == "assigned":
            copy = nd.zeros((1, 4))
            copy[:] = h
        else:                           # written through out=
            copy = nd.zeros((1, 4))
            F.sigmoid(h, out=copy)
        return copy * 2 + h


@pytest.mark.parametrize("how", ["nd.array", "F.array", "assigned", "out"])
def test_copies_of_recorded_values_keep_their_gradient_as_eager(how):
    """Eager records the copy, so the gradient flows through it: ``nd.array(h)``
    and ``buf[:] = h`` made constants (wrong gradients, or MXNet's 'not in a
    computational graph'); ``F.sigmoid(h, out=buf)`` raised BatchingError."""
    model = CopiesItsValue(how)
    model.initialize(mx.init.Uniform(0.5))
    xs = _inputs(3)

    def run(batched):
        with autograd.record():
            if batched:
                with gdb.batching():
                    outs = [model(x) for x in xs]
            else:
                outs = [model(x) for x in xs]
            loss = nd.add_n(*[out.sum() for out in outs])
        loss.backward()
        return [out.asnumpy() for out in outs], model.dense.weight.grad().asnumpy().copy()
    want, got = run(False), run(True)
    for g, w in zip(got[0], want[0]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


class AddsToZeros(gdb.DynBatchBlock):
    def hybrid_forward(self, F, x):
        total = F.zeros((1, 4))
        total += x
        return total


def test_in_place_update_of_a_constant_under_record_says_what_to_write():
    """Not MXNet's 'already in a computational graph', which eager does not say:
    a constant is in no graph."""
    x = _inputs(1)[0]
    with pytest.raises(gdb.BatchingError, match=r"sample 0, in .*write x = x \+ y"):
        with autograd.record():
            with gdb.batching():
                AddsToZeros()(x)


_STRING_ATTRIBUTES = {
    "dot_transpose": lambda F, x: F.dot(x, x, transpose_b="False") + F.dot(x, x,
                                                                           transpose_a="true"),
    "sum_over_rows": lambda F, x: F.sum(x, axis="0", keepdims="True"),
    "shape_tuples": lambda F, x: F.transpose(F.slice(x, begin="(1,0)", end="[3, 4]"),
                                             axes="(1,0)"),
    "axes_and_sizes": lambda F, x: F.split(F.swapaxes(x, dim1="0", dim2="1"),
                                           num_outputs="2", axis="0")[1],
    "row_ops": lambda F, x: F.softmax(F.flip(x, axis="0"), axis="0") * F.max(x, axis="0"),
    "leading_zeros": lambda F, x: F.softmax(x, axis="-01") * F.sum(x, axis="00", keepdims="1"),
}


class StringAttributes(gdb.DynBatchBlock):
    """Operator attributes written as strings, which MXNet parses."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, flatten=False, in_units=4)

    def hybrid_forward(self, F, n, x):
        return _STRING_ATTRIBUTES[self.form](F, F.tanh(self.dense(x[:n])))


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"granularity": "op"}],
                         ids=["default", "compiled", "op"])
@pytest.mark.parametrize("form", sorted(_STRING_ATTRIBUTES))
def test_attributes_written_as_strings_read_as_mxnet_reads_them(form, options):
    """``transpose_b="False"`` was true to the product rules (a silently wrong
    product); ``axis="0"`` and ``axes="(1,0)"`` raised TypeError."""
    model = StringAttributes(form)
    model.initialize(mx.init.Uniform(0.5))
    x = nd.array(np.random.RandomState(5).uniform(-1, 1, (4, 4)))
    assert_batched_equals_eager(model, [(4, x), (4, x * 0.5), (4, -x)], options)


class SpelledWords(gdb.DynBatchBlock):
    """Each word's characters embedded by a child block from the sample's own
    arrays of character ids, then read character by character."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.chars = gluon.nn.Embedding(12, 4)
            self.cell = gluon.rnn.GRUCell(4, input_size=4)

    def hybrid_forward(self, F, words):
        outs = []
        for chars in words:
            e = self.chars(chars)
            state = [F.zeros((1, 4))]
            for t in range(chars.shape[0]):
                out, state = self.cell(e[t:t + 1], state)
            outs.append(out)
        return F.concat(*outs, dim=0)


@pytest.mark.parametrize("granularity", ["call", "op"])
def test_a_child_block_on_a_samples_own_arrays_is_recorded_and_equals_eager(granularity,
                                                                           monkeypatch):
    """Recorded operator by operator (asked for, or a block whose samples each
    take a path of their own), an embedding of a sample's own id arrays ran
    eagerly, one launch a word, and its rows were sliced eagerly; it is now
    recorded: one batched lookup for every word of every sample."""
    from gluon_dynbatch.record import dispatch, trie
    r = np.random.RandomState(6)
    samples = [([nd.array(r.randint(0, 12, r.randint(1, 5))) for _ in range(r.randint(1, 4))],)
               for _ in range(6)]
    model = SpelledWords()
    model.initialize(mx.init.Uniform(0.5))
    model.granularity = granularity
    assert_batched_equals_eager(model, samples)
    if granularity == "call":               # as if a trial had chosen operators
        usage = trie.store().usages[(id(model), None)]
        usage.irregular, usage.watch = True, "done"
        assert_batched_equals_eager(model, samples)
    eager = []
    original = dispatch._ORIGINAL_CALL
    monkeypatch.setattr(dispatch, "_ORIGINAL_CALL", lambda block, *args: (
        eager.append(block), original(block, *args))[1])
    with gdb.batching():
        outs = [model(*sample) for sample in samples]
    assert all(o.shape[0] == len(s[0]) for o, s in zip(outs, samples))
    assert model.chars not in eager     # eagerly: one launch a word


@pytest.mark.parametrize("call", [lambda F, x: F.sum(x, axis="0x0"),
                                  lambda F, x: F.sum(x, axis="1_0"),
                                  lambda F, x: F.sum(x, axis=0, keepdims=" true")],
                         ids=["hexadecimal", "underscore", "space"])
def test_attribute_strings_mxnet_refuses_raise_its_error(call):
    """Strings MXNet cannot parse are left to it: its error, naming the sample,
    as eagerly (Python's own literals would have read "0x0" as 0)."""
    model = StringAttributes("dot_transpose")
    model.initialize()
    model.form = "refused"
    _STRING_ATTRIBUTES["refused"] = call
    x = nd.ones((2, 4))
    try:
        with pytest.raises(MXNetError, match="Invalid Parameter format"):
            model(2, x)
        with pytest.raises(gdb.BatchingError, match="Invalid Parameter format") as err:
            with gdb.batching():
                model(2, x)
        assert "sample 0" in str(err.value)
    finally:
        del _STRING_ATTRIBUTES["refused"]
    with gdb.batching():                    # the next batch works
        out = StringAttributes("sum_over_rows")
        out.initialize()
        assert out(2, x).shape == (1, 4)


class DenseOfEach(gdb.DynBatchBlock):
    """A child block called on each array of the sample's list."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, arrays):
        return F.add_n(*[self.dense(x) for x in arrays])


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"granularity": "op"}],
                         ids=["default", "compiled", "op"])
def test_a_child_block_given_no_array_raises_as_eager(options):
    """A sample's None where a child block learned an array was passed on as a
    call missing its data (MXNet's "expects 3 inputs"); eager Gluon raises
    ValueError, and so does the scope; the next batch works."""
    model = DenseOfEach()
    model.initialize()
    good = [[nd.ones((1, 3))], [nd.ones((1, 3)), nd.ones((1, 3)) * 2]]
    with pytest.raises(ValueError, match="one NDArray or one Symbol") as eager:
        model([None])
    with gdb.batching(**options):
        [model(sample) for sample in good]          # the child's call is learned
    with pytest.raises(ValueError, match="one NDArray or one Symbol") as batched:
        with gdb.batching(**options):
            [model(sample) for sample in good + [[None]]]
    assert type(batched.value) is type(eager.value)
    assert_batched_equals_eager(model, [(sample,) for sample in good], options)


class TakesByACounter(gdb.DynBatchBlock):
    """Steps through its rows by a counter it computes (``i = i + 1``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(8, flatten=False)

    def hybrid_forward(self, F, x):
        h = F.zeros((1, 8))
        i = F.zeros((1,))
        for _ in range(x.shape[1]):
            h = F.tanh(self.dense(F.take(x[0], i)) + h)
            i = i + 1
        return h


@pytest.mark.parametrize("compiled", [False, "step"])
def test_takes_from_a_table_without_gradient_by_a_computed_counter(compiled):
    """The batched take's indices carried the counter's history: MXNet ran
    take's backward for the table, which needs no gradient, and refused."""
    mx.random.seed(0)
    model = TakesByACounter()
    model.initialize(mx.init.Uniform(0.3))
    xs = [nd.random.uniform(-1, 1, shape=(1, n, 4)) for n in (3, 1, 2, 3)]
    assert_batched_equals_eager(model, [(x,) for x in xs], {"compiled": compiled})


class CatchesRefusedCalls(gdb.DynBatchBlock):
    """Falls back where MXNet refuses a call for some samples' shapes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, a, b):
        try:
            h = F.dot(a, b)
        except MXNetError:
            h = F.zeros((a.shape[0], 2))
        try:
            return h + self.dense(a)
        except MXNetError:
            return h * 2


@pytest.mark.parametrize("options", [{}, {"strategy": "agenda"}, {"strategy": "reference"},
                                     {"granularity": "op"}, {"compiled": True}])
def test_a_samples_except_mxneterror_runs_as_eagerly(options):
    """A call MXNet refuses while it is recorded raises an error that is an
    MXNetError, as eager's, and names the sample and the call."""
    mx.random.seed(0)
    model = CatchesRefusedCalls()
    model.initialize(mx.init.Uniform(0.3))
    r = np.random.RandomState(0)
    shapes = [((2, 3), (3, 2)), ((2, 3), (4, 2)), ((1, 4), (4, 2)), ((3, 3), (3, 2))]
    samples = [(nd.array(r.randn(*p)), nd.array(r.randn(*q))) for p, q in shapes]
    want = [model(a, b).asnumpy() for a, b in samples]
    with gdb.batching(**options):
        outs = [model(a, b) for a, b in samples]
    for got, expected in zip(outs, want):
        np.testing.assert_allclose(got.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(MXNetError, match="sample 1, in .*dot: invalid call") as caught:
        with gdb.batching(**options):
            for a, b in samples:
                DotsOnly()(a, b)
    assert isinstance(caught.value, gdb.BatchingError)


class DotsOnly(gdb.DynBatchBlock):
    def hybrid_forward(self, F, a, b):
        return F.dot(a, b)


class FactorsTwice(gdb.DynBatchBlock):
    """A Cholesky factor, scaled (the scaling batches over samples)."""

    def hybrid_forward(self, F, a):
        return F.linalg.potrf(a) * 2


class FactorsOrZero(gdb.DynBatchBlock):
    """Reads its factor, as eager code that checks it does."""

    def hybrid_forward(self, F, a):
        try:
            factor = F.linalg.potrf(a)
            factor.asnumpy()
        except MXNetError:
            factor = a * 0
        return factor


def _matrices(*scales):
    return [nd.array(np.eye(2) * s) for s in scales]


@pytest.mark.parametrize("compiled", [False, True, "step"])
def test_a_call_mxnet_refuses_for_one_samples_values_gives_out_no_unwritten_values(compiled):
    """MXNet's error of one sample's factor reached the batched scaling of all
    samples and was cleared by the first read: the others read memory never
    written.  The scope now raises, naming the sample at fault and its call;
    the next scope works."""
    model = FactorsTwice()
    with pytest.raises(gdb.BatchingError, match=r"sample 2, in .*potrf: MXNet refused"):
        with gdb.batching(compiled=compiled):
            outs = [model(a) for a in _matrices(1.0, 4.0, -1.0, 9.0)]
    with pytest.raises(gdb.BatchingError, match="scope that failed"):
        outs[0].asnumpy()
    good = _matrices(1.0, 4.0, 16.0)
    with gdb.batching(compiled=compiled):
        outs = [model(a) for a in good]
    for out, a in zip(outs, good):
        np.testing.assert_allclose(out.asnumpy(), 2 * np.sqrt(a.asnumpy()), rtol=1e-6)


class TakesRaising(gdb.DynBatchBlock):
    """Rows of its own by positions, out of range an error (``mode="raise"``)."""

    def hybrid_forward(self, F, x, positions):
        return F.square(F.take(F.tanh(x), F.array(positions), mode="raise"))


@pytest.mark.parametrize("compiled", [False, "plan"])
def test_a_take_out_of_range_in_one_sample_names_the_calls(compiled):
    """It gave MXNet's error alone, naming no sample or call."""
    model = TakesRaising()
    xs = [nd.ones((2, 2)) * n for n in (1, 2, 3, 4)]
    positions = [[0, 1], [1, 0], [0, 2], [1, 1]]        # sample 2 has two rows
    with pytest.raises(gdb.BatchingError, match=r"sample 2, in .*take: MXNet refused"):
        with gdb.batching(compiled=compiled):
            outs = [model(x, p) for x, p in zip(xs, positions)]
    with pytest.raises(gdb.BatchingError, match="scope that failed"):
        outs[0].asnumpy()
    positions[2] = [0, 0]
    with gdb.batching(compiled=compiled):
        outs = [model(x, p) for x, p in zip(xs, positions)]
    for out, x, p in zip(outs, xs, positions):
        np.testing.assert_allclose(out.asnumpy(), np.tanh(x.asnumpy()[p]) ** 2, rtol=1e-6)


@pytest.mark.parametrize("options", [{}, {"strategy": "agenda"}, {"granularity": "op"}])
def test_a_sample_catching_mxnets_refusal_of_its_own_values_runs_as_eagerly(options):
    model = FactorsOrZero()
    matrices = _matrices(1.0, -1.0, 4.0, -3.0)
    want = [model(a).asnumpy() for a in matrices]
    with gdb.batching(**options):
        outs = [model(a) for a in matrices]
    for got, expected in zip(outs, want):
        np.testing.assert_allclose(got.asnumpy(), expected)


class ReturnsAScorer(gdb.DynBatchBlock):
    """Returns its encoding and a function of it written with its ``F``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))

        def score(candidates):
            bias = F.ones((1, candidates.shape[0]))
            return F.dot(h, candidates, transpose_b=True) + F.linalg.gemm2(h, h, transpose_b=True) \
                + bias
        return h, score


def test_a_function_of_a_samples_f_called_after_its_scope_runs_as_eagerly():
    """Called after the scope (or inside the next one), ``F`` of a scope that
    ended recorded into its finished graph: an internal error."""
    mx.random.seed(0)
    model = ReturnsAScorer()
    model.initialize()
    r = np.random.RandomState(0)
    xs = [nd.array(r.randn(1, 4)) for _ in range(3)]
    candidates = nd.array(r.randn(5, 4))
    want = [model(x)[1](candidates).asnumpy() for x in xs]
    with gdb.batching():
        results = [model(x) for x in xs]
    after = [score(candidates).asnumpy() for _, score in results]
    with gdb.batching():
        inside = [score(candidates) for _, score in results]
    for got, again, expected in zip(after, inside, want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(again.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class SubwordSum(gdb.DynBatchBlock):
    """A word's vector as the weighted sum of its subwords' rows (a CSR row)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.table = self.params.get("table", shape=(6, 4))
            self.out = gluon.nn.Dense(1, in_units=4)

    def hybrid_forward(self, F, row, table):
        return self.out(F.tanh(F.sparse.dot(row, table)))


def _subword_row(ids):
    weights = np.full(len(ids), 1.0 / len(ids), dtype=np.float32)
    return nd.sparse.csr_matrix((weights, ids, [0, len(ids)]), shape=(1, 6))


@pytest.mark.parametrize("options", [{}, {"strategy": "unbatched"}, {"compiled": True},
                                     {"granularity": "op"}])
def test_a_csr_row_repeating_a_column_sums_its_entries_as_eager(options):
    """Gathering a sample's CSR row made it dense, keeping one of the entries a
    row repeats for one column, where ``sparse.dot`` sums them."""
    mx.random.seed(0)
    model = SubwordSum()
    model.initialize(mx.init.Uniform(0.5))
    words = [[0, 1, 0], [2], [3, 3], [4, 5, 4, 4]]
    assert_batched_equals_eager(model, [(_subword_row(ids),) for ids in words], options)


class SparseOutputs(gdb.DynBatchBlock):
    """Calls whose outputs MXNet gives in sparse storage: a dense row times a CSR
    row transposed (a CSR of one entry, empty for an all-zero row), ``tanh`` of
    it, a sum of CSR rows, the product returned as the sample's result, and a
    cast to row-sparse storage read by ``sparse.retain``."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(6, in_units=2)

    def hybrid_forward(self, F, x, row, other):
        h = self.dense(x)
        if self.how == "dot":
            return F.tanh(F.sparse.dot(h, row, transpose_b=True))
        if self.how == "returned":      # a sample's result of sparse storage
            return F.dot(h, row, transpose_b=True)
        if self.how == "sum":           # (its entries stored with room to spare)
            return F.tanh(F.sparse.dot(h, F.sparse.elemwise_add(row, other), transpose_b=True))
        kept = F.sparse.retain(F.tanh(h).T.tostype("row_sparse"), nd.array([1, 4]))
        return F.sum(kept.tostype("default"), axis=0, keepdims=True) * F.sum(h)


def _sparse_samples(seed):
    rs = np.random.RandomState(seed)
    rows = (rs.rand(4, 6) > 0.5) * rs.randn(4, 6).astype(np.float32)
    rows[seed % 2] = 0                              # a row of no entries
    others = np.roll(rows, 1, axis=1) + rows        # entries shared with the row's
    return [(nd.array(rs.randn(1, 2)), nd.sparse.csr_matrix(rows[k:k + 1]),
             nd.sparse.csr_matrix(others[k:k + 1])) for k in range(4)]


class FillsFirstColumn(gdb.DynBatchBlock):
    """``fill_element_0index``: an operator MXNet's symbols cannot build."""

    def hybrid_forward(self, F, x):
        index = F.array([k % 3 for k in range(x.shape[0])])
        return F.fill_element_0index(F.tanh(x), F.sum(x, axis=1), index) * 2


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "agenda"},
                                     {"granularity": "op"}])
def test_an_operator_mxnets_symbols_cannot_build_runs_by_itself_as_eager(options):
    """Every scope refused it ("Not enough argument to call operator"), where
    eager runs it."""
    model = FillsFirstColumn()
    rs = np.random.RandomState(0)
    xs = [nd.array(rs.uniform(-1, 1, (n, 3))) for n in (3, 4, 5)]
    want = [model(x).asnumpy() for x in xs]
    with gdb.batching(**options):
        outs = [model(x) for x in xs]
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("how", ["dot", "sum", "returned", "retain"])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "agenda"}])
def test_calls_giving_sparse_storage_run_by_themselves_as_eager(how, options):
    """Batched, a CSR step output of an empty row crashed the process (its
    concatenation), and a cast's storage was lost (``sparse.retain``
    refused): such calls run one at a time, their results dense."""
    mx.random.seed(0)
    model = SparseOutputs(how)
    model.initialize(mx.init.Uniform(0.5))
    for seed in range(2):
        samples = _sparse_samples(seed)
        want = [model(*sample).asnumpy() for sample in samples]
        with gdb.batching(**options):
            outs = [model(*sample) for sample in samples]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)
        if how != "retain":     # (eager MXNet's backward refuses the empty row's CSR)
            assert_batched_equals_eager(model, samples[:seed % 2] + samples[seed % 2 + 1:],
                                        options)


class TanhOfAScore(gdb.DynBatchBlock):
    """``tanh`` of a (1, 1) score: the call shape of ``SparseOutputs("dot")``'s
    ``tanh``, on a dense value."""

    def hybrid_forward(self, F, x):
        return F.tanh(F.sum(x, axis=1, keepdims=True))


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}])
def test_a_sparse_call_of_a_shape_a_dense_call_had_before_runs_as_eager(options):
    """The memo of call analyses is keyed by shapes and dtypes: ``tanh`` of a CSR
    (1, 1), analysed before as a dense call (another block, any earlier scope),
    was batched as dense ("copying size mismatch" reading an empty row's
    result); whichever came first decided for the other."""
    dense = TanhOfAScore()
    with gdb.batching(**options):
        [dense(nd.ones((1, 3)) * k) for k in range(3)]
    mx.random.seed(0)
    model = SparseOutputs("dot")
    model.initialize(mx.init.Uniform(0.5))
    samples = _sparse_samples(0)
    want = [model(*sample).asnumpy() for sample in samples]
    with gdb.batching(**options):
        outs = [model(*sample) for sample in samples]
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class DocumentScores(gdb.DynBatchBlock):
    """``tanh`` of a weight times a document's CSR rows transposed: CSR results
    (of no entries for an empty document), summed into a dense score."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(4, 6))
            self.out = gluon.nn.Dense(1, in_units=4)

    def hybrid_forward(self, F, doc, weight):
        scores = F.tanh(F.dot(weight, doc, transpose_b=True))
        return self.out(F.sum(scores, axis=1).reshape((1, 4)))


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "agenda"}])
def test_sparse_results_of_an_empty_document_batch_in_later_scopes_as_eager(options):
    """MXNet gives an empty CSR result without row pointers: gathered with other
    samples' in a later scope (the sum known to be dense by then), it crashed
    the process; it is recorded as a well-formed empty CSR."""
    mx.random.seed(0)
    model = DocumentScores()
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(1)
    docs = [nd.zeros((2, 6)).tostype("csr")] + [
        nd.array((rs.rand(n, 6) > 0.6) * rs.rand(n, 6)).tostype("csr") for n in (3, 1, 2)]
    for _ in range(3):
        assert_batched_equals_eager(model, [(doc,) for doc in docs], options)


class CastThenProduct(gdb.DynBatchBlock):
    """A document's CSR rows times a matrix the sample computed and cast to CSR."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = gluon.nn.Dense(4, in_units=6)

    def hybrid_forward(self, F, x, doc):
        made = F.cast_storage(F.relu(F.dot(x.T, self.proj(x)) - 0.1), "csr")
        return F.sum(F.dot(doc, made), axis=0, keepdims=True)


@pytest.mark.parametrize("options", [{}, {"granularity": "op"}, {"compiled": "step"}])
def test_a_sparse_value_a_sample_computed_is_read_as_sparse_in_later_graphs(options):
    """Computed by itself and held by a LazyArray, the CSR value reached a later
    graph as a dense leaf whose values a product's rule read (MXNet's 'copying
    size mismatch'): it is a sparse leaf, read as stored."""
    mx.random.seed(0)
    model = CastThenProduct()
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(0)
    docs = [np.zeros((1, 6), np.float32),
            ((rs.rand(2, 6) > 0.5) * rs.randn(2, 6)).astype(np.float32)]
    samples = [(nd.array(rs.randn(1, 6)), nd.sparse.csr_matrix(doc)) for doc in docs]
    want = [model(*sample).asnumpy() for sample in samples]
    for _ in range(2):
        with gdb.batching(**options):
            outs = [model(*sample) for sample in samples]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class ScalesByItsWeight(gdb.DynBatchBlock):
    def hybrid_forward(self, F, x, weight):
        return x * weight


def test_samples_numbers_of_their_own_with_other_trailing_shapes_batch_apart():
    """Past a few numbers at one place, a number comes as a literal array on one
    path: that path kept ``x``'s shape only in a key no edge held, so samples of
    other trailing shapes were batched together (MXNet's shape error)."""
    model = ScalesByItsWeight()
    r = np.random.RandomState(0)
    samples = [(nd.array(r.randn(2, width)), weight) for width, weight in
               [(8, 0.1), (8, 0.2), (8, 0.3), (8, 0.4), (6, 0.4), (6, 0.7), (8, 0.9)]]
    for _ in range(2):
        xs = [x.copy() for x, _ in samples]
        for x in xs:
            x.attach_grad()
        with autograd.record():
            with gdb.batching():
                outs = [model(x, weight) for x, (_, weight) in zip(xs, samples)]
            loss = nd.add_n(*[(o * o).sum() for o in outs])
        loss.backward()
        for out, x, (given, weight) in zip(outs, xs, samples):
            np.testing.assert_allclose(out.asnumpy(), given.asnumpy() * weight, rtol=1e-6)
            np.testing.assert_allclose(x.grad.asnumpy(), 2 * weight * weight * given.asnumpy(),
                                       rtol=1e-5)


class TableRowsRNN(gdb.DynBatchBlock):
    """An Elman RNN over word ids reading each word's row of a table the model
    holds as a plain NDArray (``self.table[w]``, not an argument), or of the
    table it is given (``given``): ``how`` is the indexing written."""

    def __init__(self, table, how, **kwargs):
        super().__init__(**kwargs)
        self.table, self.how = table, how
        with self.name_scope():
            self.wx = gluon.nn.Dense(4, in_units=3)
            self.wh = gluon.nn.Dense(4, in_units=4, use_bias=False)

    def row(self, F, table, w):
        if self.how == "slice":
            return table[w:w + 1]
        if self.how == "negative":
            return table[w - table.shape[0]].reshape((1, -1))
        if self.how == "paused":            # a constant view, made outside autograd
            with autograd.pause():
                return table[w].reshape((1, -1))
        if self.how == "reshaped paused":   # recorded, then reshaped outside autograd
            row = table[w]
            with autograd.pause():
                return row.reshape((1, -1))
        if self.how == "prefix":            # rows before w and w's: none for w = 0
            before = table[:w]              # (w, 3): empty for w = 0
            return table[w:w + 1] + F.sum(before, axis=0, keepdims=True) / max(w, 1)
        return table[w].reshape((1, -1))

    def hybrid_forward(self, F, words, *given):
        table = given[0] if given else self.table
        h = F.zeros((1, 4))
        for w in words:
            h = F.tanh(self.wx(self.row(F, table, w)) + self.wh(h))
        return h


def _table_rows_runs(how, options, given=False, grad=False):
    mx.random.seed(3)
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, (7, 3)))
    if grad:
        table.attach_grad()
    model = TableRowsRNN(table, how)
    model.initialize(mx.init.Uniform(0.5))
    sentences = [[1, 4, 2], [6], [0, 3, 3, 5, 1], [2, 2]]
    runs = []
    for batched in (False, True, True):
        scope = None
        with autograd.record():
            if not batched:
                outs = [model(s, *([table] if given else [])) for s in sentences]
            elif options == "map":
                outs = gdb.map(lambda s: model(s, *([table] if given else [])), sentences)
            else:
                with gdb.batching(**options) as scope:
                    outs = [model(s, *([table] if given else [])) for s in sentences]
            loss = nd.add_n(*[(o * o).sum() for o in outs])
        loss.backward()
        runs.append(([o.asnumpy() for o in outs], model.wx.weight.grad().asnumpy().copy(),
                     table.grad.asnumpy().copy() if grad else None, scope))
    return runs


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}, "map"])
@pytest.mark.parametrize("how", ["slice", "int", "negative", "paused", "reshaped paused",
                                 "prefix"])
@pytest.mark.parametrize("grad", [False, True])
def test_rows_of_a_table_the_model_holds_equal_eager(how, options, grad):
    """``self.table[w]`` inside a sample is NDArray's own view of a row: rows of
    the table's value in the graph, a gradient into the table where eager's
    view takes one (made under ``autograd.record()``), none where it does not."""
    if how == "prefix" and grad:
        pytest.skip("eager MXNet's gradient through an empty view of an array fails")
    runs = _table_rows_runs(how, options, grad=grad)
    want = runs[0]
    for outs, weight_grad, table_grad, _ in runs[1:]:
        for got, expected in zip(outs, want[0]):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(weight_grad, want[1], rtol=1e-5, atol=1e-6)
        if grad:
            np.testing.assert_allclose(table_grad, want[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["slice", "int"])
def test_rows_of_a_table_the_model_holds_batch_as_rows_of_the_table_given(how):
    """Each view NDArray makes of a row was a leaf of its own, analysed apart and
    gathered from as many arrays: the graph is now the one the model given the
    table as an argument records."""
    held = _table_rows_runs(how, {})[2][3].stats
    given = _table_rows_runs(how, {}, given=True)[2][3].stats
    assert held.nodes == given.nodes, (held, given)
    assert held.steps <= given.steps, (held, given)


class WritesItsTableRow(gdb.DynBatchBlock):
    """Reads a row of the table it holds, writes the row, reads it again."""

    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        self.table = table

    def hybrid_forward(self, F, k):
        row = self.table[k]
        before = F.tanh(row)
        row[:] = row * 2 + 1               # the table's memory, as eagerly
        return before + F.sigmoid(self.table[k:k + 1])


@pytest.mark.parametrize("options", [{}, {"compiled": True}, "map"])
def test_a_row_of_a_held_table_written_between_reads_reads_as_eager(options):
    results = []
    for batched in (False, True):
        table = nd.array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
        model = WritesItsTableRow(table)
        outs = outputs_of(model, [1, 3, 1], options if batched else None)
        results.append(([o.asnumpy() for o in outs], table.asnumpy()))
    for got, want in zip(results[1][0] + [results[1][1]], results[0][0] + [results[0][1]]):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _written_through_detach(options):
    mx.random.seed(0)
    model = DenseTanh()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array(np.random.RandomState(k).randn(1, 3)) for k in range(3)]
    scope = gdb.batching(**options) if options is not None else contextlib.nullcontext()
    with scope:
        outs = [model(x) for x in xs]
        outs[0].asnumpy()                   # a read: what is pending runs
        outs[0].detach()[:] = 0             # eager's detach shares the value's memory
        doubled = [(o * 2).asnumpy() for o in outs]
    return doubled + [o.asnumpy() for o in outs]


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"compiled": "plan"}])
def test_a_computed_value_written_through_its_detached_view_is_read_as_written(options):
    """The value, cut out of its flush's batched output, kept the rows it was
    handed: later calls gathered those, not its own memory the write changed."""
    for got, want in zip(_written_through_detach(options), _written_through_detach(None)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


class CachesTableRows(gdb.DynBatchBlock):
    """Keeps the view of each word's row of the table it holds in a dict on the
    model, and reuses it in later samples and scopes."""

    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        self.table, self.cache = table, {}
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, words):
        h = F.zeros((1, 3))
        for w in words:
            if w not in self.cache:
                self.cache[w] = self.table[w:w + 1]
            h = F.tanh(self.dense(self.cache[w]) + h)
        return h


def _cached_rows_grads(batched):
    mx.random.seed(0)
    table = nd.array(np.arange(12).reshape(4, 3) / 10.)
    table.attach_grad()
    model = CachesTableRows(table)
    model.initialize(mx.init.Uniform(0.5))
    grads = []
    for _ in range(2):
        with autograd.record():
            with gdb.batching() if batched else contextlib.nullcontext():
                outs = []
                for words in ([1], [2, 1]):
                    outs.append(model(words))
                    outs[-1].asnumpy()          # a read between samples: a flush
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
        grads.append(table.grad.asnumpy().copy())
    return grads


def test_a_view_of_a_held_tables_row_reused_after_a_flush_and_a_scope_takes_its_gradient():
    """The view was rows of the table before the flush and a leaf of its own
    after it: the next scope's pass gave the table no gradient through it."""
    for got, want in zip(_cached_rows_grads(True), _cached_rows_grads(False)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class FluentShapes(DenseForms):
    """Fluent methods whose NDArray code does more than call the operator:
    ``broadcast_to``/``broadcast_like`` adding leading axes (the shape padded
    with ones first), ``expand_dims``/``squeeze``/``flatten`` with ``inplace=True``."""

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        if self.form == "broadcast":
            v = h.sum(axis=0)
            return v.broadcast_to(h.shape) * h + v.broadcast_like(h)
        if self.form == "expand_inplace":
            return h.expand_dims(0, inplace=True).squeeze(axis=0, inplace=True) * 2
        return h.expand_dims(1, inplace=True).flatten(inplace=True) + h


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}, "map"],
                         ids=str)
@pytest.mark.parametrize("form", ["broadcast", "expand_inplace", "flatten_inplace"])
def test_fluent_methods_padding_shapes_or_viewing_in_place_equal_eager(form, options):
    """``v.broadcast_to(h.shape)`` of a (4,) value raised MXNet's error in a
    scope (the operator takes equal ranks), and ``inplace=True`` reached the
    operator as an argument it does not know."""
    model = FluentShapes(form)
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array(np.linspace(-1, 1, 4 * n).reshape(n, 4)) for n in (1, 3, 2)]
    want = _summed_and_differentiated(model, xs, None)
    want_grads = [p.grad().asnumpy().copy() for p in model.collect_params().values()]
    got = _summed_and_differentiated(model, xs, options)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)
    for p, expected in zip(model.collect_params().values(), want_grads):
        np.testing.assert_allclose(p.grad().asnumpy(), expected, rtol=1e-5, atol=1e-6)


class NewAxes(DenseForms):
    """Indexing with ``None`` (new axes) and ``Ellipsis``; in form ``"bump"``, the
    value is updated in place after the views are taken (outside ``record()``)."""

    KEYS = [None, Ellipsis, (None, slice(None)), (slice(None), None), (Ellipsis, None),
            (None, Ellipsis, slice(1, 3)), (slice(0, 1), None, slice(None))]

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        views = [h[key] for key in self.KEYS]
        if self.form == "bump":
            h += 1
        return [v * 1 for v in views]


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}, "map"],
                         ids=str)
def test_new_axes_and_ellipsis_index_as_eager_and_follow_an_update_in_place(options):
    """``h[None]`` and ``h[...]`` are eager views of ``h``: they were computed as
    copies in a scope (an update of ``h`` after them did not reach them)."""
    xs = [nd.array(np.linspace(-1, 1, 4 * n).reshape(n, 4)) for n in (2, 3, 1)]
    model = NewAxes("plain")
    model.initialize(mx.init.Uniform(0.5))
    want = _summed_nested(model, xs, None)
    want_grads = [p.grad().asnumpy().copy() for p in model.collect_params().values()]
    got = _summed_nested(model, xs, options)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for p, expected in zip(model.collect_params().values(), want_grads):
        np.testing.assert_allclose(p.grad().asnumpy(), expected, rtol=1e-5, atol=1e-6)
    bumped = NewAxes("bump")
    bumped.initialize(mx.init.Uniform(0.5))
    want = [v.asnumpy() for vs in outputs_of(bumped, xs) for v in vs]
    got = [v.asnumpy() for vs in outputs_of(bumped, xs, options) for v in vs]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _summed_nested(model, xs, options):
    """The values of ``model``'s lists of outputs, their total differentiated."""
    with autograd.record():
        outs = outputs_of(model, xs, options)
        total = nd.add_n(*[v.sum() for vs in outs for v in vs])
    total.backward()
    return [v.asnumpy() for vs in outs for v in vs]


class WritesOwnValues(gdb.DynBatchBlock):
    """``x op= y`` of values eager MXNet keeps out of autograd's graph even while
    it records: an input's ids doubled, a literal, a constant times a number."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.emb = gluon.nn.Embedding(20, 4)

    def hybrid_forward(self, F, tokens):
        t = tokens * 2
        t += 1
        c = F.array([0.5, 1.5, -1.0, 2.0])
        c -= 0.25
        z = F.ones((1, 4)) * 3
        z *= c
        return self.emb(t) * z


def test_an_in_place_update_under_record_is_refused_saying_what_to_write():
    """Eager MXNet refuses ``x op= y`` under ``autograd.record()`` only for values
    in autograd's graph, which depends on what earlier recorded calls read; a
    scope refuses it for every value it recorded, and says so (it claimed eager
    refused these too) and what to write; the next scope works."""
    model = WritesOwnValues()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array([1, 2, 3]), nd.array([4, 5])]
    with pytest.raises(MXNetError, match=r"sample 0.*in-place update \(\+=\) under "
                                         r"autograd\.record\(\).*refuses it always; write "
                                         r"x = x \+ y instead"):
        with autograd.record():
            outputs_of(model, xs, {})
    got = outputs_of(model, xs, {})
    for out, x in zip(got, xs):
        np.testing.assert_allclose(out.asnumpy(), model(x).asnumpy(), rtol=1e-6)


class SignedHalfSteps(gdb.DynBatchBlock):
    """Float16 steps scaled by a sign of a number near a half-precision tie."""

    def hybrid_forward(self, F, sample):
        x, bits = sample
        for bit in bits:
            x = x * ((1 + 2 ** -11 + 2 ** -40) if bit else -(1 + 2 ** -11 + 2 ** -40))
        return x


def test_a_float16_number_as_a_literal_rounds_as_mxnets_scalar_operators():
    """Numbers at one place of a loop come as literal arrays: numpy rounded the
    number straight to half precision, MXNet's scalar operators through float
    (a unit in the last place apart near a tie)."""
    model = SignedHalfSteps()
    model.initialize()
    rs = np.random.RandomState(0)
    for _ in range(3):
        samples = [(nd.ones((1, 2), dtype="float16"), tuple(rs.randint(0, 2, 6).tolist()))
                   for _ in range(12)]
        want = [model(s).asnumpy() for s in samples]
        with gdb.batching():
            outs = [model(s) for s in samples]
        for out, expected in zip(outs, want):
            np.testing.assert_array_equal(out.asnumpy(), expected)


_TABLE = nd.array(np.arange(20.0).reshape(5, 4) / 10.0)


class PlainTableRows(gdb.DynBatchBlock):
    """Rows of a plain array the model holds, picked by an index array made in
    the sample (``TABLE[F.array([i])]``), or a one-hot mask written into a
    plain buffer at a recorded index (``buf[0, F.argmax(h, axis=1)] = 1``)."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        if self.how == "getitem":
            i = int(F.argmax(h, axis=1).asscalar())
            row = _TABLE[F.array([i, (i + 2) % 5], dtype="int32")]
        else:
            buf = nd.zeros((1, 5))
            with autograd.pause():      # (eager MXNet refuses the write while recording)
                buf[0, F.argmax(h, axis=1)] = 1.0
            row = nd.dot(buf, _TABLE)
        return h * F.sum(row, axis=0, keepdims=True)


@pytest.mark.parametrize("how", ["getitem", "setitem"])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "reference"},
                                     "map"], ids=str)
def test_a_plain_array_indexed_by_a_recorded_index(how, options):
    model = PlainTableRows(how)
    model.initialize(mx.init.Uniform(0.5))
    samples = [(nd.array([[k, 1 - k, 0.5 * k, 2.0]]),) for k in range(4)]
    assert_batched_equals_eager(model, samples, options)


def test_a_computed_index_indexes_a_plain_array_after_its_scope():
    with gdb.batching():
        index = nd.array([3.0, 1.0]) * 1 + 0
    np.testing.assert_array_equal(_TABLE[index].asnumpy(), _TABLE.asnumpy()[[3, 1]])
    buf = nd.zeros((5,))
    buf[index] = 2.0
    np.testing.assert_array_equal(buf.asnumpy(), [0, 2, 0, 2, 0])


class WritesIntoOwnBuffer(gdb.DynBatchBlock):
    """A value without eager history (a constant, ``h.detach()``) written into a
    plain buffer of the sample's own, in place."""

    def __init__(self, how, paused, **kwargs):
        super().__init__(**kwargs)
        self.how, self.paused = how, paused
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        c = nd.array(np.ones((5, 4)))
        with autograd.pause() if self.paused else contextlib.nullcontext():
            c[1:2] = F.ones((1, 4)) * 2 if self.how == "constant" else h.detach()
        return F.sum(c, axis=0, keepdims=True) * h


@pytest.mark.parametrize("how", ["constant", "detach"])
def test_a_value_written_into_a_plain_buffer_while_recording(how):
    samples = [(nd.ones((1, 4)) * k,) for k in range(3)]
    model = WritesIntoOwnBuffer(how, paused=False)
    model.initialize(mx.init.Uniform(0.5))
    with pytest.raises(gdb.BatchingError, match=r"sample \d.*autograd.pause\(\)"):
        with autograd.record():
            with gdb.batching():
                [model(*s) for s in samples]
    model.paused = True                 # as the error says
    assert_batched_equals_eager(model, samples, {})


class RefillsItsBuffer(gdb.DynBatchBlock):
    """Reads the buffer it is given (a call, then ``asnumpy``), then refills it
    from numpy values, under ``autograd.record()``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x, buf):
        acc = F.tanh(self.dense(x)) + buf
        values = buf.asnumpy()
        buf[:] = values * 2 + 1
        return acc + buf


def test_a_given_buffer_read_then_refilled_from_numpy_while_recording():
    model = RefillsItsBuffer()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.ones((n, 4)) * n for n in (2, 3, 1)]
    runs = []
    for batched in (False, True):
        bufs = [nd.ones((1, 4)) * k for k in range(len(xs))]
        with autograd.record():
            with gdb.batching() if batched else contextlib.nullcontext():
                outs = [model(x, buf) for x, buf in zip(xs, bufs)]
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
        runs.append(([o.asnumpy() for o in outs], [b.asnumpy() for b in bufs],
                     model.dense.weight.grad().asnumpy().copy()))
    (want, want_bufs, want_grad), (got, got_bufs, got_grad) = runs
    for a, b in zip(got + got_bufs, want + want_bufs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)


class GatedByItsWeight(gluon.HybridBlock):
    """A child whose code reads the value of one of its own parameters."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.gate = self.params.get("gate", shape=(1,), init=mx.init.Constant(0.5))

    def hybrid_forward(self, F, x, gate):
        if gate.asscalar() > 0:
            return F.tanh(x) * gate
        return F.sigmoid(x) * gate


class HoldsAGatedChild(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = GatedByItsWeight()

    def hybrid_forward(self, F, x):
        return self.child(x)


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": True}, "map"],
                         ids=str)
def test_a_child_reading_one_of_its_own_parameters(options):
    model = HoldsAGatedChild()
    model.initialize()
    samples = [(nd.ones((n, 2)) * n,) for n in (1, 2, 3)]
    assert_batched_equals_eager(model, samples, options)
    model.child.gate.set_data(nd.array([-0.5]))            # the other branch
    assert_batched_equals_eager(model, samples, options)


class BooleanMasks(gdb.DynBatchBlock):
    """A sample's boolean mask (given, or made from the sample's numpy flags)
    cast to float; and a boolean of its result, as floats, beside it."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(5, in_units=4)

    def hybrid_forward(self, F, x, flags):
        mask = flags if self.how == "given" else F.array(flags.asnumpy(), dtype="bool")
        h = self.dense(x) * F.cast(mask, "float32")
        return h, F.cast(F.cast(h > 0, "bool"), "float32")


def _boolean_samples():
    """Three samples of 1-3 rows: values and a boolean mask of their own."""
    rs = np.random.RandomState(0)
    return [(nd.array(rs.randn(n, 4)), nd.array(rs.randint(0, 2, (n, 5)), dtype="bool"))
            for n in (1, 3, 2)]


@pytest.mark.parametrize("how", ["given", "literal"])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": True},
                                     {"granularity": "op"}, "map"], ids=str)
def test_boolean_arrays_gathered_across_samples(how, options):
    model = BooleanMasks(how)
    model.initialize(mx.init.Uniform(0.5))
    samples = _boolean_samples()
    assert_batched_equals_eager(model, samples, options)


BOOLEAN_CALLS = {
    "tile": lambda F, h, b, flags: F.cast(F.tile(b, (2, 1)), "float32"),
    "sum along rows": lambda F, h, b, flags: F.cast(F.sum(b, axis=0, keepdims=True),
                                                    "float32") * h,
    "max": lambda F, h, b, flags: F.cast(F.max(b), "float32") * h,
    "expand_dims": lambda F, h, b, flags: F.cast(F.expand_dims(b, 0), "float32")
    * F.expand_dims(h, 0),
    "rows of a given mask": lambda F, h, b, flags: h[-1:] * F.cast(flags[-1:], "float32"),
    "boolean_mask": lambda F, h, b, flags: F.contrib.boolean_mask(   # (never empty)
        h, F.cast(F.broadcast_lesser_equal(F.sum(h, axis=1), F.mean(F.sum(h, axis=1))),
                  "bool")),
    "returned": lambda F, h, b, flags: (h, b),
}


class BooleanCalls(gdb.DynBatchBlock):
    """Booleans a sample computes (or is given) through operators eager MXNet
    runs on booleans."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(5, in_units=4)

    def hybrid_forward(self, F, x, flags):
        h = self.dense(x)
        return BOOLEAN_CALLS[self.how](F, h, F.cast(h > 0, "bool"), flags)


@pytest.mark.parametrize("how", sorted(BOOLEAN_CALLS))
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": True},
                                     {"granularity": "op"}, {"strategy": "reference"},
                                     "map"], ids=str)
def test_booleans_a_sample_computes_through_operators_that_take_them(how, options):
    # Batched, MXNet's kernels without booleans (slice_axis, split, pad)
    # raised "Unknown type enum 7" when the engine ran them, naming no
    # sample, and the error came back at the next unrelated backward pass.
    model = BooleanCalls(how)
    model.initialize(mx.init.Uniform(0.5))
    samples = _boolean_samples()
    if how != "returned":
        assert_batched_equals_eager(model, samples, options)
        return
    want = [model(*sample)[1].asnumpy() for sample in samples]
    if options == "map":
        outs = gdb.map(lambda sample: model(*sample)[1], samples)
        first = [out[0].asnumpy() for out in outs]
    else:
        with gdb.batching(**options):
            outs = [model(*sample)[1] for sample in samples]
            first = [out[0].asnumpy() for out in outs]      # indexed inside the scope
    for out, row, value in zip(outs, first, want):
        assert out.dtype == np.bool_
        np.testing.assert_array_equal(row, value[0])
        np.testing.assert_array_equal(out[1:].asnumpy(), value[1:])


def _forward_replacements():
    """A child class and a DynBatchBlock class holding it, made anew (their
    ``forward`` is replaced by the tests)."""
    class Child(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.dense = gluon.nn.Dense(2, in_units=2)

        def hybrid_forward(self, F, x):
            return F.tanh(self.dense(x))

    class Holder(gdb.DynBatchBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.child = Child()

        def hybrid_forward(self, F, x):
            return self.child(x) + 1

    return Child, Holder


def _doubled(base):
    def forward(self, x):
        return base.forward(self, x) * 2
    return forward


@pytest.mark.parametrize("whose", ["child", "model"])
@pytest.mark.parametrize("where", ["instance", "class"])
def test_a_forward_replaced_after_a_first_scope_runs_inside_scopes(whose, where):
    import types
    child_class, holder_class = _forward_replacements()
    model = holder_class()
    model.initialize(mx.init.Uniform(0.5))
    samples = [(nd.ones((n, 2)) * n,) for n in (1, 2, 3)]
    assert_batched_equals_eager(model, samples)         # learns the templates first
    block, cls = (model.child, child_class) if whose == "child" else (model, holder_class)
    base = gluon.HybridBlock if whose == "child" else gdb.DynBatchBlock
    if where == "instance":
        block.forward = types.MethodType(_doubled(base), block)
    else:
        cls.forward = _doubled(base)
    for options in ({}, {"compiled": "step"}, {"strategy": "reference"}):
        assert_batched_equals_eager(model, samples, options)


def _either(F, h, imperative):
    """Mean of the rows on the imperative branch; the first row on the other."""
    if imperative:
        return F.mean(h, axis=0, keepdims=True)
    return F.slice_axis(h, axis=0, begin=0, end=1)


def _pooled(F, h):
    """``_either`` as ``F is mx.nd`` says (a helper's branch)."""
    return _either(F, h, F is mx.nd)


class PoolsInAHelper(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=2)

    def _pool(self, F, h):
        return _pooled(F, h)

    def hybrid_forward(self, F, x):
        return self._pool(F, F.tanh(self.dense(x)))


class HoldsAPooler(gdb.DynBatchBlock):
    def __init__(self, child, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = child
            self.dense = gluon.nn.Dense(2, in_units=2)

    def hybrid_forward(self, F, x):
        return self.child(self.dense(x))


class _WithDense(gdb.DynBatchBlock):
    """A Dense layer of two units; its subclasses ask ``F is mx.nd`` each in
    another place (none inherits another's asking code)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=2)


class PoolsItself(_WithDense):
    def hybrid_forward(self, F, x):
        return _either(F, F.tanh(self.dense(x)), F is mx.nd)


class PoolsInARecursiveHelper(_WithDense):
    """Asks in a recursive helper method (wrapped by the class to record frames)."""

    def encode(self, F, h, depth):
        if depth:
            return self.encode(F, F.tanh(self.dense(h)), depth - 1)
        return _either(F, h, F is mx.nd)

    def hybrid_forward(self, F, x):
        return self.encode(F, x, 2)


class PoolsLater(_WithDense):
    """Asks in a function of the module defined after the class, two calls deep."""

    def hybrid_forward(self, F, x):
        return _pools_later(F, F.tanh(self.dense(x)))


class PoolsInAClosure(_WithDense):
    """Asks in a closure, comparing with an alias of ``mx.nd``."""

    def hybrid_forward(self, F, x):
        def pool(h):
            return _either(F, h, F is _ND_ALIAS)
        return pool(F.tanh(self.dense(x)))


def _pools_later(F, h):
    return _pooled(F, h)


_ND_ALIAS = mx.ndarray


def _pools_unless(F, h, keep):
    return _either(F, h, F is mx.nd and not keep)


_pools_partially = functools.partial(_pools_unless, keep=False)


class PoolsThroughAPartial(_WithDense):
    """Asks in a function reached through a ``functools.partial``."""

    def hybrid_forward(self, F, x):
        return _pools_partially(F, F.tanh(self.dense(x)))


class PoolsLaterChild(gluon.HybridBlock):
    """A child whose class's ``hybrid_forward`` the test replaces by code asking."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=2)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


ASKING = {
    "child's helper": lambda: HoldsAPooler(PoolsInAHelper()),
    "HybridLambda": lambda: HoldsAPooler(gluon.nn.HybridLambda(_pooled)),
    "lambda calling a helper": lambda: HoldsAPooler(
        gluon.nn.HybridLambda(lambda F, h: _pools_later(F, h))),
    "own code": PoolsItself,
    "recursive helper": PoolsInARecursiveHelper,
    "function defined after the class": PoolsLater,
    "closure comparing an alias": PoolsInAClosure,
    "function through a partial": PoolsThroughAPartial,
    "child's class replaced after a scope": lambda: HoldsAPooler(PoolsLaterChild()),
}


@pytest.mark.parametrize("where", sorted(ASKING))
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "reference"},
                                     "map"], ids=str)
def test_code_asking_whether_F_is_mx_nd_takes_eagers_branch(where, options, monkeypatch):
    model = ASKING[where]()
    model.initialize(mx.init.Uniform(0.5))
    samples = [(nd.array(np.arange(2 * n).reshape(n, 2) / 4.0),) for n in (1, 3, 2)]
    if where.startswith("child's class replaced"):
        with gdb.batching():
            [model(*sample) for sample in samples]
        monkeypatch.setattr(PoolsLaterChild, "hybrid_forward",
                            lambda self, F, x: _pooled(F, F.tanh(self.dense(x))))
    assert_batched_equals_eager(model, samples, options)


class DoubledWeight(gluon.Parameter):
    """A Parameter whose ``data()`` is its own (as gluonnlp's weight drop's):
    twice the stored weight."""

    def data(self, ctx=None):
        return super().data(ctx) * 2


class DoubledDense(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)
        self.dense.weight.__class__ = DoubledWeight

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"granularity": "op"},
                                     {"strategy": "reference"}], ids=str)
def test_a_parameter_whose_data_is_its_own_is_read_once_a_flush_and_said_so(
        options, caplog, monkeypatch):
    monkeypatch.setattr(logs, "_WARNED", set())     # told once a process
    model = DoubledDense()
    model.initialize(mx.init.Uniform(0.5))
    r = np.random.RandomState(2)
    samples = [(nd.array(r.randn(k + 1, 4)),) for k in range(4)]
    with caplog.at_level("WARNING", logger="gluon_dynbatch"):
        assert_batched_equals_eager(model, samples, options)
    told = [r.getMessage() for r in caplog.records if "whose data() is its own" in r.getMessage()]
    assert len(told) == 1 and "DoubledWeight" in told[0]


def _own_forward(self, F, x):
    return F.tanh(self.dense(x))


def test_a_block_given_a_hybrid_forward_of_its_own_is_freed_after_its_scope():
    import types
    import weakref
    refs = []
    for _ in range(3):
        model = PoolsLater()
        model.initialize()
        model.hybrid_forward = types.MethodType(_own_forward, model)
        with gdb.batching():
            out = model(nd.ones((2, 2)))
        np.testing.assert_allclose(out.asnumpy(), model(nd.ones((2, 2))).asnumpy(), rtol=1e-6)
        refs.append(weakref.ref(model))
        del model, out
    gc.collect()
    assert not [ref for ref in refs if ref() is not None]
