"""The user-facing contract of DynBatchBlock, batching() and LazyArray."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import (ChildSumTreeLSTM, assert_same, check_all_strategies, make_model,
                              random_tree, reference_run, rng, run_model)


class Scaled(gdb.DynBatchBlock):
    """Tiny model: Dense on rows ``rows`` of x, with hooks for misbehaviour."""

    def __init__(self, fail_on=None, **kwargs):
        super().__init__(**kwargs)
        self.fail_on = fail_on
        with self.name_scope():
            self.dense = gluon.nn.Dense(4)

    def hybrid_forward(self, F, sample, x):
        if sample == self.fail_on:
            raise ValueError("bad sample %r" % (sample,))
        return F.tanh(self.dense(x[sample:sample + 2])) * 2 + 1


def _model(**kwargs):
    model = Scaled(**kwargs)
    model.initialize(mx.init.Uniform(0.5))
    return model


def test_values_are_ndarrays_with_known_shapes_before_running():
    model, x = _model(), nd.random.uniform(shape=(6, 3))
    with gdb.batching(keep_plan=True) as scope:
        out = model(1, x)
        assert isinstance(out, nd.NDArray)
        assert out.shape == (2, 4) and out.dtype == np.float32
        assert out.is_pending and scope.stats.flushes == 0
    assert not out.is_pending
    np.testing.assert_allclose(out.asnumpy(), model(1, x).asnumpy(), rtol=1e-6)
    assert isinstance(out + 1, nd.NDArray)            # ordinary after the scope


def test_reading_inside_scope_runs_pending_then_records_on():
    model, x = _model(), nd.random.uniform(shape=(6, 3))
    with gdb.batching(keep_plan=True) as scope:
        a = model(0, x)
        first = a.asnumpy()                       # forces a flush
        assert scope.stats.flushes == 1
        b = model(3, x) + a                       # a is now concrete: still fine
    assert scope.stats.flushes == 2
    np.testing.assert_allclose(first, model(0, x).asnumpy(), rtol=1e-6)
    np.testing.assert_allclose(b.asnumpy(), (model(3, x) + model(0, x)).asnumpy(), rtol=1e-6)


def test_printing_shows_values_and_repr_runs_nothing():
    model, x = _model(), nd.random.uniform(shape=(6, 3))
    with gdb.batching() as scope:
        out = model(1, x)
        assert "pending" in repr(out) and scope.stats.flushes == 0
        printed = str(out)                       # print(out): a read, as eagerly
        assert scope.stats.flushes == 1
    eager = model(1, x)
    assert printed.split("<")[0] == str(eager).split("<")[0]


def test_exception_in_user_code_names_sample_and_leaves_nothing_behind():
    model, x = _model(fail_on=2), nd.random.uniform(shape=(6, 3))
    kept = []
    with pytest.raises(ValueError) as info:
        with gdb.batching():
            for s in range(4):
                kept.append(model(s, x))
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "sample 2" in notes
    with pytest.raises(gdb.BatchingError, match="failed"):
        kept[0].asnumpy()
    model.fail_on = None
    with gdb.batching():                          # the next batch works
        outs = [model(s, x) for s in range(4)]
    for s, out in enumerate(outs):                # equal to float32 rounding
        np.testing.assert_allclose(out.asnumpy(), model(s, x).asnumpy(), rtol=1e-5, atol=1e-6)


def test_shape_mismatch_is_a_clear_error_naming_sample_and_operator():
    model, x = _model(), nd.random.uniform(shape=(6, 3))
    model(0, x)                                   # shapes fixed: input width 3
    bad = nd.random.uniform(shape=(6, 5))
    with pytest.raises(gdb.BatchingError) as info:
        with gdb.batching():
            model(0, x)
            model(1, bad)
    message = str(info.value)
    assert "sample 1" in message and "FullyConnected" in message and "dense" in message
    with gdb.batching():
        ok = model(1, x)
    np.testing.assert_allclose(ok.asnumpy(), model(1, x).asnumpy(), rtol=1e-6)


def test_caught_error_inside_scope_is_pruned():
    model, x = _model(fail_on=1), nd.random.uniform(shape=(6, 3))
    with gdb.batching():
        good = model(0, x)
        try:
            model(1, x)
        except ValueError:
            pass
        also = model(2, x)
    np.testing.assert_allclose(good.asnumpy(), model(0, x).asnumpy(), rtol=1e-6)
    np.testing.assert_allclose(also.asnumpy(), model(2, x).asnumpy(), rtol=1e-6)


def test_empty_scope_one_sample_and_nested_scope():
    model, x = _model(), nd.random.uniform(shape=(6, 3))
    with gdb.batching(keep_plan=True) as scope:
        pass
    assert scope.stats.steps == 0
    with gdb.batching():
        one = model(4, x)
    np.testing.assert_allclose(one.asnumpy(), model(4, x).asnumpy(), rtol=1e-5, atol=1e-6)
    with gdb.batching() as outer:
        a = model(0, x)
        with gdb.batching():
            b = model(1, x)
        assert not b.is_pending                   # the inner scope flushed
        c = model(2, x)
    assert outer.stats.flushes == 2
    for s, out in enumerate([a, b, c]):
        np.testing.assert_allclose(out.asnumpy(), model(s, x).asnumpy(), rtol=1e-5, atol=1e-6)


def test_a_scope_entered_inside_itself_is_refused_and_leaves_nothing_open():
    """``with sc: ... with sc:`` left the thread inside a dead scope: later
    calls outside any scope stayed pending, later scopes recorded nothing."""
    import gc
    from gluon_dynbatch.record import context
    model, x = _model(), nd.random.uniform(shape=(6, 3))
    scope = gdb.batching()
    with pytest.raises(RuntimeError, match="open already"):
        with scope:
            model(0, x)
            with scope:
                model(1, x)
    assert context.current() is None and gc.isenabled()
    assert not isinstance(model(2, x), gdb.LazyArray)
    with scope:                     # the same object, once at a time: as a new scope
        again = model(3, x)
    assert scope.stats.samples == 1
    np.testing.assert_allclose(again.asnumpy(), model(3, x).asnumpy(), rtol=1e-5, atol=1e-6)


def test_flush_of_a_nested_scope_runs_the_outer_scopes_pending_calls():
    model, x = _model(), nd.random.uniform(shape=(6, 3))
    with gdb.batching() as outer:
        a = model(0, x)
        with gdb.batching() as inner:
            b = model(1, x)
            inner.flush()
            assert not a.is_pending and not b.is_pending
    assert outer.stats.flushes >= 1
    for s, out in enumerate([a, b]):
        np.testing.assert_allclose(out.asnumpy(), model(s, x).asnumpy(), rtol=1e-5, atol=1e-6)


def test_operator_without_rule_runs_alone_and_correct():
    class Odd(gdb.DynBatchBlock):
        def hybrid_forward(self, F, k, x):
            y = x[k:k + 3]
            total = F.prod(y)                     # reduction over every axis: no rule
            return F.broadcast_mul(y, total) + F.cumsum(y, axis=1) \
                if hasattr(F, "cumsum") else F.broadcast_mul(y, total)
    model = Odd()
    x = nd.random.uniform(shape=(7, 2))
    x.attach_grad()
    with autograd.record():
        with gdb.batching(keep_plan=True) as scope:
            outs = [model(k, x) for k in range(4)]
        loss = sum((o * o).sum() for o in outs)
    loss.backward()
    grad = x.grad.asnumpy().copy()
    with autograd.record():
        loss2 = sum((o * o).sum() for o in [model(k, x) for k in range(4)])
    loss2.backward()
    np.testing.assert_allclose(loss.asnumpy(), loss2.asnumpy(), rtol=1e-5)
    np.testing.assert_allclose(grad, x.grad.asnumpy(), rtol=1e-5, atol=1e-6)
    sums = [s for s in scope.last_plan.steps if s.nodes[0].op.name == "prod"]
    assert sums and all(len(s.nodes) == 1 for s in sums)


def test_batchnorm_in_training_runs_per_sample():
    class Normed(gdb.DynBatchBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.bn = gluon.nn.BatchNorm(in_channels=3)

        def hybrid_forward(self, F, k, x):
            return self.bn(x[k:k + 3])
    mx.random.seed(0)
    model = Normed()
    model.initialize()
    x = nd.random.uniform(shape=(8, 3))
    with autograd.record():
        eager = [model(k, x).asnumpy() for k in range(3)]
        with gdb.batching(keep_plan=True) as scope:
            outs = [model(k, x) for k in range(3)]
    for a, b in zip(outs, eager):
        np.testing.assert_allclose(a.asnumpy(), b, rtol=1e-5, atol=1e-6)
    bn_steps = [s for s in scope.last_plan.steps if s.nodes[0].op.name == "BatchNorm"]
    assert [len(s.nodes) for s in bn_steps] == [1, 1, 1]


class NormedWithStatistics(gdb.DynBatchBlock):
    """BatchNorm's per-channel mean and variance outputs beside its rows."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.gamma = self.params.get("gamma", shape=(4,), init="ones")
            self.beta = self.params.get("beta", shape=(4,), init="zeros")
            self.mean = self.params.get("mean", shape=(4,), init=mx.init.Constant(0.1),
                                        grad_req="null")
            self.var = self.params.get("var", shape=(4,), init=mx.init.Constant(2.0),
                                       grad_req="null")

    def hybrid_forward(self, F, x, gamma, beta, mean, var):
        return F.BatchNorm(x, gamma, beta, mean, var, output_mean_var=True, fix_gamma=False)


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"compiled": "plan"}],
                         ids=lambda o: str(o.get("compiled")))
def test_batchnorm_mean_and_variance_outputs_are_each_samples(options):
    model = NormedWithStatistics()
    model.initialize()
    xs = [nd.random.uniform(shape=(1, 4, 3, 3)) for _ in range(4)]
    eager = [[a.asnumpy() for a in model(x)] for x in xs]
    with gdb.batching(**options):
        outs = [model(x) for x in xs]
    for got, want in zip(outs, eager):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.asnumpy(), b, rtol=1e-5, atol=1e-6)


def test_deferred_initialisation_inside_scope():
    model = Scaled()
    model.initialize(mx.init.Uniform(0.5))        # Dense(4) without in_units
    x = nd.random.uniform(shape=(6, 3))
    with gdb.batching():
        out = model(0, x)
    assert model.dense.weight.shape == (4, 3)
    np.testing.assert_allclose(out.asnumpy(), model(0, x).asnumpy(), rtol=1e-6)


class PausedChild(gdb.DynBatchBlock):
    """A child without ``in_units`` called under ``autograd.pause()``: its
    parameters, passed before autograd's modes change, meet a flush."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(5, activation="tanh")
            self.probe = gluon.nn.Dense(5)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        with autograd.pause():
            p = self.probe(h)
        return h * p


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}])
def test_deferred_initialisation_of_a_child_under_pause_equals_eager(options):
    mx.random.seed(3)
    model = PausedChild()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.random.uniform(shape=(1, 3)) for _ in range(3)]
    runs = []
    for batched in (True, False):   # batched first: the scope finishes initialisation
        with autograd.record():
            if batched:
                with gdb.batching(**options):
                    outs = [model(x) for x in xs]
            else:
                outs = [model(x) for x in xs]
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
        runs.append(([o.asnumpy() for o in outs], model.dense.weight.grad().asnumpy()))
    assert model.probe.weight.shape == (5, 5)
    for a, b in zip(*[outs for outs, _ in runs]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(runs[0][1], runs[1][1], rtol=1e-5, atol=1e-6)


def test_row_slices_of_an_input_become_views_not_steps():
    r = rng(5)
    trees = [random_tree(r, 20, max_depth=2) for _ in range(5)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(20, 3))
    with gdb.batching(strategy="depth", keep_plan=True) as scope:
        outs = [model(t, emb) for t in trees]  # noqa: F841  (held: values nobody holds never run)
    for step in scope.last_plan.steps:
        node = step.nodes[0]
        assert not (node.op.name == "slice_axis" and node.kwargs["axis"] == 0)
        assert not (node.op.name == "concat" and node.kwargs.get("dim", 1) == 0)
    assert scope.stats.planned_nodes < scope.stats.nodes    # views are not steps


def test_stacked_children_states_are_views_made_without_the_general_path(monkeypatch):
    """``F.concat(*states, dim=0)`` of the children's states, once its call shape is
    known, becomes a view node in compiled code: neither ``Frame.written`` nor the
    recorder's general path runs for it, and the results equal eager."""
    from gluon_dynbatch.record import frames, recorder

    r = rng(8)
    emb = nd.random.uniform(shape=(20, 3))
    model = make_model(ChildSumTreeLSTM, hidden=4)
    trees = [random_tree(r, 20, max_depth=2) for _ in range(6)]
    with gdb.batching():        # learns the templates and the views' call shapes
        [model(t, emb) for t in trees]
    general = []
    for cls, name in ((frames.Frame, "written"), (recorder.Recorder, "graph_op")):
        original = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, op, *rest, _f=original: (
            general.append(op.name), _f(self, op, *rest))[1])
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(t, emb) for t in trees]
    assert "concat" not in general, general
    stacked = [src for step in scope.last_plan.steps for node in step.nodes
               for src, _ in node.inputs if src.kind == "view" and src.op.name == "concat"]
    assert stacked                  # the steps read the children's states as views
    monkeypatch.undo()
    for (h, c), tree in zip(outs, trees):
        eh, ec = model(tree, emb)
        np.testing.assert_allclose(h.asnumpy(), eh.asnumpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c.asnumpy(), ec.asnumpy(), rtol=1e-5, atol=1e-6)


def test_row_views_at_new_rows_take_the_analysis_of_their_width():
    """A row slice of a width and trailing shape seen before, at rows never seen,
    is not analysed again; what it reuses equals a fresh analysis."""
    from gluon_dynbatch.ir import calls
    from gluon_dynbatch.ir.graph import OP, Node
    from gluon_dynbatch.record import context

    table = nd.random.uniform(shape=(900, 7))
    with gdb.batching():
        rec = context.current()
        rec.row_slice(table, 3, 5)
        before = calls.analyse
        calls.analyse = None        # any analysis now fails the test
        try:
            view = rec.row_slice(table, 811, 813)
        finally:
            calls.analyse = before
        node = view._node
        probe = Node(rec.graph, OP, node.op, list(node.inputs), node.args,
                     {"axis": 0, "begin": 811, "end": 813})
        fresh = before(probe, ((900, 7),), (np.float32,))
        for name in calls.CallInfo.__slots__:
            assert getattr(node.info, name) == getattr(fresh, name), name
        got = view.asnumpy()
    np.testing.assert_array_equal(got, table[811:813].asnumpy())


def test_training_with_trainer_matches_eager_training():
    r = rng(6)
    trees = [random_tree(r, 15, max_depth=3) for _ in range(6)]
    emb = nd.random.uniform(shape=(15, 3))
    params = {}
    for mode in ("eager", "agenda"):
        model = make_model(ChildSumTreeLSTM, seed=3, hidden=5)
        trainer = gluon.Trainer(model.collect_params(), "adagrad", {"learning_rate": 0.1})
        for _ in range(3):
            run_model(model, trees, [emb], mode)
            trainer.step(len(trees))
        params[mode] = [p.data().asnumpy() for p in model.collect_params().values()]
    for a, b in zip(params["eager"], params["agenda"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_stats_are_printable_and_consistent():
    r = rng(7)
    trees = [random_tree(r, 10, max_depth=3) for _ in range(4)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(10, 3))
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(t, emb) for t in trees]  # noqa: F841  (held: values nobody holds never run)
    stats = scope.stats
    assert stats.samples == 4 and stats.flushes == 1
    plan = scope.last_plan
    assert stats.steps == len(plan.steps) > 0
    assert stats.planned_nodes == sum(len(step.nodes) for step in plan.steps)
    # Every tree node runs in some step, and steps batch: fewer steps than nodes.
    assert stats.planned_nodes >= sum(len(list(t.nodes())) for t in trees)
    assert stats.mean_batch_size > 1
    text = str(stats)
    assert "steps" in text and "mean batch" in text and "us/call" in text
    assert stats.calls >= stats.planned_nodes > 0


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="strategy"):
        gdb.batching(strategy="fastest")
    with pytest.raises(ValueError, match="strategy"):
        Scaled(strategy="nope")


def test_unknown_compiled_setting_is_refused():
    with pytest.raises(ValueError, match="compiled setting 'whole'"):
        gdb.batching(compiled="whole")
    with pytest.raises(ValueError, match="compiled setting 2"):
        Scaled(compiled=2)
    assert Scaled(compiled=1).compiled is True
    assert gdb.batching(compiled="plan").compiled == "plan"


@pytest.mark.parametrize("bound", ["10", None, 2.5, True, float("nan")])
def test_a_plan_cache_bound_that_is_not_a_whole_number_is_refused_by_name(bound):
    """It raised Python's TypeError of a comparison, or was taken (NaN: no bound)."""
    with pytest.raises(ValueError, match="max_cached_plans"):
        Scaled(max_cached_plans=bound)
    assert Scaled(max_cached_plans=np.int64(3)).plan_cache.max_plans == 3


def test_map_refuses_keywords_that_are_not_options_inside_a_scope_too():
    """Inside a scope they were dropped: ``fn`` ran without the keyword the user
    meant for it, and bad option values passed unchecked."""
    model = make_model(Scaled)
    x = nd.random.uniform(shape=(8, 3))
    with gdb.batching():
        with pytest.raises(TypeError, match="options of batching.*scale"):
            gdb.map(model, [0, 1], x, scale=2.0)
        with pytest.raises(ValueError, match="strategy"):
            gdb.map(model, [0, 1], x, strategy="bogus")
        outs = gdb.map(model, [0, 1], x, strategy="depth")
    np.testing.assert_allclose(outs[1].asnumpy(), model(1, x).asnumpy(), rtol=1e-5)
    with pytest.raises(TypeError, match="options of batching.*scale"):
        gdb.map(model, [0, 1], x, scale=2.0)


def test_the_reference_strategy_is_counted_among_planners():
    model = make_model(Scaled)
    x = nd.random.uniform(shape=(8, 3))
    with gdb.batching(strategy="reference") as scope:
        outs = [model(k, x) for k in range(3)]
    assert scope.stats.planners == {"reference": 1} and len(outs) == 3


def test_switches_that_are_not_true_or_false_are_refused_by_name():
    for name in ("replay", "keep_plan"):
        with pytest.raises(ValueError, match=name):
            gdb.batching(**{name: "no"})
    assert gdb.batching(replay=False, keep_plan=True).keep_plan


@pytest.mark.parametrize("options", [{"analysis_budget": "fast"}, {"analysis_budget": "0.1"},
                                     {"analysis_budget": float("nan")},
                                     {"max_pending_nodes": "10"}, {"max_pending_nodes": 2.5}])
def test_settings_of_the_wrong_type_are_refused_by_name(options):
    """They raised Python's TypeError of a comparison (or were taken: NaN)."""
    name = next(iter(options))
    with pytest.raises(ValueError, match=name):
        gdb.batching(**options)
    with pytest.raises(ValueError, match=name):
        Scaled(**options)
    assert gdb.batching(analysis_budget=np.float32(0.5), max_pending_nodes=np.int64(9)) \
        .max_pending_nodes == 9


def test_graph_invariants_hold_after_recording():
    r = rng(8)
    trees = [random_tree(r, 10, max_depth=3) for _ in range(3)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(10, 3))
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(t, emb) for t in trees]
        scope.recorder.graph.lint()
        assert len(scope.recorder.graph.nodes) > 10
    assert all(not h.is_pending for h, _ in outs)


@pytest.mark.parametrize("compiled", [False, True])
def test_regression_batch_whose_inputs_are_all_one_shared_row(compiled):
    """Found by fuzzing: two `add(v, v)` of one shared row must give two rows."""
    class Twice(gdb.DynBatchBlock):
        def hybrid_forward(self, F, k, x):
            v = x[0:1]
            return F.broadcast_add(v, v), F.broadcast_add(v, v) * k

    model, x = Twice(), nd.random.uniform(shape=(3, 4))
    with gdb.batching(strategy="depth", compiled=compiled):
        outs = [model(k, x) for k in (1, 2)]
    for k, (a, b) in zip((1, 2), outs):
        want_a, want_b = model(k, x)
        np.testing.assert_allclose(a.asnumpy(), want_a.asnumpy(), rtol=1e-6)
        np.testing.assert_allclose(b.asnumpy(), want_b.asnumpy(), rtol=1e-6)


def test_flushed_batches_are_freed_by_reference_counting():
    """A batch must not leave its graph to the cyclic GC (it cost ~50% of an epoch)."""
    import gc
    r = rng(9)
    trees = [random_tree(r, 10, max_depth=3) for _ in range(24)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(10, 3))
    for compiled in (False, True, "step"):
        with gdb.batching(compiled=compiled) as scope:
            outs = [model(t, emb) for t in trees]
        del outs
        assert scope.stats.nodes > 500
        del scope
    gc.collect()
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(t, emb) for t in trees]
    del outs, scope
    # A leaked batch is thousands of nodes with their tuples and lists; what
    # remains is MXNet's own (ctypes types made per call).
    assert gc.collect() < 2000


@pytest.mark.parametrize("compiled", [False, "step"])
def test_max_pending_nodes_flushes_and_stays_exact(compiled):
    r = rng(10)
    trees = [random_tree(r, 10, max_depth=3) for _ in range(6)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(10, 3))
    expected = reference_run(model, trees, [emb])
    with gdb.batching(max_pending_nodes=40, compiled=compiled) as scope:
        outs = [model(t, emb) for t in trees]
        assert len(scope.recorder.graph.nodes) <= 41
    assert scope.stats.flushes > 3
    for (h, _), want in zip(outs, expected[0][0::2]):
        np.testing.assert_allclose(h.asnumpy(), want, rtol=1e-5, atol=1e-6)
    bounded = make_model(ChildSumTreeLSTM, hidden=4, max_pending_nodes=40)
    with gdb.batching(keep_plan=True) as scope:
        held = [bounded(t, emb) for t in trees]
    assert scope.stats.flushes > 3 and not held[0][0].is_pending
    with pytest.raises(ValueError, match="max_pending_nodes"):
        gdb.batching(max_pending_nodes=0)


@pytest.mark.parametrize("compiled", [False, True])
def test_max_pending_nodes_bounds_a_scope_of_one_call_per_sample(compiled):
    # Each sample's call was one program node added without the bound's check:
    # 300 calls and one flush.
    model = make_model(Scaled)
    x = nd.random.uniform(shape=(40, 3))
    samples = [k % 30 for k in range(300)]
    want = [model(k, x).asnumpy() for k in samples]
    for _ in range(2):
        with gdb.batching(max_pending_nodes=10, compiled=compiled) as scope:
            outs = [model(k, x) for k in samples]
            assert len(scope.recorder.graph.nodes) <= 11
        assert scope.stats.flushes > 30
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class ModeSwitch(gdb.DynBatchBlock):
    """Changes autograd's modes inside its call, after its children's calls."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)
            self.drop = gluon.nn.Dropout(0.5)

    def hybrid_forward(self, F, tree, table):
        kids = [self(child, table) for child in tree.children]
        x = self.dense(table[tree.word:tree.word + 1])
        if self.how == "pause":
            with autograd.pause():               # a value without a gradient
                y = F.tanh(x) * 2
            x = x + y
        else:
            with autograd.predict_mode():        # dropout off for this call
                x = self.drop(x) + x
        return F.tanh(x + sum(kids)) if kids else F.tanh(x)


@pytest.mark.parametrize("how", ["pause", "predict_mode"])
def test_autograd_modes_changed_inside_a_call_are_kept(how):
    r = rng(3)
    trees = [random_tree(r, 10, 3) for _ in range(5)]
    table = nd.array(np.random.RandomState(3).uniform(-1, 1, (10, 4)))
    check_all_strategies(make_model(ModeSwitch, how=how), trees, [table])


def test_mxnet_dispatching_through_its_cython_modules_is_refused_with_a_way_out():
    from gluon_dynbatch.record.lazy import check_dispatch

    class Base:
        pass
    Base.__module__ = "mxnet._cy3.ndarray"

    class NDArray(Base):
        pass
    with pytest.raises(ImportError, match="MXNET_ENABLE_CYTHON=0"):
        check_dispatch(NDArray)
    check_dispatch(nd.NDArray)          # this MXNet: its ctypes dispatch


def test_split_gates_of_a_known_frame_are_replayed_in_compiled_code(monkeypatch):
    """``F.split`` of the gates (several new values, a call a pass rewrites), once
    learned on a frame's path, is replayed without ``Frame._replay``; the results
    and gradients equal eager."""
    from examples.sick_model import OpByOpTreeLSTM
    from gluon_dynbatch.record import frames

    r = rng(9)
    emb = nd.random.uniform(shape=(20, 3))
    model = make_model(OpByOpTreeLSTM, hidden_size=4, input_size=3)
    trees = [random_tree(r, 20, max_depth=2) for _ in range(6)]
    run_model(model, trees, [emb], "depth")     # learns the frames' paths
    replayed = []
    original = frames.Frame._replay     # pylint: disable=protected-access
    monkeypatch.setattr(frames.Frame, "_replay", lambda self, macro, *rest: (
        replayed.append(macro), original(self, macro, *rest))[1])
    batched = run_model(model, trees, [emb], "depth")
    assert not replayed
    monkeypatch.undo()
    assert_same(batched, run_model(model, trees, [emb], "eager"))


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float16", "uint8", "bool"])
def test_index_arrays_and_literal_pools_reach_mxnet_as_aligned_copies(dtype, monkeypatch):
    """``known.device_array``: the values, dtype and shape given, in memory of
    its own (the numpy array may change afterwards), 64-byte aligned; on the
    CPU without a synchronous copy (which waits for the engine's queue), but
    for ``bool``, which DLPack does not carry here."""
    import ctypes
    from mxnet.base import _LIB, check_call
    from gluon_dynbatch.ir.known import device_array

    values = (np.arange(15).reshape(3, 5) % 4).astype(dtype)
    if dtype != "bool":
        monkeypatch.setattr(mx.nd.NDArray, "_sync_copyfrom", None)
    array = device_array(values, mx.cpu())
    monkeypatch.undo()
    expected = values.copy()
    values[...] = 0
    assert array.dtype == np.dtype(dtype) and array.shape == (3, 5)
    np.testing.assert_array_equal(array.asnumpy(), expected)
    data = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(data)))
    assert data.value % 64 == 0
    if dtype == "bool":             # no index dtype for take
        return
    table = nd.arange(10).reshape((5, 2))
    table.attach_grad()
    with mx.autograd.record():
        rows = nd.take(table, device_array(np.array([4, 0, 4], dtype=dtype), mx.cpu()))
    rows.backward()
    np.testing.assert_array_equal(table.grad.asnumpy()[:, 0], [1, 0, 0, 0, 2])


def test_arrays_made_and_written_from_values_in_a_scope_wait_for_no_engine_queue(monkeypatch):
    """``mx.nd.array(values)`` and ``x[:] = values`` inside a scope (a library's
    search making its step counters) copy without MXNet's synchronous copy,
    whose wait for the engine's queue would wait for the flush computing
    meanwhile (``bool`` aside); the write is ordered after what reads the
    array before it, as eagerly, and stays outside autograd."""
    from gluon_dynbatch.record import namespace

    synchronous, calls = namespace._COPY_FROM, []

    def counted(array, source):
        calls.append(np.dtype(array.dtype))
        return synchronous(array, source)
    monkeypatch.setattr(namespace, "_COPY_FROM", counted)
    x = nd.arange(6).reshape((2, 3))
    x.attach_grad()
    with gdb.batching():
        big = nd.dot(nd.ones((300, 300)), nd.ones((300, 300)))
        before = (x * nd.sum(big) / 300.0 / 300.0).sum()   # queued reads of x's old values
        with autograd.record():
            x[:] = np.array([[1, 2, 3], [4, 5, 6.5]])
            made = nd.array([[1.7, -2.2]], dtype="int32")
            plain = nd.array(np.arange(4, dtype="float64"), dtype="float64")
        flags = nd.array([1, 0], dtype="bool")
        with pytest.raises(ValueError):
            x[:] = np.ones((3, 3))
    assert calls == [np.dtype("bool")]
    assert before.asscalar() == 300.0 * 15
    np.testing.assert_array_equal(x.asnumpy(), [[1, 2, 3], [4, 5, 6.5]])
    np.testing.assert_array_equal(made.asnumpy(), [[1, -2]])
    assert made.dtype == np.int32 and plain.dtype == np.float64
    np.testing.assert_array_equal(plain.asnumpy(), np.arange(4))
    np.testing.assert_array_equal(flags.asnumpy(), [True, False])
    with autograd.record():
        (x * 2).sum().backward()                     # x is still a variable
    np.testing.assert_array_equal(x.grad.asnumpy(), np.full((2, 3), 2.0))


class SharedMaskDropout(gdb.DynBatchBlock):
    """Dropout whose mask is shared along ``axes``, given as MXNet takes it."""

    def hybrid_forward(self, F, n, x, axes):
        return F.Dropout(x[:n] * 1.0, p=0.5, axes=axes)


@pytest.mark.parametrize("axes", [0, 1, "0", "(0,)", (0,)], ids=repr)
def test_dropout_axes_as_an_int_or_a_string_keep_each_samples_own_mask(axes):
    """An int or a string raised TypeError; ``axes=0`` drew one mask for every
    sample's rows (each sample draws its own, shared by its rows)."""
    model = SharedMaskDropout()
    model.initialize()
    x = nd.ones((4, 32))
    with autograd.train_mode():
        with gdb.batching():
            outs = [model(n, x, axes) for n in (2, 3, 1, 4)]
    masks = [o.asnumpy() for o in outs]
    shared_rows = axes in (0, "0", "(0,)", (0,))
    for mask in masks:
        assert set(np.unique(mask)) <= {0.0, 2.0}
        if shared_rows:
            assert (mask == mask[:1]).all()
    if shared_rows:
        assert len({m[0].tobytes() for m in masks}) > 1


class Backpointers(gdb.DynBatchBlock):
    """Indices of the best row of each column over a sample's own rows."""

    def hybrid_forward(self, F, n, x):
        paths = F.tanh(x[:n] * 3.0)
        return F.argmax(paths, axis=0), F.argmin(paths, axis=0, keepdims=True), \
            F.argmax(paths[:1], axis=0)


@pytest.mark.parametrize("compiled", [False, "step", "plan"])
def test_argmax_over_a_samples_rows_batches_and_equals_eager(compiled):
    """A Viterbi step's backpointers (``argmax(paths, axis=0)``) ran one node a
    step: slower than eager on a structured hinge loss."""
    x = nd.array(np.random.RandomState(3).uniform(-1, 1, (5, 6)))
    x[2, 1] = x[4, 1]                           # a tie: the first row wins, as eagerly
    model = Backpointers()
    counts = [5, 2, 3, 1, 4, 5]
    want = [[o.asnumpy() for o in model(n, x)] for n in counts]
    for granularity in (None, "op"):
        with gdb.batching(compiled=compiled, keep_plan=True, granularity=granularity) as scope:
            outs = [model(n, x) for n in counts]
        for got, expected in zip(outs, want):
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a.asnumpy(), b)
    # Recorded operator by operator: one step of each (the two argmax calls of
    # a sample, over many rows and over one, share their signature).
    sizes = {s.nodes[0].op.name: len(s.nodes) for s in scope.last_plan.steps}
    assert sizes["argmax"] == 2 * len(counts) and sizes["argmin"] == len(counts)


class BackpointersOfInput(gdb.DynBatchBlock):
    """Backpointers over a sample's rows of an input with a gradient."""

    def hybrid_forward(self, F, n, x):
        return F.argmax(F.tanh(x[:n] * 3.0), axis=0)


@pytest.mark.parametrize("granularity", [None, "op"])
def test_argmax_over_a_samples_rows_in_a_recorded_loss_equals_eager(granularity):
    """Operator by operator, the segments' integer positions were tied into the
    results' history with the float input: MXNet refused the mixed ``add_n``."""
    x = nd.array(np.random.RandomState(4).uniform(-1, 1, (5, 6)))
    reference = reference_run(BackpointersOfInput(), [5, 2, 3], [x])
    result = run_model(BackpointersOfInput(), [5, 2, 3], [x], "depth", granularity=granularity)
    assert_same(result, reference)


class ShufflesDetached(gdb.DynBatchBlock):
    """Operators without a gradient on detached values, as eager code may use them."""

    def __init__(self, op="shuffle", **kwargs):
        super().__init__(**kwargs)
        self.op = op
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, flatten=False, in_units=4)

    def hybrid_forward(self, F, n, x):
        h = F.tanh(self.dense(x[:n]))
        if self.op == "shuffle":
            s = F.random.shuffle(h.detach())
        else:
            s = F.khatri_rao(h.detach(), h.detach())
        return F.sum(h) + F.sum(s)


@pytest.mark.parametrize("op", ["shuffle", "khatri_rao"])
@pytest.mark.parametrize("options", [{}, {"strategy": "reference"}, {"compiled": "plan"},
                                     {"granularity": "op"}], ids=str)
def test_operators_without_a_gradient_on_detached_values_train_as_eagerly(op, options):
    """MXNet's backward refused them ("non-differentiable"): the batched values
    they read had the history of ``BlockGrad``, which eager's ``detach()`` has not."""
    mx.random.seed(0)
    model = ShufflesDetached(op)
    model.initialize()
    x = nd.random.uniform(shape=(5, 4))

    def gradient(batched):
        with autograd.record():
            if batched:
                with gdb.batching(**options):
                    outs = [model(n, x) for n in (2, 3, 4)]
            else:
                outs = [model(n, x) for n in (2, 3, 4)]
            loss = nd.add_n(*outs)
        loss.backward()
        return loss.asnumpy(), model.dense.weight.grad().asnumpy().copy()

    want_loss, want = gradient(False)
    got_loss, got = gradient(True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if op != "shuffle":                   # (a shuffle's sum does not depend on the draw)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
