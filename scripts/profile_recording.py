"""Where recording time goes: per frame, per read of a child's value, per call.

Two measurements, each a median over ``--rounds`` scopes after ``--warmup``
scopes that teach the templates (``scope.stats.record_ms``: the time the
samples' code ran inside the scope, interception included):

1. A synthetic recursion: 50 chains of 41 calls of a DynBatchBlock, each
   calling itself and then 0, 1 or 25 operators on the child's value.  The
   differences give the cost of a frame (a DynBatchBlock call with no
   operator), of the first operator (it reads the child's value, and the
   frame becomes a program node of the graph) and of each further operator
   call on a matched template path; and 2,050 samples of one frame each,
   giving what a sample's top-level call costs beyond its frame (the task it
   runs as).
2. The SST Tree-LSTM written operator by operator (``examples/sst_model.py``,
   E = H = 128) on batches of ``--trees`` SST train trees: recording per
   call, and the floor of the same Python code run with an ``F`` whose
   operators do nothing (what the user's code costs by itself).

Usage: python scripts/profile_recording.py [--rounds 9] [--warmup 3] [--trees 50]
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]

from mxnet import autograd, nd  # noqa: E402

import gluon_dynbatch as gdb  # noqa: E402
from examples import sst_data, sst_model  # noqa: E402

CHAIN = 40          # recursion depth of the synthetic model (41 frames a sample)
SAMPLES = 50
FLOOR_OPERATORS = ("FullyConnected", "Activation", "slice_axis", "concat", "pick",
                   "log_softmax")
"""The ``F`` operators ``examples/sst_model.py``'s op-by-op encoder calls."""


class Chain(gdb.DynBatchBlock):
    """``f(d) = ops(f(d - 1))``, ``f(0) = x``: ``ops`` is no call, one, or 25 calls
    of unary, sliced and arithmetic operators, each at a line of its own."""

    def __init__(self, ops, **kwargs):
        super().__init__(**kwargs)
        self.ops = ops

    def hybrid_forward(self, F, depth, x):  # pylint: disable=arguments-differ
        if depth == 0:
            return x
        y = self(depth - 1, x)
        if self.ops == 0:
            return y
        y = F.tanh(y)
        if self.ops == 1:
            return y
        y = F.sigmoid(y)
        y = F.relu(y)
        y = F.Activation(y, act_type="tanh")
        y = F.Activation(y, act_type="sigmoid")
        y = F.slice_axis(y, axis=1, begin=0, end=4)
        y = y * y
        y = y + y
        y = F.tanh(y)
        y = F.sigmoid(y)
        y = F.relu(y)
        y = F.Activation(y, act_type="tanh")
        y = F.Activation(y, act_type="sigmoid")
        y = F.slice_axis(y, axis=1, begin=0, end=4)
        y = y * y
        y = y + y
        y = F.tanh(y)
        y = F.sigmoid(y)
        y = F.relu(y)
        y = F.Activation(y, act_type="tanh")
        y = F.Activation(y, act_type="sigmoid")
        y = F.slice_axis(y, axis=1, begin=0, end=4)
        y = y * y
        y = y + y
        return y


def record_ms(run, rounds, warmup):
    """Median ``record_ms`` and calls of ``run()``'s scopes after ``warmup`` scopes."""
    stats = []
    for k in range(warmup + rounds):
        with gdb.batching() as scope:
            outs = run(k)
        del outs
        nd.waitall()
        if k >= warmup:
            stats.append(scope.stats)
    return (statistics.median(s.record_ms for s in stats),
            statistics.median(s.calls for s in stats))


def synthetic(rounds, warmup):
    """Microseconds of a frame, of its first operator, and of each further call."""
    per_frame = {}
    for ops in (0, 1, 25):
        block = Chain(ops)
        block.initialize()
        x = nd.ones((1, 4))
        ms, _ = record_ms(lambda k, b=block: [b(CHAIN, x) for _ in range(SAMPLES)],
                          rounds, warmup)
        per_frame[ops] = ms * 1e3 / (SAMPLES * (CHAIN + 1))
    block = Chain(0)
    block.initialize()
    ms, _ = record_ms(lambda k: [block(0, x) for _ in range(SAMPLES * (CHAIN + 1))],
                      rounds, warmup)
    sample_us = ms * 1e3 / (SAMPLES * (CHAIN + 1)) - per_frame[0]
    return {"frame_us": per_frame[0], "first_call_us": per_frame[1] - per_frame[0],
            "call_us": (per_frame[25] - per_frame[1]) / 24, "sample_us": sample_us}


class _Nothing:
    """A value whose operators do nothing (the floor's stand-in for arrays)."""

    context = None

    def __getitem__(self, key):
        return self

    def _same(self, *_):
        return self

    __add__ = __radd__ = __sub__ = __mul__ = __rmul__ = __neg__ = _same


class _NothingF:
    """An ``F`` whose operators return ``_Nothing`` at once."""

    def __init__(self):
        nothing = _Nothing()
        for name in FLOOR_OPERATORS:
            setattr(self, name, lambda *args, **kwargs: nothing)
        self.value = nothing


class _FloorEncoder:
    """Runs ``OpByOpBinaryTreeLSTM.hybrid_forward`` with ``_NothingF``."""

    def __init__(self, encoder):
        self._hidden_size = encoder._hidden_size  # pylint: disable=protected-access
        self._num_classes = encoder._num_classes  # pylint: disable=protected-access
        self.F = _NothingF()
        self.params = {name: self.F.value for name in sst_model.CELL_WEIGHT_NAMES}

    def __call__(self, tree, embeddings):
        return sst_model.OpByOpBinaryTreeLSTM.hybrid_forward(
            self, self.F, tree, embeddings, **self.params)

    def _label(self, F, tree, embeddings):
        return F.slice_axis(F.value, axis=0, begin=tree.label, end=tree.label + 1)

    _binary_children = staticmethod(sst_model.OpByOpBinaryTreeLSTM._binary_children)


def sst(rounds, warmup, trees_per_batch):
    """Recording per call of the op-by-op SST model, and its Python floor."""
    data_dir = sst_data.default_sst_dir()
    if data_dir is None:
        sys.exit("SST not found: expected ../shared/data/sst (see the README)")
    trees = sst_data.load_sst(data_dir, "train")
    vocab = sst_data.build_vocab(trees)
    sst_data.assign_ids(trees, vocab)
    encoder = sst_model.OpByOpBinaryTreeLSTM(128, 128)
    encoder.initialize()
    table = nd.random.uniform(shape=(len(vocab) + 1, 128))

    def batch(k):
        return trees[k * trees_per_batch:(k + 1) * trees_per_batch]

    def run(k):
        with autograd.record():
            return [encoder(tree, table) for tree in batch(k)]

    ms, calls = record_ms(run, rounds, warmup)
    floor = _FloorEncoder(encoder)
    floors = []
    for k in range(warmup + rounds):
        start = time.perf_counter()
        for tree in batch(k):
            floor(tree, table)
        floors.append(time.perf_counter() - start)
    floor_ms = statistics.median(floors[warmup:]) * 1e3
    return {"record_ms": ms, "calls": calls, "us_per_call": ms * 1e3 / calls,
            "floor_ms": floor_ms, "floor_us_per_call": floor_ms * 1e3 / calls}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="timed scopes per measurement")
    parser.add_argument("--warmup", type=int, default=3, help="untimed scopes before them")
    parser.add_argument("--trees", type=int, default=50, help="SST trees a batch")
    args = parser.parse_args(argv)
    parts = synthetic(args.rounds, args.warmup)
    print("synthetic recursion (%d samples x %d frames):" % (SAMPLES, CHAIN + 1))
    print("  a frame with no operator        %6.2f us" % parts["frame_us"])
    print("  its first operator (reads the child's value; a program node) %6.2f us"
          % parts["first_call_us"])
    print("  each further operator call      %6.2f us" % parts["call_us"])
    print("  a sample: a top-level call, beyond its frame (its task) %6.2f us"
          % parts["sample_us"])
    found = sst(args.rounds, args.warmup, args.trees)
    print("SST op-by-op, %d trees a batch: recording %.1f ms for %d calls (%.2f us a call); "
          "the same code with operators that do nothing %.1f ms (%.2f us a call)"
          % (args.trees, found["record_ms"], found["calls"], found["us_per_call"],
             found["floor_ms"], found["floor_us_per_call"]))


if __name__ == "__main__":
    main()
