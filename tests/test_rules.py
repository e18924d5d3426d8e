"""Batching rules, one operator at a time: batched equals per-node (like vmap tests).

Each case records the same operator for several samples with different row
counts and checks every strategy, imperative and compiled, against the
reference executor, outputs and gradients.
"""
import random

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import (assert_batched_equals_eager, assert_same, check_all_strategies,
                              make_model, output_of_script, outputs_of, reference_run, rng,
                              run_model)


class OneOp(gdb.DynBatchBlock):
    """Applies ``fn(F, x)`` to rows ``start:start+rows`` of a shared table."""

    def __init__(self, fn, **kwargs):
        super().__init__(**kwargs)
        self.fn = fn

    def hybrid_forward(self, F, sample, table):
        start, rows = sample
        return self.fn(F, table[start:start + rows])


def _finite_part(F, y):
    """``y`` with its infinities zeroed (their gradients too): a loss of
    infinities alone gives eager MXNet's kernels NaN gradients of their own."""
    return F.where(F.abs(y) > 1e30, F.zeros_like(y), y)


CASES = {
    "tanh": lambda F, x: F.tanh(x),
    "activation": lambda F, x: F.Activation(x, act_type="softrelu"),
    "scalar_ops": lambda F, x: (2 - x) / 3 + x ** 2,
    "softmax_last_axis": lambda F, x: F.softmax(x, axis=-1),
    "sum_axis1": lambda F, x: F.sum(x, axis=1, keepdims=True),
    "sum_axis0_segment": lambda F, x: F.sum(x, axis=0),
    "mean_axis0_segment": lambda F, x: F.mean(x, axis=0, keepdims=True),
    "max_axis1": lambda F, x: F.max(x, axis=1),
    "max_axis0_segment": lambda F, x: F.max(F.tanh(x), axis=0, keepdims=True),
    "min_axis0_segment": lambda F, x: F.min(x * 3, axis=0),
    "slice_axis1": lambda F, x: F.slice_axis(x, axis=1, begin=1, end=3),
    "split_axis1": lambda F, x: F.split(x, num_outputs=2, axis=1)[1],
    "concat_dim1": lambda F, x: F.concat(x, F.tanh(x), dim=1),
    "concat_dim0_view": lambda F, x: F.concat(x, x[0:1], dim=0),
    "reshape_rows": lambda F, x: F.reshape(x, shape=(-1, 2, 2)),
    "reshape_flat": lambda F, x: F.reshape(x, shape=(-1,)),
    "expand_dims": lambda F, x: F.expand_dims(x, axis=1),
    "flatten": lambda F, x: F.Flatten(F.expand_dims(x, axis=2)),
    "transpose_rows": lambda F, x: F.transpose(F.reshape(x, shape=(-1, 2, 2)), axes=(0, 2, 1)),
    "swapaxes_unit_axis": lambda F, x: F.swapaxes(F.expand_dims(x, axis=0), dim1=0, dim2=1),
    "transpose_unit_axis": lambda F, x: F.transpose(F.expand_dims(x, axis=1), axes=(1, 0, 2)),
    "transpose_mixing": lambda F, x: F.transpose(F.expand_dims(x, axis=0), axes=(2, 1, 0)),
    "transpose_row": lambda F, x: F.broadcast_mul(F.transpose(x[0:1]), F.tanh(x[0:1])),
    "transpose_column": lambda F, x: x[:, 1:2].T * 3 + x[:, 2:3].transpose(axes=(1, 0)),
    "transpose_each": lambda F, x: F.dot(F.transpose(F.tanh(x)), x),
    "swapaxes_each": lambda F, x: F.swapaxes(F.reshape(x, shape=(-1, 2, 2)), dim1=0, dim2=2) * 2,
    "broadcast_row": lambda F, x: F.broadcast_mul(x, x[0:1]),
    "broadcast_to_rows": lambda F, x: F.broadcast_to(x[0:1], shape=(3, 4)) + 1,
    "int_index": lambda F, x: x[0] * 2,
    "tuple_index": lambda F, x: x[0:1, 1:3] + 1,
    "dot_shared": lambda F, x: F.dot(x, F.ones((4, 3))),
    "dot_each_scores": lambda F, x: F.dot(x[0:1], F.tanh(x), transpose_b=True),
    "dot_each_attention": lambda F, x: F.dot(
        F.softmax(F.dot(x[0:1] * 3, F.tanh(x), transpose_b=True), axis=1), x * 2),
    "full_reduce": lambda F, x: F.broadcast_mul(x, F.sum(x)),
    "sum_every_axis": lambda F, x: F.sum(F.tanh(x)) * 2,
    "mean_every_axis_keepdims": lambda F, x: F.mean(x * x, keepdims=True) + x[0:1],
    "max_axes_listed": lambda F, x: F.max(F.tanh(x), axis=(0, 1)) - 1,
    "min_every_axis_fluent": lambda F, x: (x - 0.5).min() * x,
    "norm_every_axis_alone": lambda F, x: F.norm(x) * x,
    "sum_all_one_row": lambda F, x: F.broadcast_mul(x, F.sum(x[0:1] * 2)),
    "norm_all_one_row": lambda F, x: F.norm(F.tanh(x[0:1])) + x[0:1],
    "mean_all_keepdims": lambda F, x: F.mean(F.reshape(x[0:1], shape=(1, 2, 2)),
                                             keepdims=True) + 1,
    "max_all_one_value": lambda F, x: F.max(F.sum(x[0:1], axis=1)) * x,
    "norm1_all_one_row": lambda F, x: F.norm(x[0:1] - 0.5, ord=1) * x,
    "stack_axis1": lambda F, x: F.stack(x, x * 2, axis=1),
    "stack_axis0": lambda F, x: F.stack(x, F.tanh(x), x * 2, axis=0).mean(axis=0),
    "softmax_axis0_segment": lambda F, x: F.softmax(x, axis=0) * x,
    "log_softmax_axis0_segment": lambda F, x: F.log_softmax(F.tanh(x), axis=0),
    "softmax_axis0_weights": lambda F, x: F.sum(
        F.broadcast_mul(F.softmax(F.slice_axis(x, axis=1, begin=0, end=1), axis=0), x),
        axis=0, keepdims=True),
    "mean_exclude_rows": lambda F, x: F.mean(x, axis=0, exclude=True),
    "where": lambda F, x: F.where(x > 0.5, x, -x),
    "pick": lambda F, x: F.pick(x, F.zeros((x.shape[0],)), axis=1),
    "clip_square": lambda F, x: F.clip(x, 0.2, 0.8).square(),
    "reshape_like": lambda F, x: F.reshape_like(F.tanh(x), x * 2) * x,
    "broadcast_like_column": lambda F, x: F.broadcast_like(x[:, 0:1] * 3, x) * x,
    "broadcast_like_one_row": lambda F, x: F.broadcast_like(x[0:1], F.tanh(x)) + x,
    "one_hot": lambda F, x: F.one_hot(F.array([x.shape[0] % 3]), 3) * x[0:1, 0:3],
    # Only the mean and deviation of a normalisation: MXNet's graphs compute them
    # only with the normalised output (kept: ``rules.keeps_outputs``).
    "layer_norm_mean_and_std": lambda F, x: list(F.LayerNorm(
        x * 2, F.ones((4,)), F.zeros((4,)), output_mean_var=True)[1:]),
    "group_norm_mean_and_std": lambda F, x: list(F.GroupNorm(
        F.reshape(x, (-1, 4, 1)), F.ones((2,)), F.zeros((2,)), num_groups=2,
        output_mean_var=True)[1:]),
    "layer_norm_axis0_mean": lambda F, x: F.LayerNorm(
        F.tanh(x), F.ones((x.shape[0],)), F.zeros((x.shape[0],)), axis=0,
        output_mean_var=True)[1] * 2,
    # Arrays given by name, in another order than the operator's.
    "keyword_arrays_sub": lambda F, x: F.broadcast_sub(
        rhs=F.tanh(x), lhs=F.max(x, axis=1, keepdims=True)),
    "keyword_arrays_where": lambda F, x: F.where(y=x * 3, x=F.sin(x), condition=x > 0.2),
    "keyword_arrays_pick": lambda F, x: F.pick(index=F.ones((x.shape[0],)), data=x * 2,
                                               axis=1),
    "keyword_arrays_dot": lambda F, x: F.dot(rhs=F.ones((4, 2)), lhs=F.tanh(x)),
    "keyword_arrays_dot_of_rows": lambda F, x: F.dot(rhs=F.tanh(x), lhs=x, transpose_b=True),
    "keyword_arrays_dense": lambda F, x: F.FullyConnected(
        num_hidden=3, bias=F.ones((3,)), weight=F.ones((3, 4)) * 0.5, data=x),
}

# Attributes given by position, as users write them: rules read them as keywords.
CASES.update({
    "positional_swapaxes": lambda F, x: F.swapaxes(F.tanh(x), 0, 1) * 2,
    "positional_fluent_swapaxes": lambda F, x: F.tanh(x).swapaxes(0, 1) + 1,
    "positional_mean_axis0": lambda F, x: F.mean(x * 3, 0, True) * x[0:1],
    "positional_sum": lambda F, x: F.sum(x, 1, True) + x.sum(0),
    "positional_max_axis0": lambda F, x: F.max(F.tanh(x), 0, True) * 2,
    "positional_clip_transpose": lambda F, x: F.transpose(F.clip(x, -0.2, 0.3), (1, 0)),
    "positional_reshape_slice": lambda F, x: F.slice_axis(F.reshape(x, (-1, 2)), 1, 0, 1),
    "positional_split_pick": lambda F, x: F.pick(F.split(x, 2, 1)[1], F.zeros((x.shape[0],)), 1),
    "positional_expand_dims": lambda F, x: F.expand_dims(x, 0).sum(1),
})
# Indexing with steps on the columns (``x[:, ::-1]``) and ints, as basic slices.
CASES.update({
    "reversed_columns": lambda F, x: x[:, ::-1] * 2 + x,
    "stepped_columns": lambda F, x: F.tanh(x[:, 1::2]) * x[:, 2:0:-2],
    "int_and_reversed": lambda F, x: F.expand_dims(x, axis=1)[:, 0, ::-1] * x[0:1, ::-1],
    "stepped_slices_sum": lambda F, x: F.tanh(x[:, ::-1]) + x[:, 1::2].sum(axis=1,
                                                                         keepdims=True),
})
CASES.update({
    "tile_columns": lambda F, x: F.tile(x, reps=(1, 2)) * 2,
    "tile_short_reps": lambda F, x: F.tile(F.expand_dims(x, axis=1), reps=(3, 1)),
    "tile_rows_alone": lambda F, x: F.tile(x, reps=(2, 1)),
    "softmax_activation": lambda F, x: F.SoftmaxActivation(x * 2),
    "softmax_activation_channel": lambda F, x: F.SoftmaxActivation(
        F.expand_dims(x, axis=2), mode="channel"),
})
# Edge values and axes counted from the end: each as MXNet computes it.
CASES.update({
    "swapaxes_rows_from_the_end": lambda F, x: F.sum(F.swapaxes(F.tanh(x), dim1=-1, dim2=-2),
                                                     axis=1) * 2,
    "cross_entropy_large_scores": lambda F, x: F.softmax_cross_entropy(
        x[0:1] * 300, F.array([1])) + F.softmax_cross_entropy(x[0:1] * 10, F.array([2])),
    "integer_mean_axis0_segment": lambda F, x: F.cast(
        F.mean(F.cast(F.abs(x) * 10, "int32"), axis=0, keepdims=True), "float32") * x[0:1],
    "prelu_of_infinities": lambda F, x: _finite_part(F, F.LeakyReLU(
        F.BlockGrad(F.exp(x * 200)) + x - 5, gamma=F.sum(x, axis=0) * 0.1, act_type="prelu")),
    "cross_entropy_masked_classes": lambda F, x: F.softmax_cross_entropy(
        x[0:1] * 3 + F.log(F.array([[1, 0, 1, 1]])), F.array([2])),
    "cross_entropy_masked_label": lambda F, x: F.softmax_cross_entropy(F.where(
        F.array([[1, 0, 1, 1]]) > 0, x[0:1] * 3, F.ones_like(x[0:1]) * -np.inf), F.array([1])),
    "cross_entropy_huge_scores": lambda F, x: F.softmax_cross_entropy(
        x[0:1] + F.array([[2e38, -2e38, 0, 0]]), F.array([1])),
    "cross_entropy_float64": lambda F, x: F.cast(F.softmax_cross_entropy(
        F.cast(x[0:1], "float64") * 30, F.array([3], dtype="float64")), "float32"),
})
# Aliases of operators with rules (the same MXNet operator under another name).
ALIASES = {
    "sum_axis_alias": lambda F, x: F.sum_axis(x, axis=1, keepdims=True) * x,
    "max_axis_alias": lambda F, x: F.max_axis(F.tanh(x), axis=0, keepdims=True),
    "min_axis_alias": lambda F, x: F.min_axis(x, axis=1),
    "broadcast_axes_alias": lambda F, x: F.broadcast_axes(x[:, 0:1], axis=1, size=3),
    "choose_element_alias": lambda F, x: F.choose_element_0index(x, F.zeros((x.shape[0],))),
    "direct_sum_axis_alias": lambda F, x: mx.nd.sum_axis(F.tanh(x), axis=1),
}
CASES.update(ALIASES)
# The same reshape of one value twice in a call (the fuzzer found it through two
# transposes of a row): each is its own call, whatever follows.
# Ordering along a sample's rows (k-max pooling over its tokens).
CASES.update({
    "topk_axis0_value": lambda F, x: F.topk(F.tanh(x), axis=0, k=1, ret_typ="value") * 2,
    "topk_axis0_both_ascending": lambda F, x: [
        o * 2 for o in F.topk(x, axis=0, k=1, ret_typ="both", is_ascend=True)],
    "topk_axis0_indices": lambda F, x: F.topk(x * 2, axis=0, k=1) + x[0:1],
    "sort_axis0": lambda F, x: F.sort(x, axis=0) * F.tanh(x),
    "sort_axis0_descending": lambda F, x: F.sort(F.tanh(x), axis=0, is_ascend=False) * 3,
    "argsort_axis0": lambda F, x: F.argsort(x, axis=0) + x,
})
CASES.update({
    "reshape_twice": lambda F, x: [F.tanh(F.reshape(x[0:1], (4, 1))),
                                   F.tanh(F.reshape(x[0:1], (4, 1)))],
    "transpose_row_twice": lambda F, x: [F.transpose(F.tanh(F.transpose(x[0:1]))),
                                         F.transpose(F.tanh(F.transpose(x[0:1])))],
})


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_matches_per_node(name):
    model = OneOp(CASES[name])
    _matches_reference(model, [(0, 3), (2, 1), (5, 3), (1, 2)])


def _matches_reference(model, samples):
    """``model`` (a ``OneOp``) on rows of a random table: every strategy and
    compiled mode against the reference executor, outputs and gradients."""
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, size=(12, 4)))
    expected = reference_run(model, samples, [table])
    for strategy in ("depth", "agenda"):
        for compiled in (False, True, "step"):
            assert_same(run_model(model, samples, [table], strategy, compiled), expected)


def _gradients(model, samples, options, param, runs, passes=1):
    """``param``'s gradient after ``passes`` backward passes of the summed squares
    of ``model``'s outputs, per run: eager (False) or batched with ``options``
    (``outputs_of``); the gradient is zeroed before each run."""
    grads = []
    for batched in runs:
        param.zero_grad()
        for _ in range(passes):
            with autograd.record():
                outs = outputs_of(model, samples, options if batched else None)
                loss = nd.add_n(*[(o * o).sum() for o in outs])
            loss.backward()
        grads.append(param.grad().asnumpy().copy())
    return grads


def test_batch_norm_of_running_statistics_computed_in_the_sample_equals_eager():
    """Running statistics a sample computes (``F.ones(...) * 2``) carry autograd
    history in a batched step, where MXNet's backward asked for their gradient,
    which BatchNorm does not have ("Operator _NoGradient is not implemented")."""
    model = OneOp(lambda F, x: F.BatchNorm(
        F.tanh(x), F.ones((4,)) * 1.5, F.zeros((4,)) + 0.1, F.zeros((4,)) + 0.2,
        F.ones((4,)) * 2, use_global_stats=True, fix_gamma=False) * x)
    _matches_reference(model, [(0, 3), (2, 1), (5, 3), (1, 2)])


@pytest.mark.parametrize("axis", [-3, -2, "-3"])
def test_stack_along_an_axis_counted_from_the_end_equals_eager(axis):
    """``stack(..., axis=-3)`` of (2, 4) values is along axis 0: samples of two
    rows (as many as the stacked values) were batched by rows, each output
    holding every sample's rows."""
    model = OneOp(lambda F, x: F.stack(x, F.tanh(x), axis=axis) * 2)
    _matches_reference(model, [(0, 2), (2, 2), (5, 2), (1, 3)])


class Gemm2Accumulates(gdb.DynBatchBlock):
    """``F.linalg.gemm2`` of each sample's rows against a matrix whose gradient
    accumulates (``grad_req="add"``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.pre = gluon.nn.Dense(4, flatten=False, in_units=4)
            self.w = self.params.get("w", shape=(6, 4), grad_req="add")

    def hybrid_forward(self, F, x, w):
        return F.linalg.gemm2(self.pre(x), w, transpose_b=True)


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": True}, "map"])
def test_gemm2_against_a_matrix_whose_gradient_accumulates_equals_eager(options):
    """MXNet's ``gemm2`` backward adds garbage to a gradient it adds to when one
    call writes it: the batched call of every sample did (up to 4e7 off)."""
    mx.random.seed(0)
    model = Gemm2Accumulates()
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(0)
    xs = [nd.array(rs.uniform(-1, 1, (n, 4))) for n in (3, 1, 5, 2, 4)]
    eager, batched = _gradients(model, xs, options, model.w, (False, True), passes=2)
    np.testing.assert_allclose(batched, eager, rtol=1e-5, atol=1e-5)


class SparseGradLookup(gdb.DynBatchBlock):
    """``F.Embedding(..., sparse_grad=True)`` of a Parameter whose gradient is
    stored dense (declared without ``grad_stype``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.table = self.params.get("table", shape=(7, 4))

    def hybrid_forward(self, F, ids, table):
        return F.tanh(F.Embedding(ids, table, input_dim=7, output_dim=4, sparse_grad=True))


@pytest.mark.parametrize("options", [{}, {"granularity": "op"}, {"compiled": "step"},
                                     {"compiled": True}])
def test_a_sparse_gradient_lookup_of_a_dense_gradient_table_equals_eager(options):
    """Eager MXNet gives such a lookup a dense gradient; in a graph its backward
    refused it ("Cannot use sparse_grad = 1, while stype of gradients w.r.t
    embedding weight is default")."""
    model = SparseGradLookup()
    model.initialize()
    samples = [nd.array(v) for v in ([1, 2, 3], [4], [0, 6], [2, 5])]
    eager, *batched = _gradients(model, samples, options, model.table, (False, True, True))
    for grad in batched:
        np.testing.assert_allclose(grad, eager, rtol=1e-5, atol=1e-6)


class RewrittenChildCalls(gdb.DynBatchBlock):
    """Child blocks and calls that a pass records in another form only for some
    arguments: a PReLU layer, a sparse-gradient lookup of a dense-gradient
    table (attributes given by position), a split along axis 0 given by
    position; beside a leaky ReLU, a dense-gradient lookup and a split along
    axis 1, which are recorded as written."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(9, 4)
            self.prelu = gluon.nn.PReLU(mx.init.Constant(0.3))
            self.leaky = gluon.nn.LeakyReLU(0.2)
            self.table = self.params.get("table", shape=(9, 4))

    def hybrid_forward(self, F, ids, table):
        dense = self.embed(ids)
        sparse = F.Embedding(ids, table, 9, 4, "float32", True)
        h = self.prelu(dense - sparse) + self.leaky(dense * sparse)
        rows = F.split(h, h.shape[0], 0) if h.shape[0] > 1 else [h]
        halves = F.split(h, num_outputs=2, axis=1)
        return F.sum(F.concat(*rows, dim=0) * halves[0].sum(), axis=1, keepdims=True) \
            + halves[1]


@pytest.mark.parametrize("options", [{"granularity": "op"}, {"granularity": "op", "compiled": True},
                                     {"granularity": "op", "compiled": "step"}, {}])
def test_calls_a_pass_rewrites_for_some_arguments_equal_eager(options):
    """Calls of an operator with passes take the recorder's short path when the
    pass's test says it leaves them as written; the others are rewritten (a
    prelu inside a CachedOp loses gradient, a sparse-gradient lookup of a
    dense-gradient table fails in a graph's backward pass)."""
    model = RewrittenChildCalls()
    model.initialize(mx.init.Uniform(0.5))
    samples = [(nd.array(v),) for v in ([1, 2, 3], [4], [0, 6, 8, 7], [2, 5])]
    for _ in range(2):
        assert_batched_equals_eager(model, samples, options)


def test_the_calls_a_pass_may_rewrite_include_attributes_given_by_position():
    """``passes.applies``: a call goes the short path only where no pass of its
    operator may rewrite it, whichever way its attributes are given."""
    from gluon_dynbatch.record import passes
    ids, table = nd.array([1]), nd.ones((3, 2))
    embedding = passes.applies("Embedding")
    assert embedding((ids, table, 3, 2, "float32", True), {})
    assert embedding((ids, table), {"input_dim": 3, "output_dim": 2, "sparse_grad": True})
    leaky = passes.applies("LeakyReLU")
    assert leaky((ids, table, "prelu"), {}) and leaky((ids,), {"act_type": "prelu"})
    assert not leaky((ids,), {"act_type": "leaky", "slope": 0.1})
    split = passes.applies("split")
    assert split((table, 3, 0), {}) and split((table,), {"num_outputs": 3, "axis": 0})
    assert passes.applies("tanh") is True and passes.applies("dot") is False


class LookupOf(gdb.DynBatchBlock):
    """A lookup of a table whose gradient's storage and the lookup's
    ``sparse_grad`` differ: ``how`` is ``"dense lookup"`` (``F.Embedding``
    without ``sparse_grad``) or ``"contrib"`` (``F.contrib.SparseEmbedding``,
    always sparse); the table is a Parameter (``grad_stype``) or an array
    given to every sample (``table``), looked up once per sample or per word."""

    def __init__(self, how, grad_stype="default", per_word=False, **kwargs):
        super().__init__(**kwargs)
        self.how, self.per_word = how, per_word
        self.table = self.params.get("table", shape=(10, 4), grad_stype=grad_stype)

    def hybrid_forward(self, F, words, given=None, table=None):
        table = given if given is not None else table
        lookup, extra = F.Embedding, {}
        if self.how == "contrib":
            lookup, extra = F.contrib.SparseEmbedding, {"deterministic": True}
        parts = [words[k:k + 1] for k in range(words.shape[0])] if self.per_word else [words]
        return F.add_n(*[F.sum(F.tanh(lookup(w, table, input_dim=10, output_dim=4, **extra)),
                               axis=0) for w in parts])


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"compiled": "step"},
                                     {"granularity": "op"}, {"strategy": "reference"}],
                         ids=str)
@pytest.mark.parametrize("case", ["dense lookup of a row-sparse parameter",
                                  "dense lookup of a row-sparse array, per sample",
                                  "dense lookup of a row-sparse array, per word",
                                  "contrib lookup of a dense parameter"])
def test_a_lookup_whose_sparse_grad_is_not_its_tables_gradient_storage(case, options):
    """Eager MXNet falls back to the table's storage (adding the calls' dense
    gradients); a graph's backward pass refused "sparse_grad = 0, while stype of
    gradients w.r.t embedding weight is row_sparse", a compiled plan "Expected
    row sparse storage type"."""
    array = "array" in case
    model = LookupOf("contrib" if case.startswith("contrib") else "dense",
                     "row_sparse" if "parameter" in case and "row-sparse" in case
                     else "default", per_word=case.endswith("per word"))
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(0).uniform(-0.5, 0.5, (10, 4)))
    table.attach_grad(stype="row_sparse")
    samples = [nd.array(v) for v in ([1, 2, 3], [4], [1, 5])]
    runs = []
    for batched in (False, True):
        with autograd.record():
            given = (table,) if array else ()
            if batched:
                with gdb.batching(**options):
                    outs = [model(x, *given) for x in samples]
            else:
                outs = [model(x, *given) for x in samples]
            loss = nd.add_n(*[(o * o).sum() for o in outs])
        loss.backward()
        grad = table.grad if array else model.table.grad()
        runs.append(([o.asnumpy() for o in outs], grad.tostype("default").asnumpy().copy()))
    for got, want in zip(runs[1][0], runs[0][0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(runs[0][1]).sum() > 0
    np.testing.assert_allclose(runs[1][1], runs[0][1], rtol=1e-5, atol=1e-6)


_COMPUTED_INDICES = r"""
import sys
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd
import gluon_dynbatch as gdb

class Lookup(gdb.DynBatchBlock):
    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(6, in_units=4, flatten=False)
            self.table = self.params.get("table", shape=(10, 6))
    def hybrid_forward(self, F, x, table):
        h = self.dense(x)
        idx = F.clip(F.floor(F.abs(h[:, 0]) * 5), 0, 9)
        e = F.Embedding(idx, table, input_dim=10, output_dim=6) if self.how == "embedding" \
            else F.take(table, idx)
        return h * F.sum(e, axis=0, keepdims=True) + e.sum()

model = Lookup(sys.argv[1])
model.initialize(mx.init.Uniform(0.5))
rs = np.random.RandomState(0)
xs = [nd.array(rs.randn(n, 4)) for n in (1, 3, 2, 4)]
for options in (None, dict(granularity="op", compiled="step", max_pending_nodes=5)):
    with autograd.record():
        if options is None:
            outs = [model(x) for x in xs]
        else:
            with gdb.batching(**options):
                outs = [model(x) for x in xs]
        loss = nd.add_n(*[o.sum() for o in outs])
    loss.backward()
    print(float(loss.asscalar()), float(model.table.grad().sum().asscalar()))
"""


@pytest.mark.parametrize("how", ["embedding", "take"])
def test_compiled_steps_of_a_lookup_by_indices_the_sample_computes(how):
    # The gather of the indices took a zero gradient only, inside a compiled
    # step: MXNet's backward pass crashed the process (a segfault).
    eager, batched = [[float(v) for v in line.split()]
                      for line in output_of_script(_COMPUTED_INDICES, how).split("\n")[:2]]
    np.testing.assert_allclose(batched, eager, rtol=1e-5)


class VectorLM(gdb.DynBatchBlock):
    """A language model on 1-d vectors, DyNet's way: ``pickneglogsoftmax`` as
    ``-F.pick(F.log_softmax(v), F.array([y]), axis=0)``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.E = self.params.get("E", shape=(9, 4))
        self.W = self.params.get("W", shape=(4, 4))
        self.R = self.params.get("R", shape=(9, 4))

    def hybrid_forward(self, F, sentence, E, W, R):
        h, losses = F.zeros((4,)), []
        for word, nxt in zip(sentence, sentence[1:] + [0]):
            h = F.tanh(F.dot(W, h) + E[word])
            losses.append(-F.pick(F.log_softmax(F.dot(R, h)), F.array([nxt]), axis=0))
        return F.add_n(*losses)


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"granularity": "op"}], ids=str)
def test_picks_of_1d_vectors_batch(options):
    model = VectorLM()
    model.initialize(mx.init.Uniform(0.3))
    r = random.Random(0)
    samples = [([r.randrange(1, 9) for _ in range(r.randint(2, 7))],) for _ in range(8)]
    assert_batched_equals_eager(model, samples, options)
    with gdb.batching(**options) as scope:
        outs = [model(*sample) for sample in samples]
    assert all(np.isfinite(out.asnumpy()).all() for out in outs)
    picks = sum(len(sample[0]) for sample in samples)
    assert scope.stats.steps < picks        # (each pick ran as a step of its own)


class ArgmaxOfScaled(gdb.DynBatchBlock):
    """``argmax`` over a sample's rows of its input scaled by a parameter."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.w = self.params.get("w", shape=(4,), init=mx.init.One())

    def hybrid_forward(self, F, x, w):
        return F.argmax(F.broadcast_mul(x, w), axis=0)


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": True},
                                     {"compiled": "plan"}])
def test_argmax_of_an_infinite_value_gives_the_weights_eagers_zero_gradient(options):
    """Compiled steps and plans differentiated the product under the argmax (its
    gradient zero): zero times the infinite input made the weight's gradient NaN."""
    model = ArgmaxOfScaled()
    model.initialize()
    xs = [nd.array(np.arange(8).reshape(2, 4)), nd.array(np.arange(12).reshape(3, 4)),
          nd.array([[1., np.inf, 2, 3], [0, 1, 2, 3]])]
    eager, *batched = _gradients(model, xs, options, model.w, (False, True, True))
    for grad in batched:
        np.testing.assert_array_equal(grad, eager)


def test_reshape_like_of_ranges_of_axes_equals_eager():
    """``reshape_like`` with ``lhs_begin`` ... ``rhs_end`` takes part of ``like``'s
    shape: its rows were concatenated like the output's, and a step of samples
    whose rows happened to match ``like``'s failed in MXNet."""
    model = OneOp(lambda F, x: F.reshape_like(
        F.tanh(x), F.zeros((2, 2)), lhs_begin=1, lhs_end=2, rhs_begin=0,
        rhs_end=2) * 2)
    _matches_reference(model, [(0, 2), (2, 2), (5, 4), (1, 2), (6, 4)])


@pytest.mark.parametrize("op", ["max", "min"])
def test_ragged_max_and_min_over_rows_batch_in_one_step_and_keep_infinities_apart(op):
    model = OneOp(lambda F, x: getattr(F, op)(x, axis=0, keepdims=True) * 2)
    rng = np.random.RandomState(1)
    values = rng.uniform(-1, 1, size=(12, 4))
    values[5, 2] = -np.inf if op == "max" else np.inf      # sample (5, 1) alone holds it
    table = nd.array(values)
    samples = [(0, 3), (5, 1), (6, 4), (1, 2)]
    expected = reference_run(model, samples, [table])
    for compiled in (False, True, "step"):
        got = run_model(model, samples, [table], "depth", compiled)
        assert_same(got, expected)
        assert got[2].steps == 1
    outs = [np.asarray(v) for v in got[0]]
    assert np.isinf(outs[1][0, 2]) and all(np.isfinite(outs[k]).all() for k in (0, 2, 3))


@pytest.mark.parametrize("ret_typ", ["value", "both"])
def test_k_max_pooling_over_ragged_rows_is_one_step_and_a_short_sample_fails_as_eager(ret_typ):
    """``F.topk(x, axis=0, k=2, ret_typ="value")`` of every sample's rows (k-max
    pooling) ran one call per sample; a sample with fewer rows than ``k`` gets
    MXNet's error."""
    def pool(F, x):
        found = F.topk(F.tanh(x) * 2, axis=0, k=2, ret_typ=ret_typ)
        return found if ret_typ == "value" else found[0] * (found[1] + 1)
    model = OneOp(pool)
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 2), (6, 5), (1, 2), (3, 4)]
    expected = reference_run(model, samples, [table])
    assert_same(run_model(model, samples, [table], "eager"), expected)
    for compiled in (False, True, "step"):
        got = run_model(model, samples, [table], "depth", compiled)
        assert_same(got, expected)
        # Indices may differ by ties with the padding: one call per sample.
        assert got[2].steps == 1 if ret_typ == "value" else got[2].steps > 1
    with pytest.raises(Exception, match="k must be smaller"):
        model((7, 1), table)
    with pytest.raises(gdb.BatchingError, match="sample 1.*k must be smaller"):
        with gdb.batching():
            [model(sample, table) for sample in [(0, 3), (7, 1)]]
    assert_same(run_model(model, samples, [table], "depth"), expected)


def test_k_max_pooling_of_rows_with_infinities_keeps_each_samples_values():
    """A sample's own -inf ties with the padding, and MXNet's order of ties is
    not stable: values stay each sample's own."""
    model = OneOp(lambda F, x: F.topk(x, axis=0, k=45, ret_typ="value") * 2)
    values = np.full((120, 3), -np.inf)
    values[::7] = np.random.RandomState(4).uniform(-1, 1, size=values[::7].shape)
    table = nd.array(values)
    samples = [(0, 50), (50, 60), (60, 46)]
    expected = run_model(model, samples, [table], "eager")
    for compiled in (False, "step"):
        got = run_model(model, samples, [table], "depth", compiled)
        assert got[2].steps == 1
        for out, want in zip(got[0], expected[0]):
            np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_over_ragged_rows_is_one_step_and_a_sample_alone_keeps_its_own(op):
    model = OneOp(lambda F, x: getattr(F, op)(x * 3, axis=0))
    table = nd.array(np.random.RandomState(2).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 1), (6, 5), (1, 2), (3, 1)]
    expected = reference_run(model, samples, [table])
    for compiled in (False, True, "step"):
        got = run_model(model, samples, [table], "depth", compiled)
        assert_same(got, expected)
        assert got[2].steps == 1
    probs = [np.exp(v) if op == "log_softmax" else v for v in got[0]]
    assert all(np.allclose(p.sum(axis=0), 1.0) for p in probs)
    assert np.allclose(probs[1], 1.0)           # one row: all its weight


def _score_columns(F, x):
    """A (1, 3) row of scores made of one-column pieces, as per-child attention makes."""
    row = x[0:1]
    return F.concat(row[:, 0:1], F.tanh(row[:, 1:2]), row[:, 2:3] * 2, dim=1)


SCORE_HEADS = {
    "softmax": lambda F, s: F.softmax(s, axis=1),
    "log_softmax": lambda F, s: F.log_softmax(s),
    "cross_entropy": lambda F, s: F.softmax_cross_entropy(s, F.array([1])),
}


@pytest.mark.parametrize("head", sorted(SCORE_HEADS))
@pytest.mark.parametrize("count", [2, 3])
def test_softmax_of_scores_concatenated_from_single_columns(head, count):
    # MKLDNN's softmax segfaults on such a concat's output with 2 or 3 rows.
    model = OneOp(lambda F, x: SCORE_HEADS[head](F, _score_columns(F, x)))
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 2), (5, 1), (6, 3)][:count]
    expected = reference_run(model, samples, [table])
    for strategy in ("depth", "agenda"):
        for compiled in (False, True, "step"):
            got = run_model(model, samples, [table], strategy, compiled)
            assert_same(got, expected)
            assert got[2].mean_batch_size > 1


@pytest.mark.parametrize("granularity", ["call", "op"])
def test_broadcast_like_of_a_row_or_a_column_batches_across_samples(granularity):
    model = OneOp(lambda F, x: F.broadcast_like(x[0:1], x) + F.broadcast_like(x[:, 1:2], x))
    table = nd.array(np.random.RandomState(4).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 1), (6, 4), (1, 2)]
    expected = reference_run(model, samples, [table])
    got = run_model(model, samples, [table], "depth", granularity=granularity)
    assert_same(got, expected)
    assert got[2].steps <= 4          # 10 with each broadcast_like alone


@pytest.mark.parametrize("granularity", ["call", "op"])
def test_reshapes_of_inputs_of_other_widths_to_one_shape_do_not_batch_together(granularity):
    # Both give (-1,): a (rows, 4) input and a (rows, 3) one cannot be concatenated
    # (a fused rnn.LSTM flattens its (4H, E) and (4H, H) weights so).
    model = OneOp(lambda F, x: F.reshape(x * 2, shape=(-1,)) if x.shape[0] == 3
                  else F.reshape(F.slice_axis(x, axis=1, begin=0, end=3), shape=(-1,)))
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (2, 1), (5, 3), (1, 2)]
    expected = reference_run(model, samples, [table])
    for compiled in (False, True, "step"):
        assert_same(run_model(model, samples, [table], "depth", compiled,
                              granularity=granularity), expected)


def test_reshape_family_batches_into_one_step():
    model = OneOp(lambda F, x: F.expand_dims(x, axis=1))
    table = nd.random.uniform(shape=(9, 4))
    with gdb.batching(strategy="depth", keep_plan=True) as scope:
        outs = [model((k, 2), table) for k in range(4)]
    steps = scope.last_plan.steps       # the sample's whole call is one program
    assert [len(s.nodes) for s in steps] == [4]
    (entry,) = steps[0].nodes[0].op.entries
    assert entry.op.name == "expand_dims"
    assert all(o.shape == (2, 1, 4) for o in outs)


def test_rule_registry_lookup_and_registration():
    from gluon_dynbatch.rules import ALONE, RowRule, first_row_roles, rule_for
    assert rule_for("no_such_operator") is ALONE
    assert rule_for("tanh").batching == "rows"
    gdb.register_rule("my_custom_op_for_test", RowRule(first_row_roles))
    assert isinstance(rule_for("my_custom_op_for_test"), RowRule)
    # Anything else was taken, and failed later while recording, naming no call.
    with pytest.raises(TypeError, match="no batching rule"):
        gdb.register_rule("my_other_op_for_test", "rows")
    with pytest.raises(TypeError, match="operator names are strings"):
        gdb.register_rule([RowRule], RowRule(first_row_roles))
    assert rule_for("my_other_op_for_test") is ALONE


def test_reductions_over_every_axis_of_one_row_batch_across_samples():
    model = OneOp(lambda F, x: F.norm(x[0:1]) * F.sum(x[0:1] * x[0:1]))
    table = nd.array(np.random.RandomState(4).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 1), (6, 4), (1, 2)]
    expected = reference_run(model, samples, [table])
    with gdb.batching(strategy="depth", keep_plan=True, granularity="op") as scope:
        outs = [model(s, table) for s in samples]
    assert all(o.shape == (1,) for o in outs)
    reductions = [s for s in scope.last_plan.steps if s.nodes[0].op.name in ("norm", "sum")]
    assert sorted(len(s.nodes) for s in reductions) == [len(samples)] * 2
    for compiled in (False, True, "step"):
        assert_same(run_model(model, samples, [table], "depth", compiled), expected)


def test_one_hot_of_each_samples_label_is_one_step():
    model = OneOp(lambda F, x: F.one_hot(F.array([x.shape[0]]), 5) * x[0:1, 0:1])
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 1), (6, 4), (1, 2)]
    with gdb.batching(strategy="depth", keep_plan=True, granularity="op") as scope:
        outs = [model(s, table) for s in samples]
    steps = [s for s in scope.last_plan.steps if s.nodes[0].op.name == "one_hot"]
    assert [len(s.nodes) for s in steps] == [len(samples)]
    for (_, rows), out in zip(samples, outs):
        assert out.asnumpy()[0].nonzero()[0].tolist() == [rows]


def _dots_of_own_rows(fn):
    """(model, samples, table, the reference run, the scope of one batched run) of
    ``OneOp(fn)`` over samples of 2 and 3 rows, each output a (1, 4) row."""
    model = OneOp(fn)
    table = nd.array(np.random.RandomState(5).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 3), (6, 2), (1, 3), (2, 2)]
    expected = reference_run(model, samples, [table])
    with gdb.batching(strategy="depth", keep_plan=True, granularity="op") as scope:
        outs = [model(s, table) for s in samples]
    assert all(o.shape == (1, 4) for o in outs)
    return model, samples, table, expected, scope


def test_attention_over_each_samples_own_rows_batches_across_lengths():
    # F.dot(q, K, transpose_b=True), a softmax along the row and F.dot(w, K)
    # are recorded in column form (columns.py): one step each for all lengths.
    model, samples, table, expected, scope = _dots_of_own_rows(
        lambda F, x: F.dot(F.softmax(F.dot(x[0:1], F.tanh(x), transpose_b=True), axis=1), x))
    names = [s.nodes[0].op.name for s in scope.last_plan.steps]
    assert "dot" not in names and names.count("softmax") == 1, names
    assert all(len(s.nodes) == len(samples) for s in scope.last_plan.steps), names
    for compiled in (False, True, "step"):
        for granularity in ("call", "op"):
            assert_same(run_model(model, samples, [table], "depth", compiled,
                                  granularity=granularity), expected)


def test_dots_against_each_samples_own_values_batch_by_shape():
    # Weights that are no column's reshape: one batch_dot per shape.
    model, samples, table, expected, scope = _dots_of_own_rows(
        lambda F, x: F.dot(F.tanh(x[0:1, 0:x.shape[0]]), x))
    dots = sorted(len(s.nodes) for s in scope.last_plan.steps if s.nodes[0].op.name == "dot")
    assert dots == [2, 3]                   # per shape: 3 rows and 2 rows
    for compiled in (False, True, "step"):
        assert_same(run_model(model, samples, [table], "depth", compiled), expected)


def test_transposes_that_move_the_rows_batch_by_shape():
    model = OneOp(lambda F, x: F.transpose(F.tanh(x)) * 2)
    table = nd.array(np.random.RandomState(6).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 3), (6, 2), (1, 3)]
    expected = reference_run(model, samples, [table])
    with gdb.batching(strategy="depth", keep_plan=True, granularity="op") as scope:
        outs = [model(s, table) for s in samples]
    assert [o.shape for o in outs] == [(4, 3), (4, 3), (4, 2), (4, 3)]
    steps = sorted(len(s.nodes) for s in scope.last_plan.steps
                   if s.nodes[0].op.name == "transpose")
    assert steps == [1, 3]
    for compiled in (False, True, "step"):
        assert_same(run_model(model, samples, [table], "depth", compiled), expected)


def test_compiled_steps_of_per_sample_dots_and_transposes_keep_their_shapes():
    # Found by the fuzzer: calls of (1, 4) and (2, 4) rows have the same trailing
    # shapes, but their batched calls reshape to the whole shapes, so the compiled
    # step of one cannot serve the other.
    def fn(F, x):
        b = F.broadcast_mul(F.ones((4, 4)), F.tanh(x[0:1]))
        return F.dot(x, b) + F.transpose(F.transpose(x * 2))

    model = OneOp(fn)
    table = nd.array(np.random.RandomState(7).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 1), (2, 2), (5, 1), (6, 2), (8, 2)]
    expected = reference_run(model, samples, [table])
    for compiled in (True, "step"):
        for granularity in ("call", "op"):
            assert_same(run_model(model, samples, [table], "depth", compiled,
                                  granularity=granularity), expected)


class MadeWeightTwice(gdb.DynBatchBlock):
    """Two copies of a loop body, each a dot against a weight made in the call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.mat = self.params.get("mat", shape=(4, 4))

    def hybrid_forward(self, F, sample, table, mat):
        start, rows = sample
        values = [table[start:start + rows]]
        for _ in range(2):
            values.append(F.tanh(F.dot(values[0], F.transpose(mat) * 0.5)))
        return values[1] + values[2]


def test_two_dots_against_values_made_in_the_call_are_not_stacked():
    # Found by the fuzzer: the loop body's two dots were stacked as rows, which
    # gave dot((2, 4), (8, 4)); a per-sample dot's batched call is its own.
    model = MadeWeightTwice()
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(8).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 1), (2, 2), (5, 1)]
    expected = reference_run(model, samples, [table])
    for compiled in (False, True, "step"):
        assert_same(run_model(model, samples, [table], "depth", compiled), expected)



# Each batches in one step: aliases as their operator, slices with steps as slices,
# tile and SoftmaxActivation by their rules.
@pytest.mark.parametrize("name", sorted(ALIASES) + [
    "stepped_slices_sum", "tile_columns", "tile_short_reps", "softmax_activation",
    "softmax_activation_channel"])
def test_these_operators_batch_in_one_step(name):
    model = OneOp(CASES[name])
    table = nd.array(np.random.RandomState(5).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 1), (6, 4), (1, 2)]
    got = run_model(model, samples, [table], "depth")
    assert_same(got, reference_run(model, samples, [table]))
    assert got[2].steps == 1


def test_transposes_that_move_the_rows_are_held_by_programs():
    # A frame of one shape, transpose included, is one program: no transpose step.
    model = OneOp(lambda F, x: F.sum(F.transpose(F.tanh(x)) * 2, axis=1, keepdims=True))
    table = nd.array(np.random.RandomState(7).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 3), (6, 2), (1, 3)]
    expected = reference_run(model, samples, [table])
    with gdb.batching(strategy="depth", keep_plan=True) as scope:
        outs = [model(s, table) for s in samples]
    nd.waitall()
    assert [o.shape for o in outs] == [(4, 1)] * 4
    names = [s.nodes[0].op.name for s in scope.last_plan.steps]
    assert "transpose" not in names and len(names) == 2, names    # one program per shape
    for compiled in (False, True, "step"):
        assert_same(run_model(model, samples, [table], "depth", compiled), expected)


class Repeat(gdb.DynBatchBlock):
    """Rows repeated and tiled along axis 0 (``F.repeat``, ``F.tile``)."""

    def __init__(self, repeats, **kwargs):
        super().__init__(**kwargs)
        self.repeats = repeats
        with self.name_scope():
            self.proj = gluon.nn.Dense(3)

    def hybrid_forward(self, F, words, table):
        h = self.proj(F.concat(*[table[w:w + 1] for w in words], dim=0))
        twice = F.repeat(h, repeats=self.repeats, axis=0) * F.tile(h, (self.repeats, 1))
        return F.sum(twice, axis=0, keepdims=True)


@pytest.mark.parametrize("repeats", [1, 3])
def test_rows_repeated_along_axis_0_are_a_view(repeats):
    model = make_model(Repeat, repeats=repeats)
    sentences = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 0]]
    table = nd.array(np.random.RandomState(1).uniform(-1, 1, (10, 4)))
    check_all_strategies(model, sentences, [table], compiled=(False, True))
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(words, table) for words in sentences]
    nd.waitall()
    assert len(outs) == 4
    assert not [step for step in scope.last_plan.steps if step.nodes[0].op.name == "repeat"]


class SubNamespaces(gdb.DynBatchBlock):
    """Operators of ``F.linalg`` and ``F.contrib`` (positions by ``arange_like``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(4, 4))

    def hybrid_forward(self, F, words, table, weight):
        x = F.concat(*[table[w:w + 1] for w in words], dim=0)
        x = x + F.contrib.arange_like(x, axis=0).reshape((-1, 1)) / 4 \
            + F.contrib.arange_like(x, start=1, repeat=2) / 8
        a = F.linalg.gemm2(F.tanh(x), weight, transpose_b=True)
        score = F.linalg.gemm2(a[0:1], x[-1:], transpose_b=True, alpha=0.5)
        return F.sum(a, axis=0, keepdims=True) * score


def test_operators_of_linalg_and_contrib_are_recorded_not_read():
    model = make_model(SubNamespaces)
    sentences = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 0], [2, 3, 4]]
    table = nd.array(np.random.RandomState(2).uniform(-1, 1, (10, 4)))
    check_all_strategies(model, sentences, [table], compiled=(False, True))
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(words, table) for words in sentences]
    nd.waitall()
    assert len(outs) == len(sentences) and scope.stats.reads == 0
    names = [step.nodes[0].op.name for step in scope.last_plan.steps]
    assert "arange_like" not in names           # literals: no step at all
    # a . W of every sentence of more than one word in one step (in a program)
    gemms = [len(s.nodes) for s in scope.last_plan.steps
             if "gemm2" in [e.op.name for e in getattr(s.nodes[0].op, "entries", ())]]
    assert max(gemms) == len(sentences) - 1


class PositionsOnly(gdb.DynBatchBlock):
    """Outputs made by ``arange_like`` alone: values of the input's shape only,
    whose gradient is zero (eager's are in the graph all the same)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, words, table):
        h = self.dense(F.concat(*[table[w:w + 1] for w in words], dim=0))
        return (F.contrib.arange_like(h, axis=0),
                F.contrib.arange_like(h, start=2, step=3, repeat=2), F.tanh(h))


def test_a_loss_of_positions_alone_differentiates_as_in_eager():
    # Recorded as a literal, such an output had no history: the backward pass
    # of a loss of them raised "not in a computational graph".
    model = make_model(PositionsOnly)
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, (10, 4)))
    for seed in range(3):
        r = rng(seed)
        sentences = [[r.randrange(10) for _ in range(r.randint(1, 5))] for _ in range(5)]
        check_all_strategies(model, sentences, [table], compiled=(False, True, "plan"))
        for strategy in ("depth", "reference"):
            model.collect_params().zero_grad()
            with autograd.record():
                with gdb.batching(strategy=strategy):
                    outs = [model(words, table)[0] for words in sentences]
                loss = nd.add_n(*[o.sum() for o in outs])
            loss.backward()
            assert all((p.grad().asnumpy() == 0).all()
                       for p in model.collect_params().values())


@pytest.mark.parametrize("name", ["sum_every_axis", "mean_every_axis_keepdims",
                                  "max_axes_listed", "min_every_axis_fluent"])
def test_reductions_over_every_axis_of_several_rows_batch_across_samples(name):
    # Each sample's values are one segment: one step for the samples of several
    # rows (another for one of one row, unless the axes are listed), not one per sample.
    model = OneOp(CASES[name])
    table = nd.array(np.random.RandomState(6).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 1), (6, 4), (1, 2), (3, 3), (2, 4)]
    expected = reference_run(model, samples, [table])
    with gdb.batching(keep_plan=True, granularity="op") as scope:
        outs = [model(s, table) for s in samples]
    assert_same(run_model(model, samples, [table], "depth"), expected)
    nd.waitall()
    assert len(outs) == len(samples)
    reductions = [len(step.nodes) for step in scope.last_plan.steps
                  if step.nodes[0].op.name in ("sum", "mean", "max", "min")]
    assert sum(reductions) == len(samples) and len(reductions) <= 2


class _SequenceOps(gdb.DynBatchBlock):
    """Time-first (T, 1, C) steps of a sample through the ``Sequence*`` operators."""

    def hybrid_forward(self, F, sample, table):
        start, rows = sample
        x = F.expand_dims(F.tanh(table[start:start + rows]), axis=1)        # (T, 1, C)
        length = F.array([max(1, rows - 1)])
        masked = F.SequenceMask(x, sequence_length=length, use_sequence_length=True, value=-1.)
        last = F.SequenceLast(x * 2, sequence_length=length, use_sequence_length=True)
        flipped = F.SequenceReverse(x, sequence_length=length, use_sequence_length=True)
        plain = F.SequenceReverse(F.SequenceMask(x * 3))             # without lengths
        first = F.swapaxes(x, dim1=0, dim2=1)                          # (1, T, C): batch first
        kept = F.SequenceMask(first, sequence_length=length, use_sequence_length=True, axis=1)
        final = F.SequenceLast(first, sequence_length=length, use_sequence_length=True, axis=1)
        return F.concat(F.sum(masked + flipped * plain, axis=0), last, final,
                        F.sum(kept, axis=1), dim=1), flipped


class _ReadSequence(gdb.DynBatchBlock):
    """A sample that reads a ``Sequence*`` operator's output taken without lengths."""

    def __init__(self, op, **kwargs):
        super().__init__(**kwargs)
        self.op = op
        with self.name_scope():
            self.proj = gluon.nn.Dense(3, in_units=3, flatten=False)

    def hybrid_forward(self, F, x):
        h = self.proj(F.expand_dims(x, axis=1))                 # (T, 1, 3)
        seen = getattr(F, self.op)(h).asnumpy()
        return h * float(seen.sum())


@pytest.mark.parametrize("op", ["SequenceReverse", "SequenceMask", "SequenceLast"])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, "map"], ids=str)
def test_a_sequence_operator_without_lengths_read_inside_a_sample(op, options):
    model = _ReadSequence(op)
    model.initialize(mx.init.Uniform(0.5))
    rng = np.random.RandomState(3)
    samples = [(nd.array(rng.uniform(-1, 1, (t, 3))),) for t in (3, 1, 2)]
    assert_batched_equals_eager(model, samples, options)


@pytest.mark.parametrize("granularity", ["call", "op"])
def test_sequence_operators_over_time_first_steps_batch_by_length(granularity):
    model = _SequenceOps()
    table = nd.array(np.random.RandomState(7).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 3), (6, 2), (1, 3), (2, 1)]
    expected = reference_run(model, samples, [table])
    with gdb.batching(strategy="depth", keep_plan=True, granularity=granularity) as scope:
        outs = [model(s, table) for s in samples]
    assert [o[1].shape for o in outs] == [(3, 1, 4), (3, 1, 4), (2, 1, 4), (3, 1, 4), (1, 1, 4)]
    sizes = {}
    for step in scope.last_plan.steps:
        for node in step.nodes:
            if node.op.name.startswith("Sequence"):
                sizes.setdefault(node.op.name, []).append(len(step.nodes))
    # One step per length (3, 2 and 1 steps): 3 samples, 1 and 1 (each node
    # counts its step's size).  Batch first, they are rows: programs hold them.
    assert sorted(sizes["SequenceReverse"]) == [1] * 4 + [3] * 6
    if granularity == "op":
        assert sorted(sizes["SequenceLast"]) == [1] * 4 + [3] * 6
        assert sorted(sizes["SequenceMask"]) == [1] * 6 + [3] * 9
    for compiled in (False, True, "step"):
        assert_same(run_model(model, samples, [table], "depth", compiled,
                              granularity=granularity), expected)


class _SelfAttention(gdb.DynBatchBlock):
    """One sentence's (T, 1, C) rows through self-attention's interleaved
    products, as gluonnlp's BERT and Transformer encoders compute it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = gluon.nn.Dense(3 * 2 * 4, flatten=False, in_units=4)

    def hybrid_forward(self, F, sample, table):
        start, rows = sample
        x = F.expand_dims(table[start:start + rows], axis=1)               # (T, 1, C)
        qkv = self.proj(x)
        scores = F.contrib.interleaved_matmul_selfatt_qk(qkv, heads=2)     # (2, T, T)
        att = F.softmax(scores, axis=-1)
        return F.contrib.interleaved_matmul_selfatt_valatt(qkv, att, heads=2)


def test_self_attention_products_batch_by_length():
    model = _SelfAttention()
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 3), (6, 2), (1, 3), (2, 1), (4, 2)]
    expected = reference_run(model, samples, [table])
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(s, table) for s in samples]
    assert [o.shape for o in outs] == [(3, 1, 8), (3, 1, 8), (2, 1, 8), (3, 1, 8), (1, 1, 8),
                                       (2, 1, 8)]
    sizes = sorted(len(step.nodes) for step in scope.last_plan.steps
                   if step.nodes[0].op.name.startswith("interleaved"))
    assert sizes == [1, 1, 2, 2, 3, 3]      # one call per length and product (3, 2 and 1)
    for strategy in ("depth", "agenda"):
        for compiled in (False, True, "step"):
            assert_same(run_model(model, samples, [table], strategy, compiled), expected)


class _ScaledScores(gdb.DynBatchBlock):
    """Attention scores of a sentence scaled by ``contrib.div_sqrt_dim``, as
    gluonnlp's attention cells scale them; also of a (T,) vector, whose last
    axis is its rows."""

    def hybrid_forward(self, F, sample, table):
        start, rows = sample
        x = F.tanh(table[start:start + rows])                            # (T, C)
        scores = F.contrib.div_sqrt_dim(F.dot(x, x, transpose_b=True))   # (T, T)
        vector = F.contrib.div_sqrt_dim(F.sum(x, axis=1))                # (T,)
        return F.softmax(scores, axis=-1), vector


def test_div_sqrt_dim_batches_as_rows_of_rank_two():
    model = _ScaledScores()
    table = nd.array(np.random.RandomState(5).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (5, 3), (1, 3), (2, 2), (7, 1)]
    expected = reference_run(model, samples, [table])
    with gdb.batching(keep_plan=True, granularity="op") as scope:
        outs = [model(s, table) for s in samples]
    sizes = sorted(len(step.nodes) for step in scope.last_plan.steps
                   if step.nodes[0].op.name == "div_sqrt_dim")
    assert [o[1].shape for o in outs] == [(3,), (3,), (3,), (2,), (1,)]
    assert sizes[-1] >= 3 and len(sizes) < 2 * len(samples)
    for strategy in ("depth", "agenda"):
        for compiled in (False, True, "step"):
            assert_same(run_model(model, samples, [table], strategy, compiled), expected)


class _CropsImages(gdb.DynBatchBlock):
    """``F.image.crop`` of each sample's (H, W, C) image, then a Dense layer."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3)

    def hybrid_forward(self, F, image):
        return self.dense(F.reshape(F.image.crop(image, 1, 1, 2, 2), (1, -1)))


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"granularity": "op"}])
def test_image_crop_is_not_mxnets_crop_alias_of_slice(options):
    """``image.crop`` took the rule of ``crop`` (``slice``): every sample got the
    first sample's crop."""
    mx.random.seed(0)
    model = _CropsImages()
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(0)
    images = [nd.array(rs.uniform(-1, 1, (4, 5, 3))) for _ in range(4)]
    assert_batched_equals_eager(model, [(x,) for x in images], options)


class _AddsItsFunction(gdb.DynBatchBlock):
    """``elemwise_add`` of a value and its ``log_softmax``, beside a strided
    slice and a division by its norm (a graph MXNet's backward refused)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(8, flatten=False, in_units=8)

    def hybrid_forward(self, F, x):
        v = self.dense(x)
        scores = F.FullyConnected(v[-1:, ::2], F.ones((2, 4)), num_hidden=2, no_bias=True)
        scaled = F.broadcast_div(v, F.abs(F.sum(v, axis=-1, keepdims=True)) + 1)
        return scores, scaled, F.elemwise_add(F.log_softmax(v, axis=-1), v)


@pytest.mark.parametrize("compiled", [False, True, "step"])
def test_elemwise_add_of_a_value_and_its_function_differentiates_operator_by_operator(compiled):
    model = make_model(_AddsItsFunction)
    data = np.random.RandomState(1).uniform(-1, 1, (22, 8)).astype("float32")
    xs = [nd.array(data[a:b]) for a, b in [(0, 4), (4, 8), (8, 14), (14, 15), (15, 19), (19, 22)]]

    def grads(batched):
        for x in xs:
            x.attach_grad()
        with mx.autograd.record():
            if batched:
                with gdb.batching(granularity="op", compiled=compiled):
                    outs = [model(x) for x in xs]
            else:
                outs = [model(x) for x in xs]
            loss = nd.add_n(*[(o * o).sum() * (1 + 0.1 * k) + o.sum()
                              for k, o in enumerate(o for out in outs for o in out)])
        loss.backward()
        return [x.grad.asnumpy() for x in xs]

    for got, want in zip(grads(True), grads(False)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _image(F, x, channels=1):
    return F.reshape(x, shape=(-1, channels, 4 // channels // 2, 2))


IMAGE_CASES = {
    "InstanceNorm": lambda F, x: F.InstanceNorm(_image(F, x), F.ones((1,)), F.zeros((1,))),
    "GroupNorm": lambda F, x: F.GroupNorm(_image(F, x, 2), F.ones((1,)), F.zeros((1,)),
                                          num_groups=1),
    "space_to_depth": lambda F, x: F.space_to_depth(_image(F, x), block_size=2) * 2,
    "depth_to_space": lambda F, x: F.depth_to_space(
        F.reshape(x, shape=(-1, 4, 1, 1)), block_size=2) * 2,
    "AdaptiveAvgPooling2D": lambda F, x: F.contrib.AdaptiveAvgPooling2D(
        F.tanh(_image(F, x)), output_size=1),
    "UpSampling": lambda F, x: F.UpSampling(_image(F, x), scale=2, sample_type="nearest"),
    "BilinearResize2D": lambda F, x: F.contrib.BilinearResize2D(
        F.tanh(_image(F, x)), height=3, width=3),
    "BilinearSampler": lambda F, x: F.BilinearSampler(_image(F, x), F.GridGenerator(
        F.concat(x, x[:, :2], dim=1) * 0.3, transform_type="affine", target_shape=(2, 2))),
}


def _boxes(F, rows):
    """Two boxes per sample, on its first and last image."""
    return F.array([[0, 0, 0, 1, 1], [rows - 1, 0.5, 0, 1.5, 1]])


def _boxes_outside(F, rows):
    """Boxes whose image index is before or past the sample's images (MXNet pools
    nothing for them), or fractional (read toward zero), and one on its last image."""
    return F.array([[-1, 0, 0, 1, 1], [rows, 0, 0, 1, 1], [-0.5, 0, 0, 1, 1],
                    [rows - 0.5, 0.5, 0, 1.5, 1], [rows - 1, 0, 0, 1, 1]])


ROI_CASES = {
    "ROIPooling": lambda F, x: F.ROIPooling(_image(F, F.tanh(x)), _boxes(F, x.shape[0]),
                                            pooled_size=(1, 1), spatial_scale=1.0),
    "ROIPooling outside": lambda F, x: F.ROIPooling(
        _image(F, F.tanh(x)), _boxes_outside(F, x.shape[0]), pooled_size=(1, 1),
        spatial_scale=1.0),
    "ROIAlign": lambda F, x: F.contrib.ROIAlign(_image(F, F.tanh(x)), _boxes(F, x.shape[0]),
                                                pooled_size=(1, 1), spatial_scale=1.0),
}


@pytest.mark.parametrize("name", sorted(IMAGE_CASES) + sorted(ROI_CASES))
def test_image_operators_batch_per_image_and_match_per_node(name):
    model = OneOp({**IMAGE_CASES, **ROI_CASES}[name])
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, size=(12, 4)))
    samples = [(0, 3), (2, 1), (5, 3), (1, 2)]
    expected = reference_run(model, samples, [table])
    with gdb.batching(strategy="depth", keep_plan=True, granularity="op") as scope:
        outs = [model(s, table) for s in samples]
    assert len(outs) == len(samples)
    steps = [s for s in scope.last_plan.steps if s.nodes[0].op.name == name.split()[0]]
    assert [len(s.nodes) for s in steps] == [len(samples)]
    for strategy in ("depth", "agenda"):
        for compiled in (False, True, "step"):
            assert_same(run_model(model, samples, [table], strategy, compiled), expected)


class GridPooling(gdb.DynBatchBlock):
    """A convolution's grid as one row per position, laid back into a grid and
    pooled globally (a non-local block's layout)."""

    def __init__(self, channels=4, **kwargs):
        super().__init__(**kwargs)
        self.channels = channels
        with self.name_scope():
            self.conv = gluon.nn.Conv2D(channels, 3, padding=1, in_channels=2)

    def hybrid_forward(self, F, image):
        grid = self.conv(image)
        height, width = grid.shape[2], grid.shape[3]
        positions = F.transpose(F.reshape(grid, (self.channels, height * width)))
        back = F.reshape(F.transpose(positions), (1, self.channels, height, width))
        return F.Pooling(back, kernel=(1, 1), global_pool=True, pool_type="max")


def test_global_pooling_of_a_grid_laid_back_from_rows_has_a_gradient():
    """MKLDNN's pooling backward fails on such batched rows unless they are
    laid out plainly first."""
    model = make_model(GridPooling)
    r = np.random.RandomState(0)
    images = [nd.array(r.randn(1, 2, *size)) for size in
              [(3, 4), (3, 4), (5, 2), (2, 2), (5, 2), (3, 4)]]
    expected = reference_run(model, images, [])
    for strategy in ("depth", "agenda"):
        for compiled in (False, True, "step"):
            assert_same(run_model(model, images, [], strategy, compiled), expected)


class PerSampleNumbers(gdb.DynBatchBlock):
    """Each sample's own Python numbers in scalar arithmetic (an ODE step, a temperature)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4, activation="tanh")

    def hybrid_forward(self, F, sample, table):
        start, rows, dt = sample
        h = table[start:start + rows]
        for k in range(3):
            step = dt * (k + 1)
            h = h + self.dense(h) * step
            h = (h - step) / (1.0 + step)
            h = (step - h) * 0.5 + 1.0 / (2.0 + F.abs(h)) * step
        return h


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scalar_arithmetic_with_each_samples_numbers_batches_and_equals_eager(dtype):
    model = make_model(PerSampleNumbers)
    model.cast(dtype)
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, size=(12, 4)), dtype=dtype)
    samples = [(0, 3, 0.1), (2, 1, 0.25), (5, 3, 0.3), (1, 2, 0.05)]
    expected = check_all_strategies(model, samples, [table]) and \
        run_model(model, samples, [table], "eager")
    for compiled in (False, True, "step"):
        got = run_model(model, samples, [table], "depth", compiled, granularity="op")
        assert_same(got, expected)
        # Operator by operator: one step per operator and position, whatever the numbers.
        assert got[2].steps == 3 * 13


class SlopedActivations(gdb.DynBatchBlock):
    """Two prelus with a learned slope: of a vector (DyNet style, ``F.dot`` of a
    matrix and a vector) and of rows, given the slope and bounds a prelu ignores
    (keywords or positions)."""

    def __init__(self, vector, **kwargs):
        super().__init__(**kwargs)
        self.vector = vector
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(4, 4))
            self.slope = self.params.get("slope", shape=(4,), init=mx.init.Constant(0.25))
            self.channel = gluon.nn.PReLU(mx.init.Constant(0.3))

    def hybrid_forward(self, F, sample, table, weight, slope):
        start, rows = sample
        if self.vector:
            x = F.dot(weight, table[start])
            return self.channel(F.LeakyReLU(x, slope, act_type="prelu", slope=0.5))
        x = F.FullyConnected(table[start:start + rows], weight, num_hidden=4, no_bias=True)
        h = F.LeakyReLU(x, slope, act_type="prelu", slope=0.3, lower_bound=0.1)
        return F.LeakyReLU(h, slope, "prelu", 0.3)


@pytest.mark.parametrize("vector", [True, False])
def test_a_learned_prelu_slope_takes_eagers_gradient_in_every_mode(vector):
    # Inside a CachedOp (a program or a compiled plan) MXNet 1.9.1 loses part of
    # a prelu slope's gradient; every prelu is recorded in another form.
    model = make_model(SlopedActivations, vector=vector)
    table = nd.array(np.random.RandomState(2).uniform(-1, 1, (12, 4)))
    samples = [(0, 3), (2, 1), (5, 3), (1, 2), (7, 4)]
    assert_batched_equals_eager(model, [(s, table) for s in samples])
    check_all_strategies(model, samples, [table], compiled=(False, True, "step", "plan"))


class TakesOwnRows(gdb.DynBatchBlock):
    """Takes rows of its own values by indices it computes, of dtype ``dtype``
    (``nan``, ``inf``, ``1e20``: indices MXNet takes the first row for)."""

    def __init__(self, dtype, row, **kwargs):
        super().__init__(**kwargs)
        self.dtype, self.row = dtype, row
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=2)

    def hybrid_forward(self, F, x):
        index = F.ones((2,)) * float(self.row)
        return F.take(self.dense(x), F.cast(index, self.dtype))


@pytest.mark.parametrize("options", [{}, {"compiled": True}])
@pytest.mark.parametrize("dtype, rows, row", [("uint8", 100, 1), ("int8", 100, 1),
                                              ("float16", 101, 1), ("uint8", 300, 200),
                                              ("float32", 7, "nan"), ("float32", 7, "inf"),
                                              ("float32", 7, "1e20")])
def test_rows_a_sample_takes_of_its_own_values_by_any_index_dtype_are_its_own(
        dtype, rows, row, options):
    """The batch's indices were moved in the indices' own dtype: past 255 rows
    (uint8), 127 (int8) or 2048 (float16) they wrapped or rounded into another
    sample's rows; a NaN index took the first sample's first row, an infinite
    one the last row where MXNet takes the first."""
    model = TakesOwnRows(dtype, row)
    model.initialize(mx.init.Uniform(0.5))
    count = 24 if dtype == "float16" else 4
    rng = np.random.RandomState(0)
    samples = [(nd.array(rng.uniform(-1, 1, (rows, 2))),) for _ in range(count)]
    assert_batched_equals_eager(model, samples, options)


class IntegerMean(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.w = self.params.get("w", shape=(1, 2), init=mx.init.Constant(3.7))

    def hybrid_forward(self, F, x, w):
        return F.mean(F.cast(F.broadcast_mul(x, w), "int32"))


def test_the_gradient_of_an_integer_mean_over_every_axis_of_several_rows_is_eagers():
    """A mean over all axes of a (3, 2) integer value batched as a sum and a
    division: the weight's gradient was 0, where MXNet's integer division of
    the incoming gradient gives eager's."""
    model = IntegerMean()
    model.initialize()
    samples = [(nd.array(np.arange(6).reshape(3, 2) + k),) for k in range(3)]
    assert_batched_equals_eager(model, samples)


class SumsWordRows(gdb.DynBatchBlock):
    """Sums the rows of a table it is given at a sentence's word ids (a memory
    network's sentence encodings)."""

    def hybrid_forward(self, F, words, table):
        return F.sum(F.take(table, F.array(words)), axis=0, keepdims=True)


def test_calls_whose_rule_reads_their_sources_are_analysed_once_per_kind_of_source(
        monkeypatch):
    """A ``take`` recorded operator by operator (its rule asks whether the
    indices are known and the table computed per sample) was analysed at
    every call; a second scope of the same shapes analyses none, and the
    results stay eager's."""
    from gluon_dynbatch.ir import calls
    model = SumsWordRows()
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (20, 3)))
    samples = [([k, k + 1, 3], table) for k in range(5)]
    want = [model(*sample).asnumpy() for sample in samples]
    analysed = []
    original = calls.analyse
    monkeypatch.setattr(calls, "analyse",
                        lambda node, *args: analysed.append(node.op.name) or original(node, *args))
    for _ in range(2):
        del analysed[:]
        with gdb.batching(granularity="op"):
            outs = [model(*sample) for sample in samples]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-6)
    assert "take" not in analysed


_COMPUTED_LABEL = r'''
import json, sys
import numpy as np
import mxnet as mx
from mxnet import autograd, nd
from mxnet.gluon import nn
import gluon_dynbatch as gdb

class Classifier(gdb.DynBatchBlock):
    """Images of their own sizes; the loss's label cast from an int32 array."""
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv = nn.Conv2D(4, 3, padding=1, in_channels=1)
            self.out = nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, img, label):
        if sys.argv[1] == "pixels":     # a label per pixel, a row of scores each
            s = F.reshape(F.transpose(self.conv(img)[:, :3], axes=(0, 2, 3, 1)), (-1, 3))
            return F.softmax_cross_entropy(s, F.reshape(F.cast(label, "float32"), (-1,)))
        logits = self.out(F.mean(F.relu(self.conv(img)), axis=(2, 3)))
        return F.softmax_cross_entropy(logits, F.cast(label, "float32") + 0)

def grads(options):
    mx.random.seed(0)
    model = Classifier()
    model.initialize(mx.init.Uniform(0.3))
    rs = np.random.RandomState(0)
    imgs = [nd.array(rs.randn(1, 1, a, b)) for a, b in [(5, 7), (6, 6), (5, 7), (9, 4)]]
    labels = [nd.array(rs.randint(3, size=(1,) + x.shape[2:] if sys.argv[1] == "pixels"
                                  else (1,)), dtype="int32") for x in imgs]
    with autograd.record():
        if options == "eager":
            outs = [model(x, y) for x, y in zip(imgs, labels)]
        elif options == "map":
            outs = gdb.map(lambda s: model(*s), list(zip(imgs, labels)))
        else:
            with gdb.batching(**options):
                outs = [model(x, y) for x, y in zip(imgs, labels)]
        loss = nd.add_n(*[o.sum() for o in outs])
    loss.backward()
    return [float(loss.asscalar())] + [float(p.grad().abs().sum().asscalar())
                                       for p in model.collect_params().values()]

print(json.dumps([grads("eager")] + [grads(o) for o in
                                     ({}, {"compiled": "step"}, {"strategy": "agenda"}, "map")]))
'''


@pytest.mark.parametrize("kind", ["label", "pixels"])
def test_a_loss_whose_label_the_sample_computes(kind):
    # (MXNet refuses a label's gradient, or aborts, where a batched label
    # carries autograd history: in a process of its own.)
    import json
    from dynbatch_testing import output_of_script
    runs = json.loads(output_of_script(_COMPUTED_LABEL, kind).strip().splitlines()[-1])
    for run in runs[1:]:
        np.testing.assert_allclose(run, runs[0], rtol=1e-5, atol=1e-6)


_ROW_FLAGS = nd.array([1, 0])


class RowsByFlag(gdb.DynBatchBlock):
    """``F.where`` with a condition of one flag per row that every sample shares:
    made in the call (``F.ones((2,))``), or an array the module holds."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, x):
        t = self.dense(x)                                   # (2, 4)
        flags = F.ones((2,)) if self.kind == "ones" else _ROW_FLAGS
        return F.where(flags, t, t * 3)


@pytest.mark.parametrize("kind", ["ones", "held"])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": True},
                                     {"granularity": "op"}, "map"], ids=str)
def test_where_with_a_flag_per_row_shared_by_the_samples(kind, options):
    model = RowsByFlag(kind)
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(0)
    samples = [(nd.array(rs.randn(2, 3)),) for _ in range(3)]
    assert_batched_equals_eager(model, samples, options)


class Bilinear(gdb.DynBatchBlock):
    """An RNTN's bilinear term: ``batch_dot`` of a sample's (H, 1, 2H) stack against a
    3-d parameter every sample shares, on either side."""

    def __init__(self, hidden=4, left=False, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.left = hidden, left
        self.v = self.params.get("v", shape=(hidden, 2 * hidden, 2 * hidden))

    def hybrid_forward(self, F, ab, v):  # pylint: disable=arguments-differ
        h = self.hidden
        abk = F.broadcast_to(F.expand_dims(ab, 0), (h, ab.shape[0], 2 * h))
        if self.left:       # V . ab^T: (H, 2H, n)
            return F.sum(F.batch_dot(v, F.transpose(abk, axes=(0, 2, 1))), axis=1)
        return F.batch_dot(F.batch_dot(abk, v), abk, transpose_b=True).reshape((h, -1))


@pytest.mark.parametrize("left", [False, True], ids=["shared on the right", "shared on the left"])
@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": True}], ids=str)
def test_batch_dot_against_shared_3d_weights_passes_them_once(left, options):
    """Each call's matrices go side by side within the weights' entries: exact, and
    the step's inputs hold the weights once (they were copied once per call)."""
    model = Bilinear(left=left)
    model.initialize(mx.init.Uniform(0.3))
    r = np.random.RandomState(0)
    samples = [(nd.array(r.uniform(-1, 1, (n, 8))),) for n in (1, 2, 1, 3, 2, 1)]
    assert_batched_equals_eager(model, samples, options)
    with gdb.batching(keep_plan=True, **options) as scope:
        outs = [model(*sample) for sample in samples]
    assert all(np.isfinite(out.asnumpy()).all() for out in outs)
    steps = [s for s in scope.last_plan.steps if s.nodes[0].op.name == "batch_dot"]
    shared = [s for s in steps if type(s.nodes[0].rule).__name__ == "SharedBatchDotRule"]
    assert sum(len(s.nodes) for s in shared) == len(samples)     # one such call a sample
    assert len(shared) == 3                 # one step per row count


class LogDet(gdb.DynBatchBlock):
    """A sample's (n, n) positive definite matrix through ``F.linalg``: its
    log-determinant two ways, its inverse and a per-sample product."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = gluon.nn.Dense(6, in_units=3)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        h = self.proj(x)
        a = F.dot(h, h, transpose_b=True) + 4 * F.ones_like(F.dot(x, x, transpose_b=True)) \
            * F.array(np.eye(x.shape[0]))
        sign, logdet = F.linalg.slogdet(a)
        chol = F.linalg.potrf(a)
        inv = F.linalg.inverse(a)
        both = F.linalg.gemm2(inv, a, transpose_b=True)
        return F.concat(logdet * sign, F.linalg.sumlogdiag(chol),
                        F.sum(inv).reshape((1,)), F.sum(both).reshape((1,)), dim=0)


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": True},
                                     {"strategy": "reference"}], ids=str)
def test_linalg_calls_on_matrices_of_a_size_run_as_one_stack(options):
    """``slogdet``, ``sumlogdiag`` and ``gemm2`` of each sample's own matrix: one
    step per operator and matrix size (one per call before), exact; ``potrf``
    and ``inverse``, which LAPACK refuses for some values, run alone."""
    model = LogDet()
    model.initialize(mx.init.Uniform(0.3))
    r = np.random.RandomState(1)
    sizes = (2, 3, 2, 4, 3, 2, 4, 3)
    samples = [(nd.array(r.uniform(-1, 1, (n, 3))),) for n in sizes]
    assert_batched_equals_eager(model, samples, options, rtol=1e-4, atol=1e-5)
    if options.get("strategy") == "reference":
        return
    with gdb.batching(keep_plan=True, **options) as scope:
        outs = [model(*sample) for sample in samples]
    assert all(np.isfinite(out.asnumpy()).all() for out in outs)
    for name in ("slogdet", "sumlogdiag", "gemm2"):
        steps = [s for s in scope.last_plan.steps if s.nodes[0].op.name == name]
        assert 0 < len(steps) <= len(set(sizes)), name


class MergesWords(gdb.DynBatchBlock):
    """A lattice cell's merge: the character's row repeated to the rows of the words
    ending there (``broadcast_like`` over given axes, or ``broadcast_to``)."""

    def __init__(self, like, **kwargs):
        super().__init__(**kwargs)
        self.like = like
        with self.name_scope():
            self.link = gluon.nn.Dense(4, in_units=8)

    def hybrid_forward(self, F, x, words):  # pylint: disable=arguments-differ
        cw = F.tanh(words)
        if self.like:
            xb = F.broadcast_like(x, cw, lhs_axes=(0,), rhs_axes=(0,))
        else:
            xb = F.broadcast_to(x, (cw.shape[0], x.shape[1]))
        w = F.softmax(self.link(F.concat(xb, cw, dim=1)), axis=0)
        return F.sum(w * cw, axis=0, keepdims=True)


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"granularity": "op"}], ids=str)
def test_broadcast_like_over_given_axes_batches_as_broadcast_to(options):
    """Each call ran as a step of its own (no rule takes axes); recorded as the
    ``broadcast_to`` it makes, it batches as that form does."""
    r = np.random.RandomState(0)
    samples = [(nd.array(r.uniform(-1, 1, (1, 4))), nd.array(r.uniform(-1, 1, (k, 4))))
               for k in (1, 2, 3, 2, 1, 3)]
    steps = []
    for like in (True, False):
        model = MergesWords(like)
        model.initialize(mx.init.Uniform(0.3))
        assert_batched_equals_eager(model, samples, options)
        with gdb.batching(**options) as scope:
            outs = [model(*sample) for sample in samples]
        assert all(np.isfinite(out.asnumpy()).all() for out in outs)
        steps.append(scope.stats.steps)
    assert steps[0] == steps[1]
