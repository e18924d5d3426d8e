"""Idioms of search code inside samples: what gluonnlp's beam search does.

A sample's search runs under ``autograd.pause()`` between recorded parts and
gathers rows of its own states by indices it computed.  Both batch across
samples, and results and gradients equal eager Gluon's.
"""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

import gluon_dynbatch as gdb
from dynbatch_testing import assert_same, check_all_strategies, make_model, run_model

HIDDEN = 6


class PausedSearch(gdb.DynBatchBlock):
    """Encode a sentence (recorded), pick rows of the encoding by indices found
    under ``autograd.pause()`` (with a read: which row scores best), score the
    picked rows (recorded again)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.enc = nn.Dense(HIDDEN, flatten=False)
            self.score = nn.Dense(1, flatten=False)

    def hybrid_forward(self, F, words, emb):
        states = F.tanh(self.enc(F.take(emb, F.array(words))))         # (T, H)
        with autograd.pause():
            scores = F.sum(states, axis=1)
            best = int(F.argmax(scores, axis=0).asscalar())
            order = F.argsort(scores, is_ascend=False)                  # computed indices
            width = mx.nd.full((1,), 2, ctx=states.context)
        kept = F.take(states, F.slice_axis(order, axis=0, begin=0, end=2))
        picked = F.take(states, F.array([best]))
        return self.score(F.concat(kept, picked, dim=0)) * F.sum(width)


def _sentences(seed, n):
    rs = np.random.RandomState(seed)
    return [[int(w) for w in rs.randint(0, 9, rs.randint(2, 6))] for _ in range(n)]


def test_searches_under_pause_batch_across_samples_and_equal_eager():
    model = make_model(PausedSearch)
    emb = nd.array(np.random.RandomState(1).uniform(-1, 1, (9, 4)))
    samples = _sentences(0, 12)
    stats = check_all_strategies(model, samples, [emb], strategies=("depth",),
                                 compiled=(False, True))
    for found in stats.values():
        # One round per change of autograd's modes and per read, for all 12
        # samples together: not a flush per sample.
        assert found.flushes <= 4, found
        assert found.eager_samples == 0


class Choose(gluon.HybridBlock):
    """Rows of states by indices, both given (gluonnlp's ``_choose_states``)."""

    def hybrid_forward(self, F, states, indices):
        return F.take(states, indices) * 2


class OwnTable(gdb.DynBatchBlock):
    """Rows of a table computed in the sample, by indices computed too: some
    negative, some past the table's end, some fractional (``take`` clips)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(HIDDEN, flatten=False)
            self.choose = Choose()

    def hybrid_forward(self, F, words, emb):
        table = F.tanh(self.proj(F.take(emb, F.array(words))))         # (T, H)
        idx = F.sum(table, axis=1) * 4.0 + 1.0                          # (T,), any value
        rows = self.choose(table, F.BlockGrad(idx))
        with autograd.pause():      # the sample's own frame ends: a frame per child call
            kept = self.choose(table, F.argmax(table, axis=1))
        ints = F.take(table, F.BlockGrad(F.argmax(table, axis=1)).astype("int32"))
        return rows + ints * kept


def test_takes_from_each_samples_own_table_batch_and_clip_as_eager():
    model = make_model(OwnTable)
    emb = nd.array(np.random.RandomState(2).uniform(-1, 1, (9, 4)))
    samples = _sentences(3, 10)
    stats = check_all_strategies(model, samples, [emb], strategies=("depth",),
                                 compiled=(False, True))
    # The takes of all 10 samples are a few steps, not 10 of their own each.
    assert stats[("depth", False, "op")].steps < 30
    assert stats[("depth", False)].steps < 30
