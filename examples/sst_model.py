"""Binary Tree-LSTM sentiment model on SST trees (the Gluon side of the
benchmark against DyNet's Tree-LSTM).

The cell is written for ONE tree, recursing through ``self(child, ...)``;
inside a :func:`gluon_dynbatch.batching` scope the calls of many trees are
recorded and run batched. The math (identical in
``scripts/dynet_treelstm.py``):

* pre-terminal with word embedding ``x``::

      i, o, u = sigmoid, sigmoid, tanh of (W_iou x + b_iou_leaf)
      c = i * u;  h = o * tanh(c)

* internal node with children ``(h1, c1), (h2, c2)`` and ``e = [h1; h2]``::

      i, o, u = sigmoid, sigmoid, tanh of (U_iou e + b_iou)
      f1 = sigmoid(U_f1 h1 + b_f);  f2 = sigmoid(U_f2 h2 + b_f)
      c = i * u + f1 * c1 + f2 * c2;  h = o * tanh(c)

* every non-terminal (pre-terminals and internal nodes) has logits
  ``W_out h`` (no bias); the loss is the summed softmax cross-entropy of the
  logits against the nodes' labels.  As in DyNet's benchmark, each node's
  loss is computed where the node is (in its cell), and a subtree's loss is
  passed up with its state: a tree returns one loss, not a value per node.

Two encoders compute this same function on the same Parameters:
:class:`BinaryTreeLSTM` puts a node's math in child blocks (:class:`LeafCell`,
:class:`InternalCell`), which gluon_dynbatch traces once and then records as
one call each; :class:`OpByOpBinaryTreeLSTM` calls the ``F`` operators
directly in its ``hybrid_forward``, one call per tree node, as DyNet's
benchmark writes it, so every operator is recorded on its own.
:class:`SSTSentimentModel` takes either (``encoder="cell"`` or ``"op"``).

Weights are exchanged with the DyNet side as a dict of numpy arrays (see
:data:`WEIGHT_NAMES`, :func:`get_weights`, :func:`set_weights`,
:func:`save_weights`).
"""
import functools
import logging

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import gluon_dynbatch as gdb

logger = logging.getLogger(__name__)

WEIGHT_NAMES = ("embedding", "leaf_iou_weight", "leaf_iou_bias", "iou_weight",
                "iou_bias", "forget_left_weight", "forget_right_weight",
                "forget_bias", "out_weight")
"""Names of the exported weights, shared with ``scripts/dynet_treelstm.py``."""

CELL_WEIGHT_NAMES = WEIGHT_NAMES[1:]


def _iou(F, z, hidden):
    """Split gate pre-activations (1, 3H) into sigmoid i, sigmoid o, tanh u."""
    i = F.Activation(F.slice_axis(z, axis=1, begin=0, end=hidden),
                     act_type="sigmoid")
    o = F.Activation(F.slice_axis(z, axis=1, begin=hidden, end=2 * hidden),
                     act_type="sigmoid")
    u = F.Activation(F.slice_axis(z, axis=1, begin=2 * hidden, end=3 * hidden),
                     act_type="tanh")
    return i, o, u


def _node_loss(F, h, out_weight, label, num_classes):
    """Softmax cross-entropy of the logits ``W_out h`` against ``label`` (1,)."""
    logits = F.FullyConnected(h, out_weight, no_bias=True, num_hidden=num_classes)
    return -F.pick(F.log_softmax(logits, axis=1), label, axis=1)


def leaf_state(F, x, label, iou_weight, iou_bias, out_weight, hidden, num_classes):
    """``(h, c, loss)`` of a pre-terminal with embedding ``x`` (1, E) and ``label`` (1,)."""
    z = F.FullyConnected(x, iou_weight, iou_bias, num_hidden=3 * hidden)
    i, o, u = _iou(F, z, hidden)
    c = i * u
    h = o * F.Activation(c, act_type="tanh")
    return h, c, _node_loss(F, h, out_weight, label, num_classes)


def internal_state(F, left, right, label, weights, hidden, num_classes):
    """``(h, c, loss)`` of an internal node and the summed loss of its subtree.

    Parameters
    ----------
    F : module
        Operator namespace.
    left, right : tuple of NDArray
        Each child's ``(h, c, loss)``: (1, H), (1, H) and (1,).
    label : NDArray
        (1,) the node's label.
    weights : tuple of NDArray
        ``iou_weight, iou_bias, forget_left_weight, forget_right_weight,
        forget_bias, out_weight``.
    hidden, num_classes : int
        Sizes H and K.
    """
    (h1, c1, loss1), (h2, c2, loss2) = left, right
    iou_weight, iou_bias, forget_left, forget_right, forget_bias, out_weight = weights
    z = F.FullyConnected(F.concat(h1, h2, dim=1), iou_weight, iou_bias,
                         num_hidden=3 * hidden)
    i, o, u = _iou(F, z, hidden)
    f1 = F.Activation(F.FullyConnected(h1, forget_left, forget_bias, num_hidden=hidden),
                      act_type="sigmoid")
    f2 = F.Activation(F.FullyConnected(h2, forget_right, forget_bias, num_hidden=hidden),
                      act_type="sigmoid")
    c = i * u + f1 * c1 + f2 * c2
    h = o * F.Activation(c, act_type="tanh")
    own = _node_loss(F, h, out_weight, label, num_classes)
    return h, c, loss1 + loss2 + own


#: Weights of an internal node, in the order :func:`internal_state` takes them.
INTERNAL_WEIGHTS = ("iou_weight", "iou_bias", "forget_left_weight",
                    "forget_right_weight", "forget_bias", "out_weight")


class LeafCell(gluon.HybridBlock):
    """A pre-terminal's state and loss, given its word embedding and label.

    The weights are arguments, not Parameters of this block (they belong to
    :class:`BinaryTreeLSTM`).  As a child HybridBlock its calls are traced
    once per shape by gluon_dynbatch and then replayed, which records much
    faster than the same operators called one by one.
    """

    def __init__(self, hidden_size, num_classes, **kwargs):
        super().__init__(**kwargs)
        self._hidden_size = hidden_size
        self._num_classes = num_classes

    def hybrid_forward(self, F, x, label, iou_weight, iou_bias, out_weight):
        """``(h, c, loss)`` of a pre-terminal with embedding ``x`` (1, E)."""
        return leaf_state(F, x, label, iou_weight, iou_bias, out_weight,
                          self._hidden_size, self._num_classes)


class InternalCell(gluon.HybridBlock):
    """An internal node's state and the loss of its subtree.

    Given its children's states and subtree losses and its own label.  Like
    :class:`LeafCell`, the weights are arguments.
    """

    def __init__(self, hidden_size, num_classes, **kwargs):
        super().__init__(**kwargs)
        self._hidden_size = hidden_size
        self._num_classes = num_classes

    def hybrid_forward(self, F, h1, c1, loss1, h2, c2, loss2, label, iou_weight,
                       iou_bias, forget_left_weight, forget_right_weight,
                       forget_bias, out_weight):
        """``(h, c, loss)`` from children ``(h1, c1)`` and ``(h2, c2)``."""
        weights = (iou_weight, iou_bias, forget_left_weight, forget_right_weight,
                   forget_bias, out_weight)
        return internal_state(F, (h1, c1, loss1), (h2, c2, loss2), label, weights,
                              self._hidden_size, self._num_classes)


class _TreeLSTMBase(gdb.DynBatchBlock):
    """The Parameters and the per-node bookkeeping both SST encoders share.

    Parameters
    ----------
    embed_size : int
        Size E of the word embeddings.
    hidden_size : int
        Size H of the hidden and memory states.
    num_classes : int, optional
        Number of sentiment classes (5 for SST).
    **kwargs
        Passed to :class:`gluon_dynbatch.DynBatchBlock` (``strategy``,
        ``compiled``, ``analysis_budget``, ``prefix``, ``params``).
    """

    def __init__(self, embed_size, hidden_size, num_classes=5, **kwargs):
        super().__init__(**kwargs)
        self._embed_size = embed_size
        self._hidden_size = hidden_size
        self._num_classes = num_classes
        hid3 = 3 * hidden_size
        with self.name_scope():
            self.leaf_iou_weight = self.params.get(
                "leaf_iou_weight", shape=(hid3, embed_size))
            self.leaf_iou_bias = self.params.get(
                "leaf_iou_bias", shape=(hid3,), init="zeros")
            self.iou_weight = self.params.get(
                "iou_weight", shape=(hid3, 2 * hidden_size))
            self.iou_bias = self.params.get("iou_bias", shape=(hid3,),
                                            init="zeros")
            self.forget_left_weight = self.params.get(
                "forget_left_weight", shape=(hidden_size, hidden_size))
            self.forget_right_weight = self.params.get(
                "forget_right_weight", shape=(hidden_size, hidden_size))
            self.forget_bias = self.params.get(
                "forget_bias", shape=(hidden_size,), init="zeros")
            self.out_weight = self.params.get(
                "out_weight", shape=(num_classes, hidden_size))
        self._labels = {}     # context -> label table (see _label_rows)

    def _label_rows(self, ctx):
        """The constant (num_classes,) table whose row ``k`` is the label ``k``."""
        table = self._labels.get(ctx)
        if table is None:
            table = self._labels[ctx] = mx.nd.arange(self._num_classes, ctx=ctx)
        return table

    def _label(self, F, tree, embeddings):
        """(1,) the label of ``tree``'s root, a row of the constant label table."""
        labels = self._label_rows(embeddings.context)
        return F.slice_axis(labels, axis=0, begin=tree.label, end=tree.label + 1)

    @staticmethod
    def _binary_children(tree):
        """The two children of an internal node (ValueError unless binary)."""
        if len(tree.children) != 2:
            raise ValueError("BinaryTreeLSTM needs binary trees, got a node "
                             "with %d children" % len(tree.children))
        return tree.children

    def hybrid_forward(self, F, tree, embeddings, **params):
        """Run the encoder over ``tree``.

        Parameters
        ----------
        F : module
            ``mx.nd`` (or whatever the engine passes).
        tree : SSTTree
            The (sub)tree; pre-terminals need ``word_id``, every node ``label``.
        embeddings : NDArray
            The (V, E) embedding table.
        **params : NDArray
            The encoder's weights, by name.

        Returns
        -------
        h, c : NDArray
            (1, H) hidden and memory state of the root.
        loss : NDArray
            (1,) summed softmax cross-entropy of the logits of every node of
            ``tree`` (pre-terminals and internal nodes) against its label.
        """
        raise NotImplementedError


class BinaryTreeLSTM(_TreeLSTMBase):
    """Binary Tree-LSTM over one SST tree, with the loss of every node.

    Call it as ``cell(tree, embeddings)`` with an :class:`~sst_data.SSTTree`
    whose pre-terminals have ``word_id`` set and the (V, E) embedding table.
    A node's math runs in a child block (:class:`LeafCell` or
    :class:`InternalCell`), called once per node.

    Parameters
    ----------
    embed_size : int
        Size E of the word embeddings.
    hidden_size : int
        Size H of the hidden and memory states.
    num_classes : int, optional
        Number of sentiment classes (5 for SST).
    **kwargs
        Passed to :class:`gluon_dynbatch.DynBatchBlock` (``strategy``,
        ``compiled``, ``analysis_budget``, ``prefix``, ``params``).
    """

    def __init__(self, embed_size, hidden_size, num_classes=5, **kwargs):
        super().__init__(embed_size, hidden_size, num_classes, **kwargs)
        with self.name_scope():
            self.leaf_cell = LeafCell(hidden_size, num_classes)
            self.internal_cell = InternalCell(hidden_size, num_classes)

    def hybrid_forward(self, F, tree, embeddings, **params):
        """``(h, c, loss)`` of ``tree``; each node's math in a child block."""
        label = self._label(F, tree, embeddings)
        if tree.is_preterminal:
            x = embeddings[tree.word_id:tree.word_id + 1]
            return self.leaf_cell(x, label, params["leaf_iou_weight"],
                                  params["leaf_iou_bias"], params["out_weight"])
        left, right = self._binary_children(tree)
        h1, c1, loss1 = self(left, embeddings)
        h2, c2, loss2 = self(right, embeddings)
        return self.internal_cell(
            h1, c1, loss1, h2, c2, loss2, label, params["iou_weight"],
            params["iou_bias"], params["forget_left_weight"],
            params["forget_right_weight"], params["forget_bias"],
            params["out_weight"])


class OpByOpBinaryTreeLSTM(_TreeLSTMBase):
    """The function of :class:`BinaryTreeLSTM`, written operator by operator.

    No child blocks: ``hybrid_forward`` calls the ``F`` operators of a node
    itself (one call per tree node), computes the node's loss where the node
    is and passes the subtree's loss up with the state, as DyNet's Tree-LSTM
    benchmark writes its model.  Inside a batching scope every operator is
    recorded on its own.  The Parameters and their names are those of
    :class:`BinaryTreeLSTM`, so :func:`get_weights`, :func:`set_weights`,
    ``save_parameters`` / ``load_parameters`` and the DyNet side work for
    both, and ``OpByOpBinaryTreeLSTM(E, H, prefix=cell.prefix,
    params=cell.collect_params())`` shares a :class:`BinaryTreeLSTM`'s
    weights.

    Parameters
    ----------
    embed_size : int
        Size E of the word embeddings.
    hidden_size : int
        Size H of the hidden and memory states.
    num_classes : int, optional
        Number of sentiment classes (5 for SST).
    **kwargs
        Passed to :class:`gluon_dynbatch.DynBatchBlock` (``strategy``,
        ``compiled``, ``analysis_budget``, ``prefix``, ``params``).
    """

    def hybrid_forward(self, F, tree, embeddings, **params):
        """``(h, c, loss)`` of ``tree``; each node's operators called here."""
        hidden, classes = self._hidden_size, self._num_classes
        label = self._label(F, tree, embeddings)
        if tree.is_preterminal:
            x = embeddings[tree.word_id:tree.word_id + 1]
            return leaf_state(F, x, label, params["leaf_iou_weight"],
                              params["leaf_iou_bias"], params["out_weight"],
                              hidden, classes)
        left, right = self._binary_children(tree)
        weights = tuple(params[name] for name in INTERNAL_WEIGHTS)
        return internal_state(F, self(left, embeddings), self(right, embeddings),
                              label, weights, hidden, classes)


#: The SST encoders by the name :class:`SSTSentimentModel` takes.
ENCODERS = {"cell": BinaryTreeLSTM, "op": OpByOpBinaryTreeLSTM}


class SSTSentimentModel(gluon.Block):
    """Embedding table plus a Tree-LSTM encoder: the whole SST model.

    Parameters
    ----------
    vocab_size : int
        Number of rows V of the embedding table (including the UNK row).
    embed_size : int
        Embedding size E.
    hidden_size : int
        Hidden size H.
    num_classes : int, optional
        Number of sentiment classes.
    strategy : str, optional
        Batching strategy passed to the encoder.
    encoder : {"cell", "op"}, optional
        :class:`BinaryTreeLSTM` (a node's math in child blocks) or
        :class:`OpByOpBinaryTreeLSTM` (the same function, operator by
        operator); see :data:`ENCODERS`.
    **kwargs
        Passed to :class:`mxnet.gluon.Block`.
    """

    def __init__(self, vocab_size, embed_size, hidden_size, num_classes=5,
                 strategy="agenda", encoder="cell", **kwargs):
        super().__init__(**kwargs)
        if encoder not in ENCODERS:
            raise ValueError("unknown encoder %r; choose one of %s"
                             % (encoder, ", ".join(ENCODERS)))
        with self.name_scope():
            self.embedding = self.params.get(
                "embedding", shape=(vocab_size, embed_size),
                init=mx.init.Uniform(0.1))
            self.tree_lstm = ENCODERS[encoder](embed_size, hidden_size,
                                               num_classes, strategy=strategy)

    def forward(self, trees, batched=True):
        """Run the cell over every tree.

        Parameters
        ----------
        trees : list of SSTTree
            Trees with word ids assigned.
        batched : bool, optional
            Run inside a :func:`gluon_dynbatch.batching` scope (True) or one
            tree after the other, eagerly (False).

        Returns
        -------
        list of tuple
            Per tree ``(h, c, loss)`` as returned by the encoder.
        """
        embeddings = self.embedding.data()
        if not batched:
            return [self.tree_lstm(tree, embeddings) for tree in trees]
        with gdb.batching():
            return [self.tree_lstm(tree, embeddings) for tree in trees]


def sst_loss(outputs, trees):
    """Summed softmax cross-entropy over every node of every tree.

    Parameters
    ----------
    outputs : list of tuple
        Per tree ``(h, c, loss)``, from :class:`SSTSentimentModel` or an
        encoder; used after the batching scope.
    trees : list of SSTTree
        The same trees, in the same order.

    Returns
    -------
    NDArray
        Shape (1,): the summed loss (differentiable when recorded).

    Raises
    ------
    ValueError
        If the number of outputs differs from the number of trees.
    """
    if len(outputs) != len(trees):
        raise ValueError("got %d outputs for %d trees" % (len(outputs), len(trees)))
    losses = [loss for _, _, loss in outputs]
    return losses[0] if len(losses) == 1 else mx.nd.add_n(*losses)


def batch_loss(model, trees, batched=True):
    """Forward pass only: the summed loss of ``trees`` as a float.

    Parameters
    ----------
    model : SSTSentimentModel
    trees : list of SSTTree
    batched : bool, optional
        Use the batching scope.

    Returns
    -------
    float
    """
    return float(sst_loss(model(trees, batched), trees).asscalar())


def train_step(model, trainer, trees, batched=True):
    """One training step: forward, backward and ``trainer.step(1)``.

    The loss is a sum (not a mean), so the step is not rescaled by the
    batch size, as in DyNet.

    Parameters
    ----------
    model : SSTSentimentModel
    trainer : mxnet.gluon.Trainer
    trees : list of SSTTree
    batched : bool, optional
        Use the batching scope.

    Returns
    -------
    float
        The loss of the batch before the update.
    """
    with autograd.record():
        loss = sst_loss(model(trees, batched), trees)
    loss.backward()
    trainer.step(1)
    return float(loss.asscalar())


def _params_by_name(model):
    """Map from :data:`WEIGHT_NAMES` to the model's Parameters."""
    params = {name: getattr(model.tree_lstm, name)
              for name in CELL_WEIGHT_NAMES}
    params["embedding"] = model.embedding
    return params


def get_weights(model):
    """Export the model's weights as numpy arrays.

    Parameters
    ----------
    model : SSTSentimentModel
        An initialised model.

    Returns
    -------
    dict
        :data:`WEIGHT_NAMES` -> float32 numpy array, in MXNet's layout
        (a weight is (out, in), so ``W x`` is ``FullyConnected``).
    """
    return export_named_weights(_params_by_name(model))


def export_named_weights(params):
    """``{name: numpy array}`` of each Parameter of ``params`` (name -> Parameter)."""
    return {name: param.data().asnumpy() for name, param in params.items()}


def set_weights(model, weights):
    """Load weights exported by :func:`get_weights` into ``model``.

    Parameters
    ----------
    model : SSTSentimentModel
        An initialised model of the same sizes.
    weights : dict
        :data:`WEIGHT_NAMES` -> numpy array; other keys are ignored.

    Raises
    ------
    KeyError
        If a weight is missing.
    ValueError
        If a shape differs.
    """
    load_named_weights(_params_by_name(model), weights)


def load_named_weights(params, weights):
    """Set each Parameter of ``params`` (name -> Parameter) from ``weights``.

    Raises
    ------
    KeyError
        If a weight is missing.
    ValueError
        If a shape differs.
    """
    for name, param in params.items():
        value = np.asarray(weights[name], dtype=np.float32)
        if value.shape != param.shape:
            raise ValueError("weight %s has shape %s, model expects %s"
                             % (name, value.shape, param.shape))
        param.set_data(mx.nd.array(value))


def save_weights(model, path, vocab=None):
    """Write the model's weights (and vocabulary) to an ``.npz`` file.

    Parameters
    ----------
    model : SSTSentimentModel
    path : str
        Output file, read by ``scripts/dynet_treelstm.py --weights``.
    vocab : dict, optional
        word -> id; stored as the array ``vocab`` of words in id order so the
        DyNet side maps words to the same embedding rows.
    """
    arrays = get_weights(model)
    if vocab is not None:
        words = sorted(vocab, key=vocab.get)
        if [vocab[w] for w in words] != list(range(len(words))):
            raise ValueError("vocabulary ids must be 0..V-1")
        arrays["vocab"] = np.array(words, dtype=str)
    np.savez(path, **arrays)
    logger.info("saved %d arrays to %s", len(arrays), path)


def make_model(vocab_size, embed_size, hidden_size, seed=None, ctx=None,
               encoder="cell"):
    """Build and initialise an :class:`SSTSentimentModel`.

    Parameters
    ----------
    vocab_size, embed_size, hidden_size : int
        Sizes V, E, H.
    seed : int, optional
        Seeds MXNet's and numpy's generators first, for reproducible weights.
    ctx : mxnet.Context, optional
        Defaults to the CPU.
    encoder : {"cell", "op"}, optional
        The encoder (see :class:`SSTSentimentModel`).  Both draw the same
        initial weights for the same seed.

    Returns
    -------
    SSTSentimentModel
    """
    cls = functools.partial(SSTSentimentModel, encoder=encoder)
    return seeded_model(cls, (vocab_size, embed_size, hidden_size), seed, ctx)


def seeded_model(cls, sizes, seed=None, ctx=None):
    """``cls(*sizes)`` initialised with Xavier on ``ctx`` (CPU), after seeding.

    ``seed`` seeds MXNet's and numpy's generators first, for reproducible
    weights.
    """
    if seed is not None:
        mx.random.seed(seed)
        np.random.seed(seed)
    model = cls(*sizes)
    model.initialize(mx.init.Xavier(), ctx=ctx or mx.cpu())
    return model
