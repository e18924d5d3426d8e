"""The depth planner: steps in dependency order, and tails after loops aligned.

A model that loops over a sample-dependent number of tokens and then runs a
classifier places the classifier at a different depth in every sample; the
depth planner aligns such once-per-sample tails at the end instead.
"""
import random

import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mxnet import nd
from mxnet.gluon import nn

import gluon_dynbatch as gdb
from dynbatch_testing import assert_same, reference_run, run_model
from gluon_dynbatch.ir.graph import OP, op_deps
from test_engine_hypothesis import interpreter_case, programs


class LoopThenClassify(gdb.DynBatchBlock):
    """An Elman RNN over the tokens, then a classifier and its loss, once per sample."""

    def __init__(self, hidden=6, classes=3, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.step = nn.Dense(hidden, activation="tanh")
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, table):
        h = F.zeros((1, 6))
        for w in words:
            h = self.step(F.concat(table[w:w + 1], h, dim=1))
        logits = self.out(h)
        label = F.one_hot(F.array([len(words) % 3]), 3)
        return -F.sum(label * F.log_softmax(logits))


def _sentences(seed, lengths):
    r = random.Random(seed)
    return [[r.randrange(10) for _ in range(k)] for k in lengths]


def _model():
    mx.random.seed(3)
    model = LoopThenClassify()
    model.initialize(mx.init.Uniform(0.5))
    return model


def test_the_classifier_after_loops_of_every_length_is_one_step():
    model = _model()
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, size=(10, 4)))
    samples = _sentences(0, [1, 5, 2, 7, 3, 7, 4])
    with gdb.batching(strategy="depth", keep_plan=True, granularity="op") as scope:
        outs = [model(sentence, table) for sentence in samples]
    del outs
    steps = scope.last_plan.steps
    names = [s.nodes[0].op.name for s in steps]
    tail = [s for s in steps if s.nodes[0].op.name in ("log_softmax", "sum")]
    assert [len(s.nodes) for s in tail] == [len(samples)] * 2, names
    # The recurrent steps still go by token: one step per position.
    assert len(steps) <= 7 * 3 + 6, names
    expected = reference_run(model, samples, [table])
    for compiled in (False, True, "step"):
        for granularity in ("call", "op"):
            assert_same(run_model(model, samples, [table], "depth", compiled,
                                  granularity=granularity), expected)


def _check_order(plan):
    """Every op node is in one step, after the steps of the op nodes it waits for."""
    step_of = {}
    for k, step in enumerate(plan.steps):
        for node in step.nodes:
            assert node not in step_of, "node planned twice"
            step_of[node] = k
    memo = {}
    for node, k in step_of.items():
        assert node.kind == OP
        for dep in op_deps(node, memo):
            assert step_of[dep] < k, "a step runs before an input"


@settings(deadline=None, max_examples=25)
@given(st.lists(programs(), min_size=1, max_size=5), st.booleans())
def test_depth_plans_run_every_node_after_its_inputs(progs, same_program):
    model, samples, table = interpreter_case(progs, same_program)
    with gdb.batching(strategy="depth", keep_plan=True, granularity="op") as scope:
        outs = [model(s, table) for s in samples]
    del outs
    _check_order(scope.last_plan)


def test_tree_plans_keep_their_depths():
    """Cells that run many times per sample stay at their depth (leaves in one step)."""
    from dynbatch_testing import ChildSumTreeLSTM, random_tree
    r = random.Random(2)
    trees = [random_tree(r, 10, 4) for _ in range(8)]
    mx.random.seed(1)
    model = ChildSumTreeLSTM(5)
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(2).uniform(-1, 1, size=(10, 4)))
    with gdb.batching(strategy="depth", keep_plan=True) as scope:
        outs = [model(t, table) for t in trees]
    del outs
    plan = scope.last_plan
    _check_order(plan)
    for step in plan.steps:
        assert len({n.depth for n in step.nodes}) == 1


@pytest.mark.parametrize("compiled", [False, "step"])
def test_rows_of_a_large_table_read_by_many_steps_are_taken_once_and_stay_exact(
        compiled, monkeypatch):
    """A tagger's steps each read their tokens' rows of a word table: the walk
    takes the rows the flush reads once, and the steps read those."""
    from dynbatch_testing import TokenRNN, make_model
    from gluon_dynbatch.run import lowering
    hoisted = []
    real = lowering.Lowering._hoist_table_rows

    def spy(self):
        real(self)
        hoisted.append(len(self.hoisted))

    monkeypatch.setattr(lowering.Lowering, "_hoist_table_rows", spy)
    model = make_model(TokenRNN)
    table = nd.random.uniform(-1, 1, shape=(500, 5))
    r = random.Random(4)
    sentences = [[r.randrange(500) for _ in range(r.randint(1, 7))] for _ in range(6)]
    expected = reference_run(model, sentences, [table])
    assert_same(run_model(model, sentences, [table], "depth", compiled), expected)
    assert hoisted and max(hoisted) == 1
