"""The benchmark's hand-batched Tree-LSTM equals the eager per-node model."""
import os
import random
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

from examples.sick_data import attach_words, parse_parents, random_parents  # noqa: E402
from examples.sick_model import ChildSumTreeLSTM  # noqa: E402
from handbatched_treelstm import (CELL_PARAMS, HandBatchedTreeLSTM,  # noqa: E402
                                  LevelPlan)

VOCAB, DIM, HIDDEN = 40, 7, 5


def _random_trees(seed, count, max_len=12):
    """Random dependency trees with random word ids (a single node included)."""
    rng = random.Random(seed)
    trees = []
    for k in range(count):
        n = 1 if k == 0 else rng.randint(2, max_len)
        tree = parse_parents(random_parents(n, rng))
        trees.append(attach_words(tree, [rng.randrange(VOCAB) for _ in range(n)]))
    return trees


def _model(seed):
    mx.random.seed(seed)
    model = ChildSumTreeLSTM(HIDDEN, DIM)
    model.initialize(mx.init.Uniform(0.5))
    # Non-zero biases so that a wrong bias path would show.
    bias = model.cell.x_bias
    bias.set_data(nd.random.uniform(-0.5, 0.5, shape=bias.shape))
    return model


def _grads(model):
    return {key: getattr(model.cell, key).grad().asnumpy().copy() for key in CELL_PARAMS}


def _run(model, fn, weights):
    """Roots (B, H) from ``fn`` and the parameter gradients of sum(w * roots)."""
    with autograd.record():
        roots = fn()
        loss = (roots * weights).sum()
    loss.backward()
    return roots.asnumpy(), _grads(model)


@pytest.mark.parametrize("seed", [0, 1])
def test_handbatched_equals_eager(seed):
    trees = _random_trees(seed, 9)
    model = _model(seed)
    emb = nd.random.uniform(-1, 1, shape=(VOCAB, DIM))
    weights = nd.random.uniform(-1, 1, shape=(len(trees), HIDDEN))
    hand = HandBatchedTreeLSTM(model.cell)

    eager_roots, eager_grads = _run(
        model, lambda: nd.concat(*[model(t, emb)[0] for t in trees], dim=0), weights)
    hand_roots, hand_grads = _run(model, lambda: hand(trees, emb), weights)

    np.testing.assert_allclose(hand_roots, eager_roots, rtol=1e-5, atol=1e-6)
    for key in CELL_PARAMS:
        np.testing.assert_allclose(hand_grads[key], eager_grads[key],
                                   rtol=1e-4, atol=1e-5, err_msg=key)
        assert np.abs(eager_grads[key]).max() > 0, key


def test_compiled_graph_reused_across_structures():
    model = _model(3)
    emb = nd.random.uniform(-1, 1, shape=(VOCAB, DIM))
    hand = HandBatchedTreeLSTM(model.cell)
    seen = {}
    for seed in range(4):
        trees = _random_trees(10 + seed, 6)
        levels = LevelPlan(trees).num_levels
        out = hand(trees, emb)
        assert out.shape == (6, HIDDEN)
        assert hand.last["cache_hits"] == int(levels in seen)
        seen[levels] = True
    assert hand.num_compiled == len(seen)


def test_level_plan_groups_children_below_parents():
    trees = _random_trees(5, 5)
    plan = LevelPlan(trees)
    assert plan.num_nodes == sum(t.size() for t in trees)
    assert plan.num_levels == max(t.height() for t in trees)
    start = 0
    for lev in range(plan.num_levels):
        size = plan.sizes["rows%d" % lev][0]
        if lev:
            child = plan.buffer[plan.offsets["child%d" % lev]:][
                :plan.sizes["child%d" % lev][0]]
            assert child.max() < start
            seg_rows, seg_cols = plan.sizes["seg%d" % lev]
            assert (seg_rows, seg_cols) == (size, child.size)
        start += size
    assert start == plan.num_nodes


def test_benchmark_smoke(tmp_path):
    """The benchmark runs the hand-batched system end to end on SICK."""
    import benchmark
    from examples.sick_data import default_data_dir
    if default_data_dir() is None:
        pytest.skip("SICK data not found at ../shared/data/sick")
    rows = benchmark.main(["--systems", "handbatched", "--batches", "2",
                           "--warmup", "1", "--no-second-pass",
                           "--out-dir", str(tmp_path)])
    assert rows[0]["available"] and rows[0]["trees_per_s"] > 0
    for name in ("benchmark.csv", "benchmark.md", "benchmark.json"):
        assert (tmp_path / name).is_file()


def test_benchmark_interleaves_systems_in_rotating_rounds():
    """Timed batches run in rounds of blocks, the systems' order rotating; a
    system that fails stops alone and the others finish."""
    import benchmark
    log = []

    class FakeRunner:
        def __init__(self, name, fail_at=None):
            self.name, self.fail_at = name, fail_at

        def step(self, batch):
            if batch == self.fail_at:
                raise RuntimeError("boom")
            log.append((self.name, batch))
            return {"total_ms": 1.0}

    systems = [benchmark.System(n, "eager", None, None) for n in ("a", "b", "c")]
    entries = [benchmark.Timed(systems[0], FakeRunner("a"), [0, 1, 2, 3, 4]),
               benchmark.Timed(systems[1], FakeRunner("b", fail_at=3), [0, 1, 2, 3, 4]),
               benchmark.Timed(systems[2], FakeRunner("c"), [0, 1, 2])]
    benchmark.time_interleaved(entries, block=2)
    assert log == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1),
                   ("b", 2), ("c", 2), ("a", 2), ("a", 3),
                   ("a", 4)]
    assert [len(e.records) for e in entries] == [5, 3, 3]
    assert entries[1].failure is not None and "boom" in entries[1].failure


def test_benchmark_runs_each_system_once_per_model():
    import benchmark
    systems = benchmark.select_systems("eager,imperative-depth,handbatched",
                                       [], "both")
    assert [(s.name, s.model) for s in systems] == [
        ("handbatched", "cell"), ("imperative-depth", "cell"), ("eager", "cell"),
        ("imperative-depth [opbyop]", "opbyop"), ("eager [opbyop]", "opbyop")]
    only = benchmark.select_systems("eager", [], "opbyop")
    assert [(s.name, s.model) for s in only] == [("eager [opbyop]", "opbyop")]


def test_benchmark_ratios_to_eager_of_the_same_model():
    import benchmark

    def row(name, model, kind, rate):
        return {"system": name, "model": model, "kind": kind, "available": True,
                "trees_per_s": rate, "trees_per_s_b2b": 2 * rate}

    rows = benchmark.add_ratios([
        row("handbatched", "cell", "handbatched", 100.0),
        row("eager", "cell", "eager", 5.0), row("d", "cell", "imperative", 50.0),
        row("eager [opbyop]", "opbyop", "eager", 4.0),
        row("d [opbyop]", "opbyop", "imperative", 20.0)])
    assert [r["vs_eager"] for r in rows] == [20.0, 1.0, 10.0, 1.0, 5.0]
    assert rows[4]["vs_hand"] == 0.2 and rows[4]["vs_eager_b2b"] == 5.0


def test_benchmark_smoke_op_by_op_model(tmp_path):
    """Both models' eager and batched runs on SICK, ratios per model."""
    import benchmark
    from examples.sick_data import default_data_dir
    if default_data_dir() is None:
        pytest.skip("SICK data not found at ../shared/data/sick")
    rows = benchmark.main(["--systems", "eager,imperative-depth", "--model", "both",
                           "--batches", "1", "--warmup", "1", "--no-second-pass",
                           "--no-back-to-back", "--out-dir", str(tmp_path)])
    by_name = {r["system"]: r for r in rows}
    assert set(by_name) == {"eager", "imperative-depth", "eager [opbyop]",
                            "imperative-depth [opbyop]"}
    for name, row in by_name.items():
        assert row["available"], (name, row.get("note"))
    opbyop = by_name["imperative-depth [opbyop]"]
    assert opbyop["model"] == "opbyop" and by_name["eager [opbyop]"]["vs_eager"] == 1.0
    assert opbyop["vs_eager"] == pytest.approx(
        opbyop["trees_per_s"] / by_name["eager [opbyop]"]["trees_per_s"])
    assert opbyop["record_ms"] > 0 and opbyop["steps_per_batch"] > 0
    assert opbyop["mean_batch_size"] > 1
    assert "opbyop" in (tmp_path / "benchmark.md").read_text()


def test_budget_plot_has_a_panel_per_model_and_needs_two_budgets(tmp_path):
    import benchmark

    def row(model, budget, steps):
        return {"available": True, "model": model, "budget": budget, "mean_total_ms": 50.0,
                "launch_ms": 5.0, "other_ms": 20.0, "record_ms": 15.0, "compile_ms": 1.0,
                "plan_ms": 0.5, "steps_per_batch": steps}

    rows = [row(m, b, 8.0) for m in ("cell", "opbyop") for b in (0.0, "auto")]
    assert sorted(benchmark._sweeps(rows)) == ["cell", "opbyop"]
    assert benchmark.plot_budget(str(tmp_path / "sweep.png"), rows)
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    assert not benchmark.plot_budget(str(tmp_path / "one.png"), rows[:1])
    assert not (tmp_path / "one.png").exists()
