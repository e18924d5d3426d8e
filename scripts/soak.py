"""Soak test: does memory stay bounded over thousands of batched training steps?

Trains a small Child-Sum Tree-LSTM (the example's model, tiny sizes) on random
dependency trees, a new random set of trees every batch, inside
``gluon_dynbatch.batching()`` with autograd and a ``gluon.Trainer``.  The
resident set size (``VmRSS`` of ``/proc/self/status``) is read after a
warm-up and at the end; the growth between the two is compared with a bound
(50 MB by default) and a one-line verdict is printed.  RSS over time goes to a
small CSV file.  The exit status is 0 when the growth is within the bound.
``--record NAME`` (or ``--json PATH``) also writes the figures as a record
for ``scripts/tables.py``.

``--model reads`` trains a tree model whose every node reads a value of the
graph and branches on it, so each sample waits at its reads as a task of its
own; every ``--stop-every``-th scope is left by an exception in the user's
loop while samples wait.  The verdict then also requires that no task (a
greenlet still alive) is left behind.

Run from the repository root::

    .venv/bin/python scripts/soak.py                    # 5000 batches, imperative
    .venv/bin/python scripts/soak.py --compiled step --batches 2000
    .venv/bin/python scripts/soak.py --model reads --batches 1000 --warmup 100
"""
import argparse
import csv
import gc
import os
import random
import sys
import tempfile
import time

import mxnet as mx
from mxnet import autograd, gluon, nd
from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "scripts")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import benchlib  # noqa: E402
import gluon_dynbatch as gdb  # noqa: E402
from gluon_dynbatch.record.tasks import live_tasks  # noqa: E402
from examples.sick_data import attach_words, parse_parents, random_parents  # noqa: E402
from examples.sick_model import ChildSumTreeLSTM  # noqa: E402

COMPILED = {"off": False, "plan": "plan", "step": "step", "auto": True}
SCRIPT = "scripts/soak.py"
QUICK = {"batches": 600, "warmup": 100}
"""Settings of ``--quick``."""


def rss_mb():
    """Resident set size of this process in MB (VmRSS of /proc/self/status)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("VmRSS not found in /proc/self/status (Linux only)")


def settled_rss_mb():
    """RSS once pending MXNet work is done and Python garbage is collected."""
    nd.waitall()
    gc.collect()
    return rss_mb()


def random_trees(rng, count, vocab, min_len, max_len):
    """``count`` random dependency trees with random words."""
    trees = []
    for _ in range(count):
        n = rng.randint(min_len, max_len)
        tree = parse_parents(random_parents(n, rng))
        trees.append(attach_words(tree, [rng.randrange(vocab) for _ in range(n)]))
    return trees


class BranchingTree(gdb.DynBatchBlock):
    """A tree RNN whose every node reads a score (``float(score.asscalar())``)
    and takes one of two layers by its sign; returns ``(state, score)``."""

    def __init__(self, hidden, input_size, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.inp = gluon.nn.Dense(hidden, in_units=input_size)
            self.gate = gluon.nn.Dense(1, in_units=hidden)
            self.up = gluon.nn.Dense(hidden, in_units=hidden, use_bias=False)
            self.down = gluon.nn.Dense(hidden, in_units=hidden, use_bias=False)

    def hybrid_forward(self, F, tree, emb):
        h = self.inp(F.take(emb, F.array([tree.word])))
        for child in tree.children:
            h = h + self(child, emb)[0]
        h = F.tanh(h)
        score = self.gate(h)
        if float(score.asscalar()) > 0:
            return F.tanh(self.up(h)), score
        return F.tanh(self.down(h)) * F.sigmoid(score), score


class SoakModel(gluon.Block):
    """A tree encoder (a DynBatchBlock: ``ChildSumTreeLSTM`` or
    :class:`BranchingTree`) and a linear read-out of the root state."""

    def __init__(self, encoder, hidden, input_size, strategy, compiled, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.encoder = encoder(hidden, input_size, strategy=strategy, compiled=compiled)
            self.head = gluon.nn.Dense(1, in_units=hidden)


MODELS = {"tree": ChildSumTreeLSTM, "reads": BranchingTree}
"""The encoder of each ``--model``."""


class LoopStopped(Exception):
    """Raised in the user's loop to leave a scope while samples wait at reads."""


def live_greenlets():
    """Greenlets started and not finished (tasks of samples still waiting)."""
    gc.collect()
    return live_tasks()


def stopped_step(model, trees, emb):
    """A batch whose loop raises after half its samples were called."""
    try:
        with autograd.record():
            with gdb.batching():
                for k, tree in enumerate(trees):
                    model.encoder(tree, emb)
                    if k == len(trees) // 2:
                        raise LoopStopped()
    except LoopStopped:
        return
    raise AssertionError("the loop did not stop")


def train_step(model, trainer, trees, targets, emb):
    """One batch: batched forward, L2 loss, backward, optimiser step."""
    with autograd.record():
        with gdb.batching():
            states = [model.encoder(t, emb) for t in trees]
        roots = nd.concat(*[h for h, _ in states], dim=0)
        loss = ((model.head(roots) - targets) ** 2).mean()
    loss.backward()
    trainer.step(1, ignore_stale_grad=True)    # a batch may take one branch only
    return loss


def parse_args(argv=None):
    """Parse and check the command line; apply ``--quick``."""
    parser = argparse.ArgumentParser(
        description="Train a tiny Tree-LSTM on random trees for many batches and check "
                    "that resident memory stays bounded.")
    parser.add_argument("--batches", type=int, default=5000,
                        help="batches to run, warm-up included (default 5000)")
    parser.add_argument("--warmup", type=int, default=200,
                        help="batches before the baseline RSS is taken (default 200)")
    parser.add_argument("--batch-size", type=int, default=8, help="trees per batch (default 8)")
    parser.add_argument("--min-len", type=int, default=2, help="fewest tree nodes (default 2)")
    parser.add_argument("--max-len", type=int, default=12, help="most tree nodes (default 12)")
    parser.add_argument("--hidden", type=int, default=8, help="Tree-LSTM memory size (default 8)")
    parser.add_argument("--input-size", type=int, default=8,
                        help="embedding width (default 8)")
    parser.add_argument("--vocab", type=int, default=100, help="vocabulary size (default 100)")
    parser.add_argument("--model", default="tree", choices=sorted(MODELS),
                        help="tree: Child-Sum Tree-LSTM; reads: a tree model branching on a "
                             "value read at every node (default tree)")
    parser.add_argument("--stop-every", type=int, default=10,
                        help="with --model reads, every N-th scope is left by an exception "
                             "while samples wait at reads; 0 never (default 10)")
    parser.add_argument("--strategy", default="agenda",
                        choices=[s for s in gdb.STRATEGIES if s != "reference"],
                        help="batching strategy (default agenda)")
    parser.add_argument("--compiled", default="off", choices=sorted(COMPILED),
                        help="off: imperative; plan: one CachedOp per plan (LRU plan "
                             "cache); step: one CachedOp per step; auto: compiled=True, "
                             "the executor measured cheapest (default off)")
    parser.add_argument("--bound-mb", type=float, default=50.0,
                        help="largest acceptable RSS growth after warm-up (default 50)")
    parser.add_argument("--sample-every", type=int, default=50,
                        help="batches between RSS samples in the CSV (default 50)")
    parser.add_argument("--csv", default=os.path.join(tempfile.gettempdir(),
                                                      "gluon_dynbatch_soak_rss.csv"),
                        help="where to write batch,seconds,rss_mb (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--quick", action="store_true",
                        help="short settings: %s" % ", ".join(
                            "--%s %s" % item for item in QUICK.items()))
    benchlib.add_record_arguments(parser)
    args = parser.parse_args(argv)
    args.quick_settings = benchlib.apply_quick(args, QUICK)
    if args.batches < 1 or not 0 <= args.warmup < args.batches:
        parser.error("need --batches >= 1 and 0 <= --warmup < --batches")
    if not 1 <= args.min_len <= args.max_len:
        parser.error("need 1 <= --min-len <= --max-len")
    if args.sample_every < 1:
        parser.error("--sample-every must be at least 1")
    return args


def settings_of(args):
    """The run's settings, for the record."""
    keep = ("model", "stop_every", "batches", "warmup", "batch_size", "min_len", "max_len",
            "hidden", "input_size", "vocab", "strategy", "compiled", "bound_mb", "seed")
    return dict({key: getattr(args, key) for key in keep}, quick=args.quick_settings)


def main(argv=None):
    """Train for ``--batches`` batches; print the verdict; 0 when RSS stayed bounded."""
    argv = benchlib.script_argv(argv)
    args = parse_args(argv)
    record = benchlib.start_record("soak", SCRIPT, argv, settings_of(args))
    rng = random.Random(args.seed)
    mx.random.seed(args.seed)
    model = SoakModel(MODELS[args.model], args.hidden, args.input_size, args.strategy,
                      COMPILED[args.compiled])
    model.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(model.collect_params(), "adagrad", {"learning_rate": 0.05})
    emb = nd.random.uniform(-0.5, 0.5, shape=(args.vocab, args.input_size))

    rows = [(0, 0.0, rss_mb())]
    baseline = None
    tasks_warm = None
    stopped = 0
    start = time.perf_counter()
    loss = None
    bar = tqdm(range(1, args.batches + 1), disable=args.no_progress, unit="batch",
               desc="soak %s/%s/%s" % (args.model, args.strategy, args.compiled))
    for batch in bar:
        trees = random_trees(rng, args.batch_size, args.vocab, args.min_len, args.max_len)
        targets = nd.array([[rng.uniform(-1, 1)] for _ in trees])
        if args.model == "reads" and args.stop_every and batch % args.stop_every == 0:
            stopped_step(model, trees, emb)
            stopped += 1
        else:
            loss = train_step(model, trainer, trees, targets, emb)
        if batch == args.warmup or (args.warmup == 0 and batch == 1):
            baseline = settled_rss_mb()
            tasks_warm = live_greenlets()
            rows.append((batch, time.perf_counter() - start, baseline))
        elif batch % args.sample_every == 0:
            rows.append((batch, time.perf_counter() - start, rss_mb()))
            bar.set_postfix(rss_mb="%.1f" % rows[-1][2], loss="%.4f" % loss.asscalar())
    final = settled_rss_mb()
    elapsed = time.perf_counter() - start
    tasks_end = live_greenlets()
    rows.append((args.batches, elapsed, final))

    with open(args.csv, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["batch", "seconds", "rss_mb"])
        for batch, seconds, rss in rows:
            writer.writerow([batch, "%.2f" % seconds, "%.1f" % rss])

    growth = final - baseline
    cache = model.encoder.plan_cache
    print("%d batches of %d trees (%s, compiled=%s) in %.0f s (%.1f ms/batch); final loss %.4f"
          % (args.batches, args.batch_size, args.strategy, args.compiled, elapsed,
             1000.0 * elapsed / args.batches, loss.asscalar()))
    if args.compiled != "off":
        print("plan cache: %d entries (max %d), %d hits, %d misses, %d evictions"
              % (len(cache), cache.max_plans, cache.hits, cache.misses, cache.evictions))
    print("RSS: %.1f MB at start, %.1f MB after %d warm-up batches, %.1f MB at the end; "
          "CSV: %s" % (rows[0][2], baseline, max(args.warmup, 1), final, args.csv))
    if args.model == "reads":
        print("%d scopes left by an exception while samples waited; live tasks (greenlets): "
              "%d after warm-up, %d at the end" % (stopped, tasks_warm, tasks_end))
    verdict = "PASS" if growth <= args.bound_mb and tasks_end <= tasks_warm else "FAIL"
    print("%s: RSS grew %+.1f MB over %d batches after warm-up (bound %.0f MB)%s"
          % (verdict, growth, args.batches - max(args.warmup, 1), args.bound_mb,
             "; tasks left %+d" % (tasks_end - tasks_warm) if args.model == "reads" else ""))
    summary = {"model": args.model, "stopped_scopes": stopped,
               "stop_every": args.stop_every if args.model == "reads" else None,
               "tasks_warm": tasks_warm, "tasks_end": tasks_end,
               "batches": args.batches, "batch_size": args.batch_size,
               "strategy": args.strategy, "compiled": args.compiled,
               "ms_per_batch": 1000.0 * elapsed / args.batches,
               "rss_start_mb": rows[0][2], "rss_warm_mb": baseline, "rss_end_mb": final,
               "growth_mb": growth, "bound_mb": args.bound_mb, "verdict": verdict,
               "plan_cache_hits": cache.hits if args.compiled != "off" else None,
               "plan_cache_misses": cache.misses if args.compiled != "off" else None}
    samples = [{"batch": b, "seconds": sec, "rss_mb": rss} for b, sec, rss in rows]
    benchlib.save_if_asked(args, "soak", SCRIPT, argv, settings_of(args),
                           {"soak": [summary], "rss": samples}, record=record)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
