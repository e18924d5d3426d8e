"""Differential fuzzing: random models and inputs, batched against eager.

Hypothesis draws forests of random trees (arity 0 to 5, ragged row counts,
subtrees shared between samples) whose every node runs a random straight-line
program: a DAG over the node's values with shared subexpressions, chains,
multiple outputs, operators with and without batching rules, nested child
blocks (HybridBlocks inside HybridBlocks, a second DynBatchBlock that recurses
on itself, opaque blocks run on concrete values), loops whose count depends on
the sample (over a node's children, carrying a sum; an RNN over a value's
rows), attention of a row over a value's rows, weights made from parameters
alone, literal matrices times a value and rows picked by a literal index list,
``mx.nd`` operators called directly,
values read in the middle of the scope (``asnumpy``, also under
``autograd.pause()``) and then used further, and calls under other autograd
modes (``predict_mode``).  Each node's program is its own Python path through the model, so
the templates of a scope's calls differ from node to node.  Each case runs eagerly, one
sample at a time, and batched with one strategy and one compiled mode; the
outputs, every value read mid-scope and all gradients (parameters and inputs)
must agree.

Both fuzz tests are parametrised over the 3 strategies x 3 compiled modes, so
the ``ci`` profile (25 examples per test) runs 2 x 9 x 25 = 450 cases and the
``long`` profile (``GDB_HYPOTHESIS_PROFILE=long``) 18,000.  Set
``GDB_FUZZ_ZERO_GRAD=1`` to add ``max`` behind ``BlockGrad`` (see
``TIE_OPS``).  What fuzzing found is kept as explicit regression tests at the
end of the file.
"""
import itertools
import os
import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st
from mxnet import autograd, gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import BATCHED, assert_same, reference_run, run_model

W = 4                 # feature width of every value
VOCAB = 6             # rows of the Embedding parameter
TABLE_ROWS = 16       # rows of the shared input table
MODES = list(itertools.product(BATCHED, (False, True, "step")))
MODE_IDS = ["%s-%s" % (s, c) for s, c in MODES]

# -- the model -------------------------------------------------------------------


class Inner(gluon.HybridBlock):
    """Innermost child: a Dense layer inside a HybridSequential."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.seq = gluon.nn.HybridSequential()
            self.seq.add(gluon.nn.Dense(2 * W, in_units=W, activation="tanh"))

    def hybrid_forward(self, F, x):
        return self.seq(x)


class Nested(gluon.HybridBlock):
    """A HybridBlock holding a HybridBlock holding a HybridSequential; two outputs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inner = Inner()
            self.proj = gluon.nn.Dense(W, in_units=2 * W)

    def hybrid_forward(self, F, x):
        wide = self.inner(x)
        return F.tanh(self.proj(wide)), F.slice_axis(wide, axis=1, begin=W, end=2 * W) * x


class Chain(gdb.DynBatchBlock):
    """A DynBatchBlock called by another one: recurses ``depth`` times on itself."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.lin = gluon.nn.Dense(W, in_units=W)

    def hybrid_forward(self, F, depth, x):
        y = F.tanh(self.lin(x))
        if depth > 0:
            y = self(depth - 1, y) + 0.5 * x
        return y


class OpaqueBlock(gluon.Block):
    """A plain (non-hybrid) Block: runs on concrete values, forcing a flush."""

    def forward(self, x):  # pylint: disable=arguments-differ
        return mx.nd.tanh(x) * 0.5


# A HybridBlock may not own a plain Block as a child, so the model calls this one.
OPAQUE = OpaqueBlock()


class OpaqueHybrid(gluon.HybridBlock):
    """A HybridBlock with its own ``forward``: not traceable, run on concrete values."""

    def forward(self, x):  # pylint: disable=arguments-differ
        return mx.nd.sigmoid(x) - 0.5


class FuzzNet(gdb.DynBatchBlock):
    """Interprets one random tree of node programs per sample (see module docstring).

    ``hybrid_forward`` returns ``[h, *extras]``: ``h`` (1, W) summarises the
    subtree for the parent; ``extras`` are the program outputs of every node.
    Values read mid-scope are appended to ``self.reads`` with the node that
    read them (a sample that reads waits while the others record, so samples'
    reads interleave; each sample's are in its own order); when ``self.memo``
    is a dict, subtrees reached twice (also from another sample) are
    computed once and their outputs reused.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.reads = []         # (node, value read), in the order each sample read them
        self.memo = None
        with self.name_scope():
            self.dense = gluon.nn.Dense(W, in_units=W)
            self.mix = gluon.nn.Dense(W, in_units=2 * W)
            self.nested = Nested()
            self.chain = Chain()
            # A large epsilon bounds LayerNorm's gradient on rows of nearly equal
            # values, which otherwise amplifies float32 rounding past the
            # tolerances below (hypothesis found such a row).
            self.norm = gluon.nn.LayerNorm(epsilon=0.1, in_channels=W)
            self.cell = gluon.nn.Dense(W, in_units=2 * W, activation="tanh")
            self.opaque_hybrid = OpaqueHybrid()
            self.mat = self.params.get("mat", shape=(W, W))
            self.embed = self.params.get("embed", shape=(VOCAB, W))
            self.row = self.params.get("row", shape=(1, W))
            self.vec = self.params.get("vec", shape=(W,))
            self.prelu = gluon.nn.PReLU()
            self.drop = gluon.nn.Dropout(0.5)

    def hybrid_forward(self, F, node, table, mat, embed, row, vec):
        # pylint: disable=arguments-differ
        memo = self.memo
        if memo is not None and id(node) in memo:
            return memo[id(node)]
        children = [self(child, table) for child in node.children]
        values = [table[node.offset:node.offset + node.rows]]
        if children:
            values.append(F.concat(*[c[0] for c in children], dim=0))
        for ins in node.program:
            values.extend(self._step(F, ins, values, children, node, mat, embed, row, vec))
        h = F.mean(values[node.result], axis=0, keepdims=True)
        out = [h] + [values[i] for i in node.outputs]
        for child in children:
            out.extend(child[1:])
        if memo is not None:
            memo[id(node)] = out
        return out

    def _step(self, F, ins, values, kids, node, mat, embed, row, vec):
        """Run one instruction (``kids``: the children's results, ``node``: the
        tree node running it); return the list of values it adds."""
        # pylint: disable=too-many-return-statements,too-many-branches
        op, args = ins[0], ins[1:]
        if op == "embed":                      # a source: rows of a parameter
            ids = F.array(args[0], ctx=values[0].context)
            return [F.Embedding(ids, embed, input_dim=VOCAB, output_dim=W)]
        a = values[args[0]]
        if op == "tanh":
            return [F.tanh(a)]
        if op == "sigmoid":
            return [F.sigmoid(a) - 0.5]
        if op == "dense":
            return [self.dense(a)]
        if op == "dot":
            return [F.tanh(F.dot(a, mat))]
        if op == "attend":                     # the first row attends over the rows
            scores = F.dot(a[0:1], F.tanh(a), transpose_b=True)
            return [F.dot(F.softmax(scores, axis=1), a)]
        if op == "attend2":                    # scores as a column, scaled, masked
            scores = F.dot(F.tanh(a), a[0:1].T) / 2.0
            weights = F.softmax(scores - 5.0 * (scores < -0.2), axis=0).T
            singles = [F.sum(a[k:k + 1] * a[0:1], axis=1, keepdims=True)
                       for k in range(a.shape[0])]
            second = F.exp(F.log_softmax(F.concat(*singles, dim=1)))
            return [F.dot(weights, a) + F.batch_dot(second.expand_dims(0),
                                                    a.expand_dims(0)).reshape((1, W))]
        if op == "unroll":                     # a stack on axis 1, split and indexed
            steps = F.stack(*[F.tanh(a[k:k + 1]) for k in range(a.shape[0])], axis=1)
            parts = F.split(a.expand_dims(0), axis=1, num_outputs=a.shape[0],
                            squeeze_axis=True)
            parts = parts if isinstance(parts, list) else [parts]
            return [steps[:, -1] + parts[0] * steps[0, 0:1] + F.squeeze(steps[:, 0:1], axis=1)]
        if op == "selfattend":                 # every row attends over the rows (pairs.py)
            scores = F.dot(a, F.tanh(a), transpose_b=True) / 2.0
            return [F.dot(F.softmax(scores, axis=-1), a)]
        if op == "pairmix":                    # an outer sum, a mask, along both axes
            col = F.sum(a, axis=1, keepdims=True)
            prods = F.dot(a, a, transpose_b=True)
            mixed = F.LeakyReLU(col + F.transpose(col), slope=0.1) * 0.5 + prods * (prods > -0.3)
            return [F.dot(F.softmax(mixed, axis=0), a, transpose_a=True)
                    + F.mean(mixed, axis=1, keepdims=True)]
        if op == "lowrank":                    # (W,) vectors of the node's own, broadcast
            v = F.sum(F.tanh(a), axis=0)
            return [F.broadcast_mul(a[-1:], F.sigmoid(v)) + v - F.mean(a, axis=0) + (a + v)[0:1]]
        if op in ("pick", "pickmany"):        # rows by a literal index list: few runs, or many
            picks = [a.shape[0] - 1, 0, 0] * (1 if op == "pick" else 2)
            return [F.take(a, F.array(picks, ctx=a.context)) * 1.5]
        if op == "adjacency":                  # a literal (r, r) matrix times the rows
            rows = a.shape[0]
            means = np.tril(np.ones((rows, rows), np.float32)) / np.arange(1, rows + 1)[:, None]
            return [F.dot(F.array(means.astype(np.float32), ctx=a.context), a)]
        if op == "madeweight":                 # a weight made from a parameter alone
            return [F.tanh(F.dot(a, F.transpose(mat) * 0.5))]
        if op == "rowparam":                   # a (1, W) Parameter; a weight's .data()
            weight = self.dense.weight.data(a.context)
            return [a * row + 0.5 * F.dot(a, weight, transpose_b=True)]
        if op == "vector":                     # DyNet-style 1-d vectors: W x + b, split
            v = F.tanh(F.dot(mat, a[0]) + 0.5 * F.dot(a[0], mat) + vec)
            low, high = F.split(F.concat(v, v * 2, dim=0), num_outputs=2, axis=0)
            return [a + (low * high).reshape((1, -1))]
        if op == "act":                        # nn.PReLU; a row spread by broadcast_like
            return [self.prelu(a) + 0.5 * F.broadcast_like(a[0:1], a)]
        if op == "crf":                        # a row transposed against a (W, W) Parameter
            paths = F.broadcast_add(F.transpose(a[0:1]), mat)
            total = F.log(F.sum(F.exp(paths), axis=0, keepdims=True))
            return [a + 0.1 * F.broadcast_like(total, a)]
        if op == "direct":                     # mx.nd called directly (Gluon's unroll)
            return [mx.nd.tanh(a) * 2]
        if op == "layernorm":
            return [self.norm(a)]
        if op == "nested":
            return list(self.nested(a))
        if op == "sub":
            return [self.chain(args[1], a)]
        if op == "scale":
            return [0.5 * a - 0.25]
        if op == "perscale":                   # Python numbers of each node's own
            n = len(kids)
            return [(a / (n + 1)) * (n + 0.5) - (n - a)]
        if op == "softmax1":
            return [F.softmax(a, axis=-1)]
        if op == "logsoftmax1":
            return [F.log_softmax(a, axis=1)]
        if op == "max1":                       # (see TIE_OPS)
            return [F.broadcast_sub(a, F.BlockGrad(F.max(a, axis=1, keepdims=True)))]
        if op == "floor":
            # Offset so that values a model makes exactly (a softmax's mean
            # over k rows is 1/k) sit away from the jumps: batched sums may
            # round them by one ulp.
            return [a + 0.1 * F.floor(a * 4 + 0.37)]
        if op == "compare":
            return [a * (a > 0.1) + 0.5 * a]
        if op == "reverse1":
            return [F.reverse(a, axis=1)]
        if op == "clip":
            return [F.clip(a, -0.3, 0.3)]
        if op == "split":
            left, right = F.split(a, num_outputs=2, axis=1)
            return [F.concat(right, left, dim=1), F.concat(left, right * left, dim=1)]
        if op == "reshape":
            pairs = F.tanh(a.reshape((-1, 2)))
            return [pairs.reshape((-1, W))]
        if op == "opaque":
            return [OPAQUE(a)]
        if op == "opaque_hybrid":
            return [self.opaque_hybrid(a)]
        if op == "read":
            self.reads.append((node, a.asnumpy().copy()))
            return [a * 1.5]
        if op == "pauseread":                  # read under autograd.pause(): a constant
            with autograd.pause():
                p = F.tanh(self.dense(a))
                self.reads.append((node, p.asnumpy().copy()))
            return [a + p]
        if op == "predict":                    # Dropout in predict mode: the identity
            with autograd.predict_mode():
                z = self.drop(F.tanh(a))
            return [z]
        if op == "cumsum":                     # no batching rule
            return [F.cumsum(a, axis=1) * 0.25]
        if op == "tile":                       # no batching rule
            return [F.slice_axis(F.tile(a, reps=(1, 2)), axis=1, begin=1, end=W + 1)]
        if op == "sum_all":                    # a reduction over every axis: alone
            return [F.broadcast_div(a, 1.0 + F.sum(F.square(a)))]
        if op == "norm_all":
            return [F.broadcast_div(a, 1.0 + F.sum(F.square(a)))
                    + 0.1 * F.broadcast_mul(a, F.BlockGrad(F.norm(a)))]
        if op == "softmax0":                   # a ragged softmax over the rows
            return [F.softmax(a, axis=0)]
        if op == "stack0":                     # a stack on axis 0, averaged
            return [F.stack(a, F.tanh(a), axis=0).mean(axis=0)]
        if op == "literal":                    # F.array of Python numbers
            return [F.broadcast_mul(a, F.array([[0.5 + 0.25 * k for k in range(W)]]))]
        if op == "flip0":                      # mixes rows: alone
            return [F.flip(a, axis=0)]
        if op == "transpose":                  # (r, W) -> (W, r) -> back: alone
            return [F.transpose(F.tanh(F.transpose(a)))]
        if op == "lse0":                       # log-sum-exp of the rows
            return [F.log(F.sum(F.exp(a), axis=0, keepdims=True))]
        if op == "max0":                       # a ragged max over the rows
            return [F.BlockGrad(F.max(a, axis=0, keepdims=True))
                    + F.mean(a, axis=0, keepdims=True)]
        if op == "sum0":
            return [F.sum(a, axis=0, keepdims=True) * 0.5]
        if op == "mean0":
            return [F.mean(a, axis=0, keepdims=True)]
        if op == "chain":                      # an RNN over the rows of a
            h = F.zeros((1, W))
            for i in range(a.shape[0]):
                h = self.cell(F.concat(a[i:i + 1], h, dim=1))
            return [h]
        if op == "childloop":                  # a loop over the children, carrying a sum
            acc = F.mean(a, axis=0, keepdims=True)
            for child in kids:
                acc = acc + F.sigmoid(self.dense(child[0])) * child[0]
            return [acc]
        if op == "childtotal":                 # total = 0, then total = total + x per child
            total = 0
            for child in kids:
                total = total + F.tanh(child[0])
            return [F.mean(a, axis=0, keepdims=True) + total]
        if op == "childterms":                 # several terms added per child
            acc = F.mean(a, axis=0, keepdims=True)
            for child in kids:
                acc = acc + F.tanh(child[0]) + 0.5 * child[0] + self.dense(child[0])
            return [acc]
        if op == "twice":                      # one value added more than once
            r = F.mean(a, axis=0, keepdims=True)
            return [sum([r, F.tanh(r), r]) + F.add_n(r, r)]
        if op == "rowsum":                     # Python's sum over the rows; a partial kept
            total, first = 0, None
            for k in range(a.shape[0]):
                total = total + F.tanh(a[k:k + 1])
                first = total if first is None else first
            return [total, first]
        if op == "childsum":                   # Python's sum over the children
            kids = sum(F.tanh(child[0]) for child in kids) if kids else 0.0
            return [F.mean(a, axis=0, keepdims=True) + kids]
        if op == "rows":
            return [a[args[1]:args[2]]]
        if op == "bcast":
            return [F.broadcast_to(a[0:1], shape=(args[1], W))]
        b = values[args[1]]
        if op == "add":
            return [F.broadcast_add(a, b)]
        if op == "mul":
            return [a * b]
        if op == "concat0":
            return [F.concat(a, b, dim=0)]
        if op == "concat1":
            return [self.mix(F.concat(a, b, dim=1))]
        raise AssertionError("unknown instruction %r" % (op,))


def make_fuzz_net(seed, hybridize_nested=False, **kwargs):
    """A freshly initialised FuzzNet (small uniform weights)."""
    mx.random.seed(seed)
    model = FuzzNet(**kwargs)
    model.initialize(mx.init.Uniform(0.5))
    if hybridize_nested:
        model.nested.hybridize()
    return model


def fuzz_run(model, samples, table, strategy, compiled=False, share=False):
    """``run_model`` with the reads and the memo of ``model`` reset first.

    Returns ``(result, reads)``.
    """
    model.reads = []
    model.memo = {} if share else None
    reads = any(ins[0] in ("read", "pauseread", "predict")     # samples that wait
                for node in _all_nodes(samples) for ins in node.program)
    # Samples that read run through gdb.map: their results may differ in form
    # from sample to sample (what a plain loop's placeholders cannot stand for).
    result = run_model(model, samples, [table], strategy, compiled, per_sample=reads)
    model.memo = None
    return result, _reads_per_sample(model.reads, samples)


def _reads_per_sample(reads, samples):
    """The values read, sample by sample, each in that sample's order; then those
    read at nodes several samples share, node by node: the samples take turns
    at reads, so which of them reaches a shared node first differs from eager's.
    A node read twice (by two samples, or by a sample and the memo's user)
    counts once: its first read."""
    owners = {}
    for k, root in enumerate(samples):
        stack = [root]
        while stack:
            node = stack.pop()
            owners.setdefault(id(node), set()).add(k)
            stack.extend(node.children)
    found = [[] for _ in samples]
    shared = {}
    for node, value in reads:
        ks = owners[id(node)]
        if len(ks) > 1:
            shared.setdefault(id(node), value)
        elif not any(n is node for n, _ in found[min(ks)]):
            found[min(ks)].append((node, value))
    order = list(dict.fromkeys(id(n) for n in _all_nodes(samples) if id(n) in shared))
    return [value for sample in found for _, value in sample] + [shared[i] for i in order]


def assert_sample_set_matches_eager(samples, strategy, compiled, **net_kwargs):
    """A fixed set of samples (a regression): batched equals eager."""
    model = make_fuzz_net(0, **net_kwargs)
    table = random_table(0)
    expected = fuzz_run(model, samples, table, "eager")
    got = fuzz_run(model, samples, table, strategy, compiled)
    assert_runs_agree(got, expected)


def assert_runs_agree(got, want):
    """Outputs, gradients and the values read mid-scope agree."""
    (result, reads), (ref, ref_reads) = got, want
    assert_same(result, ref, rtol=1e-4, atol=1e-5)
    assert len(reads) == len(ref_reads)
    for a, b in zip(reads, ref_reads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# -- random programs and trees ---------------------------------------------------

# Instructions, by what they need: one value (rows kept), one value (rows
# change), two values.
ROW_OPS = ("tanh", "sigmoid", "dense", "dot", "layernorm", "nested", "sub", "scale",
           "softmax1", "logsoftmax1", "reverse1", "clip", "split", "reshape", "opaque",
           "opaque_hybrid", "read", "cumsum", "tile", "sum_all", "softmax0", "flip0",
           "transpose", "stack0", "literal", "madeweight", "direct", "rowparam", "perscale",
           "vector", "act", "crf", "adjacency", "selfattend", "pairmix", "pauseread",
           "predict")
SHAPE_OPS = ("lse0", "sum0", "mean0", "chain", "rows", "bcast", "embed", "childloop",
             "childsum", "childtotal", "childterms", "attend", "rowsum", "twice",
             "attend2", "unroll", "pick", "pickmany", "lowrank")
PAIR_OPS = ("add", "mul", "concat0", "concat1")
# Operators whose gradient is zero (BlockGrad, floor, comparisons); they once
# crashed MXNet's backward after the imperative executor's concat + take gather
# (see test_regression_zero_gradient_ops_after_a_gather below).
ZERO_GRAD_OPS = ("floor", "compare", "norm_all")
# max (behind BlockGrad) jumps at ties, and float32 rounding (batched sums round
# differently) can move a tie: GDB_FUZZ_ZERO_GRAD=1 adds these to the fuzzing.
TIE_OPS = ("max1", "max0")
ALL_OPS = ROW_OPS + SHAPE_OPS + PAIR_OPS + ZERO_GRAD_OPS
if os.environ.get("GDB_FUZZ_ZERO_GRAD") == "1":
    ALL_OPS += TIE_OPS
# Values each instruction adds beyond the first.
EXTRA_OUTPUTS = {"nested": 1, "split": 1, "rowsum": 1}


class Node:
    """One tree node: rows of the table, children, and the node's program."""

    def __init__(self, offset, rows, children, program, result, outputs):
        self.offset, self.rows, self.children = offset, rows, children
        self.program, self.result, self.outputs = program, result, outputs

    def __repr__(self):
        return "Node(offset=%d, rows=%d, program=%r, result=%d, outputs=%r, children=%r)" % (
            self.offset, self.rows, self.program, self.result, self.outputs, self.children)

    def size(self):
        return 1 + sum(c.size() for c in self.children)


@st.composite
def programs(draw, rows, max_len=5):
    """A program over values with row counts ``rows``: (instructions, result, outputs)."""
    shapes = list(rows)
    program = []
    for _ in range(draw(st.integers(0, max_len))):
        op = draw(st.sampled_from(ALL_OPS))
        a = draw(st.integers(0, len(shapes) - 1))
        ra = shapes[a]
        if op in ("max0", "lse0", "sum0", "mean0", "chain", "childloop", "childsum",
                  "childtotal", "childterms", "attend", "rowsum", "twice", "attend2", "unroll",
                  "lowrank"):
            ins, out = (op, a), 1
        elif op in ("pick", "pickmany"):
            ins, out = (op, a), 3 if op == "pick" else 6
        elif op == "rows":
            start = draw(st.integers(0, ra - 1))
            stop = draw(st.integers(start + 1, ra))
            ins, out = (op, a, start, stop), stop - start
        elif op == "bcast":
            out = draw(st.integers(1, 3))
            ins = (op, a, out)
        elif op == "embed":
            ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3))
            ins, out = (op, ids), len(ids)
        elif op == "sub":
            ins, out = (op, a, draw(st.integers(0, 2))), ra
        elif op in ("add", "mul", "concat1"):
            fits = [i for i, r in enumerate(shapes)
                    if r == ra or (op != "concat1" and 1 in (r, ra))]
            b = draw(st.sampled_from(fits))
            ins, out = (op, a, b), max(ra, shapes[b])
        elif op == "concat0":
            b = draw(st.integers(0, len(shapes) - 1))
            ins, out = (op, a, b), ra + shapes[b]
        else:
            ins, out = (op, a), ra
        program.append(ins)
        shapes.extend([out] * (1 + EXTRA_OUTPUTS.get(op, 0)))
    index = st.integers(0, len(shapes) - 1)
    return program, draw(index), draw(st.lists(index, max_size=2))


@st.composite
def trees(draw, budget, depth=0, max_depth=3):
    """A random tree of at most ``budget[0]`` nodes (the budget is shared and spent)."""
    budget[0] -= 1
    arity = 0
    if depth < max_depth and budget[0] > 0:
        arity = draw(st.integers(0, min(5, budget[0])))
    children = [draw(trees(budget, depth + 1, max_depth)) for _ in range(arity)]
    rows = draw(st.integers(1, 3))
    offset = draw(st.integers(0, TABLE_ROWS - rows))
    initial = [rows] + ([len(children)] if children else [])
    program, result, outputs = draw(programs(initial))
    return Node(offset, rows, children, program, result, outputs)


@st.composite
def forests(draw, max_samples=4, max_nodes=7):
    """1 to ``max_samples`` trees; sometimes a subtree of one reappears in a later one."""
    samples = []
    for _ in range(draw(st.integers(1, max_samples))):
        tree = draw(trees([draw(st.integers(1, max_nodes))]))
        if samples and tree.children and draw(st.booleans()):
            # Replace a child (at some depth) by an earlier sample's subtree.
            # Every child adds one row to its parent, so programs stay valid;
            # with the memo on, the subtree's values are computed once and
            # shared by both samples.
            donor = draw(st.sampled_from(samples))
            while donor.children and draw(st.booleans()):
                donor = draw(st.sampled_from(donor.children))
            parent = tree
            while True:
                k = draw(st.integers(0, len(parent.children) - 1))
                if not parent.children[k].children or draw(st.booleans()):
                    break
                parent = parent.children[k]
            parent.children[k] = donor
        samples.append(tree)
    return samples


def _note_features(samples, share):
    """Tell hypothesis' statistics which features a case exercised."""
    seen = set()

    def walk(node, depth):
        seen.add("arity %d" % len(node.children))
        seen.add("depth %d" % depth)
        seen.update("op %s" % ins[0] for ins in node.program)
        for child in node.children:
            walk(child, depth + 1)
    for tree in samples:
        walk(tree, 0)
    ids = [id(n) for n in _all_nodes(samples)]
    if len(set(ids)) < len(ids):
        seen.add("shared subtree (%s)" % ("computed once" if share else "recomputed"))
    for feature in sorted(seen):
        event(feature)


def _all_nodes(samples):
    stack = list(samples)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def random_table(seed):
    """The shared input table, values in [-1, 1]."""
    return nd.array(np.random.RandomState(seed).uniform(-1, 1, size=(TABLE_ROWS, W)))


# -- the fuzz tests ----------------------------------------------------------------


@pytest.mark.parametrize("strategy,compiled", MODES, ids=MODE_IDS)
@given(samples=forests(), share=st.booleans(), hybridize=st.booleans(),
       seed=st.integers(0, 3), pending=st.sampled_from([None, None, None, 4, 25]))
def test_fuzz_random_forests_match_eager(strategy, compiled, samples, share, hybridize,
                                         seed, pending):
    """Random forests of random node programs: batched equals eager.

    ``pending`` (``max_pending_nodes``) sometimes makes the scope flush by
    itself in the middle of a sample, as a read does.
    """
    _note_features(samples, share)
    model = make_fuzz_net(seed, hybridize_nested=hybridize, max_pending_nodes=pending)
    table = random_table(seed)
    expected = fuzz_run(model, samples, table, "eager", share=share)
    got = fuzz_run(model, samples, table, strategy, compiled, share=share)
    assert_runs_agree(got, expected)


def _relabel(node, r):
    """The same structure and programs, other rows of the table."""
    offset = int(r.randint(0, TABLE_ROWS - node.rows + 1))
    return Node(offset, node.rows, [_relabel(c, r) for c in node.children], node.program,
                node.result, node.outputs)


@pytest.mark.parametrize("strategy,compiled", MODES, ids=MODE_IDS)
@given(samples=forests(max_samples=3, max_nodes=5), seed=st.integers(0, 3),
       copies=st.integers(1, 3))
def test_fuzz_consecutive_batches_reuse_plans_and_stay_exact(strategy, compiled, samples,
                                                             seed, copies):
    """Three batches in a row through one model: same shapes, new data.

    Repeating the samples (``copies``) makes batches larger; the second and
    third batches share the first's structure (so compiled plans and steps
    are reused from the cache) but read other rows of another table.
    """
    model = make_fuzz_net(seed, compiled=compiled, strategy=strategy)
    r = np.random.RandomState(seed)
    batch = samples * copies
    for k in range(3):
        table = random_table(seed + 10 * k)
        expected = fuzz_run(model, batch, table, "eager")
        got = fuzz_run(model, batch, table, strategy, compiled)
        assert_runs_agree(got, expected)
        batch = [_relabel(t, r) for t in batch]


# -- broadcasts of every rank ------------------------------------------------------
# Operands of ranks 1-4 with unit axes at random places, some axes as long as
# the sample (its length T), combined by elementwise binary operators with
# broadcasting: the shapes MXNet gives, eager's values and gradients, in every
# strategy, compiled mode and granularity, and the reference's.

BROADCAST_OPS = ("broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div",
                 "broadcast_maximum", "broadcast_minimum", "+", "-", "*")
MAX_ENTRIES = 27        # entries of an operand besides its T axis


@st.composite
def broadcast_programs(draw):
    """``(operands, steps)``: each operand ``(source, shape)``, its shape a tuple of
    sizes and ``"T"`` (the sample's length), from the sample's rows ("rows"),
    its first row ("row") or a parameter ("param"); each step ``(op, a, b)``
    combines two earlier values (operands, then step results)."""
    rank = draw(st.integers(1, 4))
    full = [draw(st.sampled_from([1, 2, 3, "T"])) for _ in range(rank)]
    while np.prod([d for d in full if d != "T"]) > MAX_ENTRIES or full.count("T") > 1:
        full[full.index("T") if full.count("T") > 1 else
             next(k for k, d in enumerate(full) if d not in (1, "T"))] = 1
    operands = []
    for _ in range(draw(st.integers(2, 3))):
        units = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
        shape = tuple(1 if unit else d for unit, d in zip(units, full))
        shape = shape[draw(st.integers(0, rank - 1)):]       # lower rank: leading axes gone
        source = "rows" if "T" in shape else draw(st.sampled_from(["row", "param"]))
        operands.append((source, shape))
    steps = []
    for k in range(draw(st.integers(1, 3))):
        count = len(operands) + k
        steps.append((draw(st.sampled_from(BROADCAST_OPS)), draw(st.integers(0, count - 1)),
                      draw(st.integers(0, count - 1))))
    return operands, steps


def _sized(shape, length):
    return tuple(length if d == "T" else d for d in shape)


class BroadcastNet(gdb.DynBatchBlock):
    """A sample ``(T, W)``: its operands made from its rows (the T axis at its
    place), its first row or parameters, then combined by broadcasts."""

    def __init__(self, program, **kwargs):
        super().__init__(**kwargs)
        self.operands, self.steps = program
        with self.name_scope():
            self.proj = gluon.nn.Dense(MAX_ENTRIES, in_units=W, flatten=False)
            for k, (source, shape) in enumerate(self.operands):
                if source == "param":
                    setattr(self, "operand%d" % k, self.params.get("operand%d" % k, shape=shape))

    def hybrid_forward(self, F, x, **params):
        length = x.shape[0]
        h = F.tanh(self.proj(x))                                    # (T, MAX_ENTRIES)
        values = []
        for k, (source, shape) in enumerate(self.operands):
            if source == "param":
                values.append(params["operand%d" % k])
                continue
            rows = h if source == "rows" else F.slice_axis(h, axis=0, begin=0, end=1)
            entries = int(np.prod([d for d in shape if d != "T"]))
            values.append(F.reshape(F.slice_axis(rows, axis=1, begin=0, end=entries),
                                    _sized(shape, length)))
        for op, a, b in self.steps:
            lhs, rhs = values[a], values[b]
            if op in ("+", "-", "*"):
                values.append(lhs + rhs if op == "+" else lhs - rhs if op == "-" else lhs * rhs)
            else:
                if op == "broadcast_div":
                    rhs = F.broadcast_add(F.abs(rhs), F.ones((1,)))
                values.append(getattr(F, op)(lhs, rhs))
        return values[-1], F.sum(F.square(values[-1]), axis=-1)


@settings(max_examples=max(4, settings().max_examples // 3))
@given(program=broadcast_programs(), lengths=st.lists(st.integers(1, 4), min_size=2,
                                                      max_size=4), seed=st.integers(0, 3))
def test_fuzz_broadcasts_of_every_rank_match_eager_and_reference(program, lengths, seed):
    """Random broadcasts between a sample's values and parameters of every rank."""
    mx.random.seed(seed)
    model = BroadcastNet(program)
    model.initialize(mx.init.Uniform(0.5))
    rng = np.random.RandomState(seed)
    samples = [nd.array(rng.uniform(-1, 1, (t, W))) for t in lengths]
    for sample, length in zip(samples, lengths):
        out = model(sample)[0]
        assert out.shape == _eager_broadcast_shape(program, length)
    expected = reference_run(model, samples, [])
    for strategy, compiled in MODES:
        assert_same(run_model(model, samples, [], strategy, compiled), expected)
    for compiled in (False, True, "step"):
        assert_same(run_model(model, samples, [], "depth", compiled, granularity="op"), expected)


def _eager_broadcast_shape(program, length):
    """The shape numpy gives the last value of ``program`` (MXNet's broadcasting
    is numpy's)."""
    operands, steps = program
    shapes = [_sized(shape, length) for _, shape in operands]
    for _, a, b in steps:
        shapes.append(np.broadcast_shapes(shapes[a], shapes[b]))
    return tuple(shapes[-1])


# -- regressions found by the fuzzer -----------------------------------------------
# (Each is a minimal reproduction kept as an explicit test.)

_ZERO_GRAD_SCRIPT = textwrap.dedent('''
    import sys
    sys.path[:0] = %(paths)r
    import numpy as np
    import mxnet as mx
    from mxnet import autograd, nd
    import gluon_dynbatch as gdb
    from dynbatch_testing import assert_same, run_model

    class ZeroGrad(gdb.DynBatchBlock):
        def hybrid_forward(self, F, k, x):
            y = F.flip(x[2 * k:2 * k + 2], axis=0)   # runs alone: one array per sample
            return %(op)s, F.tanh(y)                  # the first is batched over a gather

    model = ZeroGrad()
    x = nd.array(np.random.RandomState(0).uniform(-1, 1, size=(6, 3)))
    expected = run_model(model, [0, 1, 2], [x], "eager")
    assert_same(run_model(model, [0, 1, 2], [x], %(strategy)r, %(compiled)r), expected)
    print("same as eager")
''')


def run_isolated(script):
    """Run ``script`` in a fresh interpreter: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr




@pytest.mark.parametrize("op,strategy,compiled", [
    ("F.BlockGrad(y)", "agenda", False),
    ("y > 0", "depth", False),
    ("F.floor(y)", "agenda", False),
    ("F.BlockGrad(y)", "agenda", True),
    ("F.zeros_like(y)", "depth", "step"),
])
def test_regression_zero_gradient_ops_after_a_gather(op, strategy, compiled):
    """Found by fuzzing: a segmentation fault in backward, in a subprocess here.

    An operator whose gradient is zero (BlockGrad, stop_gradient, floor,
    round, comparisons, zeros_like), batched over inputs that the imperative
    executor gathers from several arrays (concat, then take), makes
    ``loss.backward()`` crash MXNet 1.9.1.  MXNet alone does it too::

        x.attach_grad()
        with autograd.record():
            g = nd.BlockGrad(nd.take(nd.concat(x * 1, dim=0), idx, axis=0))
            loss = (g * g).sum()
        loss.backward()                       # Segmentation fault

    Eager execution of the same model never builds that pattern.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    code, out, err = run_isolated(_ZERO_GRAD_SCRIPT % {
        "paths": [os.path.dirname(here), here], "op": op, "strategy": strategy,
        "compiled": compiled})
    assert code == 0 and "same as eager" in out, (
        "exit code %d; stderr: %s" % (code, err[-1500:]))


@pytest.mark.parametrize("second", ["reverse1", "cumsum"])
@pytest.mark.parametrize("strategy,compiled", MODES, ids=MODE_IDS)
def test_regression_static_alloc_gradient(second, strategy, compiled):
    """Found by fuzzing: wrong table gradient with ``compiled=True``.

    A node's children's mean read by ``tanh`` and by ``reverse`` (or
    ``cumsum``), inside a plan whose gathers read it too, ran as one CachedOp
    with ``static_alloc``: MXNet 1.9.1 then returned a gradient 6% off for
    the table, while the same symbol without ``static_alloc`` is exact.
    gluon_dynbatch's CachedOps do not use it (``run.STATIC_ALLOC``).
    """
    def leaf():
        return Node(0, 1, [], [], 0, [])
    inner = Node(0, 1, [leaf()], [("tanh", 1), (second, 1)], 1, [2, 3])
    samples = [Node(0, 1, [Node(0, 1, [inner, leaf()], [], 1, []), leaf()], [], 1, []),
               Node(0, 1, [Node(0, 1, [leaf(), leaf()], [], 1, []), leaf()], [], 1, [])]
    assert_sample_set_matches_eager(samples, strategy, compiled)


@pytest.mark.parametrize("strategy,compiled", MODES, ids=MODE_IDS)
def test_regression_different_rows_broadcast_to_a_multi_row_value_are_not_stacked(strategy, compiled):
    """Two calls multiply one two-row value by two different one-row values:
    grouped, the one-row values were stacked as two rows against four
    (hypothesis found it)."""
    samples = [Node(0, 2, [], [("literal", 0), ("literal", 0)], 0, [])]
    assert_sample_set_matches_eager(samples, strategy, compiled)


@pytest.mark.parametrize("strategy,compiled", MODES, ids=MODE_IDS)
def test_regression_a_literal_held_across_a_flush_is_a_constant(strategy, compiled):
    """An ``F.array`` of ids is still held when an opaque block flushes the
    scope; handed out through a gather it carried autograd history, and the
    ``Embedding`` reading it in the next graph asked for its gradient
    (hypothesis found it)."""
    samples = [Node(0, 1, [Node(0, 1, [], [], 0, [])],
                    [("tanh", 0), ("embed", [0]), ("opaque", 0)], 3, [])]
    assert_sample_set_matches_eager(samples, strategy, compiled)


@pytest.mark.parametrize("strategy,compiled", MODES, ids=MODE_IDS)
def test_regression_embedding_indices_gathered_with_other_rows_take_no_gradient(strategy,
                                                                               compiled):
    """Ids of ``F.array`` reach an ``Embedding`` after samples took turns (a call
    in predict mode) and the scope flushed by itself (``max_pending_nodes``):
    they entered a CachedOp with autograd history, whose backward then asked
    for their gradient, which ``Embedding`` refuses (hypothesis found it)."""
    program = [("predict", 0), ("embed", [0]), ("tanh", 0)]
    samples = [Node(0, 1, [], program, 2, []),
               Node(0, 1, [Node(0, 1, [], program, 2, [])], [], 0, []),
               Node(0, 1, [], [], 0, []), Node(0, 1, [], [], 0, [])]
    assert_sample_set_matches_eager(samples, strategy, compiled, max_pending_nodes=4)


@pytest.mark.parametrize("strategy,compiled", MODES, ids=MODE_IDS)
def test_regression_a_loop_reading_one_multi_row_value_in_every_iteration(strategy, compiled):
    """Two iterations of the program loop add the same two-row value to others:
    grouped, that value is stacked once per iteration, not passed once as if it
    were one row broadcast to both (hypothesis found it)."""
    samples = [Node(0, 2, [], [("sub", 0, 0), ("add", 0, 0), ("add", 0, 1)], 0, [2, 3])]
    assert_sample_set_matches_eager(samples, strategy, compiled)


@pytest.mark.parametrize("strategy,compiled", [("depth", False), ("agenda", "step")])
def test_attention_and_unroll_instructions_over_nodes_of_every_row_count(strategy, compiled):
    """The column-form attention and the reshaped values of ``attend2`` and
    ``unroll`` (columns.py, reshapes.py) over nodes of one to four rows."""
    kids = [Node(2 * k, k + 1, [], [("attend2", 0), ("unroll", 0), ("add", 1, 2)], 3, [3])
            for k in range(4)]
    samples = [Node(0, 3, kids, [("unroll", 0), ("attend2", 0)], 2, [1, 2]),
               Node(1, 1, [], [("attend2", 0), ("unroll", 1)], 2, [2])]
    assert_sample_set_matches_eager(samples, strategy, compiled)


@pytest.mark.parametrize("strategy,compiled", [("depth", False), ("agenda", True)])
def test_pair_instructions_over_nodes_of_every_row_count(strategy, compiled):
    """The (r, r) matrices of ``selfattend`` and ``pairmix`` (pairs.py) over nodes
    of one to four rows, one reading another's output."""
    kids = [Node(2 * k, k + 1, [], [("selfattend", 0), ("pairmix", 1), ("add", 1, 2)], 3, [2])
            for k in range(4)]
    samples = [Node(0, 3, kids, [("pairmix", 0), ("selfattend", 1)], 2, [1]),
               Node(1, 2, [], [("selfattend", 0), ("pairmix", 0)], 2, [1])]
    assert_sample_set_matches_eager(samples, strategy, compiled)


@pytest.mark.parametrize("strategy,compiled", [("depth", False), ("agenda", "step")])
def test_lower_rank_vectors_of_each_node_broadcast_onto_its_rows(strategy, compiled):
    """``lowrank``: a node's (W,) vectors broadcast onto a (1, W) row (one step
    for all nodes) and onto its rows (alone), one node reading another's."""
    kids = [Node(2 * k, k + 1, [], [("lowrank", 0), ("lowrank", 1), ("add", 1, 2)], 3, [2])
            for k in range(4)]
    samples = [Node(0, 3, kids, [("lowrank", 0), ("tanh", 1)], 2, [1]),
               Node(1, 2, [], [("tanh", 0), ("lowrank", 1)], 2, [1])]
    assert_sample_set_matches_eager(samples, strategy, compiled)
