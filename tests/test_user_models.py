"""Models written the way users write them, batched, equal eager Gluon.

Every case of ``user_models.CASES`` runs eagerly and under every strategy
("depth", "agenda") and execution mode (imperative, one CachedOp per plan,
one per step); outputs and the gradients of every Parameter and shared input
must agree to float32 rounding.  Further tests check what users rely on:
lists the model appends to, values kept across batches, Gluon's recurrent
cells and embedding lookups batched.
"""
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

import gluon_dynbatch as gdb
from gluon_dynbatch.record import trie
import user_models as um
from dynbatch_testing import (assert_same, check_all_strategies, make_model, random_tree,
                              run_model)

MODES = [(strategy, compiled) for strategy in ("depth", "agenda")
         for compiled in (False, True, "step")]
MODE_IDS = ["%s-%s" % (s, {False: "imperative", True: "plan", "step": "step"}[c])
            for s, c in MODES]


def _batching(mode):
    strategy, compiled = mode
    return {"strategy": strategy, "compiled": compiled}


def _check(case, mode, train_mode=True):
    """Eager and batched runs of ``case`` agree; returns the batched result."""
    eager = um.run_case(case, train_mode=train_mode)
    assert any(np.abs(g).max() > 0 for g in eager[1].values())
    batched = um.run_case(case, _batching(mode), train_mode=train_mode)
    assert_same(batched, eager)
    assert batched[2].samples == len(case.samples)
    return batched


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("name", sorted(um.CASES))
def test_user_model_equals_eager(name, mode):
    _check(um.CASES[name](), mode)


# --------------------------------------------------------------------------
# What the generic comparison does not see
# --------------------------------------------------------------------------

def test_each_sample_list_gets_one_loss_per_node():
    case = um.case_node_losses()
    with gdb.batching():
        lists = case.outputs()
    assert [len(losses) for losses in lists] == [len(list(t.nodes())) for t in case.samples]
    assert all(loss.shape == (1, 1) for losses in lists for loss in losses)


def test_dict_returns_keep_their_keys_and_python_values():
    case = um.case_dict_returns()
    with gdb.batching():
        outs = case.outputs()
    for tree, out in zip(case.samples, outs):
        assert set(out) == {"h", "c", "nodes"}
        assert out["nodes"] == len(list(tree.nodes()))
        assert out["h"].shape == out["c"].shape == (1, um.HIDDEN)


def _paths(node):
    return 1 + sum(_paths(child) for child in node.children)


def _distinct(node, seen=None):
    seen = set() if seen is None else seen
    if id(node) not in seen:
        seen.add(id(node))
        for child in node.children:
            _distinct(child, seen)
    return len(seen)


def test_dag_case_shares_subtrees_and_memo_runs_each_node_once():
    case = um.case_dag_memo()
    assert any(_paths(d) > _distinct(d) for d in case.samples)
    calls = []
    hook = case.model.inp.register_forward_hook(lambda block, args, out: calls.append(1))
    case.outputs()
    hook.detach()
    assert len(calls) == sum(_distinct(d) for d in case.samples)
    with gdb.batching() as scope:
        outs = case.outputs()
    assert outs[0].shape == (1, um.HIDDEN)
    assert scope.stats.flushes == 1


def _per_sample(branches, samples):
    """The branches taken, sample by sample, each in the order its nodes took them."""
    owner = {id(node): k for k, tree in enumerate(samples) for node in tree.nodes()}
    found = [[] for _ in samples]
    for node, up in branches:
        found[owner[id(node)]].append((id(node), up))
    return found


def test_mid_sample_reads_take_both_branches_as_eager_does():
    case = um.case_mid_sample_reads()
    case.outputs()
    eager = _per_sample(case.model.branches, case.samples)
    assert {up for sample in eager for _, up in sample} == {True, False}
    case.model.branches.clear()
    with gdb.batching() as scope:
        case.outputs()
    # Each sample's own decisions, in its own order; samples interleave.
    assert _per_sample(case.model.branches, case.samples) == eager
    # A flush per read of the sample that reads most (each node reads once, one
    # after the other), and one more: not one per read.  In the model's first
    # scope, its first call runs to its end alone (what it returns is learned
    # there), a flush per read of its own.
    longest = max(len(list(tree.nodes())) for tree in case.samples)
    first = len(list(case.samples[0].nodes()))
    assert scope.stats.flushes <= first + longest + 1
    with gdb.batching() as scope:
        case.outputs()
    assert scope.stats.flushes <= longest + 1 < scope.stats.reads


def test_hybridized_child_stays_hybridized():
    case = um.case_mixed_children()
    _check(case, ("depth", False))
    assert case.model.scorer._active      # pylint: disable=protected-access


def _plan_ops(case):
    """Operator names of the steps of one batched run of ``case`` (plan kept)."""
    with autograd.record():
        with gdb.batching(keep_plan=True) as scope:
            outputs = case.outputs()
    assert outputs
    return [(step.nodes[0].op.name, len(step.nodes)) for step in scope.last_plan.steps]


def test_stack_of_children_on_axis_0_batches_as_rows():
    case = um.case_mean_pool_tree(n=12)
    _check(case, ("depth", False))
    ops = _plan_ops(case)
    assert not any(name == "stack" for name, _ in ops)
    assert len(ops) < sum(len(list(t.nodes())) for t in case.samples) / 4


def test_gluon_loss_per_node_batches():
    case = um.case_node_loss_tree(n=12)
    ops = _plan_ops(case)
    # Its per-sample mean (``mean(axis=0, exclude=True)``) batches row by row.
    assert not any(name == "mean" for name, _ in ops)
    # ``total = 0`` then ``total = total + loss`` over the children is a sum,
    # not a chain of iterations: a tree node is one program, one step a level.
    assert len(ops) <= 2 * max(t.height() for t in case.samples)


def test_f_array_literals_are_one_array_per_dtype_and_flush(monkeypatch):
    made = []
    real = nd.array

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    class Literals(gdb.DynBatchBlock):
        def hybrid_forward(self, F, k):
            ints = F.array([k, k + 1], dtype="int32")
            rows = F.array(np.full((2, 3), k, dtype=np.float64))
            return F.array([k]) * 2, ints, rows, F.array([[k, -k]]) + rows[:1, :2]

    model = Literals()
    monkeypatch.setattr(nd, "array", counting)
    with gdb.batching():
        first = [model(k) for k in range(10)]
        read = first[3][0].asnumpy()         # runs what is pending
        second = [model(k) for k in range(10, 20)]
    # Per flush, one array per dtype and row shape (4) and the gathers'
    # indices; made one by one, the 20 samples' literals would be 80.
    assert len(made) <= 2 * 6
    assert read.tolist() == [6.0]
    for k, (scaled, ints, rows, mixed) in enumerate(first + second):
        assert scaled.dtype == np.float32 and scaled.asnumpy().tolist() == [2.0 * k]
        assert ints.dtype == np.int32 and ints.asnumpy().tolist() == [k, k + 1]
        assert rows.dtype == np.float32 and rows.asnumpy().tolist() == [[k] * 3] * 2
        assert mixed.asnumpy().tolist() == [[2.0 * k, 0.0]]


class _LiteralChild(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        return self.dense(x) * F.array([[1.0, 2.0, 3.0, 4.0]]) + F.array([0.5])


class _LiteralTree(gdb.DynBatchBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.child = _LiteralChild()
            self.embed = nn.Embedding(10, 4)

    def hybrid_forward(self, F, tree, table):
        h = table[tree.word:tree.word + 1]
        for child in tree.children:
            h = h + self(child, table)
        return F.tanh(self.child(h)) + self.embed(F.array([tree.word]))


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_literals_in_a_replayed_child_block_stay_right_across_scopes(mode):
    r = random.Random(5)
    model = um._init(_LiteralTree(), 5)
    table = um._table(5, vocab=10, dim=4)
    for _ in range(3):                      # later scopes replay the child's template
        case = um.Case(model, [random_tree(r, 10) for _ in range(5)], [table])
        _check(case, mode)


def test_a_step_function_called_per_token_is_one_part_per_token():
    case = um.case_helper_rnn(n=8)
    stats = _check(case, ("depth", False))[2]
    # Operators inside one call of the helper are one iteration, not one each.
    assert stats.steps <= max(len(s) for s in case.samples) + 1


def _three_scopes(case):
    """Stats of three batched runs of ``case``, each checked against eager."""
    eager = um.run_case(case)
    stats = []
    for _ in range(3):
        batched = um.run_case(case, {})
        assert_same(batched, eager)
        stats.append(batched[2])
    return stats


def test_a_model_whose_programs_batch_with_nothing_is_recorded_op_by_op(caplog):
    case = um.case_message_passing(n=24)        # a graph of its own in every sample
    with caplog.at_level("INFO", logger="gluon_dynbatch.record"):
        first, _, third = _three_scopes(case)
    assert third.mean_batch_size >= 3 * first.mean_batch_size
    assert third.steps <= 12                    # the sums over neighbours: a step a round
    assert "MessagePassing: calls take a new path" in caplog.text


def test_the_switch_to_operators_comes_inside_the_first_scope_when_every_call_is_new():
    # 64 graphs, most of a structure of their own: after 48 calls that each
    # made a new program, the rest of the scope is recorded operator by operator.
    case = um.case_message_passing(n=64)
    eager = um.run_case(case)
    first = um.run_case(case, {})
    assert_same(first, eager)
    assert first[2].nodes > first[2].samples    # part programs, part operators
    second = um.run_case(case, {})
    assert_same(second, eager)
    assert second[2].mean_batch_size >= 3 * first[2].mean_batch_size


def test_the_switch_to_operators_also_comes_when_the_first_scope_shapes_the_parameters():
    # Initialised but never run: the first scope records before the layers
    # have shapes, so its template trie differs from the later scopes'.
    case = um.case_message_passing(n=24)
    stats = []
    for _ in range(3):
        batched = um.run_case(case, {})
        stats.append(batched[2])
    assert stats[2].mean_batch_size >= 3 * stats[0].mean_batch_size
    assert_same(batched, um.run_case(case))


def test_models_whose_programs_batch_keep_them():
    for case in (um.case_lstm_cell(n=24), um.case_opbyop_child_sum(n=24)):
        first, _, third = _three_scopes(case)
        assert third.nodes == first.nodes and third.nodes < third.calls / 2


@pytest.mark.slow
def test_lstm_cell_every_length_from_1_to_130():
    r = random.Random(0)
    sentences = [[r.randrange(um.VOCAB) for _ in range(n)] for n in range(1, 131)]
    model = um._init(um.GluonCellTagger("lstm", hidden=2, outputs="last"), 0)
    _check(um.Case(model, sentences, [um._table(0)]), ("depth", False))


def test_raw_lstm_lengths_1_to_40():
    r = random.Random(1)
    sentences = [[r.randrange(um.VOCAB) for _ in range(n)] for n in range(1, 41)]
    r.shuffle(sentences)
    model = um._init(um.RawLSTM(hidden=2), 1)
    _check(um.Case(model, sentences, [um._table(1)]), ("agenda", "step"))


# --------------------------------------------------------------------------
# Dropout
# --------------------------------------------------------------------------

def _dropout_case(rate, n=40):
    r = random.Random(3)
    return um.Case(um._init(um.DropoutModel(rate), 3),
                   [r.randrange(um.VOCAB) for _ in range(n)], [um._table(3)])


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_dropout_outside_training_is_the_identity_as_in_eager(mode):
    batched = _check(_dropout_case(0.5, n=6), mode, train_mode=False)
    values = batched[0]
    for y, z in zip(values[0::3], values[1::3]):
        np.testing.assert_array_equal(z, y)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_dropout_in_training_masks_scales_and_backpropagates(mode):
    """Random masks cannot equal eager's; everything else about them can.

    Each sample's output is its input scaled by 1 / (1 - p) where kept and 0
    where dropped; about p of the units are dropped; samples get masks of
    their own; and the gradients equal an eager run given those same masks.
    """
    rate = 0.5
    case = _dropout_case(rate)
    values, grads, _ = um.run_case(case, _batching(mode))
    ys, zs = values[0::3], values[1::3]
    masks = []
    for y, z in zip(ys, zs):
        assert z.shape == y.shape == (1, um.HIDDEN) and np.isfinite(z).all()
        kept = z != 0
        np.testing.assert_allclose(z[kept], y[kept] / (1 - rate), rtol=1e-6)
        masks.append(kept.astype(np.float32))
    dropped = 1 - np.mean(masks)
    assert 0.3 < dropped < 0.7, dropped
    assert len({m.tobytes() for m in masks}) > len(masks) // 2
    assert np.abs(grads[case.model.proj.weight.name]).max() > 0     # flows through dropout
    fixed = um.Case(case.model, [(w, nd.array(m)) for w, m in zip(case.samples, masks)],
                    case.inputs, call=lambda model, s, shared: model(s[0], *shared, s[1]))
    assert_same((values, grads, None), um.run_case(fixed))


# --------------------------------------------------------------------------
# Lists, values kept across batches, Gluon's recurrent cells, embedding lookups
# --------------------------------------------------------------------------

def _emb():
    return um._table(5)


def test_one_list_shared_by_all_samples_collects_every_node_loss():
    case = um.case_node_losses()

    def run(batched):
        losses = []
        with autograd.record():
            if batched:
                with gdb.batching():
                    for tree in case.samples:
                        case.model(tree, *case.inputs, losses)
            else:
                for tree in case.samples:
                    case.model(tree, *case.inputs, losses)
            total = sum(losses)
        total.backward()
        grads = {n: p.grad().asnumpy().copy() for n, p in case.model.collect_params().items()}
        return [loss.asnumpy() for loss in losses], grads, None

    eager = run(False)
    assert len(eager[0]) == sum(len(list(t.nodes())) for t in case.samples)
    batched = run(True)
    assert len(batched[0]) == len(eager[0]), "%d of %d node losses" % (
        len(batched[0]), len(eager[0]))
    assert_same(batched, eager)


def test_value_memoised_across_batches():
    emb = _emb()

    def two_batches(model, batching):
        model.memo.clear()
        for words in ([1, 2, 3], [2, 3, 4]):
            result = um.run_case(um.Case(model, words, [emb]), batching)
        return result

    model = um._init(um.CrossBatchMemo(), 0)
    eager = two_batches(model, None)
    assert_same(two_batches(model, {}), eager)


@pytest.mark.parametrize("name", ["lstm_cell", "gru_cell"])
def test_gluon_rnn_cells_batch_in_one_flush(name):
    case = um.CASES[name]()
    with gdb.batching() as scope:
        outs = case.outputs()
    assert len(outs) == len(case.samples)
    assert scope.stats.flushes == 1, str(scope.stats)
    assert scope.stats.mean_batch_size > 1, str(scope.stats)


def test_embedding_lookups_batch():
    case = um.case_embedding()
    with gdb.batching(keep_plan=True) as scope:
        outs = case.outputs()
    assert len(outs) == len(case.samples)
    sizes = [len(step.nodes) for step in scope.last_plan.steps]
    longest = max(len(s) for s in case.samples)
    # Token t of every sentence runs in one step (lookups included): steps
    # follow the longest sentence, not the number of lookups.
    assert len(sizes) <= longest + 2, sizes
    assert max(sizes) >= len(case.samples), sizes


@pytest.mark.parametrize("name", ["unroll", "unroll_merged"])
def test_unroll_batches_without_reading_values(name):
    stats = _check(um.CASES[name](), ("depth", False))[2]
    assert stats.reads == 0 and stats.eager_samples == 0 and stats.flushes == 1
    assert stats.mean_batch_size > 1


def _second_scope(case):
    """Outputs and scope (plan kept) of a second batched run of ``case`` (the first
    gives deferred parameters their shapes)."""
    case.outputs()
    with gdb.batching(keep_plan=True) as scope:
        outs = case.outputs()
    return outs, scope


@pytest.mark.parametrize("name", ["fused_lstm", "fused_bigru"])
def test_fused_rnn_layer_runs_once_for_sentences_of_every_length(name):
    # Each sentence padded after its end to the longest (both directions too).
    case = um.CASES[name](n=8)
    outs, scope = _second_scope(case)
    steps = [s for s in scope.last_plan.steps if s.nodes[0].op.name == "RNN"]
    lengths = {len(words) for words in case.samples}
    assert len(lengths) > 1
    assert len(steps) == 1
    assert sum(len(s.nodes) for s in steps) == len(case.samples)
    # The weights are flattened and concatenated once for every sample.
    concats = [n for s in scope.last_plan.steps for n in s.nodes
               if n.op.name == "_rnn_param_concat"]
    assert len(concats) == 1
    assert all(o.shape == (1, um.CLASSES) for o in outs)


def test_gluon_loss_blocks_batch_across_sentences():
    case = um.CASES["gluon_losses"](n=8)
    outs, scope = _second_scope(case)
    assert all(o.shape == (1,) for o in outs)
    # No operator of the losses runs once per sentence.
    alone = [s for s in scope.last_plan.steps if len(s.nodes) == 1
             and s.nodes[0].op.name in ("reshape_like", "abs", "square")]
    assert not alone


def test_character_steps_of_every_word_batch_together():
    case = um.CASES["char_word"](n=12)
    outs, scope = _second_scope(case)
    assert all(o.shape == (1,) for o in outs)
    # Character c of every word of every sentence is one program call (cut
    # at the word only, each word's characters would be one program per
    # spelling: 1.7 calls a step in this case instead of 7.4).
    longest = max(sum(len(word) + 1 for word in sentence) for sentence in case.samples)
    assert len(scope.last_plan.steps) <= longest + 2
    assert scope.stats.mean_batch_size >= 5


def test_weights_read_with_data_and_one_row_parameters_stay_in_programs():
    case = um.CASES["weight_data"](n=12)
    outs, scope = _second_scope(case)
    assert outs
    # One program per node kind and level: the trees are at most 4 levels deep.
    assert all(s.nodes[0].op.name.startswith("call:") for s in scope.last_plan.steps)
    assert len(scope.last_plan.steps) <= 4
    params = {src.param.name for s in scope.last_plan.steps for n in s.nodes
              for src, _ in n.inputs if src.param is not None}
    assert any(name.endswith("dense0_weight") for name in params)
    assert any(name.endswith("scale") for name in params)


def test_vector_code_batches_like_row_code():
    # F.dot(W, x) of 1-d vectors, a (4H,) bias and F.split along axis 0:
    # programs of every node at each level, never a call per node.
    case = um.CASES["vector_tree"](n=12)
    outs, scope = _second_scope(case)
    assert all(h.shape == c.shape == (um.HIDDEN,) for h, c in outs)
    steps = scope.last_plan.steps
    assert all(s.nodes[0].op.name.startswith("call:") for s in steps)
    levels = max(tree.height() for tree in case.samples) + 1
    assert len(steps) <= 2 * levels
    vector = um.CASES["vector_rnn"](n=12)
    outs, scope = _second_scope(vector)
    # One program per token (the bias, x and h products inside it), one for the scores.
    assert len(scope.last_plan.steps) <= max(map(len, vector.samples)) + 2


def test_recursive_helper_methods_record_a_frame_per_call():
    # encode() and decode() recurse by name, not through self(...): each call is
    # still one program node, so trees of every shape batch node by node.
    case = um.CASES["top_down"](n=12)
    outs, scope = _second_scope(case)
    assert all(o.shape == (1,) for o in outs)
    tree_nodes = sum(len(list(tree.nodes())) for tree in case.samples)
    assert scope.stats.planned_nodes <= 3 * tree_nodes
    assert scope.stats.mean_batch_size >= 8      # 2 with the whole tree one frame


def test_which_methods_are_recursive_helpers():
    from gluon_dynbatch.record.recursion import recursive_helpers

    def walk(self, F, node):
        return [walk(self, F, c) for c in node.children] and self.walk(F, node)

    def leaf(self, F, x):
        return F.tanh(x)

    def no_f(self, node):               # recursive without F: a helper too
        return self.no_f(node)

    def once(self, node):
        return node

    def node(self, F, tree):            # node -> kids -> node
        return self.kids(F, tree) and self.leaf(F, tree)

    def kids(self, F, tree):
        return [self.node(F, c) for c in tree.children]

    def visit(self, F, tree):            # a generator: its body runs after the call
        yield tree
        for child in tree.children:
            yield from self.visit(F, child)

    found = recursive_helpers({"walk": walk, "leaf": leaf, "no_f": no_f, "hybrid_forward": walk,
                               "node": node, "kids": kids, "visit": visit, "once": once})
    assert found == {"walk", "node", "kids", "no_f"}  # by name, also inside comprehensions
    assert um.TopDownTree.encode.__wrapped__ is not um.TopDownTree.encode


@pytest.mark.parametrize("name", ["closure_tree", "method_tree"])
def test_recursion_through_a_nested_function_or_a_method_records_a_frame_per_call(name):
    # A closure made anew by each hybrid_forward call, or a method without F:
    # their recursive calls are frames, so trees of every shape batch node by node.
    case = um.CASES[name](n=12)
    outs, scope = _second_scope(case)
    assert all(o.shape == (1, um.CLASSES) for o in outs)
    tree_nodes = sum(len(list(tree.nodes())) for tree in case.samples)
    assert scope.stats.planned_nodes <= 2 * tree_nodes
    assert scope.stats.mean_batch_size >= 8      # 3 with the whole tree one frame
    assert sys.gettrace() is None


def test_nested_functions_are_left_alone_under_another_tracer():
    def tracer(frame, event, arg):
        return None

    case = um.CASES["closure_tree"]()
    eager = um.run_case(case)
    sys.settrace(tracer)
    try:
        batched = um.run_case(case, {})
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
    assert_same(batched, eager)
    assert batched[2].samples == len(case.samples)


def test_which_nested_functions_are_recursive_closures():
    from gluon_dynbatch.record.recursion import recursive_closures

    def hybrid_forward(self, F, tree):
        def encode(node):                   # by its own name, in a comprehension
            return [encode(c) for c in node.children]

        def once(node):
            return node

        def visit(node):                    # a generator: its body runs after the call
            yield node
            for child in node.children:
                yield from visit(child)
        return encode(tree), once(tree), list(visit(tree))

    found = recursive_closures(hybrid_forward)
    assert {code.co_name for code in found} == {"encode"}


def test_a_crf_forward_step_is_one_program_per_token():
    # F.transpose of the (1, C) scores is recorded as a reshape and the (C, C)
    # transitions are one block for every call: the step batches row by row.
    case = um.CASES["crf"](n=12)
    outs, scope = _second_scope(case)
    assert all(o.shape == (1,) for o in outs)
    longest = max(len(sentence) for sentence in case.samples)
    assert scope.stats.steps <= 4 * longest       # 11 a token operator by operator
    forward = [s for s in scope.last_plan.steps if s.nodes[0].op.path is None
               and {"max", "sum", "log"} <= {e.op.name for e in s.nodes[0].op.entries}]
    assert len(forward) >= longest - 2


def _depth(tree):
    return 1 + max((_depth(child) for child in tree.children), default=0)


def test_zero_gradient_operators_and_several_terms_per_child_make_one_program():
    # one_hot(argmax(...)), a comparison, detach() and stop_gradient, and
    # x = x + a + b + ... per child: one program for nodes of any child count.
    case = um.CASES["feedback"](n=12)
    outs, scope = _second_scope(case)
    assert scope.stats.reads == 0
    depth = max(_depth(tree) for tree in case.samples)
    assert scope.stats.steps <= 2 * depth + 2


def test_softmax_cross_entropy_of_each_token_batches():
    case = um.CASES["cross_entropy"](n=12)
    outs, scope = _second_scope(case)
    assert all(o.shape == (1,) for o in outs)
    alone = [s for s in scope.last_plan.steps if s.nodes[0].op.name == "softmax_cross_entropy"
             and len(s.nodes) == 1]
    # Alone only at token positions that one sentence reaches.
    lengths = [len(sentence) for sentence in case.samples]
    lonely = sum(1 for t in range(max(lengths)) if sum(n > t for n in lengths) == 1)
    assert len(alone) <= lonely


def test_per_call_numbers_and_stack_reshapes_share_one_program():
    # x / len(kids) and F.stack(*kids) (a reshape to (len(kids), 1, H)) differ per
    # node, yet nodes of one level are one program step whatever their arity.
    case = um.CASES["mean_pool_tree"](n=16)
    outs, scope = _second_scope(case)
    assert outs
    steps = scope.last_plan.steps
    levels = max(tree.height() for tree in case.samples) + 1
    assert len(steps) <= levels + 1
    uids = {s.nodes[0].op.uid for s in steps}
    assert len(uids) <= 2           # the leaves' program and the inner nodes'


@pytest.mark.parametrize("name", ["concat_children", "scored_children"])
def test_values_of_each_child_concatenated_share_one_program(name):
    # F.concat(*[f(h) for h in kids], dim=0) is the stacked output of the calls
    # grouped over the children (vectorize.py): one program for every arity.
    case = um.CASES[name](n=16)
    outs, scope = _second_scope(case)
    assert outs
    steps = scope.last_plan.steps
    arities = {len(node.children) for tree in case.samples for node in tree.nodes()}
    assert len(arities - {0}) > 1
    assert len(steps) <= max(tree.height() for tree in case.samples) + 1
    assert len({s.nodes[0].op.uid for s in steps}) <= 2


@pytest.mark.parametrize("name", ["method_tree", "closure_tree", "top_down"])
def test_calls_of_recursive_helpers_count_towards_the_switch_to_operators(name):
    # Without its calls counted, a helper's new programs alone (48 of them over
    # a long training) would switch it to operators however well they batch.
    trie.store().usages.clear()
    um.run_case(um.CASES[name](n=16), {})
    usages = list(trie.store().usages.values())
    assert usages and all(u.frames >= u.fresh > 0 for u in usages if u.fresh)
    assert all(u.frames > 0 for u in usages)


def test_attention_over_outputs_stacked_on_axis_1_is_not_per_length():
    # batch_dot scores, a mask, a softmax and a sum along axis 1 run on the
    # stacked rows (columns.py): a step per token position and one for the rest.
    case = um.CASES["stacked_attention"](n=16)
    outs, scope = _second_scope(case)
    assert all(o.shape == (1, um.CLASSES) for o in outs)
    names = [s.nodes[0].op.name for s in scope.last_plan.steps]
    assert "batch_dot" not in names
    assert len(names) <= max(len(words) for words in case.samples) + 3, names


def test_words_memoised_across_samples_keep_batching():
    """A word's vector memoised in a dict by one sample and read by later ones
    is computed before that sample's recurrence goes on, so the samples
    reading it do not wait for it: steps stay near the longest sentence."""
    case = um.case_memo_words(seed=3, n=16)
    longest = max(len(words) for words in case.samples)
    for _ in range(3):          # templates learned, then replayed
        stats = um.run_case(case, {})[2]
        assert stats.steps <= longest + 6


def test_a_scope_with_reads_collects_its_parameters_once(monkeypatch):
    """Each flush at a read starts a new graph; the model's parameters are
    looked up once per scope, not once per graph, and without Gluon's scan of
    list attributes (this model logs every branch it takes into a list)."""
    from gluon_dynbatch.record import trie
    case = um.case_mid_sample_reads(n=6)
    case.model.branches.extend([(None, True)] * 1000)
    original = trie.parameters
    owners, scans = [], []
    monkeypatch.setattr(trie, "parameters",
                        lambda block: owners.append(block) or original(block))
    monkeypatch.setattr(gluon.Block, "_check_container_with_block",
                        lambda self: scans.append(self))
    with gdb.batching() as scope:
        outs = case.outputs()
    assert scope.stats.flushes >= 4
    assert 1 <= sum(owner is case.model for owner in owners) <= 2 and not scans
    monkeypatch.undo()
    for out, want in zip(outs, [case.model(s, *case.inputs) for s in case.samples]):
        np.testing.assert_allclose(out.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)


def test_repeat_batch_script_reports_first_and_last_repeat():
    """scripts/repeat_batch.py: a memoising model's repeated batch keeps its steps."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import repeat_batch
    rows = repeat_batch.main(["--cases", "memo_words", "--repeats", "3", "--samples", "6",
                              "--hidden", "8"])
    assert [r["repeat"] for r in rows] == [1, 3]
    assert rows[0]["steps"] == rows[1]["steps"] and rows[1]["x_eager"] > 0


def _usage_of(model):
    return trie.store().usages[(id(model), None)]


def test_calls_that_keep_learning_are_tried_operator_by_operator():
    """A graph convolution written vertex by vertex takes a path of its own in
    every sample: its block is tried both ways for a few flushes and keeps the
    faster one (measured); every batch, trial or not, equals eager."""
    from gluon_dynbatch.record import usage as usage_rules
    case = um.case_graph_conv(seed=0, n=12)
    usage = None
    for k in range(usage_rules.LEARNING_WARMUP + usage_rules.LEARNING_STRIKES
                   + usage_rules.LEARNING_TRIAL + 2):
        batch = um.Case(case.model, um.case_graph_conv(seed=100 + k, n=12).samples,
                        case.inputs)
        assert_same(um.run_case(batch, {}), um.run_case(batch, None))
        usage = _usage_of(case.model)
    assert usage.trial_ms is not None
    assert usage.watch == "done" or usage.watch["trials"] >= 1
    by_op, by_frame = usage.trial_ms
    assert usage.irregular == (by_op < usage_rules.LEARNING_GAIN * by_frame)


class _BranchedPath(gdb.DynBatchBlock):
    """A hierarchical softmax whose code bit picks a branch (``score if bit else
    -score``): a template path per combination of bits, learned in most samples."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, bits, x):
        h, loss = self.dense(x), 0
        for bit in bits:
            h = F.tanh(self.dense(h))
            score = F.sum(h, axis=1)
            loss = loss - F.log(F.sigmoid(score if bit else -score))
        return loss


def _branched_path_batches(scopes):
    """Batches of new bit paths through ``_BranchedPath``, each run in ``scopes``
    scopes in a row (each equal to eager), enough for a trial; the block's Usage."""
    from gluon_dynbatch.record import usage as usage_rules
    model = _BranchedPath()
    model.initialize()
    x = nd.array(np.linspace(-1, 1, 4).reshape(1, 4))
    rng = random.Random(0)
    for _ in range(usage_rules.LEARNING_WARMUP + usage_rules.LEARNING_STRIKES
                   + usage_rules.LEARNING_TRIAL + 2):
        bits = [[rng.randrange(2) for _ in range(rng.randint(6, 9))] for _ in range(24)]
        case = um.Case(model, bits, [x])
        eager = um.run_case(case, None)
        for _ in range(scopes):
            assert_same(um.run_case(case, {}), eager)
    return _usage_of(model)


def test_calls_that_learn_a_few_states_every_time_are_tried_operator_by_operator():
    """A few new template states a call, in every batch (a path per combination
    of branches): fewer than a graph's, but never ending; the block is tried
    both ways and keeps the faster one (it never was: 16 states a call were
    needed); every batch equals eager."""
    usage = _branched_path_batches(1)
    assert usage.trial_ms is not None       # (kept frames: tried again later, if at all)
    assert usage.watch == "done" or usage.watch["trials"] >= 1


def test_a_second_scope_over_the_same_samples_does_not_keep_a_block_from_its_trial():
    """A training scope, then an evaluation scope over the same samples: the second
    replays what the first just learned; the block is still tried operator by
    operator (the second scope's flush broke the row of learning flushes, so
    the trial never started)."""
    usage = _branched_path_batches(2)
    assert usage.trial_ms is not None       # (kept frames: tried again later, if at all)
    assert usage.watch == "done" or usage.watch["trials"] >= 1


def test_calls_that_stop_learning_are_not_tried():
    """A tree model learns its paths in the first batches, then replays them: no trial."""
    case = um.case_recursive_net(seed=0, n=12)
    for k in range(8):
        batch = um.Case(case.model, um.case_recursive_net(seed=100 + k, n=12).samples,
                        case.inputs)
        um.run_case(batch, {})
    usage = _usage_of(case.model)
    assert not usage.irregular and usage.trial_ms is None
    assert usage.watch["trial"] is None and usage.watch["flushes"] >= 6


class _ChoiceChain(gdb.DynBatchBlock):
    """Applies a sample's own sequence of activations; ``kind`` picks which set."""

    KINDS = {"a": ("tanh", "sigmoid", "relu"), "b": ("softrelu", "softsign", "tanh"),
             "c": ("sigmoid", "relu", "softsign")}

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kind = "a"
        with self.name_scope():
            self.dense = nn.Dense(4)

    def hybrid_forward(self, F, choices, x):
        h = self.dense(x)
        for k in choices:
            h = F.Activation(h * 0.9 + 0.1, act_type=self.KINDS[self.kind][k])
        return h


def test_a_new_use_of_a_block_learns_its_paths_without_a_trial():
    """Paths learned in a burst (a model decoding after it trained: two new
    kinds of calls, one flush each) and then replayed do not start a trial of
    recording operator by operator; every batch equals eager."""
    model = _ChoiceChain()
    model.initialize()
    x = nd.array(np.linspace(-1, 1, 12).reshape(3, 4))
    rng = random.Random(0)
    batches = {kind: [[rng.randrange(3) for _ in range(12)] for _ in range(12)]
               for kind in "abc"}
    for kind in "aaabcbcbc":
        model.kind = kind
        case = um.Case(model, batches[kind], [x])
        assert_same(um.run_case(case, {}), um.run_case(case, None))
    usage = _usage_of(model)
    assert usage.trial_ms is None and not usage.irregular
    assert usage.watch["trial"] is None and usage.watch["flushes"] >= 7


def test_calls_recorded_one_by_one_take_compiled_code_once_known(monkeypatch):
    """Operator by operator (``granularity="op"``, and blocks whose samples each
    take a path of their own), a call whose call shape is known is recorded in
    compiled code (``RecorderCore.graph_call``), not through ``Recorder.graph_op``;
    outputs and gradients equal eager on a new batch."""
    from gluon_dynbatch.record import recorder

    case = um.CASES["graph_conv"](seed=0, n=8)
    um.run_case(case, {"granularity": "op"})            # learns the call shapes
    general = []
    original = recorder.Recorder.graph_op
    monkeypatch.setattr(recorder.Recorder, "graph_op", lambda self, op, *rest: (
        general.append(op.name), original(self, op, *rest))[1])
    batched = um.run_case(case, {"granularity": "op"})
    monkeypatch.undo()
    assert not {"FullyConnected", "Activation", "relu", "broadcast_add", "_div_scalar",
                "add_n"} & set(general), general
    assert_same(batched, um.run_case(case))


def test_a_trial_whose_flushes_all_ran_by_operator_still_decides():
    """Frames that make programs of their own switch their flush to operators
    (``Usage.note_program``) even where the trial asked for frames: the trial
    counts each flush the way it ran and decides from what ran."""
    from gluon_dynbatch.record.usage import LEARNING_TRIAL, Usage
    usage = Usage()
    watch = usage.watch = {"trial": {"op": [], "frame": []}}
    usage.irregular = True
    for _ in range(2 * LEARNING_TRIAL):
        usage._trial_flush(watch, 0.5)      # pylint: disable=protected-access
        if usage.watch == "done":
            break
        usage.irregular = True              # the flush switched itself
    assert usage.watch == "done" and usage.irregular
    assert usage.trial_ms == (0.5, None)


def test_message_passing_over_new_graphs_batch_after_batch_equals_eager():
    """Each sample its own graph, a new batch every time: past the trial of
    recording operator by operator, every batch runs and equals eager."""
    case = um.case_message_passing(seed=0, n=12)
    for k in range(16):
        batch = um.Case(case.model, um.case_message_passing(seed=200 + k, n=12).samples,
                        case.inputs)
        assert_same(um.run_case(batch, {}), um.run_case(batch, None))
    usage = _usage_of(case.model)       # tried (kept frames: tried again later, if at all)
    assert usage.watch == "done" or usage.watch["trials"] >= 1


class PickedByIndexArrays(gdb.DynBatchBlock):
    """A sentence's projected rows, elements picked by index arrays (NDArray
    advanced indexing): one by row and column, or each row's largest."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.proj = nn.Dense(4)

    def hybrid_forward(self, F, sentence, emb):
        length = len(sentence)
        h = self.proj(F.take(emb, F.array(sentence)))
        if self.form == "row_and_column":
            return h[F.array([length - 1]), F.array([2])]
        return h[F.arange(length), F.argmax(h, axis=1)]


@pytest.mark.parametrize("form", ["row_and_column", "largest_of_each_row"])
def test_elements_picked_by_index_arrays_equal_eager(form):
    """Index arrays stacked for ``gather_nd`` (no gradient) are gathered rows of
    an earlier step: MXNet's backward crashed the process on them (a zero
    gradient reaching a take of a concat) before they were detached."""
    r = random.Random(3)
    sentences = [[6], [6, 7, 8]] + [[r.randrange(20) for _ in range(r.randint(1, 5))]
                                    for _ in range(4)]
    emb = nd.array(np.random.RandomState(0).uniform(-1, 1, (20, 3)))
    model = make_model(PickedByIndexArrays, form=form)
    eager = run_model(model, sentences, [emb], "eager")
    check_all_strategies(model, sentences, [emb], strategies=("depth", "agenda"))
    assert_same(run_model(model, sentences, [emb], "depth"), eager)


class OffsetChildren(gdb.DynBatchBlock):
    """Children's states added in a loop with a Python number that is 0 for even
    words: ``F.tanh(h + child + tree.word % 2)``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(4)

    def hybrid_forward(self, F, tree, emb):
        h = self.inp(emb[tree.word:tree.word + 1])
        for child in tree.children:
            h = F.tanh(h + self(child, emb) + tree.word % 2)
        return h


def test_a_sum_of_children_plus_a_number_that_is_zero_equals_eager():
    from dynbatch_testing import Tree
    trees = [Tree(0, [Tree(1)]), Tree(3, [Tree(2), Tree(5)]), Tree(4, [Tree(6), Tree(7)])]
    r = random.Random(5)
    trees += [random_tree(r, 20, max_depth=3) for _ in range(4)]
    emb = nd.array(np.random.RandomState(1).uniform(-1, 1, (20, 3)))
    model = make_model(OffsetChildren)
    eager = run_model(model, trees, [emb], "eager")
    check_all_strategies(model, trees, [emb], strategies=("depth", "agenda", "unbatched"))
    assert_same(run_model(model, trees, [emb], "depth"), eager)


class SlicedFromEnd(gdb.DynBatchBlock):
    """Rows of a sentence's projection sliced with ``F.slice_axis`` at bounds of
    the sample's own: negative (counted from the end) or ``end=None``."""

    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        with self.name_scope():
            self.proj = nn.Dense(4, flatten=False)

    def hybrid_forward(self, F, sample, emb):
        words, k = sample
        h = self.proj(F.take(emb, F.array(words)))
        if self.form == "negative":
            return F.slice_axis(h, axis=0, begin=-k - 1, end=-k)
        if self.form == "to_the_end":
            return F.slice_axis(h, axis=0, begin=k, end=None).sum(axis=0, keepdims=True)
        return F.slice_axis(h, axis=1, begin=-k - 1, end=-k)     # a column from the end


@pytest.mark.parametrize("form", ["negative", "to_the_end", "column"])
def test_slices_at_bounds_counted_from_the_end_equal_eager(form):
    """Bounds that differ by sample become positions: negative bounds and
    ``end=None`` are counted from the value's end first (silently row 0 before,
    or a TypeError for ``None``)."""
    r = random.Random(4)
    samples = [([r.randrange(20) for _ in range(r.randint(4, 7))], k) for k in (1, 2, 3, 3, 1, 2)]
    emb = nd.array(np.random.RandomState(2).uniform(-1, 1, (20, 3)))
    model = make_model(SlicedFromEnd, form=form)
    eager = run_model(model, samples, [emb], "eager")
    check_all_strategies(model, samples, [emb], strategies=("depth", "agenda"))
    assert_same(run_model(model, samples, [emb], "depth"), eager)


def test_a_trial_that_kept_frames_is_run_again_while_calls_go_on_learning():
    """A trial whose flushes by operator ran on a busy machine keeps frames; the
    block's calls go on learning, so it is tried again (after a longer wait),
    and a clear trial then switches it; a block tried as often as allowed
    keeps what the last trial said."""
    from gluon_dynbatch.record import usage as rules
    usage = rules.Usage()
    calls = states = 0
    trials = []

    def flush(ms_per_call):
        nonlocal calls, states
        calls += 100
        states += 10 * 100              # learns ten template states a call
        usage.frames += 100
        usage.counters = [[states]]
        return usage.note_learning(ms_per_call * 100, False)

    flush(1.0)                          # the block's first flush
    for _ in range(200):
        if usage.watch == "done":
            break
        before = usage.watch.get("trials", 0)
        by_op = usage.watch["trial"] is not None and usage.irregular
        # Busy during the first trial's flushes by operator, not later.
        flush((5.0 if not trials else 0.2) if by_op else 1.0)
        if usage.watch == "done" or usage.watch.get("trials", 0) > before:
            trials.append(usage.trial_ms)
    assert trials and not trials[0][0] < trials[0][1]       # the first kept frames
    assert usage.watch == "done" and usage.irregular
    assert usage.trial_ms[0] < rules.LEARNING_GAIN * usage.trial_ms[1]
    usage = rules.Usage()
    usage.watch = rules._new_watch(rules.LEARNING_TRIALS - 1, 0, (0, 0))
    usage.watch["trial"] = {"op": [], "frame": []}
    usage.irregular = True
    for cost in (5.0, 1.0):
        usage._trial_flush(usage.watch, cost)   # pylint: disable=protected-access
    assert usage.watch == "done" and not usage.irregular


def test_a_trial_whose_flushes_alternate_modes_decides_within_each_mode():
    """Under ``compiled=True`` the executor of a flush changes (whole plans,
    compiled steps, imperative calls): a trial compares each mode's flushes
    with those of the same mode, and decides once one mode has enough (a
    flush of another mode no longer throws the trial's count away)."""
    from gluon_dynbatch.record import usage as rules
    usage = rules.Usage()
    usage.counters = [[0]]
    modes = ["plan", "imperative"]
    for flush in range(60):
        if usage.watch == "done":
            break
        usage.frames += 10
        usage.counters[0][0] += int(2 * rules.LEARNING_SEVERE * 10)
        cost = 2.0 if usage.irregular else 10.0      # clearly cheaper by operator
        usage.note_learning(cost * 10, modes[flush % 2])
    assert usage.watch == "done" and usage.irregular


def test_a_trial_decides_once_one_way_is_clearly_cheaper():
    """Each flush of a trial is a batch run the slow way half the time: once both
    ways have run and one cost less than half of the other, the trial ends."""
    from gluon_dynbatch.record.usage import Usage
    for costs, by_op in (((0.2, 1.0), True), ((1.0, 0.3), False)):
        usage = Usage()
        watch = usage.watch = {"trial": {"op": [], "frame": []}}
        usage.irregular = True              # the trial's first flush: by operator
        for cost in costs:
            usage._trial_flush(watch, cost)     # pylint: disable=protected-access
        # Operator by operator: decided for good; frames: tried again later.
        assert (usage.watch == "done") == by_op and usage.irregular == by_op
        assert usage.watch == "done" or usage.watch["trial"] is None
        assert usage.trial_ms == costs
    usage = Usage()
    watch = usage.watch = {"trial": {"op": [], "frame": []}}
    usage.irregular = True
    for cost in (0.8, 1.0):                 # not clear: the trial goes on
        usage._trial_flush(watch, cost)     # pylint: disable=protected-access
    assert usage.watch != "done"


def test_calls_each_learning_a_path_of_their_own_start_a_trial_at_their_third_flush():
    """A block learning a hundred and more states a call (message passing over
    each sample's graph, vertex by vertex) in its first three flushes is tried
    operator by operator from its fourth: three slow batches, not four."""
    from gluon_dynbatch.record import usage as usage_rules
    usage = usage_rules.Usage()
    usage.counters = [[0]]
    for flush in range(usage_rules.LEARNING_STRIKES):
        assert not usage.irregular
        usage.frames += 10
        usage.counters[0][0] += int(2 * usage_rules.LEARNING_SEVERE * 10)
        usage.note_learning(10.0, "imperative")
    trial = usage.watch["trial"]
    assert usage.irregular and (trial["op"], trial["frame"]) == ([], [1.0])


def test_calls_learning_their_paths_in_two_flushes_then_replaying_are_not_tried():
    """A seq2seq model learns a path per sentence length, a hundred states a call,
    in its first two flushes, then replays them: no trial (whose first flush as
    frames, a learning one, would make recording operator by operator look
    cheaper than its replays are)."""
    from gluon_dynbatch.record import usage as usage_rules
    usage = usage_rules.Usage()
    usage.counters = [[0]]
    for flush in range(8):
        usage.frames += 10
        if flush < 2:
            usage.counters[0][0] += int(2 * usage_rules.LEARNING_SEVERE * 10)
        usage.note_learning(10.0, "imperative")
        assert not usage.irregular
    assert usage.watch["trial"] is None


def test_a_trial_counts_the_flush_that_started_it_as_one_as_frames():
    """The flush that starts a trial ran as frames, learning as the next ones
    would: one flush by operator that is clearly cheaper decides the trial
    (a slow batch as frames fewer for a model whose samples each take a path
    of their own)."""
    from gluon_dynbatch.record import usage as usage_rules
    usage = usage_rules.Usage()
    usage.counters = [[0]]
    flushes = 0
    while not usage.irregular:              # learning: many new states a call
        usage.frames += 10
        usage.counters[0][0] += int(2 * usage_rules.LEARNING_STATES * 10)
        usage.note_learning(10.0, "imperative")
        flushes += 1
    assert flushes == max(usage_rules.LEARNING_WARMUP + 1, usage_rules.LEARNING_STRIKES)
    usage.op_calls += 10
    usage.note_learning(2.0, "imperative")   # by operator: 0.2 ms a call against 1.0
    assert usage.watch == "done" and usage.irregular
    assert usage.trial_ms == (0.2, 1.0)


def test_calls_after_a_read_taking_a_path_of_each_samples_own_are_recorded_op_by_op():
    """Each sample's calls after its read became one program of its own: the
    flush after the read ran a step per sample, scope after scope (its samples
    all started in the flush before, which was not counted)."""
    model = make_model(um.RoutedTokens)
    table = nd.array(np.random.RandomState(0).uniform(-1, 1, (um.VOCAB, um.DIM)))
    stats = []
    for seed in range(3):
        r = random.Random(seed)
        sentences = [[r.randrange(um.VOCAB) for _ in range(r.randint(3, 8))] for _ in range(24)]
        with autograd.record():
            with gdb.batching() as scope:
                outs = [model(words, table) for words in sentences]
        stats.append(scope.stats)
        want = [model(words, table).asnumpy() for words in sentences]
        for out, expected in zip(outs, want):
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    assert stats[2].mean_batch_size >= 3 * stats[0].mean_batch_size
