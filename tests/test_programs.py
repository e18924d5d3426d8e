"""Calls recorded as one program node each (gluon_dynbatch/programs.py)."""
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import (ChildSumTreeLSTM, Tree, assert_same, check_all_strategies,
                              make_model, outputs_of, random_tree, reference_run, rng,
                              run_model)
from gluon_dynbatch.templates.programs import PROGRAM_RULE, Program

STRATEGIES = ["depth", "agenda", "unbatched"]
MODES = [False, True, "step"]


def _plan(model, samples, inputs, **kwargs):
    with gdb.batching(keep_plan=True, **kwargs) as scope:
        outs = [model(s, *inputs) for s in samples]
    return scope, outs


def _call_steps(plan):
    return [s for s in plan.steps if isinstance(s.nodes[0].op, Program)]


def _mixed_trees():
    """Trees whose nodes have 0, 1, 2 and 3 children, several at each height."""
    return [Tree(0, [Tree(1), Tree(2), Tree(3)]), Tree(4, [Tree(5)]),
            Tree(6, [Tree(7), Tree(8)]), Tree(9, [Tree(1, [Tree(2), Tree(3)]), Tree(4)]),
            Tree(5)]


def test_tree_lstm_cell_is_one_node_per_call_and_arity_does_not_split_batches():
    trees = _mixed_trees()
    model = make_model(ChildSumTreeLSTM, hidden=5)
    emb = nd.random.uniform(shape=(10, 4))
    scope, _ = _plan(model, trees, [emb])
    steps = _call_steps(scope.last_plan)
    assert steps == scope.last_plan.steps          # nothing but cell calls runs
    nodes = sum(1 for t in trees for _ in t.nodes())
    assert sum(len(s.nodes) for s in steps) == nodes
    # One step per height: the calls with 1, 2 and 3 children of height 2 share one.
    heights = max(t.height() for t in trees)
    assert len(steps) == heights
    arities = {node.inputs[1][0].out_shapes[0][0] for node in steps[1].nodes}
    assert arities == {1, 2, 3}
    op_scope, _ = _plan(model, trees, [emb], granularity="op")
    assert scope.stats.nodes < op_scope.stats.nodes / 3


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("compiled", MODES)
def test_call_nodes_match_eager_and_per_operator_runs(strategy, compiled):
    r = rng(11)
    trees = _mixed_trees() + [random_tree(r, 10, max_depth=3) for _ in range(5)]
    model = make_model(ChildSumTreeLSTM, hidden=6)
    emb = nd.random.uniform(-1, 1, shape=(10, 4))
    eager = run_model(model, trees, [emb], "eager")
    per_op = run_model(model, trees, [emb], strategy, compiled, granularity="op")
    calls = run_model(model, trees, [emb], strategy, compiled)
    assert_same(per_op, eager)
    assert_same(calls, eager)
    assert calls[2].nodes < per_op[2].nodes


def test_variant_repeats_one_row_inputs_only_when_a_call_needs_it():
    model = make_model(ChildSumTreeLSTM, hidden=3)
    emb = nd.random.uniform(shape=(10, 2))
    leaves = [Tree(w) for w in range(4)]
    scope, _ = _plan(model, leaves, [emb])
    (step,) = scope.last_plan.steps
    variant, _ = PROGRAM_RULE.batch_arrays(step.nodes)
    assert not any(variant)                        # every call has one child row
    scope, _ = _plan(model, [Tree(0, [Tree(1), Tree(2)]), Tree(3, [Tree(4)])], [emb])
    variant, arrays = PROGRAM_RULE.batch_arrays(scope.last_plan.steps[1].nodes)
    assert any(variant)                            # x's row is repeated per child
    # The repeat index gives each call's child rows its own x row: 0, 0 then 1.
    assert [0, 0, 1] in [list(a) for a in arrays if a.ndim == 1]



def test_batch_arrays_of_one_call_shape_are_kept_per_count_and_equal_a_fresh_build():
    model = make_model(ChildSumTreeLSTM, hidden=3)
    emb = nd.random.uniform(shape=(10, 2))
    trees = [Tree(w, [Tree(1), Tree(2)]) for w in range(4)]
    scope, _ = _plan(model, trees, [emb])
    nodes = scope.last_plan.steps[1].nodes
    assert len({n.info for n in nodes}) == 1
    for count in (4, 2, 4):
        variant, arrays = PROGRAM_RULE.batch_arrays(nodes[:count])
        fresh_variant, fresh = PROGRAM_RULE._batch_arrays(  # pylint: disable=protected-access
            nodes[0].op, nodes[:count], False)
        assert variant == fresh_variant
        assert [a.tolist() for a in arrays] == [a.tolist() for a in fresh]
        arrays.clear()                  # the caller's list, not the program's
    assert (nodes[0].info, 4) in nodes[0].op.batches
    assert len(PROGRAM_RULE.batch_arrays(nodes)[1]) == len(fresh)

class Pooled(gluon.HybridBlock):
    """Means and sums over a call's rows, kept and dropped axes, reshapes."""

    def hybrid_forward(self, F, rows, x):  # pylint: disable=arguments-differ
        pooled = F.mean(rows * 3, axis=0)                       # (D,): rank 1
        total = F.sum(F.tanh(rows), axis=0, keepdims=True)      # (1, D)
        both = F.broadcast_add(F.reshape(pooled, shape=(1, -1)), x) * total
        return both, F.reshape(both, shape=(-1, 1))


class UsesPooled(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.pool = Pooled()

    def hybrid_forward(self, F, k, x):
        return self.pool(x[k:k + 1 + k % 4], x[k:k + 1])


@pytest.mark.parametrize("compiled", MODES)
def test_means_sums_and_reshapes_inside_a_call(compiled):
    model = UsesPooled()
    x = nd.random.uniform(-1, 1, shape=(12, 5))
    samples = list(range(8))
    eager = run_model(model, samples, [x], "eager")
    assert_same(run_model(model, samples, [x], "depth", compiled), eager)
    scope, _ = _plan(model, samples, [x])
    (step,) = _call_steps(scope.last_plan)
    assert len(step.nodes) == len(samples)


class WithRowView(gluon.HybridBlock):
    """Takes the first row of its input: a view of a graph value, outside the program."""

    def hybrid_forward(self, F, rows):  # pylint: disable=arguments-differ
        return F.tanh(F.slice_axis(rows, axis=0, begin=0, end=1)) * 2


class WithMadeWeight(gluon.HybridBlock):
    """Computes the weight of its FullyConnected from its input (``per_call``: it
    differs per call) or from its parameter alone (the same for every call)."""

    def __init__(self, per_call=True, **kwargs):
        super().__init__(**kwargs)
        self.per_call = per_call
        with self.name_scope():
            self.raw = self.params.get("raw", shape=(3, 5))

    def hybrid_forward(self, F, x, raw):  # pylint: disable=arguments-differ
        weight = F.tanh(raw)
        if self.per_call:
            weight = F.broadcast_mul(weight, F.sum(x))
        return F.FullyConnected(x, weight, no_bias=True, num_hidden=3)


class Uses(gdb.DynBatchBlock):
    def __init__(self, child, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = child

    def hybrid_forward(self, F, k, x):
        return self.child(x[k:k + 2])


def test_blocks_that_do_not_batch_row_by_row_stay_per_operator():
    model = Uses(WithMadeWeight())
    model.initialize()
    x = nd.random.uniform(-1, 1, shape=(9, 5))
    samples = list(range(6))
    scope, _ = _plan(model, samples, [x])
    assert not _call_steps(scope.last_plan)
    eager = run_model(model, samples, [x], "eager")
    assert_same(run_model(model, samples, [x], "depth"), eager)


def test_a_weight_made_from_parameters_alone_is_made_once_and_calls_batch():
    model = Uses(WithMadeWeight(per_call=False))
    model.initialize()
    x = nd.random.uniform(-1, 1, shape=(9, 5))
    samples = list(range(6))
    scope, _ = _plan(model, samples, [x])
    steps = scope.last_plan.steps
    assert [len(s.nodes) for s in steps] == [1, len(samples)]
    assert steps[0].nodes[0].op.name == "tanh"
    eager = run_model(model, samples, [x], "eager")
    for mode in MODES:
        assert_same(run_model(model, samples, [x], "depth", mode), eager)


def test_rows_of_an_argument_are_a_view_and_the_rest_one_program():
    model = Uses(WithRowView())
    model.initialize()
    x = nd.random.uniform(-1, 1, shape=(9, 5))
    samples = list(range(6))
    scope, _ = _plan(model, samples, [x])
    (step,) = scope.last_plan.steps
    assert isinstance(step.nodes[0].op, Program) and len(step.nodes) == len(samples)
    eager = run_model(model, samples, [x], "eager")
    for mode in MODES:
        assert_same(run_model(model, samples, [x], "depth", mode), eager)


def test_reference_strategy_and_op_granularity_record_every_operator():
    model = make_model(ChildSumTreeLSTM, hidden=3)
    emb = nd.random.uniform(shape=(10, 2))
    trees = _mixed_trees()
    scope, _ = _plan(model, trees, [emb], strategy="unbatched", granularity="op")
    assert not _call_steps(scope.last_plan)
    for strategy in ("reference", "depth"):
        with gdb.batching(strategy=strategy) as scope:
            outs = [model(t, emb) for t in trees]
            ops = {type(n.op).__name__ for n in scope.recorder.graph.nodes if n.op}
        assert ("Program" in ops) == (strategy != "reference")
        assert outs[0][0].shape == (1, 3)


def test_granularity_is_validated_and_a_block_default():
    with pytest.raises(ValueError, match="granularity"):
        gdb.batching(granularity="block")
    with pytest.raises(ValueError, match="granularity"):
        ChildSumTreeLSTM(granularity="tree")
    model = make_model(ChildSumTreeLSTM, hidden=3, granularity="op")
    emb = nd.random.uniform(shape=(10, 2))
    scope, _ = _plan(model, _mixed_trees(), [emb])
    assert not _call_steps(scope.last_plan)


def test_nan_in_one_call_stays_in_its_call():
    model = make_model(ChildSumTreeLSTM, hidden=3)
    table = np.random.RandomState(0).uniform(size=(10, 2)).astype(np.float32)
    table[3, 0] = np.nan
    emb = nd.array(table)
    trees = [Tree(0, [Tree(1), Tree(2)]), Tree(4, [Tree(3), Tree(5)]), Tree(6, [Tree(7)])]
    with gdb.batching():
        outs = [model(t, emb) for t in trees]
    assert np.isnan(outs[1][0].asnumpy()).all()
    for k in (0, 2):
        want = model(trees[k], emb)[0].asnumpy()
        np.testing.assert_allclose(outs[k][0].asnumpy(), want, rtol=1e-5, atol=1e-6)


def test_reference_executor_runs_call_nodes_one_call_at_a_time():
    """``Program.run`` (a call node unbatched, as the reference executor runs it)."""
    from gluon_dynbatch.run.reference import run_reference
    trees = _mixed_trees()
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    with gdb.batching() as scope:
        outs = [model(t, emb) for t in trees]
        graph = scope.recorder.graph
        assert any(isinstance(n.op, Program) for n in graph.nodes)
        live, needed = graph.live_and_needed()
        run_reference(needed, live, None)
    for tree, (h, c) in zip(trees, outs):
        want_h, want_c = model(tree, emb)
        np.testing.assert_allclose(h.asnumpy(), want_h.asnumpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c.asnumpy(), want_c.asnumpy(), rtol=1e-5, atol=1e-6)


class WeightAndItsFunction(gdb.DynBatchBlock):
    """Adds one value to a parameter and to a function of that parameter:
    two calls of one operator whose first inputs are weights, not rows."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)
            self.bias = self.params.get("bias", shape=(1, 4))

    def hybrid_forward(self, F, sample, x, bias):
        h = self.dense(x[sample:sample + 1])
        if self.form == "tanh":
            return bias + h, F.tanh(bias) + h
        if self.form == "scaled":
            return bias - h, bias * 2 - h
        return bias * 1 + h, bias * 2 + h


@pytest.mark.parametrize("form", ["tanh", "scaled", "both_scaled"])
def test_calls_reading_a_weight_and_a_function_of_it_equal_eager(form):
    model = make_model(WeightAndItsFunction, form=form)
    x = nd.random.uniform(-1, 1, shape=(9, 3))
    check_all_strategies(model, list(range(5)), [x], strategies=("depth",))


class HalfPrecisionWeight(gdb.DynBatchBlock):
    """Each float16 sample casts a float32 weight to float16, as mixed precision does."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.w = self.params.get("w", shape=(1, 4), init="ones")

    def hybrid_forward(self, F, x, w):
        if self.form == "cast":
            half = F.cast(w, x.dtype)
        elif self.form == "astype":
            half = w.astype("float16")
        else:
            half = F.amp_cast(w, dtype="float16")
        return x * half


@pytest.mark.parametrize("form", ["cast", "astype", "amp_cast"])
@pytest.mark.parametrize("mode", MODES)
def test_a_weight_cast_to_half_precision_sums_its_gradient_as_eager(form, mode):
    # 40 samples' float16 gradients of 3000 each: 120000 in float32 (as
    # eager sums them), past float16's largest value summed in float16.
    model = make_model(HalfPrecisionWeight, form=form)
    samples = [nd.full((1, 4), 3000.0, dtype="float16") for _ in range(40)]

    def grad(batching):
        model.w.zero_grad()
        with autograd.record():
            outs = outputs_of(model, samples, batching)
            loss = nd.add_n(*[o.astype("float32").sum() for o in outs])
        loss.backward()
        return model.w.grad().asnumpy()

    np.testing.assert_array_equal(grad(None), np.full((1, 4), 120000.0))
    np.testing.assert_array_equal(grad({"compiled": mode}), np.full((1, 4), 120000.0))


class ColumnCell(gdb.DynBatchBlock):
    """A binary tree cell on (size, 1) columns whose bias has the column's shape:
    the batched add lays each call's ``size`` rows out against one block."""

    def __init__(self, size, **kwargs):
        super().__init__(**kwargs)
        self.size = size
        with self.name_scope():
            self.table = self.params.get("table", shape=(10, size))
            self.w = self.params.get("w", shape=(size, 2 * size))
            self.b = self.params.get("b", shape=(size, 1))

    def hybrid_forward(self, F, tree, table, w, b):
        if not tree.children:
            return F.transpose(table[tree.word:tree.word + 1])
        left, right = (self(child) for child in tree.children[:2])
        return F.tanh(F.dot(w, F.concat(left, right, dim=0)) + b)


def _binary(r, leaves):
    if leaves == 1:
        return Tree(r.randrange(10))
    k = r.randint(1, leaves - 1)
    return Tree(r.randrange(10), [_binary(r, k), _binary(r, leaves - k)])


@pytest.mark.parametrize("sizes", [(8, 4), (4, 8)])
def test_two_models_of_one_class_and_other_sizes_each_batch_as_their_own(sizes):
    """Programs are shared by templates of the same form; a second instance
    whose parameters have other shapes does not run the first's layout."""
    r = rng(3)
    trees = [_binary(r, r.randint(1, 6)) for _ in range(8)]
    for size in sizes:
        model = make_model(ColumnCell, size=size)
        assert_same(run_model(model, trees, [], "depth"), reference_run(model, trees, []))
