"""Planning under an analysis budget, with the measured cost model."""
import pytest
from mxnet import nd

import gluon_dynbatch as gdb
from gluon_dynbatch import budget
from gluon_dynbatch.plan import make_plan
from dynbatch_testing import (ChildSumTreeLSTM, assert_same, make_model, random_tree,
                              reference_run, rng, run_model)


def _trees(seed=0, count=6):
    r = rng(seed)
    return [random_tree(r, 12, max_depth=3) for _ in range(count)]


def test_cost_model_is_measured_and_prefers_batched_plans():
    model = budget.calibrate()
    assert model.launch > 0 and model.gather > 0 and model.row >= 0
    trees = _trees()
    net = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(12, 3))
    with gdb.batching(keep_plan=True) as scope:
        outs = [net(t, emb) for t in trees]
        graph = scope.recorder.graph
        nodes = list(graph.nodes)
    assert outs
    batched, unbatched = make_plan(nodes, "depth"), make_plan(nodes, "unbatched")
    assert model.cost(batched) < model.cost(unbatched)


@pytest.mark.parametrize("value", [0, 0.0, 1e-9, 10.0, "auto"])
def test_any_budget_gives_a_correct_plan(value):
    trees = _trees(1)
    net = make_model(ChildSumTreeLSTM, hidden=4, analysis_budget=value)
    emb = nd.random.uniform(shape=(12, 3))
    expected = reference_run(net, trees, [emb])
    got = run_model(net, trees, [emb], None)
    assert_same(got, expected)


def test_zero_budget_keeps_the_cheapest_strategy_and_a_large_one_tries_all():
    trees = _trees(2)
    net = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(12, 3))
    with gdb.batching(keep_plan=True) as scope:
        [net(t, emb) for t in trees]
        nodes = list(scope.recorder.graph.nodes)
    _, tried = budget.plan_within_budget(nodes, 0.0)
    assert tried == ["depth"]
    plan, tried = budget.plan_within_budget(nodes, 10.0)
    assert tried == list(budget.CANDIDATES)
    costs = {s: budget.calibrate().cost(make_plan(nodes, s)) for s in budget.CANDIDATES}
    assert budget.calibrate().cost(plan) == min(costs.values())


def test_auto_budget_follows_recent_execution_time():
    assert budget.resolve_budget("auto", None) == budget.AUTO_DEFAULT
    assert budget.resolve_budget("auto", 0.2) == pytest.approx(0.2 * budget.AUTO_FRACTION)
    net = make_model(ChildSumTreeLSTM, hidden=4, analysis_budget="auto")
    emb = nd.random.uniform(shape=(12, 3))
    with gdb.batching():
        outs = [net(t, emb) for t in _trees(3)]
    assert net.recent_execute_s is not None and net.recent_execute_s > 0
    assert all(not h.is_pending for h, _ in outs)


@pytest.mark.parametrize("bad", [-1, "fast", None])
def test_bad_budgets_are_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        budget.resolve_budget(bad, None)
    if bad is not None:
        with pytest.raises((ValueError, TypeError)):
            gdb.batching(analysis_budget=bad)
