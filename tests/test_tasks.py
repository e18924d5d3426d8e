"""Samples that read values: each waits at its read while the others record.

A sample's code that reads a pending value (``int(x.asscalar())``, ``bool(x)``)
runs as a task: it waits, the scope goes on with the other samples, and what
is pending runs for all of them at once.  Results, gradients and each
sample's side effects equal eager Gluon's; a scope flushes once per read of
the sample that reads most, plus once.
"""
import collections
import contextlib
import contextvars
import copy
import dataclasses
import enum
import gc
import io
import pickle
import sys
import weakref

import greenlet
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn, rnn

import gluon_dynbatch as gdb
import gluon_dynbatch.scope as gdb_scope
from gluon_dynbatch import logs
from gluon_dynbatch.record.tasks import PendingValue, live_tasks
from dynbatch_testing import output_of_script

VOCAB, HIDDEN, EOS = 7, 8, 0


class Greedy(gdb.DynBatchBlock):
    """A GRU decoder choosing each next token by the argmax of its scores (a
    read), until end-of-sentence; returns the tokens and their log-probabilities."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.log = []                   # (sample's start token, step, token)
        with self.name_scope():
            self.emb = nn.Embedding(VOCAB, HIDDEN)
            self.cell = rnn.GRUCell(HIDDEN)
            self.out = nn.Dense(VOCAB)

    def hybrid_forward(self, F, start, max_len=9, fail_at=None):
        h, tok, tokens, scores = F.zeros((1, HIDDEN)), start, [], []
        for step in range(max_len):
            out, [h] = self.cell(self.emb(F.array([tok])), [h])
            logits = self.out(out)
            tok = int(F.argmax(logits, axis=1).asscalar())
            self.log.append((start, step, tok))
            if step == fail_at:
                raise ValueError("sample %d failed on purpose" % start)
            scores.append(F.pick(F.log_softmax(logits, axis=1), F.array([tok]), axis=1))
            tokens.append(tok)
            if tok == EOS:
                break
        return tokens, F.concat(*scores, dim=0)


def _model(seed=3):
    mx.random.seed(seed)
    model = Greedy()
    model.initialize(mx.init.Uniform(0.8))
    return model


STARTS = [1, 2, 3, 4, 5, 6, 2, 5]


def _eager(model, starts):
    with autograd.record():
        results = [model(s) for s in starts]
        loss = nd.add_n(*[scores.sum() for _, scores in results])
    loss.backward()
    grads = {n: p.grad().asnumpy().copy() for n, p in model.collect_params().items()}
    return results, grads


def _assert_like_eager(model, got, want, want_grads):
    """Tokens, scores and the model's gradients equal eager's."""
    for (tokens, scores), (ref_tokens, ref_scores) in zip(got, want):
        assert tokens == ref_tokens
        np.testing.assert_allclose(scores.asnumpy(), ref_scores.asnumpy(), rtol=1e-5, atol=1e-6)
    for name, grad in want_grads.items():
        np.testing.assert_allclose(model.collect_params()[name].grad().asnumpy(), grad,
                                   rtol=1e-5, atol=1e-6, err_msg=name)


def test_greedy_decoding_waits_at_each_read_and_equals_eager():
    model = _model()
    want, want_grads = _eager(model, STARTS)
    eager_log = sorted(model.log)
    model.log.clear()
    with autograd.record():
        with gdb.batching() as scope:
            got = gdb.map(model, STARTS)
        loss = nd.add_n(*[scores.sum() for _, scores in got])
    loss.backward()
    _assert_like_eager(model, got, want, want_grads)
    assert sorted(model.log) == eager_log
    # Each sample's own steps in its own order, the samples interleaved.
    for start in set(STARTS):
        mine = [step for s, step, _ in model.log if s == start]
        assert mine == sorted(mine)
    longest = max(len(tokens) for tokens, _ in want)
    stats = scope.stats
    assert stats.reads == sum(len(tokens) for tokens, _ in want)
    assert stats.flushes == longest + 1 < stats.reads


def test_a_plain_loop_returns_results_filled_in_when_the_samples_finish():
    model = _model()
    want, _ = _eager(model, STARTS)
    with gdb.batching() as scope:
        outs = [model(s) for s in STARTS]
        # The model's first call in a scope shows the form of its results (it
        # runs to its end); the others wait and hand out placeholders of it.
        assert type(outs[0][0]) is list
        assert all(isinstance(out[1], gdb.LazyArray) for out in outs[1:])
    for (tokens, scores), (ref_tokens, ref_scores) in zip(outs, want):
        assert tokens == ref_tokens
        np.testing.assert_allclose(scores.asnumpy(), ref_scores.asnumpy(), rtol=1e-5, atol=1e-6)
    first, rest = len(want[0][0]), max(len(t) for t, _ in want[1:])
    assert scope.stats.flushes <= first + rest + 1 < scope.stats.reads
    with gdb.batching() as scope:             # the form is known: every sample waits
        outs = [model(s) for s in STARTS]
    assert [list(tokens) for tokens, _ in outs] == [t for t, _ in want]
    assert scope.stats.flushes == max(len(t) for t, _ in want) + 1


def test_a_result_used_before_its_sample_finished_is_run_first():
    model = _model()
    want, _ = _eager(model, STARTS[:3])
    with gdb.batching():
        first = model(STARTS[0])
        tokens, scores = first                # the model's first call: run to its end
        assert tokens == want[0][0]
        rest = [model(s) for s in STARTS[1:3]]
        total = scores.sum()                  # recorded like any value
    np.testing.assert_allclose(total.asnumpy(), want[0][1].asnumpy().sum(), rtol=1e-5)
    assert [out[0] for out in rest] == [w[0] for w in want[1:3]]


def test_an_error_in_one_sample_after_a_read_lets_the_others_finish():
    model = _model()
    with pytest.raises(ValueError, match="sample 3 failed") as info:
        gdb.map(lambda s: model(s, 9, 1 if s == 3 else None), STARTS[:5])
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "raised while recording sample 2" in notes
    assert "gdb.map's call for samples[%d]" % STARTS.index(3) in notes
    finished = {s for s, _, tok in model.log if tok == EOS}
    ended = {s for s in STARTS[:5] if s != 3}
    # Every other sample ran to its end (EOS or the step limit).
    for start in ended:
        steps = [step for s, step, _ in model.log if s == start]
        assert start in finished or len(steps) == 9
    with gdb.batching():                      # the next batch works
        outs = gdb.map(model, STARTS[:2])
    assert len(outs) == 2


def test_a_scope_left_early_unwinds_its_waiting_samples():
    model = _model()
    unwound = []

    class Guarded(gdb.DynBatchBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.inner = model

        def hybrid_forward(self, F, start):
            try:
                return self.inner(start)
            finally:
                unwound.append(start)

    guarded = Guarded()
    before = _greenlets()
    with pytest.raises(KeyError):
        with gdb.batching():
            outs = [guarded(s) for s in STARTS[:4]]
            raise KeyError("the user's loop stops")
    assert sorted(unwound) == sorted(STARTS[:4])
    # The first call ran to its end (it showed the form of the results); the
    # others' placeholders say their sample never finished.
    with pytest.raises(gdb.BatchingError, match="waiting at a read.*KeyError"):
        outs[1][1].asnumpy()
    del outs
    gc.collect()
    assert _greenlets() <= before


def _greenlets():
    gc.collect()
    return live_tasks()


def test_many_scopes_with_waiting_samples_leave_no_greenlet_behind():
    model = _model()
    before = _greenlets()
    for k in range(30):
        with gdb.batching():
            outs = [model(s) for s in STARTS[:3]]
        assert outs[0][0]
    del outs
    gc.collect()
    assert _greenlets() <= before


def test_an_interrupt_while_a_round_resumes_its_samples_leaves_none_waiting(monkeypatch):
    """A KeyboardInterrupt (Ctrl-C) at the third sample a round resumes: the
    samples not resumed yet were out of the waiting list, and the scope's end
    did not unwind them (their stacks stayed for good)."""
    from gluon_dynbatch.record import tasks as task_module
    model = _model()
    before = _greenlets()
    switch, count = task_module.Tasks._switch, [0]

    def interrupted(self, task):
        if sys._getframe(1).f_code.co_name == "_resume":
            count[0] += 1
            if count[0] == 3:
                raise KeyboardInterrupt
        return switch(self, task)
    monkeypatch.setattr(task_module.Tasks, "_switch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with gdb.batching():
            [model(s) for s in STARTS]
    monkeypatch.setattr(task_module.Tasks, "_switch", switch)
    assert _greenlets() <= before
    want, want_grads = _eager(model, STARTS)
    with autograd.record():
        with gdb.batching():
            got = gdb.map(model, STARTS)
        loss = nd.add_n(*[scores.sum() for _, scores in got])
    loss.backward()
    _assert_like_eager(model, got, want, want_grads)


class Tree:
    def __init__(self, word, children=()):
        self.word, self.children = word, list(children)


class ReadingTree(gdb.DynBatchBlock):
    """A tree RNN whose nodes branch on a value they read; each reads under
    ``autograd.pause()`` (the modes are each waiting sample's own)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(HIDDEN)
            self.a = nn.Dense(HIDDEN)
            self.b = nn.Dense(HIDDEN)

    def hybrid_forward(self, F, tree, table):
        h = self.inp(table[tree.word:tree.word + 1])
        for child in tree.children:
            h = h + self(child, table)
        probe = F.sum(h)
        with autograd.pause():          # the sample waits here, outside recording
            up = float(probe.asscalar()) > 0
        if up:
            return F.tanh(self.a(h))
        return F.tanh(self.b(h)) * 0.5


def _trees(seed, n):
    rs = np.random.RandomState(seed)

    def grow(depth):
        k = 0 if depth > 2 else rs.randint(0, 3)
        return Tree(rs.randint(0, 10), [grow(depth + 1) for _ in range(k)])
    return [grow(0) for _ in range(n)]


@pytest.mark.parametrize("strategy,compiled", [("depth", False), ("agenda", True),
                                               ("depth", "step")])
def test_trees_branching_on_reads_batch_and_equal_eager(strategy, compiled):
    mx.random.seed(0)
    model = ReadingTree()
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(1).uniform(-1, 1, (10, 4)))
    trees = _trees(2, 8)
    table.attach_grad()
    with autograd.record():
        want = [model(t, table) for t in trees]
        loss = nd.add_n(*[w.sum() for w in want])
    loss.backward()
    want_grad = model.a.weight.grad().asnumpy().copy(), table.grad.asnumpy().copy()
    with autograd.record():
        with gdb.batching(strategy=strategy, compiled=compiled) as scope:
            got = [model(t, table) for t in trees]
        loss = nd.add_n(*[g.sum() for g in got])
    loss.backward()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.a.weight.grad().asnumpy(), want_grad[0], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(table.grad.asnumpy(), want_grad[1], rtol=1e-5, atol=1e-6)
    assert scope.stats.eager_samples == 0 and scope.stats.flushes < scope.stats.reads


class _Sample:
    """A sample object, to see who keeps it alive."""

    def __init__(self, start):
        self.start = start


def test_finished_tasks_keep_nothing_of_their_samples_alive():
    """The greenlet a finished task ran on serves the next task (a new one's
    first switch costs ten times more); while idle it holds nothing of the
    sample, its arguments or its result."""
    model = _model()
    for mode in ("loop", "map", "error"):
        samples = [_Sample(s) for s in STARTS[:4]]
        refs = [weakref.ref(s) for s in samples]
        with gdb.batching():
            if mode == "map":
                outs = gdb.map(lambda s: model(s.start), samples)
            elif mode == "loop":
                outs = [model(s.start) for s in samples]
            else:
                outs = []
                for k in range(len(samples)):
                    with pytest.raises(ZeroDivisionError):
                        gdb.map(lambda s: model(s.start) and 1 / 0, samples[k:k + 1])
        results = [weakref.ref(scores) for _, scores in outs]
        del samples, outs
        gc.collect()
        assert all(ref() is None for ref in refs + results), mode
    assert live_tasks() == 0


class _Cyclic:
    """An object in a reference cycle (a search tree's node and its parent)."""

    def __init__(self):
        self.me = self


def test_cyclic_garbage_samples_make_is_collected_once_the_process_grows(monkeypatch):
    """Open scopes pause the cyclic collector: a search whose nodes link to their
    parents kept every tree it dropped until the scope ended (gigabytes where
    eager stays flat); past ``COLLECT_AFTER_KB`` of growth a flush collects."""
    monkeypatch.setattr(gdb_scope, "COLLECT_AFTER_KB", -1, raising=False)   # every flush
    monkeypatch.setattr(gdb_scope, "CHECK_SIZE_EVERY_S", 0.0, raising=False)
    model = _model()

    def search(start):
        dropped = []
        for _ in range(3):
            dropped.append(weakref.ref(_Cyclic()))      # garbage at once
            model(start)[1].asnumpy()                   # a read: the samples wait
        return sum(ref() is not None for ref in dropped)

    with gdb.batching():
        alive = gdb.map(search, STARTS[:4])
    assert alive == [0, 0, 0, 0]


class CatchesEverything(gdb.DynBatchBlock):
    """A decoder whose code catches every exception around its reads."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4, activation="tanh")

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        for _ in range(4):
            h = self.dense(h)
            try:
                int(F.argmax(h, axis=1).asscalar())
            except:  # noqa: E722  pylint: disable=bare-except
                continue
        return h


def test_samples_that_catch_every_exception_leave_no_task_when_their_scope_fails():
    """The scope's own code raises while samples wait: each waiting sample is
    unwound by a ``GreenletExit`` it caught (a bare ``except:``), went on to its
    next read, and stayed suspended there, one task per sample and scope."""
    model = CatchesEverything()
    model.initialize()
    xs = [nd.array(np.random.RandomState(k).uniform(-1, 1, (1, 4))) for k in range(3)]
    for _ in range(3):
        with pytest.raises(KeyError):
            with gdb.batching():
                outs = [model(x) for x in xs]
                raise KeyError("the scope's own code fails")
        gc.collect()        # (``outs`` is kept: its waiting results held the tasks)
        assert live_tasks() == 0, outs


def test_soak_script_counts_the_tasks_scopes_leave_behind(monkeypatch, tmp_path):
    """scripts/soak.py --model reads passes when stopped scopes unwind their
    waiting samples, and fails when they do not."""
    import sys
    from pathlib import Path
    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    monkeypatch.syspath_prepend(scripts)
    soak = __import__("soak")
    from gluon_dynbatch.record import recursion
    raised, limit = list(recursion._RAISED), sys.getrecursionlimit()  # pylint: disable=W0212
    argv = ["--model", "reads", "--batches", "12", "--warmup", "3", "--stop-every", "3",
            "--batch-size", "4", "--no-progress", "--csv", str(tmp_path / "rss.csv")]
    assert soak.main(argv) == 0
    from gluon_dynbatch.record import tasks
    before = {id(g) for g in _live()}
    monkeypatch.setattr(tasks.Tasks, "close", lambda self, why: None)
    assert soak.main(argv) == 1
    monkeypatch.undo()
    for glet in _live():            # unwind what the broken close left waiting
        if id(glet) not in before:
            glet.throw()
    # A task the broken close left may still count as recording: later tests
    # would record under the recursion limit of this one.
    recursion._RAISED[:] = raised  # pylint: disable=W0212
    sys.setrecursionlimit(limit)
    del sys.modules["soak"]


def _live():
    gc.collect()
    return [obj for obj in gc.get_objects() if isinstance(obj, greenlet.greenlet)
            and obj and not obj.dead and obj is not greenlet.getcurrent()]


def test_rows_handed_out_are_analysed_once_per_position(monkeypatch):
    """A flush hands each sample its rows of a batched output, whose row count
    depends on how many samples were live; reading those rows in the next
    flush needs no new analysis for a position seen before, nor for a new
    position of rows of a width seen before."""
    from gluon_dynbatch.ir import calls
    from gluon_dynbatch.record import recorder
    recorder._ROW_SLICES.clear()        # memos: start from nothing known
    recorder._ROW_WIDTHS.clear()
    calls.INFOS.clear()
    model = _model()
    original = calls.analyse
    seen = []
    monkeypatch.setattr(calls, "analyse", lambda node, *args: (
        seen.append(node.op.name) or original(node, *args)))

    def row_analyses(starts):
        del seen[:]
        with gdb.batching():
            gdb.map(model, starts)
        return seen.count("slice_axis")

    assert row_analyses([1, 2, 3, 4, 5]) > 0
    assert row_analyses([1, 2, 3, 4, 5]) == 0
    # One more sample: its positions are new, its rows' widths are not.
    assert row_analyses([1, 2, 3, 4, 5, 6]) == 0
    assert row_analyses([1, 2, 3, 4, 5, 6, 2]) == 0


def test_values_handed_out_are_cut_out_only_when_used_as_arrays(monkeypatch):
    """A flush hands each sample its rows of a batched output without cutting
    them out: a round's reads copy each batched output from MXNet once, not a
    copy per sample; values used as arrays afterwards (a loss, an in-place
    update) are cut out then and equal eager's."""
    model = _model()
    want, want_grads = _eager(model, STARTS)
    copies = []
    original = nd.NDArray.asnumpy
    monkeypatch.setattr(nd.NDArray, "asnumpy", lambda self: (
        copies.append(type(self)) or original(self)))
    with autograd.record():
        with gdb.batching() as scope:
            got = gdb.map(model, STARTS)
        assert scope.stats.reads == sum(len(tokens) for tokens, _ in want)
        # Every read of a round reads rows of one batched output: one copy a round.
        assert len(copies) <= scope.stats.flushes < scope.stats.reads
        assert all(not scores.is_pending for _, scores in got)
        assert got[0][1].shape == want[0][1].shape
        loss = nd.add_n(*[scores.sum() for _, scores in got])
    loss.backward()
    _assert_like_eager(model, got, want, want_grads)
    with gdb.batching():
        again = gdb.map(model, STARTS[:4])
    scores = again[1][1]
    scores += 1                               # written in place: cut out first
    np.testing.assert_allclose(scores.asnumpy(), want[1][1].asnumpy() + 1, rtol=1e-5)
    np.testing.assert_allclose(again[2][1].asnumpy(), want[2][1].asnumpy(), rtol=1e-5)


class HeldLiteral(gdb.DynBatchBlock):
    """A literal (``F.array``) held across a read, then used again: as an
    embedding's indices, which take no gradient, and as a pick's indices."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.emb = nn.Embedding(VOCAB, HIDDEN)

    def hybrid_forward(self, F, start):
        ids = F.array([start % VOCAB, (start + 1) % VOCAB])
        h = self.emb(ids)
        first = int(F.argmax(h.sum(axis=1), axis=0).asscalar())        # a read
        again = self.emb(ids) * (first + 1)
        return F.concat(again, F.pick(h, ids % 2, axis=1).reshape((2, 1)), dim=1)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_literal_held_across_a_read_is_used_again_as_eager_uses_it(compiled):
    mx.random.seed(4)
    model = HeldLiteral()
    model.initialize(mx.init.Uniform(0.8))
    starts = [1, 2, 3, 4, 5, 6]

    def run(batched):
        with autograd.record():
            if batched:
                with gdb.batching(compiled=compiled):
                    outs = gdb.map(model, starts)
            else:
                outs = [model(s) for s in starts]
            loss = nd.add_n(*[out.sum() for out in outs])
        loss.backward()
        return [out.asnumpy() for out in outs], model.emb.weight.grad().asnumpy().copy()

    want, want_grad = run(False)
    for _ in range(2):                      # learning the templates, then replaying them
        got, grad = run(True)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


class RoutedConstantRows(gdb.DynBatchBlock):
    """Rows of a constant table (frozen embeddings), a read choosing a scale,
    then ``dot`` of the rows with a weight: after the read, one sample's rows
    are a constant array and the others' rows of the flush's output."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.gate = nn.Dense(4, in_units=HIDDEN)
            self.weight = self.params.get("weight", shape=(HIDDEN, HIDDEN))

    def hybrid_forward(self, F, word, table, weight):
        x = table[word:word + 1]
        k = int(F.argmax(self.gate(x), axis=1).asscalar())
        return F.dot(x, weight) * (k + 1)


@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("options", [{}, {"compiled": True}])
def test_constant_rows_held_across_a_read_multiply_as_in_eager(record, options):
    mx.random.seed(6)
    model = RoutedConstantRows()
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(1).uniform(-1, 1, (30, HIDDEN)))
    modes = autograd.record if record else autograd.pause
    for words in ([3, 17, 5, 29, 11, 8], [4, 9, 21, 2, 0], [7, 7, 13]):
        with modes():
            want = [model(w, table).asnumpy() for w in words]
            with gdb.batching(**options):
                got = [model(w, table) for w in words]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.asnumpy(), b, rtol=1e-5, atol=1e-6)


def test_a_scopes_last_flush_hands_out_one_array_per_group():
    """Values of a flush that no sample waits for go to the user, who uses
    them as arrays: each group of them is rows of one array (one split when
    used), not rows of every step that computed one (a cut per step)."""
    from dynbatch_testing import TokenRNN
    mx.random.seed(2)
    model = TokenRNN(hidden=5)
    model.initialize(mx.init.Uniform(0.5))
    emb = nd.random.uniform(shape=(10, 3))
    sentences = [[1, 2], [3], [4, 5, 6, 7], [8, 9, 1]]
    want = [model(s, emb) for s in sentences]
    with gdb.batching():
        outs = [model(s, emb) for s in sentences]
    states = [h for _, h in outs]
    assert len({id(h._rows[0]) for h in states}) == 1       # last states of every length
    for (_, h), (_, ref) in zip(outs, want):
        np.testing.assert_allclose(h.asnumpy(), ref.asnumpy(), rtol=1e-5, atol=1e-6)


class _PredictToTheEnd(gdb.DynBatchBlock):
    """Runs its last calls in predict mode: a sample ends in other autograd
    modes than those its result is handed out in."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.first = nn.Dense(4)
            self.drop = nn.Dropout(0.5)
            self.rest = nn.Dense(4)

    def hybrid_forward(self, F, steps, x):
        h = self.first(x)
        with autograd.predict_mode():
            for _ in range(steps):
                h = F.tanh(self.rest(self.drop(h)))
        return h


def _alarm(seconds):
    """Raise TimeoutError in the main thread after ``seconds``, then every half
    second (code that catches one does not hide a hang): a hang fails the test."""
    import signal

    def _raise(signum, frame):
        raise TimeoutError("no result after %d s" % seconds)
    signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)


def test_samples_ending_in_predict_mode_hand_out_their_results():
    """A finished sample's results go to its placeholders under the modes it
    ended in, while the pending calls of others ran in predict mode."""
    import signal
    mx.random.seed(2)
    model = _PredictToTheEnd()
    model.initialize()
    x = nd.array(np.linspace(-1, 1, 12).reshape(3, 4))
    steps = [2, 1, 3, 2, 1]
    results = []
    for batched in (False, True):
        x.attach_grad()
        _alarm(30)
        try:
            with autograd.record():
                if batched:
                    with gdb.batching():
                        outs = [model(k, x) for k in steps]
                else:
                    outs = [model(k, x) for k in steps]
                loss = nd.add_n(*[(o * o).sum() for o in outs])
            loss.backward()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        results.append(([o.asnumpy() for o in outs], x.grad.asnumpy().copy(),
                        model.first.weight.grad().asnumpy().copy()))
    (want, want_x, want_w), (got, got_x, got_w) = results
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_x, want_x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)


def test_a_waiting_samples_result_used_in_the_scopes_own_calls_equals_eager():
    """A loss and a backward pass per sample inside the scope: the result of a
    sample that waits (here at a change of autograd's modes) is an operand of
    the scope's own calls before its sample has finished."""
    mx.random.seed(2)
    model = _PredictToTheEnd()
    model.initialize()
    x = nd.array(np.linspace(-1, 1, 12).reshape(3, 4))
    results = []
    for batched in (False, True):
        model.collect_params().zero_grad()
        scope = gdb.batching() if batched else contextlib.nullcontext()
        outs = []
        with scope:
            for k in [2, 1, 3, 2]:
                with autograd.record():
                    out = model(k, x)
                    loss = (out * out).sum()
                loss.backward()
                outs.append(out)
        results.append(([o.asnumpy() for o in outs], model.first.weight.grad().asnumpy().copy()))
    _assert_runs_agree(results)


def _assert_runs_agree(results, grad_atol=1e-6):
    """``results``: (outputs as numpy, a weight's gradient) eagerly, then batched."""
    (want, want_grad), (got, got_grad) = results
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=grad_atol)


class PadsWithZeros(gluon.HybridBlock):
    """A child whose calls use the constant ``F.zeros((1, 1))``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(F.concat(x[:, :2], F.zeros((1, 1)), dim=1)))


class PondersUntilDone(gdb.DynBatchBlock):
    """Adaptive computation: steps until a running total read as a number
    passes 0.5; the total starts as the same constant ``F.zeros((1, 1))``,
    read as a plain array before any step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.step = PadsWithZeros()

    def hybrid_forward(self, F, k, x):
        h = self.step(x[k:k + 1])
        total = F.zeros((1, 1))
        while total.asscalar() < 0.5:
            h = self.step(h)
            total = total + F.sigmoid(F.sum(h, axis=1, keepdims=True))
        return h


def test_a_constant_read_as_a_plain_array_stays_a_constant_of_the_graph():
    # Reading the constant copies it out of the graph; the steps' programs,
    # which read the same constant, still get it as a leaf of the graph.
    mx.random.seed(0)
    model = PondersUntilDone()
    model.initialize()
    x = nd.random.uniform(shape=(5, 3))
    eager = [model(k, x).asnumpy() for k in range(4)]
    for _ in range(2):
        with gdb.batching():
            got = gdb.map(lambda k: model(k, x), list(range(4)))
        for out, want in zip(got, eager):
            np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-5, atol=1e-6)


class PrintsWhatItReads(gdb.DynBatchBlock):
    """Prints a value it reads into a buffer of its own (``redirect_stdout``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(1, in_units=3)

    def hybrid_forward(self, F, k):
        y = self.dense(F.ones((1, 3)) * k)
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            print("sample", k, y)                   # a read, in the sample's own stream
        return buffer.getvalue(), y


def test_a_sample_printing_into_its_own_stream_while_it_waits_equals_eager():
    mx.random.seed(0)
    model = PrintsWhatItReads()
    model.initialize()
    eager = [model(k)[0] for k in (1, 2, 3)]
    stdout = sys.stdout
    with gdb.batching():
        got = [text for text, _ in gdb.map(model, [1, 2, 3])]
    assert sys.stdout is stdout
    assert got == eager             # the same text, ``<NDArray 1x1 @cpu(0)>`` included


class ReadsUnderPause(gdb.DynBatchBlock):
    """Reads a value computed under ``autograd.pause()`` (``kind == "pause"``) or
    one it differentiates through."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(8, activation="tanh")
            self.after = nn.Dense(8)

    def hybrid_forward(self, F, sample):
        kind, x = sample
        h = self.dense(x)
        if kind == "pause":
            with autograd.pause():
                F.max(h).asscalar()
            return h
        h.asnumpy()
        return self.after(h)


@pytest.mark.parametrize("how", ["map", "loop"])
@pytest.mark.parametrize("options", [{}, {"strategy": "reference"}, {"compiled": "step"},
                                     {"compiled": True}])
def test_samples_waiting_under_other_modes_record_under_their_own(how, options):
    """A sample that resumes after one whose calls ran under ``autograd.pause()``
    records under its own modes: its gradients reach the parameters, as eagerly."""
    mx.random.seed(1)
    model = ReadsUnderPause()
    model.initialize(mx.init.Uniform(0.7))
    r = np.random.RandomState(0)
    samples = [(kind, nd.array(r.uniform(-1, 1, (1, 4))))
               for kind in ("pause", "read", "read")]
    # Eager, then two scopes: the second knows the form of the block's results,
    # so every sample starts before the first read.
    _eager_then_twice_batched(model, samples, options, how == "map")


def _eager_then_twice_batched(model, samples, options, use_map):
    """Outputs and ``model.dense``'s weight gradient: eager, then two scopes
    with ``options`` (through ``gdb.map`` with ``use_map``), all agreeing; the
    last scope."""
    results = []
    for batched in (False, True, True):
        with autograd.record():
            if not batched:
                outs = [model(s) for s in samples]
            else:
                with gdb.batching(**options) as scope:
                    outs = gdb.map(model, samples) if use_map \
                        else [model(s) for s in samples]
            loss = nd.add_n(*[(o * o).sum() for o in outs])
        loss.backward()
        results.append(([o.asnumpy() for o in outs], model.dense.weight.grad().asnumpy().copy()))
    _assert_runs_agree(results[:2], grad_atol=1e-5)
    _assert_runs_agree(results[::2], grad_atol=1e-5)
    return scope


class SearchesThenScores(gdb.DynBatchBlock):
    """A search of its own number of steps under ``autograd.pause()``, each step
    reading a value (as a beam search does), then a score that is differentiated
    and read once more."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(8, activation="tanh")
            self.step = nn.Dense(8)
            self.after = nn.Dense(8)

    def hybrid_forward(self, F, sample):
        steps, x = sample
        h = self.dense(x)
        with autograd.pause():
            probe = h
            for _ in range(steps):
                probe = self.step(probe)
                if float(F.max(probe).asscalar()) > 0:
                    probe = probe * 0.5
        score = self.after(h + probe)
        if float(F.sum(score).asscalar()) > 0:
            score = score * 2
        return score


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}])
def test_samples_leaving_pause_at_different_rounds_keep_batching(options):
    """Samples whose searches under ``autograd.pause()`` end at different reads
    go on batching: a round resumes the samples under its pair of autograd modes
    together, so a scope flushes once per read of the longest sample (and once
    more per change of modes), not once per sample leaving the search."""
    mx.random.seed(2)
    model = SearchesThenScores()
    model.initialize(mx.init.Uniform(0.7))
    r = np.random.RandomState(3)
    samples = [(1 + k % 5, nd.array(r.uniform(-1, 1, (1, 4)))) for k in range(20)]
    scope = _eager_then_twice_batched(model, samples, options, True)
    assert scope.stats.reads == sum(steps + 1 for steps, _ in samples)
    # The longest sample reads 6 times and changes modes twice (each a wait).
    assert scope.stats.flushes == 6 + 2 + 1, scope.stats


class ReadsThenScales(gdb.DynBatchBlock):
    """Doubles its output where a value it reads is positive."""

    def __init__(self, fail_on=None, **kwargs):
        super().__init__(**kwargs)
        self.fail_on = fail_on
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        if h.sum().asscalar() > 0:
            h = h * 2
        if self.fail_on is not None and float(x.sum().asscalar()) == self.fail_on:
            raise ValueError("sample %s failed on purpose" % self.fail_on)
        return h


class MapsItsGroup(gdb.DynBatchBlock):
    """Runs ``gluon_dynbatch.map`` over a group of samples inside its own call."""

    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inner = inner

    def hybrid_forward(self, F, group):
        return F.concat(*gdb.map(self.inner, group), dim=0)


def _groups():
    r = np.random.RandomState(4)
    xs = [nd.array(r.uniform(-1, 1, (1, 3))) for _ in range(6)]
    return [xs[:2], xs[2:5], xs[5:]]


def test_map_inside_a_sample_waits_for_its_own_samples():
    """``gluon_dynbatch.map`` called by a sample (a mapped function, a block's
    call) returns its samples' results once they finish, equal to eager."""
    mx.random.seed(0)
    inner = ReadsThenScales()
    inner.initialize()
    outer = MapsItsGroup(inner)
    groups = _groups()
    want = [[inner(x).asnumpy() for x in g] for g in groups]
    with gdb.batching():
        got = gdb.map(lambda g: gdb.map(inner, g), groups)
    for g_got, g_want in zip(got, want):
        assert len(g_got) == len(g_want)
        for a, b in zip(g_got, g_want):
            np.testing.assert_allclose(a.asnumpy(), b, rtol=1e-5, atol=1e-6)
    with gdb.batching():
        stacked = [outer(g) for g in groups]
    for a, g_want in zip(stacked, want):
        np.testing.assert_allclose(a.asnumpy(), np.concatenate(g_want), rtol=1e-5, atol=1e-6)


def test_an_error_of_map_the_user_caught_is_not_raised_again():
    mx.random.seed(0)
    model = ReadsThenScales(fail_on=3.0)
    model.initialize()
    xs = [nd.ones((1, 3)) * k / 3.0 for k in range(4)]     # sample 3 sums to 3
    with gdb.batching():
        with pytest.raises(ValueError, match="failed on purpose"):
            gdb.map(model, xs)
        got = gdb.map(model, xs[:3])
    for a, x in zip(got, xs):
        np.testing.assert_allclose(a.asnumpy(), model(x).asnumpy(), rtol=1e-5, atol=1e-6)


class ChoosesTokens(gdb.DynBatchBlock):
    """Returns the tokens it chose (as many as ``steps``) and its last state."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x, steps):
        h, tokens = x, []
        for _ in range(steps):
            h = F.tanh(self.dense(h))
            tokens.append(int(F.argmax(h, axis=1).asscalar()))
        return tokens, h


def test_token_lists_of_different_lengths_in_a_plain_loop_equal_eager():
    """A list of plain values in a result (the tokens a decoder chose) may have
    another length in every sample: the first scope's plain loop batches too."""
    mx.random.seed(0)
    model = ChoosesTokens()
    model.initialize(mx.init.Uniform(0.8))
    r = np.random.RandomState(2)
    samples = [(nd.array(r.uniform(-1, 1, (1, 4))), steps) for steps in (1, 3, 2, 4, 3)]
    want = [model(*s) for s in samples]
    with gdb.batching() as scope:
        got = [model(*s) for s in samples]
    for (tokens, h), (ref_tokens, ref_h) in zip(got, want):
        # A list, as eager returns it: compared, added to, copied as one.
        assert isinstance(tokens, list) and tokens == ref_tokens
        assert tokens + [-1] == ref_tokens + [-1] and type(copy.copy(tokens)) is list
        np.testing.assert_allclose(h.asnumpy(), ref_h.asnumpy(), rtol=1e-5, atol=1e-6)
    # The first sample runs to its end alone (it shows the form); the others batch.
    assert scope.stats.flushes <= 1 + 4 + 1 < scope.stats.reads


class ReturnsWhatItRead(gdb.DynBatchBlock):
    """Returns a number it read (a confidence) and a count, not arrays."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(1, in_units=4)

    def hybrid_forward(self, F, x):
        score = float(F.sigmoid(self.dense(x)).asscalar())
        return score, int(score > 0.5) + 1


def test_numbers_a_plain_loop_returns_act_as_the_numbers_eager_returns():
    """A waiting call's numbers (a plain loop) act as numbers once the scope ends:
    arithmetic both ways, comparisons, ``round``, ``format``, ``hash``, ``sum``,
    ``divmod``, numpy, indexing with the count."""
    mx.random.seed(3)
    model = ReturnsWhatItRead()
    model.initialize(mx.init.Uniform(1.0))
    r = np.random.RandomState(5)
    xs = [nd.array(r.uniform(-1, 1, (1, 4))) for _ in range(5)]
    want = [model(x) for x in xs]
    with gdb.batching():
        got = [model(x) for x in xs]
    for (score, count), (ref_score, ref_count) in zip(got, want):
        assert score + 1 == ref_score + 1 and 1 - score == 1 - ref_score
        assert (score < 0.5) == (ref_score < 0.5) and (0.5 <= score) == (0.5 <= ref_score)
        assert round(score, 2) == round(ref_score, 2)
        assert "{:.3f}".format(score) == "{:.3f}".format(ref_score)
        assert hash(score) == hash(ref_score) and sum([score, score]) == 2 * ref_score
        assert divmod(count, 2) == divmod(ref_count, 2) and -count == -ref_count
        assert ["a", "b", "c"][count] == ["a", "b", "c"][ref_count]
        assert np.array([score, count]).dtype == np.float64
        assert type(float(score)) is float and str(count) == str(ref_count)
    # Pickled as the numbers themselves, and no longer holding their samples' tasks.
    loaded = pickle.loads(pickle.dumps(got))
    assert loaded == [tuple(w) for w in want] and type(loaded[0][0]) is float
    stand_ins = [v for pair in got for v in pair if type(v) is PendingValue]
    assert stand_ins and all(v._task is None for v in stand_ins)  # pylint: disable=W0212


class ReturnsRowAndChoice(gdb.DynBatchBlock):
    """Returns its row, a number and an index it read; None in mode "none"."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x, mode="row"):
        h = F.tanh(self.dense(x))
        k = int(F.argmax(h, axis=1).asscalar())
        if mode == "none":
            return None
        return h, float(h[0, k].asscalar()), k


def _uses_of_stand_ins(results):
    """Arrays computed from arrays and the numbers, indices and Nones beside them."""
    found = []
    for result in results:
        if result is None:
            found.append(None)
            continue
        h, score, k = result
        # (the first use of each sample's index: its sample still waits)
        part = nd.slice(nd.ones((1, 4)), begin=(0, k), end=(1, 4)).sum().reshape((1, 1))
        found.append(nd.concat(part, h * score, score * h, h / score, h - score,
                               h[:, k].reshape((1, 1)), h[0, k].reshape((1, 1)), dim=1))
    return found


@pytest.mark.parametrize("when", ["inside", "after"])
def test_arrays_combined_with_numbers_waiting_samples_return_equal_eager(when):
    """``h * score``, ``h[:, k]`` and ``begin=(0, k)`` with a waiting sample's number
    and index (they raised TypeError, ValueError and MXNetError), and a None result
    is None (it was a stand-in)."""
    mx.random.seed(4)
    model = ReturnsRowAndChoice()
    model.initialize(mx.init.Uniform(1.0))
    r = np.random.RandomState(6)
    for mode in ("row", "none"):
        xs = [nd.array(r.uniform(-1, 1, (1, 4))) for _ in range(8)]
        want = _uses_of_stand_ins([model(x, mode) for x in xs])
        assert all(w is None for w in want) == (mode == "none")
        for _ in range(2):          # the first scope learns the form of the results
            with gdb.batching():
                results = [model(x, mode) for x in xs]
                if when == "inside":
                    got = _uses_of_stand_ins(results)
            if when == "after":
                got = _uses_of_stand_ins(results)
            for g, w in zip(got, want):
                assert (g is None) == (w is None)
                if w is not None:
                    np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-6)


@dataclasses.dataclass
class RowAndChoice:
    row: object
    choice: object


class ReturnsRecords(ReturnsRowAndChoice):
    """Its row and the index it read, in an OrderedDict or a dataclass."""

    def hybrid_forward(self, F, x, mode="ordered"):
        h = F.tanh(self.dense(x))
        k = int(F.argmax(h, axis=1).asscalar())
        if mode == "ordered":
            return collections.OrderedDict([("row", h), ("choice", k)])
        return RowAndChoice(h, k)


@pytest.mark.parametrize("mode", ["ordered", "dataclass"])
def test_waiting_samples_return_ordered_dicts_and_dataclasses_of_their_own_type(mode):
    """They were one stand-in for the whole result after the scope: code that
    flattens results by type found no arrays in them."""
    mx.random.seed(4)
    model = ReturnsRecords()
    model.initialize(mx.init.Uniform(1.0))
    r = np.random.RandomState(7)
    xs = [nd.array(r.uniform(-1, 1, (1, 4))) for _ in range(6)]
    want = [model(x, mode) for x in xs]
    for _ in range(2):              # the first scope learns the form of the results
        with gdb.batching():
            got = [model(x, mode) for x in xs]
        for g, w in zip(got, want):
            assert type(g) is type(w)
            parts = (g["row"], g["choice"]) if mode == "ordered" else (g.row, g.choice)
            wants = (w["row"], w["choice"]) if mode == "ordered" else (w.row, w.choice)
            np.testing.assert_allclose(parts[0].asnumpy(), wants[0].asnumpy(), rtol=1e-6)
            assert parts[1] == wants[1]


def test_a_leaf_arrays_description_serves_its_graph_and_the_next_only():
    table, wide = nd.ones((5, 3)), nd.ones((2, 7), dtype="float16")
    with gdb.batching() as scope:
        rec = scope.recorder
        first = rec.new_leaf(table)
        rec.new_graph()                     # as a flush for a read does
        again, other = rec.new_leaf(table), rec.new_leaf(wide)
        assert id(table) in rec._described[0]   # pylint: disable=protected-access
        assert (again.shape, again.dtype) == (first.shape, first.dtype) == ((5, 3), np.float32)
        assert (other.shape, other.dtype) == ((2, 7), np.float16)
        rec.new_graph()
        rec.new_graph()
        assert not any(id(table) in kept for kept in rec._described)  # pylint: disable=W0212
        rec.new_graph()


class _ReadsThrice(gdb.DynBatchBlock):
    """Reads a value at each of three steps; at the second, may wait for another
    thread (``pause``: the thread's events) before going on."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.pause = None
        with self.name_scope():
            self.a = nn.Dense(4)
            self.b = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.a(x))
        for step in range(3):
            sign = 1.0 if float(F.sum(h).asscalar()) > 0 else -1.0
            if step == 1 and self.pause is not None:
                read, other_ran = self.pause
                read.set()
                other_ran.wait(30)
            h = F.tanh(self.b(h)) * sign
        return h


def test_another_threads_backward_pass_leaves_a_scopes_values_differentiable():
    """A backward pass frees the graph of its own thread only: another thread's
    pass between two reads of a scope does not make the values the scope's
    first flushes handed out constants (their gradients were dropped)."""
    import threading
    mx.random.seed(0)
    model = _ReadsThrice()
    model.initialize(mx.init.Uniform(1.0))
    xs = [nd.array(np.random.RandomState(i).uniform(-1, 1, (1, 3))) for i in range(3)]

    def gradients(batched):
        with autograd.record():
            with gdb.batching() if batched else contextlib.nullcontext():
                outs = [model(x) for x in xs]
            loss = nd.add_n(*[(o * o).sum() for o in outs])
        loss.backward()
        return {k: p.grad().asnumpy().copy() for k, p in model.collect_params().items()}

    eager = gradients(False)
    read, other_ran = threading.Event(), threading.Event()

    def other_thread():                 # an unrelated model's eager training step
        read.wait(30)
        dense = nn.Dense(2)
        dense.initialize()
        with autograd.record():
            loss = dense(nd.ones((1, 3))).sum()
        loss.backward()
        other_ran.set()

    model.pause = (read, other_ran)
    result = {}
    threads = [threading.Thread(target=other_thread),
               threading.Thread(target=lambda: result.update(g=gradients(True)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    model.pause = None
    assert other_ran.is_set() and "g" in result
    for name, grad in eager.items():
        np.testing.assert_allclose(result["g"][name], grad, rtol=1e-5, atol=1e-6)


class ChildUnderOwnModes(gdb.DynBatchBlock):
    """Calls its child layer under ``autograd.pause()`` (``"pause"``), under
    ``predict_mode()`` (``"predict"``: its Dropout is the identity) or as it is,
    by sample."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.d = nn.Dense(5, in_units=5, activation="tanh")
            self.drop = nn.Dropout(0.5)
            self.o = nn.Dense(3, in_units=5)

    def hybrid_forward(self, F, x, kind):
        if kind == "pause":
            with autograd.pause():
                x = self.d(x)
        elif kind == "predict":
            with autograd.predict_mode():
                x = self.drop(self.d(x))
        else:
            x = self.d(x)
        return F.sum(self.o(x))


@pytest.mark.parametrize("how", ["loop", "map"])
@pytest.mark.parametrize("kinds", [("pause", "plain"), ("plain", "pause"),
                                   ("plain", "predict", "pause")])
def test_a_child_called_under_a_samples_own_modes_equals_eager(how, kinds):
    """A child block called right after the sample changed autograd's modes is
    not replayed from a template learned under other modes, and a sample that
    starts after one that changed them records under its own."""
    mx.random.seed(0)
    model = ChildUnderOwnModes()
    model.initialize()
    samples = [(nd.ones((1, 5)) * (k + 1), kind) for k, kind in enumerate(kinds)]
    runs = []
    for batched in (True, False):
        with autograd.record():
            if not batched:
                outs = [model(*s) for s in samples]
            else:
                with gdb.batching():
                    outs = gdb.map(lambda s: model(*s), samples) if how == "map" \
                        else [model(*s) for s in samples]
            loss = nd.add_n(*outs)
        loss.backward()
        runs.append(([o.asnumpy() for o in outs],
                     {k: p.grad().asnumpy().copy() for k, p in model.collect_params().items()}))
    (got, got_grads), (want, want_grads) = runs
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for name, grad in want_grads.items():
        np.testing.assert_allclose(got_grads[name], grad, rtol=1e-5, atol=1e-6, err_msg=name)


class WordVector(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.emb = nn.Embedding(20, 5)

    def hybrid_forward(self, F, word):
        return self.emb(F.array([word]))


class PausesAtItsFirstWord(gdb.DynBatchBlock):
    """A nested DynBatchBlock called under ``autograd.pause()`` for the first word
    of the samples that ask for it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.word = WordVector()
            self.o = nn.Dense(3, in_units=5)

    def hybrid_forward(self, F, words, pause):
        h = F.zeros((1, 5))
        for i, word in enumerate(words):
            if pause and i == 0:
                with autograd.pause():
                    x = self.word(word)
            else:
                x = self.word(word)
            h = h + x
        return F.sum(self.o(h))


def test_a_nested_block_called_under_pause_by_some_samples_equals_eager():
    """(Its frame's root was taken under the modes before the change: the scope
    failed when the outputs were used.)"""
    model = PausesAtItsFirstWord()
    model.initialize()
    samples = [([1, 2, 3], True), ([4, 5], False), ([6], True)]
    runs = []
    for batched in (True, False):
        with autograd.record():
            if batched:
                with gdb.batching():
                    outs = [model(*s) for s in samples]
            else:
                outs = [model(*s) for s in samples]
            loss = nd.add_n(*outs)
        loss.backward()
        runs.append((loss.asscalar(), model.word.emb.weight.grad().asnumpy().copy()))
    assert runs[0][0] == pytest.approx(runs[1][0], rel=1e-5)
    np.testing.assert_allclose(runs[0][1], runs[1][1], rtol=1e-5, atol=1e-6)


class ReadsThenSums(gdb.DynBatchBlock):
    """Reads a value of its input, then a layer's output weighted by position."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, flatten=False, in_units=4)

    def hybrid_forward(self, F, x):
        scale = 2.0 if float(x.sum().asscalar()) > 1.0 else 1.0
        return F.sum(self.dense(x) * F.arange(x.shape[0]).reshape((-1, 1))) * scale


@pytest.mark.parametrize("form", ["sum", "generator", "add_n", "plus"])
def test_the_scopes_code_combining_results_of_waiting_samples_equals_eager(form):
    """``sum(outs)`` in the scope of samples that wait at reads: settling one
    sample's result ran flushes that left another's, looked up before it, in a
    graph already run (an internal error)."""
    model = ReadsThenSums()
    model.initialize()
    xs = [nd.random.uniform(shape=(n, 4)) for n in (1, 3, 1, 2)]
    combine = {"sum": sum, "add_n": lambda outs: nd.add_n(*outs),
               "plus": lambda outs: ((outs[0] + outs[1]) + outs[2]) + outs[3]}
    runs = []
    for batched in (False, True):
        with autograd.record():
            with gdb.batching() if batched else contextlib.nullcontext():
                if form == "generator":
                    total = sum(model(x) for x in xs)
                else:
                    total = combine[form]([model(x) for x in xs])
        total.backward()
        runs.append((total.asnumpy(), model.dense.weight.grad().asnumpy()))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(runs[1][1], runs[0][1], rtol=1e-5, atol=1e-6)


class ReadsInTwoModes(gdb.DynBatchBlock):
    """A block whose mode argument changes what its calls return: ``"pick"``
    gives the chosen class and the scores, ``"score"`` the chosen class, its
    score read as a number, and the scores."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x, mode):
        h = self.dense(x)
        k = int(F.argmax(h, axis=1).asscalar())         # a read: the sample waits
        if mode in ("pick", _Mode.PICK):
            return [k], h
        return [k], float(h[0, k].asscalar()), h


class _Mode(enum.Enum):
    PICK = 0
    SCORE = 1


@pytest.mark.parametrize("modes", [("pick", "score"), (_Mode.PICK, _Mode.SCORE)],
                         ids=["strings", "enum"])
def test_results_of_a_blocks_modes_in_a_plain_loop_take_each_modes_form(modes):
    """The form of a waiting call's results (what a plain loop hands out before
    the sample finishes) is learned per block and settings: a scope of one
    mode after a scope of another hands out results of its own form."""
    model = ReadsInTwoModes()
    model.initialize()
    xs = [nd.array(np.random.RandomState(i).randn(1, 4)) for i in range(4)]
    for mode in modes * 2:
        want = [model(x, mode) for x in xs]
        with gdb.batching():
            outs = [model(x, mode) for x in xs]
        for got, ref in zip(outs, want):
            assert len(got) == len(ref) and list(got[0]) == ref[0]
            if mode in ("score", _Mode.SCORE):
                assert float(got[1]) == pytest.approx(ref[1], rel=1e-5)
            np.testing.assert_allclose(got[-1].asnumpy(), ref[-1].asnumpy(), rtol=1e-5)


_SETTING = contextvars.ContextVar("setting", default="default")


class ReadsContext(gdb.DynBatchBlock):
    """Notes a context variable before and after a read, then sets it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []

    def hybrid_forward(self, F, x):
        self.seen.append(_SETTING.get())
        float(F.sum(x).asscalar())          # a read: the sample waits
        self.seen.append(_SETTING.get())
        _SETTING.set("set by a sample")
        return x + 1


def test_samples_start_in_a_copy_of_their_callers_context():
    """Each sample sees the context variables its caller set, as a task of
    asyncio does; what one sets is its own (a worker greenlet serves many)."""
    model = ReadsContext()
    xs = [nd.ones((1, 2)) * k for k in range(3)]
    token = _SETTING.set("caller")
    try:
        for how in ("loop", "map"):
            model.seen.clear()
            with gdb.batching():
                if how == "map":
                    gdb.map(model, xs)
                else:
                    [model(x) for x in xs]      # pylint: disable=expression-not-assigned
            assert model.seen == ["caller"] * 6, how
    finally:
        _SETTING.reset(token)


class _Heavy:
    def __init__(self, k):
        self.x = nd.ones((1, 2)) * k


class ReadsThenFails(gdb.DynBatchBlock):
    def hybrid_forward(self, F, sample, fail=False):
        float(F.sum(sample.x).asscalar())
        if fail:
            raise ValueError("sample failed")
        return sample.x + 1


def test_an_error_kept_by_the_user_keeps_no_later_sample_alive():
    """A task's error keeps its own frames; not the worker's, which later runs
    other samples (here: samples of a scope left while they waited)."""
    model = ReadsThenFails()
    kept = []
    try:
        gdb.map(lambda k: model(_Heavy(k), k == 0), range(2))
    except ValueError as err:
        kept.append(err)
    with gdb.batching():
        [model(_Heavy(k)) for k in range(2)]    # pylint: disable=expression-not-assigned
    later = [_Heavy(k) for k in range(2)]
    refs = [weakref.ref(s) for s in later]
    with pytest.raises(KeyError):
        with gdb.batching():
            outs = [model(s) for s in later]
            raise KeyError("the user's loop stops")
    del later
    gc.collect()
    assert kept and not any(ref() is not None for ref in refs)


def test_idle_workers_of_other_threads_are_no_live_tasks():
    import threading
    done, leave = threading.Event(), threading.Event()

    def scopes():
        model = ReadsThenFails()
        for _ in range(3):
            with gdb.batching():
                [model(_Heavy(k)) for k in range(3)]   # pylint: disable=W0106
        done.set()
        leave.wait(30)          # its idle workers stay while it lives

    gc.collect()
    before = live_tasks()
    thread = threading.Thread(target=scopes)
    thread.start()
    try:
        assert done.wait(60)
        gc.collect()
        assert live_tasks() == before
    finally:
        leave.set()
        thread.join()


class RejectsAfterReading(gdb.DynBatchBlock):
    """Reads a value, then rejects samples it finds bad (``ValueError``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x, bad):
        h = F.tanh(self.dense(x))
        float(h.sum().asscalar())           # a read: the sample waits
        if bad:
            raise ValueError("a bad sample")
        return h


def _called(model, x, bad):
    return model(x, bad)


def _skipping_bad_samples(model, xs, flags, how="loop"):
    """A loop that skips the samples whose call raises, as users write it: the
    call in the ``try``, in a helper the ``try`` calls, or in ``suppress``."""
    outs = []
    for x, bad in zip(xs, flags):
        if how == "suppress":
            with contextlib.suppress(ValueError):
                outs.append(model(x, bad))
            continue
        try:
            outs.append(model(x, bad) if how == "loop" else _called(model, x, bad))
        except ValueError:
            continue
    return outs


@pytest.mark.parametrize("how", ["loop", "helper", "suppress"])
def test_a_sample_raising_after_a_read_inside_the_callers_try_is_caught_there(how):
    """A call inside a ``try`` of the caller runs to its end before it returns, so
    its error comes out where the loop catches it, as eagerly (it came out at
    the scope's end, and the whole batch was lost); a ``try`` around the whole
    scope changes nothing: the samples still wait at their reads together."""
    mx.random.seed(1)
    model = RejectsAfterReading()
    model.initialize()
    xs = [nd.array(np.random.RandomState(i).randn(1, 4)) for i in range(6)]
    flags = [0, 0, 1, 0, 1, 0]     # (numbers: a bool would be a setting, of forms of its own)
    want = _skipping_bad_samples(model, xs, flags, how)
    for _ in range(2):          # the first scope learns the form of the results
        with gdb.batching():
            outs = _skipping_bad_samples(model, xs, flags, how)
        assert len(outs) == len(want) == 4
        for out, ref in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), ref.asnumpy(), rtol=1e-5, atol=1e-6)
    for enter in (gdb.batching, _a_users_scope):
        try:
            with enter() as scope:
                outs = []
                for x in xs:
                    outs.append(model(x, 0))
        except ValueError:
            pytest.fail("no sample raised")
        assert scope.stats.flushes <= 2 < scope.stats.reads


@contextlib.contextmanager
def _a_users_scope():
    """A scope entered through a context manager of the user's."""
    with gdb.batching() as scope:
        yield scope


class SelectsSlots(gdb.DynBatchBlock):
    """Slots of a memory chosen after a read: by a mask made before it
    (``boolean_mask``, whose output shape depends on its data: it runs alone),
    or the first slot."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.emb = nn.Embedding(20, 4)
            self.query = nn.Dense(4, flatten=False, in_units=4)

    def hybrid_forward(self, F, ids):
        x = self.emb(ids)
        keep = ids > 5
        if (ids > 5).sum().asscalar() > 0:
            chosen = F.contrib.boolean_mask(x, keep)
        else:
            chosen = x[0:1]
        return F.mean(self.query(chosen), axis=0, keepdims=True)


@pytest.mark.parametrize("options", [{}, {"strategy": "agenda"}, {"compiled": "plan"}],
                         ids=lambda o: str(o))
def test_a_call_run_alone_after_a_read_leaves_the_templates_numbering_alone(options):
    """One sample's call that runs alone read values from before its read; a
    sample on the other branch must not be matched against positions it took."""
    mx.random.seed(0)
    model = SelectsSlots()
    model.initialize(mx.init.Xavier())
    samples = [nd.array([0, 7]), nd.array([1, 0]), nd.array([9, 8, 2]), nd.array([3, 4, 1])]
    params = list(model.collect_params().values())

    def run(batched):
        for p in params:
            p.zero_grad()
        with autograd.record():
            with gdb.batching(**options) if batched else contextlib.nullcontext():
                outs = [model(s) for s in samples]
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
        return [o.asnumpy() for o in outs], [p.grad().asnumpy().copy() for p in params]

    want_outs, want_grads = run(False)
    for _ in range(2):                        # learning, then matching the templates
        outs, grads = run(True)
        for a, b in zip(outs + grads, want_outs + want_grads):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


_REUSED = ValueError("a module's own error object")


def test_map_notes_name_the_sample_of_each_call_that_raised():
    """An exception object raised again by a later call names that call's
    sample, not the first's; one raised inside a nested map names both."""
    model = _model()

    def fails_at(bad):
        def fn(s):
            model(s, 3)
            if s == bad:
                raise _REUSED
            return s
        return fn

    for bad in (STARTS[4], STARTS[1]):
        with pytest.raises(ValueError) as info:
            gdb.map(fails_at(bad), STARTS[:5])
        notes = [n for n in info.value.__notes__ if "gdb.map" in n]
        assert notes == ["gluon_dynbatch: raised by gdb.map's call for samples[%d]"
                         % STARTS.index(bad)]
    with pytest.raises(ValueError) as info:
        gdb.map(lambda group: gdb.map(fails_at(STARTS[1]), group), [STARTS[:1], STARTS[:3]])
    notes = [n for n in info.value.__notes__ if "gdb.map" in n]
    assert notes == ["gluon_dynbatch: raised by gdb.map's call for samples[1]"] * 2


class MasksWeights(gdb.DynBatchBlock):
    """``boolean_mask`` of a weight by a mask of weights alone (or by one with
    autograd history): it runs alone, inside the block's frame."""

    def __init__(self, with_history=False, **kwargs):
        super().__init__(**kwargs)
        self.with_history = with_history
        with self.name_scope():
            self.table = self.params.get("table", shape=(10, 6))

    def hybrid_forward(self, F, t, table):
        mask = table[:, 0] > 0
        if self.with_history:
            mask = F.clip(mask + nd.array([1] + [0] * 9), 0, 1)
        return table[t:t + 1] + F.sum(F.contrib.boolean_mask(table, mask)) * 0.01


@pytest.mark.parametrize("with_history", [False, True])
def test_a_data_shaped_call_on_weights_runs_alone_with_eagers_gradients(with_history):
    """A mask of weights alone raised the recorder's internal ShapeFromData;
    a mask with history got MXNet's unwritten gradient memory (NaN at times)."""
    for seed in range(3):
        mx.random.seed(seed)
        model = MasksWeights(with_history)
        model.initialize(mx.init.Uniform(0.5))

        def run(batched):
            model.table.zero_grad()
            with autograd.record():
                with gdb.batching(granularity="op") if batched else contextlib.nullcontext():
                    outs = [model(t) for t in range(10)]
                loss = nd.add_n(*[(o * o).sum() + o.sum() for o in outs])
            loss.backward()
            return [o.asnumpy() for o in outs], model.table.grad().asnumpy().copy()

        want_outs, want_grad = run(False)
        outs, grad = run(True)
        for a, b in zip(outs + [grad], want_outs + [want_grad]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class StepsUntilItStops(gdb.DynBatchBlock):
    """A decoder's list of per-step outputs, as long as its sample decodes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4, activation="tanh")

    def hybrid_forward(self, F, x, limit=6):
        outs, h = [], x
        for _ in range(limit):
            h = self.dense(h)
            outs.append(h)
            if int(F.argmax(h, axis=1).asscalar()) == 0:
                break
        return outs


def test_lists_of_other_lengths_than_learned_are_refitted_in_place():
    """Each waiting call is handed a list of the length an earlier call
    returned; a sample whose list is longer or shorter refits it (it raised)."""
    mx.random.seed(0)
    model = StepsUntilItStops()
    model.initialize(mx.init.Uniform(1.0))
    xs = [nd.array(np.random.RandomState(i).uniform(-1, 1, (1, 4))) for i in range(8)]
    want = [model(x) for x in xs]
    assert len({len(w) for w in want}) > 2
    for _ in range(2):
        with gdb.batching() as scope:
            got = [model(x) for x in xs]
            firsts = [g[0] for g in got]        # stand-ins used while samples wait
            total = nd.add_n(*firsts).sum()
        assert [len(g) for g in got] == [len(w) for w in want]
        for g, w in zip(got, want):
            for a, b in zip(g, w):
                np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(total.asscalar(), sum(w[0].sum().asscalar() for w in want),
                                   rtol=1e-5)
    # The last scope batched its samples' reads: a flush a token, not one a read.
    assert scope.stats.flushes <= max(len(w) for w in want) + 1 < scope.stats.reads


def test_a_stand_in_at_a_place_its_result_lacks_raises_where_used():
    mx.random.seed(0)
    model = StepsUntilItStops()
    model.initialize(mx.init.Uniform(1.0))
    xs = [nd.array(np.random.RandomState(i).uniform(-1, 1, (1, 4))) for i in range(8)]
    lengths = [len(model(x)) for x in xs]
    longest = lengths.index(max(lengths))
    with gdb.batching():
        first = model(xs[longest])          # learns the longest form
    with gdb.batching():
        got = [model(x) for x in xs]
        place = max(lengths) - 1
        lasts = [g[place] for g in got]     # stand-ins at the learned last place
        short = lengths.index(min(lengths))
        with pytest.raises(gdb.BatchingError, match="nothing of this kind"):
            lasts[short].asnumpy()
    assert [len(g) for g in got] == lengths and first


@pytest.mark.parametrize("use", ["last", "list", "prefixed"])
def test_a_waiting_list_read_at_once_has_its_own_samples_length(use):
    """``model(x)[-1]``, ``list(model(x))`` or ``[start] + model(x)`` in the
    loop's body: the list a waiting call hands out has the length an earlier
    call returned until its sample finishes; reading its length or its end
    waits for the sample (the last item was another step's output, the list
    of another length; a plain list's ``+`` copied none of its items)."""
    mx.random.seed(0)
    model = StepsUntilItStops()
    model.initialize(mx.init.Uniform(1.0))
    xs = [nd.array(np.random.RandomState(i).uniform(-1, 1, (1, 4))) for i in range(8)]
    pick = {"last": lambda g: [g[-1]], "list": list,
            "prefixed": lambda g: ([None] + g)[1:]}[use]
    want = [pick(model(x)) for x in xs]
    assert len({len(model(x)) for x in xs}) > 2
    for _ in range(2):
        with gdb.batching():
            got = [pick(model(x)) for x in xs]
        assert [len(g) for g in got] == [len(w) for w in want]
        for g, w in zip(got, want):
            for a, b in zip(g, w):
                np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)


class ReadsKTimes(gdb.DynBatchBlock):
    """A tuple of ``k`` arrays, one per read."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4, activation="tanh")

    def hybrid_forward(self, F, x, k):
        outs, h = [], x
        for _ in range(k):
            h = self.dense(h if float(F.sum(h).asscalar()) > 0 else -h)
            outs.append(h)
        return tuple(outs)


def test_forms_that_change_with_an_integer_argument_are_learned_per_integer():
    mx.random.seed(0)
    model = ReadsKTimes()
    model.initialize(mx.init.Uniform(1.0))
    xs = [nd.array(np.random.RandomState(i).uniform(-1, 1, (1, 4))) for i in range(6)]
    with gdb.batching():
        [model(x, 2) for x in xs]
    with pytest.raises(gdb.BatchingError, match="per integer argument") as info:
        with gdb.batching():              # a tuple handed out cannot be refitted
            [model(x, 2 if i < 2 else 3) for i, x in enumerate(xs)]
    # The error names the first sample whose result changed form, and its block.
    assert str(info.value).startswith("sample 2, in %s: " % model.name)
    for k in (3, 2, 3):
        want = [model(x, k) for x in xs]
        with gdb.batching() as scope:
            got = [model(x, k) for x in xs]
        for g, w in zip(got, want):
            assert len(g) == k
            for a, b in zip(g, w):
                np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)
    # Batched: the first call learns its form alone, the others wait together.
    assert scope.stats.flushes <= 2 * k + 1


class ReadsUntilNegative(ReadsKTimes):
    """A tuple as long as its sample's values allow: its form changes by data."""

    def hybrid_forward(self, F, x):
        outs, h = [], x
        for _ in range(4):
            if float(F.sum(h).asscalar()) <= 0:
                break
            h = self.dense(h)
            outs.append(h)
        return tuple(outs)


def test_a_block_whose_tuples_change_length_by_data_is_told_once_to_use_map(caplog):
    mx.random.seed(0)
    model = ReadsUntilNegative()
    model.initialize(mx.init.Uniform(1.0))
    xs = [nd.array(np.random.RandomState(i).uniform(-1, 1, (1, 4))) for i in range(8)]
    want = [model(x) for x in xs]
    assert len({len(w) for w in want}) > 1
    with pytest.raises(gdb.BatchingError):
        with gdb.batching():
            [model(x) for x in xs]
    with caplog.at_level("WARNING", logger="gluon_dynbatch"):
        for _ in range(2):
            with gdb.batching():
                got = [model(x) for x in xs]
            for g, w in zip(got, want):
                assert len(g) == len(w)
                for a, b in zip(g, w):
                    np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)
    told = [r for r in caplog.records if "change form from call to call" in r.getMessage()]
    assert len(told) == 1 and "gluon_dynbatch.map" in told[0].getMessage()


class TrainsOrDecodes(gdb.DynBatchBlock):
    """Given gold actions, a loss array; without them, a greedy decode's
    ``(score, actions)``, reading each step's argmax."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.out = nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x, gold=None):
        scores, actions = [], []
        for t in range(x.shape[0]):
            score = self.out(x[t:t + 1])
            action = gold[t] if gold is not None else int(F.argmax(score, axis=1).asscalar())
            actions.append(action)
            scores.append(score[:, action:action + 1])
        total = F.add_n(*scores)
        return total if gold is not None else (total, actions)


def test_a_call_leaving_out_an_argument_learns_its_own_form_of_results():
    """Training (``model(x, gold)``) then decoding (``model(x)``) on one block."""
    mx.random.seed(0)
    model = TrainsOrDecodes()
    model.initialize(mx.init.Uniform(1.0))
    r = np.random.RandomState(0)
    xs = [nd.array(r.uniform(-1, 1, (n, 4))) for n in (3, 5, 2, 4)]
    golds = [list(r.randint(0, 3, size=x.shape[0])) for x in xs]
    with gdb.batching():
        losses = [model(x, gold) for x, gold in zip(xs, golds)]
    for x, gold, loss in zip(xs, golds, losses):
        np.testing.assert_allclose(loss.asnumpy(), model(x, gold).asnumpy(), rtol=1e-5)
    want = [model(x) for x in xs]
    with gdb.batching():
        got = [model(x) for x in xs]
    for (score, actions), (want_score, want_actions) in zip(got, want):
        assert actions == want_actions
        np.testing.assert_allclose(score.asnumpy(), want_score.asnumpy(), rtol=1e-5)


class StepsInADict(StepsUntilItStops):
    """Its per-step outputs and their count, in a dict and in a tuple."""

    def hybrid_forward(self, F, x, limit=6):
        outs = super().hybrid_forward(F, x, limit)
        return {"steps": outs, "count": len(outs)}, (outs[-1], outs)


def test_lists_inside_dicts_and_tuples_are_refitted_in_place():
    mx.random.seed(0)
    model = StepsInADict()
    model.initialize(mx.init.Uniform(1.0))
    xs = [nd.array(np.random.RandomState(i).uniform(-1, 1, (1, 4))) for i in range(8)]
    want = [model(x) for x in xs]
    for _ in range(2):
        with gdb.batching() as scope:
            got = [model(x) for x in xs]
        for (g_dict, (g_last, g_steps)), (w_dict, (w_last, w_steps)) in zip(got, want):
            assert type(g_dict) is dict and g_dict["count"] == w_dict["count"]
            assert g_dict["steps"] is not None and len(g_steps) == len(w_steps)
            for a, b in zip(g_dict["steps"] + g_steps + [g_last], w_steps + w_steps + [w_last]):
                np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)
    assert scope.stats.flushes < scope.stats.reads          # still batched


class ReadsThenArgmax(gdb.DynBatchBlock):
    """Steps while the sum of its state is large (a read a step), then reads the
    argmax of the state (a zero-gradient step run outside autograd)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.a = nn.Dense(8, in_units=8)

    def hybrid_forward(self, F, h):
        steps = 0
        while steps < 4 and F.sum(h).asscalar() > 0.5:
            h = F.tanh(self.a(h)) * 0.9
            steps += 1
        k = int(F.argmax(h, axis=1).asscalar())
        return h * (k + 1)


@pytest.mark.parametrize("strategy", ["depth", "agenda"])
def test_an_argmax_read_after_earlier_reads_keeps_the_samples_batched(strategy):
    """Tying the argmax step's results to its inputs' history used an operator
    on a value of an earlier flush: the scope recorded it, read it itself, took
    that for reads by the user's loop and ran the samples eagerly."""
    mx.random.seed(0)
    rs = np.random.RandomState(0)
    xs = [nd.array(rs.randn(1, 8) * 2) for _ in range(8)]
    runs = []
    for batched in (False, True):
        mx.random.seed(1)                       # a fresh model each run, the same draw
        model = ReadsThenArgmax()
        model.initialize(mx.init.Uniform(0.5))
        with autograd.record():
            with gdb.batching(strategy=strategy) if batched else contextlib.nullcontext() \
                    as scope:
                outs = [model(x) for x in xs]
            loss = nd.add_n(*[(o * o).sum() for o in outs])
        loss.backward()
        runs.append([o.asnumpy() for o in outs] + [
            p.grad().asnumpy() for p in model.collect_params().values()])
    assert scope.stats.eager_samples == 0
    assert scope.stats.flushes < scope.stats.reads
    for got, want in zip(runs[1], runs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class ScoresUntilItStops(gdb.DynBatchBlock):
    """A list of per-step scores, one per step it reads its way through: empty
    for a sample of no steps (which reads nothing and waits for nothing)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.step = nn.Dense(4, in_units=4)
            self.score = nn.Dense(1, in_units=4)

    def hybrid_forward(self, F, x, steps):
        h, scores = x, []
        for _ in range(steps):
            h = F.tanh(self.step(h))
            scores.append(self.score(h))
            if float(scores[-1].asscalar()) > 10.0:     # never: a read per step
                break
        return scores


def test_a_list_first_seen_empty_takes_arrays_when_a_waiting_call_returns_them():
    # The empty list's form ("values") refused lists of arrays: BatchingError.
    mx.random.seed(0)
    model = ScoresUntilItStops()
    model.initialize()
    xs = [nd.array(np.random.RandomState(k).uniform(-1, 1, (1, 4))) for k in range(6)]
    steps = [0, 0, 2, 3, 1, 0]
    want = [model(x, n) for x, n in zip(xs, steps)]
    for _ in range(2):
        with autograd.record():
            with gdb.batching():
                got = [model(x, n) for x, n in zip(xs, steps)]
            total = nd.add_n(*[s.sum() for g in got for s in g])
        total.backward()
        assert [len(g) for g in got] == steps
        for g, w in zip(got, want):
            for a, b in zip(g, w):
                np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)


class Labelled:
    """A plain object a sample returns (a decoded node)."""

    def __init__(self, label, table):
        self.label, self.table = label, table


class ReturnsObjects(gdb.DynBatchBlock):
    """A decoded node and a numpy table, made from a value it read."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x):
        label = int(F.argmax(self.dense(x), axis=1).asscalar())
        return Labelled(label, np.zeros((3, 3))), np.zeros(3)


def test_stand_ins_take_attributes_and_items_set_on_them():
    mx.random.seed(1)
    model = ReturnsObjects()
    model.initialize()
    xs = [nd.array(np.random.RandomState(k).uniform(-1, 1, (1, 4))) for k in range(5)]
    want = [model(x)[0].label for x in xs]
    with gdb.batching():
        model(xs[0])                                    # learns the form
    with gdb.batching():
        got = [model(x) for x in xs]
    assert any(type(node) is PendingValue for node, _ in got)
    for (node, row), label in zip(got, want):
        node.name = "n%d" % node.label                  # set on the object itself
        node.table[label, label] = 1.0
        row[label] = 2.0
        assert node.value().name == "n%d" % label if type(node) is PendingValue \
            else node.name == "n%d" % label
        assert np.asarray(row).tolist() == [2.0 if k == label else 0.0 for k in range(3)]
        assert float(np.asarray(node.table).sum()) == 1.0


class ReadsThenReturnsItsWeight(gdb.DynBatchBlock):
    """Reads a value, then returns a weight as it is (or computed from weights alone)."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        with self.name_scope():
            self.w = self.params.get("w", shape=(1, 4))

    def hybrid_forward(self, F, x, w):
        x.sum().asscalar()
        if self.kind == "weight":
            return w
        if self.kind == "pair":
            return [x * 2, w]
        return F.tanh(w)


@pytest.mark.parametrize("kind", ["weight", "pair", "of weights"])
@pytest.mark.parametrize("strategy", ["depth", "reference"])
def test_samples_returning_one_weight_after_a_read_each_get_its_value(kind, strategy):
    """A call on weights alone is one node for all samples; each waiting
    sample's result still stands for its own copy of it."""
    mx.random.seed(0)
    model = ReadsThenReturnsItsWeight(kind)
    model.initialize(mx.init.Uniform(0.3))
    xs = [nd.ones((1, 4)) * k for k in range(4)]

    def flat(result):
        return [a.asnumpy() for a in (result if isinstance(result, list) else [result])]

    want = [flat(model(x)) for x in xs]
    with gdb.batching(strategy=strategy):
        outs = [model(x) for x in xs]
    for got, expected in zip(outs, want):
        for a, b in zip(flat(got), expected):
            np.testing.assert_allclose(a, b, rtol=1e-6)


class ReadsThreeTimes(gdb.DynBatchBlock):
    """Reads its score at each of three steps and picks by it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x):
        total = 0
        for _ in range(3):
            s = self.dense(x)
            a = int(np.argmax(s.asnumpy()))
            total = total + s[:, a:a + 1]
            x = F.tanh(x + s[:, :1])
        return total


def test_reads_inside_samples_do_not_count_as_reads_of_the_scopes_own_code():
    """One read by the scope's code after samples that read keeps batching."""
    mx.random.seed(0)
    model = ReadsThreeTimes()
    model.initialize(mx.init.Uniform(0.8))
    r = np.random.RandomState(1)
    first, second = ([nd.array(r.uniform(-1, 1, (1, 4))) for _ in range(8)] for _ in range(2))
    want = [model(x).asnumpy() for x in first + second]
    with gdb.batching() as scope:
        outs = gdb.map(model, first)
        float(outs[0].asscalar())
        outs += gdb.map(model, second)
    assert scope.stats.eager_samples == 0
    assert scope.stats.reads == 3 * 16 + 1
    assert not getattr(model, "reads_inside", False)
    for got, expected in zip(outs, want):
        np.testing.assert_allclose(got.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class StopsEarly(gdb.DynBatchBlock):
    """Reads its state after every row of its input and stops past a threshold."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(5, in_units=4)
            self.rec = nn.Dense(5, in_units=5, use_bias=False)

    def hybrid_forward(self, F, x):
        h = F.zeros((1, 5))
        for t in range(x.shape[0]):
            h = F.tanh(self.inp(x[t:t + 1]) + self.rec(h))
            if h.sum().asscalar() > 1.5:
                break
        return h


@pytest.mark.parametrize("compiled", [False, True])
def test_an_input_buffer_refilled_while_its_sample_waits_is_read_as_eager_reads_it(compiled):
    """``buf[:] = rows; model(buf)`` per sample: a sample waiting at a read
    resumed on the next sample's rows; it now finishes before the write."""
    mx.random.seed(0)
    model = StopsEarly(compiled=compiled)
    model.initialize(mx.init.Uniform(0.3))
    rs = np.random.RandomState(0)
    data = [rs.uniform(-1, 1, (5, 4)).astype(np.float32) for _ in range(6)]
    buf = nd.zeros((5, 4))

    def run(batched):
        outs = []
        with gdb.batching() if batched else contextlib.nullcontext():
            for rows in data:
                buf[:] = rows
                outs.append(model(buf))
        return [o.asnumpy() for o in outs]

    want = run(False)
    for _ in range(2):
        for got, expected in zip(run(True), want):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


class StatefulCellDecoder(gdb.DynBatchBlock):
    """A Zoneout or variational-dropout GRU stepped over a sample's words, reset
    at the sample's start, with a read (or a change of autograd's modes) per step:
    the samples take turns between their steps."""

    def __init__(self, kind, wait, **kwargs):
        super().__init__(**kwargs)
        self.wait = wait
        with self.name_scope():
            gru = rnn.GRUCell(8, input_size=8)
            self.cell = rnn.ZoneoutCell(gru, zoneout_outputs=0.5) if kind == "zoneout" \
                else gluon.contrib.rnn.VariationalDropoutCell(gru, drop_outputs=0.5)

    def hybrid_forward(self, F, words, table):
        self.cell.reset()
        state = self.cell.begin_state(batch_size=1, func=F.zeros)
        steps = []
        for w in words:
            out, state = self.cell(table[w:w + 1], state)
            steps.append((out, state[0]))
            if self.wait == "read" and float(F.sum(out).asscalar()) > 1e9:
                break
            if self.wait == "modes":
                with autograd.predict_mode():
                    steps.append((F.tanh(out), None))
        return steps


def _cells_own_state_broken(kind, outs):
    """Elements no sample's own cell state explains: Zoneout's output is its new
    state or its previous output; a variational dropout mask holds over a sample."""
    broken = 0
    for steps in outs:
        before, mask = np.zeros((1, 8), np.float32), None
        for out, state in steps:
            if state is None:
                continue
            out, state = out.asnumpy(), state.asnumpy()
            if kind == "zoneout":
                own = np.isclose(out, state, atol=1e-6) | np.isclose(out, before, atol=1e-6)
                broken += int((~own).sum())
                before = out
            else:
                mask = out == 0 if mask is None else mask
                broken += int(((out == 0) != mask).sum())
    return broken


@pytest.mark.parametrize("kind", ["zoneout", "variational"])
@pytest.mark.parametrize("wait", ["read", "modes"])
def test_stateful_cells_keep_each_samples_state_while_samples_take_turns(kind, wait):
    # The cells keep state on the block between calls; samples that took turns
    # overwrote each other's (another sample's previous output, a mask changed
    # in mid-sentence).
    mx.random.seed(0)
    model = StatefulCellDecoder(kind, wait)
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (12, 8)))
    sentences = [[1, 5, 3, 7], [2, 2, 9], [4, 0, 6, 8, 1], [3, 3, 3], [11, 10, 9, 8]]
    with autograd.record():
        eager = [model(s, table) for s in sentences]
        with gdb.batching():
            batched = [model(s, table) for s in sentences]
    assert _cells_own_state_broken(kind, eager) == 0
    assert _cells_own_state_broken(kind, batched) == 0
    assert [len(steps) for steps in batched] == [len(steps) for steps in eager]


_PAUSED_THEN_CRITIC = r"""
import sys
import numpy as np
import mxnet as mx
from mxnet import autograd, nd
from mxnet.gluon import nn
import gluon_dynbatch as gdb

class Generator(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.out = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, z):
        x = F.tanh(self.out(z))
        with autograd.pause():              # a statistic without gradient
            self.stat = F.sum(F.abs(x))
        return x

class Critic(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.score = nn.Dense(1, in_units=4)

    def hybrid_forward(self, F, x):
        return self.score(x)

mx.random.seed(0)
gen, critic = Generator(), Critic()
gen.initialize()
critic.initialize()
zs = [nd.array(np.random.RandomState(k).randn(1, 4)) for k in range(3)]

def scores():
    if sys.argv[1] == "nested":
        return [critic(gen(z)) for z in zs]
    fakes = [gen(z) for z in zs]
    return [critic(f) for f in fakes]

runs = []
for batched in (False, True):
    with autograd.record():
        if batched:
            with gdb.batching():
                out = scores()
        else:
            out = scores()
        loss = nd.add_n(*out)
    loss.backward()
    runs.append([o.asnumpy() for o in out] + [gen.out.weight.grad().asnumpy().copy()])
print("max diff", max(float(np.abs(a - b).max()) for a, b in zip(*runs)))
"""


@pytest.mark.parametrize("form", ["nested", "two loops"])
def test_a_result_of_another_modes_task_passed_to_another_block_ends_as_eager(form):
    # The critic's calls waited for the generators' results under recording's
    # modes while the generators waited under pause's: each round kept the
    # critics' modes, and the scope never ended (run in a process of its own,
    # which a time limit stops).
    out = output_of_script(_PAUSED_THEN_CRITIC, form, timeout=120)
    assert float(out.split("max diff")[-1]) < 1e-6


class CostAugmentedViterbi(gdb.DynBatchBlock):
    """A structured hinge loss: Viterbi over emission scores plus a Hamming
    cost, its back-pointers (``argmax``, no gradient) read after the forward
    pass, then the loss of the decoded path against the gold one."""

    def __init__(self, tags=5, **kwargs):
        super().__init__(**kwargs)
        self.tags = tags
        with self.name_scope():
            self.emit = nn.Dense(tags, in_units=8)
            self.trans = self.params.get("trans", shape=(tags, tags))

    def _score(self, F, emissions, trans, path):
        total = F.sum(F.pick(emissions, F.array(path), axis=1))
        for prev, tag in zip(path, path[1:]):
            total = total + trans[prev, tag]
        return total

    def hybrid_forward(self, F, sample, table, trans):
        words, gold = sample
        emissions = self.emit(F.take(table, F.array(words)))
        cost = np.ones((len(words), self.tags), dtype="float32")
        cost[np.arange(len(words)), gold] = 0
        scores = emissions + F.array(cost)
        alpha, pointers = F.reshape(scores[0], (self.tags, 1)), []
        for t in range(1, len(words)):
            table_t = F.broadcast_add(alpha, trans)
            pointers.append(F.argmax(table_t, axis=0))
            alpha = F.reshape(F.max(table_t, axis=0), (self.tags, 1)) \
                + F.reshape(scores[t], (self.tags, 1))
        pointers = [[int(v) for v in p.asnumpy()] for p in pointers]
        path = [int(F.argmax(alpha, axis=0).asscalar())]
        for back in reversed(pointers):
            path.append(back[path[-1]])
        path.reverse()
        F.max(alpha)        # computed, never used
        hamming = sum(int(p != g) for p, g in zip(path, gold))
        return F.relu(self._score(F, emissions, trans, path) + hamming
                      - self._score(F, emissions, trans, gold))


@pytest.mark.parametrize("strategy", ["depth", "agenda"])
def test_flushes_of_a_full_graph_while_samples_wait_at_reads_hand_out_every_value(strategy):
    # The zero tying argmax's results to their inputs, made while such a flush
    # ran, was recorded into the next graph (Python's ``==`` on a value of an
    # earlier flush), switching to waiting samples mid-flush: a sample then
    # read a value the flush had not handed out yet ("not produced by its flush").
    r = np.random.RandomState(1)
    table = nd.array(r.uniform(-1, 1, (20, 8)))
    mx.random.seed(0)
    model = CostAugmentedViterbi()
    model.initialize(mx.init.Uniform(0.5))
    for batch in range(4):
        r = np.random.RandomState(60 + batch)
        lengths = [1, 7] + list(r.randint(1, 8, size=3))
        samples = [(list(r.randint(0, 20, size=n)), list(r.randint(0, 5, size=n)))
                   for n in lengths]
        want = [model(s, table).asnumpy() for s in samples]
        with autograd.record():
            with gdb.batching(max_pending_nodes=7, strategy=strategy):
                outs = [model(s, table) for s in samples]
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-5)


class TagsByARead(gdb.DynBatchBlock):
    """A tagger whose tag is read (the sample waits), returned in a list and alone."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, x):
        tag = int(F.argmax(self.dense(x), axis=1).asscalar())
        return [tag], tag


class ScoresTags(gdb.DynBatchBlock):
    """A second stage given the tagger's list and number."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=3)

    def hybrid_forward(self, F, x, tags, tag):
        return self.dense(x) + F.full((1, 3), tag) + len(tags)


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"strategy": "reference"}])
def test_a_waiting_samples_list_and_number_given_to_a_second_block_equal_eager(options):
    """A flush copying a constant asked whether waiting samples held the arrays
    it wrote: looking through their arguments read the stand-in list another
    waiting call returned, which ran that sample inside the flush ("internal
    error: value not produced by its flush")."""
    mx.random.seed(0)
    tagger, scorer = TagsByARead(), ScoresTags()
    tagger.initialize()
    scorer.initialize()
    xs = [nd.array(np.random.RandomState(k).uniform(-1, 1, (1, 3))) for k in range(3)]

    def pipeline(x):
        tags, tag = tagger(x)
        return scorer(x, tags, tag)

    with autograd.record():
        want = [pipeline(x).asnumpy() for x in xs]
        with gdb.batching(**options):
            outs = [pipeline(x) for x in xs]
    for out, expected in zip(outs, want):
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class Example:
    """A sample's record, as data pipelines make them."""

    def __init__(self, x):
        self.x = x


class ReadsThenUsesItsExample(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, example):
        k = int(F.argmax(self.dense(example.x), axis=1).asscalar())    # the sample waits
        return self.dense(example.x) * (k + 1)


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, {"strategy": "reference"}])
def test_a_buffer_refilled_between_samples_inside_an_object_they_were_given_is_read_as_eager(
        options):
    """Waiting samples given the buffer inside a plain object were not known to
    hold it: the next refill went ahead, and they resumed with its values."""
    mx.random.seed(0)
    model = ReadsThenUsesItsExample()
    model.initialize(mx.init.Uniform(0.9))
    data = [np.random.RandomState(k).uniform(-1, 1, (1, 4)) for k in range(3)]
    buf = nd.zeros((1, 4))

    def loop():
        outs = []
        for values in data:
            buf[:] = values                 # one input buffer, refilled per sample
            outs.append(model(Example(buf)))
        return [o.asnumpy() for o in outs]

    want = loop()
    with gdb.batching(**options):
        got = loop()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class RaisesAfterRecording(gdb.DynBatchBlock):
    def __init__(self, kept, **kwargs):
        super().__init__(**kwargs)
        self.kept = kept
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x, bad):
        value = self.dense(x) * 2
        self.kept.append(value)
        if bad:
            raise KeyError("bad sample")
        return value


def test_a_value_a_failed_sample_recorded_read_after_the_scope_raises_a_batching_error():
    """It raised ``TypeError: 'NoneType' object is not callable``."""
    kept = []
    model = RaisesAfterRecording(kept)
    model.initialize()
    xs = [nd.ones((1, 4)) * k for k in range(3)]
    with pytest.raises(KeyError):
        with gdb.batching():
            [model(x, k == 1) for k, x in enumerate(xs)]
    with pytest.raises(gdb.BatchingError, match="batching scope"):
        kept[1].asnumpy()


class ReadsInsideAWith(gdb.DynBatchBlock):
    """Reads a value inside a ``with`` block that sets per-thread state: MXNet's
    default context, numpy's error handling or the warning filters."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        p = F.relu(self.dense(x))          # some entries are exactly 0
        if self.kind == "context":
            with mx.cpu(1):
                values = p.asnumpy()
        elif self.kind == "errstate":
            with np.errstate(divide="ignore"):
                values = np.log(p.asnumpy())       # log(0) without raising
        else:
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values = p.asnumpy()
        k = int(np.argmax(values))
        return F.pick(p, F.array([k]), axis=1) + F.ones((1,))


@pytest.mark.parametrize("how", ["loop", "map"])
@pytest.mark.parametrize("kind", ["context", "errstate", "warnings"])
def test_state_a_with_block_sets_is_each_samples_own_while_it_waits_at_a_read(kind, how):
    """Each ``with`` saves the value it found and puts it back on exit: samples
    resumed in the others' state would unwind them out of order, leaving a block's
    value set for the others (``np.errstate``: a raise where eager ignores) and
    after the scope (the default context: the next eager call on ``cpu(1)``)."""
    import warnings
    mx.random.seed(0)
    model = ReadsInsideAWith(kind)
    model.initialize(mx.init.Uniform(1.0))
    xs = [nd.array(np.random.RandomState(k).randn(1, 4)) for k in range(4)]
    old_err, filters = np.seterr(all="raise"), warnings.filters
    try:
        eager = [model(x).asnumpy() for x in xs]
        with gdb.batching():
            outs = gdb.map(model, xs) if how == "map" else [model(x) for x in xs]
        for got, want in zip(outs, eager):
            np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-6)
        assert mx.context.current_context() == mx.cpu(0)
        assert np.geterr()["divide"] == "raise"
        assert warnings.filters is filters
    finally:
        np.seterr(**old_err)


class SetsErrorHandling(gdb.DynBatchBlock):
    """Sets numpy's error handling without a ``with`` block (sample 0), notes what
    each sample sees, and reads a value."""

    def __init__(self, seen, **kwargs):
        super().__init__(**kwargs)
        self.seen = seen
        with self.name_scope():
            self.dense = nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, x, k):
        if k == 0:
            np.seterr(divide="raise")
        self.seen.append((k, np.geterr()["divide"]))
        h = self.dense(x)
        h.asnumpy()
        return h


@pytest.mark.parametrize("how", ["loop", "map"])
def test_state_a_sample_sets_for_good_stays_set_as_eagerly(how):
    """``np.seterr`` outside any block in a sample holds after the scope, as in
    eager code (it was put back when the sample ended), and for the samples
    that start after it has finished."""
    seen = []
    model = SetsErrorHandling(seen)
    model.initialize()
    xs = [nd.ones((1, 3)) * k for k in range(3)]
    old = np.seterr(divide="warn")
    try:
        for batched in (False, True):
            np.seterr(divide="warn")
            del seen[:]
            if batched:
                with gdb.batching():
                    if how == "map":
                        gdb.map(lambda a: model(*a), [(x, k) for k, x in enumerate(xs)])
                    else:
                        [model(x, k) for k, x in enumerate(xs)]
            else:
                [model(x, k) for k, x in enumerate(xs)]
            assert seen[0] == (0, "raise") and len(seen) == 3
            assert np.geterr()["divide"] == "raise"
    finally:
        np.seterr(**old)


class WarnsAndRecords(gdb.DynBatchBlock):
    """Sample 0 records its warnings (``catch_warnings(record=True)``) around a
    read; every sample warns."""

    def __init__(self, logs, **kwargs):
        super().__init__(**kwargs)
        self.logs = logs
        with self.name_scope():
            self.dense = nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, x, k):
        import warnings
        h = self.dense(x)
        if k == 0:
            with warnings.catch_warnings(record=True) as log:
                warnings.simplefilter("always")
                h.asnumpy()
                warnings.warn("sample 0")
            self.logs.append([str(w.message) for w in log])
        else:
            warnings.warn("sample %d" % k)      # while sample 0 waits inside its block
            h.asnumpy()
        return h


def test_warnings_a_sample_records_around_a_read_are_its_own():
    """The log of ``catch_warnings(record=True)`` in a sample waiting at a read
    collected the other samples' warnings (its handler was the process's)."""
    import warnings
    logs = []
    model = WarnsAndRecords(logs)
    model.initialize()
    xs = [nd.ones((1, 3)) * k for k in range(3)]
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always")
        with gdb.batching():
            gdb.map(lambda a: model(*a), [(x, k) for k, x in enumerate(xs)])
    assert logs == [["sample 0"]]
    assert sorted(str(w.message) for w in outside
                  if str(w.message).startswith("sample")) == ["sample 1", "sample 2"]


class FailsTwice(gdb.DynBatchBlock):
    """Sample 1 fails after a read (it waits first), sample 2 at once."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, k, x):
        h = F.tanh(self.dense(x))
        if k == 1:
            value = float(F.sum(h).asscalar())
            raise ValueError("sample 1 fails after its read (%.3f)" % value)
        if k == 2:
            raise KeyError("sample 2 fails at once")
        return F.sum(h, axis=0, keepdims=True)


@pytest.mark.parametrize("options", [{}, {"compiled": True}], ids=str)
def test_the_error_of_the_first_sample_to_fail_in_eagers_order_is_raised(options):
    """Sample 2's error, raised while sample 1 waited at its read, came out of the
    loop, where eager code stops at sample 1's error (sample 2 never runs)."""
    model = FailsTwice()
    model.initialize()
    xs = [nd.ones((n, 4)) * 0.1 for n in (2, 3, 1, 2)]
    gc.collect()
    before = live_tasks()
    for batched in (False, True):
        with pytest.raises(ValueError, match="sample 1 fails after its read"):
            with gdb.batching(**options) if batched else contextlib.nullcontext():
                [model(k, x) for k, x in enumerate(xs)]
    with gdb.batching(**options):
        outs = [model(0, x) for x in xs]
    for out, x in zip(outs, xs):
        np.testing.assert_allclose(out.asnumpy(), model(0, x).asnumpy(), rtol=1e-5, atol=1e-6)
    gc.collect()
    assert live_tasks() == before


def test_a_waiting_samples_result_used_in_another_thread_says_so():
    import concurrent.futures
    model = _model()
    want = [tokens for tokens, _ in (model(s) for s in STARTS)]
    before = _greenlets()
    with pytest.raises(gdb.BatchingError, match="another thread"):
        with gdb.batching():
            results = [model(s) for s in STARTS]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda result: result[1].asnumpy(), results))
    del results
    assert _greenlets() == before
    with gdb.batching():
        results = [model(s) for s in STARTS]
    assert [list(tokens) for tokens, _ in results] == want


def test_a_plain_cell_called_by_the_scopes_code_does_not_stop_waiting_samples(
        caplog, monkeypatch):
    # Gluon's cell counts its calls in an attribute; that is no setting the
    # waiting samples must finish before.
    from gluon_dynbatch import logs
    monkeypatch.setattr(logs, "_WARNED", set())
    model, cell = _model(), rnn.GRUCell(HIDDEN, input_size=HIDDEN)
    cell.initialize()
    flushes = []
    for with_cell in (False, False, True):
        with caplog.at_level("WARNING", logger="gluon_dynbatch"):
            with gdb.batching() as scope:
                results = []
                for s in STARTS:
                    results.append(model(s))
                    if with_cell:
                        cell(nd.ones((1, HIDDEN)), [nd.zeros((1, HIDDEN))])
        flushes.append(scope.stats.flushes)
    assert flushes[2] == flushes[1]
    assert not [r for r in caplog.records if "is set by the scope's code" in r.getMessage()]


class ReadsThenPicks(gdb.DynBatchBlock):
    """Reads a value (the sample waits), then returns the argmax of its rows."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(5, in_units=5)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        if float(F.sum(h).asscalar()) > 1e9:
            h = -h
        return F.argmax(h, axis=1)


def test_a_waiting_samples_result_indexes_a_plain_array_in_the_scopes_code():
    rs = np.random.RandomState(1)
    table = nd.array(rs.randn(5, 3))
    xs = [nd.array(rs.randn(n, 5)) for n in (2, 3, 1)]
    model = ReadsThenPicks()
    model.initialize()
    want = [table[model(x)].asnumpy() for x in xs]
    with gdb.batching():
        got = [table[model(x)] for x in xs]
        masks = []
        for x in xs:
            mask = nd.zeros((5,))
            mask[model(x)] = 1.0
            masks.append(mask)
    for g, w, m, x in zip(got, want, masks, xs):
        np.testing.assert_array_equal(g.asnumpy(), w)
        expected = np.zeros(5)
        expected[model(x).asnumpy().astype(int)] = 1
        np.testing.assert_array_equal(m.asnumpy(), expected)


class SummedDense(gdb.DynBatchBlock):
    """``tanh(dense(x))`` summed over its rows: no read."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x)).sum(axis=0, keepdims=True)


def test_values_of_a_scope_read_by_several_threads_at_once():
    import concurrent.futures
    model = SummedDense()
    model.initialize()
    rs = np.random.RandomState(5)
    xs = [nd.array(rs.randn(n, 4)) for n in (2, 3, 1, 4)]
    want = [model(x).asnumpy() for x in xs]
    for _ in range(12):
        with gdb.batching():
            outs = [model(x) for x in xs]
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda out: out.asnumpy(), outs))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class RowsLoop(gdb.DynBatchBlock):
    """A recurrence over the rows of the sample: no read."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(8, in_units=3)

    def hybrid_forward(self, F, x):
        h = F.zeros((1, 8))
        for t in range(x.shape[0]):
            h = F.tanh(self.dense(x[t:t + 1]) + h)
        return h


@pytest.mark.parametrize("own_reads", [False, True], ids=["pool only", "scope reads too"])
def test_a_pool_reads_each_result_while_the_scope_records_the_next(own_reads):
    # Each result goes to a worker thread as soon as it is returned; with
    # ``own_reads`` the scope's thread also reads one now and then.  Two
    # flushes ran at once ("internal error: value not produced by its flush",
    # every run), or a worker read while a sample recorded (refused).
    import concurrent.futures
    model = RowsLoop()
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(0)
    xs = [nd.array(rs.randn(int(n), 3)) for n in rs.randint(1, 12, 40)]
    want = [model(x).asnumpy() for x in xs]
    for _ in range(4):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            with gdb.batching():
                futures = []
                for k, x in enumerate(xs):
                    out = model(x)
                    futures.append(pool.submit(lambda v: v.asnumpy(), out))
                    if own_reads and k % 7 == 6:
                        out.asnumpy()
                got = [f.result() for f in futures]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class WaitsForAPool(gdb.DynBatchBlock):
    """A sample that hands its own value to a worker thread and waits for it."""

    def __init__(self, pool, **kwargs):
        super().__init__(**kwargs)
        self.pool = pool
        with self.name_scope():
            self.dense = nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, x):
        h = self.dense(x)
        return h * float(self.pool.submit(lambda v: v.sum().asscalar(), h).result())


def test_a_sample_waiting_for_a_thread_that_reads_its_value_gets_an_error(monkeypatch):
    import concurrent.futures
    from gluon_dynbatch import scope as scope_module
    monkeypatch.setattr(scope_module, "OTHER_THREAD_WAIT", 0.5)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        model = WaitsForAPool(pool)
        model.initialize()
        x = nd.ones((2, 3))
        assert np.isfinite(model(x).asnumpy()).all()     # eager runs
        # Batched, the worker waits for the sample, which waits for the worker.
        with pytest.raises(gdb.BatchingError, match="is the sample waiting for this thread"):
            with gdb.batching():
                model(x).asnumpy()
    other = SummedDense()
    other.initialize()
    with gdb.batching():            # the next scope works
        out = other(nd.ones((2, 4)))
    np.testing.assert_allclose(out.asnumpy(), other(nd.ones((2, 4))).asnumpy(), rtol=1e-5)


def test_values_read_by_a_pool_while_the_scope_ends():
    # Reads submitted inside the scope, collected after it: a read that waited
    # for the scope's end flush found the scope gone (AttributeError).
    import concurrent.futures
    model = RowsLoop()
    model.initialize(mx.init.Uniform(0.5))
    rs = np.random.RandomState(1)
    xs = [nd.array(rs.randn(n, 3)) for n in (2, 5, 1, 3)]
    want = [model(x).asnumpy() for x in xs]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for _ in range(20):
            with gdb.batching():
                futures = [pool.submit(lambda v: v.asnumpy(), model(x)) for x in xs]
            for future, w in zip(futures, want):
                np.testing.assert_allclose(future.result(), w, rtol=1e-5, atol=1e-6)


class ReadsInFinally(gdb.DynBatchBlock):
    """Reads a value, then reads another in a ``finally`` block."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(2, in_units=3)

    def hybrid_forward(self, F, x):
        h = F.tanh(self.dense(x))
        try:
            return h * float(h.sum().asscalar())
        finally:
            self.last = float(h.mean().asscalar())


def test_a_scope_ended_by_an_error_lets_waiting_samples_read_without_a_warning(caplog):
    # Reads in the samples' finally blocks as the scope unwound were taken for
    # the scope's own code reading (a warning blaming it, the rest run eagerly).
    model = ReadsInFinally()
    model.initialize()
    xs = [nd.ones((n, 3)) * n for n in (1, 2, 3, 1, 2, 3, 1, 2)]
    with caplog.at_level("WARNING", logger="gluon_dynbatch"):
        for _ in range(3):
            with pytest.raises(KeyError):
                with gdb.batching():
                    [model(x) for x in xs]
                    raise KeyError("the loop's own error")
    assert not [r for r in caplog.records if "read while recording" in r.getMessage()]
    with gdb.batching() as scope:
        outs = [model(x) for x in xs]
    for out, x in zip(outs, xs):
        np.testing.assert_allclose(out.asnumpy(), model(x).asnumpy(), rtol=1e-5)
    assert scope.stats.eager_samples == 0


class Scale(gluon.HybridBlock):
    """``x * self.k``: a setting its parent gives it per sample."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.k = 1

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return x * self.k


class SetsAfterPause(gdb.DynBatchBlock):
    """Computes something under ``autograd.pause()`` (or ``predict_mode()``), then
    sets its child's setting and calls it at once: no read in the sample's code."""

    def __init__(self, how, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        with self.name_scope():
            self.scale = Scale()

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        with autograd.pause() if self.how == "pause" else autograd.predict_mode():
            b = x * 3
        self.scale.k = x.shape[0]
        return F.sum(self.scale(x + b))


@pytest.mark.parametrize("how", ["pause", "predict_mode"])
@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"compiled": "step"},
                                     {"strategy": "reference"}])
def test_a_setting_written_after_a_change_of_modes_reaches_its_samples_own_call(how, options):
    """A sample waits for its round at a change of autograd's modes: before it
    writes a block's attribute, not after (the other samples' writes reached
    its call: the last sample's setting, silently)."""
    model = SetsAfterPause(how)
    model.initialize()
    xs = [nd.ones((n, 2)) for n in (1, 2, 3)]
    with autograd.record():
        want = [float(o.asscalar()) for o in (model(x) for x in xs)]
    assert want == [8.0, 32.0, 72.0]
    for _ in range(2):          # (the second scope starts with the last sample's setting)
        with autograd.record():
            with gdb.batching(**options):
                outs = [model(x) for x in xs]
        assert [float(o.asscalar()) for o in outs] == want


class NotesAfterReading(gdb.DynBatchBlock):
    """Reads a value, then notes its sample in a list, or raises for one sample."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []
        self.fail = None
        with self.name_scope():
            self.dense = nn.Dense(2, in_units=2)

    def hybrid_forward(self, F, x, k):  # pylint: disable=arguments-differ
        h = self.dense(x)
        if float(F.sum(h).asscalar()) > 1e9:
            h = h * 2
        if k == self.fail:
            raise ValueError("sample %d failed on purpose" % k)
        self.seen.append(k)
        return F.sum(h)


def test_a_nested_scope_finishes_the_samples_it_started_when_it_ends():
    """Its samples' side effects are done and their errors raised at the inner
    block's end, as a scope of its own would (they finished at the outer
    scope's end: the code after the inner block saw nothing noted, and an
    error came out of the outer block)."""
    model = NotesAfterReading()
    model.initialize()
    xs = [nd.ones((1, 2)) * k for k in range(3)]
    with gdb.batching():
        with gdb.batching():
            outs = [model(x, k) for k, x in enumerate(xs)]
        assert sorted(model.seen) == [0, 1, 2]
        model.fail, model.seen = 1, []
        after = []
        with pytest.raises(ValueError, match="sample 1 failed"):
            with gdb.batching():
                [model(x, k) for k, x in enumerate(xs)]    # pylint: disable=W0106
            after.append("ran")
        assert after == []
    assert len(outs) == 3 and all(np.isfinite(o.asscalar()) for o in outs)


class ReturnsNumpyArray(gdb.DynBatchBlock):
    """Returns its value as an ``mx.np`` array (numpy semantics off), after a read."""

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        h = F.tanh(x)
        if float(F.sum(h).asscalar()) > 1e9:
            h = h * 2
        return h.as_np_ndarray()


def test_an_mx_np_result_in_a_plain_loop_is_a_clear_error_and_map_returns_it():
    """A placeholder of a plain loop cannot stand for an ``mx.np`` array: a
    BatchingError naming the sample and the way out (MXNet's TypeError of
    ``identity`` before); ``gdb.map`` returns the array as eager does."""
    model = ReturnsNumpyArray()
    xs = [nd.ones((n, 2)) for n in (1, 2)]
    with pytest.raises(gdb.BatchingError, match=r"sample \d.*mx\.np array.*gdb\.map"):
        with gdb.batching():
            [model(x) for x in xs]      # pylint: disable=W0106
    with gdb.batching():
        outs = gdb.map(model, xs)
    assert [type(o).__name__ for o in outs] == ["ndarray", "ndarray"]
    for out, x in zip(outs, xs):
        np.testing.assert_allclose(out.asnumpy(), np.tanh(x.asnumpy()), rtol=1e-6)


def test_gluon_layers_under_numpy_semantics_run_as_eager():
    """Under ``npx.set_np()`` Gluon's layers call ``mx.npx`` operators, which take
    ``mx.np`` arrays only, as do the model's ``F.np`` calls on its parameters:
    the calls run as eagerly (MXNet's TypeError about legacy arrays before)."""
    script = """
import numpy as onp
import mxnet as mx
from mxnet import autograd, gluon, np, npx
import gluon_dynbatch as gdb
npx.set_np()

class M(gdb.DynBatchBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.d = gluon.nn.Dense(4, in_units=4, flatten=False)
        self.p = self.params.get("p", shape=(4,))
    def hybrid_forward(self, F, x, p):
        return F.np.tanh(self.d(x)).sum(axis=0) + F.np.dot(x, p).sum()

m = M(); m.initialize()
rs = onp.random.RandomState(0)
xs = [np.array(rs.randn(n, 4), dtype="float32") for n in (2, 3)]
def run(batched):
    m.collect_params().zero_grad()
    with autograd.record():
        if batched:
            with gdb.batching():
                outs = [m(x) for x in xs]
        else:
            outs = [m(x) for x in xs]
        loss = outs[0].sum() + outs[1].sum()
    loss.backward()
    return [o.asnumpy() for o in outs] + [m.d.weight.grad().asnumpy(), m.p.grad().asnumpy()]
want = run(False)
for _ in range(2):
    for g, w in zip(run(True), want):
        onp.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
print("same")
"""
    assert output_of_script(script).strip().endswith("same")


def test_a_nested_scope_given_options_of_its_own_says_it_runs_with_the_outer_ones(
        caplog, monkeypatch):
    """Its options were ignored without a word (its stats stay empty)."""
    monkeypatch.setattr(logs, "_WARNED", set())     # told once a process
    model = NotesAfterReading()
    model.initialize()
    with caplog.at_level("WARNING"):
        with gdb.batching():
            with gdb.batching(strategy="agenda", keep_plan=True):
                outs = [model(nd.ones((1, 2)), k) for k in range(2)]
    assert len(outs) == 2
    said = [r.getMessage() for r in caplog.records if "joins it" in r.getMessage()]
    assert said and "strategy" in said[0] and "keep_plan" in said[0]


class PausesOnItsInput(gdb.DynBatchBlock):
    """A child computing something under ``autograd.pause()`` from its input (a search
    it does not differentiate), then its output from the same input."""

    def __init__(self, every, **kwargs):
        super().__init__(**kwargs)
        self.every = every
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, h, k):  # pylint: disable=arguments-differ
        if self.every or k % 2:
            with autograd.pause():
                self.dense(h)
        return self.dense(h)


class EncodesThenPauses(gdb.DynBatchBlock):
    """Its input encoded by its own layer, given to a child that pauses."""

    def __init__(self, every, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.enc = nn.Dense(4, in_units=3, flatten=False)
            self.child = PausesOnItsInput(every)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return self.child(F.tanh(self.enc(x)), x.shape[0])


@pytest.mark.parametrize("every", [False, True], ids=["some samples", "every sample"])
@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"compiled": "step"}, "map"],
                         ids=str)
def test_a_child_pausing_on_its_parents_value_keeps_the_parents_gradient(every, options):
    """The parent's calls computing the child's input entered the graph when the
    child's paused call read it, under the paused modes: no gradient reached the
    parent's layer from those samples (all zeros when every sample paused)."""
    mx.random.seed(3)
    model = EncodesThenPauses(every)
    model.initialize(mx.init.Normal(0.5))
    r = np.random.RandomState(3)
    xs = [nd.array(r.randn(n, 3)) for n in (2, 3, 1, 4)]

    def run(batched):
        model.collect_params().zero_grad()      # (a pass not reaching a weight leaves it)
        with autograd.record():
            if batched == "map":
                outs = gdb.map(model, xs)
            elif batched is not None:
                with gdb.batching(**batched):
                    outs = [model(x) for x in xs]
            else:
                outs = [model(x) for x in xs]
            loss = nd.add_n(*[o.sum() for o in outs])
        loss.backward()
        return [o.asnumpy() for o in outs], model.enc.weight.grad().asnumpy().copy()

    want = run(None)
    assert np.abs(want[1]).max() > 0
    for _ in range(2):
        got = run(options)
        for out, expected in zip(got[0], want[0]):
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


class MapsUnderPause(gdb.DynBatchBlock):
    """Maps a function over two copies of its input, the function calling a child
    under ``autograd.pause()``; then uses the child's result."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inner = EncodesThenPauses(False)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        def paused(y):
            with autograd.pause():
                return self.inner(y)
        parts = gdb.map(paused, [x, x * 2])
        return self.inner(x) + parts[0]


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"compiled": "step"}], ids=str)
def test_map_inside_a_call_whose_tasks_change_modes_equals_eager(options):
    """The tasks of ``gdb.map`` inside a sample recorded into the caller's frame,
    which a change of modes in them ended with values never settled: a
    RecursionError where eager runs."""
    mx.random.seed(0)
    model = MapsUnderPause()
    model.initialize()
    xs = [nd.ones((2, 3)), nd.ones((3, 3)) * 0.5]
    with autograd.record():
        want = [model(x).asnumpy() for x in xs]
    for _ in range(2):
        with autograd.record():
            with gdb.batching(**options):
                outs = [model(x) for x in xs]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)


class MapsChildrenUnderPause(gdb.DynBatchBlock):
    """A tree whose marked nodes encode their children with ``gdb.map`` under
    ``autograd.pause()``, the others in a loop."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, tree, table):  # pylint: disable=arguments-differ
        if tree.label:
            with autograd.pause():
                kids = gdb.map(lambda child: self(child, table), tree.children)
        else:
            kids = [self(child, table) for child in tree.children]
        h = self.inp(table[tree.word:tree.word + 1])
        for kid in kids:
            h = h + kid
        return F.tanh(h)


def test_a_tree_mapping_its_childrens_calls_under_pause_equals_eager():
    """The map's tasks recorded into the marked node's frame, which the change of
    modes ended: a RecursionError (a value never settled)."""
    def node(word, children=(), label=0):
        tree = Tree(word, list(children))
        tree.label = label
        return tree
    leaf = lambda: node(1)      # noqa: E731
    trees = [node(1, [node(1, [node(1, [leaf(), leaf()]), node(1, [leaf(), leaf()]), leaf()]),
                      node(1, [node(1, [leaf(), leaf(), leaf()]),
                               node(1, [leaf(), leaf()], label=1)])]),
             node(2, [node(3, [leaf()], label=1), leaf()])]
    mx.random.seed(0)
    model = MapsChildrenUnderPause()
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(1).uniform(-1, 1, (10, 4)))
    with autograd.record():
        want = [model(tree, table).asnumpy() for tree in trees]
    for _ in range(2):
        with autograd.record():
            with gdb.batching():
                outs = [model(tree, table) for tree in trees]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)
