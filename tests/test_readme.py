"""The README's tour runs as written, and batched equals eager."""
import re
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dynbatch_testing import random_tree, rng

README = Path(__file__).resolve().parents[1] / "README.md"


def _tour():
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README.md has no python example"
    return blocks[0]


def _run_tour(trees, emb, labels):
    """Run the tour's code on ``trees``; its namespace afterwards."""
    mx.random.seed(3)
    head = gluon.nn.Dense(1)
    head.initialize()

    def loss_fn(h, y):
        return ((head(h) - y) ** 2).sum()

    space = {"trees": trees, "emb": emb, "labels": labels, "loss_fn": loss_fn}
    exec(compile(_tour(), str(README), "exec"), space)  # pylint: disable=exec-used
    return space


def test_readme_tour_runs_and_matches_eager():
    r = rng(4)
    trees = [random_tree(r, 30, max_depth=3) for _ in range(6)]
    emb = nd.random.uniform(-1, 1, shape=(30, 8))
    labels = [nd.array([[float(k % 2)]]) for k in range(len(trees))]
    space = _run_tour(trees, emb, labels)
    model, scope, outs = space["model"], space["scope"], space["outs"]
    assert scope.stats.samples == len(trees) and scope.stats.steps > 0
    batched = [h.asnumpy() for h, _ in outs]
    grads = {name: p.grad().asnumpy().copy() for name, p in model.collect_params().items()}
    with autograd.record():
        eager = [model(t, emb) for t in trees]
        loss = sum(space["loss_fn"](h, y) for (h, _), y in zip(eager, labels))
    loss.backward()
    for got, (want, _) in zip(batched, eager):
        np.testing.assert_allclose(got, want.asnumpy(), rtol=1e-5, atol=1e-6)
    for name, p in model.collect_params().items():
        np.testing.assert_allclose(grads[name], p.grad().asnumpy(), rtol=1e-4, atol=1e-6)
