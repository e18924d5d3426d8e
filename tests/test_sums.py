"""Chains of additions recorded operator by operator become segment sums (``sums.py``).

Each model here is checked against eager Gluon (outputs and every gradient)
and its plan is checked for what the rewrite is for: sums of any length in
one step, at the depth of their deepest term.
"""
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mxnet import autograd, nd
from mxnet.gluon import nn

import gluon_dynbatch as gdb
from dynbatch_testing import (assert_same, check_all_strategies, make_model, random_tree,
                              run_model)
from gluon_dynbatch.plan import sums

H = 5


class Neighbours(gdb.DynBatchBlock):
    """Rows summed over each vertex's neighbours with Python's ``sum``, two rounds."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.msg = nn.Dense(H, in_units=H)
            self.upd = nn.Dense(H, in_units=H)

    def hybrid_forward(self, F, graph, table):
        words, neighbours = graph
        h = [table[w:w + 1] for w in words]
        for _ in range(2):
            m = [self.msg(v) for v in h]
            h = [F.tanh(self.upd(h[i]) + sum(m[j] for j in neighbours[i]))
                 for i in range(len(h))]
        return F.concat(*h, dim=0)


class Partials(gdb.DynBatchBlock):
    """A running total whose partial sums are also returned or read twice."""

    def hybrid_forward(self, F, words, table):
        rows = [F.tanh(table[w:w + 1]) for w in words]
        total = rows[0]
        partials = []
        for k, row in enumerate(rows[1:]):
            total = total + row
            if k % 2 == 0:
                partials.append(total)          # held: returned to the caller
            elif k % 3 == 1:
                partials.append(total * total)  # read again by another call
        broadcast = total + table[0]            # (1, H) + (H,): not a link
        return [total, broadcast, F.add_n(*rows), total + 1.0] + partials


def _graphs(seed, n):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        size = r.randint(1, 6)
        nbrs = [[j for j in range(size) if j != i and r.random() < 0.5] for i in range(size)]
        out.append(([r.randrange(10) for _ in range(size)], nbrs))
    return out


def _table(seed=0):
    return nd.array(np.random.RandomState(seed).uniform(-1, 1, (10, H)))


def _sentences(seed, n):
    r = random.Random(seed)
    return [[r.randrange(10) for _ in range(r.randint(1, 8))] for _ in range(n)]


def _steps(plan):
    return [step.nodes[0].op.name for step in plan.steps]


def test_sums_over_neighbours_are_one_step_per_round_and_exact():
    model = make_model(Neighbours)
    check_all_strategies(model, _graphs(0, 6), [_table()])
    model(_graphs(0, 1)[0], _table())           # eager: parameters known
    with gdb.batching(granularity="op", keep_plan=True) as scope:
        outs = [model(g, _table()) for g in _graphs(1, 16)]
    assert len(outs) == 16
    names = _steps(scope.last_plan)
    assert "broadcast_add" not in names and "_plus_scalar" not in names
    assert names.count("sum") == 2               # one segment sum per round
    assert len(names) <= 10


def test_partial_sums_the_user_holds_or_reads_again_keep_their_values():
    model = make_model(Partials)
    check_all_strategies(model, _sentences(0, 6), [_table()])


class Losses(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.out = nn.Dense(1, in_units=H)

    def hybrid_forward(self, F, words, table):
        h = 0
        for w in words:
            h = F.tanh(table[w:w + 1] + 0.5 * h)
        return self.out(h).sum()


def _loss_inside(samples, table, strategy="depth", granularity=None):
    model = make_model(Losses)
    table.attach_grad()
    with autograd.record():
        if strategy == "eager":
            loss = sum(model(s, table) for s in samples)
            scope = None
        else:
            with gdb.batching(strategy=strategy, granularity=granularity,
                              keep_plan=True) as scope:
                loss = sum(model(s, table) for s in samples)
    loss.backward()
    grads = {k: p.grad().asnumpy().copy()
             for k, p in enumerate(model.collect_params().values())}
    grads["table"] = table.grad.asnumpy().copy()
    return [loss.asnumpy()], grads, scope


@pytest.mark.parametrize("strategy", ["depth", "agenda", "unbatched"])
def test_a_loss_summed_over_every_sample_inside_the_scope(strategy):
    samples = _sentences(2, 40)
    want = _loss_inside(samples, _table(), "eager")
    got = _loss_inside(samples, _table(), strategy)
    assert_same(got, want)
    if strategy != "unbatched":
        names = _steps(got[2].last_plan)
        assert "broadcast_add" not in names and names[-1] == "sum"
        assert len(names) <= 20                  # 40 samples: not a step per sample


def test_long_chains_are_summed_in_pieces(monkeypatch):
    monkeypatch.setattr(sums, "MAX_TERMS", 3)
    samples = _sentences(3, 11)
    want = _loss_inside(samples, _table(), "eager")
    got = _loss_inside(samples, _table(), "depth")
    assert_same(got, want)
    assert _steps(got[2].last_plan).count("sum") >= 2


def _linted(seen):
    """``sums.rewrite`` that checks the graph's invariants after each rewrite
    and notes how many chains it rewrote in ``seen``."""
    original = sums.rewrite

    def checked(graph):
        count = original(graph)
        graph.lint()
        seen.append(count)
        return count
    return checked


def test_the_rewritten_graph_keeps_the_invariants(monkeypatch):
    seen = []
    monkeypatch.setattr(sums, "rewrite", _linted(seen))
    model = make_model(Partials)
    run_model(model, _sentences(4, 6), [_table()], "depth", granularity="op")
    assert seen and seen[0] > 0


def test_the_reference_executor_runs_the_chains_as_recorded(monkeypatch):
    def refuse(graph):
        raise AssertionError("the reference must see the graph as recorded")

    monkeypatch.setattr(sums, "rewrite", refuse)
    model = make_model(Partials)
    eager = run_model(model, _sentences(5, 4), [_table()], "eager")
    assert_same(run_model(model, _sentences(5, 4), [_table()], "reference"), eager)



# Sums that add one value more than once: each occurrence counts.
REPEATS = {
    "sum_of_a_repeated_list": lambda F, x, kids: sum([x, x, x] + kids + kids),
    "add_n_with_a_repeat": lambda F, x, kids: F.add_n(x, x, *kids),
    "two_sums_from_zero": lambda F, x, kids: (0 + x) + (0 + x) + sum(kids),
    "scalar_zero_by_keyword": lambda F, x, kids: F._internal._plus_scalar(x, scalar=0.0) + x,
    "a_child_twice": lambda F, x, kids: x + sum(kids) + (kids[0] if kids else 0),
}


class Repeats(gdb.DynBatchBlock):
    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.dense = nn.Dense(H, in_units=H)

    def hybrid_forward(self, F, tree, table):
        kids = [self(child, table) for child in tree.children]
        return F.tanh(0.5 * self.form(F, self.dense(table[tree.word:tree.word + 1]), kids))


@pytest.mark.parametrize("name", sorted(REPEATS))
def test_a_value_added_more_than_once_counts_each_time(name):
    r = random.Random(7)
    trees = [random_tree(r, 10, 3) for _ in range(6)]
    check_all_strategies(make_model(Repeats, form=REPEATS[name]), trees, [_table()])


def _keyword_zero_in_a_loop(F, x, kids):
    total = F._internal._plus_scalar(x, scalar=0.0)
    for kid in kids:
        total = F._internal._plus_scalar(total, scalar=0.0) + kid
    return total


def test_x_plus_zero_given_by_keyword_inside_a_loop():
    r = random.Random(8)
    trees = [random_tree(r, 10, 3) for _ in range(6)]
    check_all_strategies(make_model(Repeats, form=_keyword_zero_in_a_loop), trees, [_table()])


class TokenLosses(gdb.DynBatchBlock):
    """Python's ``sum`` of a cross-entropy per token: ``0 + loss`` starts the chain
    between calls that no program holds."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.out = nn.Dense(3)

    def hybrid_forward(self, F, words, table):
        logits = [self.out(table[w:w + 1]) for w in words]
        return sum(F.softmax_cross_entropy(z, F.array([w % 3])) for z, w in zip(logits, words))


def test_a_python_sum_of_losses_between_calls_no_program_holds_is_one_chain():
    model, table = make_model(TokenLosses), nd.array(np.random.RandomState(3).uniform(size=(10, 4)))
    sentences = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [0]]
    check_all_strategies(model, sentences, [table], strategies=("depth",), compiled=(False,))
    with gdb.batching(keep_plan=True) as scope:
        outs = [model(words, table) for words in sentences]
    nd.waitall()
    assert len(outs) == len(sentences)
    starts = [step for step in scope.last_plan.steps
              if [e.op.name for e in getattr(step.nodes[0].op, "entries", ())] == ["_plus_scalar"]]
    assert not starts, "x + 0 made a program of its own: the chain is no longer summed as one"


class AdditionProgram(gdb.DynBatchBlock):
    """Runs a sample's program of additions over rows of a table: each
    instruction adds two earlier values, starts from zero (Python's ``sum``),
    calls ``add_n``, or reads a value again through another operator; some
    intermediate values are returned (held by the caller)."""

    def hybrid_forward(self, F, program, table):
        words, instructions = program
        values = [F.tanh(table[w:w + 1]) for w in words]
        held = []
        for kind, a, b in instructions:
            x, y = values[a % len(values)], values[b % len(values)]
            if kind == "add":
                values.append(x + y)
            elif kind == "sum":
                values.append(sum([x, y, x]))
            elif kind == "add_n":
                values.append(F.add_n(x, y, x))
            elif kind == "read":
                values.append(F.sigmoid(x) * y)
            else:
                held.append(x + y)
                values.append(held[-1])
        return [values[-1]] + held


_INSTRUCTIONS = st.lists(st.tuples(st.sampled_from(["add", "add", "sum", "add_n", "read",
                                                    "hold"]),
                                   st.integers(0, 30), st.integers(0, 30)),
                         min_size=1, max_size=12)
_PROGRAMS = st.lists(st.tuples(st.lists(st.integers(0, 9), min_size=1, max_size=4),
                               _INSTRUCTIONS), min_size=1, max_size=5)


@settings(max_examples=25, deadline=None)
@given(programs=_PROGRAMS)
def test_random_programs_of_additions_are_exact_and_keep_the_invariants(programs):
    seen = []
    original = sums.rewrite
    model = make_model(AdditionProgram)
    want = run_model(model, programs, [_table()], "eager")
    sums.rewrite = _linted(seen)
    try:
        got = run_model(model, programs, [_table()], "depth", granularity="op")
    finally:
        sums.rewrite = original
    assert_same(got, want)
    assert seen
