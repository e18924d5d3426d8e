"""Batched runs equal eager and reference runs on Tree-LSTMs, RNNs and tree RNNs."""
from collections import Counter

import numpy as np
import pytest
from mxnet import gluon, nd

from dynbatch_testing import (BinaryTreeLSTM, ChildSumTreeLSTM, TokenRNN, check_all_strategies,
                              make_model, random_binary_tree, random_tree, reference_run, rng,
                              run_model, sick_trees)
import gluon_dynbatch as gdb


def test_child_sum_tree_lstm_random_trees():
    r = rng(0)
    trees = [random_tree(r, 30, max_depth=3) for _ in range(6)]
    model = make_model(ChildSumTreeLSTM, hidden=6)
    emb = nd.random.uniform(shape=(30, 5))
    check_all_strategies(model, trees, [emb])


def test_child_sum_tree_lstm_sick_trees():
    trees = sick_trees(10)
    if trees is None:
        pytest.skip("SICK data not found at ../shared/data/sick")
    vocab = max(n.word for t in trees for n in t.nodes()) + 1
    model = make_model(ChildSumTreeLSTM, hidden=10)
    emb = nd.random.uniform(-1, 1, shape=(vocab, 7))
    check_all_strategies(model, trees, [emb])


def test_binary_tree_lstm():
    r = rng(1)
    trees = [random_binary_tree(r, 25, r.randint(1, 9)) for _ in range(7)]
    model = make_model(BinaryTreeLSTM, hidden=5)
    emb = nd.random.uniform(shape=(25, 4))
    stats = check_all_strategies(model, trees, [emb])
    assert stats["depth"].mean_batch_size > 2


def test_token_rnn_ragged_sentences():
    r = rng(2)
    sentences = [[r.randrange(40) for _ in range(r.randint(1, 9))] for _ in range(8)]
    model = make_model(TokenRNN, hidden=6)
    emb = nd.random.uniform(shape=(40, 5))
    stats = check_all_strategies(model, sentences, [emb])
    # One step per time step at most for the recurrence (plus the output layers).
    assert stats["depth"].steps < 8 * 9


def _cell_batches(plan, weight):
    """Sizes of the steps that apply the layer whose weight Parameter is ``weight``
    (as an operator, or inside a whole-call node)."""
    sizes = []
    for step in plan.steps:
        node = step.nodes[0]
        if (node.op.name == "FullyConnected" or node.rule.batching == "program") and any(
                src.param is weight for src, _ in node.inputs):
            sizes.append(len(step.nodes))
    return sizes


@pytest.mark.parametrize("strategy", ["depth", "agenda"])
def test_sick_cell_batch_size_near_nodes_per_level(strategy):
    """Variable arity must not split the cell's batches."""
    trees = sick_trees(50)
    if trees is None:
        pytest.skip("SICK data not found at ../shared/data/sick")
    model = make_model(ChildSumTreeLSTM, hidden=8)
    emb = nd.random.uniform(shape=(max(n.word for t in trees for n in t.nodes()) + 1, 6))
    with gdb.batching(strategy=strategy, keep_plan=True) as scope:
        outs = [model(t, emb) for t in trees]
    nodes = sum(1 for t in trees for _ in t.nodes())
    levels = max(t.height() for t in trees)
    sizes = _cell_batches(scope.last_plan, model.cell.iou_x.weight)
    assert sum(sizes) == nodes
    assert np.mean(sizes) >= 0.8 * nodes / levels, (sizes, nodes, levels)
    assert outs[0][0].shape == (1, 8)
    arities = Counter(len(n.children) for t in trees for n in t.nodes())
    assert len(arities) >= 3      # the data really mixes arities


def test_batched_steps_are_few_and_results_exact_for_many_trees():
    r = rng(3)
    trees = [random_tree(r, 50, max_depth=4, arities=(0, 1, 2, 3)) for _ in range(20)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(50, 3))
    ref = reference_run(model, trees, [emb])
    got = run_model(model, trees, [emb], "agenda")
    for a, b in zip(got[0], ref[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    stats = got[2]
    assert stats.mean_batch_size > 10
    assert stats.steps < stats.planned_nodes / 10


class RowPicker(gdb.DynBatchBlock):
    """Rows of a table chosen per sample through ``F.slice_axis`` and ``x[i:j]``.

    ``(k, begin, end)`` samples exercise the recorder's row-slice fast path
    (non-negative int bounds, axis 0) and its fallbacks (negative bounds,
    ``end=None``), all of which must equal eager execution.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, sample, table, other):
        begin, end = sample
        rows = F.slice_axis(table, axis=0, begin=begin, end=end)
        extra = other[1:3] if begin >= 0 else F.slice_axis(other, axis=0, begin=-2,
                                                          end=None)
        return F.tanh(self.dense(rows)).sum(axis=0, keepdims=True) + extra.sum()


def test_row_slices_fast_path_and_fallbacks_equal_eager():
    model = make_model(RowPicker)
    table = nd.random.uniform(shape=(7, 4))
    other = nd.random.uniform(shape=(4, 3))
    samples = [(0, 1), (2, 5), (6, 7), (-3, None), (-1, None), (-4, -2), (3, 4), (0, 7)]
    check_all_strategies(model, samples, [table, other], strategies=("depth",))


def test_out_of_range_row_slice_names_sample_and_next_batch_works():
    model = make_model(RowPicker)
    table = nd.random.uniform(shape=(7, 4))
    other = nd.random.uniform(shape=(4, 3))
    with pytest.raises(gdb.BatchingError, match="sample 1"):
        with gdb.batching():
            for s in [(0, 1), (5, 9)]:
                model(s, table, other)
    with gdb.batching():
        out = model((2, 4), table, other)
    np.testing.assert_allclose(out.asnumpy(), model((2, 4), table, other).asnumpy(),
                               rtol=1e-6)


class RowsAndChildren(gdb.DynBatchBlock):
    """Word rows and children's states gathered in ways the compiler's walk
    resolves in bulk or view by view, all batched into the same steps.

    A sample is ``(words, table_choice)``: a chain of nodes, each reading a
    row of ``tables[choice]`` (one table for some samples, another, or a
    concatenation of both, which is a view of two segments) and the
    concatenation of its previous state with a constant row (a leaf) or with
    a second computed state.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)
            self.mix = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, sample, first, second):
        words, choice = sample
        table = {"first": first, "second": second,
                 "both": F.concat(first, second, dim=0)}[choice]
        state = F.tanh(self.dense(table[words[0]:words[0] + 1]))
        for k, word in enumerate(words[1:]):
            x = F.tanh(self.dense(table[word:word + 1]))
            other = F.ones((1, 3)) if k % 2 else x
            children = F.concat(state, other, dim=0)
            mixed = F.tanh(self.mix(children))
            state = mixed[0:1] * 0.7 + mixed[1:2] * 0.3     # order matters
        return state


def test_walk_gathers_in_bulk_and_view_by_view_equal_eager():
    model = make_model(RowsAndChildren)
    first = nd.random.uniform(shape=(6, 4))
    second = nd.random.uniform(shape=(5, 4))
    samples = [([0, 3, 5, 1], "first"), ([2, 4, 1], "second"), ([7, 10, 0, 6], "both"),
               ([1, 1, 2], "first"), ([5, 2], "both"), ([0, 4, 3, 2, 1], "second")]
    check_all_strategies(model, samples, [first, second], strategies=("depth", "agenda"))
