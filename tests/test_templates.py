"""Templates: what a frame's calls become (gluon_dynbatch/templates.py, vectorize.py, sites.py).

Each test checks the structure of the plan (how many programs, how many
steps) and that the results equal eager Gluon, outputs and every gradient.
"""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import (BinaryTreeLSTM, TokenRNN, Tree, assert_same,
                              check_all_strategies, make_model, random_binary_tree, rng,
                              run_model)
from examples.sick_model import OpByOpTreeLSTM
from gluon_dynbatch.templates.programs import Program

MODES = [False, True, "step"]


def _plan(model, samples, inputs, **kwargs):
    with gdb.batching(keep_plan=True, **kwargs) as scope:
        outs = [model(s, *inputs) for s in samples]
    return scope.last_plan, outs


def _programs(plan):
    return {step.nodes[0].op.uid for step in plan.steps if isinstance(step.nodes[0].op, Program)}


class Gates(gluon.HybridBlock):
    """Row-wise runs around an operator whose weight is computed in the block."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(6, in_units=3)
            self.raw = self.params.get("raw", shape=(2, 3))

    def hybrid_forward(self, F, x, rows, raw):  # pylint: disable=arguments-differ
        z = F.Activation(F.slice_axis(self.dense(x), axis=1, begin=0, end=3), act_type="tanh")
        s = F.sum(rows, axis=0, keepdims=True)
        a = F.Activation(F.broadcast_mul(z, s), act_type="sigmoid")
        w = F.Activation(raw, act_type="tanh")                   # a weight made here...
        v = F.FullyConnected(a, w, no_bias=True, num_hidden=2)   # ...used by this FC
        return F.tanh(v) * 2, a


class UsesGates(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.gates = Gates()

    def hybrid_forward(self, F, k, x):
        rows = x[k:k + 1 + k % 3]                          # 1, 2 or 3 rows
        return self.gates(x[k:k + 1], rows)


@pytest.mark.parametrize("compiled", MODES)
def test_a_call_that_is_no_program_runs_its_row_wise_runs_as_programs(compiled):
    model = make_model(UsesGates)
    x = nd.random.uniform(-1, 1, shape=(9, 3))
    samples = list(range(7))
    eager = run_model(model, samples, [x], "eager")
    assert_same(run_model(model, samples, [x], "depth", compiled), eager)
    plan, _ = _plan(model, samples, [x], compiled=compiled)
    kinds = [type(step.nodes[0].op).__name__ for step in plan.steps]
    assert "Program" in kinds and "OpDef" in kinds
    # The runs batch: every sample's run is in one step.
    assert max(len(step.nodes) for step in plan.steps) == len(samples)


class ChildLoop(gdb.DynBatchBlock):
    """A Python loop over the children with a sum carried across it."""

    def __init__(self, hidden=4, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.down = gluon.nn.Dense(hidden, in_units=hidden)
            self.leaf = gluon.nn.Dense(hidden, in_units=3)

    def hybrid_forward(self, F, tree, emb):
        states = [self(child, emb) for child in tree.children]
        c = F.tanh(self.leaf(emb[tree.word:tree.word + 1]))
        for h in states:
            c = c + F.sigmoid(self.down(h)) * h
        return c


def _fan(r, depth=3):
    """Trees whose nodes have 1 to 4 children (leaves at the bottom)."""
    if depth == 0:
        return Tree(r.randrange(10))
    return Tree(r.randrange(10), [_fan(r, depth - 1) for _ in range(r.randint(1, 4))])


@pytest.mark.parametrize("compiled", MODES)
def test_calls_of_any_count_of_children_share_one_program(compiled):
    r = rng(3)
    trees = [_fan(r, 2) for _ in range(5)]
    model = make_model(ChildLoop)
    emb = nd.random.uniform(shape=(10, 3))
    eager = run_model(model, trees, [emb], "eager")
    assert_same(run_model(model, trees, [emb], "depth", compiled), eager)
    plan, _ = _plan(model, trees, [emb], compiled=compiled)
    # Leaves are one program; inner nodes with 1, 2, 3 or 4 children another.
    assert len(_programs(plan)) == 2
    assert len(plan.steps) == 3                 # one step per level


def test_a_sum_over_one_child_is_recognised_as_one_over_several():
    """A loop that ran once still carries its sum: the program of a node with
    one child is the one of a node with three."""
    model = make_model(ChildLoop)
    emb = nd.random.uniform(shape=(10, 3))
    one = Tree(0, [Tree(1)])
    three = Tree(2, [Tree(3), Tree(4), Tree(5)])
    plan, _ = _plan(model, [one, three], [emb])
    top = plan.steps[-1]
    assert len(top.nodes) == 2 and len(_programs(plan)) == 2


@pytest.mark.parametrize("compiled", MODES)
def test_a_recurrent_loop_runs_one_step_per_token_across_sentences(compiled):
    r = rng(5)
    sentences = [[r.randrange(10) for _ in range(n)] for n in (1, 3, 5, 7, 4)]
    model = make_model(TokenRNN, hidden=5)
    emb = nd.random.uniform(shape=(10, 3))
    eager = run_model(model, sentences, [emb], "eager")
    assert_same(run_model(model, sentences, [emb], "depth", compiled), eager)
    plan, _ = _plan(model, sentences, [emb], compiled=compiled)
    # Token t of every sentence still that long runs in one step (one program
    # per iteration), whatever the sentences' lengths.
    longest = max(len(s) for s in sentences)
    assert len(plan.steps) <= longest + 2
    assert max(len(step.nodes) for step in plan.steps) == len(sentences)


@pytest.mark.parametrize("strategy", ["depth", "agenda"])
def test_op_by_op_models_plan_like_cell_models(strategy):
    """The Child-Sum and binary Tree-LSTMs written op by op: one program per
    node kind, one step per level (as the models written with cells)."""
    r = rng(7)
    model = OpByOpTreeLSTM(6, 3)
    model.initialize(mx.init.Uniform(0.3))
    trees = [_fan(r, 3) for _ in range(4)]
    emb = nd.random.uniform(shape=(10, 3))
    assert_same(run_model(model, trees, [emb], strategy), run_model(model, trees, [emb], "eager"))
    plan, _ = _plan(model, trees, [emb], strategy=strategy)
    assert len(_programs(plan)) == 2
    binary = make_model(BinaryTreeLSTM, hidden=5)
    bins = [random_binary_tree(r, 10, n) for n in (1, 2, 5, 8)]
    assert_same(run_model(binary, bins, [emb], strategy), run_model(binary, bins, [emb], "eager"))
    plan, _ = _plan(binary, bins, [emb], strategy=strategy)
    assert len(_programs(plan)) == 2


class CellLoop(gdb.DynBatchBlock):
    """A gluon.rnn cell (several operators per call) called once per token."""

    def __init__(self, cell, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = cell

    def hybrid_forward(self, F, tokens, emb):
        state = [F.zeros((1, 4)) for _ in self.cell.state_info()]
        for t in tokens:
            out, state = self.cell(emb[t:t + 1], state)
        return out


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_a_child_block_of_several_operators_in_a_loop_is_one_iteration(cell):
    # The operators of one call share the call's place in the loop; they must
    # not be taken for iterations of it.
    make = {"lstm": gluon.rnn.LSTMCell, "gru": gluon.rnn.GRUCell, "rnn": gluon.rnn.RNNCell}
    model = CellLoop(make[cell](4, input_size=3))
    model.initialize(mx.init.Uniform(0.5))
    r = rng(11)
    sentences = [[r.randrange(10) for _ in range(n)] for n in (2, 6, 4, 6)]
    emb = nd.random.uniform(shape=(10, 3))
    eager = run_model(model, sentences, [emb], "eager")
    for _ in range(2):                      # the first call defers initialisation
        assert_same(run_model(model, sentences, [emb], "depth"), eager)
    plan, _ = _plan(model, sentences, [emb])
    tokens = sum(len(s) for s in sentences)
    nodes = sum(len(step.nodes) for step in plan.steps)
    assert nodes <= 2 * tokens + 2 * len(sentences), (nodes, tokens)
    # Token t of every sentence, last or not, runs in one step.
    assert len(plan.steps) <= max(len(s) for s in sentences) + 1, len(plan.steps)


class AttentionLoop(gdb.DynBatchBlock):
    """A helper attending over the sentence's own keys once per token: each
    ``F.dot`` is recorded as several operators (the column form)."""

    def hybrid_forward(self, F, tokens, emb):
        keys = F.tanh(emb[0:len(tokens) + 1])
        h = F.zeros((1, 3))
        for t in tokens:
            h = self.attend(F, emb[t:t + 1] + h, keys)
        return h

    def attend(self, F, x, keys):
        weights = F.softmax(F.dot(x, keys, transpose_b=True), axis=1)
        return F.tanh(F.dot(weights, keys))


@pytest.mark.parametrize("compiled", [False, True])
def test_the_operators_a_rewrite_records_for_one_call_are_one_iteration(compiled):
    # The operators a library rewrite records for one call of the user's
    # (each at a line of the rewrite's) are not iterations of the user's loop.
    r = rng(13)
    sentences = [[r.randrange(8) for _ in range(n)] for n in (1, 4, 2, 4, 3)]
    model = AttentionLoop()
    emb = nd.random.uniform(shape=(8, 3))
    eager = run_model(model, sentences, [emb], "eager")
    assert_same(run_model(model, sentences, [emb], "depth", compiled), eager)
    plan, _ = _plan(model, sentences, [emb], compiled=compiled)
    # Token t of every sentence runs in one step (and the keys in one).
    assert len(plan.steps) <= max(len(s) for s in sentences) + 2, len(plan.steps)


class DirectOps(gdb.DynBatchBlock):
    """``F`` operators reading the children's outputs, and ``-x``, in ``hybrid_forward``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.weight = self.params.get("weight", shape=(3, 3))

    def hybrid_forward(self, F, tree, emb, weight):
        x = emb[tree.word:tree.word + 1]
        for child in tree.children:
            x = F.broadcast_add(x, F.tanh(self(child, emb)))
        return -F.FullyConnected(x, weight, no_bias=True, num_hidden=3)


def test_known_calls_reading_child_outputs_and_numbers_take_the_short_path(monkeypatch):
    """Once learned, a frame's ``F`` calls that read its children's outputs for the
    first time, or take a number (``-x`` is ``_mul_scalar(x, -1.0)``), follow the
    trie from ``Frame.op`` without the general path."""
    from gluon_dynbatch.record.frames import Frame
    model = make_model(DirectOps)
    r = rng(3)
    trees = [_fan(r, 3) for _ in range(6)]
    emb = nd.random.uniform(shape=(10, 3))
    for _ in range(2):                  # learns the templates
        run_model(model, trees, [emb], "depth")
    general = []
    real = Frame._op
    monkeypatch.setattr(Frame, "_op",
                        lambda self, op, args, kwargs: general.append(op.name)
                        or real(self, op, args, kwargs))
    got = run_model(model, trees, [emb], "depth")
    # Only the graph's first use of the weight goes the general way (``ref`` names it).
    assert general == ["FullyConnected"]
    assert_same(got, run_model(model, trees, [emb], "eager"))


class GatesState(gluon.HybridBlock):
    """``F.elemwise_mul`` (no broadcasting) of a projection and a state, as
    ``rnn.GRUCell`` gates its previous state."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, x, state):
        return F.elemwise_mul(F.tanh(self.dense(x)), state)


class SharedState(gdb.DynBatchBlock):
    """Several calls of one cell on the same state (beams sharing a parent):
    a group of calls whose one-row input every member reads."""

    def __init__(self, read, **kwargs):
        super().__init__(**kwargs)
        self.read = read
        with self.name_scope():
            self.cell = GatesState()
            self.start = gluon.nn.Dense(4, in_units=3)

    def hybrid_forward(self, F, sample, emb):
        word, count = sample
        state = F.tanh(self.start(emb[word:word + 1]))
        if self.read:
            state.asnumpy()
        outs = [self.cell(emb[word + k:word + k + 1], state) for k in range(count)]
        same = [self.cell(emb[word:word + 1], state) for _ in range(count)]
        return F.concat(*(outs + same), dim=0)


@pytest.mark.parametrize("read", [False, True])
def test_a_non_broadcasting_call_on_a_state_every_member_reads_equals_eager(read):
    model = make_model(SharedState, read=read)
    emb = nd.random.uniform(-1, 1, shape=(10, 3))
    check_all_strategies(model, [(1, 2), (3, 3), (0, 1)], [emb], strategies=("depth",))


class RowsOfATable(gdb.DynBatchBlock):
    """A sample's rows of a table (its own count of them), an unused sum of them
    and a reshaped row (``form``), and their mean: frames whose first read of
    the rows comes from a sum the fast arithmetic path leaves to the slow one."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form

    def hybrid_forward(self, F, rows, table):
        a = table[0:rows]
        lead = (a[0] * 2).reshape((1, -1))
        if self.form == "add":
            _ = a + lead
        elif self.form == "mul":
            _ = a * lead
        elif self.form == "rows":
            _ = a + (a[0:1] * 2).reshape((1, -1))
        return F.mean(a, axis=0, keepdims=True) * 3.0


@pytest.mark.parametrize("form", ["add", "mul", "rows"])
def test_a_value_first_read_by_a_sum_keeps_its_row_count_in_the_template(form):
    """Samples with other row counts than the first template's, in later scopes,
    get their own template: the mean divides by their own count."""
    model = RowsOfATable(form)
    model.initialize()
    table = nd.random.uniform(-1, 1, shape=(6, 4))
    table.attach_grad()
    for counts in ([3, 3], [2, 4, 1], [4, 2, 3]):
        runs = []
        for batched in (False, True):
            with mx.autograd.record():
                if batched:
                    with gdb.batching():
                        outs = [model(rows, table) for rows in counts]
                else:
                    outs = [model(rows, table) for rows in counts]
                loss = nd.add_n(*[(o * o).sum() for o in outs])
            loss.backward()
            runs.append(([o.asnumpy() for o in outs], table.grad.asnumpy().copy()))
        (want, want_grad), (got, got_grad) = runs
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)


class ZerosCarried(gdb.DynBatchBlock):
    """A sum carried over a loop that starts as zeros plus zeros (a DNC's usage)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=2)

    def hybrid_forward(self, F, xs):
        usage, written = F.zeros((1, 3)), F.zeros((1, 3))
        outs = []
        for x in xs:
            usage = usage + written
            written = self.dense(x) + usage
            outs.append(written)
        return F.concat(*outs, dim=0)


@pytest.mark.parametrize("compiled", MODES)
def test_a_loop_sum_that_starts_as_zeros_plus_zeros_equals_eager(compiled):
    model = make_model(ZerosCarried)
    r = np.random.RandomState(1)
    for lengths in ([3, 2, 1], [1, 4, 2]):
        samples = [[nd.array(r.randn(1, 2)) for _ in range(n)] for n in lengths]
        eager = run_model(model, samples, [], "eager")
        assert_same(run_model(model, samples, [], "depth", compiled), eager)


def _encode_through_a_function(model, table, tree):
    """A module-level helper recursing over the children: one call of the block
    records the whole tree, each child's loop nested in its parent's."""
    h = model.leaf(table[tree.word:tree.word + 1])
    for child in tree.children:
        h = h + model.merge(_encode_through_a_function(model, table, child))
    return nd.tanh(h)


class FunctionRecursion(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.leaf = gluon.nn.Dense(4)
            self.merge = gluon.nn.Dense(4, use_bias=False)

    def hybrid_forward(self, F, tree, table):
        return _encode_through_a_function(self, table, tree)


def _chain(depth, offset=0):
    tree = Tree((offset + depth) % 9)
    for level in range(depth - 1):
        tree = Tree((offset + level) % 9, [tree])
    return tree


def test_loops_nested_by_a_recursive_function_are_named_in_constant_size(monkeypatch):
    """The name of a loop held the names of the loops around it, twice over: each
    level of a recursion through a helper function doubled it, and recording a
    chain of depth 20 took 15 s (depth 60 never ended).  Outputs equal eager's
    down to depth 60."""
    from gluon_dynbatch.record import sites
    named = []
    original = sites.iterations

    def noting(*args):
        found = original(*args)
        named.extend(loop for where in found for loop, _ in where)
        return found
    monkeypatch.setattr(sites, "iterations", noting)
    model = FunctionRecursion()
    model.initialize(mx.init.Uniform(0.5))
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (9, 3)))
    for depth in (12, 60):
        trees = [_chain(depth, k) for k in range(3)]
        want = [model(tree, table).asnumpy() for tree in trees]
        with gdb.batching():
            outs = [model(tree, table) for tree in trees]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)
        assert named and all(type(loop) is int for loop in named)


class GoldPathScore(gdb.DynBatchBlock):
    """A recurrence over a sentence, scores per token, then the score of the
    sample's own gold subset of tokens (a CRF's or a segmenter's gold path):
    the calls after the shared computation differ from sample to sample."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.step = gluon.nn.Dense(4, in_units=8)
            self.score = gluon.nn.Dense(1, in_units=4)

    def hybrid_forward(self, F, sample, table):
        words, gold = sample
        h = F.zeros((1, 4))
        scores = []
        for w in words:
            h = F.tanh(self.step(F.concat(table[w:w + 1], h, dim=1)))
            scores.append(self.score(h))
        total = F.log(F.sum(F.exp(F.concat(*scores, dim=1))))
        return total - sum(scores[t] for t in gold)


def _gold_samples(r, n, length=8):
    return [([r.randrange(6) for _ in range(length)],
             sorted(r.sample(range(length), r.randint(1, 4)))) for _ in range(n)]


def test_calls_parting_after_a_long_shared_computation_learn_a_short_segment(monkeypatch):
    """Each sample's gold subset made a trie path, and a recipe of the whole
    computation (hundreds of calls analysed), per sample in every batch; the
    state where the paths part is now a cut point: later batches make recipes
    of the short parts after it only, and every result equals eager."""
    from gluon_dynbatch import scope as scope_module
    from gluon_dynbatch.record import frames
    made = []
    real = scope_module.recipe_for

    def counting(frame, positions):
        made.append(frame.state.depth)
        return real(frame, positions)
    monkeypatch.setattr(scope_module, "recipe_for", counting)
    model = make_model(GoldPathScore)
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (6, 4)))
    r = rng(1)
    for _ in range(4):
        samples = _gold_samples(r, 12)
        del made[:]
        assert_same(run_model(model, samples, [table], "depth"),
                    run_model(model, samples, [table], "eager"))
    assert max(made, default=0) < frames.CUT_DEPTH
    check_all_strategies(model, _gold_samples(r, 6), [table])


class CutThenOwnInput(gdb.DynBatchBlock):
    """40 calls every sample shares, then a sample's own input of its own shape."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x, y):
        h = x
        for _ in range(20):
            h = F.tanh(self.dense(h))
        return F.sum(F.tanh(y)) + F.sum(h)


@pytest.mark.parametrize("options", [{}, {"compiled": True}, {"compiled": "step"}], ids=str)
def test_a_call_reaching_a_cut_point_keys_its_outside_arrays_by_shape(options):
    """The call met at a cut point had read the sample's own array at a position
    before the cut, then was keyed again after it by that position alone: every
    sample replayed the first one's shape (values silently wrong, in this scope
    and the next)."""
    model = make_model(CutThenOwnInput)
    rs = np.random.RandomState(0)
    x = nd.array(rs.uniform(-1, 1, (1, 4)))
    ys = [nd.array(rs.uniform(-1, 1, (k, 4))) for k in (2, 3, 4, 5, 2, 3, 1)]
    eager = [model(x, y).asnumpy() for y in ys]
    for _ in range(2):
        with gdb.batching(**options):
            outs = [model(x, y) for y in ys]
        for got, want in zip(outs, eager):
            np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)


class GoldThenReads(gdb.DynBatchBlock):
    """Paths that part at a sample's own gold steps, then reads that make samples wait."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.step = gluon.nn.Dense(4, in_units=4)
            self.out = gluon.nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x, gold):
        h, hs = x, []
        for _ in range(20):
            h = F.tanh(self.step(h))
            hs.append(h)
        out = sum(F.sum(hs[t]) for t in gold)
        steps = 0
        while float(F.sum(h).asscalar()) > -2 and steps < 2:
            h = F.tanh(self.out(h)) - 0.3
            steps += 1
        return out + F.sum(h)


@pytest.mark.parametrize("options", [{}, {"compiled": "step"}, "map"], ids=str)
def test_samples_waiting_past_a_state_that_becomes_a_cut_point_finish_as_eagerly(options):
    """A sample made a state a cut point while others waited at reads on paths
    past it: those paths were dropped, and the waiting samples' frames went
    on from states without a segment start (IndexError, AttributeError)."""
    model = make_model(GoldThenReads)
    rs = np.random.RandomState(0)
    golds = [[0], [1, 2], [3], [4, 5, 6], [7], [2, 9]]
    xs = [nd.array(rs.uniform(-1, 1, (1, 4))) for _ in golds]
    eager = [model(x, g).asnumpy() for x, g in zip(xs, golds)]
    for _ in range(3):
        if options == "map":
            with gdb.batching():
                outs = gdb.map(lambda pair: model(*pair), list(zip(xs, golds)))
        else:
            with gdb.batching(**options):
                outs = [model(x, g) for x, g in zip(xs, golds)]
        for got, want in zip(outs, eager):
            np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)
