"""Bidirectional LSTM tagger over SST sentences (workload 2 of
``scripts/bench_dynet.py``).

Each sentence is the words of an SST tree, left to right; its tags are the
sentiment labels (0-4) of the words' pre-terminals, one tag per token. The
tagger is written for ONE sentence at a time: a Python loop runs an LSTM cell
over the tokens forwards and another one backwards, the two states of each
token are concatenated and a dense layer gives 5 tag logits per token. Inside
a :func:`gluon_dynbatch.batching` scope the calls of many sentences are
recorded and run batched.

The math (identical on the DyNet side, ``scripts/bench_dynet.py``, which uses
DyNet's ``VanillaLSTMBuilder``)::

    z = W_x x_t + b (+ W_h h_{t-1} when t > first)     gate order i, f, o, g
    i, f, o = sigmoid(z_i), sigmoid(z_f), sigmoid(z_o);  g = tanh(z_g)
    c_t = i * g (+ f * c_{t-1});  h_t = o * tanh(c_t)
    logits_t = W_out [h_fwd_t; h_bwd_t] + b_out

and the loss is the summed softmax cross-entropy of every token's logits.
DyNet's vanilla LSTM adds a constant 1 to the forget gate's pre-activation;
:func:`dynet_weights` folds that constant into the exported bias, so both
sides compute the same function.
"""
import logging

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import gluon_dynbatch as gdb
from examples.sst_model import export_named_weights, load_named_weights, seeded_model

logger = logging.getLogger(__name__)

NUM_TAGS = 5
"""Tags are the SST sentiment labels 0-4."""

DYNET_FORGET_BIAS = 1.0
"""Constant DyNet's ``VanillaLSTMBuilder`` adds to the forget gate."""

WEIGHT_NAMES = ("embedding",
                "fwd_x_weight", "fwd_h_weight", "fwd_bias",
                "bwd_x_weight", "bwd_h_weight", "bwd_bias",
                "out_weight", "out_bias")
"""Names of the exported weights (see :func:`get_weights`)."""


class LSTMCell(gluon.HybridBlock):
    """One LSTM step written with ``F`` operators, gate order i, f, o, g.

    Called as ``cell(x)`` for the first token (zero initial state: the
    recurrent term and the forget gate drop out) or ``cell(x, h, c)``.

    Parameters
    ----------
    hidden_size : int
        Size H of the hidden and memory states.
    input_size : int
        Size E of the inputs.
    **kwargs
        Passed to :class:`mxnet.gluon.HybridBlock`.
    """

    def __init__(self, hidden_size, input_size, **kwargs):
        super().__init__(**kwargs)
        self._hidden_size = hidden_size
        hid4 = 4 * hidden_size
        with self.name_scope():
            self.x_weight = self.params.get("x_weight",
                                            shape=(hid4, input_size))
            self.h_weight = self.params.get("h_weight",
                                            shape=(hid4, hidden_size))
            self.bias = self.params.get("bias", shape=(hid4,), init="zeros")

    def _gate(self, F, z, k, act):
        """Gate ``k`` (width H) of the pre-activations ``z``, activated."""
        hid = self._hidden_size
        part = F.slice_axis(z, axis=1, begin=k * hid, end=(k + 1) * hid)
        return F.Activation(part, act_type=act)

    def hybrid_forward(self, F, x, *state, x_weight=None, h_weight=None,
                       bias=None):
        """Advance the LSTM by one token.

        Parameters
        ----------
        F : module
            ``mx.nd`` (or the recording namespace of gluon_dynbatch).
        x : NDArray
            Input of the step, shape (1, E).
        *state : NDArray
            Nothing for the first step, else ``h, c`` of the previous step,
            each of shape (1, H).

        Returns
        -------
        h, c : NDArray
            The new state, each of shape (1, H).
        """
        hid4 = 4 * self._hidden_size
        z = F.FullyConnected(x, x_weight, bias, num_hidden=hid4)
        if state:
            h_prev, c_prev = state
            z = z + F.FullyConnected(h_prev, h_weight, no_bias=True,
                                     num_hidden=hid4)
        i = self._gate(F, z, 0, "sigmoid")
        o = self._gate(F, z, 2, "sigmoid")
        g = self._gate(F, z, 3, "tanh")
        c = i * g
        if state:
            c = c + self._gate(F, z, 1, "sigmoid") * c_prev
        h = o * F.Activation(c, act_type="tanh")
        return h, c


class BiLSTMTagger(gdb.DynBatchBlock):
    """Bidirectional LSTM tagger over one sentence.

    Call it as ``tagger(word_ids, embeddings)`` with the sentence's word ids
    (a list of ints) and the (V, E) embedding table; it returns the (T, 5)
    tag logits of the T tokens.

    Parameters
    ----------
    embed_size : int
        Size E of the word embeddings.
    hidden_size : int
        Size H of each direction's LSTM state.
    num_tags : int, optional
        Number of tags.
    **kwargs
        Passed to :class:`gluon_dynbatch.DynBatchBlock` (``strategy``,
        ``compiled``, ``prefix``, ``params``).
    """

    def __init__(self, embed_size, hidden_size, num_tags=NUM_TAGS, **kwargs):
        super().__init__(**kwargs)
        self._num_tags = num_tags
        with self.name_scope():
            self.forward_cell = LSTMCell(hidden_size, embed_size,
                                         prefix="fwd_")
            self.backward_cell = LSTMCell(hidden_size, embed_size,
                                          prefix="bwd_")
            self.out_weight = self.params.get(
                "out_weight", shape=(num_tags, 2 * hidden_size))
            self.out_bias = self.params.get("out_bias", shape=(num_tags,),
                                            init="zeros")

    @staticmethod
    def _run(cell, inputs):
        """Hidden states of ``cell`` run over ``inputs`` in order."""
        state = cell(inputs[0])
        hiddens = [state[0]]
        for x in inputs[1:]:
            state = cell(x, *state)
            hiddens.append(state[0])
        return hiddens

    def hybrid_forward(self, F, word_ids, embeddings, out_weight=None,
                       out_bias=None):
        """Tag logits of one sentence.

        Parameters
        ----------
        F : module
            Operator namespace.
        word_ids : sequence of int
            The sentence, at least one token.
        embeddings : NDArray
            The (V, E) embedding table.

        Returns
        -------
        NDArray
            Shape (T, num_tags).
        """
        if not word_ids:
            raise ValueError("BiLSTMTagger needs at least one token")
        inputs = [embeddings[w:w + 1] for w in word_ids]
        forward = self._run(self.forward_cell, inputs)
        backward = self._run(self.backward_cell, inputs[::-1])[::-1]
        features = F.concat(F.concat(*forward, dim=0),
                            F.concat(*backward, dim=0), dim=1)
        return F.FullyConnected(features, out_weight, out_bias,
                                num_hidden=self._num_tags)


class TaggerModel(gluon.Block):
    """Embedding table plus :class:`BiLSTMTagger`: the whole tagging model.

    Parameters
    ----------
    vocab_size, embed_size, hidden_size : int
        Sizes V, E, H.
    num_tags : int, optional
    **kwargs
        Passed to :class:`mxnet.gluon.Block`.
    """

    def __init__(self, vocab_size, embed_size, hidden_size, num_tags=NUM_TAGS,
                 **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embedding = self.params.get(
                "embedding", shape=(vocab_size, embed_size),
                init=mx.init.Uniform(0.1))
            self.tagger = BiLSTMTagger(embed_size, hidden_size, num_tags)

    def forward(self, sentences, batched=True):
        """Tag logits of every sentence.

        Parameters
        ----------
        sentences : list of sequence of int
            Word ids of each sentence.
        batched : bool, optional
            Run inside a :func:`gluon_dynbatch.batching` scope (True) or one
            sentence after the other, eagerly (False).

        Returns
        -------
        list of NDArray
            Per sentence, its (T, num_tags) logits.
        """
        embeddings = self.embedding.data()
        if not batched:
            return [self.tagger(ids, embeddings) for ids in sentences]
        with gdb.batching():
            return [self.tagger(ids, embeddings) for ids in sentences]


def tagger_loss(logits, tags):
    """Summed softmax cross-entropy of every token of every sentence.

    Parameters
    ----------
    logits : list of NDArray
        Per sentence, (T, num_tags) logits; used after the batching scope.
    tags : list of sequence of int
        Per sentence, its T tags.

    Returns
    -------
    NDArray
        Shape (1,), differentiable when recorded.

    Raises
    ------
    ValueError
        If the number of logit rows differs from the number of tags.
    """
    labels = np.array([t for sent in tags for t in sent], dtype=np.float32)
    rows = sum(z.shape[0] for z in logits)
    if rows != len(labels):
        raise ValueError("got %d logit rows for %d tags" % (rows, len(labels)))
    scores = mx.nd.log_softmax(mx.nd.concat(*logits, dim=0), axis=1)
    picked = mx.nd.pick(scores, mx.nd.array(labels, ctx=scores.context),
                        axis=1)
    return -mx.nd.sum(picked, axis=0, keepdims=True)


def batch_loss(model, sentences, tags, batched=True):
    """Forward pass only: the summed loss as a float.

    Parameters
    ----------
    model : TaggerModel
    sentences : list of sequence of int
    tags : list of sequence of int
    batched : bool, optional

    Returns
    -------
    float
    """
    return float(tagger_loss(model(sentences, batched), tags).asscalar())


def train_step(model, trainer, sentences, tags, batched=True):
    """One training step (forward, backward, ``trainer.step(1)``).

    The loss is a sum, not a mean, as on the DyNet side.

    Returns
    -------
    float
        The loss before the update.
    """
    with autograd.record():
        loss = tagger_loss(model(sentences, batched), tags)
    loss.backward()
    trainer.step(1)
    return float(loss.asscalar())


def _params_by_name(model):
    """Map from :data:`WEIGHT_NAMES` to the model's Parameters."""
    tagger = model.tagger
    params = {"embedding": model.embedding, "out_weight": tagger.out_weight,
              "out_bias": tagger.out_bias}
    for short, cell in (("fwd", tagger.forward_cell),
                        ("bwd", tagger.backward_cell)):
        params[short + "_x_weight"] = cell.x_weight
        params[short + "_h_weight"] = cell.h_weight
        params[short + "_bias"] = cell.bias
    return params


def get_weights(model):
    """Export the weights as numpy arrays.

    Parameters
    ----------
    model : TaggerModel
        An initialised model.

    Returns
    -------
    dict
        :data:`WEIGHT_NAMES` -> float32 array in MXNet's (out, in) layout.
    """
    return export_named_weights(_params_by_name(model))


def set_weights(model, weights):
    """Load weights exported by :func:`get_weights`.

    Raises
    ------
    KeyError
        If a weight is missing.
    ValueError
        If a shape differs.
    """
    load_named_weights(_params_by_name(model), weights)


def dynet_weights(weights):
    """The weights as DyNet's ``VanillaLSTMBuilder`` wants them.

    DyNet adds :data:`DYNET_FORGET_BIAS` to the forget gate, so that much is
    taken off the forget part of each exported bias.

    Parameters
    ----------
    weights : dict
        From :func:`get_weights`.

    Returns
    -------
    dict
        A copy with adjusted ``fwd_bias`` and ``bwd_bias``.
    """
    out = {name: np.array(value, dtype=np.float32)
           for name, value in weights.items()}
    for name in ("fwd_bias", "bwd_bias"):
        hid = out[name].shape[0] // 4
        out[name][hid:2 * hid] -= DYNET_FORGET_BIAS
    return out


def make_model(vocab_size, embed_size, hidden_size, seed=None, ctx=None):
    """Build and initialise a :class:`TaggerModel`.

    Parameters
    ----------
    vocab_size, embed_size, hidden_size : int
    seed : int, optional
        Seeds MXNet's and numpy's generators first.
    ctx : mxnet.Context, optional
        Defaults to the CPU.

    Returns
    -------
    TaggerModel
    """
    return seeded_model(TaggerModel, (vocab_size, embed_size, hidden_size), seed, ctx)
