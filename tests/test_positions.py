"""Slices at positions of a sample's own: the position recorded as data.

A pointer network reads ``H[i:i + 1]`` and ``scores[:, i:i + 1]`` at
positions each sample gives.  Once two samples slice one value at different
positions, the slice is recorded as a gather by a literal position
(``rewrite.positions``): new positions then take no new path through the
templates, and the results stay those of eager Gluon.  A loop over a
sample's rows keeps its slices (they vectorise whole).
"""
import random

import numpy as np
import pytest
from mxnet import autograd, nd
from mxnet.gluon import nn

import gluon_dynbatch as gdb
import user_models as um
from dynbatch_testing import assert_batched_equals_eager, assert_same

WORDS, HIDDEN = 5, 4
MODES = [{"strategy": s, "compiled": c} for s in ("depth", "agenda")
         for c in (False, True, "step")]


class Projected(gdb.DynBatchBlock):
    """A sentence's words projected: ``self.rows(F, words, emb)`` is its (T, H) matrix."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(HIDDEN, flatten=False)

    def rows(self, F, words, emb):
        return F.tanh(self.proj(F.concat(*[emb[w:w + 1] for w in words], dim=0)))


class Pointer(Projected):
    """Rows and columns at the sample's own positions ``pointers``."""

    def hybrid_forward(self, F, sample, emb):
        words, pointers = sample
        H = self.rows(F, words, emb)
        parts = []
        for i in pointers:
            row = H[i:i + 1]
            scores = F.log_softmax(F.dot(row, H, transpose_b=True))
            parts += [row * F.sum(H, axis=0, keepdims=True), scores[:, i:i + 1],
                      F.tanh(row)[:, i % HIDDEN:i % HIDDEN + 1]]
        return F.concat(*parts, dim=1)


class RowLoop(Projected):
    """Every row of the sample's matrix in turn: positions fixed by the loop."""

    def hybrid_forward(self, F, words, emb):
        H = self.rows(F, words, emb)
        return sum(H[t:t + 1] * (t + 1) for t in range(len(words)))


TAGS = 4


class GoldPath(gdb.DynBatchBlock):
    """A CRF's score of a sample's gold tags: rows and entries of weights
    (``trans[prev, tag]``, ``start[0, tag]``, ``trans[prev][tag]``) and of
    the emissions at the tags each sample gives."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.emit = nn.Dense(TAGS, in_units=3)
            self.trans = self.params.get("trans", shape=(TAGS, TAGS))
            self.start = self.params.get("start", shape=(1, TAGS))

    def hybrid_forward(self, F, sample, trans, start):
        x, tags = sample
        e = self.emit(x)
        score = start[0, tags[0]] + e[0, tags[0]]
        for i in range(1, len(tags)):
            pair = trans[tags[i - 1], tags[i]] if i % 2 else trans[tags[i - 1]][tags[i]]
            score = score + pair + e[i][tags[i]]
        return score


def _tagged(seed, n, length=None):
    r = random.Random(seed)
    samples = []
    for _ in range(n):
        size = length or r.randint(1, 6)
        samples.append((nd.array(np.random.RandomState(r.randrange(99)).uniform(
            -1, 1, (size, 3))), [r.randrange(TAGS) for _ in range(size)]))
    return samples


def _score_trie(model, samples):
    with gdb.batching() as scope:
        outs = [model(s) for s in samples]
        root = scope.recorder.frame_root(model)
    nd.waitall()
    del outs
    return root


def test_weights_at_a_samples_own_tags_take_no_new_path():
    model = _model(GoldPath)
    _score_trie(model, _tagged(0, 2, 4))        # parameters get their shapes
    root = _score_trie(model, _tagged(1, 8, 4))
    learned = root.counter[0]
    assert {"take", "pick"} <= _ops_learned(root)
    again = _score_trie(model, _tagged(2, 8, 4))
    assert again is root and root.counter[0] == learned


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "%(strategy)s-%(compiled)s" % m)
def test_gold_path_scores_equal_eager(mode):
    model = _model(GoldPath)
    _score_trie(model, _tagged(3, 8))           # tags already known to vary
    case = um.Case(model, _tagged(4, 7), [])
    assert_same(um.run_case(case, mode), um.run_case(case))


def _samples(seed, n, pointers=2):
    r = random.Random(seed)
    return [([r.randrange(20) for _ in range(WORDS)],
             [r.randrange(WORDS) for _ in range(pointers)]) for _ in range(n)]


def _case(model, samples):
    emb = nd.array(np.random.RandomState(0).uniform(-1, 1, (20, 3)))
    return um.Case(model, samples, [emb])


def _model(cls, seed=0):
    return um._init(cls(), seed)   # pylint: disable=protected-access


def _ops_learned(root):
    """Names of the operators on every edge of a template trie."""
    names, todo = set(), [root]
    while todo:
        state = todo.pop()
        for key, nxt in state.next.items():
            if hasattr(key[0], "name"):
                names.add(key[0].name)
            todo.append(nxt)
    return names


def _trie_after(model, samples):
    with gdb.batching() as scope:
        outs = [model(s, _EMB) for s in samples]
        root = scope.recorder.frame_root(model)
    nd.waitall()
    del outs
    return root


_EMB = nd.array(np.random.RandomState(1).uniform(-1, 1, (20, 3)))


def test_new_positions_take_no_new_path():
    model = _model(Pointer)
    _trie_after(model, _samples(0, 2))          # parameters get their shapes
    root = _trie_after(model, _samples(1, 8))
    learned = root.counter[0]
    assert {"take", "pick"} <= _ops_learned(root)
    again = _trie_after(model, _samples(2, 8))
    assert again is root and root.counter[0] == learned


def test_loop_over_rows_keeps_its_slices():
    model = _model(RowLoop)
    _trie_after(model, [[0] * WORDS])
    root = _trie_after(model, [[r] * WORDS for r in range(6)])
    ops = _ops_learned(root)
    assert "slice_axis" in ops and "take" not in ops


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "%(strategy)s-%(compiled)s" % m)
def test_pointer_slices_equal_eager(mode):
    model = _model(Pointer)
    _trie_after(model, _samples(3, 6))          # positions already known to vary
    case = _case(model, _samples(4, 7))
    eager = um.run_case(case)
    batched = um.run_case(case, mode)
    assert_same(batched, eager)


def test_reference_strategy_records_slices_as_written():
    model = _model(Pointer)
    _trie_after(model, _samples(5, 6))
    case = _case(model, _samples(6, 4))
    with autograd.record():
        with gdb.batching(strategy="reference") as scope:
            outs = case.outputs()
            ops = _ops_learned(scope.recorder.frame_root(model))
    assert "take" not in ops and "pick" not in ops
    assert_same(um.run_case(case, {"strategy": "reference"}), um.run_case(case))
    del outs


class Tail(gdb.DynBatchBlock):
    """``F.slice_axis`` of a sample's rows from its own ``begin`` to its ``end``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(3, in_units=HIDDEN)

    def hybrid_forward(self, F, x, begin, end):
        h = F.tanh(self.proj(x))
        return F.sum(F.slice_axis(h, axis=0, begin=begin, end=end), axis=0, keepdims=True)


@pytest.mark.parametrize("bounds", [[(0, 1), (2, 3), (-1, None), (3, None)],
                                    [(0, -1), (1, -2), (2, -1), (1, -1)],
                                    [(-3, -1), (-2, 5), (0, 2), (-5, None)]],
                         ids=["end None", "end negative", "begin negative"])
def test_slice_axis_at_positions_counted_from_the_end_equals_eager(bounds):
    """``end=None`` and negative bounds, as MXNet counts them: the slice pass's
    shape check subtracted the raw bounds (a TypeError, or an internal error)."""
    model = Tail()
    model.initialize()
    xs = [nd.random.uniform(-1, 1, shape=(5, HIDDEN)) for _ in bounds]
    assert_batched_equals_eager(model, [(x, b, e) for x, (b, e) in zip(xs, bounds)])
