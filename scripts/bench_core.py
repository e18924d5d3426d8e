"""Forward+backward time of SICK Tree-LSTM batches: eager one tree at a time vs batched.

Measures, in one run, the Child-Sum Tree-LSTM of the example (D=300, H=150,
random embeddings) on the first ``--pairs`` pairs of SICK train (both trees of
each pair), one sample at a time eagerly and with gluon_dynbatch's imperative
batched execution for each strategy.  Prints medians and ratios.

The same batch is timed repeatedly, so compiled modes run from their cache
after the warm-up; scripts/benchmark.py measures new batches and whole epochs.

Usage: python scripts/bench_core.py [--pairs 25] [--repeats 5] [--modes ...]
"""
import argparse
import os
import statistics
import sys
import time

import mxnet as mx
from mxnet import autograd, nd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import gluon_dynbatch as gdb  # noqa: E402
from examples.sick_data import attach_words, default_data_dir, load_split  # noqa: E402
from examples.sick_model import ChildSumTreeLSTM  # noqa: E402


def load_trees(pairs):
    data_dir = default_data_dir()
    if data_dir is None:
        sys.exit("SICK not found: expected ../shared/data/sick (the preprocessed SICK of Tai et al. 2015; see the README, section The SICK example)")
    split = load_split(data_dir, "train")[:pairs]
    vocab = {}
    trees = []
    for pair in split:
        for tokens, tree in ((pair.a_tokens, pair.a_tree), (pair.b_tokens, pair.b_tree)):
            ids = [vocab.setdefault(t.lower(), len(vocab)) for t in tokens]
            trees.append(attach_words(tree, ids))
    return trees, len(vocab)


def step(model, trees, emb, mode):
    """One forward+backward over all trees; returns seconds and stats."""
    nd.waitall()
    start = time.perf_counter()
    stats = None
    with autograd.record():
        if mode == "eager":
            outs = [model(t, emb) for t in trees]
        else:
            strategy, _, how = mode.partition("+")
            compiled = {"compiled": True, "step": "step"}.get(how, False)
            with gdb.batching(strategy=strategy, compiled=compiled) as scope:
                outs = [model(t, emb) for t in trees]
            stats = scope.stats
        loss = nd.add_n(*[(h * h).sum() for h, _ in outs])
    loss.backward()
    nd.waitall()
    return time.perf_counter() - start, stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default="eager,depth,agenda,depth+compiled,depth+step",
                        help="comma list: eager, or a strategy with an optional "
                             "+compiled (one CachedOp per plan) or +step (per step)")
    args = parser.parse_args()
    trees, vocab = load_trees(args.pairs)
    mx.random.seed(0)
    model = ChildSumTreeLSTM(150, 300)
    model.initialize(mx.init.Xavier())
    emb = nd.random.uniform(-0.1, 0.1, shape=(vocab, 300))
    nodes = sum(t.size() for t in trees)
    print("SICK train, %d pairs = %d trees, %d nodes, D=300 H=150, forward+backward"
          % (args.pairs, len(trees), nodes))
    times = {}
    for mode in args.modes.split(","):
        step(model, trees, emb, mode)                     # warm-up
        runs = [step(model, trees, emb, mode) for _ in range(args.repeats)]
        times[mode] = statistics.median(t for t, _ in runs)
        stats = runs[-1][1]
        print("%-8s %8.1f ms  %s" % (mode, 1000 * times[mode], stats if stats else ""))
    if "eager" in times:
        for mode, t in times.items():
            if mode != "eager":
                print("speed-up of %s over eager: %.1fx" % (mode, times["eager"] / t))


if __name__ == "__main__":
    main()
