"""Broadcasts of one-row values with lower-rank values computed per sample.

``x + F.sum(h, axis=0)`` adds a (1, H) row and an (H,) vector, as numpy
broadcasting allows.  Each sample's vector is its own, so it batches as that
sample's row: these models must run in a few steps, exactly.
"""
import random

import numpy as np
import pytest
from mxnet import gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import check_all_strategies, make_model, random_tree

H, E = 5, 4


class TreeOfVectors(gdb.DynBatchBlock):
    """Children's states summed without keepdims (an (H,) vector) and added to a
    node's (1, H) row; with ``argument=True`` the sum is passed to a helper block."""

    def __init__(self, argument=False, **kwargs):
        super().__init__(**kwargs)
        self.argument = argument
        with self.name_scope():
            self.inp = gluon.nn.Dense(H)
            self.u = gluon.nn.Dense(H, use_bias=False)
            self.mix = Mix()

    def hybrid_forward(self, F, tree, table):
        x = self.inp(table[tree.word:tree.word + 1])
        if tree.children:
            kids = F.concat(*[self(child, table) for child in tree.children], dim=0)
            total = F.sum(self.u(kids), axis=0)                 # (H,)
            x = self.mix(x, total) if self.argument else x + total
        return F.tanh(x)


class Mix(gluon.HybridBlock):
    """``x * sigmoid(v) - v`` of a (1, H) row and an (H,) vector given as arguments."""

    def hybrid_forward(self, F, x, v):
        return x * F.sigmoid(v) - v


class SentenceContext(gdb.DynBatchBlock):
    """A sentence's mean (H,) scales every step's (1, H) state; a (1,) per-sample
    number broadcast too; a (H,) bias parameter added as well."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = gluon.nn.Dense(H, flatten=False)
            self.cell = gluon.rnn.GRUCell(H)
            self.bias = self.params.get("bias", shape=(H,))

    def hybrid_forward(self, F, words, table, bias):
        x = self.proj(F.concat(*[table[w:w + 1] for w in words], dim=0))
        context = F.mean(x, axis=0)                             # (H,)
        scale = F.max(F.sum(x, axis=1), axis=0, keepdims=True)  # (1,)
        h = F.zeros((1, H))
        for t in range(len(words)):
            h, _ = self.cell(x[t:t + 1], [h])
            h = F.broadcast_mul(h, F.sigmoid(context)) + bias
        return F.broadcast_sub(h, context) * F.tanh(scale)


def _trees(seed, count=7):
    rng = random.Random(seed)
    return [random_tree(rng, 10, max_depth=3, arities=(0, 1, 2, 3)) for _ in range(count)]


def _table(seed=0):
    return nd.array(np.random.RandomState(seed).uniform(-1, 1, (10, E)))


@pytest.mark.parametrize("argument", [False, True])
def test_tree_adding_each_nodes_vector_to_its_row_batches_by_level(argument):
    model = make_model(TreeOfVectors, argument=argument)
    trees, table = _trees(0), _table()
    check_all_strategies(model, trees, [table])
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(tree, table) for tree in trees]
    nd.waitall()
    assert len(outs) == len(trees)
    depth = max(_height(tree) for tree in trees)
    # Every node of a level in one step (as when written with keepdims=True).
    assert len(scope.last_plan.steps) <= depth + 1


def _height(tree):
    return 1 + max((_height(child) for child in tree.children), default=0)


def test_sentence_vectors_broadcast_onto_each_step_batch_across_sentences():
    model = make_model(SentenceContext)
    rng = random.Random(1)
    sentences = [[rng.randrange(10) for _ in range(n)] for n in (3, 1, 4, 2, 4, 3)]
    table = _table(1)
    check_all_strategies(model, sentences, [table])
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(words, table) for words in sentences]
    nd.waitall()
    assert len(outs) == len(sentences)
    # A step per token position (and a few more), not per sentence and token.
    assert len(scope.last_plan.steps) < sum(len(s) for s in sentences)


class CenteredRows(gdb.DynBatchBlock):
    """Each word's row minus the sentence's mean (an (H,) vector), plus an
    attention context summed without keepdims: (T, H) and (H,) broadcast."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = gluon.nn.Dense(H, flatten=False)
            self.att = gluon.nn.Dense(1, flatten=False)

    def hybrid_forward(self, F, words, table):
        x = F.tanh(self.proj(F.concat(*[table[w:w + 1] for w in words], dim=0)))
        centred = x - F.mean(x, axis=0)
        context = F.sum(F.softmax(self.att(x), axis=0) * x, axis=0)      # (H,)
        mixed = F.broadcast_mul(centred, F.sigmoid(context)) + context
        return F.max(mixed, axis=0, keepdims=True)


def test_rows_of_each_sentence_and_its_own_vectors_batch_across_lengths():
    model = make_model(CenteredRows)
    rng = random.Random(2)
    sentences = [[rng.randrange(10) for _ in range(n)] for n in (3, 1, 4, 2, 4, 3, 5)]
    table = _table(2)
    check_all_strategies(model, sentences, [table])
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(words, table) for words in sentences]
    nd.waitall()
    assert len(outs) == len(sentences)
    assert len(scope.last_plan.steps) < len(set(map(len, sentences)))


class GatedLoop(gdb.DynBatchBlock):
    """A gate vector (H,) of the sentence scales the state at every token; the last
    output plus the gate: additions of a row and a vector are no sum of rows."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = gluon.rnn.LSTMCell(H)
            self.gate = gluon.nn.Dense(H)

    def hybrid_forward(self, F, words, table):
        rows = F.concat(*[table[w:w + 1] for w in words], dim=0)
        gate = F.sigmoid(self.gate(rows)).max(axis=0)                  # (H,)
        states = self.cell.begin_state(1)
        for w in words:
            out, states = self.cell(table[w:w + 1], states)
            states = [states[0] * gate, states[1]]
        return out + gate


def test_a_vector_added_to_a_loops_last_row_is_no_sum_of_rows():
    model = make_model(GatedLoop)
    rng = random.Random(3)
    sentences = [[rng.randrange(10) for _ in range(n)] for n in (3, 1, 4, 2, 4)]
    check_all_strategies(model, sentences, [_table(3)])
