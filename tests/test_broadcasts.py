"""Broadcasts between values of a sample's own, of every rank.

Additive (Bahdanau) attention scores a query against every key with a
broadcast: ``F.broadcast_add(F.expand_dims(q, axis=2), F.expand_dims(K,
axis=1))`` of a (1, 1, H) query and (1, T, H) keys is (1, 1, T, H).  The
recorded shape of every such call must be the shape MXNet computes, and the
values and gradients eager Gluon's, whatever the ranks and which operand is
the wider one.
"""
import itertools

import numpy as np
import pytest
from mxnet import gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import check_all_strategies, make_model

H = 4
LENGTHS = (3, 5, 2, 3, 4, 1)


class Additive(gdb.DynBatchBlock):
    """``softmax(v . tanh(Wq q + Wk K))`` over a sentence's keys, then the context."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.wq = gluon.nn.Dense(H, flatten=False, use_bias=False)
            self.wk = gluon.nn.Dense(H, flatten=False, use_bias=False)
            self.v = gluon.nn.Dense(1, flatten=False, use_bias=False)

    def hybrid_forward(self, F, sample):
        keys, query = sample                                     # (1, T, H), (1, 1, H)
        scores = F.broadcast_add(F.expand_dims(self.wq(query), axis=2),
                                 F.expand_dims(self.wk(keys), axis=1))   # (1, 1, T, H)
        energy = F.reshape(self.v(F.tanh(scores)), shape=(1, 1, -1))      # (1, 1, T)
        weights = F.softmax(energy, axis=-1)
        return F.batch_dot(weights, keys), weights


def _sentences(seed, lengths=LENGTHS):
    rng = np.random.RandomState(seed)
    return [(nd.array(rng.uniform(-1, 1, (1, t, H))), nd.array(rng.uniform(-1, 1, (1, 1, H))))
            for t in lengths]


def test_additive_attention_scores_over_three_dimensional_inputs_are_exact():
    model = make_model(Additive)
    check_all_strategies(model, _sentences(0), [])
    with gdb.batching():
        outs = [model(s) for s in _sentences(1)]
    for (_, weights), length in zip(outs, LENGTHS):
        assert weights.shape == (1, 1, length)
        np.testing.assert_allclose(weights.asnumpy().sum(), 1.0, rtol=1e-5)


class GluonNLPAttention(gdb.DynBatchBlock):
    """gluonnlp's own attention cells over a sentence: query (1, 1, H), keys (1, T, H)."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        from gluonnlp.model import attention_cell
        with self.name_scope():
            self.proj = gluon.nn.Dense(H, flatten=False)
            if kind == "mlp":
                self.cell = attention_cell.MLPAttentionCell(units=H, normalized=False)
            else:
                self.cell = attention_cell.DotProductAttentionCell(scaled=True)

    def hybrid_forward(self, F, sample):
        keys, query = sample
        context, weights = self.cell(query, self.proj(keys))
        return context, weights


@pytest.mark.parametrize("kind", ["mlp", "dot"])
def test_gluonnlp_attention_cells_are_exact(kind):
    pytest.importorskip("gluonnlp")
    model = make_model(GluonNLPAttention, kind=kind)
    check_all_strategies(model, _sentences(2), [], strategies=("depth",))


class Broadcast(gdb.DynBatchBlock):
    """``op(a, b)`` of two values of the sample, each an expand_dims of its rows."""

    def __init__(self, left, right, op, **kwargs):
        super().__init__(**kwargs)
        self.left, self.right, self.op = left, right, op
        with self.name_scope():
            self.proj = gluon.nn.Dense(H, flatten=False)

    def hybrid_forward(self, F, sample):
        keys, query = sample                                     # (1, T, H), (1, 1, H)
        a = self.proj(keys)
        b = F.tanh(query)
        for axis in self.left:
            a = F.expand_dims(a, axis=axis)
        for axis in self.right:
            b = F.expand_dims(b, axis=axis)
        out = getattr(F, self.op)(a, b)
        return F.sum(out * out, axis=-1, keepdims=True), out


# Where each operand gets its unit axes: every placement that broadcasts.
PLACEMENTS = [((), ()), ((1,), (2,)), ((2,), (1,)), ((0,), (0,)), ((1, 1), (2, 2)),
              ((3,), (3,))]


@pytest.mark.parametrize("left,right", PLACEMENTS)
@pytest.mark.parametrize("op", ["broadcast_add", "broadcast_mul"])
def test_broadcasts_of_every_rank_match_eager(left, right, op):
    model = make_model(Broadcast, left=left, right=right, op=op)
    sentences = _sentences(3)
    check_all_strategies(model, sentences, [], strategies=("depth",))
    with gdb.batching():
        outs = [model(s)[1] for s in sentences]
    eager = [model(s)[1] for s in sentences]
    assert [o.shape for o in outs] == [e.shape for e in eager]


def test_a_reshape_that_changes_the_number_of_elements_is_refused():
    class Bad(gdb.DynBatchBlock):
        def hybrid_forward(self, F, x):
            return F.reshape(F.tanh(x), shape=(1, 2))

    model = Bad()
    with pytest.raises(gdb.BatchingError, match="sample 0.*number of elements"):
        with gdb.batching():
            model(nd.ones((1, 3)))
    with gdb.batching():                        # the next batch works
        out = model(nd.ones((1, 2)))
    assert out.shape == (1, 2)


def test_recorded_shapes_equal_what_mxnet_computes_for_the_call_as_written():
    # Every pair of ranks 2-4 of (rows, H) values, against eager shapes.
    class Pairwise(gdb.DynBatchBlock):
        def hybrid_forward(self, F, sample, lead):
            keys, query = sample
            a = F.reshape(F.tanh(keys), shape=lead[0] + keys.shape)
            b = F.reshape(F.sigmoid(query), shape=lead[1] + query.shape)
            return F.broadcast_add(a, b)

    model = Pairwise()
    sentences = _sentences(4)
    for lead in itertools.product([(), (1,), (1, 1)], repeat=2):
        eager = [model((k[0], q[0]), lead).shape for k, q in sentences]
        with gdb.batching():
            outs = [model((k[0], q[0]), lead) for k, q in sentences]
        assert [o.shape for o in outs] == eager
        for out, (k, q) in zip(outs, sentences):
            np.testing.assert_allclose(out.asnumpy(), model((k[0], q[0]), lead).asnumpy(),
                                       rtol=1e-5, atol=1e-6)
