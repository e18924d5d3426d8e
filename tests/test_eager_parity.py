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
