"""Compiled plans and the plan cache: hits, keys, invalidation, LRU bound, threads."""
import sys
import threading

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import (ChildSumCell, ChildSumTreeLSTM, DenseTanh, TanhDense, Tree,
                              assert_same, make_model, output_of_script, random_tree,
                              reference_run, rng, run_model)
from gluon_dynbatch.run.cache import PlanCache


def _relabel(tree, r, vocab):
    """The same shape of tree with other words."""
    return Tree(r.randrange(vocab), [_relabel(c, r, vocab) for c in tree.children])


def _compiled_run(model, trees, emb, compiled="plan"):
    with gdb.batching(compiled=compiled) as scope:
        outs = [model(t, emb) for t in trees]
    return [h.asnumpy() for h, _ in outs], scope.stats


def test_same_plan_shape_hits_and_stays_exact():
    r = rng(0)
    trees = [random_tree(r, 20, max_depth=3) for _ in range(5)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(20, 3))
    _, first = _compiled_run(model, trees, emb)
    assert (first.cache_hits, first.cache_misses) == (0, 1)
    others = [_relabel(t, r, 20) for t in trees]
    _, second = _compiled_run(model, others, emb)
    assert (second.cache_hits, second.cache_misses) == (1, 0)
    expected = reference_run(model, others, [emb])
    assert_same(run_model(model, others, [emb], "agenda", compiled="plan"), expected)


def test_replacing_a_child_does_not_reuse_a_stale_plan():
    r = rng(1)
    trees = [random_tree(r, 10, max_depth=2) for _ in range(3)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(10, 3))
    _compiled_run(model, trees, emb)
    with model.name_scope():
        model.cell = ChildSumCell(4)
    model.cell.initialize(mx.init.Uniform(0.9))
    got, stats = _compiled_run(model, trees, emb)
    assert stats.cache_misses == 1
    want = [model(t, emb)[0].asnumpy() for t in trees]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("compiled", [False, "plan"])
def test_a_copy_of_a_block_after_scopes_runs_as_its_original(how, compiled):
    """``copy.deepcopy`` and ``pickle`` of a DynBatchBlock raised (the plan cache's
    lock, then its CachedOps); a copy starts with no plans and gives what its
    original gives, eagerly and in a scope."""
    import copy
    import pickle
    r = rng(2)
    trees = [random_tree(r, 10, max_depth=2) for _ in range(3)]
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(10, 3))
    _compiled_run(model, trees, emb, compiled)
    twin = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    assert len(twin.plan_cache) == 0
    want = [model(t, emb)[0].asnumpy() for t in trees]
    got, _ = _compiled_run(twin, trees, emb, compiled)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(twin(trees[0], emb)[0].asnumpy(), want[0], rtol=1e-5, atol=1e-6)


class RowDense(gdb.DynBatchBlock):
    """Dense layer on a few rows of a table: generic in dtype."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, k, table):
        return F.tanh(self.dense(table[k:k + 2]))


def test_changing_dtype_does_not_reuse_a_stale_plan():
    model = RowDense()
    model.initialize(mx.init.Uniform(0.5))
    table = nd.random.uniform(shape=(6, 4))
    with gdb.batching(compiled="plan"):
        [model(k, table) for k in range(3)]
    model.cast("float64")
    table64 = table.astype("float64")
    with gdb.batching(compiled="plan") as scope:
        outs = [model(k, table64) for k in range(3)]
    assert scope.stats.cache_misses == 1
    for k, out in enumerate(outs):
        assert out.dtype == np.float64
        np.testing.assert_allclose(out.asnumpy(), model(k, table64).asnumpy(), rtol=1e-12)


def test_lru_bound_evicts_least_recently_used():
    model = make_model(ChildSumTreeLSTM, hidden=3, max_cached_plans=2)
    emb = nd.random.uniform(shape=(5, 2))
    shapes = [[Tree(0)], [Tree(0, [Tree(1)])], [Tree(0, [Tree(1, [Tree(2)])])]]
    total = gdb.BatchStats()
    for trees in shapes + shapes[-1:]:
        total.add(_compiled_run(model, trees, emb)[1])
    assert len(model.plan_cache) == 2
    assert total.evictions == 1 and total.cache_misses == 3 and total.cache_hits == 1


def test_plan_cache_is_thread_safe():
    cache = PlanCache(max_plans=8)
    errors = []

    def work(seed):
        try:
            for k in range(500):
                key = (seed * 1000 + k) % 20
                if cache.get(key) is None:
                    cache.put(key, object())
        except Exception as err:  # pragma: no cover - the assertion below reports it
            errors.append(err)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(cache) <= 8
    assert cache.hits + cache.misses == 2000


def test_threads_sharing_a_compiled_plan_call_it_in_turn():
    """MXNet 1.9.1's CachedOp fails now and then when two threads call it at once
    ("Graph attr dependency shape is required by pass MXPlanMemory"): the plan
    cache shares compiled plans between threads, whose calls take turns."""
    import time
    from gluon_dynbatch.run.executors import CompiledPlan
    x = mx.sym.var("x")
    plan = CompiledPlan(mx.sym.tanh(x), ())
    inside, overlaps = [0], []
    real = plan.op

    def slow_op(*inputs):
        inside[0] += 1
        overlaps.append(inside[0] > 1)
        time.sleep(0.01)            # a wide window for another thread to enter
        out = real(*inputs)
        inside[0] -= 1
        return out
    plan.op = slow_op
    data = nd.ones((2, 3))
    threads = [threading.Thread(target=lambda: [plan([data]) for _ in range(5)])
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlaps) == 15 and not any(overlaps)
    assert plan.calls == 15


_FORK_WHILE_ANOTHER_THREAD_RECORDS = """
import gc, os, threading
import mxnet as mx
from mxnet import gluon, nd
import gluon_dynbatch as gdb


class Layer(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=2)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


model = Layer()
model.initialize(mx.init.Uniform(0.5))
x = nd.ones((1, 2))
opened, done = threading.Event(), threading.Event()


def record():
    with gdb.batching():
        model(x)
        opened.set()
        done.wait(60)


thread = threading.Thread(target=record)
thread.start()
opened.wait(60)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    with gdb.batching():
        out = model(x * 2)
    value = float(out.sum().asscalar())
    same = value == float(model(x * 2).sum().asscalar())
    os.write(write, ("%s %s" % (gc.isenabled(), same)).encode())
    os._exit(0)
os.close(write)
print("child", os.read(read, 200).decode())
os.waitpid(pid, 0)
done.set()
thread.join()
print("parent", gc.isenabled())
"""


def test_a_process_forked_while_another_thread_records_collects_garbage_again():
    """A child forked while another thread had a scope open counted that scope
    open for good: Python's garbage collector stayed off there (DataLoader and
    pool workers leaked every reference cycle)."""
    out = output_of_script(_FORK_WHILE_ANOTHER_THREAD_RECORDS, timeout=120).split()
    assert out[out.index("child") + 1:out.index("child") + 3] == ["True", "True"]
    assert out[out.index("parent") + 1] == "True"


def test_a_thread_whose_scope_another_thread_ended_batches_its_next_scopes():
    """A generator's scope, opened in one thread and closed by another, stayed
    the first thread's current scope: its later scopes recorded nothing and
    ran eagerly, silently."""
    emb = nd.random.uniform(shape=(10, 3))
    model = make_model(ChildSumTreeLSTM, hidden=4)
    trees = [random_tree(rng(6), 10, max_depth=2) for _ in range(3)]

    def batches():
        with gdb.batching():
            yield [model(t, emb) for t in trees]

    generator, counts = batches(), []
    opened, done = threading.Event(), threading.Event()

    def work():
        next(generator)             # its scope opens in this thread
        opened.set()
        done.wait(30)
        with gdb.batching() as scope:
            outs = [model(t, emb) for t in trees]
        counts.append((scope.stats.samples, [o[0].asnumpy() for o in outs]))
    worker = threading.Thread(target=work)
    worker.start()
    opened.wait(30)
    generator.close()               # and ends in this one
    done.set()
    worker.join()
    samples, outs = counts[0]
    assert samples == len(trees)
    for out, tree in zip(outs, trees):
        np.testing.assert_allclose(out, model(tree, emb)[0].asnumpy(), rtol=1e-5, atol=1e-6)


def test_threads_record_separately_and_match_running_alone():
    r = rng(3)
    tree_sets = [[random_tree(r, 10, max_depth=3) for _ in range(4)] for _ in range(4)]
    emb = nd.random.uniform(shape=(10, 3))
    models = [make_model(ChildSumTreeLSTM, seed=s, hidden=4) for s in range(4)]
    alone = [_compiled_run(m, ts, emb)[0] for m, ts in zip(models, tree_sets)]
    results = [None] * 4

    def work(k):
        results[k] = _compiled_run(models[k], tree_sets[k], emb)[0]
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, alone):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_the_templates_of_a_thread_go_when_it_ends_though_its_model_lives():
    """A thread's store of templates stayed as long as the model it recorded
    lived (callbacks dropping its entries with the model held the store): a
    thread per batch grew memory batch after batch."""
    import gc
    from gluon_dynbatch.record.trie import State
    r = rng(5)
    trees = [random_tree(r, 10, max_depth=2) for _ in range(3)]
    emb = nd.random.uniform(shape=(10, 3))
    model = make_model(ChildSumTreeLSTM, hidden=4)

    def states_after(threads):
        for _ in range(threads):
            thread = threading.Thread(target=_compiled_run, args=(model, trees, emb, False))
            thread.start()
            thread.join()
        gc.collect()
        return sum(type(o) is State for o in gc.get_objects())
    first = states_after(2)
    assert states_after(4) == first


class _WithHead(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = gluon.nn.Dense(4, in_units=3)
        self.head = TanhDense()

    def hybrid_forward(self, F, x):
        return F.sum(self.head(self.inp(x)))


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}])
def test_a_child_replaced_before_every_scope_is_freed_with_its_weights(options):
    """A fresh head per task or episode (``model.head = Head()`` before each
    scope): the parent's tries, keyed by its parameters, kept every old head's
    parameters and their arrays alive; now the tries of a few parameter sets
    are kept per block (``trie.MAX_VERSIONS``), and outputs equal eager."""
    import gc
    import weakref
    from mxnet import autograd
    from gluon_dynbatch.record import trie
    model = _WithHead()
    model.initialize()
    xs = [nd.array(np.linspace(-1, 1, 3 * k).reshape(k, 3)) for k in (1, 2, 3)]
    gc.collect()
    blocks_noted = len(trie.store().versions)
    old = []
    for _ in range(trie.MAX_VERSIONS + 6):
        model.head = TanhDense()
        model.head.initialize()
        old.append(weakref.ref(model.head.dense.weight))
        eager = [model(x).asnumpy() for x in xs]
        with autograd.record():
            with gdb.batching(**options):
                outs = [model(x) for x in xs]
            loss = nd.add_n(*outs)
        loss.backward()
        for got, want in zip(outs, eager):
            np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)
        del outs, loss
    gc.collect()
    assert sum(ref() is not None for ref in old) <= trie.MAX_VERSIONS + 1
    assert len(trie.store().versions) - blocks_noted <= 4      # the living blocks' alone


def test_max_cached_plans_must_be_positive():
    import pytest
    with pytest.raises(ValueError, match="max_cached_plans"):
        ChildSumTreeLSTM(max_cached_plans=0)


def test_compiled_training_matches_eager_training():
    r = rng(4)
    trees = [random_tree(r, 15, max_depth=3) for _ in range(5)]
    emb = nd.random.uniform(shape=(15, 3))
    params = {}
    for compiled in (None, True):
        model = make_model(ChildSumTreeLSTM, seed=5, hidden=4)
        trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": 0.01})
        for _ in range(3):
            if compiled:
                run_model(model, trees, [emb], "depth", compiled=True)
            else:
                run_model(model, trees, [emb], "eager")
            trainer.step(len(trees))
        params[compiled] = [p.data().asnumpy() for p in model.collect_params().values()]
    for a, b in zip(params[None], params[True]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_batches_of_different_trees_with_one_height_share_a_compiled_plan():
    """Gathers read whole families of earlier outputs, and steps are ordered
    canonically, so the plan shape depends on the height, not the trees."""
    r = rng(13)

    def batch():
        trees = []
        while len(trees) < 6:
            tree = random_tree(r, 15, max_depth=3, arities=(0, 1, 2, 3))
            if tree.height() == 4 or not trees:
                trees.append(tree)
        return [t for t in trees if t.height() == 4] or trees
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(15, 3))
    stats = gdb.BatchStats()
    for _ in range(4):
        trees = batch()
        if max(t.height() for t in trees) != 4:
            continue
        _, run_stats = _compiled_run(model, trees, emb)
        stats.add(run_stats)
        expected = reference_run(model, trees, [emb])
        assert_same(run_model(model, trees, [emb], "depth", compiled=True), expected)
    assert stats.cache_misses <= 2 and stats.cache_hits >= 2


def _chooser_run(chooser, costs, cycles, nodes=10):
    """Feed ``chooser`` cycles of ``nodes`` nodes costing ``costs[mode]`` seconds
    a node; the executors it chose, in order."""
    modes = []
    for _ in range(cycles):
        mode = chooser.next_mode()
        modes.append(mode)
        chooser.note(mode, costs[mode] * nodes, nodes)
    return modes


def test_executor_choice_runs_the_cheapest_and_tries_the_others_now_and_then():
    from gluon_dynbatch.run import choice
    chooser = choice.ExecutorChoice("model")
    modes = _chooser_run(chooser, {True: 3e-4, "step": 1e-4, False: 2e-4}, 200)
    trial = choice.WARMUP + len(choice.MODES) * choice.TRIAL
    assert modes[:trial] == [True] * choice.WARMUP + list(choice.MODES) * choice.TRIAL
    assert chooser.best == "step"
    later = modes[trial:]
    assert later.count("step") > 0.85 * len(later)
    # The slower an executor was, the less often it runs again.
    assert 0 < later.count(True) < later.count(False)


def test_executor_choice_keeps_its_executor_against_one_within_noise():
    from gluon_dynbatch.run import choice
    chooser = choice.ExecutorChoice("model")
    costs = {True: 0.90e-4, "step": 5e-4, False: 1.00e-4}
    _chooser_run(chooser, costs, choice.WARMUP + len(choice.MODES) * choice.TRIAL)
    assert chooser.best is True and chooser.decided
    costs[True] = 1.02e-4       # now a little dearer than imperative calls
    _chooser_run(chooser, costs, 300)
    assert chooser.best is True
    costs[True] = 1.2e-4        # now clearly dearer
    _chooser_run(chooser, costs, 20)
    assert chooser.best is False


def test_executor_choice_compiles_only_where_it_clearly_pays():
    from gluon_dynbatch.run import choice
    chooser = choice.ExecutorChoice("model")
    # Steps launch 5% cheaper than imperative calls, but each is a CachedOp
    # call in the backward pass too: imperative calls stay.
    _chooser_run(chooser, {True: 4e-4, "step": 0.95e-4, False: 1e-4}, 30)
    assert chooser.best is False and chooser.decided


def test_executor_choice_follows_a_change_of_costs():
    from gluon_dynbatch.run.choice import ExecutorChoice
    chooser = ExecutorChoice("model")
    costs = {True: 1e-4, "step": 2e-4, False: 3e-4}
    _chooser_run(chooser, costs, 40)
    assert chooser.best is True
    costs[True] = 9e-4          # plans stop repeating: a compile each
    _chooser_run(chooser, costs, 260)
    assert chooser.best == "step"


def test_executor_choice_sets_aside_one_long_pause_of_the_loop():
    from gluon_dynbatch.run import choice
    chooser = choice.ExecutorChoice("model")
    costs = {True: 1e-4, "step": 2e-4, False: 3e-4}
    _chooser_run(chooser, costs, 40)
    chooser.note(True, 1.0, 10)         # an evaluation between two training batches
    assert chooser.mean(True) == 1e-4 and chooser.best is True


def test_executor_choice_measures_a_scope_over_all_its_flushes():
    from gluon_dynbatch.run import choice
    chooser = choice.ExecutorChoice("model")
    for _ in range(choice.WARMUP + len(choice.MODES) * choice.TRIAL + 1):
        mode = chooser.begin()
        # A large flush, then a small one whose cost per node is higher.
        per_node = {True: 3e-4, "step": 1e-4, False: 2e-4}[mode]
        chooser.count(per_node * 90, 90)
        chooser.count(per_node * 10 * 5, 10)
    assert chooser.best == "step"
    assert chooser.mean("step") == pytest.approx(1.4e-4)


def test_compiled_plans_that_repeat_are_found_in_the_cache():
    r = rng(8)
    model = make_model(ChildSumTreeLSTM, hidden=4)
    emb = nd.random.uniform(shape=(20, 3))
    trees = [random_tree(r, 20, max_depth=3) for _ in range(4)]
    for _ in range(6):
        _, stats = _compiled_run(model, [_relabel(t, r, 20) for t in trees], emb)
    assert (stats.cache_hits, stats.cache_misses) == (1, 0)
    assert len(model.plan_cache) == 1


class Widths(gdb.DynBatchBlock):
    """Element-wise calls on a (1, T) row: the trailing shape of every step is T."""

    def hybrid_forward(self, F, x):
        return F.tanh(x) * 2 + F.sigmoid(x)


def test_compiled_true_tries_every_executor_runs_the_cheapest_and_stays_exact():
    from gluon_dynbatch.run import choice
    model = Widths()
    for k in range(choice.WARMUP + len(choice.MODES) * choice.TRIAL + 1):
        # A new width every time: every plan and every step shape is new.
        xs = [nd.random.uniform(-1, 1, shape=(1, k + 2)) for _ in range(3)]
        with gdb.batching(compiled=True) as scope:
            outs = [model(x) for x in xs]
        got = [o.asnumpy() for o in outs]
        for x, value in zip(xs, got):
            np.testing.assert_allclose(value, model(x).asnumpy(), rtol=1e-5, atol=1e-6)
    executors = model.executors
    assert all(len(executors.costs[mode]) >= choice.TRIAL for mode in choice.MODES)
    # Every scope but the last is noted; the last scope ran the choice.
    assert sum(map(len, executors.costs.values())) == k - choice.WARMUP
    assert executors.open[0] == executors.best and scope.stats.flushes == 1
    cheapest = min(executors.cost(mode) for mode in choice.MODES)
    assert executors.cost(executors.best) <= cheapest / (1 - choice.MARGIN), executors.summary()


class BiLM(gdb.DynBatchBlock):
    """gluonnlp's two-layer BiLMEncoder (skip connections) over one sentence:
    MXNet 1.9.1 refuses to build a graph of its whole plan."""

    def __init__(self, **kwargs):
        import gluonnlp
        super().__init__(**kwargs)
        with self.name_scope():
            self.encoder = gluonnlp.model.BiLMEncoder("lstm", 2, 4, 6, skip_connection=True)

    def hybrid_forward(self, F, x):
        out, _ = self.encoder(F.transpose(x, axes=(1, 0, 2)),
                              self.encoder.begin_state(F.zeros, batch_size=1))
        return out


@pytest.mark.parametrize("compiled", ["plan", True])
def test_a_plan_mxnet_refuses_to_build_runs_as_imperative_calls(compiled, caplog, monkeypatch):
    from dynbatch_testing import assert_batched_equals_eager
    from gluon_dynbatch import logs
    from gluon_dynbatch.ir import rules
    monkeypatch.setattr(logs, "_WARNED", set())     # told once a process
    # Refused for its elemwise_add nodes, which the whole plan runs as written here
    # (equal-shape additions run as broadcast_add, whose graph MXNet builds).
    monkeypatch.setattr(rules, "SAME_SHAPE_ADDS", frozenset())
    model = BiLM()
    model.initialize()
    rs = np.random.RandomState(0)
    with caplog.at_level("WARNING", logger="gluon_dynbatch"):
        for lengths in [(2, 3, 5, 1), (4, 2, 3)]:
            samples = [(nd.array(rs.uniform(-1, 1, (1, n, 4))),) for n in lengths]
            assert_batched_equals_eager(model, samples, {"compiled": compiled})
    told = [r for r in caplog.records if "refused to build a plan's graph" in r.getMessage()]
    assert len(told) == 1


class KhatriRao(gdb.DynBatchBlock):
    """``F.khatri_rao``: an operator MXNet registers no gradient for."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        h = F.reshape(self.dense(x), shape=(3, 1))
        return F.khatri_rao(h, h + 1.0)


@pytest.mark.parametrize("compiled", ["step", "plan"])
def test_operators_without_a_gradient_run_in_compiled_modes(compiled):
    """MXNet refuses to make a CachedOp of a graph holding one: such steps (it
    raised BatchingError) and plans run as batched imperative calls."""
    model = KhatriRao()
    model.initialize(mx.init.Uniform(0.5))
    xs = [nd.random.uniform(-1, 1, shape=(1, 3)) for _ in range(4)]
    want = [model(x).asnumpy() for x in xs]
    for _ in range(2):
        with gdb.batching(compiled=compiled):
            outs = [model(x) for x in xs]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class TiedSparseLM(gdb.DynBatchBlock):
    """An output layer sharing an embedding's weight, whose gradient is sparse."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.emb = gluon.nn.Embedding(12, 4, sparse_grad=True)
            self.cell = gluon.rnn.LSTMCell(4, input_size=4)
            self.out = gluon.nn.Dense(12, flatten=False, in_units=4, params=self.emb.params)

    def hybrid_forward(self, F, words):
        x = self.emb(F.array([words]))
        state = self.cell.begin_state(batch_size=1, func=F.zeros)
        losses = []
        for t in range(len(words) - 1):
            h, state = self.cell(x[:, t], state)
            losses.append(-F.pick(F.log_softmax(self.out(h)), F.array([words[t + 1]]), axis=1))
        return F.concat(*losses, dim=0)


@pytest.mark.parametrize("compiled", ["plan", True])
def test_a_tied_sparse_gradient_trains_under_compiled_plans(compiled):
    """MXNet's CachedOp cannot sum a sparse and a dense gradient of one weight:
    such plans run as batched imperative calls."""
    mx.random.seed(0)
    model = TiedSparseLM()
    model.initialize(mx.init.Uniform(0.3))
    sentences = [[1, 2], [3, 4, 5], [6, 7, 8, 9]]

    def gradients(options):
        with mx.autograd.record():
            if options is None:
                outs = [model(s) for s in sentences]
            else:
                with gdb.batching(**options):
                    outs = [model(s) for s in sentences]
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
        return {name: p.grad().tostype("default").asnumpy()
                for name, p in model.collect_params().items()}

    want = gradients(None)
    for _ in range(2):
        got = gradients({"compiled": compiled})
        for name, grad in want.items():
            np.testing.assert_allclose(got[name], grad, rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_frozen_sparse_embedding_keeps_compiled_plans():
    """A sparse-gradient table with ``grad_req="null"`` has no gradient at all:
    its plans stay compiled (they ran as imperative calls, as a tied one's do)."""
    mx.random.seed(0)
    model = TiedSparseLM()
    model.initialize(mx.init.Uniform(0.3))
    model.emb.weight.grad_req = "null"
    sentences = [[1, 2], [3, 4, 5], [6, 7, 8, 9]]
    with mx.autograd.record():
        want = [model(s) for s in sentences]
    for _ in range(2):
        with mx.autograd.record():
            with gdb.batching(compiled="plan") as scope:
                outs = [model(s) for s in sentences]
            nd.add_n(*[o.sum() for o in outs]).backward()
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected.asnumpy(), rtol=1e-5, atol=1e-6)
    assert scope.stats.cache_hits + scope.stats.cache_misses > 0


class _Chain(gdb.DynBatchBlock):
    """``f(d) = tanh(dense(f(d - 1)))``: a plan of one step per level."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, depth, x):
        return x if depth == 0 else F.tanh(self.dense(self(depth - 1, x)))


@pytest.mark.parametrize("cap, compiles", [(4, False), (1000, True)])
def test_compiled_true_runs_plans_of_many_steps_as_imperative_calls(monkeypatch, cap, compiles):
    """Compiling a whole plan of hundreds of steps took seconds a scope (a chain
    600 calls deep: 3 s, against 1 s eagerly): past ``MAX_WHOLE_PLAN_STEPS``
    steps, ``compiled=True`` runs the plan's calls imperatively."""
    from gluon_dynbatch import scope as scope_module
    monkeypatch.setattr(scope_module, "MAX_WHOLE_PLAN_STEPS", cap)
    mx.random.seed(0)
    model = _Chain(compiled=True)
    model.initialize()
    xs = [nd.random.uniform(-1, 1, shape=(1, 4)) for _ in range(3)]
    want = [model(8 + k, x).asnumpy() for k, x in enumerate(xs)]
    with gdb.batching() as scope:
        outs = [model(8 + k, x) for k, x in enumerate(xs)]
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    assert scope.stats.steps > 4
    assert (scope.stats.cache_misses > 0) == compiles


def _chain(depth):
    tree = Tree(1)
    for k in range(depth):
        tree = Tree(k % 5, [tree])
    return tree


@pytest.mark.parametrize("depth, whole", [(30, True), (230, False)])
def test_a_plan_longer_than_the_whole_plan_bound_runs_as_compiled_steps_under_plan(
        depth, whole, monkeypatch):
    """``compiled="plan"`` compiled a chain of 1,000 nodes as one graph: 22 s
    for what eager ran in 0.7 s (its backward pass too), 3 GB."""
    from gluon_dynbatch import scope as scope_module
    whole_runs = []
    real = scope_module.run_compiled

    def counting(plan, *args, **kwargs):
        whole_runs.append(len(plan.steps))
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(scope_module, "run_compiled", counting)
    model = make_model(ChildSumTreeLSTM, hidden=3)
    trees = [_chain(depth), _chain(3)]
    emb = nd.array(np.random.RandomState(0).uniform(-1, 1, (6, 3)))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5000))        # (eager Gluon's own calls, per level)
    try:
        expected = run_model(model, trees, [emb], "eager")
        got = run_model(model, trees, [emb], "depth", compiled="plan")
    finally:
        sys.setrecursionlimit(limit)
    assert_same(got, expected)
    assert bool(whole_runs) == whole, (whole_runs, got[2])


def test_the_memos_of_call_shapes_stay_bounded_under_ever_new_shapes(monkeypatch):
    # A server seeing new row counts at every batch grew them without bound.
    from gluon_dynbatch.ir import calls, ops
    monkeypatch.setattr(ops, "MAX_INFERRED", 50)
    monkeypatch.setattr(calls, "MAX_INFOS", 50)
    model = make_model(DenseTanh)
    for rows in range(301, 340):        # (row counts no other test records)
        x = nd.array(np.random.RandomState(rows).randn(rows, 3))
        with gdb.batching():
            out = model(x)
        np.testing.assert_allclose(out.asnumpy(), model(x).asnumpy(), rtol=1e-5, atol=1e-6)
        assert len(ops.INFER._cache) <= 50 and len(calls.INFOS) <= 50
