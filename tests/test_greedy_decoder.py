"""The greedy decoder example: decoding and sampling with reads, batched, equal eager.

Each sentence reads a value per token, so its later tokens are recorded in
later flushes of the scope, on values earlier flushes handed out (rows of
their batched outputs): tokens, scores and the scores' gradients must equal
eager decoding.
"""
import random

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

import gluon_dynbatch as gdb
from examples import greedy_decoder as gd


def _model(seed=5, hidden=16):
    mx.random.seed(seed)
    model = gd.Seq2Seq(hidden=hidden, embed=8, max_len=7)
    model.initialize(mx.init.Xavier())
    return model


def _grads(model):
    return {name: p.grad().asnumpy().copy() for name, p in model.collect_params().items()}


def _decode_and_backward(model, sources, batched, seeds=None):
    def one(k):
        rng = None if seeds is None else random.Random(seeds[k])
        return model(sources[k], None, rng) if rng else model(sources[k])
    with autograd.record():
        if batched:
            with gdb.batching() as scope:
                results = gdb.map(one, range(len(sources)))
        else:
            results, scope = [one(k) for k in range(len(sources))], None
        loss = nd.add_n(*[score for _, score in results])
    loss.backward()
    return results, _grads(model), scope


def _check(model, sources, seeds=None):
    want, want_grads, _ = _decode_and_backward(model, sources, False, seeds)
    got, got_grads, scope = _decode_and_backward(model, sources, True, seeds)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
    assert gd.same_decodes(got, want)
    for name, grad in want_grads.items():
        np.testing.assert_allclose(got_grads[name], grad, rtol=1e-4, atol=1e-5, err_msg=name)
    longest = max(len(tokens) for tokens, _ in want) + 1
    assert scope.stats.flushes <= min(longest, model.max_len) + 1
    assert scope.stats.reads == sum(min(len(t) + 1, model.max_len) for t, _ in want)
    return want


def test_greedy_decoding_batched_equals_eager_with_gradients():
    model = _model()
    rng = random.Random(2)
    sources = [[rng.randrange(10) for _ in range(rng.randint(2, 6))] for _ in range(9)]
    want = _check(model, sources)
    assert len({len(tokens) for tokens, _ in want}) > 1     # sentences stop at different steps


def test_sampling_batched_equals_eager():
    model = _model(seed=8)
    rng = random.Random(4)
    sources = [[rng.randrange(10) for _ in range(rng.randint(2, 6))] for _ in range(7)]
    _check(model, sources, seeds=[rng.randrange(1000) for _ in sources])


def test_teacher_forced_training_reduces_the_loss():
    model = _model(seed=1)
    pairs = gd.make_pairs(96, random.Random(0))
    losses = gd.train(model, pairs, epochs=3, batch_size=32, lr=0.01, seed=0, progress=False)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


@pytest.mark.parametrize("flag", ["--batch-size", "--hidden", "--samples", "--rounds",
                                  "--train-pairs", "--test-pairs"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_sizes_below_one_are_refused_by_the_parser(flag, value, capsys):
    with pytest.raises(SystemExit) as info:
        gd.build_parser().parse_args([flag, value])
    assert info.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err
