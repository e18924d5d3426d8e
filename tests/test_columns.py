"""Attention over a sample's own rows is recorded in column form (``columns.py``).

Each model is checked against eager Gluon (outputs and every gradient) in
every strategy and compiled mode, and its plan against what the rewrite is
for: the scores, their softmax and the weighted sum of sentences of every
length run as one step each.
"""
import math
import random

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd
from mxnet.gluon import nn

import gluon_dynbatch as gdb
from dynbatch_testing import assert_same, check_all_strategies, make_model, run_model

H = 4
LENGTHS = (1, 1, 2, 3, 4, 5, 6)


def _sentences(seed):
    rng = random.Random(seed)
    return [[rng.randrange(10) for _ in range(n)] for n in LENGTHS]


def _table(seed=0):
    return nd.array(np.random.RandomState(seed).uniform(-1, 1, (10, H)))


def _dot_attention(F, block, keys):
    scores = F.dot(block.query(keys[-1:]), keys, transpose_b=True)          # (1, T)
    return F.dot(F.softmax(scores, axis=1), keys)


def _scaled(F, block, keys):
    scores = F.dot(block.query(keys[-1:]), keys, transpose_b=True) / math.sqrt(H)
    weights = F.softmax(F.tanh(scores) * 2.0 - 1.0)
    return F.dot(weights, F.tanh(keys))


def _transposed_column(F, block, keys):
    weights = F.softmax(block.score(keys).T, axis=-1)                        # (T, 1).T
    return F.dot(weights, keys)


def _concatenated_scores(F, block, keys):
    scores = F.concat(*[block.score(keys[k:k + 1]) for k in range(keys.shape[0])], dim=1)
    return F.dot(F.exp(F.log_softmax(scores, axis=-1)), keys)


def _direct_mx_nd(F, block, keys):
    scores = mx.nd.dot(block.query(keys[-1:]), keys, transpose_b=True)
    return mx.nd.dot(mx.nd.softmax(-scores), keys)


def _weights_returned(F, block, keys):
    weights = F.softmax(F.dot(block.query(keys[-1:]), keys, transpose_b=True))
    return F.dot(weights, keys), F.sum(weights * weights, axis=1, keepdims=True)


def _column_query(F, block, keys):
    scores = F.dot(keys, block.query(keys[-1:]), transpose_b=True)          # (T, 1)
    return F.sum(F.softmax(scores, axis=0) * keys, axis=0, keepdims=True)


def _transposed_query(F, block, keys):
    scores = F.dot(keys, block.query(keys[-1:]).T)                           # (T, 1)
    return F.dot(F.softmax(scores, axis=0).T, keys)


def _vector_scores(F, block, keys):
    scores = F.sum(F.broadcast_mul(keys, block.query(keys[-1:])), axis=1)     # (T,)
    return F.dot(F.softmax(scores.reshape((1, -1))), keys)


def _batch_dot(F, block, keys):
    query, rows = block.query(keys[-1:]).expand_dims(0), keys.expand_dims(0)
    weights = F.softmax(F.batch_dot(query, rows, transpose_b=True), axis=-1)  # (1, 1, T)
    return F.batch_dot(weights, rows).reshape((1, H))


def _masked(F, block, keys):
    scores = F.dot(block.query(keys[-1:]), keys, transpose_b=True)
    scores = scores - 1e4 * (scores < -0.5)
    return F.dot(F.softmax(scores), keys)


def _stacked_outputs(F, block, keys):
    stacked = F.stack(*[keys[k:k + 1] for k in range(keys.shape[0])], axis=1)   # (1, T, H)
    scores = F.batch_dot(stacked, block.query(keys[-1:]).expand_dims(2))      # (1, T, 1)
    context = F.sum(F.broadcast_mul(stacked, F.softmax(scores, axis=1)), axis=1)
    return context + F.max(stacked, axis=1) * F.mean(F.tanh(stacked), axis=1)


FORMS = {"dot_attention": _dot_attention, "scaled": _scaled,
         "transposed_column": _transposed_column,
         "concatenated_scores": _concatenated_scores, "direct_mx_nd": _direct_mx_nd,
         "weights_returned": _weights_returned, "column_query": _column_query,
         "transposed_query": _transposed_query, "vector_scores": _vector_scores,
         "batch_dot": _batch_dot, "masked": _masked, "stacked_outputs": _stacked_outputs}


class Attention(gdb.DynBatchBlock):
    """One of ``FORMS`` over a sentence's rows, then a classifier."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = FORMS[form]
        with self.name_scope():
            self.rows = nn.Dense(H, in_units=H, activation="tanh")
            self.query = nn.Dense(H, in_units=H)
            self.score = nn.Dense(1, in_units=H)
            self.out = nn.Dense(3, in_units=H)

    def hybrid_forward(self, F, words, table):
        keys = self.rows(F.concat(*[table[w:w + 1] for w in words], dim=0))   # (T, H)
        found = self.form(F, self, keys)
        if isinstance(found, tuple):
            return self.out(found[0]), found[1]
        return self.out(found)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_attention_over_sentences_of_every_length_is_one_step_each(form):
    model = make_model(Attention, form=form)
    samples, table = _sentences(0), _table()
    check_all_strategies(model, samples, [table], strategies=("depth",), compiled=(False,))
    with gdb.batching(keep_plan=True, granularity="op") as scope:
        outs = [model(words, table) for words in samples]
    nd.waitall()
    assert len(outs) == len(samples)
    names = [step.nodes[0].op.name for step in scope.last_plan.steps]
    if form == "weights_returned":
        return          # the (1, T) weights themselves are made per length
    assert not set(names) & {"dot", "batch_dot"}, names
    # A step of one length would hold one sentence (two for length 1).
    assert min(len(step.nodes) for step in scope.last_plan.steps) >= 2, names


class RowsOfTwoLayouts(gdb.DynBatchBlock):
    """Two rows whose bases hold the same values in two layouts: a (1, T)
    transpose of a (T, 1) column, and the reshape of a (T,) vector."""

    def hybrid_forward(self, F, words, table):
        x = F.concat(*[table[w:w + 1] for w in words], dim=0)[:, 0:1]       # (T, 1)
        row = F.transpose(F.tanh(x))                                        # (1, T) of (T, 1)
        vector = F.tanh(row[0])                                             # (T,)
        return F.sum(row + vector.reshape((1, -1)), axis=1, keepdims=True)


def test_rows_of_bases_in_two_layouts_add_as_written():
    # Their bases, a (T, 1) column and a (T,) vector, would broadcast to (T, T).
    model = make_model(RowsOfTwoLayouts)
    check_all_strategies(model, _sentences(1), [_table()])


class PoolsByLearnedQuery(gdb.DynBatchBlock):
    """Attention pooling with a learned query (a Set Transformer's pooling, a
    hierarchical attention network's context vector), scores as a row or as
    a column."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.rows = nn.Dense(H, in_units=H, activation="tanh")
            self.query = self.params.get("query", shape=(1, H))
            self.out = nn.Dense(3, in_units=H)

    def hybrid_forward(self, F, words, table, query):
        keys = self.rows(F.concat(*[table[w:w + 1] for w in words], dim=0))   # (T, H)
        if self.form == "row":
            weights = F.softmax(F.dot(query, keys, transpose_b=True) / math.sqrt(H), axis=1)
            return self.out(F.dot(weights, keys))
        weights = F.softmax(F.dot(keys, query, transpose_b=True), axis=0)      # (T, 1)
        return self.out(F.dot(weights, F.tanh(keys), transpose_a=True))


@pytest.mark.parametrize("form", ["row", "column"])
def test_attention_pooling_by_a_learned_query_is_one_step_each(form):
    """A learned query is a weight, and the row of its scores was recorded as
    written, as was the weighted sum ``dot(w, V, transpose_a=True)`` of a column
    of weights: steps of one sentence length each."""
    model = make_model(PoolsByLearnedQuery, form=form)
    samples, table = _sentences(2), _table()
    check_all_strategies(model, samples, [table], strategies=("depth", "agenda"))
    assert_same(run_model(model, samples, [table], "depth"),
                run_model(model, samples, [table], "eager"))
    with gdb.batching(keep_plan=True, granularity="op") as scope:
        outs = [model(words, table) for words in samples]
    nd.waitall()
    assert len(outs) == len(samples)
    names = [step.nodes[0].op.name for step in scope.last_plan.steps]
    # ``dot(keys, query, transpose_b=True)`` batches by rows as it is.
    assert form == "column" or "dot" not in names, names
    assert min(len(step.nodes) for step in scope.last_plan.steps) >= 2, names
