"""User-style models built on common Gluon idioms inside ``hybrid_forward``.

Word ids and labels made with ``F.array`` at every node or token, a Gluon
loss block called per node, children pooled with ``F.stack(..., axis=0)``
and a mean, attention weights soft-maxed over a sentence's tokens,
messages summed over a graph's neighbours, ``nn.Embedding`` and
``nn.LayerNorm`` children.  Each batches
as eager Gluon computes it; ``user_models.CASES`` holds their cases.
"""
import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon import nn, rnn

import gluon_dynbatch as gdb


class RecursiveNet(gdb.DynBatchBlock):
    """Socher-style recursive network over binary trees.

    A leaf looks its word up with an ``nn.Embedding`` child on ``F.array([word])``;
    an inner node composes its two children with one tanh layer.
    """

    def __init__(self, vocab, dim, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(vocab, dim)
            self.compose = nn.Dense(dim, in_units=2 * dim, activation="tanh")

    def hybrid_forward(self, F, tree):
        if not tree.children:
            return self.embed(F.array([tree.word]))
        left, right = (self(child) for child in tree.children)
        return self.compose(F.concat(left, right, dim=1))


class MeanPoolTree(gdb.DynBatchBlock):
    """Children stacked with ``F.stack(..., axis=0)``, averaged, scaled by Python numbers."""

    def __init__(self, hidden, dim, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden, in_units=dim)
            self.rec = nn.Dense(hidden, in_units=hidden, use_bias=False)
            self.norm = nn.LayerNorm(in_channels=hidden)

    def hybrid_forward(self, F, tree, emb):
        x = self.inp(emb[tree.word:tree.word + 1])
        if tree.children:
            kids = [self(child, emb) for child in tree.children]
            pooled = F.stack(*kids, axis=0).mean(axis=0)
            x = x + 0.5 * self.rec(pooled) / len(kids)
        return F.relu(self.norm(x))


class TaggerLoss(gdb.DynBatchBlock):
    """An LSTMCell tagger returning its mean token loss: ``F.pick`` of each ``F.array([tag])``."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.lstm = rnn.LSTMCell(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, sample, emb):
        words, tags = sample
        state = self.lstm.begin_state(batch_size=1)
        loss = 0
        for word, tag in zip(words, tags):
            out, state = self.lstm(emb[word:word + 1], state)
            logp = F.log_softmax(self.out(out))
            loss = loss - F.pick(logp, F.array([tag]), axis=1)
        return loss / len(words)


class NodeLossTree(gdb.DynBatchBlock):
    """A tree model calling ``gluon.loss.SoftmaxCrossEntropyLoss`` at every node.

    Returns ``(h, loss)``: the loss sums the node's and its subtrees'; the
    label of a node is ``F.array([word % classes])``.
    """

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.inp = nn.Dense(hidden, activation="tanh")
            self.cls = nn.Dense(classes)
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def hybrid_forward(self, F, tree, emb):
        h = self.inp(emb[tree.word:tree.word + 1])
        total = 0
        for child in tree.children:
            h_child, loss_child = self(child, emb)
            h = h + h_child
            total = total + loss_child
        label = F.array([tree.word % self.classes])
        return h, total + self.loss(self.cls(h), label)


class AttentivePooling(gdb.DynBatchBlock):
    """A ``rnn.GRUCell`` over a sentence, its states pooled by attention over the tokens."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = rnn.GRUCell(hidden)
            self.att = nn.Dense(1, flatten=False)
            self.proj = nn.Dense(hidden, activation="relu")

    def hybrid_forward(self, F, words, emb):
        state = self.cell.begin_state(batch_size=1)
        outputs = []
        for word in words:
            out, state = self.cell(emb[word:word + 1], state)
            outputs.append(out)
        states = F.concat(*outputs, dim=0)                  # (T, H)
        weights = F.softmax(self.att(states), axis=0)       # (T, 1)
        return self.proj(F.sum(F.broadcast_mul(weights, states), axis=0, keepdims=True))


class Graph:
    """A sample's graph: a word per vertex and each vertex's neighbours."""

    def __init__(self, words, neighbours):
        self.words, self.neighbours = words, neighbours


class MessagePassing(gdb.DynBatchBlock):
    """Two rounds of message passing over a sample's graph, then a max over the vertices.

    A vertex without neighbours sums nothing: ``sum([])`` is the integer 0.
    """

    def __init__(self, hidden, rounds=2, **kwargs):
        super().__init__(**kwargs)
        self.rounds = rounds
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.msg = nn.Dense(hidden)
            self.upd = nn.Dense(hidden)

    def hybrid_forward(self, F, graph, emb):
        h = [self.inp(emb[word:word + 1]) for word in graph.words]
        for _ in range(self.rounds):
            messages = [self.msg(v) for v in h]
            h = [F.tanh(self.upd(h[i]) + sum(messages[j] for j in graph.neighbours[i]))
                 for i in range(len(h))]
        return F.concat(*h, dim=0).max(axis=0, keepdims=True)


def elman_step(F, x, h, w_x, w_h, hidden):
    """One step of an Elman RNN: a plain Python helper, as users factor a cell."""
    return F.tanh(F.FullyConnected(x, w_x, no_bias=True, num_hidden=hidden)
                  + F.FullyConnected(h, w_h, no_bias=True, num_hidden=hidden))


class HelperRNN(gdb.DynBatchBlock):
    """An RNN over a sentence whose step is a Python function called per token."""

    def __init__(self, hidden, dim, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.w_x = self.params.get("w_x", shape=(hidden, dim))
            self.w_h = self.params.get("w_h", shape=(hidden, hidden))

    def hybrid_forward(self, F, words, emb, w_x, w_h):
        h = F.zeros((1, self.hidden))
        for word in words:
            h = elman_step(F, emb[word:word + 1], h, w_x, w_h, self.hidden)
        return h


class UnrollEncoder(gdb.DynBatchBlock):
    """``rnn.LSTMCell.unroll`` over a sentence's embedded words, then a classifier.

    ``unroll`` splits its input and stacks its outputs with ``mx.nd``
    operators called directly, not through ``F``.
    """

    def __init__(self, hidden, classes, merge=False, **kwargs):
        super().__init__(**kwargs)
        self.merge = merge
        with self.name_scope():
            self.cell = rnn.LSTMCell(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        x = F.concat(*[emb[w:w + 1] for w in words], dim=0).expand_dims(0)   # (1, T, E)
        outs, _ = self.cell.unroll(len(words), x, layout="NTC", merge_outputs=self.merge)
        last = outs[:, -1] if self.merge else outs[-1]
        return self.out(last)


class FusedLSTMEncoder(gdb.DynBatchBlock):
    """A fused ``rnn.LSTM`` layer run over a sentence laid out (T, 1, E).

    With ``bigru``, a two-layer bidirectional ``rnn.GRU`` over (1, T, E) instead.
    """

    def __init__(self, hidden, dim, classes, bigru=False, **kwargs):
        super().__init__(**kwargs)
        self.bigru = bigru
        with self.name_scope():
            if bigru:
                self.rnn = rnn.GRU(hidden, num_layers=2, bidirectional=True, layout="NTC",
                                   input_size=dim)
            else:
                self.rnn = rnn.LSTM(hidden, input_size=dim)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        x = F.concat(*[emb[w:w + 1] for w in words], dim=0)
        if self.bigru:
            return self.out(self.rnn(x.expand_dims(0))[:, -1])          # (1, T, E)
        return self.out(self.rnn(x.expand_dims(1))[-1])                 # (T, 1, E)


class DotAttention(gdb.DynBatchBlock):
    """GRU states of a sentence; the last state attends over them through ``F.dot``."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = rnn.GRUCell(hidden)
            self.query = nn.Dense(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        state = self.cell.begin_state(batch_size=1)
        states = []
        for word in words:
            h, state = self.cell(emb[word:word + 1], state)
            states.append(h)
        keys = F.concat(*states, dim=0)                                     # (T, H)
        scores = F.dot(self.query(states[-1]), keys, transpose_b=True)     # (1, T)
        context = F.dot(F.softmax(scores, axis=1), keys)                   # (1, H)
        return self.out(F.concat(context, states[-1], dim=1))


class ConcatChildren(gdb.DynBatchBlock):
    """Each child projected on its own, the projections concatenated into (k, H)
    with ``F.concat(*[...], dim=0)``, attention over them."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.proj = nn.Dense(hidden)
            self.att = nn.Dense(1)

    def hybrid_forward(self, F, tree, emb):
        x = self.inp(emb[tree.word:tree.word + 1])
        kids = [self(child, emb) for child in tree.children]
        if not kids:
            return F.tanh(x)
        keys = F.concat(*[F.tanh(self.proj(h)) for h in kids], dim=0)        # (k, H)
        weights = F.softmax(self.att(keys), axis=0)
        return F.tanh(x + F.sum(weights * keys, axis=0, keepdims=True))


class StackedAttention(gdb.DynBatchBlock):
    """RNN outputs stacked along axis 1 into (1, T, H); the last output attends over
    them through ``F.batch_dot``, scaled and masked, as batched code would write it."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.scale = 1.0 / hidden ** 0.5
        with self.name_scope():
            self.cell = rnn.RNNCell(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        state, outs = self.cell.begin_state(batch_size=1), []
        for word in words:
            h, state = self.cell(emb[word:word + 1], state)
            outs.append(h)
        memory = F.stack(*outs, axis=1)                                      # (1, T, H)
        scores = F.batch_dot(memory, outs[-1].expand_dims(2)) * self.scale    # (1, T, 1)
        scores = scores - 100.0 * (scores < -1.0)
        weights = F.softmax(scores, axis=1)
        context = F.sum(F.broadcast_mul(memory, weights), axis=1)            # (1, H)
        return F.log_softmax(self.out(context))


class BiGRUTagger(gdb.DynBatchBlock):
    """Forward and backward ``rnn.GRUCell`` over the tokens, a tag loss per token."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.forward_cell = rnn.GRUCell(hidden)
            self.backward_cell = rnn.GRUCell(hidden)
            self.tag = nn.Dense(classes)
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def _run(self, cell, inputs):
        state = cell.begin_state(batch_size=1)
        outputs = []
        for x in inputs:
            out, state = cell(x, state)
            outputs.append(out)
        return outputs

    def hybrid_forward(self, F, words, emb):
        inputs = [emb[w:w + 1] for w in words]
        forward = self._run(self.forward_cell, inputs)
        backward = self._run(self.backward_cell, inputs[::-1])[::-1]
        total = 0
        for word, f, b in zip(words, forward, backward):
            label = F.array([word % self.classes])
            total = total + self.loss(self.tag(F.concat(f, b, dim=1)), label)
        return total


class GluonLosses(gdb.DynBatchBlock):
    """A GRU sentence encoder scored by four ``gluon.loss`` blocks per sentence
    (each reshapes its label like the prediction)."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = rnn.GRUCell(hidden)
            self.out = nn.Dense(classes)
            self.l2 = gluon.loss.L2Loss()
            self.l1 = gluon.loss.L1Loss()
            self.huber = gluon.loss.HuberLoss()
            self.bce = gluon.loss.SigmoidBinaryCrossEntropyLoss()

    def hybrid_forward(self, F, words, emb):
        state = self.cell.begin_state(batch_size=1)
        for word in words:
            h, state = self.cell(emb[word:word + 1], state)
        y = self.out(h)
        label = F.array([[float(w % 2) for w in words[:1]] * y.shape[1]])
        return F.add_n(*[loss(y, label) for loss in (self.l2, self.l1, self.huber, self.bce)])


class CharWordTagger(gdb.DynBatchBlock):
    """A character ``rnn.GRUCell`` over each word feeding a word ``rnn.LSTMCell``,
    a tag loss per word: a recurrent loop inside a recurrent loop."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.char_cell = rnn.GRUCell(hidden)
            self.word_cell = rnn.LSTMCell(hidden)
            self.tag = nn.Dense(classes)
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def hybrid_forward(self, F, sentence, emb):
        state = self.word_cell.begin_state(batch_size=1)
        total = 0
        for word in sentence:
            chars = self.char_cell.begin_state(batch_size=1)
            for char in word:
                spelled, chars = self.char_cell(emb[char:char + 1], chars)
            out, state = self.word_cell(spelled, state)
            total = total + self.loss(self.tag(out), F.array([len(word) % self.classes]))
        return total


class Seq2SeqAttention(gdb.DynBatchBlock):
    """A GRU encoder, a GRU decoder attending over the encoder states with
    ``F.dot``, and a loss per target word: the decoder waits for the whole
    source, so its steps start at a depth that depends on the source length."""

    def __init__(self, hidden, vocab, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.encoder = rnn.GRUCell(hidden)
            self.decoder = rnn.GRUCell(hidden)
            self.combine = nn.Dense(hidden, activation="tanh")
            self.out = nn.Dense(vocab)
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def hybrid_forward(self, F, pair, emb):
        source, target = pair
        state = self.encoder.begin_state(batch_size=1)
        keys = []
        for word in source:
            h, state = self.encoder(emb[word:word + 1], state)
            keys.append(h)
        keys = F.concat(*keys, dim=0)
        total, previous = 0, 0
        for word in target:
            h, state = self.decoder(emb[previous:previous + 1], state)
            weights = F.softmax(F.dot(h, keys, transpose_b=True), axis=1)
            context = F.dot(weights, keys)
            logits = self.out(self.combine(F.concat(h, context, dim=1)))
            total = total + self.loss(logits, F.array([word]))
            previous = word
        return total


class ScalarMath(gdb.DynBatchBlock):
    """Python numbers in the arithmetic (``1 - x``, ``x ** 2``, ``0.5 * h``),
    ``F.where`` on a comparison, ``F.maximum``, and after the loop over the
    tokens a classifier with a ``F.one_hot`` target."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.proj = nn.Dense(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        h = None
        for word in words:
            x = self.proj(emb[word:word + 1])
            y = 1 - F.exp(-x * 0.5) + x ** 2 / 3
            y = F.maximum(F.where(x > 0, y, -y), 0.1 * x)
            h = y if h is None else 0.5 * (h + y)
        target = F.one_hot(F.array([len(words) % self.classes]), self.classes)
        return -F.sum(target * F.log_softmax(self.out(h))) + 0.01 * F.sum(F.abs(h))


class WeightData(gdb.DynBatchBlock):
    """A child's weight read with ``.data()`` in ``hybrid_forward`` (``F.dot`` against
    it), and a (1, H) Parameter scaling every node's state: ``F.tanh(x) * v``."""

    def __init__(self, hidden, dim, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(hidden, in_units=dim)
            self.scale = self.params.get("scale", shape=(1, hidden))

    def hybrid_forward(self, F, tree, emb, scale):
        x = F.dot(emb[tree.word:tree.word + 1], self.proj.weight.data(), transpose_b=True)
        x = x + self.proj.bias.data()
        for child in tree.children:
            x = x + F.tanh(self(child, emb))
        return F.tanh(x) * scale


class VectorTreeLSTM(gdb.DynBatchBlock):
    """A binary Tree-LSTM ported from DyNet line by line: 1-d vectors (``emb[w]``),
    ``W * x`` as ``F.dot(W, x)``, a (4H,) bias Parameter, gates by ``F.split``
    along axis 0 and by slicing; returns ``(h, c)``."""

    def __init__(self, hidden, dim, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.w_leaf = self.params.get("w_leaf", shape=(3 * hidden, dim))
            self.u_node = self.params.get("u_node", shape=(4 * hidden, 2 * hidden))
            self.b_node = self.params.get("b_node", shape=(4 * hidden,))

    def hybrid_forward(self, F, tree, emb, w_leaf, u_node, b_node):
        hid = self.hidden
        if not tree.children:
            gates = F.dot(w_leaf, emb[tree.word])
            i, o, u = gates[:hid], gates[hid:2 * hid], gates[2 * hid:]
            c = F.sigmoid(i) * F.tanh(u)
        else:
            kids = [self(child, emb) for child in tree.children[:2]]
            kids += [(F.zeros((hid,)), F.zeros((hid,)))] * (2 - len(kids))
            gates = F.dot(u_node, F.concat(kids[0][0], kids[1][0], dim=0)) + b_node
            i, f, o, u = F.split(gates, num_outputs=4, axis=0)
            c = F.sigmoid(i) * F.tanh(u) + F.sigmoid(f) * (kids[0][1] + kids[1][1])
        return F.sigmoid(o) * F.tanh(c), c


class VectorRNN(gdb.DynBatchBlock):
    """An Elman RNN on 1-d vectors as DyNet code writes it: ``tanh(W x + U h + b)``
    per token, scores ``F.dot(h, V)`` with the vector on the left."""

    def __init__(self, hidden, dim, classes, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.w = self.params.get("w", shape=(hidden, dim))
            self.u = self.params.get("u", shape=(hidden, hidden))
            self.b = self.params.get("b", shape=(hidden,))
            self.v = self.params.get("v", shape=(hidden, classes))

    def hybrid_forward(self, F, words, emb, w, u, b, v):
        h = F.zeros((self.hidden,))
        for word in words:
            h = F.tanh(F.dot(w, emb[word]) + F.dot(u, h) + b)
        return F.log_softmax(F.dot(h, v))


class TopDownTree(gdb.DynBatchBlock):
    """Recursive helper methods, not ``self(...)``: ``encode`` runs a GRU cell up
    the tree, keeping each node's state in a dict; ``decode`` runs down it from
    the root, appending a loss per node to a list.  Returns the mean loss."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.classes = hidden, classes
        with self.name_scope():
            self.up = rnn.GRUCell(hidden)
            self.down = nn.Dense(hidden, activation="tanh")
            self.out = nn.Dense(classes)

    def encode(self, F, tree, emb, states):
        h = F.zeros((1, self.hidden))
        for child in tree.children:
            h = h + self.encode(F, child, emb, states)
        h, _ = self.up(emb[tree.word:tree.word + 1], [h])
        states[id(tree)] = h
        return h

    def decode(self, F, tree, parent, states, losses):
        d = self.down(F.concat(states[id(tree)], parent, dim=1))
        scores = F.log_softmax(self.out(d))
        losses.append(F.pick(scores, F.array([tree.word % self.classes]), axis=1))
        for child in tree.children:
            self.decode(F, child, d, states, losses)

    def hybrid_forward(self, F, tree, emb):
        states, losses = {}, []
        root = self.encode(F, tree, emb, states)
        self.decode(F, tree, F.zeros_like(root), states, losses)
        return -F.add_n(*losses) / len(losses)


class CrossEntropyTagger(gdb.DynBatchBlock):
    """A GRU tagger summing ``F.softmax_cross_entropy`` of each token's scores,
    starting from the Python number 0."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.cell = rnn.GRUCell(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        state, loss = self.cell.begin_state(batch_size=1), 0
        for word in words:
            h, state = self.cell(emb[word:word + 1], state)
            loss = loss + F.softmax_cross_entropy(self.out(h), F.array([word % self.classes]))
        return loss


class ScoredChildren(gdb.DynBatchBlock):
    """Attention over the children written child by child: one (1, 1) score per
    child, the scores concatenated into a row, soft-maxed, and ``F.dot`` of the
    weights with the children's states."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.att = nn.Dense(1, use_bias=False)
            self.mix = nn.Dense(hidden, use_bias=False)

    def hybrid_forward(self, F, tree, emb):
        x = self.inp(emb[tree.word:tree.word + 1])
        kids = [self(child, emb) for child in tree.children]
        if not kids:
            return F.tanh(x)
        scores = F.concat(*[self.att(F.tanh(h + x)) for h in kids], dim=1)     # (1, k)
        context = F.dot(F.softmax(scores, axis=1), F.concat(*kids, dim=0))   # (1, H)
        return F.tanh(x + self.mix(context))


class ClosureTree(gdb.DynBatchBlock):
    """A tree RNN recursing through a function nested in ``hybrid_forward``."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.u = nn.Dense(hidden, use_bias=False)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, tree, emb):
        def encode(node):
            x = self.inp(emb[node.word:node.word + 1])
            for child in node.children:
                x = x + self.u(encode(child))
            return F.tanh(x)
        return F.log_softmax(self.out(encode(tree)))


class MemorySlots(gdb.DynBatchBlock):
    """A few memory slots, one row each, gated and updated at every token (a small
    recurrent entity network): each sample's own (slots, H) state."""

    def __init__(self, hidden, classes, slots=3, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.keys = self.params.get("keys", shape=(slots, hidden))
            self.u = nn.Dense(hidden, use_bias=False)
            self.v = nn.Dense(hidden, use_bias=False)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb, keys):
        memory = keys
        for word in words:
            s = emb[word:word + 1]                                           # (1, H)
            gate = F.sigmoid(F.dot(memory, s, transpose_b=True)
                             + F.dot(keys, s, transpose_b=True))              # (slots, 1)
            new = F.relu(self.u(memory) + self.v(keys) + F.broadcast_like(s, memory))
            memory = F.L2Normalization(memory + F.broadcast_mul(gate, new))
        return F.log_softmax(self.out(F.sum(memory, axis=0, keepdims=True)))


class CRFTagger(gdb.DynBatchBlock):
    """A linear-chain CRF's negative log-likelihood over one sentence: the
    forward algorithm token by token, ``F.transpose`` of the (1, C) scores
    against a (C, C) transition Parameter, and the gold path's score."""

    def __init__(self, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.emit = nn.Dense(classes)
            self.trans = self.params.get("trans", shape=(classes, classes))

    def hybrid_forward(self, F, words, emb, trans):
        tags = [word % self.classes for word in words]
        scores = self.emit(F.concat(*[emb[w:w + 1] for w in words], dim=0))     # (T, C)
        alpha = scores[0:1]
        gold = F.pick(scores[0:1], F.array(tags[:1]), axis=1)
        for t in range(1, len(words)):
            paths = F.broadcast_add(F.transpose(alpha), trans)                  # (C, C)
            top = F.max(paths, axis=0, keepdims=True)
            alpha = top + F.log(F.sum(F.exp(F.broadcast_sub(paths, top)), axis=0,
                                      keepdims=True)) + scores[t:t + 1]
            gold = gold + F.pick(scores[t:t + 1], F.array(tags[t:t + 1]), axis=1)
        top = F.max(alpha, axis=1)
        return top + F.log(F.sum(F.exp(F.broadcast_sub(alpha, top.reshape((1, 1)))))) - gold


class ActivationTree(gdb.DynBatchBlock):
    """Gluon's activation blocks in a tree: ``nn.PReLU`` (one slope, and one per
    channel), ``nn.LeakyReLU``, ``nn.ELU`` and ``nn.Activation``."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.u = nn.Dense(hidden, use_bias=False)
            self.prelu = nn.PReLU()
            self.channel_prelu = nn.PReLU(mx.init.Uniform(0.5), in_channels=hidden)
            self.leaky, self.elu = nn.LeakyReLU(0.1), nn.ELU()
            self.act = nn.Activation("softrelu")

    def hybrid_forward(self, F, tree, emb):
        x = self.prelu(self.inp(emb[tree.word:tree.word + 1]))
        for child in tree.children:
            x = x + self.leaky(self.u(self(child, emb)))
        return self.act(self.elu(self.channel_prelu(x)))


class MethodTree(gdb.DynBatchBlock):
    """DyNet's style: a recursive method without ``F`` (``expr_for_tree``) calling
    child blocks and fluent methods, the root's result classified in
    ``hybrid_forward``."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.u = nn.Dense(hidden, use_bias=False)
            self.out = nn.Dense(classes)

    def expr_for_tree(self, tree, emb):
        x = self.inp(emb[tree.word:tree.word + 1])
        for child in tree.children:
            x = x + self.u(self.expr_for_tree(child, emb))
        return x.tanh()

    def hybrid_forward(self, F, tree, emb):
        return F.log_softmax(self.out(self.expr_for_tree(tree, emb)))


class FeedbackTree(gdb.DynBatchBlock):
    """Zero-gradient operators inside a node's calls: a child's predicted class fed
    back as ``F.one_hot(F.argmax(...))``, a mask ``F.where(k > 0, ...)``, and
    ``k.detach()`` / ``F.stop_gradient``; several terms added per child."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.cls = nn.Dense(classes)
            self.back = nn.Dense(hidden)

    def hybrid_forward(self, F, tree, emb):
        x = self.inp(emb[tree.word:tree.word + 1])
        for child in tree.children:
            k = self(child, emb)
            guess = F.one_hot(F.argmax(self.cls(k), axis=1), self.classes)
            x = x + self.back(guess) + F.where(k > 0, k, 0.5 * k) \
                + 0.1 * k.detach() + 0.1 * F.stop_gradient(k * 2)
        return F.tanh(x)


class GraphConv(gdb.DynBatchBlock):
    """Graph convolution as users write it per vertex: ``F.add_n`` over the
    neighbours divided by their count (``F.zeros_like`` for none), three rounds,
    a mean of the vertices by ``sum(h) / len(h)`` and the loss inside the call."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.inp = nn.Dense(hidden, activation="relu")
            self.conv = nn.Dense(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, graph, emb):
        h = [self.inp(emb[word:word + 1]) for word in graph.words]
        for _ in range(3):
            h = [F.relu(self.conv(h[i] + (F.add_n(*[h[j] for j in nbrs]) / len(nbrs)
                                          if nbrs else F.zeros_like(h[i]))))
                 for i, nbrs in enumerate(graph.neighbours)]
        label = F.one_hot(F.array([len(graph.words) % self.classes]), self.classes)
        return -F.sum(label * F.log_softmax(self.out(sum(h) / len(h))))


class AdjacencyGCN(gdb.DynBatchBlock):
    """A graph convolution as the textbook writes it for one graph: the
    normalised adjacency ``D^-1 (A + I)`` built with numpy, ``F.array`` of it,
    ``relu(W (A H))`` twice and a max over the vertices."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.conv1 = nn.Dense(hidden)
            self.conv2 = nn.Dense(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, graph, emb):
        size = len(graph.words)
        adjacency = np.eye(size, dtype=np.float32)
        for i, nbrs in enumerate(graph.neighbours):
            adjacency[i, nbrs] = 1.0
        adjacency = F.array(adjacency / adjacency.sum(axis=1, keepdims=True))
        h = self.inp(F.concat(*[emb[w:w + 1] for w in graph.words], dim=0))
        h = F.relu(self.conv1(F.dot(adjacency, h)))
        h = F.relu(self.conv2(F.dot(adjacency, h)))
        return F.log_softmax(self.out(F.max(h, axis=0, keepdims=True)))


class PickedRows(gdb.DynBatchBlock):
    """A GRU over a sentence; the states of some words (every word whose id is
    even, a list of the sample's own) picked with ``F.take(H, F.array(idx))``
    and averaged."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = rnn.GRUCell(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        state, outs = self.cell.begin_state(batch_size=1), []
        for word in words:
            out, state = self.cell(emb[word:word + 1], state)
            outs.append(out)
        picks = [k for k, word in enumerate(words) if word % 2 == 0] or [len(words) - 1]
        picked = F.take(F.concat(*outs, dim=0), F.array(picks))
        return F.log_softmax(self.out(F.mean(picked, axis=0, keepdims=True)))


class IndexingTree(gdb.DynBatchBlock):
    """Indexing and mode idioms per node: columns reversed and stepped
    (``x[:, ::-1]``, ``x[:, 1::2]``), ``F.sum_axis``, ``F.tile``, a child and a
    value of the node's own added twice."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = nn.Dense(hidden)
            self.kid = nn.Dense(hidden, use_bias=False)

    def hybrid_forward(self, F, tree, emb):
        x = self.inp(emb[tree.word:tree.word + 1])
        kids = [self(child, emb) for child in tree.children]
        if kids:
            x = x + self.kid(sum(kids + kids[:1]))
        x = sum([x, x, F.tanh(x)]) / 3
        scale = F.sigmoid(F.sum_axis(x, axis=1, keepdims=True))
        half = F.tile(x[:, 1::2], reps=(1, 2))
        return F.tanh(x[:, ::-1] * scale + half)


class PointerNet(gdb.DynBatchBlock):
    """A pointer network trained on the sample's own gold pointers: a GRU
    encodes the words, and each decoder step scores every encoder state
    against its query and feeds the pointed-at state ``H[i:i + 1]`` (a slice
    at a position of the sample's own) back as the next input."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.enc = rnn.GRUCell(hidden)
            self.dec = rnn.GRUCell(hidden)
            self.query = nn.Dense(hidden, use_bias=False)

    def hybrid_forward(self, F, sample, emb):
        words, pointers = sample
        state, outs = self.enc.begin_state(batch_size=1), []
        for word in words:
            out, state = self.enc(emb[word:word + 1], state)
            outs.append(out)
        H = F.concat(*outs, dim=0)
        inp, losses = F.mean(H, axis=0, keepdims=True), []
        for i in pointers:
            out, state = self.dec(inp, state)
            scores = F.dot(self.query(out), H, transpose_b=True)
            losses.append(-F.log_softmax(scores)[:, i:i + 1])
            inp = H[i:i + 1]
        return F.concat(*losses, dim=1)


class MemoWords(gdb.DynBatchBlock):
    """A word LSTM whose word vectors (a projection of the embedding) are
    memoised in a dict that every sample of the batch shares: a word seen by
    an earlier sample is read from the dict, not computed again."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(hidden)
            self.cell = rnn.LSTMCell(hidden)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, cache, emb):
        state = self.cell.begin_state(batch_size=1)
        for word in words:
            vec = cache.get(word)
            if vec is None:
                vec = cache[word] = F.tanh(self.proj(emb[word:word + 1]))
            out, state = self.cell(vec, state)
        return F.log_softmax(self.out(out))
