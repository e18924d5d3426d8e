"""Idioms of search code inside samples: what gluonnlp's beam search does.

A sample's search runs under ``autograd.pause()`` between recorded parts and
gathers rows of its own states by indices it computed.  Both batch across
samples, and results and gradients equal eager Gluon's.
"""
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

import gluon_dynbatch as gdb
from gluon_dynbatch.record import trie
from dynbatch_testing import check_all_strategies, make_model

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


def _every_mode(cls, seed, samples):
    """``check_all_strategies`` of a fresh ``cls`` on ``samples`` sentences over a
    (9, 4) table drawn with ``seed``: eager, reference, depth (imperative and
    compiled) and operator by operator; the stats of each run."""
    model = make_model(cls)
    emb = nd.array(np.random.RandomState(seed).uniform(-1, 1, (9, 4)))
    return check_all_strategies(model, _sentences(seed + 1, samples), [emb],
                                strategies=("depth",), compiled=(False, True))


def test_searches_under_pause_batch_across_samples_and_equal_eager():
    stats = _every_mode(PausedSearch, 1, 12)
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
    stats = _every_mode(OwnTable, 2, 10)
    # The takes of all 10 samples are a few steps, not 10 of their own each.
    assert stats[("depth", False, "op")].steps < 30
    assert stats[("depth", False)].steps < 30


class Shift(gluon.HybridBlock):
    """A block without parameters, made with a number (as gluonnlp's search
    makes its step block, with the beam size, for every search)."""

    def __init__(self, by, **kwargs):
        super().__init__(**kwargs)
        self._by = by

    def hybrid_forward(self, F, x):
        return F.tanh(x) * self._by + self._by


class MakesItsBlocks(gdb.DynBatchBlock):
    """Makes a new ``Shift`` for every call, hybridized as gluonnlp's are."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3)

    def hybrid_forward(self, F, x, by):
        shift = Shift(by)
        shift.hybridize()
        h = self.dense(x)
        with autograd.pause():      # the call's own frame ends: the block has one of its own
            scale = shift(h)
        return h * scale


def _learned():
    return sum(root.counter[0] for root in trie.store().roots.values())


def test_blocks_made_alike_in_every_call_share_their_templates():
    model = make_model(MakesItsBlocks)
    rs = np.random.RandomState(5)

    def batch():
        return [(nd.array(rs.uniform(-1, 1, (2, 4))), [1.0, 2.0][k % 2]) for k in range(6)]

    for samples in (batch(), batch()):
        want = [model(x, by).asnumpy() for x, by in samples]
        before = _learned()
        with gdb.batching():
            got = [model(x, by) for x, by in samples]
        for g, w in zip(got, want):     # a block made with 2.0 is not one made with 1.0
            np.testing.assert_allclose(g.asnumpy(), w, rtol=1e-5, atol=1e-6)
    # The second batch's blocks are new objects, made like the first's: no
    # template is learned again.
    assert _learned() == before
