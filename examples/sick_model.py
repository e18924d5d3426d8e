"""Dependency (Child-Sum) Tree-LSTM for SICK relatedness (Tai et al. 2015).

The tree encoder is written for one sentence at a time, recursing over the
children of a node; :mod:`gluon_dynbatch` batches the calls of all trees of a
minibatch when they run inside one :func:`gluon_dynbatch.batching` scope.
"""
import logging

import mxnet as mx
import numpy as np
from mxnet import gluon

import gluon_dynbatch as gdb

from .sick_data import NUM_CLASSES, expected_score, target_distribution

LOG = logging.getLogger(__name__)


class ChildSumLSTMCell(gluon.HybridBlock):
    """One Child-Sum Tree-LSTM node update.

    ``i, o, u`` are computed from the input and the sum of the children's
    hidden states; each child ``k`` gets its own forget gate
    ``f_k = sigmoid(W_f x + U_f h_k + b_f)``; then
    ``c = i * u + sum_k f_k * c_k`` and ``h = o * tanh(c)``.  Without the
    output gate (as in Tai et al.'s code for SICK, ``gate_output = false``)
    ``h = tanh(c)``.

    Parameters
    ----------
    hidden_size : int
        Memory dimension H.
    input_size : int
        Input (embedding) dimension D.
    output_gate : bool, optional
        Use the output gate ``o`` (default True).  When False the
        parameters hold no rows for it: ``x_weight`` is (3H, D) for
        ``i, u, f`` and ``h_iou_weight`` is (2H, H) for ``i, u``; with it
        they are (4H, D) for ``i, o, u, f`` and (3H, H) for ``i, o, u``.
    **kwargs
        Passed to :class:`mxnet.gluon.HybridBlock`.
    """

    def __init__(self, hidden_size, input_size, output_gate=True, **kwargs):
        super().__init__(**kwargs)
        self._hidden_size = hidden_size
        self.output_gate = output_gate
        n_iou = 3 if output_gate else 2
        self._n_iou = n_iou
        with self.name_scope():
            self.x_weight = self.params.get(
                "x_weight", shape=((n_iou + 1) * hidden_size, input_size),
                init=mx.init.Xavier())
            self.x_bias = self.params.get(
                "x_bias", shape=((n_iou + 1) * hidden_size,), init="zeros")
            self.h_iou_weight = self.params.get(
                "h_iou_weight", shape=(n_iou * hidden_size, hidden_size),
                init=mx.init.Xavier())
            self.h_f_weight = self.params.get(
                "h_f_weight", shape=(hidden_size, hidden_size),
                init=mx.init.Xavier())

    def _gate(self, F, x, k, act):
        """Slice gate ``k`` (width H) out of ``x`` and apply ``act``."""
        hid = self._hidden_size
        part = F.slice_axis(x, axis=1, begin=k * hid, end=(k + 1) * hid)
        return F.Activation(part, act_type=act)

    def hybrid_forward(self, F, x, child_h, child_c, x_weight, x_bias,
                       h_iou_weight, h_f_weight):
        """Compute ``(h, c)`` of a node.

        Parameters
        ----------
        F : module
            ``mx.nd`` or ``mx.sym``.
        x : NDArray
            Input of the node, shape (1, D).
        child_h, child_c : NDArray
            Hidden and memory states of the k children, shape (k, H); one
            row of zeros for a leaf.

        Returns
        -------
        tuple of NDArray
            ``(h, c)``, each of shape (1, H).
        """
        hid, n_iou = self._hidden_size, self._n_iou
        x_all = F.FullyConnected(x, x_weight, x_bias,
                                 num_hidden=(n_iou + 1) * hid)
        h_sum = F.sum(child_h, axis=0, keepdims=True)
        iou = (F.slice_axis(x_all, axis=1, begin=0, end=n_iou * hid)
               + F.FullyConnected(h_sum, h_iou_weight, no_bias=True,
                                  num_hidden=n_iou * hid))
        i = self._gate(F, iou, 0, "sigmoid")
        u = self._gate(F, iou, n_iou - 1, "tanh")
        f_x = F.slice_axis(x_all, axis=1, begin=n_iou * hid,
                           end=(n_iou + 1) * hid)
        f_h = F.FullyConnected(child_h, h_f_weight, no_bias=True,
                               num_hidden=hid)
        f = F.Activation(F.broadcast_add(f_h, f_x), act_type="sigmoid")
        c = i * u + F.sum(f * child_c, axis=0, keepdims=True)
        h = F.Activation(c, act_type="tanh")
        if self.output_gate:
            h = self._gate(F, iou, 1, "sigmoid") * h
        return h, c


class ChildSumTreeLSTM(gdb.DynBatchBlock):
    """Child-Sum Tree-LSTM over a dependency tree, written per sentence.

    Parameters
    ----------
    hidden_size : int
        Memory dimension H.
    input_size : int
        Word-embedding dimension D.
    strategy : str, optional
        Batching strategy for :class:`gluon_dynbatch.DynBatchBlock`; None
        keeps the library's default.
    analysis_budget : optional
        Passed to :class:`gluon_dynbatch.DynBatchBlock` when not None.
    output_gate : bool, optional
        Passed to :class:`ChildSumLSTMCell` (default True).
    **kwargs
        Passed to :class:`mxnet.gluon.HybridBlock`.
    """

    def __init__(self, hidden_size, input_size, strategy=None,
                 analysis_budget=None, output_gate=True, **kwargs):
        if strategy is not None:
            kwargs["strategy"] = strategy
        if analysis_budget is not None:
            kwargs["analysis_budget"] = analysis_budget
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.input_size = input_size
        with self.name_scope():
            self.cell = ChildSumLSTMCell(hidden_size, input_size,
                                         output_gate=output_gate)

    def hybrid_forward(self, F, tree, embeddings):
        """Encode the subtree rooted at ``tree``.

        Parameters
        ----------
        F : module
            Operator namespace.
        tree : examples.sick_data.Tree
            Root of the subtree; every node's ``word`` must be set.
        embeddings : NDArray
            The whole (fixed) embedding table, shape (V, D).

        Returns
        -------
        tuple of NDArray
            ``(h, c)`` of the root, each of shape (1, H).
        """
        if tree.word is None:
            raise ValueError(f"tree node {tree.index} has no word id; "
                             "call sick_data.attach_words first")
        states = [self(child, embeddings) for child in tree.children]
        if states:
            child_h = F.concat(*[s[0] for s in states], dim=0)
            child_c = F.concat(*[s[1] for s in states], dim=0)
        else:
            child_h = F.zeros((1, self.hidden_size))
            child_c = F.zeros((1, self.hidden_size))
        x = embeddings[tree.word:tree.word + 1]
        return self.cell(x, child_h, child_c)


class OpByOpTreeLSTM(gdb.DynBatchBlock):
    """Child-Sum Tree-LSTM written operator by operator, as users write it.

    The same function as :class:`ChildSumTreeLSTM` (with the same
    ``output_gate`` option), written without a cell block: ``nn.Dense``
    children are called directly in :meth:`hybrid_forward`, the gates come
    out of ``F.split``, and a Python loop over the children computes one
    forget gate per child, ``f_k = sigmoid(W_f x + b_f + U_f h_k)``.  The
    children's hidden states are summed with Python's ``sum`` (as in
    ``sum(h for h, _ in states)``: one addition per child, the first to the
    integer 0); a leaf sums to ``F.zeros((1, H))`` and has no forget gate.
    Use :func:`copy_encoder_weights` to give it a cell encoder's weights.

    Parameters
    ----------
    hidden_size : int
        Memory dimension H.
    input_size : int
        Word-embedding dimension D.
    strategy : str, optional
        Batching strategy for :class:`gluon_dynbatch.DynBatchBlock`; None
        keeps the library's default.
    analysis_budget : optional
        Passed to :class:`gluon_dynbatch.DynBatchBlock` when not None.
    output_gate : bool, optional
        Use the output gate ``o`` (default True); without it
        ``h = tanh(c)``.
    **kwargs
        Passed to :class:`mxnet.gluon.HybridBlock`.

    Attributes
    ----------
    iou_x : mxnet.gluon.nn.Dense
        ``W x + b`` of the gates ``i, o, u`` (``i, u`` without the output
        gate), stacked in that order.
    iou_h : mxnet.gluon.nn.Dense
        ``U h_sum`` of the same gates, no bias.
    f_x : mxnet.gluon.nn.Dense
        ``W_f x + b_f`` of the forget gates.
    f_h : mxnet.gluon.nn.Dense
        ``U_f h_k``, no bias.
    """

    def __init__(self, hidden_size, input_size, strategy=None,
                 analysis_budget=None, output_gate=True, **kwargs):
        if strategy is not None:
            kwargs["strategy"] = strategy
        if analysis_budget is not None:
            kwargs["analysis_budget"] = analysis_budget
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.input_size = input_size
        self.output_gate = output_gate
        n_iou = 3 if output_gate else 2
        dense = gluon.nn.Dense
        with self.name_scope():
            self.iou_x = dense(n_iou * hidden_size, in_units=input_size,
                               weight_initializer=mx.init.Xavier())
            self.iou_h = dense(n_iou * hidden_size, in_units=hidden_size,
                               use_bias=False,
                               weight_initializer=mx.init.Xavier())
            self.f_x = dense(hidden_size, in_units=input_size,
                             weight_initializer=mx.init.Xavier())
            self.f_h = dense(hidden_size, in_units=hidden_size,
                             use_bias=False,
                             weight_initializer=mx.init.Xavier())

    def hybrid_forward(self, F, tree, embeddings):
        """Encode the subtree rooted at ``tree``.

        Parameters
        ----------
        F : module
            Operator namespace.
        tree : examples.sick_data.Tree
            Root of the subtree; every node's ``word`` must be set.
        embeddings : NDArray
            The whole (fixed) embedding table, shape (V, D).

        Returns
        -------
        tuple of NDArray
            ``(h, c)`` of the root, each of shape (1, H).
        """
        if tree.word is None:
            raise ValueError(f"tree node {tree.index} has no word id; "
                             "call sick_data.attach_words first")
        states = [self(child, embeddings) for child in tree.children]
        x = embeddings[tree.word:tree.word + 1]
        if states:
            h_sum = sum(h for h, _ in states)
        else:
            h_sum = F.zeros((1, self.hidden_size))
        iou = self.iou_x(x) + self.iou_h(h_sum)
        if self.output_gate:
            i, o, u = F.split(iou, num_outputs=3, axis=1)
        else:
            i, u = F.split(iou, num_outputs=2, axis=1)
        c = F.sigmoid(i) * F.tanh(u)
        f_x = self.f_x(x)
        for h_k, c_k in states:
            c = c + F.sigmoid(f_x + self.f_h(h_k)) * c_k
        h = F.tanh(c)
        if self.output_gate:
            h = F.sigmoid(o) * h
        return h, c


#: Encoders of :class:`SimilarityModel`, by the name its ``encoder`` takes.
ENCODERS = {"cell": ChildSumTreeLSTM, "opbyop": OpByOpTreeLSTM}

#: The cell's parameters, in the layout :func:`encoder_weights` returns.
CELL_WEIGHTS = ("x_weight", "x_bias", "h_iou_weight", "h_f_weight")


def _opbyop_layers(encoder):
    """The (x-side, h-side) Dense layers of an :class:`OpByOpTreeLSTM`."""
    return (encoder.iou_x, encoder.f_x), (encoder.iou_h, encoder.f_h)


def encoder_weights(encoder, grad=False):
    """An encoder's weights (or their gradients) in the cell's layout.

    Parameters
    ----------
    encoder : ChildSumTreeLSTM or OpByOpTreeLSTM
    grad : bool, optional
        Return the gradients instead of the weights.

    Returns
    -------
    dict of str to NDArray
        ``x_weight`` ((n+1)H, D: the rows of ``i, (o,) u`` then ``f``),
        ``x_bias``, ``h_iou_weight`` (nH, H) and ``h_f_weight`` (H, H),
        as :class:`ChildSumLSTMCell` holds them.
    """
    def value(param):
        return param.grad() if grad else param.data()

    if isinstance(encoder, ChildSumTreeLSTM):
        return {k: value(getattr(encoder.cell, k)) for k in CELL_WEIGHTS}
    (iou_x, f_x), (iou_h, f_h) = _opbyop_layers(encoder)
    return {
        "x_weight": mx.nd.concat(value(iou_x.weight), value(f_x.weight),
                                 dim=0),
        "x_bias": mx.nd.concat(value(iou_x.bias), value(f_x.bias), dim=0),
        "h_iou_weight": value(iou_h.weight).copy(),
        "h_f_weight": value(f_h.weight).copy(),
    }


def set_encoder_weights(encoder, weights):
    """Set an encoder's weights from the cell's layout.

    Parameters
    ----------
    encoder : ChildSumTreeLSTM or OpByOpTreeLSTM
    weights : dict of str to NDArray
        As :func:`encoder_weights` returns them.
    """
    if isinstance(encoder, ChildSumTreeLSTM):
        for key in CELL_WEIGHTS:
            getattr(encoder.cell, key).set_data(weights[key])
        return
    (iou_x, f_x), (iou_h, f_h) = _opbyop_layers(encoder)
    rows = iou_x.weight.shape[0]
    iou_x.weight.set_data(weights["x_weight"][:rows])
    f_x.weight.set_data(weights["x_weight"][rows:])
    iou_x.bias.set_data(weights["x_bias"][:rows])
    f_x.bias.set_data(weights["x_bias"][rows:])
    iou_h.weight.set_data(weights["h_iou_weight"])
    f_h.weight.set_data(weights["h_f_weight"])


def copy_encoder_weights(source, target):
    """Give ``target`` the weights of ``source`` (either encoder, either way).

    Both must have the same sizes and ``output_gate``; they then compute
    the same function.

    Parameters
    ----------
    source, target : ChildSumTreeLSTM or OpByOpTreeLSTM
    """
    set_encoder_weights(target, encoder_weights(source))


class SimilarityHead(gluon.HybridBlock):
    """Relatedness classifier on two sentence vectors.

    ``log_softmax(W_p sigmoid(W [h_a * h_b; |h_a - h_b|] + b) + b_p)``.

    Parameters
    ----------
    memory_size : int
        Dimension H of the sentence vectors.
    hidden_size : int, optional
        Width of the sigmoid layer.
    num_classes : int, optional
        Number of score classes K.
    **kwargs
        Passed to :class:`mxnet.gluon.HybridBlock`.
    """

    def __init__(self, memory_size, hidden_size=50, num_classes=NUM_CLASSES,
                 **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.hidden = gluon.nn.Dense(hidden_size, activation="sigmoid",
                                         in_units=2 * memory_size)
            self.out = gluon.nn.Dense(num_classes, in_units=hidden_size)

    def hybrid_forward(self, F, h_a, h_b):
        """Return class log-probabilities.

        Parameters
        ----------
        F : module
            Operator namespace.
        h_a, h_b : NDArray
            Sentence vectors, shape (B, H).

        Returns
        -------
        NDArray
            Log-probabilities, shape (B, K).
        """
        features = F.concat(h_a * h_b, F.abs(h_a - h_b), dim=1)
        return F.log_softmax(self.out(self.hidden(features)), axis=-1)


class SimilarityModel(gluon.Block):
    """Tree-LSTM encoder shared by both sentences plus a similarity head.

    Parameters
    ----------
    input_size : int
        Word-embedding dimension D.
    memory_size : int, optional
        Tree-LSTM memory dimension.
    hidden_size : int, optional
        Width of the head's hidden layer.
    num_classes : int, optional
        Number of score classes.
    dynbatch : bool, optional
        Encode all trees of a call inside one ``gdb.batching()`` scope; when
        False every tree runs eagerly, one after the other.
    strategy : str, optional
        Batching strategy, passed to the encoder when not None.
    num_words : int, optional
        When given, the model owns a trainable (num_words, input_size) word
        embedding table, the parameter ``embedding`` (weight decay
        multiplier 0), used whenever :meth:`forward` gets no table.  Set its
        initial values with ``model.embedding.set_data(table)`` after
        ``initialize``.  When None (the default) the table is passed to
        every call and stays fixed.
    output_gate : bool, optional
        Passed to the encoder (default True).
    encoder : {"cell", "opbyop"}, optional
        The tree encoder: :class:`ChildSumTreeLSTM`, whose node update is
        one :class:`ChildSumLSTMCell` call (the default), or
        :class:`OpByOpTreeLSTM`, the same function written operator by
        operator.  Their parameters have different names, so saved
        parameters load into a model of the same encoder only.
    **kwargs
        Passed to :class:`mxnet.gluon.Block`.
    """

    def __init__(self, input_size, memory_size=150, hidden_size=50,
                 num_classes=NUM_CLASSES, dynbatch=True, strategy=None,
                 num_words=None, output_gate=True, encoder="cell", **kwargs):
        if encoder not in ENCODERS:
            raise ValueError("unknown encoder %r; choose one of %s"
                             % (encoder, ", ".join(sorted(ENCODERS))))
        super().__init__(**kwargs)
        self.dynbatch = dynbatch
        self.num_classes = num_classes
        with self.name_scope():
            self.embedding = None
            if num_words is not None:
                self.embedding = self.params.get(
                    "embedding", shape=(num_words, input_size),
                    init=mx.init.Uniform(0.05), wd_mult=0.0)
            self.encoder = ENCODERS[encoder](memory_size, input_size,
                                             strategy=strategy,
                                             output_gate=output_gate)
            self.head = SimilarityHead(memory_size, hidden_size, num_classes)

    def encode(self, trees, embeddings):
        """Encode trees; return their root hidden states as one (N, H) array.

        Parameters
        ----------
        trees : list of Tree
        embeddings : NDArray
            Embedding table (V, D).

        Returns
        -------
        NDArray
            Shape (len(trees), H).
        """
        if self.dynbatch:
            with gdb.batching():
                states = [self.encoder(tree, embeddings) for tree in trees]
        else:
            states = [self.encoder(tree, embeddings) for tree in trees]
        return mx.nd.concat(*[h for h, _ in states], dim=0)

    def forward(self, pairs, embeddings=None):
        """Predict class log-probabilities for sentence pairs.

        Parameters
        ----------
        pairs : list of SickPair
            Pairs whose trees carry word ids.
        embeddings : NDArray, optional
            Embedding table (V, D), held fixed.  None uses the model's own
            trainable table (``num_words`` given at construction).

        Returns
        -------
        NDArray
            Log-probabilities, shape (len(pairs), K).

        Raises
        ------
        ValueError
            No table is given and the model owns none.
        """
        if embeddings is None:
            if self.embedding is None:
                raise ValueError("no embedding table: pass one, or build "
                                 "the model with num_words")
            embeddings = self.embedding.data()
        trees = [p.a_tree for p in pairs] + [p.b_tree for p in pairs]
        roots = self.encode(trees, embeddings)
        n = len(pairs)
        h_a = mx.nd.slice_axis(roots, axis=0, begin=0, end=n)
        h_b = mx.nd.slice_axis(roots, axis=0, begin=n, end=2 * n)
        return self.head(h_a, h_b)


def make_loss():
    """Return the KL-divergence loss against sparse targets.

    In MXNet 1.9 ``KLDivLoss`` sums ``p * (log p - log q)`` over the classes,
    so each entry is the KL divergence of one pair.  (Torch's
    ``DistKLDivCriterion`` in Tai et al.'s code also divides by the number
    of classes K; AdaGrad's steps do not depend on that scale, but an L2
    penalty added to the gradient does, see ``tree_lstm_sick.add_l2``.)

    Returns
    -------
    mxnet.gluon.loss.KLDivLoss
        Called as ``loss(log_probs, targets)``, returns shape (B,).
    """
    return gluon.loss.KLDivLoss(from_logits=True)


def batch_targets(pairs, num_classes=NUM_CLASSES, ctx=None):
    """Sparse target distributions of a list of pairs as an (B, K) NDArray.

    Parameters
    ----------
    pairs : list of SickPair
    num_classes : int, optional
    ctx : mxnet.Context, optional

    Returns
    -------
    NDArray
    """
    scores = np.array([p.score for p in pairs], dtype=np.float64)
    return mx.nd.array(target_distribution(scores, num_classes), ctx=ctx)


def predict_scores(log_probs):
    """Expected relatedness ``r^T p`` from class log-probabilities.

    Parameters
    ----------
    log_probs : NDArray
        Shape (B, K).

    Returns
    -------
    numpy.ndarray
        Shape (B,).
    """
    return expected_score(np.exp(log_probs.asnumpy()))
