"""Eager against batched runs of models whose samples read values, on fresh batches.

The model is the sequence-to-sequence decoder of ``examples/greedy_decoder.py``
(reversing digit strings), first trained with teacher forcing for
``--epochs`` epochs so that its sentences stop at different lengths.  Three
workloads, each on ``--samples`` sentences:

* ``greedy``: greedy decoding, an ``argmax`` read per token and a stop at
  end-of-sentence (``gdb.map`` in one scope against a loop of eager calls);
  the batched tokens and scores must equal eager's.
* ``sampling``: ancestral sampling, the probabilities read per token (each
  sentence with a ``random.Random`` of its own seed, the same on both sides).
* ``teacher_forcing``: one training batch (forward, backward), no reads.

Method.  Every round draws new sentences (``benchlib.batch_seed``), so no
system meets a batch it has seen; ``--warmup`` rounds run untimed first.  In
a round both systems run the same sentences back to back, eager first in
even rounds and batched first in odd ones, each between two waits for MXNet.
The figures are medians over rounds; ``x_eager`` is the median of the
per-round ratios.  ``flushes`` and ``longest`` (the most tokens of a sentence,
end-of-sentence included) are means over rounds: a scope flushes once per
token of its longest sentence, plus once.

Run from the repository root::

    .venv/bin/python scripts/bench_reads.py --samples 64 --record reads
"""
import argparse
import logging
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import mxnet as mx  # noqa: E402
from mxnet import autograd, nd  # noqa: E402
from tqdm import tqdm  # noqa: E402

import benchlib  # noqa: E402
import gluon_dynbatch as gdb  # noqa: E402
from examples import greedy_decoder as gd  # noqa: E402

LOG = logging.getLogger("bench_reads")
SCRIPT = "scripts/bench_reads.py"
WORKLOADS = ("greedy", "sampling", "teacher_forcing")
QUICK = {"samples": 16, "rounds": 2, "warmup": 1, "epochs": 1, "train_pairs": 256}
COLUMNS = (("workload", "workload", "%s"), ("samples", "samples", "%d"),
           ("eager_ms", "eager ms", "%.1f"), ("batched_ms", "batched ms", "%.1f"),
           ("x_eager", "x eager", "%.2f"), ("flushes", "flushes", "%.1f"),
           ("longest", "longest", "%.1f"), ("same", "same as eager", "%s"))


def build_parser():
    """The command-line parser."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--samples", type=int, default=64, help="sentences per batch")
    add("--rounds", type=int, default=5, help="timed rounds per workload")
    add("--warmup", type=int, default=2, help="untimed rounds first")
    add("--epochs", type=int, default=3, help="teacher-forced training before timing")
    add("--train-pairs", type=int, default=2000)
    add("--hidden", type=int, default=64)
    add("--workloads", default=",".join(WORKLOADS))
    add("--seed", type=int, default=11)
    add("--quick", action="store_true", help="short settings: %s" % QUICK)
    benchlib.add_record_arguments(parser)
    return parser


def trained_model(args):
    """The decoder, trained with teacher forcing (batched) for ``args.epochs``."""
    mx.random.seed(args.seed)
    model = gd.Seq2Seq(hidden=args.hidden)
    model.initialize(mx.init.Xavier())
    pairs = gd.make_pairs(args.train_pairs, random.Random(args.seed))
    gd.train(model, pairs, args.epochs, 32, 0.005, args.seed, progress=False)
    return model


def run_decoding(model, sources, batched, seeds=None):
    """Decode ``sources`` (sampling with ``seeds`` if given); (results, stats)."""
    def one(pair):
        source, seed = pair
        return model(source) if seed is None else model(source, None, random.Random(seed))
    pairs = list(zip(sources, seeds or [None] * len(sources)))
    if not batched:
        return [one(pair) for pair in pairs], None
    with gdb.batching() as scope:
        results = gdb.map(one, pairs)
    return results, scope.stats


def run_training(model, pairs, batched):
    """Forward and backward of one teacher-forced batch; (loss, stats)."""
    with autograd.record():
        if batched:
            with gdb.batching() as scope:
                losses = [model(source, target) for source, target in pairs]
            stats = scope.stats
        else:
            losses, stats = [model(source, target) for source, target in pairs], None
        loss = nd.add_n(*losses)
    loss.backward()
    return [(None, loss)], stats


def one_round(model, workload, seed, samples, batched_first):
    """Both systems on one fresh batch: {system: (ms, results, stats)}."""
    rng = random.Random(seed)
    pairs = gd.make_pairs(samples, rng)
    if workload == "teacher_forcing":
        def run(batched):
            return run_training(model, pairs, batched)
    else:
        seeds = [rng.randrange(1 << 30) for _ in pairs] if workload == "sampling" else None

        def run(batched):
            return run_decoding(model, [source for source, _ in pairs], batched, seeds)
    out = {}
    for batched in ((True, False) if batched_first else (False, True)):
        ms, (results, stats) = benchlib.time_call(lambda b=batched: run(b), sync=mx.nd.waitall)
        out["batched" if batched else "eager"] = (ms, results, stats)
    return out


def bench_workload(model, workload, args):
    """The row of one workload (see the module docstring)."""
    rounds = []
    for r in range(args.warmup + args.rounds):
        seed = benchlib.batch_seed(args.seed, workload, r)
        result = one_round(model, workload, seed, args.samples, batched_first=r % 2 == 1)
        if r >= args.warmup:
            rounds.append(result)
    eager = [r["eager"][0] for r in rounds]
    batched = [r["batched"][0] for r in rounds]
    same = all(gd.same_decodes(r["eager"][1], r["batched"][1]) for r in rounds) \
        if workload != "teacher_forcing" else "-"
    longest = [1 + max(len(tokens) for tokens, _ in r["eager"][1]) for r in rounds] \
        if workload != "teacher_forcing" else [0]
    return {"workload": workload, "samples": args.samples, "rounds": len(rounds),
            "eager_ms": benchlib.median(eager), "batched_ms": benchlib.median(batched),
            "x_eager": benchlib.median(e / b for e, b in zip(eager, batched)),
            "flushes": benchlib.mean(r["batched"][2].flushes for r in rounds),
            "longest": benchlib.mean(longest), "same": same}


def main(argv=None):
    """Train, time every workload, print and return the rows."""
    argv = benchlib.script_argv(argv)
    args = build_parser().parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    settings = {key: getattr(args, key) for key in
                ("samples", "rounds", "warmup", "epochs", "train_pairs", "hidden", "seed")}
    record = benchlib.start_record("reads", SCRIPT, argv, dict(settings, quick=args.quick))
    model = trained_model(args)
    rows = []
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for workload in tqdm(workloads, desc="workloads", leave=False, disable=None):
        rows.append(bench_workload(model, workload, args))
        LOG.info("%-16s eager %8.1f ms  batched %7.1f ms  x%.2f", workload,
                 rows[-1]["eager_ms"], rows[-1]["batched_ms"], rows[-1]["x_eager"])
    print("\n".join(benchlib.text_table(rows, COLUMNS)))
    benchlib.save_if_asked(args, "reads", SCRIPT, argv, settings, {"workloads": rows},
                           record=record)
    if not all(row["same"] in (True, "-") for row in rows):
        LOG.error("batched results differ from eager results")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
