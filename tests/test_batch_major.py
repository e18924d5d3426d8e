"""Per-sample values laid out batch-major with a batch of one: ``(1, T, H)``.

Users given a sentence as ``(1, T, H)`` (or ``(T, H)`` they expand) reshape,
transpose, slice, reduce and broadcast it along the token axis, for sentences
of every length in one batch.  Each idiom must give eager Gluon's values and
gradients in every strategy and execution mode.
"""
import numpy as np
import pytest
from mxnet import gluon, nd

import gluon_dynbatch as gdb
from dynbatch_testing import check_all_strategies, make_model

H = 4
LENGTHS = (3, 1, 6, 2, 3, 5)


def _idioms(F, X, q, g, T):
    """Each idiom on ``X`` (1, T, H), a query parameter ``q`` (1, 1, H) and a
    gate ``g`` (1, T, 1) computed from ``X``."""
    return {
        "reshape_rows": lambda: F.reshape(X, (-1, H)),
        "reshape_explicit": lambda: F.reshape(X, (T, H)),
        "reshape_flat": lambda: F.reshape(X, (1, -1)),
        "swapaxes": lambda: F.swapaxes(X, 0, 1),
        "transpose_default": lambda: F.transpose(X),
        "transpose_axes": lambda: F.transpose(X, axes=(1, 0, 2)),
        "transpose_features": lambda: F.transpose(X, axes=(0, 2, 1)),
        "slice_first": lambda: F.slice_axis(X, axis=1, begin=0, end=1),
        "slice_last": lambda: X[:, -1],
        "slice_tail": lambda: F.slice_axis(X, axis=1, begin=1 if T > 1 else 0, end=None),
        "expand_squeeze": lambda: F.squeeze(F.expand_dims(X, axis=0), axis=(0, 1)),
        "squeeze": lambda: F.squeeze(X, axis=0),
        "add_query": lambda: F.broadcast_add(X, q),
        "mul_gate": lambda: F.broadcast_mul(X, g),
        "sum_tokens": lambda: F.sum(X, axis=1),
        "mean_tokens": lambda: F.mean(X, axis=1, keepdims=True),
        "max_tokens": lambda: F.max(X, axis=1),
        "softmax_tokens": lambda: F.softmax(X, axis=1),
        "batch_dot_query": lambda: F.batch_dot(F.softmax(F.batch_dot(q, X, transpose_b=True),
                                                         axis=-1), X),
        "concat_tokens": lambda: F.concat(X, F.tanh(X), dim=1),
        "concat_features": lambda: F.concat(X, F.tanh(X), dim=2),
        "take_tokens": lambda: F.take(X, nd.array([0, T - 1]), axis=1),
        "reverse_tokens": lambda: F.reverse(X, axis=1),
        "sum_features": lambda: F.sum(X, axis=2, keepdims=True),
        "split_tokens": lambda: F.split(X, num_outputs=T, axis=1)[0] if T > 1 else X,
        "flip_features": lambda: F.flip(X, axis=2),
    }


IDIOMS = sorted(_idioms(None, None, None, None, 1))


class BatchMajor(gdb.DynBatchBlock):
    """A sentence ``(1, T, H)`` (or ``(T, H)``, expanded): one idiom applied to it
    as given and to its projection, the entries of each result summed into a
    (1, 1) score."""

    def __init__(self, idiom, **kwargs):
        super().__init__(**kwargs)
        self.idiom = idiom
        with self.name_scope():
            self.proj = gluon.nn.Dense(H, flatten=False, in_units=H)
            self.gate = gluon.nn.Dense(1, flatten=False, in_units=H)
            self.q = self.params.get("q", shape=(1, 1, H))
            self.w = self.params.get("w", shape=(1, 1))

    def hybrid_forward(self, F, sentence, q, w):
        if len(sentence.shape) == 2:
            sentence = F.expand_dims(sentence, axis=0)
        T = sentence.shape[1]
        scores = []
        for X in (sentence, F.tanh(self.proj(sentence))):          # (1, T, H)
            out = _idioms(F, X, q, F.sigmoid(self.gate(X)), T)[self.idiom]()
            scores.append(F.broadcast_mul(F.sum(out * out), w) + F.sum(F.exp(out)))
        return scores


def _sentences(rank, lengths=LENGTHS, seed=0):
    rng = np.random.RandomState(seed)
    shape = (lambda t: (1, t, H)) if rank == 3 else (lambda t: (t, H))
    return [nd.array(rng.uniform(-1, 1, shape(t))) for t in lengths]


@pytest.mark.parametrize("rank", [3, 2])
@pytest.mark.parametrize("idiom", IDIOMS)
def test_batch_major_idiom_equals_eager(idiom, rank):
    check_all_strategies(make_model(BatchMajor, idiom=idiom), _sentences(rank), [])
