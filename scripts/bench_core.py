"""One SICK Tree-LSTM batch, forward and backward, phase by phase, for each mode.

The Child-Sum Tree-LSTM of the example (D=300, H=150, random embeddings) on
batches of ``--pairs`` SICK train pairs (both trees of each pair), forward and
backward of a sum of squares of the root states (no optimiser), run eagerly
one tree at a time and batched by gluon_dynbatch in each mode of ``--modes``
(a strategy, optionally ``+compiled``, one CachedOp per plan, or ``+step``,
one per step).

Method.  Every mode has its own block sharing one set of Parameters, so no
mode reuses another's caches.  Batch k holds pairs ``k * pairs`` to
``(k + 1) * pairs - 1`` of SICK train.  Every mode first runs the same
``--warmup`` batches untimed; then ``--rounds`` rounds, round k running
every mode on batch ``warmup + k`` (a batch no mode has seen), the modes'
order rotating by one each round.  Each batch is timed between two waits for
MXNet.  Figures are medians over rounds (ms) and means (counts), ``x_eager``
the median of the per-round ratios to eager.

Usage: python scripts/bench_core.py [--pairs 25] [--rounds 5] [--modes ...]
    [--record bench_core]
"""
import argparse
import logging
import os
import sys

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import mxnet as mx  # noqa: E402
from mxnet import autograd, nd  # noqa: E402

import benchlib  # noqa: E402
import gluon_dynbatch as gdb  # noqa: E402
from examples.sick_data import default_data_dir, load_split  # noqa: E402
from examples.sick_model import ChildSumTreeLSTM  # noqa: E402

LOG = logging.getLogger("bench_core")
SCRIPT = "scripts/bench_core.py"
INPUT_SIZE, HIDDEN_SIZE = 300, 150
QUICK = {"rounds": 2, "warmup": 1}
"""Settings of ``--quick``."""
MS_FIELDS = ("record_ms", "plan_ms", "execute_ms", "compile_ms", "us_per_call")
COUNT_FIELDS = ("calls", "nodes", "steps", "mean_batch_size")
COLUMNS = (("mode", "mode", "%s"), ("ms", "ms", "%.1f"), ("x_eager", "x eager", "%.1f"),
           ("calls", "calls", "%.0f"), ("nodes", "nodes", "%.0f"), ("steps", "steps", "%.1f"),
           ("mean_batch_size", "mean batch", "%.1f"), ("record_ms", "record ms", "%.1f"),
           ("us_per_call", "us/call", "%.2f"), ("plan_ms", "plan ms", "%.1f"),
           ("execute_ms", "execute ms", "%.1f"), ("compile_ms", "compile ms", "%.1f"))


def load_batches(pairs, count):
    """``count`` batches of ``pairs`` SICK train pairs as trees, and the vocabulary size."""
    data_dir = default_data_dir()
    if data_dir is None:
        sys.exit("SICK not found: expected ../shared/data/sick (the preprocessed SICK of "
                 "Tai et al. 2015; see the README, section The SICK example)")
    split = load_split(data_dir, "train")
    if pairs * count > len(split):
        sys.exit("--pairs x (--warmup + --rounds) exceeds the %d pairs of SICK train"
                 % len(split))
    split = split[:pairs * count]
    vocab_size = benchlib.number_sick_words(split)
    batches = [[tree for pair in split[k * pairs:(k + 1) * pairs]
                for tree in (pair.a_tree, pair.b_tree)] for k in range(count)]
    return batches, vocab_size


def parse_mode(mode):
    """``"depth+compiled"`` -> arguments of ``gdb.batching`` (None for eager)."""
    if mode == "eager":
        return None
    strategy, _, how = mode.partition("+")
    if strategy not in gdb.STRATEGIES or how not in ("", "compiled", "step"):
        raise ValueError("bad mode %r: eager, or a strategy with +compiled or +step" % mode)
    return {"strategy": strategy, "compiled": {"compiled": True, "step": "step"}.get(how, False)}


def step(model, trees, emb, batching):
    """One forward and backward over ``trees``; the scope's stats (None when eager)."""
    stats = None
    with autograd.record():
        if batching is None:
            outs = [model(t, emb) for t in trees]
        else:
            with gdb.batching(**batching) as scope:
                outs = [model(t, emb) for t in trees]
            stats = scope.stats
        loss = nd.add_n(*[(h * h).sum() for h, _ in outs])
    loss.backward()
    return stats


def build_models(modes, vocab_size):
    """One block per mode, all sharing the first one's Parameters; the embeddings."""
    mx.random.seed(0)
    first = ChildSumTreeLSTM(HIDDEN_SIZE, INPUT_SIZE)
    first.initialize(mx.init.Xavier())
    models = {}
    for mode in modes:
        models[mode] = first if not models else ChildSumTreeLSTM(
            HIDDEN_SIZE, INPUT_SIZE, prefix=first.prefix, params=first.collect_params())
    emb = nd.random.uniform(-0.1, 0.1, shape=(vocab_size, INPUT_SIZE))
    return models, emb


def run_rounds(modes, batches, warmup, run):
    """Warm every mode up on the same batches, then time them in rotating rounds.

    Parameters
    ----------
    modes : list of str
    batches : list
        ``warmup`` warm-up batches, then one batch per round.
    warmup : int
    run : callable
        ``run(mode, batch) -> (ms, stats)``.

    Returns
    -------
    dict
        Mode -> list of ``(ms, stats)`` in round order.
    """
    for batch in batches[:warmup]:
        for mode in modes:
            run(mode, batch)
    timed = batches[warmup:]
    out = {mode: [None] * len(timed) for mode in modes}
    order = list(benchlib.interleaved(modes, len(timed)))
    for r, mode in tqdm(order, desc="rounds", unit="batch", leave=False, disable=None):
        out[mode][r] = run(mode, timed[r])
    return out


def summarize(modes, runs):
    """One row per mode: medians of ms, means of counts, ratio to eager."""
    rows = []
    eager = [ms for ms, _ in runs["eager"]] if "eager" in runs else None
    for mode in modes:
        times = [ms for ms, _ in runs[mode]]
        row = {"mode": mode, "ms": benchlib.median(times), "rounds": len(times),
               "x_eager": (benchlib.median(e / t for e, t in zip(eager, times))
                           if eager else None)}
        stats = [s.as_dict() for _, s in runs[mode] if s is not None]
        for name in MS_FIELDS:
            row[name] = benchlib.median(s[name] for s in stats)
        for name in COUNT_FIELDS:
            row[name] = benchlib.mean(s[name] for s in stats)
        rows.append(row)
    return rows


def build_parser():
    """Return the command-line parser."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=25, help="pairs per batch")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed rounds, each on a new batch (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed batches every mode runs first (default: %(default)s)")
    parser.add_argument("--modes", default="eager,depth,agenda,depth+compiled,depth+step",
                        help="comma list: eager, or a strategy with an optional "
                             "+compiled (one CachedOp per plan) or +step (per step)")
    parser.add_argument("--quick", action="store_true",
                        help="short settings: %s" % ", ".join(
                            "--%s %s" % item for item in QUICK.items()))
    benchlib.add_record_arguments(parser)
    return parser


def main(argv=None):
    """Time the modes; print and return the rows."""
    argv = benchlib.script_argv(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    quick = benchlib.apply_quick(args, QUICK)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        batching = {mode: parse_mode(mode) for mode in modes}
    except ValueError as err:
        parser.error(str(err))
    if args.rounds < 1 or args.warmup < 0 or args.pairs < 1:
        parser.error("--rounds and --pairs must be at least 1, --warmup at least 0")
    settings = {"pairs": args.pairs, "rounds": args.rounds, "warmup": args.warmup,
                "modes": modes, "input_size": INPUT_SIZE, "hidden_size": HIDDEN_SIZE,
                "quick": quick}
    record = benchlib.start_record("bench_core", SCRIPT, argv, settings)
    batches, vocab_size = load_batches(args.pairs, args.warmup + args.rounds)
    models, emb = build_models(modes, vocab_size)
    LOG.info("SICK train, batches of %d pairs (%d trees), D=%d H=%d, forward+backward",
             args.pairs, 2 * args.pairs, INPUT_SIZE, HIDDEN_SIZE)

    def run(mode, trees):
        return benchlib.time_call(lambda: step(models[mode], trees, emb, batching[mode]),
                                  sync=nd.waitall)
    rows = summarize(modes, run_rounds(modes, batches, args.warmup, run))
    print("\n".join(benchlib.text_table(rows, COLUMNS)))
    benchlib.save_if_asked(args, "bench_core", SCRIPT, argv, settings, {"modes": rows},
                           record=record)
    return rows


if __name__ == "__main__":
    main()
