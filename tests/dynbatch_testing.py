"""Shared test models and the eager-vs-batched comparison used by the engine tests."""
import os
import random
import subprocess
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

import gluon_dynbatch as gdb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SICK_DIR = os.path.join(REPO, "..", "shared", "data", "sick")
BATCHED = ("unbatched", "depth", "agenda")


class Tree:
    """A minimal tree: ``word`` (row of the embedding table) and ``children``."""

    def __init__(self, word, children=()):
        self.word = word
        self.children = list(children)

    def nodes(self):
        yield self
        for child in self.children:
            yield from child.nodes()

    def height(self):
        return 1 + max((c.height() for c in self.children), default=0)


def random_tree(rng, vocab, max_depth=4, arities=(0, 0, 1, 2, 3, 5), depth=0):
    """A random tree with the given arities (leaves below ``max_depth``)."""
    k = 0 if depth >= max_depth else rng.choice(arities)
    return Tree(rng.randrange(vocab),
                [random_tree(rng, vocab, max_depth, arities, depth + 1) for _ in range(k)])


def random_binary_tree(rng, vocab, leaves):
    """A random binary tree with ``leaves`` leaves."""
    if leaves == 1:
        return Tree(rng.randrange(vocab))
    left = rng.randint(1, leaves - 1)
    return Tree(rng.randrange(vocab), [random_binary_tree(rng, vocab, left),
                                       random_binary_tree(rng, vocab, leaves - left)])


def trees_from_parents(parents):
    """Tree of a dependency parse given as 1-based heads (0 = root)."""
    nodes = [Tree(i) for i in range(len(parents))]
    root = None
    for i, head in enumerate(parents):
        if head == 0:
            root = nodes[i]
        else:
            nodes[head - 1].children.append(nodes[i])
    return root


def sick_trees(limit):
    """The first ``limit`` trees of SICK's dev split (a.parents), or None if absent."""
    path = os.path.join(SICK_DIR, "dev", "a.parents")
    if not os.path.exists(path):
        return None
    out = []
    with open(path) as f:
        for line in f:
            out.append(trees_from_parents([int(t) for t in line.split()]))
            if len(out) == limit:
                break
    return out


class ChildSumCell(gluon.HybridBlock):
    """Child-Sum Tree-LSTM cell: x (1, D), children's h and c (k, H)."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.iou_x = gluon.nn.Dense(3 * hidden)
            self.iou_h = gluon.nn.Dense(3 * hidden, use_bias=False)
            self.f_x = gluon.nn.Dense(hidden)
            self.f_h = gluon.nn.Dense(hidden, use_bias=False)

    def hybrid_forward(self, F, x, child_h, child_c):
        H = self.hidden
        iou = self.iou_x(x) + self.iou_h(F.sum(child_h, axis=0, keepdims=True))
        i = F.Activation(F.slice_axis(iou, axis=1, begin=0, end=H), act_type="sigmoid")
        o = F.Activation(F.slice_axis(iou, axis=1, begin=H, end=2 * H), act_type="sigmoid")
        u = F.Activation(F.slice_axis(iou, axis=1, begin=2 * H, end=3 * H), act_type="tanh")
        f = F.sigmoid(F.broadcast_add(self.f_h(child_h), self.f_x(x)))
        c = i * u + F.sum(f * child_c, axis=0, keepdims=True)
        return o * F.tanh(c), c


class ChildSumTreeLSTM(gdb.DynBatchBlock):
    """Recursive Child-Sum Tree-LSTM over ``Tree`` objects."""

    def __init__(self, hidden=8, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.cell = ChildSumCell(hidden)

    def hybrid_forward(self, F, tree, emb):
        states = [self(child, emb) for child in tree.children]
        x = emb[tree.word:tree.word + 1]
        if states:
            child_h = F.concat(*[h for h, _ in states], dim=0)
            child_c = F.concat(*[c for _, c in states], dim=0)
        else:
            child_h = child_c = F.zeros((1, self.hidden))
        return self.cell(x, child_h, child_c)


class BinaryTreeLSTM(gdb.DynBatchBlock):
    """Binary Tree-LSTM: leaves read a word, internal nodes combine two children."""

    def __init__(self, hidden=8, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.leaf = gluon.nn.Dense(3 * hidden)
            self.node = gluon.nn.Dense(3 * hidden)
            self.forget = gluon.nn.Dense(hidden)

    def hybrid_forward(self, F, tree, emb):
        H = self.hidden
        if not tree.children:
            gates = self.leaf(emb[tree.word:tree.word + 1])
            prev = None
        else:
            (h1, c1), (h2, c2) = [self(child, emb) for child in tree.children]
            gates = self.node(F.concat(h1, h2, dim=1))
            prev = [(h1, c1), (h2, c2)]
        i = F.sigmoid(F.slice_axis(gates, axis=1, begin=0, end=H))
        o = F.sigmoid(F.slice_axis(gates, axis=1, begin=H, end=2 * H))
        u = F.tanh(F.slice_axis(gates, axis=1, begin=2 * H, end=3 * H))
        c = i * u
        if prev:
            for h_k, c_k in prev:
                c = c + F.sigmoid(self.forget(h_k)) * c_k
        return o * F.tanh(c), c


class DenseForms(gdb.DynBatchBlock):
    """A (4, 4) Dense and a ``form``: the base of test models written several
    ways (subclasses give ``hybrid_forward``)."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)


class TanhDense(gluon.HybridBlock):
    """``tanh(Dense(x))`` of a (n, 4) value: a plain child block with a parameter."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


class DenseTanh(gdb.DynBatchBlock):
    """``tanh(Dense(x))`` of a (n, 3) value: the smallest block with a parameter."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


class TokenRNN(gdb.DynBatchBlock):
    """Elman RNN over a sentence of token ids, one token at a time."""

    def __init__(self, hidden=8, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.i2h = gluon.nn.Dense(hidden)
            self.h2h = gluon.nn.Dense(hidden, use_bias=False)
            self.out = gluon.nn.Dense(3)

    def hybrid_forward(self, F, tokens, emb):
        h = F.zeros((1, self.hidden))
        outputs = []
        for t in tokens:
            h = F.tanh(self.i2h(emb[t:t + 1]) + self.h2h(h))
            outputs.append(self.out(h))
        return F.concat(*outputs, dim=0), h


def _loss(outputs):
    """A scalar loss touching every output with distinct weights."""
    flat = list(_flatten(outputs))
    total = None
    for k, out in enumerate(flat):
        term = (out * out).sum() * (1.0 + 0.1 * k) + out.sum()
        total = term if total is None else total + term
    return total


def _flatten(obj):
    if isinstance(obj, nd.NDArray):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _flatten(item)


def outputs_of(model, samples, batching=None):
    """``model(s)`` of every sample: eagerly (``batching`` None), through
    ``gdb.map`` (``"map"``), else in a scope of those options."""
    if batching is None:
        return [model(s) for s in samples]
    if batching == "map":
        return gdb.map(model, samples)
    with gdb.batching(**batching):
        return [model(s) for s in samples]


def run_model(model, samples, inputs, strategy, compiled=False, granularity=None,
              per_sample=False):
    """Forward and backward of all samples; returns outputs, gradients and stats.

    With ``per_sample``, batched samples run through ``gdb.map`` (each a task
    handing out its result when it finishes) instead of a plain loop.
    """
    for array in inputs:
        array.attach_grad()
    stats = None
    with autograd.record():
        if strategy == "eager":
            outs = [model(s, *inputs) for s in samples]
        else:
            with gdb.batching(strategy=strategy, compiled=compiled,
                              granularity=granularity) as scope:
                if per_sample:
                    outs = gdb.map(model, samples, *inputs)
                else:
                    outs = [model(s, *inputs) for s in samples]
            stats = scope.stats
        loss = _loss(outs)
    loss.backward()
    values = [o.asnumpy() for o in _flatten(outs)]
    grads = {name: p.grad().asnumpy().copy() for name, p in model.collect_params().items()
             if p.grad_req != "null"}
    for k, array in enumerate(inputs):
        grads["input%d" % k] = array.grad.asnumpy().copy()
    return values, grads, stats


def assert_same(result, expected, rtol=1e-5, atol=1e-6):
    """Outputs and every gradient equal to float32 rounding."""
    values, grads, _ = result
    ref_values, ref_grads, _ = expected
    assert len(values) == len(ref_values)
    for got, want in zip(values, ref_values):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        scale = max(1.0, float(np.abs(ref_grads[name]).max()))
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=rtol,
                                   atol=atol * scale, err_msg=name)


def assert_batched_equals_eager(model, samples, options=None, rtol=1e-5, atol=1e-5):
    """Forward and backward of ``model(*sample)`` for every sample, eagerly and
    then inside ``gdb.batching(**options)`` (``"map"``: through ``gdb.map``):
    outputs and every parameter's gradient equal."""
    runs = []
    for batched in (False, True):
        with autograd.record():
            if batched and options == "map":
                outs = gdb.map(lambda sample: model(*sample), samples)
            elif batched:
                with gdb.batching(**(options or {})):
                    outs = [model(*sample) for sample in samples]
            else:
                outs = [model(*sample) for sample in samples]
            loss = _loss(outs)
        loss.backward()
        runs.append(([o.asnumpy() for o in _flatten(outs)],
                     {name: p.grad().asnumpy().copy()
                      for name, p in model.collect_params().items() if p.grad_req != "null"},
                     None))
    assert_same(runs[1], runs[0], rtol=rtol, atol=atol)


def reference_run(model, samples, inputs):
    """The reference executor's run, checked against eager Gluon first.

    The reference records every operator as it is called and runs them one
    by one: the oracle of the batched strategies, itself held to eager.
    """
    eager = run_model(model, samples, inputs, "eager")
    reference = run_model(model, samples, inputs, "reference")
    assert_same(reference, eager, rtol=1e-6, atol=1e-7)   # same ops, same order
    return reference


def check_all_strategies(model, samples, inputs, strategies=BATCHED,
                         compiled=(False, True, "step")):
    """Compare eager, reference and every strategy, imperative and compiled.

    Every run records whole child-block calls as one node where it can (the
    default granularity); the first strategy also runs operator by operator.
    Returns the stats of each run, keyed by ``(strategy, compiled)`` and
    ``(strategy, compiled, "op")``.
    """
    reference = reference_run(model, samples, inputs)
    stats = {}
    for strategy in strategies:
        for mode in compiled:
            result = run_model(model, samples, inputs, strategy, compiled=mode)
            assert_same(result, reference)
            stats[(strategy, mode)] = result[2]
            stats.setdefault(strategy, result[2])
    for mode in compiled:
        result = run_model(model, samples, inputs, strategies[0], compiled=mode,
                           granularity="op")
        assert_same(result, reference)
        stats[(strategies[0], mode, "op")] = result[2]
    return stats


def make_model(cls, seed=0, **kwargs):
    mx.random.seed(seed)
    model = cls(**kwargs)
    model.initialize(mx.init.Uniform(0.3))
    return model


def rng(seed):
    return random.Random(seed)


def output_of_script(script, *args, timeout=300):
    """The standard output of Python ``script`` run with ``args`` in a process of
    its own from the repository root: a crash (or a hang, past ``timeout``
    seconds) there fails the test, not the suite."""
    proc = subprocess.run([sys.executable, "-c", script] + list(args), capture_output=True,
                          text=True, timeout=timeout,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout
