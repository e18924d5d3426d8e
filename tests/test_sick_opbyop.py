"""The op-by-op SICK encoder: the cell encoder's function, batched like eager."""
import random

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

from dynbatch_testing import assert_same, run_model
from examples.sick_data import attach_words, parse_parents, random_parents
from examples.sick_model import (CELL_WEIGHTS, ChildSumTreeLSTM,
                                 OpByOpTreeLSTM, SimilarityModel,
                                 copy_encoder_weights, encoder_weights)

VOCAB, DIM, HIDDEN = 30, 7, 5


def _trees(seed, count=7, max_len=12):
    """Random dependency trees with word ids; the first is a single node."""
    rng = random.Random(seed)
    trees = []
    for k in range(count):
        n = 1 if k == 0 else rng.randint(2, max_len)
        tree = parse_parents(random_parents(n, rng))
        trees.append(attach_words(tree, [rng.randrange(VOCAB)
                                         for _ in range(n)]))
    return trees


def _encoders(seed, output_gate=True):
    """A cell encoder (non-zero biases) and an op-by-op one with its weights."""
    mx.random.seed(seed)
    cell = ChildSumTreeLSTM(HIDDEN, DIM, output_gate=output_gate)
    cell.initialize(mx.init.Uniform(0.5))
    bias = cell.cell.x_bias
    bias.set_data(nd.random.uniform(-0.5, 0.5, shape=bias.shape))
    opbyop = OpByOpTreeLSTM(HIDDEN, DIM, output_gate=output_gate)
    opbyop.initialize()
    copy_encoder_weights(cell, opbyop)
    return cell, opbyop


def _eager(encoder, trees, emb):
    """Root states and the gradients (cell layout) of a loss on all of them."""
    with autograd.record():
        outs = [encoder(t, emb) for t in trees]
        loss = sum((h * h).sum() * (1 + k) + c.sum()
                   for k, (h, c) in enumerate(outs))
    loss.backward()
    values = [a.asnumpy() for pair in outs for a in pair]
    grads = {k: v.asnumpy() for k, v in encoder_weights(encoder, grad=True).items()}
    return values, grads


def test_weights_copy_both_ways():
    cell, opbyop = _encoders(0)
    np.testing.assert_array_equal(opbyop.iou_x.weight.data().asnumpy(),
                                  cell.cell.x_weight.data().asnumpy()[:3 * HIDDEN])
    np.testing.assert_array_equal(opbyop.f_x.bias.data().asnumpy(),
                                  cell.cell.x_bias.data().asnumpy()[3 * HIDDEN:])
    back = ChildSumTreeLSTM(HIDDEN, DIM)
    back.initialize()
    copy_encoder_weights(opbyop, back)
    for key in CELL_WEIGHTS:
        np.testing.assert_array_equal(getattr(back.cell, key).data().asnumpy(),
                                      getattr(cell.cell, key).data().asnumpy(),
                                      err_msg=key)


@pytest.mark.parametrize("output_gate", [True, False])
def test_opbyop_computes_the_cell_encoders_function(output_gate):
    """Same weights: same root states and same gradients, eagerly."""
    cell, opbyop = _encoders(1, output_gate)
    trees = _trees(1)
    emb = nd.random.uniform(-1, 1, shape=(VOCAB, DIM))
    want_values, want_grads = _eager(cell, trees, emb)
    got_values, got_grads = _eager(opbyop, trees, emb)
    for got, want in zip(got_values, want_values):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for key in CELL_WEIGHTS:
        # The two sum in different orders: atol scaled as in assert_same.
        scale = float(np.abs(want_grads[key]).max())
        assert scale > 0, key
        np.testing.assert_allclose(got_grads[key], want_grads[key], rtol=1e-5,
                                   atol=1e-6 * max(1.0, scale), err_msg=key)


@pytest.mark.parametrize("compiled", [False, True, "step"])
@pytest.mark.parametrize("strategy", ["depth", "agenda"])
def test_opbyop_batched_equals_eager(strategy, compiled):
    _, opbyop = _encoders(2)
    trees = _trees(2)
    emb = nd.random.uniform(-1, 1, shape=(VOCAB, DIM))
    eager = run_model(opbyop, trees, [emb], "eager")
    batched = run_model(opbyop, trees, [emb], strategy, compiled=compiled)
    assert_same(batched, eager)
    assert batched[2].samples == len(trees)


def test_similarity_model_takes_either_encoder():
    mx.random.seed(3)
    cell_model = SimilarityModel(DIM, HIDDEN, 4)
    cell_model.initialize()
    opbyop_model = SimilarityModel(DIM, HIDDEN, 4, encoder="opbyop")
    opbyop_model.initialize()
    assert isinstance(opbyop_model.encoder, OpByOpTreeLSTM)
    copy_encoder_weights(cell_model.encoder, opbyop_model.encoder)
    for mine, theirs in zip(opbyop_model.head.collect_params().values(),
                            cell_model.head.collect_params().values()):
        mine.set_data(theirs.data())
    trees = _trees(3, count=6)
    emb = nd.random.uniform(-1, 1, shape=(VOCAB, DIM))
    roots = [m.encode(trees, emb).asnumpy() for m in (cell_model, opbyop_model)]
    assert roots[0].shape == (6, HIDDEN)
    np.testing.assert_allclose(roots[1], roots[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown encoder"):
        SimilarityModel(DIM, encoder="dense")
