"""Fusion of row-wise runs inside replay templates (gluon_dynbatch/fuse.py)."""
import pytest
from mxnet import gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import (ChildSumTreeLSTM, assert_same, make_model, random_tree, rng,
                              run_model)
from gluon_dynbatch import record, replay
from gluon_dynbatch.fuse import FusedOp


class Gates(gluon.HybridBlock):
    """Row-wise runs around a broadcast op and an axis-0 sum; an op whose
    weight (a shared input) is computed inside the block."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(6, in_units=3)
            self.raw = self.params.get("raw", shape=(2, 3))

    def hybrid_forward(self, F, x, rows, raw):  # pylint: disable=arguments-differ
        z = F.Activation(F.slice_axis(self.dense(x), axis=1, begin=0, end=3), act_type="tanh")
        s = F.sum(rows, axis=0, keepdims=True)             # segment: ends a run
        g = F.broadcast_mul(z, s)                          # broadcast: never fused
        a = F.Activation(g, act_type="sigmoid")
        w = F.Activation(raw, act_type="tanh")             # a weight made in the run...
        v = F.FullyConnected(a, w, no_bias=True, num_hidden=2)   # ...so FC stays out
        return F.tanh(v) * 2, a


class UsesGates(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.gates = Gates()

    def hybrid_forward(self, F, k, x):
        rows = x[k:k + 1 + k % 3]                          # 1, 2 or 3 rows: other shapes
        return self.gates(x[k:k + 1], rows)


def _fused_templates(block):
    """This thread's fused templates of ``block`` (keys start with id(block))."""
    store = record._thread_store()  # pylint: disable=protected-access
    return [t for key, t in store.templates.items()
            if key[0] == id(block) and t is not replay.UNTEMPLATABLE and t.fused]


def test_runs_are_fused_but_not_broadcasts_segments_or_internal_weights():
    model = make_model(UsesGates)
    x = nd.random.uniform(-1, 1, shape=(9, 3))
    with gdb.batching(granularity="op"):
        outs = [model(k, x) for k in range(6)]
    assert len(outs) == 6
    templates = _fused_templates(model.gates)
    assert templates
    for template in templates:
        names = [repr(e[0]) for e in template.entries]
        fused = [e[0] for e in template.entries if isinstance(e[0], FusedOp)]
        assert "FusedOp(FullyConnected, slice_axis, Activation)" in names
        assert "OpDef(broadcast_mul)" in names and "OpDef(sum)" in names
        # The FC's weight w is made by the run before it, so the FC starts a new run.
        assert "FusedOp(Activation, Activation)" in names
        assert "FusedOp(FullyConnected, tanh, _mul_scalar)" in names
        for op in fused:
            members = [m[0].name for m in op.members]
            assert "broadcast_mul" not in members and "sum" not in members


@pytest.mark.parametrize("strategy", ["depth", "agenda", "unbatched"])
def test_fused_templates_match_eager_and_reference(strategy):
    model = make_model(UsesGates)
    x = nd.random.uniform(-1, 1, shape=(9, 3))
    samples = list(range(7))
    eager = run_model(model, samples, [x], "eager")
    assert_same(run_model(model, samples, [x], "reference"), eager)
    assert_same(run_model(model, samples, [x], strategy), eager)


def test_tree_lstm_plans_fused_steps_and_stays_exact():
    r = rng(5)
    trees = [random_tree(r, 10, max_depth=4) for _ in range(8)]
    model = make_model(ChildSumTreeLSTM, hidden=5)
    emb = nd.random.uniform(shape=(10, 3))
    expected = run_model(model, trees, [emb], "eager")
    assert_same(run_model(model, trees, [emb], "depth"), expected)
    with gdb.batching(keep_plan=True, granularity="op") as scope:
        outs = [model(t, emb) for t in trees]
    assert len(outs) == len(trees)
    fused = [s for s in scope.last_plan.steps if isinstance(s.nodes[0].op, FusedOp)]
    assert fused and max(len(s.nodes) for s in fused) > 1
    # compiled scopes keep per-operator templates (their plan shapes repeat more)
    with gdb.batching(keep_plan=True, compiled=True, granularity="op") as scope:
        outs = [model(t, emb) for t in trees]
    assert len(outs) == len(trees)
    assert not any(isinstance(s.nodes[0].op, FusedOp) for s in scope.last_plan.steps)
