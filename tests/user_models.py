"""Models written the way Gluon and DyNet users write them, and their test cases.

Each model is a :class:`gluon_dynbatch.DynBatchBlock` written for one sample
in plain Python: ``nn.Dense`` children called directly, ``F.split`` into
gates, Python loops over children and tokens, per-node losses appended to a
list, dictionaries and namedtuples returned, values read in the middle of a
sample.  :data:`CASES` builds each model with small sizes together with its
samples and shared inputs; :func:`run_case` runs a case eagerly or in a
batching scope, forward and backward, and returns what
``dynbatch_testing.assert_same`` compares.  ``tests/test_user_models.py``
checks every case against eager Gluon; ``scripts/user_models_bench.py`` times
one batch of each.
"""
import random
from collections import namedtuple

import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn, rnn

import gluon_dynbatch as gdb
from dynbatch_testing import Tree, random_binary_tree, random_tree
from examples.sick_model import OpByOpTreeLSTM
import gluonnlp_models as gm
from matrix_models import (DecomposableAttention, GraphAttention, MatrixTreeParser,
                           SelfAttention, TensorTree, TextCNN,
                           TokenLossMean, VectorContext)
from idiom_models import (ActivationTree, AdjacencyGCN, AttentivePooling, BiGRUTagger,
                          CharWordTagger, ClosureTree, ConcatChildren, CRFTagger,
                          CrossEntropyTagger, DotAttention, FeedbackTree, FusedLSTMEncoder,
                          GluonLosses, Graph, GraphConv, HelperRNN, IndexingTree, MeanPoolTree,
                          MemorySlots, MemoWords, MessagePassing, MethodTree, NodeLossTree,
                          PickedRows, PointerNet, RecursiveNet, ScalarMath, ScoredChildren,
                          Seq2SeqAttention, StackedAttention, TaggerLoss, TopDownTree,
                          UnrollEncoder, VectorRNN, VectorTreeLSTM, WeightData)

HIDDEN, DIM, VOCAB, CLASSES = 8, 6, 40, 3

State = namedtuple("State", ["h", "c"])


# --------------------------------------------------------------------------
# Trees and DAGs
# --------------------------------------------------------------------------

class NodeLossTreeRNN(gdb.DynBatchBlock):
    """A tree RNN that appends each node's loss to the caller's list.

    DyNet's style: ``model(tree, emb, losses)``; the caller sums ``losses``
    after the batch.  A node's label is its word id modulo the classes.
    """

    def __init__(self, hidden=HIDDEN, classes=CLASSES, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.leaf = nn.Dense(hidden, activation="tanh")
            self.combine = nn.Dense(hidden, use_bias=False)
            self.classify = nn.Dense(classes)

    def hybrid_forward(self, F, tree, emb, losses):
        h = self.leaf(emb[tree.word:tree.word + 1])
        for child in tree.children:
            h = h + self.combine(self(child, emb, losses))
        h = F.tanh(h)
        label = tree.word % self.classes
        log_probs = F.log_softmax(self.classify(h))
        losses.append(-F.slice_axis(log_probs, axis=1, begin=label, end=label + 1))
        return h


class NamedTupleCell(gluon.HybridBlock):
    """A Child-Sum-like cell that returns a ``State(h, c)`` namedtuple."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.gates = nn.Dense(3 * hidden)
            self.forget = nn.Dense(hidden)

    def hybrid_forward(self, F, x, h_sum, c_sum):
        i, o, u = F.split(self.gates(F.concat(x, h_sum, dim=1)), num_outputs=3, axis=1)
        c = F.sigmoid(i) * F.tanh(u) + F.sigmoid(self.forget(x)) * c_sum
        return State(h=F.sigmoid(o) * F.tanh(c), c=c)


class DictTreeLSTM(gdb.DynBatchBlock):
    """A tree LSTM returning ``{"h": ..., "c": ..., "nodes": int}`` per subtree.

    Its cell returns a namedtuple; children's states are summed with
    ``F.add_n``.
    """

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.cell = NamedTupleCell(hidden)

    def hybrid_forward(self, F, tree, emb):
        kids = [self(child, emb) for child in tree.children]
        if kids:
            h_sum = F.add_n(*[k["h"] for k in kids])
            c_sum = F.add_n(*[k["c"] for k in kids])
        else:
            h_sum = c_sum = F.zeros((1, self.hidden))
        state = self.cell(emb[tree.word:tree.word + 1], h_sum, c_sum)
        return {"h": state.h, "c": state.c,
                "nodes": 1 + sum(k["nodes"] for k in kids)}


class DagNode:
    """A node of a DAG: a word and children that other nodes may share."""

    def __init__(self, word, children=()):
        self.word = word
        self.children = list(children)


def random_dag(rng, vocab, size):
    """A DAG of ``size`` nodes, each with 0-2 children among the earlier nodes.

    A node may be the child of several nodes (a shared subtree).

    Returns
    -------
    DagNode
        A root whose children are the nodes no other node points to, so that
        every node is reachable from it.
    """
    nodes = []
    for _ in range(size):
        picks = rng.sample(nodes, rng.randint(0, min(2, len(nodes))))
        nodes.append(DagNode(rng.randrange(vocab), picks))
    tops = [n for n in nodes if not any(n in m.children for m in nodes)]
    return DagNode(rng.randrange(vocab), tops)


class MemoDagRNN(gdb.DynBatchBlock):
    """Recursive RNN over a DAG, memoised on node objects within the call.

    A node reached twice (a shared subtree) is computed once: the result is
    cached in a dict keyed by ``id(node)`` that the call passes down.
    """

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.rec = nn.Dense(hidden, use_bias=False)

    def hybrid_forward(self, F, node, emb, memo=None):
        if memo is None:
            memo = {}
        key = id(node)
        if key not in memo:
            h = self.inp(emb[node.word:node.word + 1])
            for child in node.children:
                h = h + self.rec(self(child, emb, memo))
            memo[key] = F.tanh(h)
        return memo[key]


class ChildAttention(gdb.DynBatchBlock):
    """Tree encoder attending over its children's states.

    The children's states are stacked (k, H), scored (k, 1), the scores
    soft-maxed over the children (axis 0) and the states summed with those
    weights.
    """

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.key = nn.Dense(hidden, use_bias=False)
            self.score = nn.Dense(1, use_bias=False)
            self.mix = nn.Dense(hidden, use_bias=False)

    def hybrid_forward(self, F, tree, emb):
        x = self.inp(emb[tree.word:tree.word + 1])
        kids = [self(child, emb) for child in tree.children]
        if not kids:
            return F.tanh(x)
        states = F.concat(*kids, dim=0)
        scores = self.score(F.tanh(F.broadcast_add(self.key(states), x)))
        weights = F.softmax(scores, axis=0)
        context = F.sum(F.broadcast_mul(weights, states), axis=0, keepdims=True)
        return F.tanh(x + self.mix(context))


class HierarchicalSoftmaxCBOW(gdb.DynBatchBlock):
    """word2vec's CBOW with a hierarchical softmax: the mean of the context's
    embeddings scored at each node of the word's path, the node's code bit the
    sign of its score (``score * (2 * bit - 1)``)."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(VOCAB, hidden)
            self.nodes = self.params.get("nodes", shape=(VOCAB, hidden))

    def hybrid_forward(self, F, sample, nodes):
        context, path, code = sample
        h = F.mean(self.embed(F.array(context)), axis=0, keepdims=True)
        loss = 0
        for node, bit in zip(path, code):
            score = F.dot(h, nodes[node:node + 1], transpose_b=True) * (2 * bit - 1)
            loss = loss - F.log(F.sigmoid(score) + 1e-7)
        return loss


class BiaffineArcs(gdb.DynBatchBlock):
    """A biaffine dependency scorer (Dozat and Manning): a BiLSTM's states, the
    (n, n) scores of every head for every dependent plus a bias per head, and
    the loss of each word's gold head."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(VOCAB, DIM)
            self.lstm = rnn.LSTM(hidden // 2, bidirectional=True, layout="NTC")
            self.dep = nn.Dense(hidden, flatten=False, activation="relu")
            self.head = nn.Dense(hidden, flatten=False, activation="relu")
            self.U = self.params.get("U", shape=(hidden, hidden))
            self.u = self.params.get("u", shape=(1, hidden))

    def hybrid_forward(self, F, sample, U, u):
        words, heads = sample
        h = self.lstm(self.embed(F.array([0] + words)).expand_dims(0))[0]    # (n, hidden)
        dep, head = self.dep(h), self.head(h)
        scores = F.dot(F.dot(dep, U), head, transpose_b=True)
        scores = F.broadcast_add(scores, F.dot(u, head, transpose_b=True))
        arcs = F.log_softmax(scores[1:], axis=1)
        return -F.mean(F.pick(arcs, F.array(heads), axis=1))


class BranchingTreeRNN(gdb.DynBatchBlock):
    """A tree RNN that reads a value per node and branches on it.

    ``if float(score.asscalar()) > 0`` picks one of two layers, so every node
    reads a value of the graph in the middle of its sample.
    """

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        self.branches = []      # (node, the branch it took), in call order
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.gate = nn.Dense(1)
            self.up = nn.Dense(hidden, use_bias=False)
            self.down = nn.Dense(hidden, use_bias=False)

    def hybrid_forward(self, F, tree, emb):
        h = self.inp(emb[tree.word:tree.word + 1])
        for child in tree.children:
            h = h + self(child, emb)
        h = F.tanh(h)
        score = self.gate(h)
        up = float(score.asscalar()) > 0
        self.branches.append((tree, up))
        if up:
            return F.tanh(self.up(h))
        return F.tanh(self.down(h)) * F.sigmoid(score)


class RoutedTokens(gdb.DynBatchBlock):
    """A mixture of experts: each token goes to one of three experts, picked by
    a gate whose choices the sample reads once (``topk``), then token by token:
    after the read, each sample's calls take a path of its own."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.gate = nn.Dense(3)
            self.experts = nn.HybridSequential()
            self.experts.add(*[nn.Dense(hidden) for _ in range(3)])
            self.out = nn.Dense(CLASSES)

    def hybrid_forward(self, F, words, emb):
        x = F.concat(*[emb[w:w + 1] for w in words], dim=0)
        gates = F.softmax(self.gate(x), axis=1)
        picks = F.topk(gates, axis=1, k=1).asnumpy().astype(int).ravel()
        routed = [self.experts[int(k)](x[t:t + 1])
                  * F.pick(gates[t:t + 1], F.array([int(k)]), axis=1, keepdims=True)
                  for t, k in enumerate(picks)]
        return F.sum(self.out(F.relu(F.concat(*routed, dim=0)) + x[:, 0:1]), axis=0,
                     keepdims=True)


class MemoryHops(gdb.DynBatchBlock):
    """An end-to-end memory network: a story's sentences, each the sum of its
    words' rows (``F.take`` by ``F.array`` of the ids), are its memories; three
    hops of attention from the question, then the answer's cross-entropy."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.keys = nn.Dense(hidden, use_bias=False)
            self.values = nn.Dense(hidden, use_bias=False)
            self.query = nn.Dense(hidden, use_bias=False)
            self.hop = nn.Dense(hidden)
            self.answer = nn.Dense(CLASSES)

    def hybrid_forward(self, F, sample, emb):
        story, question, answer = sample
        memories = F.concat(*[F.sum(F.take(emb, F.array(s)), axis=0, keepdims=True)
                              for s in story], dim=0)
        keys, values = self.keys(memories), self.values(memories)
        u = self.query(F.sum(F.take(emb, F.array(question)), axis=0, keepdims=True))
        for _ in range(3):
            attention = F.softmax(F.dot(u, keys, transpose_b=True), axis=-1)
            u = self.hop(u) + F.dot(attention, values)
        return F.softmax_cross_entropy(self.answer(u), F.array([answer]))


class HeldVectors(gdb.DynBatchBlock):
    """Pretrained word vectors the model holds as a plain NDArray (frozen, not a
    Parameter, not an argument), read a row per token (``self.vectors[w]``)
    into a GRU cell; the class scores of the last state."""

    def __init__(self, vectors, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        self.vectors, self.hidden = vectors, hidden
        with self.name_scope():
            self.cell = rnn.GRUCell(hidden)
            self.out = nn.Dense(CLASSES)

    def hybrid_forward(self, F, words):
        state = [F.zeros((1, self.hidden))]
        for w in words:
            _, state = self.cell(self.vectors[w].reshape((1, -1)), state)
        return F.log_softmax(self.out(state[0]))


class HybridizedScorer(gluon.HybridBlock):
    """An ordinary child block; the model calls ``hybridize()`` on it."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(hidden)

    def hybrid_forward(self, F, x):
        return F.tanh(self.dense(x))


class OpaqueScale(gluon.HybridBlock):
    """A child HybridBlock whose ``forward`` is overridden."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(hidden, use_bias=False)

    def forward(self, x):  # pylint: disable=arguments-differ
        return self.dense(x) * 0.5


class MixedChildren(gdb.DynBatchBlock):
    """A tree model calling a hybridized child and an opaque one."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.scorer = HybridizedScorer(hidden)
            self.opaque = OpaqueScale(hidden)
        self.scorer.hybridize()

    def hybrid_forward(self, F, tree, emb):
        h = self.scorer(emb[tree.word:tree.word + 1])
        for child in tree.children:
            h = h + self.opaque(self(child, emb))
        return F.tanh(h)


class OpByOpBinaryTreeLSTM(gdb.DynBatchBlock):
    """Binary Tree-LSTM (Tai et al.'s N-ary form, N = 2), operator by operator.

    Leaves compute ``i, o, u`` from their word; an internal node from its
    two children, with one forget gate per child, each seeing both children.
    """

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.leaf = nn.Dense(3 * hidden)
            self.iou_left = nn.Dense(3 * hidden)
            self.iou_right = nn.Dense(3 * hidden, use_bias=False)
            self.f_left = nn.Dense(2 * hidden)
            self.f_right = nn.Dense(2 * hidden, use_bias=False)

    def hybrid_forward(self, F, tree, emb):
        if not tree.children:
            i, o, u = F.split(self.leaf(emb[tree.word:tree.word + 1]), num_outputs=3, axis=1)
            c = F.sigmoid(i) * F.tanh(u)
        else:
            (h_l, c_l), (h_r, c_r) = [self(child, emb) for child in tree.children]
            i, o, u = F.split(self.iou_left(h_l) + self.iou_right(h_r), num_outputs=3, axis=1)
            f_l, f_r = F.split(self.f_left(h_l) + self.f_right(h_r), num_outputs=2, axis=1)
            c = F.sigmoid(i) * F.tanh(u) + F.sigmoid(f_l) * c_l + F.sigmoid(f_r) * c_r
        return F.sigmoid(o) * F.tanh(c), c


# --------------------------------------------------------------------------
# Token loops
# --------------------------------------------------------------------------

class GluonCellTagger(gdb.DynBatchBlock):
    """A gluon.rnn LSTMCell or GRUCell called in a Python loop over tokens.

    Parameters
    ----------
    cell : {"lstm", "gru"}
    hidden : int
    outputs : {"concat", "last"}
        Return the per-token outputs concatenated (T, classes) and the last
        hidden state, or the last output and the last hidden state.
    """

    def __init__(self, cell="lstm", hidden=HIDDEN, outputs="concat", **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        self.outputs = outputs
        with self.name_scope():
            self.cell = rnn.LSTMCell(hidden) if cell == "lstm" else rnn.GRUCell(hidden)
            self.out = nn.Dense(CLASSES)

    def hybrid_forward(self, F, tokens, emb):
        state = [F.zeros((1, self.hidden)) for _ in self.cell.state_info()]
        outputs = []
        for t in tokens:
            out, state = self.cell(emb[t:t + 1], state)
            outputs.append(self.out(out))
        if self.outputs == "concat":
            return F.concat(*outputs, dim=0), state[0]
        return outputs[-1], state[0]


class GoldTokens(gdb.DynBatchBlock):
    """A recurrence written operator by operator over the rows of the sentence's
    embedded words (``e[t:t + 1]``), a score per token, and the loss of the
    sample's own gold tokens: log-sum-exp of every score minus the gold ones'
    (the calls after the shared part differ from sample to sample)."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.embed = nn.Embedding(VOCAB, DIM)
            self.w = nn.Dense(hidden, in_units=DIM)
            self.u = nn.Dense(hidden, in_units=hidden, use_bias=False)
            self.score = nn.Dense(1, in_units=hidden)

    def hybrid_forward(self, F, sample):
        words, gold = sample
        e = self.embed(F.array(words))
        h = F.zeros((1, self.hidden))
        scores = []
        for t in range(len(words)):
            h = F.tanh(self.w(e[t:t + 1]) + self.u(h))
            scores.append(self.score(h))
        every = F.concat(*scores, dim=1)
        top = F.max(every, axis=1, keepdims=True)
        total = top + F.log(F.sum(F.exp(F.broadcast_sub(every, top)), axis=1, keepdims=True))
        return total - sum(scores[t] for t in gold)


class RawLSTM(gdb.DynBatchBlock):
    """An LSTM over tokens written with F operators and its own Parameters."""

    def __init__(self, hidden=HIDDEN, input_size=DIM, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.w_x = self.params.get("w_x", shape=(4 * hidden, input_size))
            self.w_h = self.params.get("w_h", shape=(4 * hidden, hidden))
            self.bias = self.params.get("bias", shape=(4 * hidden,))
            self.out = nn.Dense(CLASSES)

    def hybrid_forward(self, F, tokens, emb, w_x, w_h, bias):
        H = self.hidden
        h = c = F.zeros((1, H))
        total = None
        for t in tokens:
            gates = (F.FullyConnected(emb[t:t + 1], w_x, bias, num_hidden=4 * H)
                     + F.FullyConnected(h, w_h, no_bias=True, num_hidden=4 * H))
            i, f, g, o = F.split(gates, num_outputs=4, axis=1)
            c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
            h = F.sigmoid(o) * F.tanh(c)
            score = self.out(h)
            total = score if total is None else total + score
        return total, h


class EmbeddingRNN(gdb.DynBatchBlock):
    """An Elman RNN reading word ids through embedding lookups in the model.

    Each token is looked up twice: by an ``nn.Embedding`` child on a (1,)
    slice of the sentence's id array, and by ``F.Embedding`` on the model's
    own table; the two vectors are concatenated.
    """

    def __init__(self, hidden=HIDDEN, vocab=VOCAB, dim=DIM, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.vocab, self.dim = hidden, vocab, dim
        with self.name_scope():
            self.embed = nn.Embedding(vocab, dim)
            self.table = self.params.get("table", shape=(vocab, dim))
            self.i2h = nn.Dense(hidden)
            self.h2h = nn.Dense(hidden, use_bias=False)

    def hybrid_forward(self, F, ids, table):
        h = F.zeros((1, self.hidden))
        for k in range(ids.shape[0]):
            index = ids[k:k + 1]
            x = F.concat(self.embed(index),
                         F.Embedding(index, table, input_dim=self.vocab, output_dim=self.dim),
                         dim=1)
            h = F.tanh(self.i2h(x) + self.h2h(h))
        return h


class DropoutModel(gdb.DynBatchBlock):
    """A projection of one word, dropout, and a layer after it.

    Returns ``(y, z, out)``: the value before dropout, after it, and the
    output layer's.  Given ``mask`` (1, H), ``z = y * mask / (1 - rate)``
    instead of a random mask (for checking the gradients of a batched run).
    """

    def __init__(self, rate, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate
        with self.name_scope():
            self.proj = nn.Dense(hidden)
            self.drop = nn.Dropout(rate)
            self.out = nn.Dense(CLASSES)

    def hybrid_forward(self, F, word, emb, mask=None):
        y = F.tanh(self.proj(emb[word:word + 1]))
        z = self.drop(y) if mask is None else y * mask / (1.0 - self.rate)
        return y, z, self.out(z)


# --------------------------------------------------------------------------
# Models of the engine's known defects (see tests/test_user_models.py)
# --------------------------------------------------------------------------

class CrossBatchMemo(gdb.DynBatchBlock):
    """Caches a projection per word in a dict kept across calls and batches."""

    def __init__(self, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        self.memo = {}
        with self.name_scope():
            self.proj = nn.Dense(2 * hidden)
            self.out = nn.Dense(CLASSES)

    def hybrid_forward(self, F, word, emb):
        if word not in self.memo:
            self.memo[word] = F.tanh(self.proj(emb[word:word + 1]))
        return F.tanh(self.out(self.memo[word]))


# --------------------------------------------------------------------------
# Cases: a model with its samples and shared inputs
# --------------------------------------------------------------------------

class Case:
    """A model, its samples and shared inputs, and how one sample is called.

    Parameters
    ----------
    model : DynBatchBlock
    samples : list
    inputs : list of NDArray
        Shared by every sample (the embedding table); gradients are taken.
    call : callable, optional
        ``call(model, sample, inputs)`` returns the sample's outputs;
        default ``model(sample, *inputs)``.
    notes : str, optional
        What to expect of this model's batching (printed by the benchmark).
    """

    def __init__(self, model, samples, inputs, call=None, notes="", fresh=None):
        self.model = model
        self.samples = samples
        self.inputs = inputs
        self.call = call or (lambda m, sample, shared: m(sample, *shared))
        self.notes = notes
        self.fresh = fresh

    def outputs(self):
        """The outputs of every sample, in order (``fresh()`` called first: a
        cache the samples share starts empty on each run)."""
        if self.fresh is not None:
            self.fresh()
        return [self.call(self.model, s, self.inputs) for s in self.samples]


def _init(model, seed):
    mx.random.seed(seed)
    model.initialize(mx.init.Uniform(0.3))
    return model


def _table(seed, vocab=VOCAB, dim=DIM):
    return nd.array(random.Random(seed).choices(range(-50, 51), k=vocab * dim),
                    dtype="float32").reshape((vocab, dim)) / 50.0


def _trees(seed, n, max_depth=3):
    r = random.Random(seed)
    return [Tree(r.randrange(VOCAB))] + [random_tree(r, VOCAB, max_depth) for _ in range(n - 1)]


def _sentences(seed, n, max_len=12):
    r = random.Random(seed)
    lengths = [1, max_len] + [r.randint(1, max_len) for _ in range(n - 2)]
    return [[r.randrange(VOCAB) for _ in range(k)] for k in lengths[:n]]


def _graphs(seed, n, max_size=7):
    r = random.Random(seed)
    graphs = []
    for _ in range(n):
        size = r.randint(1, max_size)
        neighbours = [[j for j in range(size) if j != i and r.random() < 0.4] for i in range(size)]
        graphs.append(Graph([r.randrange(VOCAB) for _ in range(size)], neighbours))
    return graphs


def _node_losses(model, tree, shared):
    losses = []
    model(tree, *shared, losses)
    return losses


def case_node_losses(seed=0, n=6, hidden=HIDDEN):
    """Per-node losses appended to a list of each sample's own."""
    return Case(_init(NodeLossTreeRNN(hidden), seed), _trees(seed, n), [_table(seed)],
                call=_node_losses)


def case_dict_returns(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(DictTreeLSTM(hidden), seed), _trees(seed, n), [_table(seed)])


def case_dag_memo(seed=0, n=6, hidden=HIDDEN):
    r = random.Random(seed)
    dags = [random_dag(r, VOCAB, r.randint(1, 9)) for _ in range(n)]
    return Case(_init(MemoDagRNN(hidden), seed), dags, [_table(seed)])


def case_lstm_cell(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(GluonCellTagger("lstm", hidden), seed), _sentences(seed, n),
                [_table(seed)])


def case_gru_cell(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(GluonCellTagger("gru", hidden), seed), _sentences(seed, n),
                [_table(seed)])


def _embedding_call(model, sentence, shared):
    return model(nd.array(sentence), *shared)


def case_embedding(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(EmbeddingRNN(hidden), seed), _sentences(seed, n), [],
                call=_embedding_call)


def case_child_attention(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(ChildAttention(hidden), seed), _trees(seed, n), [_table(seed)])


def case_mid_sample_reads(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(BranchingTreeRNN(hidden), seed), _trees(seed, n), [_table(seed)],
                notes="a read per tree node: each sample waits at its reads")


def _paths(seed, n, depth=(2, 6)):
    """(context words, path of tree nodes, code bits) of ``n`` words."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        d = r.randint(*depth)
        out.append(([r.randrange(VOCAB) for _ in range(r.randint(2, 5))],
                    [r.randrange(VOCAB) for _ in range(d)], [r.randrange(2) for _ in range(d)]))
    return out


def case_hsoftmax_cbow(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(HierarchicalSoftmaxCBOW(hidden), seed), _paths(seed, n), [],
                notes="a code bit's sign per node of a path: each combination a template path")


def _parses(seed, n, max_len=9):
    """(words, each word's head: 0 the root) of ``n`` sentences."""
    r = random.Random(seed)
    out = []
    for k in range(n):
        length = [1, max_len][k] if k < 2 else r.randint(1, max_len)
        out.append(([r.randrange(1, VOCAB) for _ in range(length)],
                    [r.randrange(length + 1) for _ in range(length)]))
    return out


def case_biaffine_arcs(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(BiaffineArcs(hidden), seed), _parses(seed, n), [],
                notes="(n, n) arc scores and a bias per head, of every sentence length")


def case_routed_tokens(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(RoutedTokens(hidden), seed), _sentences(seed, n), [_table(seed)],
                notes="a read per sentence, then an expert per token")


def _stories(seed, n):
    """(sentences of word ids, question, answer class) per sample: 1-8 sentences
    of 1-5 words."""
    r = random.Random(seed)
    return [([[r.randrange(VOCAB) for _ in range(r.randint(1, 5))]
              for _ in range(r.randint(1, 8))],
             [r.randrange(VOCAB) for _ in range(r.randint(1, 4))], r.randrange(CLASSES))
            for _ in range(n)]


def case_memory_hops(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(MemoryHops(hidden), seed), _stories(seed, n), [_table(seed)],
                notes="a memory network: sentences summed from word rows, three hops")


def case_tensor_tree(seed=0, n=6, hidden=HIDDEN):
    r = random.Random(seed)
    trees = [random_binary_tree(r, VOCAB, r.randint(1, 9)) for _ in range(n)]
    return Case(_init(TensorTree(VOCAB, hidden), seed), trees, [],
                notes="a recursive neural tensor network: batch_dot against a 3-d parameter")


def _dependency_trees(seed, n):
    """(word ids, head of each word: 0 the root, else a word's position + 1) per
    sample: 2-7 words, each head an earlier word or the root (one root word)."""
    r = random.Random(seed)
    samples = []
    for _ in range(n):
        count = r.randint(2, 7)
        heads = [0] + [r.randint(1, j) for j in range(1, count)]
        samples.append(([r.randrange(VOCAB) for _ in range(count)], heads))
    return samples


def case_matrix_tree(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(MatrixTreeParser(hidden), seed), _dependency_trees(seed, n),
                [_table(seed)],
                notes="a dependency tree's loss by the matrix-tree theorem: slogdet of a "
                      "Laplacian per sentence")


def case_held_vectors(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(HeldVectors(_table(seed), hidden), seed), _sentences(seed, n), [],
                notes="rows of word vectors the model holds as a plain NDArray")


def case_mixed_children(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(MixedChildren(hidden), seed), _trees(seed, n), [_table(seed)])


def case_dropout_p0(seed=0, n=6, hidden=HIDDEN):
    r = random.Random(seed)
    return Case(_init(DropoutModel(0.0, hidden), seed),
                [r.randrange(VOCAB) for _ in range(n)], [_table(seed)])


def case_opbyop_child_sum(seed=0, n=6, hidden=HIDDEN):
    model = OpByOpTreeLSTM(hidden, DIM)
    return Case(_init(model, seed), _trees(seed, n), [_table(seed)])


def case_opbyop_binary(seed=0, n=6, hidden=HIDDEN):
    r = random.Random(seed)
    trees = [random_binary_tree(r, VOCAB, r.randint(1, 9)) for _ in range(n)]
    return Case(_init(OpByOpBinaryTreeLSTM(hidden), seed), trees, [_table(seed)])


def case_gold_tokens(seed=0, n=6, hidden=HIDDEN):
    r = random.Random(seed + 2)
    samples = [(words, sorted(r.sample(range(len(words)), r.randint(1, len(words)))))
               for words in _sentences(seed, n)]
    return Case(_init(GoldTokens(hidden), seed), samples, [],
                notes="a loss over each sample's own gold tokens after a shared recurrence")


def case_raw_lstm(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(RawLSTM(hidden), seed), _sentences(seed, n), [_table(seed)])


def case_recursive_net(seed=0, n=6, hidden=HIDDEN):
    r = random.Random(seed)
    trees = [random_binary_tree(r, VOCAB, r.randint(1, 9)) for _ in range(n)]
    return Case(_init(RecursiveNet(VOCAB, hidden), seed), trees, [])


def case_mean_pool_tree(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(MeanPoolTree(hidden, DIM), seed), _trees(seed, n), [_table(seed)])


def case_tagger_loss(seed=0, n=6, hidden=HIDDEN):
    r = random.Random(seed + 1)
    samples = [(s, [r.randrange(CLASSES) for _ in s]) for s in _sentences(seed, n)]
    return Case(_init(TaggerLoss(hidden, CLASSES), seed), samples, [_table(seed)])


def case_node_loss_tree(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(NodeLossTree(hidden, CLASSES), seed), _trees(seed, n), [_table(seed)])


def case_attentive_pooling(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(AttentivePooling(hidden), seed), _sentences(seed, n), [_table(seed)])


def case_message_passing(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(MessagePassing(hidden), seed), _graphs(seed, n), [_table(seed)])


def case_helper_rnn(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(HelperRNN(hidden, DIM), seed), _sentences(seed, n), [_table(seed)])


def case_unroll(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(UnrollEncoder(hidden, CLASSES), seed), _sentences(seed, n),
                [_table(seed)], notes="LSTMCell.unroll: mx.nd.split on its input")


def case_unroll_merged(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(UnrollEncoder(hidden, CLASSES, merge=True), seed), _sentences(seed, n),
                [_table(seed)], notes="LSTMCell.unroll(merge_outputs=True): mx.nd.stack")


def case_fused_lstm(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(FusedLSTMEncoder(hidden, DIM, CLASSES), seed), _sentences(seed, n),
                [_table(seed)], notes="fused rnn.LSTM: one call per sample")


def case_fused_bigru(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(FusedLSTMEncoder(hidden, DIM, CLASSES, bigru=True), seed),
                _sentences(seed, n), [_table(seed)],
                notes="fused two-layer bidirectional rnn.GRU, batch axis first")


def case_gluon_losses(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(GluonLosses(hidden, CLASSES), seed), _sentences(seed, n), [_table(seed)],
                notes="L2, L1, Huber and sigmoid cross-entropy losses per sentence")


def _spelled_sentences(seed, n):
    r = random.Random(seed)
    return [[[r.randrange(VOCAB) for _ in range(r.randint(1, 5))]
             for _ in range(r.randint(1, 6))] for _ in range(n)]


def case_char_word(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(CharWordTagger(hidden, CLASSES), seed), _spelled_sentences(seed, n),
                [_table(seed)], notes="a character GRU per word inside a word LSTM")


def _pairs(seed, n, max_len=8):
    r = random.Random(seed)
    return [([r.randrange(VOCAB) for _ in range(r.randint(1, max_len))],
             [r.randrange(VOCAB) for _ in range(r.randint(1, max_len))]) for _ in range(n)]


def case_seq2seq(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(Seq2SeqAttention(hidden, VOCAB), seed), _pairs(seed, n), [_table(seed)],
                notes="encoder-decoder with attention, a loss per target word")


def case_scalar_math(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(ScalarMath(hidden, CLASSES), seed), _sentences(seed, n), [_table(seed)],
                notes="Python-number arithmetic, where, one_hot target after the loop")


def case_weight_data(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(WeightData(hidden, DIM), seed), _trees(seed, n), [_table(seed)],
                notes="a weight read with .data(), a (1, H) Parameter scaling the state")


def case_vector_tree(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(VectorTreeLSTM(hidden, DIM), seed), _trees(seed, n), [_table(seed)],
                notes="DyNet-style 1-d vectors: F.dot(W, x), split gates, (4H,) bias")


def case_vector_rnn(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(VectorRNN(hidden, DIM, CLASSES), seed), _sentences(seed, n),
                [_table(seed)], notes="DyNet-style 1-d vectors over tokens")


def case_top_down(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(TopDownTree(hidden, CLASSES), seed), _trees(seed, n), [_table(seed)],
                notes="recursive helper methods up and down the tree, a dict of states")


def case_cross_entropy(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(CrossEntropyTagger(hidden, CLASSES), seed), _sentences(seed, n),
                [_table(seed)], notes="F.softmax_cross_entropy per token")


def case_scored_children(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(ScoredChildren(hidden), seed), _trees(seed, n), [_table(seed)],
                notes="a (1, 1) score per child, concatenated and soft-maxed on axis 1")


def case_closure_tree(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(ClosureTree(hidden, CLASSES), seed), _trees(seed, n), [_table(seed)],
                notes="recursion through a function nested in hybrid_forward")


def case_memory_slots(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(MemorySlots(hidden, CLASSES), seed), _sentences(seed, n),
                [_table(seed, dim=hidden)], notes="each sample's own (slots, H) state per token")


def case_crf(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(CRFTagger(CLASSES), seed), _sentences(seed, n), [_table(seed)],
                notes="a CRF's forward algorithm over (C, C) scores per token")


def case_activations(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(ActivationTree(hidden), seed), _trees(seed, n), [_table(seed)],
                notes="nn.PReLU, nn.LeakyReLU, nn.ELU, nn.Activation")


def case_method_tree(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(MethodTree(hidden, CLASSES), seed), _trees(seed, n), [_table(seed)],
                notes="a recursive method without F, as DyNet code has it")


def case_feedback(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(FeedbackTree(hidden, CLASSES), seed), _trees(seed, n), [_table(seed)],
                notes="one_hot(argmax), F.where(k > 0, ...), detach() in each node")


def case_graph_conv(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(GraphConv(hidden, CLASSES), seed), _graphs(seed, n), [_table(seed)])


def case_picked_rows(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(PickedRows(hidden, CLASSES), seed), _sentences(seed, n), [_table(seed)])


def case_pointer_net(seed=0, n=6, hidden=HIDDEN):
    r = random.Random(seed + 1)
    samples = [(words, [r.randrange(len(words)) for _ in range(r.randint(1, len(words)))])
               for words in _sentences(seed, n)]
    return Case(_init(PointerNet(hidden), seed), samples, [_table(seed)],
                notes="slices H[i:i + 1] at the sample's own gold positions")


def case_memo_words(seed=0, n=6, hidden=HIDDEN):
    cache = {}
    return Case(_init(MemoWords(hidden, CLASSES), seed), _sentences(seed, n), [_table(seed)],
                call=lambda m, words, shared: m(words, cache, *shared), fresh=cache.clear,
                notes="word vectors memoised in a dict the batch's samples share")


def case_adjacency_gcn(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(AdjacencyGCN(hidden, CLASSES), seed), _graphs(seed, n), [_table(seed)])


def case_self_attention(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(SelfAttention(hidden, CLASSES), seed), _sentences(seed, n), [_table(seed)])


def case_decomposable(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(DecomposableAttention(hidden, CLASSES), seed), _pairs(seed, n),
                [_table(seed)], notes="a pair of sentences aligned along both axes")


def case_graph_attention(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(GraphAttention(hidden, CLASSES), seed), _graphs(seed, n), [_table(seed)])


def case_text_cnn(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(TextCNN(hidden, CLASSES), seed), _sentences(seed, n), [_table(seed)],
                notes="Conv1D of widths 2-4 over (1, E, T), max over time")


def case_vector_context(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(VectorContext(hidden, CLASSES), seed), _sentences(seed, n),
                [_table(seed)], notes="(H,) vectors of the sentence broadcast onto its rows")


def case_token_loss_mean(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(TokenLossMean(hidden, CLASSES), seed), _sentences(seed, n),
                [_table(seed)], notes="F.mean of a sentence's (T,) token losses")


def case_indexing_tree(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(IndexingTree(hidden), seed), _trees(seed, n), [_table(seed)])


def case_dot_attention(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(DotAttention(hidden, CLASSES), seed), _sentences(seed, n), [_table(seed)])


def case_concat_children(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(ConcatChildren(hidden), seed), _trees(seed, n), [_table(seed)],
                notes="children projected one by one, F.concat(*[...], dim=0), attention")


def case_stacked_attention(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(StackedAttention(hidden, CLASSES), seed), _sentences(seed, n),
                [_table(seed)], notes="outputs stacked on axis 1, batch_dot attention, a mask")


def case_bigru_tagger(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(BiGRUTagger(hidden, CLASSES), seed), _sentences(seed, n), [_table(seed)])


def case_gluonnlp_lstmp_lm(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(gm.LSTMPLanguageModel(hidden, VOCAB, DIM), seed),
                gm.sentences(seed, n, VOCAB, min_len=2), [],
                notes="gluonnlp's LSTMPCellWithClip language model, a loss per next word")


def case_gluonnlp_mlp_seq2seq(seed=0, n=4, hidden=HIDDEN):
    return Case(_init(gm.AttentionSeq2Seq(hidden, VOCAB, DIM, "mlp"), seed),
                gm.translations(seed, n, VOCAB), [],
                notes="GRU encoder-decoder, gluonnlp's MLPAttentionCell")


def case_gluonnlp_dot_seq2seq(seed=0, n=4, hidden=HIDDEN):
    return Case(_init(gm.AttentionSeq2Seq(hidden, VOCAB, DIM, "dot"), seed),
                gm.translations(seed, n, VOCAB), [],
                notes="GRU encoder-decoder, gluonnlp's DotProductAttentionCell")


def case_gluonnlp_char_highway(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(gm.CharHighwayTagger(hidden, CLASSES, 20), seed), gm.spelled(seed, n, 20),
                [], notes="gluonnlp's ConvolutionalEncoder per word, a Highway layer, tags")


def case_gluonnlp_transformer_layer(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(gm.TransformerLayerClassifier(gm.units(hidden), CLASSES, VOCAB), seed),
                gm.sentences(seed, n, VOCAB), [],
                notes="gluonnlp's TransformerEncoderCell over a (1, T, U) sentence")


def case_gluonnlp_bert(seed=0, n=6, hidden=HIDDEN):
    return Case(_init(gm.BERTClassifier(gm.units(hidden), CLASSES, VOCAB), seed),
                gm.sentences(seed, n, VOCAB, min_len=2, max_len=5), [],
                notes="gluonnlp's BERTModel (two encoder layers, the pooler) over a sentence")


def case_gluonnlp_transformer_nmt(seed=0, n=4, hidden=HIDDEN):
    return Case(_init(gm.TransformerTranslation(gm.units(hidden), VOCAB), seed),
                gm.translations(seed, n, VOCAB, max_len=4), [],
                notes="gluonnlp's Transformer encoder and decoder cells, a step per word")


def case_gluonnlp_beam_search(seed=0, n=4, hidden=HIDDEN):
    return Case(_init(gm.BeamSearchDecoder(hidden, VOCAB, DIM), seed),
                [source for source, _ in gm.translations(seed, n, VOCAB, max_len=4)], [],
                notes="gluonnlp's BeamSearchSampler (reads every step), the best re-scored")


#: Every case, by name.
CASES = {
    "node_losses": case_node_losses,
    "dict_returns": case_dict_returns,
    "dag_memo": case_dag_memo,
    "lstm_cell": case_lstm_cell,
    "gru_cell": case_gru_cell,
    "embedding": case_embedding,
    "child_attention": case_child_attention,
    "mid_sample_reads": case_mid_sample_reads,
    "hsoftmax_cbow": case_hsoftmax_cbow,
    "biaffine_arcs": case_biaffine_arcs,
    "routed_tokens": case_routed_tokens,
    "memory_hops": case_memory_hops,
    "tensor_tree": case_tensor_tree,
    "matrix_tree": case_matrix_tree,
    "held_vectors": case_held_vectors,
    "mixed_children": case_mixed_children,
    "dropout_p0": case_dropout_p0,
    "opbyop_child_sum": case_opbyop_child_sum,
    "opbyop_binary": case_opbyop_binary,
    "raw_lstm": case_raw_lstm,
    "gold_tokens": case_gold_tokens,
    "recursive_net": case_recursive_net,
    "mean_pool_tree": case_mean_pool_tree,
    "tagger_loss": case_tagger_loss,
    "node_loss_tree": case_node_loss_tree,
    "attentive_pooling": case_attentive_pooling,
    "message_passing": case_message_passing,
    "helper_rnn": case_helper_rnn,
    "unroll": case_unroll,
    "unroll_merged": case_unroll_merged,
    "fused_lstm": case_fused_lstm,
    "fused_bigru": case_fused_bigru,
    "dot_attention": case_dot_attention,
    "stacked_attention": case_stacked_attention,
    "concat_children": case_concat_children,
    "gluon_losses": case_gluon_losses,
    "char_word": case_char_word,
    "bigru_tagger": case_bigru_tagger,
    "seq2seq": case_seq2seq,
    "scalar_math": case_scalar_math,
    "weight_data": case_weight_data,
    "vector_tree": case_vector_tree,
    "vector_rnn": case_vector_rnn,
    "top_down": case_top_down,
    "cross_entropy": case_cross_entropy,
    "scored_children": case_scored_children,
    "closure_tree": case_closure_tree,
    "memory_slots": case_memory_slots,
    "crf": case_crf,
    "activations": case_activations,
    "method_tree": case_method_tree,
    "feedback": case_feedback,
    "graph_conv": case_graph_conv,
    "adjacency_gcn": case_adjacency_gcn,
    "picked_rows": case_picked_rows,
    "pointer_net": case_pointer_net,
    "memo_words": case_memo_words,
    "indexing_tree": case_indexing_tree,
    "self_attention": case_self_attention,
    "decomposable": case_decomposable,
    "graph_attention": case_graph_attention,
    "text_cnn": case_text_cnn,
    "vector_context": case_vector_context,
    "token_loss_mean": case_token_loss_mean,
    "gluonnlp_lstmp_lm": case_gluonnlp_lstmp_lm,
    "gluonnlp_mlp_seq2seq": case_gluonnlp_mlp_seq2seq,
    "gluonnlp_dot_seq2seq": case_gluonnlp_dot_seq2seq,
    "gluonnlp_char_highway": case_gluonnlp_char_highway,
    "gluonnlp_transformer_layer": case_gluonnlp_transformer_layer,
    "gluonnlp_bert": case_gluonnlp_bert,
    "gluonnlp_transformer_nmt": case_gluonnlp_transformer_nmt,
    "gluonnlp_beam_search": case_gluonnlp_beam_search,
}


# --------------------------------------------------------------------------
# Running a case
# --------------------------------------------------------------------------

def flatten(obj):
    """The NDArrays of nested lists, tuples (namedtuples) and dicts (by sorted key)."""
    if isinstance(obj, nd.NDArray):
        yield obj
    elif isinstance(obj, dict):
        for key in sorted(obj):
            yield from flatten(obj[key])
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from flatten(item)


def weighted_loss(outputs):
    """A scalar touching every output array with its own weight."""
    total = None
    for k, out in enumerate(flatten(outputs)):
        term = (out * out).sum() * (1.0 + 0.1 * k) + out.sum()
        total = term if total is None else total + term
    return total


def concat_loss(outputs):
    """A scalar of every output, as one loss over all of them concatenated."""
    flat = nd.concat(*[out.reshape((-1,)) for out in flatten(outputs)], dim=0)
    return (flat * flat).sum() + flat.sum()


def forward_backward(case, batching=None, train_mode=True, loss_fn=weighted_loss):
    """Forward and backward of every sample of ``case``.

    Parameters
    ----------
    case : Case
    batching : dict, optional
        Arguments of :func:`gluon_dynbatch.batching`; None runs eagerly.
    train_mode : bool, optional
        ``autograd.record(train_mode=...)``.
    loss_fn : callable, optional
        The scalar to differentiate, of the outputs.

    Returns
    -------
    outputs : list
    stats : BatchStats or None
    """
    with autograd.record(train_mode=train_mode):
        if batching is None:
            outputs, stats = case.outputs(), None
        else:
            with gdb.batching(**batching) as scope:
                outputs = case.outputs()
            stats = scope.stats
        loss = loss_fn(outputs)
    loss.backward()
    return outputs, stats


def run_case(case, batching=None, train_mode=True):
    """Outputs, gradients and stats of a case, as ``assert_same`` compares them.

    Returns
    -------
    tuple
        ``(values, grads, stats)``: the output arrays as numpy, the gradient
        of every Parameter (by name) and shared input (``input<k>``), and the
        scope's stats (None when eager).
    """
    for array in case.inputs:
        array.attach_grad()
    outputs, stats = forward_backward(case, batching, train_mode)
    values = [o.asnumpy() for o in flatten(outputs)]
    grads = {name: p.grad().asnumpy().copy()
             for name, p in case.model.collect_params().items() if p.grad_req != "null"}
    for k, array in enumerate(case.inputs):
        grads["input%d" % k] = array.grad.asnumpy().copy()
    return values, grads, stats
