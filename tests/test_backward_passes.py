"""Backward passes and in-place writes around batching scopes, as in eager MXNet.

A backward pass without ``retain_graph`` frees the graph it ran through:
values a scope computed become constants after a pass through their own
graph, as eager arrays do, and keep their gradient after a pass through
another graph.  An array written in place after calls that read it were
recorded gives those calls its old values.
"""
import contextlib
import random

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn, rnn
from mxnet.base import MXNetError

import gluon_dynbatch as gdb
from gluon_dynbatch import logs
from dynbatch_testing import DenseTanh as Encoder, output_of_script, outputs_of


class Scorer(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(1, in_units=4)

    def hybrid_forward(self, F, h):
        return self.dense(h)


def _inputs():
    return [nd.array(np.random.RandomState(k).randn(1, 3)) for k in range(4)]


def _models():
    mx.random.seed(0)
    encoder, scorer, other = Encoder(), Scorer(), gluon.nn.Dense(1, in_units=3)
    for block in (encoder, scorer, other):
        block.initialize()
    return encoder, scorer, other


def _calls(block, xs, batched):
    if not batched:
        return [block(x) for x in xs]
    with gdb.batching():
        return [block(x) for x in xs]


def _after_unrelated_backward(batched, free_own, retain=True):
    encoder, scorer, other = _models()
    xs = _inputs()
    with autograd.record():
        hs = _calls(encoder, xs, batched)
        first = nd.add_n(*[h.sum() for h in hs])
    if free_own:
        first.backward()            # frees the encoder's graph: hs become constants
    with autograd.record():
        aux = other(nd.ones((1, 3))).sum()
    aux.backward(retain_graph=retain)   # another model's graph: hs keep theirs
    encoder.collect_params().zero_grad()
    with autograd.record():
        scores = _calls(scorer, hs, batched)
        loss = nd.add_n(*[s.sum() for s in scores])
    loss.backward()
    return encoder.dense.weight.grad().asnumpy(), scorer.dense.weight.grad().asnumpy()


@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("free_own", [False, True])
def test_values_of_a_scope_keep_their_graph_unless_a_pass_through_it_freed_it(free_own, retain):
    expected = _after_unrelated_backward(False, free_own, retain)
    got = _after_unrelated_backward(True, free_own, retain)
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-7)
    assert (np.abs(got[0]).max() == 0) == free_own


def _gan_step(batched, retain=False):
    """A discriminator step on ``fake.detach()``, then a generator step through it."""
    generator, critic, _ = _models()
    xs = _inputs()
    with autograd.record():
        fake = _calls(generator, xs, batched)
        critic_loss = nd.add_n(*[s.sum() for s in _calls(critic, [f.detach() for f in fake],
                                                          batched)])
    critic_loss.backward(retain_graph=retain)   # frees the critic's graph, not fake's
    with autograd.record():
        gen_loss = nd.add_n(*[s.sum() for s in _calls(critic, fake, batched)])
    gen_loss.backward()
    return generator.dense.weight.grad().asnumpy()


@pytest.mark.parametrize("retain", [False, True])
def test_a_generator_trains_through_a_critic_stepped_on_its_detached_output(retain):
    expected = _gan_step(False)
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(_gan_step(True, retain), expected, rtol=1e-5, atol=1e-7)


class Recurrent(gdb.DynBatchBlock):
    """A step whose state the caller carries from one batch to the next."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.step = gluon.nn.Dense(4, in_units=4)
            self.out = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x, prev=None):
        h = F.tanh(self.step(x))
        if prev is not None:
            h = h + prev
        return h, F.log_softmax(self.out(h))


def _state_carried_into_eager_code(batching, hybridized):
    """A state of one training step (kept past its backward pass, off the
    loss's path) read by the next step run eagerly."""
    mx.random.seed(0)
    model = Recurrent()
    model.initialize()
    xs = [nd.array(np.random.RandomState(k).randn(1, 4)) for k in range(3)]
    with autograd.record():
        outs = outputs_of(model, xs, batching)
        loss = nd.add_n(*[o[1].sum() for o in outs])
    loss.backward()
    kept = outs[-1][0]
    if hybridized:
        model.hybridize()
    model.collect_params().zero_grad()
    with autograd.record():
        loss = nd.add_n(*[model(x, kept)[1].sum() for x in xs])
    loss.backward()
    return model.step.weight.grad().asnumpy()


@pytest.mark.parametrize("hybridized", [False, True])
@pytest.mark.parametrize("batching", [{}, {"strategy": "agenda"}, {"compiled": "step"},
                                      {"compiled": True}, {"granularity": "op"},
                                      {"strategy": "reference"}])
def test_a_state_kept_past_its_backward_pass_is_a_constant_in_eager_code(batching, hybridized):
    # MXNet failed the second backward pass ("The any container is empty")
    # when the state was cut out of a batched array that the first pass freed.
    expected = _state_carried_into_eager_code(None, hybridized)
    np.testing.assert_allclose(_state_carried_into_eager_code(batching, hybridized), expected,
                               rtol=1e-5, atol=1e-7)


class PooledLSTMLayer(gdb.DynBatchBlock):
    """A fused LSTM layer over a sentence, max-pooled: its packed weights are
    recorded once per graph and shared by the samples."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.emb = nn.Embedding(20, 6)
            self.lstm = rnn.LSTM(4, layout="NTC")
            self.out = nn.Dense(2)

    def hybrid_forward(self, F, tokens):
        return self.out(F.max(self.lstm(self.emb(tokens).expand_dims(0)), axis=1))


@pytest.mark.parametrize("batching", [{}, {"strategy": "reference"}])
def test_a_pass_per_sample_through_shared_packed_weights_says_how_to_differentiate(batching):
    mx.random.seed(0)
    model = PooledLSTMLayer()
    model.initialize()
    model.collect_params().setattr("grad_req", "add")
    xs = [nd.array([1, 2, 3]), nd.array([4, 5]), nd.array([6, 7, 8, 9])]
    with autograd.record():
        with gdb.batching(**batching):
            outs = [model(x) for x in xs]
        losses = [o.sum() for o in outs]
    losses[0].backward()
    with pytest.raises(MXNetError, match="share its batched graph"):
        for loss in losses[1:]:
            loss.backward()


def test_a_backward_pass_per_sample_of_one_scope_says_how_to_differentiate():
    encoder, _, _ = _models()
    xs = _inputs()
    with autograd.record():
        with gdb.batching():
            hs = [encoder(x) for x in xs]
        losses = [h.sum() for h in hs]
    losses[0].backward()
    with pytest.raises(MXNetError, match="share its batched graph"):
        losses[1].backward()
    # As the message says: every pass but the last keeps the graph.
    with autograd.record():
        with gdb.batching():
            hs = [encoder(x) for x in xs]
        losses = [h.sum() for h in hs]
    grads = []
    for k, loss in enumerate(losses):
        encoder.collect_params().zero_grad()
        loss.backward(retain_graph=k < len(losses) - 1)
        grads.append(encoder.dense.weight.grad().asnumpy().copy())
    for k, x in enumerate(xs):
        encoder.collect_params().zero_grad()
        with autograd.record():
            loss = encoder(x).sum()
        loss.backward()
        np.testing.assert_allclose(grads[k], encoder.dense.weight.grad().asnumpy(),
                                   rtol=1e-5, atol=1e-7)


def _written_in_place(batched):
    """A buffer refilled per sample, a weight set between calls, a prediction
    recorded before an optimizer's step: each call sees the values of its time."""
    encoder, _, _ = _models()
    xs = _inputs()
    trainer = gluon.Trainer(encoder.collect_params(), "sgd", {"learning_rate": 1.0})
    buffer = nd.zeros((1, 3))
    outs = []
    scope = gdb.batching() if batched else None
    if scope is not None:
        scope.__enter__()
    for x in xs:
        buffer[:] = x.asnumpy()                     # ``_sync_copyfrom``
        outs.append(encoder(buffer))
    buffer[:] = xs[0]                               # ``copyto``: an operator with ``out``
    outs.append(encoder(buffer))
    weight = encoder.dense.weight
    weight.set_data(weight.data() * 0.5)
    outs.append(encoder(xs[1]))
    with autograd.record():
        loss = nd.add_n(*[encoder(x).sum() for x in xs])
    loss.backward()
    outs.append(encoder(xs[2]))
    trainer.step(1)                                 # ``sgd_update(..., out=weight)``
    outs.append(encoder(xs[2]))
    if scope is not None:
        scope.__exit__(None, None, None)
    return [out.asnumpy() for out in outs]


class TwoHeads(gdb.DynBatchBlock):
    """A classifier's scores and the features they are computed from."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.enc = gluon.nn.Dense(4, activation="tanh", in_units=5)
            self.out = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x):
        h = self.enc(x)
        return self.out(h), h


def _two_passes(model, xs, batching, second, between=None):
    """Gradients after ``l1.backward(retain_graph=True)`` then ``l2.backward()``;
    ``between`` the passes: ``"scope"``, another scope of the model under
    ``autograd.record()`` whose outputs no loss uses (a forward pass to
    monitor); ``"another model's step"``, a Trainer step of another model."""
    other = nn.Dense(2, in_units=3)
    other.initialize()
    trainer = gluon.Trainer(other.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        loss = other(nd.ones((1, 3))).sum()
    loss.backward()
    with autograd.record():
        with batching():
            outs = [model(x) for x in xs]
            if between == "a pool read the outputs":     # (its flush: in a worker thread)
                import concurrent.futures
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    list(pool.map(lambda out: out[0].asnumpy(), outs))
        l1 = nd.add_n(*[o.sum() for o, _ in outs])
        l2 = nd.add_n(*[(h * h).sum() if second == "features" else (o * o).sum()
                        for o, h in outs])
    l1.backward(retain_graph=True)
    if between == "a pool read the outputs":
        pass
    elif between == "scope":
        with autograd.record():
            with batching():
                [model(x * 2) for x in xs]
    elif between:
        trainer.step(1)
    l2.backward()
    return {name: p.grad().asnumpy() for name, p in model.collect_params().items()}


@pytest.mark.parametrize("between", [None, "scope", "another model's step",
                                     "a pool read the outputs"])
@pytest.mark.parametrize("second", ["features", "scores"])
@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "agenda"}])
def test_a_second_pass_leaves_what_it_does_not_reach_as_the_first_wrote_it(
        second, options, between, caplog, monkeypatch):
    monkeypatch.setattr(logs, "_WARNED", set())     # told once a process
    # The features' pass does not reach the classifier: eager keeps its
    # gradients from the first pass; batched steps of both outputs wrote zeros.
    model = TwoHeads()
    model.initialize(mx.init.Xavier())
    for seed in range(2):
        r = np.random.RandomState(seed)
        xs = [nd.array(r.randn(1, 5)) for _ in range(4)]
        want = _two_passes(model, xs, contextlib.nullcontext, second, between)
        with caplog.at_level("WARNING", logger="gluon_dynbatch"):
            got = _two_passes(model, xs, lambda: gdb.batching(**options), second, between)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    assert np.abs(want[model.out.weight.name]).sum() > 0
    told = [r.getMessage() for r in caplog.records if "retain_graph" in r.getMessage()]
    assert bool(told) == (second == "features")


class Gated(gdb.DynBatchBlock):
    """Features, and a term gated by ``relu(g(v))``: closed (an exact zero
    gradient of ``g``) when every sample's ``v`` is negative."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.enc = gluon.nn.Dense(4, in_units=3)
            self.g = gluon.nn.Dense(1, in_units=1, weight_initializer=mx.init.One())

    def hybrid_forward(self, F, x, v):
        h = F.tanh(self.enc(x))
        return F.sum(h) + F.sum(F.relu(self.g(v)) * h)


def _retaining_steps(batching, update):
    """``g``'s gradient and weight after each of three training steps, each
    passing its loss with ``retain_graph=True``: the gate opens, closes, opens."""
    mx.random.seed(0)
    model = Gated()
    model.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(model.collect_params(), "sgd", {"learning_rate": 0.1})
    r = np.random.RandomState(0)
    seen = []
    for sign in (1, -1, 1):
        batch = [(nd.array(r.randn(k + 1, 3)), nd.array([[sign * (0.5 + k)]])) for k in range(3)]
        with autograd.record():
            with batching():
                outs = [model(x, v) for x, v in batch]
            loss = nd.add_n(*outs)
        loss.backward(retain_graph=True)
        seen.append(model.g.weight.grad().asnumpy().copy())
        if update == "trainer":
            trainer.step(len(batch))
        elif update == "set_data":      # by hand: no Trainer
            for param in model.collect_params().values():
                param.set_data(param.data() - 0.1 / len(batch) * param.grad())
        else:
            for param in model.collect_params().values():
                weight = param.data()
                weight -= 0.1 / len(batch) * param.grad()
        seen.append(model.g.weight.data().asnumpy().copy())
    return seen


@pytest.mark.parametrize("update", ["trainer", "set_data", "in place"])
@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}],
                         ids=str)
def test_a_later_step_passing_with_retain_graph_writes_its_zero_gradients(update, options):
    # Each step's pass keeps its graph; the next step's pass runs through a new
    # scope, and a gradient it leaves zero is zero, as eagerly, not the last
    # step's gradient given back (which the update would then apply again).
    want = _retaining_steps(contextlib.nullcontext, update)
    got = _retaining_steps(lambda: gdb.batching(**options), update)
    assert float(np.abs(want[2]).max()) == 0.0 and float(np.abs(want[0]).max()) > 0
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg="item %d" % k)


def _input_gradients(model, batching, per_sample):
    """``x.grad`` of inputs given gradients before the scope, after a pass per
    sample's loss: inside each sample (``gdb.map``), or after the scope."""
    r = np.random.RandomState(3)
    xs = [nd.array(r.randn(1, 5)) for _ in range(4)]
    for x in xs:
        x.attach_grad()

    def one(x):
        with autograd.record():
            loss = (model(x)[0] ** 2).sum()
        loss.backward()
        return loss
    with batching():
        if per_sample:
            gdb.map(one, xs)
        else:
            with autograd.record():
                losses = [(model(x)[0] ** 2).sum() for x in xs]
    if not per_sample:
        for k, loss in enumerate(losses):
            loss.backward(retain_graph=k < len(losses) - 1)
    return [x.grad.asnumpy() for x in xs]


@pytest.mark.parametrize("per_sample", [True, False], ids=["inside", "after"])
@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "agenda"}])
def test_a_pass_per_sample_leaves_the_other_samples_input_gradients(per_sample, options):
    # Each sample's pass runs through batched steps holding every sample's
    # rows: it wrote zeros into the gradients of the others' inputs.
    model = TwoHeads()
    model.initialize(mx.init.Xavier())
    want = _input_gradients(model, contextlib.nullcontext, per_sample)
    got = _input_gradients(model, lambda: gdb.batching(**options), per_sample)
    for g, w in zip(got, want):
        assert np.abs(w).sum() > 0
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_arrays_written_in_place_inside_a_scope_give_each_call_its_values():
    for got, want in zip(_written_in_place(True), _written_in_place(False)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


class ReadsMemory(gdb.DynBatchBlock):
    """Adds a view of an array it keeps (``memory[0:1]``), then writes the
    array in place (``how``: through the array itself, or a view of it)."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        self.memory = nd.zeros((2, 3))
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x, value):
        h = self.dense(x + self.memory[0:1])
        if self.how == "base":
            self.memory[:] = value
        elif self.how == "iadd":
            self.memory += value
        else:
            self.memory.reshape((-1,))[:] = value
        return h


def _through_views(how, options):
    """Outputs of a sample writing an array whose view it read (a scope each);
    of a loop refilling a buffer whose view each call gets; the arrays after."""
    mx.random.seed(0)
    model = ReadsMemory(how)
    model.initialize()
    xs = _inputs()
    buffer = nd.zeros((2, 3))
    outs = []
    for k, x in enumerate(xs):
        with gdb.batching(**options) if options is not None else contextlib.nullcontext():
            outs.append(model(x, float(k + 1)))
    with gdb.batching(**options) if options is not None else contextlib.nullcontext():
        for x in xs:
            buffer[:] = nd.concat(x, x * 2, dim=0)
            outs.append(model.dense(buffer[1:2]))
    return [o.asnumpy() for o in outs] + [model.memory.asnumpy(), buffer.asnumpy()]


@pytest.mark.parametrize("how", ["base", "iadd", "reshaped"])
@pytest.mark.parametrize("options", [{}, {"strategy": "reference"}, {"compiled": True}])
def test_writes_of_arrays_whose_views_calls_read_give_each_call_its_values(how, options):
    """The pending calls read a view (``memory[0:1]``), the write went to the
    array (or another view of it): the calls ran after the write."""
    for got, want in zip(_through_views(how, options), _through_views(how, None)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


class Masked(gluon.HybridBlock):
    """Multiplies by an array it keeps, which its parent writes per sample."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.mask = nd.ones((1, 3))

    def hybrid_forward(self, F, x):
        return x * self.mask


class SetsMask(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.masked = Masked()

    def hybrid_forward(self, F, x, scale):
        self.masked.mask[:] = scale
        return self.masked(x)


@pytest.mark.parametrize("options", [{}, {"compiled": True}])
def test_samples_each_writing_one_array_before_their_calls_read_their_own_values(options):
    """Each sample waits at its write while the next one writes too: after the
    wait, calls other samples recorded meanwhile run before the write."""
    model = SetsMask()
    model.initialize()
    xs, scales = _inputs(), [2.0, 3.0, 5.0, 7.0]
    want = [model(x, s).asnumpy() for x, s in zip(xs, scales)]
    for _ in range(2):
        with gdb.batching(**options):
            got = [model(x, s) for x, s in zip(xs, scales)]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.asnumpy(), b, rtol=1e-6)


class ReadsThenReuses(gdb.DynBatchBlock):
    """Reads a value of its input's layer (the sample waits), then uses its
    input again."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        if h.sum().asscalar() > 0:
            h = h + x
        return h * x


REFILLS = {
    "view": lambda buf, k: buf.__setitem__(slice(None), (k + 1.0) * nd.array([[1, -1, .5]])),
    "kvstore": None,
    "broadcast": None,
    "pushpull": None,
    "reset_arrays": lambda buf, k: nd.reset_arrays(buf, num_arrays=1),
}


def _refilled_by(how, options):
    """A buffer written between samples by ``how``: a refill of a buffer whose
    view each sample waiting at a read was given, a pull from a kvstore (no
    operator writes it), ``reset_arrays`` (``zero_grad``: no ``out``)."""
    mx.random.seed(0)
    model = ReadsThenReuses()
    model.initialize()
    encoder = _models()[0]
    buf = nd.ones((2, 3)) * 5
    store = mx.kv.create("local")
    store.init(0, nd.zeros((2, 3)))
    outs = []
    with gdb.batching(**options) if options is not None else contextlib.nullcontext():
        for k in range(3):
            if how == "kvstore":
                store.push(0, nd.ones((2, 3)) * (k - 1))
                store.pull(0, out=buf)
            elif how == "broadcast":
                store.broadcast(k + 1, nd.ones((2, 3)) * (k - 1), buf)
            elif how == "pushpull":
                store.pushpull(0, nd.ones((2, 3)) * (k - 1), buf)
            elif how == "view":
                REFILLS[how](buf, k)
            if how == "reset_arrays":       # a pending call reads the buffer, then reset
                outs.append(encoder(buf))
                REFILLS[how](buf, k)
                buf += k + 2.0
            else:
                outs.append(model(buf[0:1]))
    return [o.asnumpy() for o in outs]


@pytest.mark.parametrize("how", sorted(REFILLS))
@pytest.mark.parametrize("options", [{}, {"compiled": True}])
def test_buffers_written_without_an_operators_out_run_what_reads_them_first(how, options):
    for got, want in zip(_refilled_by(how, options), _refilled_by(how, None)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class ReadsThenDense(gdb.DynBatchBlock):
    """Waits at a read, then calls a layer it did not call before it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.first = gluon.nn.Dense(3, in_units=3)
            self.second = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.first(x))
        if h.sum().asscalar() > -10:
            h = self.second(h)
        return h


def _steps_while_waiting(how, options):
    """Per sample a call waiting at its read, then ``how`` writes the weights."""
    mx.random.seed(0)
    model = ReadsThenDense()
    model.initialize()
    trainer = gluon.Trainer(model.collect_params(), "sgd", {"learning_rate": 1.0})
    xs = [nd.array([[0.1 * k, -0.2, 0.3]]) for k in range(3)]
    outs = []
    for _ in range(2):                  # the second batch replays what the first learned
        with autograd.record():
            loss = nd.add_n(*[(model(x) ** 2).sum() for x in xs])
        loss.backward()
        with gdb.batching(**options) if options is not None else contextlib.nullcontext():
            for x in xs:
                outs.append(model(x))
                if how == "step":
                    trainer.step(1, ignore_stale_grad=True)
                else:
                    model.second.weight.data()[:] *= 0.5
    return [o.asnumpy() for o in outs]


@pytest.mark.parametrize("how", ["step", "in place"])
@pytest.mark.parametrize("options", [{}, {"compiled": True}])
def test_weights_written_while_samples_wait_at_reads_are_read_as_eager_reads_them(how, options):
    """Eager's sample finished, on the old weights, before the loop's write;
    a waiting sample resumed after it and its calls after the read used the
    new weights."""
    for got, want in zip(_steps_while_waiting(how, options), _steps_while_waiting(how, None)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class TakesRows(gdb.DynBatchBlock):
    """Rows of a constant buffer (``take``, or an ``Embedding`` of its rows)."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, buffer):
        if self.how == "take":
            return self.dense(F.take(buffer, F.array([0, 2])))
        return self.dense(F.Embedding(F.array([0, 2]), buffer, input_dim=3, output_dim=3))


def _refilled_under_record(how, options):
    mx.random.seed(0)
    model = TakesRows(how)
    model.initialize()
    buffer = nd.zeros((3, 3))
    outs = []
    with autograd.record():
        with gdb.batching(**options) if options is not None else contextlib.nullcontext():
            for k in range(4):
                buffer[:] = k + 1.0
                outs.append(model(buffer))
        loss = nd.add_n(*[(o * o).sum() for o in outs])
    loss.backward()
    return [o.asnumpy() for o in outs] + [model.dense.weight.grad().asnumpy()]


@pytest.mark.parametrize("how", ["take", "embedding"])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": "plan"}])
def test_a_constant_buffer_refilled_under_record_stays_out_of_autograds_graph(how, options):
    """Eager's ``take`` of a constant takes no gradient of it and leaves it out
    of autograd's graph; batched calls made it an input there, and MXNet
    refused the next refill ("already in a computational graph")."""
    for got, want in zip(_refilled_under_record(how, options), _refilled_under_record(how, None)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _given_new_arrays(how, options):
    """Samples before and after a parameter is given new arrays: outputs, and
    the gradient of the parameter's arrays after the change."""
    encoder, _, _ = _models()
    xs = _inputs()
    weight = encoder.dense.weight
    scope = gdb.batching(**options) if options is not None else None
    with autograd.record():
        if scope is not None:
            scope.__enter__()
        outs = [encoder(x) for x in xs[:2]]
        if how == "force_reinit":
            mx.random.seed(7)
            encoder.initialize(mx.init.Uniform(0.5), force_reinit=True)
        else:
            encoder.cast("float64")
            xs = [x.astype("float64") for x in xs]
        outs += [encoder(x) for x in xs[2:]]
        if scope is not None:
            scope.__exit__(None, None, None)
        loss = nd.add_n(*[o.sum().astype("float32") for o in outs])
    loss.backward()
    return [o.asnumpy() for o in outs], weight.grad().asnumpy()


@pytest.mark.parametrize("how", ["force_reinit", "cast"])
@pytest.mark.parametrize("options", [{}, {"strategy": "agenda"}, {"strategy": "reference"},
                                     {"compiled": True}, {"granularity": "op"}])
def test_a_parameter_given_new_arrays_inside_a_scope_is_read_as_eager_reads_it(how, options):
    """Calls recorded before ``initialize(force_reinit=True)`` ran with the new
    weights, and a ``cast('float64')`` between samples made the next batched
    call fail (float32 leaf, float64 input)."""
    got, want = _given_new_arrays(how, options), _given_new_arrays(how, None)
    for out, expected in zip(got[0], want[0]):
        assert out.dtype == expected.dtype
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


class CachesSubtrees(gdb.DynBatchBlock):
    """A tree RNN caching each subtree's encoding by its shape, across samples
    and training steps."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cache = {}
        with self.name_scope():
            self.wx = gluon.nn.Dense(8, in_units=6)
            self.wh = gluon.nn.Dense(8, in_units=8, use_bias=False)
            self.out = gluon.nn.Dense(3, in_units=8)

    def encode(self, F, tree, table):
        key = repr(tree)
        if key not in self.cache:
            hs = [self.encode(F, child, table) for child in tree[1]]
            h = self.wx(table[tree[0]:tree[0] + 1])
            if hs:
                h = h + self.wh(sum(hs))
            self.cache[key] = F.tanh(h)
        return self.cache[key]

    def hybrid_forward(self, F, tree, table):
        return self.out(self.encode(F, tree, table))


def _cached_steps(options):
    """Three steps of a cache kept across them; outputs and gradients of each."""
    mx.random.seed(0)
    model = CachesSubtrees()
    model.initialize(mx.init.Uniform(0.3))
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (6, 6)))
    table.attach_grad()

    def tree(rng, depth):
        kids = 0 if depth >= 3 else rng.choice([0, 1, 2, 2, 3])
        return (rng.randrange(6), tuple(tree(rng, depth + 1) for _ in range(kids)))
    found = []
    for step in range(3):
        rng = random.Random(step)
        trees = [tree(rng, 0) for _ in range(8)]
        with autograd.record():
            with gdb.batching(**options) if options is not None else contextlib.nullcontext():
                outs = [model(t, table) for t in trees]
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
        found.append([o.asnumpy() for o in outs] + [table.grad.asnumpy().copy()] + [
            p.grad().asnumpy().copy() for p in model.collect_params().values()])
    return found


@pytest.mark.parametrize("options", [{"max_pending_nodes": 5},
                                     {"max_pending_nodes": 3, "granularity": "op"}])
def test_values_cached_across_steps_from_flushes_inside_a_scope_are_constants_once_freed(
        options):
    """A value alone in its group of a flush was handed out as the gather itself:
    a later backward pass freed the batched steps it was gathered from but not
    the gather, which then still had history, and the third step's backward
    pass failed ("The any container is empty")."""
    for got, want in zip(_cached_steps(options), _cached_steps(None)):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class Carries(gdb.DynBatchBlock):
    """A step of a recurrence over chunks (truncated backpropagation through
    time): its loss and the state the next chunk starts from."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, chunk, h):
        for x in chunk:
            h = F.tanh(self.dense(x) + h)
        return F.sum(h * h), h


@pytest.mark.parametrize("batched", [False, True])
def test_states_carried_over_by_detach_are_constants_without_a_warning(batched, caplog,
                                                                       monkeypatch):
    """``h.detach()`` of the previous scope's state (the truncated-BPTT idiom):
    the user asked for a constant, so no warning about a freed graph; the
    losses and weights as eager's."""
    monkeypatch.setattr(logs, "_WARNED", set())
    runs = []
    for run_batched in (False, batched):
        mx.random.seed(0)
        model = Carries()
        model.initialize()
        trainer = gluon.Trainer(model.collect_params(), "sgd", {"learning_rate": 0.1})
        rs = np.random.RandomState(3)
        states, losses = [nd.zeros((1, 4)) for _ in range(3)], []
        for _ in range(3):
            chunks = [[nd.array(rs.randn(1, 3)) for _ in range(rs.randint(1, 4))]
                      for _ in states]
            with autograd.record():
                outs = _carry(model, chunks, states, run_batched)
                loss = nd.add_n(*[out[0] for out in outs])
            loss.backward()
            trainer.step(1)
            states = [out[1] for out in outs]
            losses.append(loss.asscalar())
        runs.append((losses, model.dense.weight.data().asnumpy()))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-5)
    np.testing.assert_allclose(runs[1][1], runs[0][1], rtol=1e-5, atol=1e-6)
    assert not [r for r in caplog.records if "earlier batch" in r.getMessage()]


def _carry(block, chunks, states, batched):
    if not batched:
        return [block(chunk, h.detach()) for chunk, h in zip(chunks, states)]
    with gdb.batching():
        return [block(chunk, h.detach()) for chunk, h in zip(chunks, states)]


class Marginals(gdb.DynBatchBlock):
    """A sample's own gradient: the marginals of its scores as the gradient of
    their log-partition, over a detached copy (``autograd.grad`` or
    ``backward()`` and ``x.grad``), used as constants in its loss."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, words, emb):
        scores = self.dense(F.concat(*[emb[w:w + 1] for w in words], dim=0))
        if self.how == "plain":         # an array of the sample's own making
            x = nd.array([[0.1 * w, 0.2, -0.3 * w] for w in words])
        else:
            x = scores.detach()
        x.attach_grad()
        with autograd.record():
            top = F.max(x, axis=1, keepdims=True)
            logz = F.sum(top + F.log(F.sum(F.exp(F.broadcast_sub(x, top)), axis=1,
                                           keepdims=True)))
        if self.how == "grad":
            marginals = autograd.grad(logz, [x])[0]
        else:
            logz.backward()
            marginals = x.grad
        return F.sum(marginals * scores)


def _marginal_losses(model, sentences, emb, options):
    for param in model.collect_params().values():
        param.zero_grad()
    with autograd.record():
        if options is None:
            outs = [model(words, emb) for words in sentences]
        else:
            with gdb.batching(**options):
                outs = [model(words, emb) for words in sentences]
        loss = nd.add_n(*outs)
    loss.backward()
    return ([out.asnumpy() for out in outs],
            {name: p.grad().asnumpy().copy() for name, p in model.collect_params().items()})


@pytest.mark.parametrize("how", ["grad", "backward", "plain"])
@pytest.mark.parametrize("options", [{}, {"strategy": "reference"}, {"compiled": "step"},
                                     {"granularity": "op"}])
def test_a_gradient_a_sample_takes_of_its_own_equals_eager(how, options):
    """Each sample's pass keeps the batched graph other samples share and leaves
    their gradients as they were (internal MXNet errors, or other samples'
    marginals zeroed by a later sample's pass)."""
    mx.random.seed(2)
    model = Marginals(how)
    model.initialize(mx.init.Uniform(0.5))
    emb = nd.random.uniform(-1, 1, shape=(10, 4))
    sentences = [[1], [2, 3], [4, 5, 6, 7], [8, 0, 2]]
    want = _marginal_losses(model, sentences, emb, None)
    for _ in range(2):
        got = _marginal_losses(model, sentences, emb, options)
        for g, w in zip(got[0], want[0]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        for name in want[1]:
            np.testing.assert_allclose(got[1][name], want[1][name], rtol=1e-4, atol=1e-5)


class InputGradient(gdb.DynBatchBlock):
    """A sample's gradient with respect to its own input (an array the caller gave
    a gradient, ``x.attach_grad()``), used in its output: through
    ``autograd.grad`` or through a pass and ``x.grad``."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, x):
        with autograd.record():
            out = F.sum(F.tanh(self.dense(x)))
        if self.how == "grad":
            slope = autograd.grad(out, [x], retain_graph=True)[0]
        else:
            out.backward(retain_graph=True)
            slope = x.grad
        return out + F.sum(slope * slope)


def _input_gradient_losses(model, xs, options, record):
    model.dense.weight.zero_grad()
    for x in xs:
        x.attach_grad()
    with autograd.record(record):
        with gdb.batching(**options) if options is not None else _NO_SCOPE():
            outs = [model(x) for x in xs]
        loss = nd.add_n(*outs)
    if not record:
        return [out.asnumpy() for out in outs]
    loss.backward()
    return ([out.asnumpy() for out in outs] + [x.grad.asnumpy() for x in xs]
            + [model.dense.weight.grad().asnumpy()])


_NO_SCOPE = contextlib.nullcontext


@pytest.mark.parametrize("record", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("shared", [False, True], ids=["own", "shared"])
@pytest.mark.parametrize("how", ["grad", "backward"])
@pytest.mark.parametrize("options", [{}, {"strategy": "reference"}, {"compiled": "step"}])
def test_a_gradient_a_sample_takes_with_respect_to_its_input_equals_eager(how, options, shared,
                                                                         record):
    """The input a sample's code sees stands for the caller's array, whose gradient
    it takes (MXNet refused it: 'does not require gradient'; ``x.grad`` was None,
    or, of one array all samples share, another sample's)."""
    mx.random.seed(3)
    model = InputGradient(how)
    model.initialize(mx.init.Uniform(0.5))
    for seed in range(2):
        xs = [nd.random.uniform(-1, 1, shape=(1, 3)) for _ in range(3 + seed)]
        if shared:
            xs = [xs[0]] * len(xs)
        want = _input_gradient_losses(model, xs, None, record)
        got = _input_gradient_losses(model, xs, options, record)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _per_sample_gradients(model, xs, batched, table=None, read=False):
    """Each sample's gradients as DP-SGD takes them: cleared, its own pass, copied
    (``read``: after reading its score first, outside ``autograd.record()``)."""
    got = []

    def one(x):
        if read:
            float(model(x).asscalar())
        model.collect_params().zero_grad()
        if table is not None:
            table.grad[:] = 0
        with autograd.record():
            loss = model(x) if table is None else model(x) + nd.sum(table * x)
        loss.backward()
        got.append([model.dense.weight.grad().asnumpy().copy()]
                   + ([] if table is None else [table.grad.asnumpy().copy()]))
        return loss

    if batched == "map":
        with gdb.batching():
            gdb.map(one, xs)
    else:
        for x in xs:
            one(x)
    return got


@pytest.mark.parametrize("read", [False, True], ids=["pass", "read first"])
@pytest.mark.parametrize("table", [False, True], ids=["weights", "table"])
def test_per_sample_gradients_added_into_cleared_gradients_equal_eager(table, read):
    """With ``grad_req="add"``, each sample clears the gradients and runs its pass
    (samples of ``gdb.map`` wait at their passes): a sample's clearing comes
    after the earlier samples' passes, as eager's (the passes added up; a
    sample that read first, outside autograd, was resumed in rounds of its
    own modes before the earlier samples' passes; an array whose gradient
    only the sample's code reads was not known as one)."""
    mx.random.seed(5)
    model = DenseSum()
    model.initialize(mx.init.Uniform(0.5))
    model.collect_params().setattr("grad_req", "add")
    shared = nd.random.uniform(-1, 1, shape=(1, 3)) if table else None
    if table:
        shared.attach_grad(grad_req="add")
    xs = [nd.random.uniform(-1, 1, shape=(1, 3)) for _ in range(3)]
    want = _per_sample_gradients(model, xs, False, shared, read)
    got = _per_sample_gradients(model, xs, "map", shared, read)
    for sample_got, sample_want in zip(got, want):
        for g, w in zip(sample_got, sample_want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


class DenseSum(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, x):
        return F.sum(F.tanh(self.dense(x)))


def _ordered_passes(how, batched):
    """Per-sample gradients with ``grad_req="add"`` around other work: another
    block called first, a pass before the clearing, or samples of a nested
    ``gdb.map`` after a read."""
    mx.random.seed(7)
    model, other = DenseSum(), DenseSum()
    model.initialize(mx.init.Uniform(0.5))
    other.initialize(mx.init.Uniform(0.5))
    model.collect_params().setattr("grad_req", "add")
    got = []

    def own(x):
        model.collect_params().zero_grad()
        with autograd.record():
            loss = model(x)
        loss.backward()
        got.append(model.dense.weight.grad().asnumpy().copy())
        return loss

    def one(x):
        if how == "other first":
            other(x)
        elif how == "pass first":
            with autograd.record():
                loss = model(x)
            loss.backward()
        return own(x)

    def group(xs):
        float(model(xs[0]).asscalar())
        inner = gdb.map(own, xs) if batched else [own(x) for x in xs]
        return [own(xs[-1])] + list(inner)

    rs = np.random.RandomState(3)
    xs = [nd.array(rs.uniform(-1, 1, (1, 3))) for _ in range(4)]
    samples, fn = ([xs[:1], xs[1:3], xs[3:]], group) if how == "nested" else (xs, one)
    if batched:
        with gdb.batching():
            gdb.map(fn, samples)
    else:
        for sample in samples:
            fn(sample)
    return got + [model.dense.weight.grad().asnumpy()]


@pytest.mark.parametrize("how", ["other first", "pass first", "nested"])
def test_per_sample_gradients_follow_eagers_order_of_samples(how):
    """A clearing of a block called after another (its gradients were not known
    as such), a pass adding into gradients an earlier sample has not read yet,
    and samples of a ``gdb.map`` inside a sample that read first (they ran
    after samples started after their caller): all in eager's order."""
    want = _ordered_passes(how, False)
    got = _ordered_passes(how, True)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _updating_samples(model, xs, batched, how):
    """Each sample calls the model, then moves the bias by its output (``set_data``
    or an in-place write), or by its own gradient (online SGD)."""
    bias = model.dense.bias

    def one(x):
        if how == "sgd":
            with autograd.record():
                out = model(x)
            out.backward()
            bias.set_data(bias.data() - 0.1 * bias.grad())
            return out
        out = model(x)
        if how == "set_data":
            bias.set_data(bias.data() + 0.5)
        else:
            bias.data()[:] += 0.25
        return out

    if batched:
        with gdb.batching():
            outs = gdb.map(one, xs)
    else:
        outs = [one(x) for x in xs]
    return [out.asnumpy() for out in outs] + [bias.data().asnumpy()]


@pytest.mark.parametrize("how", ["set_data", "in place"])
def test_weights_a_sample_of_gdb_map_writes_reach_the_next_sample_as_eager(how):
    """What is pending runs at the write, with no other sample started, so the
    next sample starts with the new weights (they recorded calls with the old
    ones while the writer waited: updates were lost)."""
    runs = []
    for batched in (False, True):
        mx.random.seed(6)
        model = DenseSum()
        model.initialize(mx.init.Uniform(0.5))
        xs = [nd.ones((1, 3)) * k for k in range(4)]
        runs.append(_updating_samples(model, xs, batched, how))
    for got, want in zip(runs[1], runs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_weights_a_sample_writes_while_others_wait_raise_a_clear_error():
    """Online SGD inside ``gdb.map``: the samples wait at their passes, so the
    others have recorded calls with the old weights before the first write."""
    mx.random.seed(6)
    model = DenseSum()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.ones((1, 3)) * k for k in range(3)]
    with pytest.raises(gdb.BatchingError, match="weights are written in place inside a sample") \
            as info:
        _updating_samples(model, xs, True, "sgd")
    # Where: the sample's own code (its ``gdb.map`` function), not "outside any sample".
    assert "outside any sample" not in str(info.value)
    assert "samples[" in " ".join(getattr(info.value, "__notes__", []))
    want = [model(x).asnumpy() for x in xs]
    with gdb.batching():
        outs = [model(x) for x in xs]
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class RunningMean(gdb.DynBatchBlock):
    """A running mean of the sample's rows kept in a parameter, written with
    ``set_data`` under ``autograd.pause()`` (a statistic of the user's own)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)
            self.mean = self.params.get("mean", shape=(1, 3), init=mx.init.Zero(),
                                        grad_req="null", differentiable=False)

    def hybrid_forward(self, F, x, mean):
        h = self.dense(x)
        with autograd.pause():
            self.mean.set_data(0.9 * mean + 0.1 * F.mean(h, axis=0, keepdims=True))
        return h - mean


def test_a_running_statistic_samples_write_is_refused_in_a_plain_loop_by_what_happened():
    """The samples' mode change under ``pause()`` makes each wait, so the next
    one starts and reads the statistic before the write: refused, and the
    message says so (it spoke of ``gdb.map`` alone); the next scope works."""
    model = RunningMean()
    model.initialize()
    xs = [nd.ones((n, 4)) * n for n in (1, 2, 3)]
    with pytest.raises(gdb.BatchingError, match="change of autograd's mode.*run such a model "
                                               "eagerly"):
        with autograd.record():
            with gdb.batching():
                [model(x) for x in xs]      # pylint: disable=expression-not-assigned
    plain = DenseSum()
    plain.initialize()
    with gdb.batching():
        outs = [plain(x[:, :3]) for x in xs]
    for out, x in zip(outs, xs):
        np.testing.assert_allclose(out.asnumpy(), plain(x[:, :3]).asnumpy(), rtol=1e-6)


class MarkedVariable(gdb.DynBatchBlock):
    """A gradient into a buffer of the sample's own (``autograd.mark_variables``)
    of a value it computed, or one through a pass whose head gradient it
    computed (``backward(out_grad=...)``), used in its output."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        v = h.detach()
        if self.how == "marked":
            slope = nd.zeros(v.shape)
            autograd.mark_variables([v], [slope])
        else:
            v.attach_grad()
        with autograd.record():
            y = F.tanh(v)
        if self.how == "marked":
            F.sum(y).backward()
        else:
            y.backward(out_grad=F.ones_like(y) + y.detach())
            slope = v.grad
        return F.sum(slope * h)


def _marked_outputs(model, xs, options, record):
    with autograd.record(record):
        with gdb.batching(**options) if options is not None else _NO_SCOPE():
            outs = [model(x) for x in xs]
    return [out.asnumpy() for out in outs]


@pytest.mark.parametrize("record", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("how", ["marked", "head"])
@pytest.mark.parametrize("options", [{}, {"strategy": "reference"}, {"compiled": "step"}])
def test_gradients_a_sample_writes_into_its_own_arrays_equal_eager(how, options, record):
    """A marked value is an array of its own, as after ``attach_grad`` (its
    gradient was zeros, or MXNet refused the other samples' buffers), and a
    pass's pending head gradient is computed before the other samples'
    gradients are kept (their gradients were zeros)."""
    mx.random.seed(4)
    model = MarkedVariable(how)
    model.initialize(mx.init.Uniform(0.5))
    for seed in range(2):
        xs = [nd.random.uniform(-1, 1, shape=(2, 3)) for _ in range(3 + seed)]
        want = _marked_outputs(model, xs, None, record)
        got = _marked_outputs(model, xs, options, record)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        assert all(np.abs(w).sum() > 0 for w in want)


class SecondOrder(gdb.DynBatchBlock):
    """``x.grad`` of ``d/dx`` of ``sin(x)``: a gradient of a gradient."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(5, in_units=3)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        v = h.detach()
        v.attach_grad()
        with autograd.record():
            first = autograd.grad(F.sin(v), [v], head_grads=nd.ones((1, 5)),
                                  create_graph=True)[0]
        first.backward()
        return h + v.grad


def test_a_gradient_of_a_gradient_inside_a_sample_names_the_sample_and_the_way_out():
    """MXNet cannot differentiate the batched steps' gathers twice: a clear error
    (it was MXNet's 'non-differentiable'), and the reference strategy runs it."""
    model = SecondOrder()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.random.uniform(-1, 1, shape=(1, 3)) for _ in range(3)]
    with autograd.record():
        want = [model(x).asnumpy() for x in xs]
    with pytest.raises(gdb.BatchingError, match="sample 0, in .*create_graph.*reference"):
        with autograd.record():
            with gdb.batching():
                [model(x) for x in xs]
    with autograd.record():
        with gdb.batching(strategy="reference"):
            outs = [model(x) for x in xs]
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


def _eager_second_order_error():
    """MXNet's own error for a gradient of a gradient through ``sum``, no scope."""
    with pytest.raises(MXNetError) as info:
        _eager_second_order_error_unchecked()
    return info.value


@pytest.mark.parametrize("heads", ["outputs", "loss"])
def test_a_gradient_penalty_on_a_scopes_values_says_how_to_run_it(heads):
    """``autograd.grad(outs, xs, create_graph=True)`` in the scope's own code (a
    gradient penalty), of the outputs or of a loss made of them: a clear error
    pointing to the reference strategy (it was MXNet's advice not to
    hybridize), which gives eager's results; MXNet's own errors afterwards,
    of code that batched nothing, stay MXNet's."""
    model = Encoder()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.random.uniform(-1, 1, shape=(1, 3)) for _ in range(3)]

    def penalised(batching):
        for param in model.collect_params().values():
            param.zero_grad()
        for x in xs:
            x.attach_grad()
        with autograd.record():
            outs = outputs_of(model, xs, batching)
            of = outs if heads == "outputs" else nd.add_n(*outs)
            grads = autograd.grad(of, xs, create_graph=True, retain_graph=True)
            total = nd.add_n(*outs).sum() + nd.add_n(*[(g * g).sum() for g in grads])
        total.backward()
        return model.dense.weight.grad().asnumpy().copy()
    want = penalised(None)
    with pytest.raises(gdb.BatchingError, match="create_graph=False.*reference"):
        penalised({})
    np.testing.assert_allclose(penalised({"strategy": "reference"}), want, rtol=1e-5,
                               atol=1e-6)
    assert type(_eager_second_order_error()) is MXNetError


def test_input_gradients_with_create_graph_say_to_pass_false_when_used_as_values():
    """``autograd.grad(loss, xs, create_graph=True)`` with no pass through the
    result: MXNet cannot record the batched steps' backward at the call itself,
    and the error says so (it spoke of a pass that had not happened);
    ``create_graph=False`` gives eager's gradients."""
    model = Encoder()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.random.uniform(-1, 1, shape=(1, 3)) for _ in range(3)]

    def input_gradients(batching, create_graph):
        for x in xs:
            x.attach_grad()
        with autograd.record():
            outs = outputs_of(model, xs, batching)
            total = nd.add_n(*[(o * o).sum() for o in outs])
            grads = autograd.grad(total, xs, create_graph=create_graph, retain_graph=True)
        return [g.asnumpy() for g in grads]
    want = input_gradients(None, True)
    with pytest.raises(gdb.BatchingError, match="create_graph=True.*create_graph=False"):
        input_gradients({"compiled": "plan"}, True)
    for got, expected in zip(input_gradients({"compiled": "plan"}, False), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_an_eager_gradient_of_a_gradient_after_a_scope_keeps_mxnets_error():
    """A scope recorded under ``autograd.record()`` whose values were never
    differentiated, then eager code that MXNet cannot differentiate twice: the
    error said only that batched steps could not be, and to run the model with
    the reference strategy.  It is MXNet's error too now, and gives its text."""
    model = Encoder()
    model.initialize(mx.init.Uniform(0.5))
    with autograd.record():
        with gdb.batching():
            outs = [model(x) for x in _inputs()]
    with pytest.raises(MXNetError, match="non-differentiable|higher order"):
        _eager_second_order_error_unchecked()
    assert len(outs) == 4


def _eager_second_order_error_unchecked():
    x = nd.array([[1.0, 2.0]])
    x.attach_grad()
    with autograd.record():
        first = autograd.grad(nd.sum(nd.sin(x)), [x], create_graph=True, retain_graph=True)[0]
        total = nd.sum(first * first)
    total.backward()


_DETACHED_IN_SCOPE = r'''
import contextlib
import sys
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn, rnn
import gluon_dynbatch as gdb

class Layer(gdb.DynBatchBlock):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(units, in_units=4)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))

def critic_grad(settings):
    mx.random.seed(0)
    generator, critic = Layer(4), Layer(1)
    generator.initialize()
    critic.initialize()
    zs = [nd.array(np.random.RandomState(k).randn(1, 4)) for k in range(3)]
    with autograd.record():
        with contextlib.nullcontext() if settings is None else gdb.batching(**settings):
            fake = [generator(z) for z in zs]
            scores = [critic(f.detach()) for f in fake]
        loss = nd.add_n(*scores)
    loss.backward()
    return critic.dense.weight.grad().asnumpy()

want = critic_grad(None)
got = critic_grad({"strategy": sys.argv[1]})
print("max diff", float(np.abs(got - want).max()))
'''


def _max_diff_in_a_process(script, strategy):
    """The ``max diff`` a script prints, run in a process of its own with
    ``strategy`` (a crash of MXNet's there fails the test, not the suite)."""
    return float(output_of_script(script, strategy).split("max diff")[-1])


@pytest.mark.parametrize("strategy", ["reference", "depth"])
def test_a_critic_on_values_detached_inside_the_scope_equals_eager(strategy):
    """``x.detach()`` inside a scope is recorded as ``BlockGrad``; run as
    recorded under autograd, MXNet's backward through it crashed the process
    (the reference executor), where eager's detach has no history at all."""
    assert _max_diff_in_a_process(_DETACHED_IN_SCOPE, strategy) < 1e-6


_COUNTER_READ_IN_A_WHILE = r"""
import sys
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn, rnn
import gluon_dynbatch as gdb

class Walk(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        x = self.dense(x)
        i, h = F.zeros((1,)), x[0:1]
        while bool(i < x.shape[0]):         # read: the samples wait, then go on
            h = h + F.take(x, i)
            i = i + 1
        return h

def run(strategy):
    mx.random.seed(0)
    model = Walk()
    model.initialize()
    xs = [nd.array(np.random.RandomState(n).randn(n, 4)) for n in (2, 3, 2)]
    with autograd.record():
        if strategy == "eager":
            outs = [model(x) for x in xs]
        else:
            with gdb.batching(strategy=strategy):
                outs = [model(x) for x in xs]
        loss = nd.add_n(*[(o * o).sum() for o in outs])
    loss.backward()
    return np.concatenate([o.asnumpy().ravel() for o in outs]
                          + [model.dense.weight.grad().asnumpy().ravel()])

want = run("eager")
got = run(sys.argv[1])
print("max diff", float(np.abs(got - want).max()))
"""


@pytest.mark.parametrize("strategy", ["depth", "agenda"])
def test_taking_rows_by_a_counter_read_in_a_while_condition_equals_eager(strategy):
    """``while bool(i < n): h = h + F.take(x, i); i = i + 1``: the batched take's
    indices, gathered from the samples' counters, reached MXNet's backward with
    only the zero gradient of an index, and the process crashed (segfault)."""
    assert _max_diff_in_a_process(_COUNTER_READ_IN_A_WHILE, strategy) < 1e-5


@pytest.mark.parametrize("settings", [{}, {"compiled": "step"}, {"granularity": "op"}],
                         ids=["default", "step", "op"])
def test_an_output_written_with_out_then_used_again_in_the_scope_equals_eager(settings):
    """``nd.sigmoid(o, out=o)`` on an output still pending: the flush its handle
    runs hands it out as rows of the flush's arrays, and later calls in the
    scope read those rows instead of the values written."""
    model = Encoder()
    model.initialize(mx.init.Uniform(0.5))
    again = Encoder()                   # reads the (2, 4) outputs
    again.dense = gluon.nn.Dense(4, in_units=4)
    again.initialize(mx.init.Uniform(0.5))
    xs = [nd.random.uniform(-1, 1, shape=(2, 3)) for _ in range(4)]

    def run(batched):
        with gdb.batching(**settings) if batched else contextlib.nullcontext():
            firsts = [model(x) for x in xs]
            for out in firsts:
                nd.sigmoid(out, out=out)
            seconds = [again(out) for out in firsts]
        return [o.asnumpy() for o in firsts + seconds]
    for got, want in zip(run(True), run(False)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class DeferredRNN(gdb.DynBatchBlock):
    """Dense layers without ``in_units``: their weights get their shapes, and
    their gradient arrays, at the first call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.step = gluon.nn.Dense(4)
            self.out = gluon.nn.Dense(1)

    def hybrid_forward(self, F, x):
        h = F.zeros((1, 4))
        for t in range(x.shape[0]):
            h = F.tanh(self.step(x[t:t + 1] + h))
        return self.out(h)


def _per_sample_passes(options, grad_req):
    """Each sample's own ``backward()`` (``grad_req`` "add": the sum; "write":
    each sample's gradient copied), the model's first calls inside the scope."""
    mx.random.seed(0)
    model = DeferredRNN()
    model.initialize(mx.init.Xavier())
    model.collect_params().setattr("grad_req", grad_req)
    xs = [nd.array(np.random.RandomState(k).randn(n, 4)) for k, n in enumerate((1, 3, 2))]

    def sample(x):
        with autograd.record():
            loss = model(x).sum()
        loss.backward()
        return model.out.weight.grad().copy(), model.step.weight.grad().copy()

    if options is None:
        grads = [sample(x) for x in xs]
    else:
        with gdb.batching(**options):
            grads = gdb.map(sample, xs)
    return [g.asnumpy() for pair in grads for g in pair] + \
        [p.grad().asnumpy() for p in model.collect_params().values()]


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}])
@pytest.mark.parametrize("grad_req", ["add", "write"])
def test_samples_own_passes_after_deferred_initialisation_in_the_scope_equal_eager(
        options, grad_req):
    """Gluon marked the layers' new gradient arrays as variables while the
    first sample ran: taken for arrays that sample made its own, the later
    samples' passes put them back as they were, so only the first sample's
    gradient was left (or every sample's copy was the first's)."""
    got, want = _per_sample_passes(options, grad_req), _per_sample_passes(None, grad_req)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class HingeAfterSearch(gdb.DynBatchBlock):
    """A structured hinge loss: the best labelling found under ``autograd.pause()``
    (a read), then the scores of it and of the gold one, recorded."""

    def __init__(self, read_first=False, **kwargs):
        super().__init__(**kwargs)
        self.read_first = read_first
        with self.name_scope():
            self.out = gluon.nn.Dense(3, in_units=4, flatten=False)

    def hybrid_forward(self, F, feats, gold):
        if self.read_first:
            float(F.sum(F.array(gold)).asscalar())          # a read before anything
        with autograd.pause():
            augmented = self.out(feats) + 1.0 - F.one_hot(F.array(gold), 3)
            pred = [int(p) for p in F.argmax(augmented, axis=1).asnumpy()]
        scores = self.out(feats)
        return F.relu(F.sum(F.pick(scores, F.array(pred), axis=1))
                      - F.sum(F.pick(scores, F.array(gold), axis=1)) + 1.0)


def _hinge_input_grads(options, read_first):
    """The gradients of an encoder run before the scope and of inputs given one."""
    mx.random.seed(0)
    encoder = gluon.nn.Dense(4, in_units=5, flatten=False)
    encoder.initialize()
    model = HingeAfterSearch(read_first)
    model.initialize()
    raw = [nd.array(np.random.RandomState(k).randn(n, 5)) for k, n in enumerate((3, 2, 4))]
    golds = [[0, 1, 2], [2, 2], [1, 0, 0, 2]]
    results = []
    for _ in range(2):                              # the second scope replays the first
        for x in raw:
            x.attach_grad()
        with autograd.record():
            feats = [encoder(x) for x in raw]
            if options is None:
                outs = [model(f, g) for f, g in zip(feats, golds)]
            elif options == "map":
                outs = gdb.map(lambda pair: model(*pair), list(zip(feats, golds)))
            else:
                with gdb.batching(**options):
                    outs = [model(f, g) for f, g in zip(feats, golds)]
            loss = nd.add_n(*outs)
        loss.backward()
        results.append([encoder.weight.grad().asnumpy().copy()] +
                       [x.grad.asnumpy().copy() for x in raw])
    return results


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}, "map"])
@pytest.mark.parametrize("read_first", [False, True])
def test_inputs_first_used_under_pause_after_a_flush_keep_their_gradient(options, read_first):
    """A sample's input, wrapped before a flush (a read, a change of modes), was
    copied when first used after it, in the modes of then: under
    ``autograd.pause()`` a copy without the input's gradient, which the
    sample's recorded calls then read (no gradient reached the input)."""
    got, want = _hinge_input_grads(options, read_first), _hinge_input_grads(None, read_first)
    for scope_got, scope_want in zip(got, want):
        for g, w in zip(scope_got, scope_want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _frozen_encoder_run(options):
    """A head trained on ``encoder(x).detach()`` in one scope (fine-tuning
    with a frozen encoder): the encoder's weights, the head's, after two steps
    of SGD with momentum and weight decay skipping stale gradients."""
    mx.random.seed(2)
    encoder, head = Encoder(), Scorer()
    encoder.initialize(mx.init.Uniform(0.5))
    head.initialize(mx.init.Uniform(0.5))
    params = list(encoder.collect_params().values()) + list(head.collect_params().values())
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.1})
    rs = np.random.RandomState(0)
    for _ in range(2):
        xs = [nd.array(rs.uniform(-1, 1, (k, 3))) for k in (1, 2, 3)]
        with autograd.record():
            if options is None:
                outs = [head(encoder(x).detach()) for x in xs]
            else:
                with gdb.batching(**options):
                    feats = [encoder(x).detach() for x in xs]
                    outs = [head(f) for f in feats]
            loss = nd.add_n(*[(o ** 2).sum() for o in outs])
        loss.backward()
        trainer.step(len(xs), ignore_stale_grad=True)
    return [p.data().asnumpy() for p in params]


class DetachedInside(gdb.DynBatchBlock):
    """``head(encoder(x).detach())`` inside one block: the detach is a call of
    the block's program."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.encoder = gluon.nn.Dense(4, in_units=3)
            self.head = gluon.nn.Dense(1, in_units=4)

    def hybrid_forward(self, F, x):
        return self.head(F.tanh(self.encoder(x)).detach())


@pytest.mark.parametrize("options", [{}, {"compiled": "plan"}, {"compiled": "step"},
                                     {"strategy": "reference"}], ids=str)
def test_a_detach_inside_a_blocks_program_leaves_the_encoder_as_eager_does(options):
    """A whole compiled plan, and a step's compiled program, reached every input
    of a block's program, the encoder's weights behind its ``detach()`` too (a
    zero gradient, fresh)."""
    runs = []
    for batched in (False, True):
        mx.random.seed(3)
        model = DetachedInside()
        model.initialize(mx.init.Uniform(0.5))
        trainer = gluon.Trainer(model.collect_params(), "sgd",
                                {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.1})
        rs = np.random.RandomState(1)
        for _ in range(2):
            xs = [nd.array(rs.uniform(-1, 1, (k, 3))) for k in (1, 2, 3)]
            with autograd.record():
                outs = outputs_of(model, xs, options if batched else None)
                loss = nd.add_n(*[(o ** 2).sum() for o in outs])
            loss.backward()
            trainer.step(len(xs), ignore_stale_grad=True)
        runs.append([p.data().asnumpy() for p in model.collect_params().values()])
    for got, want in zip(runs[1], runs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("options", [{}, {"compiled": "plan"}, {"compiled": "step"},
                                     {"strategy": "reference"}], ids=str)
def test_a_frozen_encoders_detached_outputs_leave_its_weights_as_eager_does(options):
    """A whole plan compiled as one graph gave the encoder a zero gradient,
    marked fresh, through ``detach()``: weight decay then moved it."""
    for got, want in zip(_frozen_encoder_run(options), _frozen_encoder_run(None)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


class BlockedOutput(gdb.DynBatchBlock):
    """A sample's output behind ``F.BlockGrad``: no gradient flows back."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.w = self.params.get("w", shape=(4,))

    def hybrid_forward(self, F, x, w):
        return F.BlockGrad(F.broadcast_mul(x, F.reshape(w, (1, -1))))


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"compiled": "plan"},
                                     {"compiled": "step"}, "map"], ids=str)
def test_a_loss_of_blockgrad_outputs_alone_gives_zero_gradients_as_eagerly(options):
    """Compiled plans and steps gave such outputs no history (their inputs were
    passed without it, no gradient reaching them): ``backward()`` raised
    MXNet's "Cannot differentiate node" where eager writes zeros."""
    model = BlockedOutput()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array(np.random.RandomState(k).uniform(-1, 1, (n, 4)))
          for k, n in enumerate((2, 3, 1))]
    for _ in range(2):
        model.w.grad()[:] = 1.0
        with autograd.record():
            outs = outputs_of(model, xs, options)
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
        np.testing.assert_array_equal(model.w.grad().asnumpy(), np.zeros(4))
        want = [(x * model.w.data().reshape((1, -1))).asnumpy() for x in xs]
        for got, expected in zip(outs, want):
            np.testing.assert_allclose(got.asnumpy(), expected, rtol=1e-6)


class ReadsThenScores(gdb.DynBatchBlock):
    """A sample that reads a value (a stop test) before its last call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        if float(F.sum(h).asscalar()) > 100:     # a read: the sample waits
            h = h * 2
        return F.sum(self.dense(x) * h, axis=1)


def _replaced_while_waiting(how, options):
    """A first loop whose samples wait at a read, the scope's own code giving the
    layer new weights, a second loop: outputs, and the weight's gradient."""
    mx.random.seed(5)
    model = ReadsThenScores()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array(np.random.RandomState(k).randn(k + 1, 4)) for k in range(3)]
    with autograd.record():
        with gdb.batching(**options) if options is not None else contextlib.nullcontext():
            outs = [model(x) for x in xs]
            if how == "force_reinit":
                mx.random.seed(9)
                model.initialize(mx.init.Uniform(0.5), force_reinit=True)
            else:
                model.cast("float64")
                xs = [x.astype("float64") for x in xs]
            outs += [model(x) for x in xs]
        loss = nd.add_n(*[o.sum().astype("float32") for o in outs])
    loss.backward()
    return [o.asnumpy() for o in outs] + [model.dense.weight.grad().asnumpy()]


@pytest.mark.parametrize("how", ["force_reinit", "cast"])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "reference"}])
def test_weights_replaced_while_samples_wait_at_a_read_reach_only_later_samples(how, options):
    """The samples of the first loop waiting at a read finish first, with the old
    weights, as eager's did (they resumed with the new weights, or failed on
    float64 weights: "Incompatible attr")."""
    got, want = _replaced_while_waiting(how, options), _replaced_while_waiting(how, None)
    assert len(got) == len(want)
    for out, expected in zip(got, want):
        assert out.dtype == expected.dtype
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


class Head(gdb.DynBatchBlock):
    """``tanh(dense(x))``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


def _fresh_head_per_sample(batched):
    """``gdb.map`` of a function giving a shared head new weights, then using it."""
    head = Head()
    head.initialize()
    xs = [nd.array(np.random.RandomState(k).randn(k + 1, 3)) for k in range(3)]

    def fn(k):
        mx.random.seed(100 + k)
        head.initialize(mx.init.Uniform(0.5), force_reinit=True)
        return head(xs[k])

    if not batched:
        return [fn(k).asnumpy() for k in range(3)]
    with gdb.batching():
        outs = gdb.map(fn, range(3))
    return [o.asnumpy() for o in outs]


def test_a_head_given_new_weights_by_each_sample_of_map_equals_eager():
    """Each sample's calls read the weights it gave the head, as eagerly (the
    sample waited at its re-initialisation and then read the last sample's)."""
    for got, want in zip(_fresh_head_per_sample(True), _fresh_head_per_sample(False)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _frozen_then_trained(first, second, options):
    """The encoder's ``grad_req`` is ``first`` for a first loop and ``second`` for
    a second one, in one scope: its bias's gradient."""
    encoder, _, _ = _models()
    xs = _inputs()
    params = encoder.collect_params()
    params.setattr("grad_req", first)
    with autograd.record():
        with gdb.batching(**options) if options is not None else contextlib.nullcontext():
            outs = [encoder(x) for x in xs[:2]]
            params.setattr("grad_req", second)
            outs += [encoder(x) for x in xs[2:]]
        loss = nd.add_n(*[o.sum() for o in outs])
    loss.backward()
    grad = encoder.dense.bias.grad().asnumpy().copy()
    params.setattr("grad_req", "write")
    return grad


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}])
def test_a_layer_frozen_for_the_first_samples_takes_the_gradient_of_the_later_ones(options):
    """``grad_req`` set from "null" to "write" between two loops: the first loop's
    calls run first, without a gradient, as eager's did (they ran at the
    scope's end and added the first samples' share)."""
    np.testing.assert_allclose(_frozen_then_trained("null", "write", options),
                               _frozen_then_trained("null", "write", None),
                               rtol=1e-5, atol=1e-6)


def _given_a_gradient_between_loops(options):
    """An input read by a first loop, then given a gradient by the scope's own
    code, then read by a second loop: its gradient."""
    encoder, _, _ = _models()
    x = _inputs()[0]
    with autograd.record():
        with gdb.batching(**options) if options is not None else contextlib.nullcontext():
            outs = [encoder(x) for _ in range(2)]
            x.attach_grad()
            outs += [encoder(x) for _ in range(2)]
        loss = nd.add_n(*[o.sum() for o in outs])
    loss.backward()
    return x.grad.asnumpy()


@pytest.mark.parametrize("options", [{}, {"strategy": "reference"}])
def test_an_input_given_a_gradient_between_two_loops_takes_the_later_loops_gradient(options):
    """As eager, only calls after ``attach_grad`` reach the gradient (the reference
    strategy counted the first loop's calls too)."""
    np.testing.assert_allclose(_given_a_gradient_between_loops(options),
                               _given_a_gradient_between_loops(None), rtol=1e-5, atol=1e-6)


class Saliency(gdb.DynBatchBlock):
    """A sample giving a gradient to its own input (``x.attach_grad()``, saliency with
    respect to the input), or to an embedding it computes and returns."""

    def __init__(self, of_input, **kwargs):
        super().__init__(**kwargs)
        self.of_input = of_input
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4, flatten=False)

    def hybrid_forward(self, F, x):
        if self.of_input:
            x.attach_grad()
            return F.sum(F.tanh(self.dense(x)))
        e = F.tanh(self.dense(x))
        e.attach_grad()
        return F.sum(e * e), e


def _saliencies(of_input, mode):
    mx.random.seed(2)
    model = Saliency(of_input)
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.array(np.random.RandomState(k).randn(k + 1, 4)) for k in range(3)]
    with autograd.record():
        if mode is None:
            outs = [model(x) for x in xs]
        elif mode == "map":
            outs = gdb.map(model, xs)
        else:
            with gdb.batching(**mode):
                outs = [model(x) for x in xs]
        loss = nd.add_n(*[o if of_input else o[0] + o[1].sum() for o in outs])
    loss.backward()
    held = xs if of_input else [o[1] for o in outs]
    return [None if a.grad is None else a.grad.asnumpy() for a in held]


@pytest.mark.parametrize("of_input", [True, False], ids=["input", "returned value"])
@pytest.mark.parametrize("mode", [{}, {"compiled": True}, {"strategy": "reference"}, "map"],
                         ids=["default", "compiled", "reference", "map"])
def test_a_gradient_a_sample_attaches_is_read_by_its_caller_as_eager(of_input, mode):
    """``x.attach_grad()`` on a sample's input gives the caller's array the gradient,
    and an array the sample attaches a gradient to and returns is, for the
    caller, that variable (both were None: a copy of the sample's got it)."""
    want = _saliencies(of_input, None)
    for _ in range(2):
        got = _saliencies(of_input, mode)
        for grad, expected in zip(got, want):
            assert grad is not None
            np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


class AttachesThenReads(gdb.DynBatchBlock):
    """Gives its input a gradient, then reads a value (a stop test)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3, flatten=False)

    def hybrid_forward(self, F, x):
        x.attach_grad()
        h = F.tanh(self.dense(x))
        if float(F.sum(h).asscalar()) > 0:
            h = h * 2
        return F.sum(h)


def _one_input_attached_by_each(mode):
    mx.random.seed(4)
    model = AttachesThenReads()
    model.initialize(mx.init.Normal(0.5))
    x = nd.array(np.random.RandomState(4).randn(2, 3))
    with autograd.record():
        with gdb.batching(**mode) if mode is not None else contextlib.nullcontext():
            outs = [model(x) for _ in range(5)]
        loss = nd.add_n(*[o * (k + 1) for k, o in enumerate(outs)])
    loss.backward()
    return x.grad.asnumpy()


@pytest.mark.parametrize("mode", [{}, {"strategy": "reference"}], ids=str)
def test_one_input_each_sample_gives_a_gradient_holds_the_last_samples_gradient(mode):
    """Each ``attach_grad`` makes the array a new variable, as eagerly: its gradient
    is the last sample's (the samples that waited at their reads added theirs)."""
    want = _one_input_attached_by_each(None)
    for _ in range(2):
        np.testing.assert_allclose(_one_input_attached_by_each(mode), want, rtol=1e-5, atol=1e-6)
