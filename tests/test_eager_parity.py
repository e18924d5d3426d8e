"""Models eager Gluon runs, batched: eager's result, or eager's error named.

Each model here is written as users write them and runs eagerly one sample
at a time.  Batched, it must give eager's values and gradients; where eager
MXNet raises, the batched run raises a clear error naming the sample, the
user's block and the call.
"""
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.gluon import rnn

import gluon_dynbatch as gdb
from dynbatch_testing import check_all_strategies, make_model

H = 4


def _states(count, seed=0, rows=1):
    rng = np.random.RandomState(seed)
    return [nd.array(rng.uniform(-1, 1, (rows, H))) for _ in range(count)]


# --------------------------------------------------------------------------
# A learned start vector as the input of a Gluon rnn cell
# --------------------------------------------------------------------------

class LearnedStart(gdb.DynBatchBlock):
    """A decoder's first steps: its own ``go`` parameter (1, H) is the input of an
    rnn cell whose state is each sample's encoding (``scaled``: ``go * 1``)."""

    def __init__(self, cell="lstm", scaled=False, **kwargs):
        super().__init__(**kwargs)
        self.kind, self.scaled = cell, scaled
        with self.name_scope():
            self.go = self.params.get("go", shape=(1, H))
            self.cell = rnn.LSTMCell(H, input_size=H) if cell == "lstm" \
                else rnn.GRUCell(H, input_size=H)

    def hybrid_forward(self, F, encoding, go):
        state = [encoding, encoding] if self.kind == "lstm" else [encoding]
        x = go * 1 if self.scaled else go
        outs = []
        for _ in range(2):
            x, state = self.cell(x, state)
            outs.append(x)
        return F.concat(*outs, dim=0)


@pytest.mark.parametrize("cell, scaled", [("lstm", False), ("gru", False), ("lstm", True)])
def test_learned_start_vector_into_an_rnn_cell_equals_eager(cell, scaled):
    model = make_model(LearnedStart, cell=cell, scaled=scaled)
    check_all_strategies(model, _states(5), [], strategies=("depth", "agenda"))


# --------------------------------------------------------------------------
# A character CNN over each word
# --------------------------------------------------------------------------

class CharCNN(gdb.DynBatchBlock):
    """Each word's characters embedded (1, C, E), laid out (C, 1, E) and encoded
    by gluonnlp's ConvolutionalEncoder (convolutions over the characters, a
    highway layer), or transposed to (1, E, C) for one ``nn.Conv1D``."""

    def __init__(self, gluonnlp_encoder=True, **kwargs):
        super().__init__(**kwargs)
        self.gluonnlp_encoder = gluonnlp_encoder
        with self.name_scope():
            self.embed = gluon.nn.Embedding(20, 8)
            if gluonnlp_encoder:
                import gluonnlp
                self.encode = gluonnlp.model.ConvolutionalEncoder(
                    embed_size=8, num_filters=(8, 8), ngram_filter_sizes=(1, 2),
                    conv_layer_activation="tanh", num_highway=1, output_size=None)
            else:
                self.conv = gluon.nn.Conv1D(8, 2, in_channels=8, activation="tanh")
            self.out = gluon.nn.Dense(3)

    def hybrid_forward(self, F, words):
        vectors = []
        for chars in words:
            x = self.embed(F.array([chars]))                     # (1, C, E)
            if self.gluonnlp_encoder:
                vectors.append(self.encode(F.transpose(x, axes=(1, 0, 2))))
            else:
                x = F.expand_dims(F.transpose(F.reshape(x, (-1, 8))), axis=0)
                vectors.append(F.max(self.conv(x), axis=2))
        return self.out(F.concat(*vectors, dim=0))


def _spelled(seed, count=5):
    rng = np.random.RandomState(seed)
    return [[list(rng.randint(0, 20, rng.randint(2, 6))) for _ in range(rng.randint(1, 4))]
            for _ in range(count)]


@pytest.mark.parametrize("gluonnlp_encoder", [True, False], ids=["gluonnlp", "conv1d"])
def test_character_cnn_trains_and_equals_eager(gluonnlp_encoder):
    model = make_model(CharCNN, gluonnlp_encoder=gluonnlp_encoder)
    check_all_strategies(model, _spelled(0), [], strategies=("depth",))
    trainer = gluon.Trainer(model.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        with gdb.batching(compiled=True):
            loss = sum(model(words).sum() for words in _spelled(1))
    loss.backward()
    trainer.step(1)


# --------------------------------------------------------------------------
# nn.HybridLambda given an operator by name
# --------------------------------------------------------------------------

class Lambdas(gdb.DynBatchBlock):
    """``nn.HybridLambda("tanh")`` and a HybridLambda of a function, in a sequence."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = gluon.nn.HybridSequential()
            self.body.add(gluon.nn.Dense(H), gluon.nn.HybridLambda("tanh"),
                          gluon.nn.HybridLambda(lambda F, x: F.LeakyReLU(x, slope=0.1)))

    def hybrid_forward(self, F, x):
        return self.body(x)


def test_hybrid_lambda_by_name_equals_eager():
    check_all_strategies(make_model(Lambdas), _states(5, rows=2), [], strategies=("depth",))
