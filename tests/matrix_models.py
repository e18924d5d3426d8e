"""User-style models over matrices and vectors of a sample's own: every word
attending to every word of its sentence, two sentences aligned word by word, a
graph's vertices attending to their neighbours, a sentence's (H,) vectors
broadcast onto its rows, a sentence's mean token loss.  Written for one
sample, as papers give them; ``user_models.CASES`` holds their cases."""
import math

import numpy as np
from mxnet.gluon import nn

import gluon_dynbatch as gdb


class SelfAttention(gdb.DynBatchBlock):
    """One layer of scaled dot-product self-attention over a sentence: queries,
    keys and values, a residual and ``nn.LayerNorm``, mean pooling, a classifier."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        with self.name_scope():
            self.query = nn.Dense(hidden, flatten=False)
            self.key = nn.Dense(hidden, flatten=False)
            self.value = nn.Dense(hidden, flatten=False)
            self.norm = nn.LayerNorm()
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        x = F.concat(*[emb[w:w + 1] for w in words], dim=0)
        q, k, v = self.query(x), self.key(x), self.value(x)
        weights = F.softmax(F.dot(q, k, transpose_b=True) / math.sqrt(self.hidden), axis=-1)
        h = self.norm(F.dot(weights, v) + q)
        return F.log_softmax(self.out(F.mean(h, axis=0, keepdims=True)))


class DecomposableAttention(gdb.DynBatchBlock):
    """Parikh et al.'s decomposable attention over a pair of sentences: each
    word of one aligned softly to the other (a softmax along each axis of their
    scores), compared and summed."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.attend = nn.Dense(hidden, activation="relu", flatten=False)
            self.compare = nn.Dense(hidden, activation="relu", flatten=False)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, pair, emb):
        a = F.concat(*[emb[w:w + 1] for w in pair[0]], dim=0)
        b = F.concat(*[emb[w:w + 1] for w in pair[1]], dim=0)
        scores = F.dot(self.attend(a), self.attend(b), transpose_b=True)
        beta = F.dot(F.softmax(scores, axis=1), b)
        alpha = F.dot(F.softmax(scores, axis=0), a, transpose_a=True)
        v1 = F.sum(self.compare(F.concat(a, beta, dim=1)), axis=0, keepdims=True)
        v2 = F.sum(self.compare(F.concat(b, alpha, dim=1)), axis=0, keepdims=True)
        return F.log_softmax(self.out(F.concat(v1, v2, dim=1)))


class GraphAttention(gdb.DynBatchBlock):
    """A graph attention layer (Velickovic et al.) on a dense mask built with
    numpy: ``LeakyReLU(a1(h) + a2(h).T)``, the mask added, a softmax over
    each vertex's neighbours, ``F.dot`` with the states."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(hidden, use_bias=False, flatten=False)
            self.src = nn.Dense(1, use_bias=False, flatten=False)
            self.dst = nn.Dense(1, use_bias=False, flatten=False)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, graph, emb):
        size = len(graph.words)
        mask = np.full((size, size), -1e9, dtype=np.float32)
        np.fill_diagonal(mask, 0.0)
        for i, nbrs in enumerate(graph.neighbours):
            mask[i, nbrs] = 0.0
        h = self.proj(F.concat(*[emb[w:w + 1] for w in graph.words], dim=0))
        scores = F.LeakyReLU(self.src(h) + F.transpose(self.dst(h)), slope=0.2)
        h = F.relu(F.dot(F.softmax(scores + F.array(mask), axis=1), h))
        return F.log_softmax(self.out(F.mean(h, axis=0, keepdims=True)))


class TextCNN(gdb.DynBatchBlock):
    """Kim's convolutional sentence classifier: the words' rows transposed to
    (1, E, T), convolutions of widths 2, 3 and 4 over time, each max-pooled."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.convs = [nn.Conv1D(hidden, width, padding=width // 2, activation="relu")
                          for width in (2, 3, 4)]
            for conv in self.convs:
                self.register_child(conv)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        x = F.concat(*[emb[w:w + 1] for w in words], dim=0)
        x = F.expand_dims(F.transpose(x), axis=0)                        # (1, E, T)
        pooled = [F.max(conv(x), axis=2) for conv in self.convs]
        return F.log_softmax(self.out(F.concat(*pooled, dim=1)))


class VectorContext(gdb.DynBatchBlock):
    """numpy-style vectors of a sentence's own: its rows centred on their mean
    (``x - F.mean(x, axis=0)``), an attention context summed without
    ``keepdims`` (an (H,) vector) that gates every row and is added to the
    pooled (1, H) row."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(hidden, activation="tanh", flatten=False)
            self.att = nn.Dense(1, flatten=False)
            self.out = nn.Dense(classes)

    def hybrid_forward(self, F, words, emb):
        x = self.proj(F.concat(*[emb[w:w + 1] for w in words], dim=0))
        centred = x - F.mean(x, axis=0)
        context = F.sum(F.softmax(self.att(x), axis=0) * x, axis=0)        # (H,)
        pooled = F.max(centred * F.sigmoid(context), axis=0, keepdims=True)
        return F.log_softmax(self.out(pooled + context))


class TokenLossMean(gdb.DynBatchBlock):
    """A sentence's loss as the mean of its (T,) token losses (``F.mean`` over
    every axis), plus ``F.sum(F.square(h))`` of its (T, H) states."""

    def __init__(self, hidden, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.proj = nn.Dense(hidden, activation="tanh", flatten=False)
            self.out = nn.Dense(classes, flatten=False)

    def hybrid_forward(self, F, words, emb):
        h = self.proj(F.concat(*[emb[w:w + 1] for w in words], dim=0))
        logp = F.log_softmax(self.out(h), axis=-1)
        tags = F.array([w % self.classes for w in words])
        losses = -F.pick(logp, tags, axis=1)                                    # (T,)
        return F.reshape(F.mean(losses) + 0.01 * F.sum(F.square(h)), (1, 1))


class TensorTree(gdb.DynBatchBlock):
    """Socher et al.'s recursive neural tensor network (2013) over binary trees: an
    inner node composes its children's (1, d) vectors ``ab`` as
    ``tanh(ab V ab^T + W ab)``, the bilinear term two ``batch_dot`` calls against
    the 3-d parameter ``V`` (d, 2d, 2d), as the paper's equation reads."""

    def __init__(self, vocab, dim, **kwargs):
        super().__init__(**kwargs)
        self.dim = dim
        with self.name_scope():
            self.embed = nn.Embedding(vocab, dim)
            self.compose = nn.Dense(dim, in_units=2 * dim)
        self.tensor = self.params.get("tensor", shape=(dim, 2 * dim, 2 * dim))

    def hybrid_forward(self, F, tree, tensor):  # pylint: disable=arguments-differ
        if not tree.children:
            return self.embed(F.array([tree.word]))
        ab = F.concat(*[self(child) for child in tree.children], dim=1)
        stacked = F.broadcast_to(F.expand_dims(ab, 0), (self.dim, 1, 2 * self.dim))
        bilinear = F.batch_dot(F.batch_dot(stacked, tensor), stacked, transpose_b=True)
        return F.tanh(F.reshape(bilinear, (1, self.dim)) + self.compose(ab))


class MatrixTreeParser(gdb.DynBatchBlock):
    """The loss of a sentence's gold non-projective dependency tree under the
    matrix-tree theorem (Koo et al. 2007; structured attention, Kim et al. 2017):
    arc scores ``h h^T`` of its words' vectors, the Laplacian of their
    exponentials with the root scores as its first row, ``log Z`` its
    ``F.linalg.slogdet``, minus the gold arcs' scores."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = nn.Dense(hidden, flatten=False)
            self.root = nn.Dense(1, flatten=False)

    def hybrid_forward(self, F, sample, emb):  # pylint: disable=arguments-differ
        words, heads = sample           # heads[j]: 0 for the root, else i + 1
        n = len(words)
        h = F.tanh(self.proj(F.concat(*[emb[w:w + 1] for w in words], dim=0)))
        scores = F.dot(h, h, transpose_b=True)                  # [i, j]: arc i -> j
        root = F.reshape(self.root(h), (1, n))
        weights = F.exp(scores) * F.array(1 - np.eye(n))
        laplacian = F.broadcast_mul(F.array(np.eye(n)), F.sum(weights, axis=0, keepdims=True)) \
            - weights
        laplacian = F.concat(F.exp(root), F.slice_axis(laplacian, axis=0, begin=1, end=n), dim=0)
        _, log_z = F.linalg.slogdet(laplacian)
        arcs, roots = np.zeros((n, n)), np.zeros((1, n))
        for j, head in enumerate(heads):
            if head:
                arcs[head - 1, j] = 1
            else:
                roots[0, j] = 1
        gold = F.sum(scores * F.array(arcs)) + F.sum(root * F.array(roots))
        return log_z - gold
