"""Splits, slices and reshapes of reshaped values read rows of the source (``reshapes.py``).

Each model is checked against eager Gluon (outputs and every gradient) in
every strategy and compiled mode, and its plan against what the rewrite is
for: sentences of different lengths share their steps.
"""
import random

import numpy as np
import pytest
from mxnet import autograd, nd
from mxnet.gluon import nn, rnn

import gluon_dynbatch as gdb
from dynbatch_testing import assert_same, check_all_strategies, make_model, run_model
from gluon_dynbatch.rewrite import reshapes

H = 4
LENGTHS = (1, 2, 3, 4, 5, 6)


def _sentences(seed, lengths=LENGTHS):
    rng = random.Random(seed)
    return [[rng.randrange(10) for _ in range(n)] for n in lengths]


def _table(seed=0):
    return nd.array(np.random.RandomState(seed).uniform(-1, 1, (10, H)))


class Unroll(gdb.DynBatchBlock):
    """``rnn.LSTMCell.unroll`` over the sentence, in either layout, outputs merged or not."""

    def __init__(self, layout, merge, **kwargs):
        super().__init__(**kwargs)
        self.layout, self.merge = layout, merge
        with self.name_scope():
            self.cell = rnn.LSTMCell(H, input_size=H)
            self.out = nn.Dense(3, in_units=H)

    def hybrid_forward(self, F, words, table):
        x = F.concat(*[table[w:w + 1] for w in words], dim=0)
        x = x.expand_dims(0 if self.layout == "NTC" else 1)
        outs, _ = self.cell.unroll(len(words), x, layout=self.layout,
                                   merge_outputs=self.merge)
        if not self.merge:
            last = outs[-1]
        elif self.layout == "NTC":
            last = outs[:, -1]
        else:
            last = outs[-1]
        return self.out(last)


@pytest.mark.parametrize("layout", ["NTC", "TNC"])
@pytest.mark.parametrize("merge", [False, True])
def test_unroll_over_sentences_of_every_length_shares_its_steps(layout, merge):
    model = make_model(Unroll, layout=layout, merge=merge)
    stats = check_all_strategies(model, _sentences(0), [_table()], strategies=("depth",),
                                 compiled=(False,))
    # One step per token position (the longest sentence has 6) and the
    # classifier; a split or stack of each length would add one per length.
    assert stats["depth"].steps <= max(LENGTHS) + 2, stats["depth"]


def _rows(F, table, words):
    return F.concat(*[table[w:w + 1] for w in words], dim=0)       # (T, H)


def _split_squeezed(F, x, dense):
    parts = F.split(x.expand_dims(0), axis=1, num_outputs=x.shape[0], squeeze_axis=True)
    parts = parts if isinstance(parts, list) else [parts]
    return F.add_n(*[F.tanh(dense(p)) for p in parts])


def _split_kept(F, x, dense):
    parts = F.split(x.expand_dims(0), axis=1, num_outputs=x.shape[0])
    parts = parts if isinstance(parts, list) else [parts]
    return F.add_n(*[F.tanh(dense(p.reshape((1, H)))) for p in parts])


def _stack_last(F, x, dense):
    hs = [F.tanh(dense(x[k:k + 1])) for k in range(x.shape[0])]
    return F.stack(*hs, axis=1)[:, -1] * 2


def _stack_slice(F, x, dense):
    stacked = F.stack(*[dense(x[k:k + 1]) for k in range(x.shape[0])], axis=1)  # (1, T, H)
    first = F.slice_axis(stacked, axis=1, begin=0, end=1).reshape((1, H))
    return F.tanh(first) + stacked[0].sum(axis=0, keepdims=True)


def _reshape_back(F, x, dense):
    back = x.expand_dims(0).reshape((x.shape[0], H))
    flat = back.reshape((-1,)).reshape((-1, H))
    return dense(F.sum(flat, axis=0, keepdims=True))


def _squeeze(F, x, dense):
    return dense(F.squeeze(x.expand_dims(1), axis=1)[-1:])


def _negative_stack_axis(F, x, dense):
    hs = [dense(x[k:k + 1]) for k in range(x.shape[0])]
    return F.stack(*hs, axis=-2)[:, 0] + F.stack(*hs, axis=-2)[:, -1]


def _swapped(F, x, dense):
    steps = F.swapaxes(x.expand_dims(0), 0, 1)                          # (T, 1, H)
    back = F.swapaxes(F.tanh(steps), dim1=1, dim2=0)                    # (1, T, H)
    return dense(back[:, -1] + back[0, 0:1])


FORMS = {"swapped": _swapped, "split_squeezed": _split_squeezed, "split_kept": _split_kept,
         "stack_last": _stack_last, "stack_slice": _stack_slice,
         "reshape_back": _reshape_back, "squeeze": _squeeze,
         "negative_stack_axis": _negative_stack_axis}


class Form(gdb.DynBatchBlock):
    """One of ``FORMS`` over a sentence's rows."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = FORMS[form]
        with self.name_scope():
            self.dense = nn.Dense(H, in_units=H)

    def hybrid_forward(self, F, words, table):
        return self.form(F, _rows(F, table, words), self.dense)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_parts_of_reshaped_values_are_rows_of_their_source(form):
    model = make_model(Form, form=form)
    check_all_strategies(model, _sentences(1), [_table(1)], strategies=("depth",),
                         compiled=(False,))
    with gdb.batching(keep_plan=True, granularity="op") as scope:
        outs = [model(words, _table(1)) for words in _sentences(1)]
    nd.waitall()
    assert all(out.shape == outs[0].shape for out in outs)
    names = [step.nodes[0].op.name for step in scope.last_plan.steps]
    assert not set(names) & {"SliceChannel", "stack", "slice", "expand_dims"}, names


class Paused(gdb.DynBatchBlock):
    """A reshape made under ``autograd.pause()``: no gradient passes back through it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(H, in_units=H)

    def hybrid_forward(self, F, words, table):
        x = F.tanh(self.dense(_rows(F, table, words)))
        with autograd.pause():
            held = x.expand_dims(0)
        parts = F.split(held, axis=1, num_outputs=len(words), squeeze_axis=True)
        parts = parts if isinstance(parts, list) else [parts]
        return x[:1] + F.add_n(*parts)


def test_a_reshape_made_under_pause_passes_no_gradient_back():
    model = make_model(Paused)
    samples, table = _sentences(2), _table(2)
    expected = run_model(model, samples, [table], "eager")
    assert_same(run_model(model, samples, [table], "depth"), expected)


def test_target_shapes():
    assert reshapes.target_shape("expand_dims", (3, 4), {"axis": -1}) == (3, 4, 1)
    assert reshapes.target_shape("squeeze", (1, 3, 1), {}) == (3,)
    assert reshapes.target_shape("squeeze", (1, 1), {"axis": (0, 1)}) == (1,)
    assert reshapes.target_shape("squeeze", (2, 3), {"axis": 0}) is None
    assert reshapes.target_shape("reshape", (2, 3, 4), {"shape": (0, -1)}) == (2, 12)
    assert reshapes.target_shape("reshape", (2, 3), {"shape": (-1, -1)}) is None
    assert reshapes.target_shape("reshape", (2, 3), {"shape": (-3,)}) is None
    assert reshapes.target_shape("reshape", (2, 3), {"shape": (6,), "reverse": True}) is None
    assert reshapes.target_shape("Flatten", (2, 3, 4), {}) == (2, 12)
