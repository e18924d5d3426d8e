"""A sample's own (m, n) matrices: self-attention over a sentence, attention
between two sentences, and other calls on such matrices (``pairs.py``).

Recorded as written, every call on a matrix as tall and as wide as the
sample is long batches only with samples of the same lengths.  In pair form
the products, softmaxes and reductions of samples of every length run as
one step each, exactly: outputs and every gradient as eager Gluon's.
"""
import math

import numpy as np
import pytest
from mxnet import nd
from mxnet.gluon import nn

import gluon_dynbatch as gdb
from dynbatch_testing import check_all_strategies, make_model
from matrix_models import DecomposableAttention

LENGTHS = (3, 1, 6, 2, 5, 4, 2)
WIDTH = 4


def _sentences(seed, lengths=LENGTHS):
    rng = np.random.RandomState(seed)
    return [list(rng.randint(0, 10, size)) for size in lengths]


def _table():
    return nd.array(np.random.RandomState(1).uniform(-1, 1, (10, WIDTH)))


class SelfAttention(gdb.DynBatchBlock):
    """Scaled dot-product self-attention over a sentence, a residual, mean pooling."""

    def __init__(self, hold=False, **kwargs):
        super().__init__(**kwargs)
        self.hold = hold
        with self.name_scope():
            self.q = nn.Dense(5, flatten=False)
            self.k = nn.Dense(5, flatten=False)
            self.v = nn.Dense(5, flatten=False)

    def hybrid_forward(self, F, words, table):
        x = F.concat(*[table[w:w + 1] for w in words], dim=0)
        q, k, v = self.q(x), self.k(x), self.v(x)
        weights = F.softmax(F.dot(q, k, transpose_b=True) / math.sqrt(5), axis=-1)
        pooled = F.mean(F.dot(weights, v) + q, axis=0, keepdims=True)
        return (pooled, weights) if self.hold else pooled


class MatrixCalls(gdb.DynBatchBlock):
    """Elementwise calls on the matrix and on two of them, a mask, and every
    reduction along either axis."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(3, flatten=False)

    def hybrid_forward(self, F, words, table):
        h = self.proj(F.concat(*[table[w:w + 1] for w in words], dim=0))
        scores = F.dot(h, h, transpose_b=True)
        col = F.sum(h, axis=1, keepdims=True)
        # An outer difference, the (1, n) row first: entry (j, k) is col[k] - tanh(col[j]).
        outer = F.broadcast_sub(F.transpose(col), F.tanh(col))
        mixed = F.tanh(scores) * scores - 100.0 * (scores < -0.05) + 0.1 * outer
        rows = F.sum(mixed, axis=1) + F.max(mixed, axis=-1)                  # (n,)
        cols = F.mean(mixed, axis=0, keepdims=True)                         # (1, n)
        top = F.max(F.log_softmax(mixed, axis=0), axis=1, keepdims=True)    # (n, 1)
        every = F.sum(mixed) * F.mean(mixed, axis=(1, 0), keepdims=True)     # (1, 1)
        return F.sum(F.reshape(rows, (-1, 1)) * h + F.transpose(cols) * h + top * h,
                     axis=0, keepdims=True) + every


def _steps(model, samples, table, name):
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(sample, table) for sample in samples]
    nd.waitall()
    assert outs
    return [len(step.nodes) for step in scope.last_plan.steps
            if step.nodes[0].op.name == name]


def test_self_attention_over_sentences_of_every_length_is_exact_and_one_step_a_call():
    model, sentences, table = make_model(SelfAttention), _sentences(0), _table()
    check_all_strategies(model, sentences, [table])
    longer = sum(1 for n in LENGTHS if n > 1)      # one word: a column (columns.py)
    for name in ("_pair_scores", "_group_softmax", "_pair_weighted"):
        assert _steps(model, sentences, table, name) == [longer], name
    assert _steps(model, sentences, table, "dot") == []


def test_attention_weights_held_by_the_caller_are_exact():
    model, sentences, table = make_model(SelfAttention, hold=True), _sentences(1), _table()
    check_all_strategies(model, sentences, [table], compiled=(False, "step"))


def test_alignments_along_both_axes_of_two_sentences_are_exact():
    rng = np.random.RandomState(2)
    pairs = [(list(rng.randint(0, 10, m)), list(rng.randint(0, 10, n)))
             for m, n in ((3, 4), (2, 2), (5, 3), (4, 6), (2, 5), (3, 4))]
    model, table = make_model(DecomposableAttention, hidden=5, classes=3), _table()
    check_all_strategies(model, pairs, [table])
    # The softmaxes along either axis are one step, then the two products.
    assert _steps(model, pairs, table, "_group_softmax") == [12]
    assert _steps(model, pairs, table, "_pair_weighted") == [6]
    assert _steps(model, pairs, table, "_pair_weighted_t") == [6]


def test_elementwise_calls_masks_and_reductions_along_either_axis_are_exact():
    model, sentences, table = make_model(MatrixCalls), _sentences(3), _table()
    check_all_strategies(model, sentences, [table])
    longer = sum(1 for n in LENGTHS if n > 1)
    assert _steps(model, sentences, table, "_pair_scores") == [longer]
    # Means along axis 0 and over every entry: one step.
    assert _steps(model, sentences, table, "_group_mean") == [2 * longer]
    assert _steps(model, sentences, table, "_pair_outer") == [longer]


class GraphAttention(gdb.DynBatchBlock):
    """Graph attention on a dense adjacency: an outer sum of two (n, 1) scores,
    a leaky ReLU, the graph's mask (a literal, or an array given to the model)."""

    def __init__(self, given=False, **kwargs):
        super().__init__(**kwargs)
        self.given = given
        with self.name_scope():
            self.w = nn.Dense(5, use_bias=False, flatten=False)
            self.src = nn.Dense(1, use_bias=False, flatten=False)
            self.dst = nn.Dense(1, use_bias=False, flatten=False)

    def hybrid_forward(self, F, graph, table):
        words, mask = graph
        h = self.w(F.concat(*[table[w:w + 1] for w in words], dim=0))
        scores = F.LeakyReLU(self.src(h) + F.transpose(self.dst(h)), slope=0.2)
        scores = (mask if self.given else F.array(mask)) + scores
        return F.max(F.dot(F.softmax(scores, axis=1), h), axis=0, keepdims=True)


def _graphs(seed, given):
    rng = np.random.RandomState(seed)
    graphs = []
    for size in LENGTHS:
        edges = np.triu(rng.uniform(size=(size, size)) < 0.5, 1)
        linked = edges | edges.T | np.eye(size, dtype=bool)
        mask = np.where(linked, 0, -1e4).astype(np.float32)
        graphs.append((list(rng.randint(0, 10, size)), nd.array(mask) if given else mask))
    return graphs


@pytest.mark.parametrize("given", [False, True])
def test_graph_attention_with_a_mask_of_each_graph_is_exact(given):
    model, graphs, table = make_model(GraphAttention, given=given), _graphs(6, given), _table()
    check_all_strategies(model, graphs, [table])
    longer = sum(1 for n in LENGTHS if n > 1)
    assert _steps(model, graphs, table, "_group_softmax") == [longer]
    assert _steps(model, graphs, table, "_pair_weighted") == [longer]


class TwoOperators(gdb.DynBatchBlock):
    """Pairwise scores of a graph's nodes made by two elementwise operators, as
    graph attention adds a bias and multiplies by a mask: an outer sum and an
    outer product of the same scores, a known bias added and a known mask
    multiplied (``how`` names one of them alone)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.src = nn.Dense(1, flatten=False)
            self.dst = nn.Dense(1, flatten=False)

    def hybrid_forward(self, F, words, table, how="all"):
        h = F.concat(*[table[w:w + 1] for w in words], dim=0)
        s, d = self.src(h), self.dst(h)             # (n, 1) scores of each node
        n = len(words)
        bias = F.array(np.arange(n * n, dtype=np.float32).reshape(n, n) / (n * n))
        mask = F.array(np.triu(np.ones((n, n), dtype=np.float32)))
        pairs = {"outer +": lambda: s + F.transpose(d), "outer *": lambda: s * F.transpose(d),
                 "known +": lambda: s + F.transpose(d) + bias,
                 "known *": lambda: (s + F.transpose(d)) * mask}
        if how != "all":
            return F.sum(pairs[how](), axis=1, keepdims=True)
        scores = (pairs["outer +"]() + bias) * mask + F.tanh(pairs["outer *"]())
        return F.sum(scores, axis=1, keepdims=True)


def test_pairwise_calls_of_two_operators_in_a_sample_are_exact_in_every_mode():
    """Compiled steps of every pairwise operator had one key: an outer product
    ran the CachedOp compiled for the outer sum before it (a mask multiplied
    as the bias was added), outputs and gradients wrong."""
    model, sentences, table = make_model(TwoOperators), _sentences(3), _table()
    check_all_strategies(model, sentences, [table])


@pytest.mark.parametrize("compiled", ["step", "plan"])
@pytest.mark.parametrize("first, second", [("outer +", "outer *"), ("known +", "known *")])
def test_a_scope_of_another_pairwise_operator_compiles_its_own(first, second, compiled):
    """A scope whose samples take the outer product after one that took the
    outer sum, in the same shapes: the second reused the first's steps (and
    the plan made of them) and computed sums."""
    model, sentences, table = make_model(TwoOperators), _sentences(4), _table()
    for how in (first, second):
        want = [model(words, table, how).asnumpy() for words in sentences]
        with gdb.batching(compiled=compiled):
            outs = [model(words, table, how) for words in sentences]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class Heads(gdb.DynBatchBlock):
    """Scores of each word's head: a log-softmax along the rows, the gold head
    of each word picked (``F.pick`` by a literal), and the reverse along axis 0."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dep = nn.Dense(5, flatten=False)
            self.head = nn.Dense(5, flatten=False)

    def hybrid_forward(self, F, words, table):
        h = F.concat(*[table[w:w + 1] for w in words], dim=0)
        scores = F.dot(self.dep(h), self.head(h), transpose_b=True)
        gold = F.array([(3 * k + 1) % len(words) for k in range(len(words))])
        loss = -F.mean(F.pick(F.log_softmax(scores, axis=1), gold, axis=1))
        wrapped = F.array([2 * k - 3 for k in range(len(words))])      # -3, -1, 1, ...
        back = F.pick(F.softmax(scores, axis=0), wrapped, axis=0, mode="wrap", keepdims=True)
        return F.reshape(loss, (1, 1)) + F.sum(back, axis=1, keepdims=True)


def test_entries_picked_by_a_literal_along_either_axis_are_exact():
    model, sentences, table = make_model(Heads), _sentences(7), _table()
    check_all_strategies(model, sentences, [table])
    # Only the one-word sentence picks as written: its (1, 1) scores are no pairs.
    assert _steps(model, sentences, table, "pick") == [LENGTHS.count(1)]


class Memory(gdb.DynBatchBlock):
    """Attention over a weight (a memory of slots): rows, not pairs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(WIDTH, flatten=False)
            self.memory = self.params.get("memory", shape=(3, WIDTH))

    def hybrid_forward(self, F, words, table, memory):
        h = self.proj(F.concat(*[table[w:w + 1] for w in words], dim=0))
        weights = F.softmax(F.dot(h, memory, transpose_b=True), axis=-1)
        return F.sum(F.dot(weights, memory), axis=0, keepdims=True)


def test_scores_against_a_weight_stay_products_of_rows():
    model, sentences, table = make_model(Memory), _sentences(5), _table()
    check_all_strategies(model, sentences, [table], compiled=(False,))
    assert _steps(model, sentences, table, "_pair_scores") == []


def test_compiled_plans_are_reused_for_sentences_of_other_lengths():
    # Pair form keeps lengths out of the plan: two batches of different lengths
    # (no sentence of one word, which runs in column form) share one compiled plan.
    model, table = make_model(SelfAttention), _table()
    for lengths in ((3, 2, 6, 2, 5, 4, 2), (4, 7, 2, 3, 3, 2, 8)):
        with gdb.batching(compiled=True) as scope:
            outs = [model(words, table) for words in _sentences(9, lengths)]
        nd.waitall()
        assert [out.shape for out in outs] == [(1, 5)] * len(lengths)
    assert (scope.stats.cache_hits, scope.stats.cache_misses) == (1, 0)


class LengthScaled(gdb.DynBatchBlock):
    """Scores divided by the sentence's own length (a Python number per sample)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(5, flatten=False)

    def hybrid_forward(self, F, words, table):
        h = self.proj(F.concat(*[table[w:w + 1] for w in words], dim=0))
        weights = F.softmax(F.dot(h, h, transpose_b=True) / len(words))
        return F.sum(F.dot(weights, h), axis=0, keepdims=True)


def test_scores_scaled_by_each_samples_own_number_are_one_step():
    model, sentences, table = make_model(LengthScaled), _sentences(10), _table()
    check_all_strategies(model, sentences, [table])
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(words, table) for words in sentences]
    nd.waitall()
    assert len(outs) == len(sentences)
    # Between two calls in pair form, the division is a program of one call,
    # which batches every number (a node would batch only its own).
    scaled = [len(step.nodes) for step in scope.last_plan.steps
              if "_div_scalar" in [e.op.name for e in getattr(step.nodes[0].op, "entries", ())]
              or step.nodes[0].op.name == "_div_scalar"]
    assert sorted(scaled) == sorted([sum(1 for n in LENGTHS if n > 1), LENGTHS.count(1)])


class OuterSumAndProduct(gdb.DynBatchBlock):
    """``qa * kb.T - (qa + kb.T)``: two outer combinations of a sample's own
    vectors (pair form), of the same shapes, in one sample."""

    def hybrid_forward(self, F, qa, kb):
        product = F.broadcast_mul(qa, F.transpose(kb))
        total = F.broadcast_add(qa, F.transpose(kb))
        return product - total


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_outer_sums_and_products_keep_their_own_compiled_steps(dtype):
    """In float16 such calls run one by one, and ``compiled="step"`` keyed
    their compiled steps by ``_pair_outer`` alone: the sum reused the product's
    step (errors of order 1)."""
    model = OuterSumAndProduct()
    model.initialize()
    rs = np.random.RandomState(0)
    samples = [(nd.array(rs.randn(m, 1), dtype=dtype), nd.array(rs.randn(n, 1), dtype=dtype))
               for m, n in ((3, 2), (5, 4), (6, 6), (2, 9))]
    want = [model(*s).asnumpy().astype("float64") for s in samples]
    for _ in range(2):
        with gdb.batching(compiled="step"):
            outs = [model(*s) for s in samples]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy().astype("float64"), expected,
                                       rtol=2e-3, atol=2e-3)


class BiaffineWithBiases(gdb.DynBatchBlock):
    """A biaffine scorer's (n, n) arc scores plus a bias per head (a (1, n) row,
    as ``dot(u, h^T)`` gives it, or written with ``+``) and one per dependent (an
    (n, 1) column), each of the four operators, the vector first or second."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(3, flatten=False)
            self.u = self.params.get("u", shape=(1, 3))

    def hybrid_forward(self, F, words, table, u):
        h = self.proj(F.concat(*[table[w:w + 1] for w in words], dim=0))
        scores = F.dot(h, h, transpose_b=True)
        head = F.dot(u, h, transpose_b=True)                 # (1, n)
        dependent = F.sigmoid(F.sum(h, axis=1, keepdims=True)) + 0.5    # (n, 1)
        scores = F.broadcast_add(scores, head) + F.transpose(F.tanh(head).T)
        scores = F.broadcast_mul(dependent, scores) - F.broadcast_div(head, dependent * 2)
        scores = F.broadcast_sub(scores, dependent) / (head * head + 1.0)
        arcs = F.log_softmax(scores, axis=1)
        return F.sum(arcs).reshape((1, 1)) * F.mean(F.broadcast_div(scores, head + 3.0))


def test_a_matrix_plus_a_row_or_a_column_of_the_samples_own_is_exact_and_one_step():
    """Recorded as written, a row or column broadcast over a sample's own matrix
    batched only samples of one length (a biaffine parser's arc scores with a
    bias per head): now one step for every length."""
    model, sentences, table = make_model(BiaffineWithBiases), _sentences(5), _table()
    check_all_strategies(model, sentences, [table])
    longer = sum(1 for n in LENGTHS if n > 1)
    rows = _steps(model, sentences, table, "_pair_row")
    cols = _steps(model, sentences, table, "_pair_col")
    assert rows and cols and all(size == longer for size in rows + cols)
    for name in ("broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div"):
        assert len(_steps(model, sentences, table, name)) <= 1, name     # not one per length
