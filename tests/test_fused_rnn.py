"""Gluon's fused RNN layers over sentences of different lengths.

A layer called without states runs as one call for every sentence, each
padded after its end (``layer_rules.PaddedRNNRule``; both directions layer by
layer); a layer whose states are given or returned runs once per length
(``RNNRule``).  Every form is checked against eager
Gluon, outputs and every gradient.
"""
import random

import numpy as np
import pytest
import mxnet as mx
from mxnet import autograd, nd
from mxnet.gluon import nn, rnn

import gluon_dynbatch as gdb
from dynbatch_testing import check_all_strategies, make_model, output_of_script

E, H = 3, 4
LENGTHS = (1, 4, 2, 5, 3, 5)


def _sentences(seed):
    rng = random.Random(seed)
    return [[rng.randrange(10) for _ in range(n)] for n in LENGTHS]


def _table(seed=0):
    return nd.array(np.random.RandomState(seed).uniform(-1, 1, (10, E)))


LAYERS = {
    "lstm": lambda: rnn.LSTM(H, input_size=E),
    "gru_two_layers_ntc": lambda: rnn.GRU(H, num_layers=2, layout="NTC", input_size=E),
    "relu_rnn": lambda: rnn.RNN(H, activation="relu", input_size=E),
    "lstm_states_given": lambda: rnn.LSTM(H, num_layers=2, input_size=E),
    "gru_final_state": lambda: rnn.GRU(H, input_size=E),
    "lstm_final_states": lambda: rnn.LSTM(H, input_size=E),
    "bigru_final_state": lambda: rnn.GRU(H, bidirectional=True, input_size=E),
    "bidirectional_lstm": lambda: rnn.LSTM(H, bidirectional=True, input_size=E),
    "bidirectional_gru_two_layers": lambda: rnn.GRU(H, num_layers=2, bidirectional=True,
                                                    input_size=E),
    "bidirectional_tanh_rnn": lambda: rnn.RNN(H, bidirectional=True, input_size=E),
}
PER_LENGTH = ("lstm_states_given",)


class Encoder(gdb.DynBatchBlock):
    """A fused layer over a sentence; the last output and the mean of all."""

    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        self.kind = layer
        with self.name_scope():
            self.rnn = LAYERS[layer]()

    def hybrid_forward(self, F, words, table):
        x = F.concat(*[table[w:w + 1] for w in words], dim=0)            # (T, E)
        if self.kind == "gru_two_layers_ntc":
            out = self.rnn(x.expand_dims(0))                              # (1, T, H)
            pooled = F.mean(out, axis=1) + F.max(F.tanh(out), axis=1)     # over time
            out = out[0] + pooled
        elif self.kind == "lstm_states_given":
            out, states = self.rnn(x.expand_dims(1), self.rnn.begin_state(batch_size=1))
            return F.concat(out[-1], states[1][1], dim=1)
        elif self.kind in ("gru_final_state", "lstm_final_states", "bigru_final_state"):
            # The final hidden state (and an LSTM's cell state) used, not the outputs.
            _, states = self.rnn(x.expand_dims(1), self.rnn.begin_state(batch_size=1))
            return F.concat(*[s[0] for s in states], dim=1)
        else:
            out = self.rnn(x.expand_dims(1)).reshape((len(words), -1))
        return F.concat(out[-1:], F.mean(out, axis=0, keepdims=True), dim=1)


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_fused_layers_over_sentences_of_different_lengths(layer):
    model = make_model(Encoder, layer=layer)
    samples, table = _sentences(0), _table()
    check_all_strategies(model, samples, [table], strategies=("depth",))
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(words, table) for words in samples]
    nd.waitall()
    assert len(outs) == len(samples)
    calls = [len(s.nodes) for s in scope.last_plan.steps if s.nodes[0].op.name == "RNN"]
    per_length = sorted([LENGTHS.count(n) for n in set(LENGTHS)])
    if layer in PER_LENGTH:
        assert sorted(calls) == per_length
    elif layer == "lstm_final_states":
        # The hidden state is the padded call's last step; the cell state needs
        # the call that returns it, per length.
        assert sorted(calls) == sorted(per_length + [len(samples)])
    else:
        assert calls == [len(samples)]


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_fused_layer_code_runs_once_per_shape_then_replays(layer, monkeypatch):
    # A layer's call reads its weights flattened and concatenated, values of
    # weights alone: it is learned once per sentence length and replayed after.
    runs = []
    kernel = rnn.rnn_layer._RNNLayer._forward_kernel   # pylint: disable=protected-access

    def counted(self, *args, **kwargs):
        runs.append(1)
        return kernel(self, *args, **kwargs)
    monkeypatch.setattr(rnn.rnn_layer._RNNLayer, "_forward_kernel", counted)
    model = make_model(Encoder, layer=layer)
    samples, table = _sentences(0), _table()
    steps = []
    for _ in range(2):
        del runs[:]
        with gdb.batching(keep_plan=True) as scope:
            outs = [model(words, table) for words in samples]
        nd.waitall()
        assert len(outs) == len(samples)
        steps.append(len(scope.last_plan.steps))
        if not steps[1:]:
            assert len(runs) == len(set(LENGTHS))
    assert runs == [] and steps[0] == steps[1]


def test_fused_layer_weights_are_resolved_once_per_batch(monkeypatch):
    # Every sample's replayed call reads the layer's flattened weights: the
    # graph makes their calls once and every later sample finds them, without
    # walking the calls that made them again.
    from gluon_dynbatch.record import weights as weight_calls
    made = []
    shared_call = weight_calls.shared_call

    def counted(*args, **kwargs):
        made.append(1)
        return shared_call(*args, **kwargs)
    model = make_model(Encoder, layer="lstm")
    samples, table = _sentences(0), _table()
    with gdb.batching():
        first = [model(words, table) for words in samples]      # learns the templates
    monkeypatch.setattr(weight_calls, "shared_call", counted)
    with gdb.batching():
        outs = [model(words, table) for words in samples * 3]
    per_batch = len(made)
    del made[:]
    with gdb.batching():
        model(samples[0], table)
    assert 0 < per_batch == len(made)
    for a, b in zip(first, outs):
        assert np.allclose(a.asnumpy(), b.asnumpy())


class FusedEncoder(gdb.DynBatchBlock):
    """A fused RNN layer without ``input_size``, whose call reshapes its
    weights before any operator could tell their shapes."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.rnn = getattr(rnn, kind)(6)
            self.out = nn.Dense(1, flatten=False)

    def hybrid_forward(self, F, x):
        return F.sum(self.out(self.rnn(x)))


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}])
def test_deferred_initialisation_of_a_fused_rnn_layer_inside_scope(kind, options):
    xs = [nd.random.uniform(shape=(n, 1, 3)) for n in (3, 5, 4)]
    runs = []
    for batched in (True, False):   # each run initialises a model of its own
        mx.random.seed(11)
        model = FusedEncoder(kind)
        model.initialize(mx.init.Uniform(0.5))
        with autograd.record():
            if batched:
                with gdb.batching(**options):
                    outs = [model(x) for x in xs]
            else:
                outs = [model(x) for x in xs]
            loss = nd.add_n(*outs)
        loss.backward()
        weight = model.rnn.l0_i2h_weight
        runs.append(([o.asnumpy() for o in outs], weight.data().asnumpy(),
                     weight.grad().asnumpy()))
    assert runs[0][1].shape == (runs[0][1].shape[0], 3)
    np.testing.assert_array_equal(runs[0][1], runs[1][1])     # the same initial values
    for a, b in zip(runs[0][0], runs[1][0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(runs[0][2], runs[1][2], rtol=1e-5, atol=1e-6)


class PaddedWithLengths(gdb.DynBatchBlock):
    """A fused layer given each sentence's length (``use_sequence_length``) over
    the sentence padded with rows of zeros; the output at its last word."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.rnn = {"gru": rnn.GRU, "rnn": rnn.RNN, "lstm": rnn.LSTM}[kind](
                H, input_size=E, use_sequence_length=True)

    def hybrid_forward(self, F, words, table):
        x = F.concat(*[table[w:w + 1] for w in words], F.zeros((2, E)), dim=0)
        length = F.array([len(words)])
        out, _ = self.rnn(x.expand_dims(1), self.rnn.begin_state(batch_size=1, func=F.zeros),
                          length)
        return F.SequenceLast(out, sequence_length=length, use_sequence_length=True)


@pytest.mark.parametrize("kind", ["gru", "rnn", "lstm"])
def test_fused_layers_given_sequence_lengths_equal_eager(kind):
    """A GRU's or plain RNN's lengths follow its one state, where ``mx.sym.RNN``
    names an LSTM's cell state: every strategy raised in shape inference."""
    model = make_model(PaddedWithLengths, kind=kind)
    check_all_strategies(model, _sentences(1), [_table(1)], strategies=("depth", "agenda"))


_PROJECTED = r'''
import random
import sys
import numpy as np
import mxnet as mx
from mxnet import gluon
from mxnet.gluon import rnn
import gluon_dynbatch as gdb

class Tagger(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.emb = gluon.nn.Embedding(20, 8)
            self.lstm = rnn.LSTM(8, input_size=8, projection_size=4,
                                 bidirectional=sys.argv[1] == "1")
            self.out = gluon.nn.Dense(3)

    def hybrid_forward(self, F, words):
        x = self.emb(F.array(words)).reshape((len(words), 1, 8))
        return self.out(self.lstm(x)[-1])

mx.random.seed(0)
rs = random.Random(0)
model = Tagger()
model.initialize(mx.init.Xavier())
sentences = [[rs.randrange(20) for _ in range(rs.randint(1, 9))] for _ in range(6)]
want = [model(s).asnumpy() for s in sentences]
for settings in ({}, {"compiled": "step"}, {"granularity": "op"}):
    with gdb.batching(**settings):
        got = [model(s) for s in sentences]
    print("max diff", max(float(np.abs(g.asnumpy() - w).max()) for g, w in zip(got, want)))
'''


@pytest.mark.parametrize("bidirectional", ["0", "1"])
def test_an_lstm_with_a_projection_called_without_states_runs_as_eager(bidirectional):
    """MXNet's RNN operator with a projection aborts the process when asked for
    no state outputs, which the padded call of a layer called without states
    asks for: such a layer runs as its code is written (in a child process)."""
    out = output_of_script(_PROJECTED, bidirectional)
    diffs = [float(line.split()[-1]) for line in out.splitlines()
             if line.startswith("max diff")]
    assert len(diffs) == 3 and max(diffs) < 1e-5
