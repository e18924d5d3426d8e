"""A sample's own literals applied to its values: products with a constant
matrix, ``F.dot(F.array(adjacency), H)``, and rows picked by an index list,
``F.take(H, F.array(idx))``.

A graph convolution written for one graph multiplies its vertices' states by
the graph's (normalised) adjacency matrix, a literal of the sample's own
size.  Its products over graphs of every size run as one step
(``layer_rules.KnownMatrixDotRule``), exactly: outputs and every gradient as
eager Gluon's.  A matrix computed in the sample (not a literal) at the same
place of the same code runs as before.  Rows picked by a literal index list
are runs of the value's rows, which move rows only (views): no step at all;
many runs are one take over every sample's rows (``KnownTakeRule``).
"""
import numpy as np
import pytest
from mxnet import autograd, nd
from mxnet.gluon import nn

import gluon_dynbatch as gdb
from dynbatch_testing import check_all_strategies, make_model

SIZES = (3, 1, 5, 2, 5, 4)


def _graphs(seed):
    rng = np.random.RandomState(seed)
    graphs = []
    for size in SIZES:
        edges = np.triu(rng.uniform(size=(size, size)) < 0.5, 1).astype(np.float32)
        # Weighted edges and self-loops: no two vertices' states are equal, so the
        # max over vertices has no exact tie, where its gradient would depend on
        # the last bit of rounding (eager gives every tied entry the gradient).
        weights = rng.uniform(0.5, 1.5, size=(size, size)).astype(np.float32)
        adjacency = (edges + edges.T) * (weights + weights.T) \
            + np.diag(rng.uniform(0.5, 1.5, size)).astype(np.float32)
        graphs.append((list(rng.randint(0, 10, size)),
                       adjacency / adjacency.sum(1, keepdims=True)))
    return graphs


def _table():
    return nd.array(np.random.RandomState(1).uniform(-1, 1, (10, 4)))


class GCN(gdb.DynBatchBlock):
    """Two graph convolutions; with ``computed``, the graphs of an even size use
    a matrix computed from their states instead (a softmax of their products)."""

    def __init__(self, computed=False, transpose=False, scaled=False, **kwargs):
        super().__init__(**kwargs)
        self.computed, self.transpose, self.scaled = computed, transpose, scaled
        with self.name_scope():
            self.inp = nn.Dense(5)
            self.conv = nn.Dense(5)

    def hybrid_forward(self, F, graph, table):
        words, adjacency = graph
        h = self.inp(F.concat(*[table[w:w + 1] for w in words], dim=0))
        matrix = F.array(adjacency)
        if self.computed and len(words) % 2 == 0:
            matrix = F.softmax(F.dot(h, h, transpose_b=True), axis=1)
        for _ in range(2):
            product = F.dot(matrix, h, transpose_a=True) if self.transpose else F.dot(matrix, h)
            h = F.relu(self.conv(product))
        if self.scaled:                         # another literal, after the products
            h = h * F.array([[0.5, 1.0, 1.5, 2.0, 2.5]])
        return F.max(h, axis=0, keepdims=True)


class Convolve(gdb.DynBatchBlock):
    """``relu(W (M H))`` of a matrix and states given by the caller."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv = nn.Dense(5)

    def hybrid_forward(self, F, matrix, h):
        return F.relu(self.conv(F.dot(matrix, h)))


class EitherMatrix(gdb.DynBatchBlock):
    """Passes ``Convolve`` a literal adjacency, or for every other sample one
    computed from the states (of the same shape): the same calls of
    ``Convolve`` read a literal in some samples and a computed value in others."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(5)
            self.convolve = Convolve()

    def hybrid_forward(self, F, graph, table):
        words, adjacency, computed = graph
        h = self.inp(F.concat(*[table[w:w + 1] for w in words], dim=0))
        matrix = F.softmax(F.dot(h, h, transpose_b=True), axis=1) if computed \
            else F.array(adjacency)
        return F.max(self.convolve(matrix, h), axis=0, keepdims=True)


def _product_steps(model, graphs, table, name="dot"):
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(graph, table) for graph in graphs]
    nd.waitall()
    assert all(out.shape == (1, 5) for out in outs)
    return [len(s.nodes) for s in scope.last_plan.steps if s.nodes[0].op.name == name]


def test_products_with_literal_adjacencies_of_every_size_are_one_step_each():
    model, graphs, table = make_model(GCN), _graphs(0), _table()
    check_all_strategies(model, graphs, [table])
    # The one-vertex graph's (1, 1) products are recorded as weighted sums.
    assert _product_steps(model, graphs, table) == [len(graphs) - 1] * 2


def test_a_computed_matrix_at_the_place_of_a_literal_stays_exact():
    model, graphs, table = make_model(GCN, computed=True), _graphs(2), _table()
    check_all_strategies(model, graphs, [table])
    # Literal products batch across sizes; so do computed ones, in pair form
    # (pairs.py): the matrix of their scores, then the two products with it.
    literal = sum(1 for n in SIZES if n % 2 and n > 1)
    computed = sum(1 for n in SIZES if n % 2 == 0)
    assert _product_steps(model, graphs, table) == [literal] * 2
    assert _product_steps(model, graphs, table, "_pair_scores") == [computed]
    assert _product_steps(model, graphs, table, "_pair_weighted") == [computed] * 2


def test_the_same_call_on_a_literal_and_on_a_computed_matrix_stays_exact():
    twice = [graph for graph in _graphs(4) for _ in range(2)]
    graphs = [(words, adjacency, k % 2 == 1) for k, (words, adjacency) in enumerate(twice)]
    model, table = make_model(EitherMatrix), _table()
    check_all_strategies(model, graphs, [table])


def test_products_with_transposed_literals_are_one_step_each_too():
    model, graphs, table = make_model(GCN, transpose=True), _graphs(3), _table()
    check_all_strategies(model, graphs, [table])
    # The one-vertex graph's (1, 1) products are recorded as weighted sums.
    assert _product_steps(model, graphs, table) == [len(graphs) - 1] * 2


def test_compiled_plans_of_graphs_of_the_same_sizes_are_reused():
    model, table = make_model(GCN), _table()
    for seed in range(2):
        with gdb.batching(compiled=True) as scope:
            outs = [model(graph, table) for graph in _graphs(seed)]
        nd.waitall()
        assert all(out.shape == (1, 5) for out in outs)
    # Other adjacency values, the same sizes in the same order: the same plan.
    assert (scope.stats.cache_hits, scope.stats.cache_misses) == (1, 0)


def test_a_literal_run_by_a_flush_before_its_product_is_read_as_run():
    # The second literal makes the scope flush (every few nodes): the first is
    # computed (a leaf) before the products analysed on it are planned.
    model, graphs, table = make_model(GCN, scaled=True, max_pending_nodes=4), _graphs(5), _table()
    check_all_strategies(model, graphs, [table], strategies=("depth",))


PICKS = {"runs": [0, 1, 2, 4], "repeats": [3, 3, 0], "reversed": [3, 2, 1, 0],
         "clipped": [-2, 1, 9], "fractional": [0.0, 1.5, -1.2, 2.7],
         "scattered": [4, 0, 3, 1, 2, 0, 4, 1]}


class Picks(gdb.DynBatchBlock):
    """Rows of each graph's states picked by a literal index list (``mode``)."""

    def __init__(self, picks, mode="clip", **kwargs):
        super().__init__(**kwargs)
        self.picks, self.mode = picks, mode
        with self.name_scope():
            self.inp = nn.Dense(5)

    def hybrid_forward(self, F, graph, table):
        words, _ = graph
        h = F.tanh(self.inp(F.concat(*[table[w:w + 1] for w in words], dim=0)))
        picked = F.take(h, F.array(PICKS[self.picks]), mode=self.mode)
        return F.sum(picked * F.arange(1, len(PICKS[self.picks]) + 1).reshape((-1, 1)),
                     axis=0, keepdims=True)


@pytest.mark.parametrize("picks,mode", [("runs", "clip"), ("repeats", "clip"),
                                        ("reversed", "wrap"), ("clipped", "clip"),
                                        ("clipped", "wrap"), ("fractional", "clip"),
                                        ("fractional", "wrap"), ("scattered", "clip"),
                                        ("scattered", "wrap")])
def test_rows_picked_by_literal_indices_batch_across_samples(picks, mode):
    model, graphs, table = make_model(Picks, picks=picks, mode=mode), _graphs(6), _table()
    check_all_strategies(model, graphs, [table], strategies=("depth",))
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(graph, table) for graph in graphs]
    nd.waitall()
    assert all(out.shape == (1, 5) for out in outs)
    takes = [s for s in scope.last_plan.steps if "take" in _names(s.nodes[0])]
    # Up to four runs of rows are views (no step); more are one take for every
    # sample (a repeated row starts a run: the one-vertex graph's picks are 8).
    if picks == "scattered":
        assert [len(s.nodes) for s in takes] == [len(graphs)]
    else:
        assert not takes


def _names(node):
    """The operators a node runs: its own, or its program's."""
    op = node.op
    return [op.name] if op.path is not None else [entry.op.name for entry in op.entries]


class GivenGCN(GCN):
    """Two graph convolutions by an adjacency NDArray the caller gives."""

    def hybrid_forward(self, F, graph, table):
        words, adjacency = graph
        h = self.inp(F.concat(*[table[w:w + 1] for w in words], dim=0))
        for _ in range(2):
            h = F.relu(self.conv(F.dot(adjacency, h)))
        return F.max(h, axis=0, keepdims=True)


def test_products_with_given_constant_adjacencies_are_one_step_each():
    graphs = [(words, nd.array(adjacency)) for words, adjacency in _graphs(7)]
    model, table = make_model(GivenGCN), _table()
    check_all_strategies(model, graphs, [table])
    assert _product_steps(model, graphs, table) == [len(graphs) - 1] * 2


def _given_run(model, graphs, table, scale, batched):
    """Outputs and gradients, the adjacencies made from ``scale`` under autograd."""
    for array in (table, scale):
        array.attach_grad()
    with autograd.record():
        given = [(words, nd.softmax(nd.array(adjacency) * scale, axis=1))
                 for words, adjacency in graphs]
        if batched:
            with gdb.batching():
                outs = [model(graph, table) for graph in given]
        else:
            outs = [model(graph, table) for graph in given]
        loss = nd.add_n(*[out.sum() for out in outs])
    loss.backward()
    grads = [p.grad().asnumpy().copy() for p in model.collect_params().values()]
    return [out.asnumpy() for out in outs], grads + [table.grad.asnumpy(), scale.grad.asnumpy()]


def test_given_adjacencies_with_a_history_pass_their_gradient_as_eager_does():
    # Computed under autograd from a value with a gradient: not constants.
    model, graphs, table = make_model(GivenGCN), _graphs(8), _table()
    scale = nd.array([1.5])
    want = _given_run(model, graphs, table, scale, batched=False)
    got = _given_run(model, graphs, table, scale, batched=True)
    assert abs(want[1][-1]).sum() > 0
    for mine, theirs in zip(got[0] + got[1], want[0] + want[1]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
