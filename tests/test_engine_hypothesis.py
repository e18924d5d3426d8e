"""Property-based differential tests: random trees and DAG programs, every strategy."""
import mxnet as mx
from hypothesis import given, strategies as st
from mxnet import gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import (BATCHED, ChildSumTreeLSTM, Tree, assert_same, make_model,
                              reference_run, run_model)

WIDTH = 4


@st.composite
def trees(draw, depth=0, vocab=12):
    arity = 0 if depth >= 3 else draw(st.integers(0, 5))
    word = draw(st.integers(0, vocab - 1))
    return Tree(word, [draw(trees(depth=depth + 1)) for _ in range(arity)])


@given(st.lists(trees(), min_size=1, max_size=6), st.sampled_from(BATCHED),
       st.sampled_from([False, True, "step"]))
def test_random_trees_all_arities(samples, strategy, compiled):
    model = make_model(ChildSumTreeLSTM, hidden=3)
    emb = nd.array(mx.nd.random.uniform(shape=(12, 2)).asnumpy())
    expected = reference_run(model, samples, [emb])
    assert_same(run_model(model, samples, [emb], strategy, compiled), expected)


# A program is a list of instructions over a growing list of values, each of
# shape (rows, WIDTH) with per-sample (ragged) row counts.
OPS = ("dense", "tanh", "add", "mul", "concat0", "sum0", "rows", "scale", "alone",
       "mean0", "concat1")


@st.composite
def programs(draw):
    rows0 = draw(st.integers(1, 4))
    shapes = [rows0]
    program = []
    for _ in range(draw(st.integers(1, 9))):
        op = draw(st.sampled_from(OPS))
        a = draw(st.integers(0, len(shapes) - 1))
        if op in ("add", "mul", "concat1"):
            same = [i for i, r in enumerate(shapes) if r == shapes[a] or r == 1
                    or shapes[a] == 1]
            b = draw(st.sampled_from(same))
            if op == "concat1" and shapes[a] != shapes[b]:
                op = "add"
            rows = max(shapes[a], shapes[b])
            program.append((op, a, b))
        elif op == "concat0":
            b = draw(st.integers(0, len(shapes) - 1))
            rows = shapes[a] + shapes[b]
            program.append((op, a, b))
        elif op in ("sum0", "mean0"):
            rows = 1
            program.append((op, a))
        elif op == "rows":
            start = draw(st.integers(0, shapes[a] - 1))
            stop = draw(st.integers(start + 1, shapes[a]))
            rows = stop - start
            program.append((op, a, start, stop))
        else:
            rows = shapes[a]
            program.append((op, a))
        shapes.append(rows)
    outputs = draw(st.lists(st.integers(0, len(shapes) - 1), min_size=1, max_size=3))
    return rows0, program, outputs


class Interpreter(gdb.DynBatchBlock):
    """Runs one program per sample on rows of a shared input table."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(WIDTH, in_units=WIDTH)
            self.inner = gluon.nn.HybridSequential()
            self.inner.add(gluon.nn.Dense(2 * WIDTH, in_units=2 * WIDTH, activation="tanh"))

    def hybrid_forward(self, F, sample, table):
        offset, (rows0, program, outputs) = sample
        values = [table[offset:offset + rows0]]
        for ins in program:
            op, a = ins[0], values[ins[1]]
            if op == "dense":
                out = self.dense(a)
            elif op == "tanh":
                out = F.tanh(a)
            elif op == "add":
                out = F.broadcast_add(a, values[ins[2]])
            elif op == "mul":
                out = a * values[ins[2]]
            elif op == "concat0":
                out = F.concat(a, values[ins[2]], dim=0)
            elif op == "concat1":
                both = self.inner(F.concat(a, values[ins[2]], dim=1))
                out = F.slice_axis(both, axis=1, begin=0, end=WIDTH)
            elif op == "sum0":
                out = F.sum(a, axis=0, keepdims=True)
            elif op == "mean0":
                out = F.mean(a, axis=0, keepdims=True)
            elif op == "rows":
                out = a[ins[2]:ins[3]]
            elif op == "scale":
                out = 0.5 * a - 1
            else:   # "alone": no batching rule for a full reduction
                out = F.broadcast_mul(a, F.sum(F.abs(a)))
            values.append(out)
        return [values[i] for i in outputs]


def interpreter_case(progs, same_program):
    """``(model, samples, table)``: one drawn program per sample, or the first for all."""
    if same_program:
        progs = [progs[0]] * len(progs)
    samples = [(k, p) for k, p in enumerate(progs)]
    mx.random.seed(0)
    model = Interpreter()
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(mx.nd.random.uniform(-1, 1, shape=(len(progs) + 4, WIDTH)).asnumpy())
    return model, samples, table


@given(st.lists(programs(), min_size=1, max_size=5), st.sampled_from(BATCHED),
       st.booleans(), st.sampled_from([False, True, "step"]))
def test_random_dag_programs(progs, strategy, same_program, compiled):
    model, samples, table = interpreter_case(progs, same_program)
    expected = run_model(model, samples, [table], "eager")
    assert_same(reference_run(model, samples, [table]), expected)
    assert_same(run_model(model, samples, [table], strategy, compiled), expected,
                rtol=1e-5, atol=1e-5)
