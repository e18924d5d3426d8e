"""Grafts: a child block's calls learned on one path, copied onto new paths.

Sentences whose words have different character counts take a new path
through the templates at every word; the word LSTM's cell is still traced
only the first time it is called from its line with its argument shapes,
no call shape is analysed twice, and the results stay those of eager Gluon
in every mode.
"""
import random

import numpy as np
import pytest
from mxnet import nd
from mxnet.gluon import nn, rnn

import gluon_dynbatch as gdb
import user_models as um
from dynbatch_testing import assert_same

MODES = [{"strategy": s, "compiled": c} for s in ("depth", "agenda")
         for c in (False, True, "step")]


class CountedCell(rnn.LSTMCell):
    """An LSTM cell whose traces (runs of its Python code) ``_count_traces`` counts.

    The count is kept outside the cell's code: a cell counting its own runs
    acts besides computing, so its code would run at every call
    (``record/purity.py``)."""

    traced = 0


def _count_traces(monkeypatch):
    from gluon_dynbatch.record.recorder import Recorder
    trace = Recorder.trace

    def counting(self, block, args):
        if isinstance(block, CountedCell):
            CountedCell.traced += 1
        return trace(self, block, args)
    monkeypatch.setattr(Recorder, "trace", counting)


class CharWords(gdb.DynBatchBlock):
    """Each word the max over its characters' vectors, then a word LSTM."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.chars = nn.Dense(6, flatten=False)
            self.cell = CountedCell(5)
            self.out = nn.Dense(3)

    def hybrid_forward(self, F, words, table):
        state = self.cell.begin_state(batch_size=1)
        outs = []
        for chars in words:
            rows = F.concat(*[table[c:c + 1] for c in chars], dim=0)
            vec = F.max(F.tanh(self.chars(rows)), axis=0, keepdims=True)
            out, state = self.cell(vec, state)
            outs.append(self.out(out))
        return F.concat(*outs, dim=0)


def _sentences(seed, n):
    r = random.Random(seed)
    return [[[r.randrange(20) for _ in range(r.randint(1, 6))] for _ in range(r.randint(2, 5))]
            for _ in range(n)]


def _case(model, samples):
    return um.Case(model, samples, [nd.array(np.random.RandomState(0).uniform(-1, 1, (20, 4)))])


def test_new_paths_do_not_trace_the_cell_again(monkeypatch):
    _count_traces(monkeypatch)
    model = um._init(CharWords(), 0)  # pylint: disable=protected-access
    case = _case(model, _sentences(0, 2))
    um.run_case(case, {})                     # parameters get their shapes
    um.run_case(_case(model, _sentences(1, 8)), {})
    before = CountedCell.traced
    fresh = _case(model, _sentences(2, 16))
    um.run_case(fresh, {})
    words = sum(len(s) for s in fresh.samples)
    # Traced at most once per word position (a longer sentence than seen), never per word.
    assert CountedCell.traced - before <= 5 < words


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "%(strategy)s-%(compiled)s" % m)
def test_grafted_calls_equal_eager(mode):
    model = um._init(CharWords(), 1)  # pylint: disable=protected-access
    um.run_case(_case(model, _sentences(3, 6)), mode)
    case = _case(model, _sentences(4, 9))
    assert_same(um.run_case(case, mode), um.run_case(case))


def test_new_paths_analyse_no_known_call_shape(monkeypatch):
    from gluon_dynbatch.ir import calls
    model = um._init(CharWords(), 2)  # pylint: disable=protected-access
    every_count = [[[k % 20] * k for k in range(1, 7)], [[3] * k for k in range(6, 0, -1)]]
    every_length = [[[4, 5]] * n for n in range(2, 6)]      # sentences of every word count
    um.run_case(_case(model, every_count), {})
    um.run_case(_case(model, every_count + every_length + _sentences(5, 6)), {})
    analysed = []
    original = calls.analyse
    monkeypatch.setattr(calls, "analyse", lambda *a: analysed.append(1) or original(*a))
    fresh = _case(model, _sentences(6, 12))
    um.run_case(fresh, {})
    assert not analysed
