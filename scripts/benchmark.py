"""Training-step throughput of the SICK Child-Sum Tree-LSTM, every system in one run.

Two ways of writing the same model (``--model``, default both):

* ``cell``: the example's ChildSumTreeLSTM, whose node update is one call of
  a cell block (ChildSumLSTMCell);
* ``opbyop``: the example's OpByOpTreeLSTM, the same function written
  operator by operator (``nn.Dense`` children, ``F.split``, a Python loop
  over the children); it starts from the cell model's weights.

Each model has its own Parameters, head and trainer; every system but
hand-batched runs once per model.  Systems, all of one model on the same
Parameters, batches, loss and optimiser (AdaGrad):

* ``eager``: the example's ChildSumTreeLSTM outside any batching scope, one
  tree (and one node) at a time;
* ``imperative-<strategy>``: gluon_dynbatch, batched imperative execution;
* ``step-<strategy>``: gluon_dynbatch, each step of a flush one cached CachedOp;
* ``compiled-<strategy>``: gluon_dynbatch, each flush one CachedOp with a plan
  cache, plus a sweep of ``analysis_budget`` (``compiled budget=...``);
* ``handbatched``: scripts/handbatched_treelstm.py, level by level, index
  arrays fed as data, one CachedOp per level count (the practical limit).

A step is forward over 25 SICK train pairs (50 trees, D=300, H=150, fixed
random embeddings), the example's similarity head and KL loss, backward and
``Trainer.step``.  Medians over ``--batches`` batches, each one seen for the
first time by the timed system (warm-up batches come before them), are
reported as trees/s and as ratios to the same model's eager run and to
hand-batched (which computes the same function).

Method.  Every system, eager included, first trains on the same
``--warmup`` batches, untimed.  The timed batches follow them, the same ones
for every system; they run in interleaved rounds (``--round-batches``
batches of every system, the systems' order rotating each round), so that
the machine's drift in speed during the run does not skew the ratios.  The
further passes are interleaved the same way: the systems with a plan cache
run the timed batches a second time (``again``: batches seen before, plans
cached), and every system runs the batches that follow the timed ones back
to back, without a wait per step (``b2b``: batches new to it).  The epoch
check trains every epoch-check system on SICK train from empty caches, the
systems again taking turns in rounds.

Results go to ``--out-dir`` as CSV, Markdown, JSON and (after the budget
sweep) a PNG; ``--record NAME`` (or ``--json PATH``) writes the run's record
for ``scripts/tables.py``.

Run from the repository root::

    .venv/bin/python scripts/benchmark.py --batches 10 --epoch-check --record sick_training
"""
import argparse
import csv
import gc
import inspect
import json
import logging
import math
import os
import platform
import random
import statistics
import sys
import time
from collections import namedtuple
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import benchlib  # noqa: E402
from examples.progress_logging import setup_logging  # noqa: E402

LOG = logging.getLogger("benchmark")

PAIRS_PER_BATCH = 25
INPUT_SIZE = 300
HIDDEN_SIZE = 150
LEARNING_RATE = 0.05
WEIGHT_DECAY = 1e-4
DEFAULT_BUDGETS = "0,0.001,0.01,0.1,auto"
STRATEGIES = ("agenda", "depth")
GROUPS = ("eager", "imperative", "compiled", "step", "budget", "handbatched")
#: Timings of BatchStats, ms; ``compile_ms`` is part of ``execute_ms``.
STATS_FIELDS = ("record_ms", "plan_ms", "compile_ms", "execute_ms")
#: The time split reported, ms per batch (means, so they add up).
SPLIT_FIELDS = ("record_ms", "plan_ms", "compile_ms", "launch_ms", "gc_ms",
                "other_ms")
#: Counters summed over the timed batches.
COUNT_FIELDS = ("cache_hits", "cache_misses", "evictions", "steps",
                "planned_nodes", "nodes", "calls", "reused_choices")
EPOCH_SKIP = 5
SCRIPT = "scripts/benchmark.py"
QUICK = {"batches": 2, "warmup": 1, "round_batches": 1, "epoch_batches": 20}
"""Settings of ``--quick`` (a smoke run)."""
#: Systems with a plan cache, timed a second time on the same batches.
CACHING_KINDS = ("compiled", "step", "handbatched")

# Filled in by import_runtime(), after --threads has set the environment.
mx = nd = autograd = gluon = gdb = None
sick_data = sick_model = handbatched = None

#: The model classes of ``--model``, by name (see the module docstring).
MODEL_CLASSES = {"cell": "ChildSumTreeLSTM", "opbyop": "OpByOpTreeLSTM"}
MODEL_CHOICES = ("cell", "opbyop", "both")

System = namedtuple("System", ["name", "kind", "strategy", "budget", "model"],
                    defaults=("cell",))
System.__doc__ = """One benchmarked configuration.

Attributes
----------
name : str
    Row label.
kind : str
    ``"eager"``, ``"imperative"``, ``"compiled"`` or ``"handbatched"``.
strategy : str or None
    gluon_dynbatch strategy; None = the library default.
budget : float, str or None
    ``analysis_budget``; None = the library default.
model : str
    ``"cell"`` or ``"opbyop"`` (a key of :data:`MODEL_CLASSES`).
"""


class GcTimer:
    """Wall time spent in Python's cyclic garbage collector (gc.callbacks).

    Attributes
    ----------
    total : float
        Seconds in collections since :meth:`install`.
    """

    def __init__(self):
        self.total = 0.0
        self._start = None

    def __call__(self, phase, info):
        """The gc callback: time each collection."""
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.total += time.perf_counter() - self._start
            self._start = None

    def install(self):
        """Start timing collections; return self."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def uninstall(self):
        """Stop timing collections."""
        if self in gc.callbacks:
            gc.callbacks.remove(self)


GC_TIMER = GcTimer()


def build_parser():
    """Return the command-line parser.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(
        description="Training-step throughput of the SICK Child-Sum "
                    "Tree-LSTM: eager Gluon, gluon_dynbatch (imperative and "
                    "compiled) and a hand-batched CachedOp implementation.",
        epilog="Systems (--systems): groups %s, or names such as "
               "imperative-agenda, compiled-depth, handbatched."
               % ", ".join(GROUPS))
    add = parser.add_argument
    add("--data-dir", default=None,
        help="SICK directory holding train/ (default: ../shared/data/sick "
             "from the repository root)")
    add("--batches", type=int, default=10,
        help="timed batches per system (default: %(default)s)")
    add("--warmup", type=int, default=3,
        help="untimed batches every system runs before the timed ones, the same "
             "ones for every system (default: %(default)s)")
    add("--eager-batches", type=int, default=None,
        help="timed batches for eager, ~1 s each (default: as --batches, so that "
             "eager is timed on the same batches as every other system and the "
             "ratios compare the same work)")
    add("--round-batches", type=int, default=5,
        help="timed batches each system runs in a row before the next system's "
             "turn; the rounds rotate the systems' order (default: %(default)s)")
    add("--systems", default=",".join(GROUPS),
        help="comma list of systems or groups to run (default: all)")
    add("--model", choices=MODEL_CHOICES, default="both",
        help="model code timed: 'cell' (the node update in one cell block), "
             "'opbyop' (the same function written operator by operator) or "
             "'both', each system once per model, in the same interleaved "
             "rounds (default: %(default)s); hand-batched runs once")
    add("--budgets", default=DEFAULT_BUDGETS,
        help="analysis_budget values of the sweep, seconds or 'auto' "
             "(default: %(default)s)")
    add("--no-back-to-back", action="store_true",
        help="do not run the batches after the timed ones back to back (no "
             "per-step wait)")
    add("--no-second-pass", action="store_true",
        help="do not time the batches a second time (seen before, all plans "
             "cached) for the systems with a plan cache")
    add("--epoch-check", action="store_true",
        help="also train one whole epoch of SICK train (180 batches) with "
             "the compiled configs of each model timed (and "
             "hand-batched) and report the cache hit rate and the "
             "analysis+compile share")
    add("--epoch-batches", type=int, default=None,
        help="train only the first N batches of the epoch in --epoch-check "
             "(default: all)")
    add("--quick", action="store_true",
        help="short settings for a smoke run: %s" % ", ".join(
            "--%s %s" % (k.replace("_", "-"), v) for k, v in QUICK.items()))
    add("--out-dir", default="results/benchmark",
        help="where CSV, Markdown, JSON and PNG go (default: %(default)s)")
    add("--seed", type=int, default=0,
        help="seed of batch order, embeddings and init (default: %(default)s)")
    add("--threads", type=int, default=None,
        help="set OMP_NUM_THREADS before importing mxnet (default: as set)")
    add("--engine-threads", type=int, default=None,
        help="set MXNET_CPU_WORKER_NTHREADS before importing mxnet")
    add("--verbose", action="store_true", help="debug logging")
    benchlib.add_record_arguments(parser)
    return parser


def set_threads(threads, engine_threads):
    """Set the thread environment variables; must precede importing mxnet."""
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    if engine_threads is not None:
        os.environ["MXNET_CPU_WORKER_NTHREADS"] = str(engine_threads)
    if "mxnet" in sys.modules and (threads or engine_threads):
        LOG.warning("mxnet was imported already: thread settings may be "
                    "ignored")


def import_runtime():
    """Import mxnet, gluon_dynbatch and the model code into module globals."""
    global mx, nd, autograd, gluon, gdb  # pylint: disable=global-statement
    global sick_data, sick_model, handbatched  # pylint: disable=global-statement
    import mxnet  # pylint: disable=import-outside-toplevel
    import gluon_dynbatch  # pylint: disable=import-outside-toplevel
    import handbatched_treelstm  # pylint: disable=import-outside-toplevel
    from examples import sick_data as data_mod  # pylint: disable=import-outside-toplevel
    from examples import sick_model as model_mod  # pylint: disable=import-outside-toplevel
    mx, nd, autograd, gluon = mxnet, mxnet.nd, mxnet.autograd, mxnet.gluon
    gdb, handbatched = gluon_dynbatch, handbatched_treelstm
    sick_data, sick_model = data_mod, model_mod


# --------------------------------------------------------------------------
# Library features
# --------------------------------------------------------------------------

def detect_features():
    """Find out what this gluon_dynbatch supports.

    Returns
    -------
    dict
        ``compiled`` (bool), ``budget_via`` (``"scope"``, ``"block"`` or
        None) and ``notes`` (list of str).
    """
    notes = []
    try:
        gdb.batching(compiled=True)
        compiled = True
    except TypeError as err:
        compiled = False
        notes.append("compiled execution unavailable: gdb.batching("
                     "compiled=True) raised TypeError (%s)" % err)
    budget_via = None
    if "analysis_budget" in inspect.signature(gdb.batching).parameters:
        budget_via = "scope"
    elif "analysis_budget" in inspect.signature(
            gdb.DynBatchBlock.__init__).parameters:
        budget_via = "block"
    if budget_via and not compiled:
        notes.append("analysis_budget sweep skipped: the budget only acts "
                     "on compiled execution, which is unavailable")
        budget_via = None
    elif not budget_via:
        notes.append("analysis_budget sweep skipped: not a parameter of "
                     "gdb.batching or DynBatchBlock")
    return {"compiled": compiled, "budget_via": budget_via, "notes": notes}


def clear_engine_caches():
    """Empty gluon_dynbatch's shared plan cache so systems do not share plans.

    Each system also gets a fresh encoder block (and so an empty per-block
    cache); the scope module's ``DEFAULT_CACHE`` serves scopes without one.

    Returns
    -------
    list of str
        What was cleared.
    """
    from gluon_dynbatch import scope
    scope.DEFAULT_CACHE.clear()
    LOG.debug("cleared the default plan cache")
    return ["gdb.scope.DEFAULT_CACHE"]


# --------------------------------------------------------------------------
# Systems
# --------------------------------------------------------------------------

def parse_budget(text):
    """``"auto"`` stays a string; anything else becomes a float."""
    text = text.strip()
    return text if text == "auto" else float(text)


def all_systems(budgets):
    """Every system the benchmark knows, in run order.

    Parameters
    ----------
    budgets : list
        Values of the analysis_budget sweep.

    Returns
    -------
    list of (str, System)
        Group name and system.
    """
    systems = [("handbatched", System("handbatched", "handbatched", None, None))]
    for kind in ("imperative", "compiled", "step"):
        systems += [(kind, System("%s-%s" % (kind, s), kind, s, None))
                    for s in STRATEGIES]
    systems += [("budget", System("compiled budget=%s" % b, "compiled", None, b))
                for b in budgets]
    systems.append(("eager", System("eager", "eager", None, None)))
    return systems


def select_systems(spec, budgets, model="cell"):
    """Systems named (or whose group is named) in the comma list ``spec``.

    Parameters
    ----------
    spec : str
    budgets : list
    model : {"cell", "opbyop", "both"}, optional
        Every system but hand-batched is run for this model, or for each of
        the two (see :func:`for_models`).

    Raises
    ------
    SystemExit
        A name matches no system.
    """
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    known = all_systems(budgets)
    names = {s.name for _, s in known} | set(GROUPS)
    unknown = [w for w in wanted if w not in names]
    if unknown:
        sys.exit("unknown system(s) %s; choose from %s"
                 % (", ".join(unknown), ", ".join(sorted(names))))
    chosen = [s for group, s in known if group in wanted or s.name in wanted]
    return for_models(chosen, ("cell", "opbyop") if model == "both" else (model,))


def for_models(systems, models):
    """Each system once per model; hand-batched (a model of its own) once.

    The rows of the cell model keep the systems' names; the other models'
    rows get the model's name in brackets (``eager [opbyop]``).

    Returns
    -------
    list of System
        Grouped by model, in the order of ``models``.
    """
    out = [s for s in systems if s.kind == "handbatched"]
    for model in models:
        label = "" if model == "cell" else " [%s]" % model
        out += [s._replace(name=s.name + label, model=model) for s in systems
                if s.kind != "handbatched"]
    return out


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def resolve_data_dir(path):
    """Return the SICK directory or exit with a clear message."""
    data_dir = Path(path) if path else sick_data.default_data_dir()
    if data_dir is None or not (Path(data_dir) / "train").is_dir():
        where = data_dir or (ROOT.parent / "shared" / "data" / "sick")
        sys.exit("SICK train split not found at %s/train.\nThe benchmark "
                 "needs the SICK data preprocessed as in Tai et al. (2015) "
                 "(a.toks, b.toks, a.parents, b.parents, sim.txt); pass "
                 "--data-dir DIR." % where)
    return Path(data_dir)


def load_batches(data_dir, seed):
    """SICK train in shuffled batches of 25 pairs, word ids attached.

    Returns
    -------
    batches : list of list of SickPair
    vocab_size : int
    """
    pairs = sick_data.load_split(data_dir, "train")
    vocab_size = benchlib.number_sick_words(pairs)
    random.Random(seed).shuffle(pairs)
    batches = [pairs[i:i + PAIRS_PER_BATCH]
               for i in range(0, len(pairs), PAIRS_PER_BATCH)]
    LOG.info("SICK train from %s: %d pairs, %d batches of %d, vocabulary %d",
             data_dir, len(pairs), len(batches), PAIRS_PER_BATCH, vocab_size)
    return batches, vocab_size


def batch_trees(pairs):
    """All a-trees then all b-trees of a batch."""
    return [p.a_tree for p in pairs] + [p.b_tree for p in pairs]


# --------------------------------------------------------------------------
# The training step
# --------------------------------------------------------------------------

ModelParts = namedtuple("ModelParts", ["encoder", "head", "trainer"])
ModelParts.__doc__ = """One model's encoder, similarity head and AdaGrad trainer."""


class Bench:
    """Shared models, heads, embeddings, loss and trainers of all systems.

    The cell model's parts are also ``encoder``, ``head`` and ``trainer``
    (hand-batched reads the cell's Parameters).  Every other model starts
    from the cell model's weights, so both compute the same function at
    the start; each then trains its own copy.

    Parameters
    ----------
    vocab_size : int
    features : dict
        From :func:`detect_features`.
    models : sequence of str, optional
        Keys of :data:`MODEL_CLASSES` to build besides ``"cell"``.
    """

    def __init__(self, vocab_size, features, models=("cell",)):
        self.features = features
        self.ctx = mx.cpu()
        self.embeddings = nd.random.uniform(
            -0.05, 0.05, shape=(vocab_size, INPUT_SIZE), ctx=self.ctx)
        self.loss_fn = sick_model.make_loss()
        self.parts = {"cell": self._build("cell")}
        self.encoder, self.head, self.trainer = self.parts["cell"]
        for model in models:
            if model not in self.parts:
                self.parts[model] = self._build(model, like=self.parts["cell"])

    def _build(self, model, like=None):
        """Encoder, head and trainer of ``model``; weights copied from ``like``."""
        encoder = getattr(sick_model, MODEL_CLASSES[model])(HIDDEN_SIZE, INPUT_SIZE)
        head = sick_model.SimilarityHead(HIDDEN_SIZE)
        encoder.initialize(mx.init.Xavier(), ctx=self.ctx)
        head.initialize(mx.init.Xavier(), ctx=self.ctx)
        if like is not None:
            sick_model.copy_encoder_weights(like.encoder, encoder)
            for mine, theirs in zip(head.collect_params().values(),
                                    like.head.collect_params().values()):
                mine.set_data(theirs.data())
        params = encoder.collect_params()
        params.update(head.collect_params())
        trainer = gluon.Trainer(params, "adagrad", {
            "learning_rate": LEARNING_RATE, "wd": WEIGHT_DECAY})
        return ModelParts(encoder, head, trainer)

    def encoder_for(self, system):
        """A fresh encoder sharing the Parameters of ``system``'s model.

        A new block per system starts any per-block plan cache empty.
        """
        kwargs = {}
        if system.budget is not None and self.features["budget_via"] == "block":
            kwargs["analysis_budget"] = system.budget
        shared = self.parts[system.model].encoder
        encoder = type(shared)(HIDDEN_SIZE, INPUT_SIZE, prefix=shared.prefix,
                               params=shared.collect_params(), **kwargs)
        theirs = dict(shared.collect_params().items())
        for name, param in encoder.collect_params().items():
            if theirs.get(name) is not param:
                raise RuntimeError("encoder copy does not share %s" % name)
        return encoder

    def scope_kwargs(self, system):
        """Arguments of ``gdb.batching`` for a gluon_dynbatch system."""
        kwargs = {"strategy": system.strategy}
        if self.features["compiled"]:
            kwargs["compiled"] = {"compiled": True, "step": "step"}.get(system.kind, False)
        if system.budget is not None and self.features["budget_via"] == "scope":
            kwargs["analysis_budget"] = system.budget
        return kwargs


class Runner:
    """Runs training steps of one system and returns per-batch figures.

    Parameters
    ----------
    bench : Bench
    system : System
    """

    def __init__(self, bench, system):
        self.bench = bench
        self.system = system
        self.parts = bench.parts[system.model]
        if system.kind == "handbatched":
            self.hand = handbatched.HandBatchedTreeLSTM(bench.encoder.cell,
                                                        bench.ctx)
        elif system.kind != "eager":
            self.encoder = bench.encoder_for(system)

    def encode(self, trees):
        """Root hidden states (B, H) and a dict of the encoder's figures."""
        bench, kind = self.bench, self.system.kind
        emb = bench.embeddings
        if kind == "handbatched":
            return self.hand(trees, emb), dict(self.hand.last)
        if kind == "eager":
            outs = [self.parts.encoder(t, emb) for t in trees]
            return nd.concat(*[h for h, _ in outs], dim=0), {}
        with gdb.batching(**bench.scope_kwargs(self.system)) as scope:
            outs = [self.encoder(t, emb) for t in trees]
        return nd.concat(*[h for h, _ in outs], dim=0), scope.stats.as_dict()

    def step(self, pairs, sync=True):
        """One full training step; return its figures (ms and counters).

        With ``sync=False`` the step neither waits for earlier work nor for
        its own (MXNet runs it asynchronously), and its figures mean little:
        see :func:`run_back_to_back`.
        """
        bench = self.bench
        trees = batch_trees(pairs)
        targets = sick_model.batch_targets(pairs, ctx=bench.ctx)
        n = len(pairs)
        if sync:
            nd.waitall()
        gc_before = GC_TIMER.total
        start = time.perf_counter()
        with autograd.record():
            roots, figures = self.encode(trees)
            log_probs = self.parts.head(
                nd.slice_axis(roots, axis=0, begin=0, end=n),
                nd.slice_axis(roots, axis=0, begin=n, end=2 * n))
            loss = bench.loss_fn(log_probs, targets)
        loss.backward()
        self.parts.trainer.step(n)
        if sync:
            nd.waitall()
        total = 1000.0 * (time.perf_counter() - start)
        figures["gc_ms"] = 1000.0 * (GC_TIMER.total - gc_before)
        return _batch_record(total, len(trees), figures)


def _batch_record(total_ms, num_trees, figures):
    """Per-batch figures: total, time split, counters (0 when absent).

    ``launch_ms`` is ``execute_ms`` less ``compile_ms``; ``gc_ms`` the time
    in Python's cyclic garbage collector during the step; ``other_ms`` what
    none of these cover (engine work, head, backward, update).
    """
    rec = {"total_ms": total_ms, "trees": num_trees}
    for name in STATS_FIELDS + COUNT_FIELDS + ("gc_ms",):
        rec[name] = figures.get(name, 0) or 0
    rec["planners"] = dict(figures.get("planners") or {})
    rec["launch_ms"] = rec["execute_ms"] - rec["compile_ms"]
    rec["other_ms"] = total_ms - rec["record_ms"] - rec["plan_ms"] \
        - rec["execute_ms"] - rec["gc_ms"]
    return rec


# --------------------------------------------------------------------------
# Running and summarising
# --------------------------------------------------------------------------

def run_batches(runner, batches, label):
    """Training steps over ``batches`` with a progress bar; list of records."""
    return [runner.step(pairs)
            for pairs in tqdm(batches, desc=label, leave=False, unit="batch",
                              disable=None)]


def run_back_to_back(runner, batches):
    """Milliseconds of ``batches`` run back to back, waiting only at the end.

    This is how a training loop runs: MXNet computes a step's backward and
    update while Python already prepares (records, plans) the next one, so
    the two cores overlap.  The per-step figures wait for every step instead.
    """
    nd.waitall()
    start = time.perf_counter()
    for pairs in batches:
        runner.step(pairs, sync=False)
    nd.waitall()
    return 1000.0 * (time.perf_counter() - start)


def unavailable_row(system, note):
    """Summary row of a system that could not run."""
    return {"system": system.name, "model": system.model, "kind": system.kind,
            "strategy": system.strategy, "budget": system.budget,
            "available": False, "note": note}


def _hit_rate(hits, misses):
    """Hits per lookup, None without lookups."""
    return hits / (hits + misses) if hits + misses else None


def summarize(system, records, again=None, back_to_back_ms=None):
    """Summary row of one system.

    Parameters
    ----------
    system : System
    records : list of dict
        Per-batch figures of the timed batches, each new to the system.
    again : list of dict, optional
        The same batches timed a second time (seen before: plans cached).
    back_to_back_ms : float, optional
        Mean ms per batch of further new batches run back to back
        (:func:`run_back_to_back`).

    Returns
    -------
    dict
        Median total and trees/s, mean time split, summed counters.
    """
    row = {"system": system.name, "model": system.model, "kind": system.kind,
           "strategy": system.strategy, "budget": system.budget,
           "available": True, "note": "", "batches": len(records)}
    row["total_ms"] = statistics.median(r["total_ms"] for r in records)
    row["mean_total_ms"] = statistics.mean(r["total_ms"] for r in records)
    for name in SPLIT_FIELDS:
        row[name] = statistics.mean(r[name] for r in records)
    for name in COUNT_FIELDS:
        row[name] = sum(r[name] for r in records)
    row["steps_per_batch"] = row["steps"] / len(records)
    row["planners"] = _planners(records)
    row["mean_batch_size"] = (row["planned_nodes"] / row["steps"]
                              if row["steps"] else None)
    trees = statistics.mean(r["trees"] for r in records)
    row["trees_per_s"] = 1000.0 * trees / row["total_ms"]
    row["hit_rate"] = _hit_rate(row["cache_hits"], row["cache_misses"])
    if back_to_back_ms is not None:
        row["back_to_back_ms"] = back_to_back_ms
        row["trees_per_s_b2b"] = 1000.0 * trees / back_to_back_ms
    if again:
        row["again_ms"] = statistics.median(r["total_ms"] for r in again)
        row["trees_per_s_again"] = 1000.0 * trees / row["again_ms"]
        row["hit_rate_again"] = _hit_rate(
            sum(r["cache_hits"] for r in again),
            sum(r["cache_misses"] for r in again))
    return row


def _planners(records):
    """Which planners' plans ran, with counts of flushes: "agenda 7, depth 3"."""
    counts = {}
    for record in records:
        for name, count in record.get("planners", {}).items():
            counts[name] = counts.get(name, 0) + count
    return ", ".join("%s %d" % item for item in sorted(counts.items())) or None


def system_batches(system, args, batches):
    """(warm-up, timed, back-to-back) batches of a system.

    Every system warms up on the same ``--warmup`` first batches.  The timed
    batches follow them and the back-to-back ones follow the timed ones, so
    both are new to the system when they run.
    """
    timed = args.eager_batches if system.kind == "eager" else args.batches
    start = args.warmup
    b2b = 0 if args.no_back_to_back else timed
    return (batches[:start], batches[start:start + timed],
            batches[start + timed:start + timed + b2b])


class Timed:
    """One system in the interleaved timing: its runner, batches and records.

    Parameters
    ----------
    system : System
    runner : Runner
    timed : list
        Its timed batches (the same ones for every system, eager included,
        unless ``--eager-batches`` says otherwise).
    fresh : list, optional
        Further batches, new to it, for the back-to-back pass.

    Attributes
    ----------
    records, again : list of dict
        Per-batch figures of the timed batches, first seen and seen again.
    b2b : list of tuple
        ``(ms, batches)`` of each back-to-back block.
    failure : str or None
    """

    def __init__(self, system, runner, timed, fresh=()):
        self.system = system
        self.runner = runner
        self.timed = timed
        self.fresh = list(fresh)
        self.records, self.again, self.b2b = [], [], []
        self.failure = None


def _unavailable(bench, system):
    """Why ``system`` cannot run with this gluon_dynbatch, or None."""
    if system.kind in ("compiled", "step") and not bench.features["compiled"]:
        return "unavailable: compiled=True not supported by gluon_dynbatch"
    if system.budget is not None and not bench.features["budget_via"]:
        return "unavailable: analysis_budget not supported"
    return None


def _failed(system, err):
    LOG.error("%s failed: %s: %s", system.name, type(err).__name__, err)
    LOG.debug("traceback", exc_info=True)
    return "failed: %s: %s" % (type(err).__name__, err)


def prepare_system(bench, system, args, batches):
    """A warmed-up :class:`Timed` for ``system``, or its unavailable row."""
    why = _unavailable(bench, system)
    if why:
        return unavailable_row(system, why)
    clear_engine_caches()
    gc.collect()
    warm, timed, fresh = system_batches(system, args, batches)
    try:
        runner = Runner(bench, system)
        run_batches(runner, warm, system.name + " (warm-up)")
    except Exception as err:  # pylint: disable=broad-except
        return unavailable_row(system, _failed(system, err))
    return Timed(system, runner, timed, fresh)


def _pass_new(entry, batches):
    for pairs in batches:
        entry.records.append(entry.runner.step(pairs))


def _pass_again(entry, batches):
    for pairs in batches:
        entry.again.append(entry.runner.step(pairs))


def _pass_b2b(entry, batches):
    entry.b2b.append((run_back_to_back(entry.runner, batches), len(batches)))


PASSES = {"new": ("timed", _pass_new), "again": ("timed", _pass_again),
          "b2b": ("fresh", _pass_b2b)}
"""Timing passes: the batches each runs (a :class:`Timed` attribute) and how."""


def time_interleaved(entries, block, kind="new"):
    """Time every system's batches in rounds, ``block`` batches per system each.

    Round ``r`` runs batches ``r*block`` to ``(r+1)*block - 1`` of every
    system, one system after another, the order rotating from round to round
    (``benchlib.interleaved``).  A drift of the machine's speed during the run
    so reaches every system alike, while each system still runs several steps
    in a row as a training loop does (alternating single steps would leave
    every step of a fast system with caches cold from the eager one).  A
    garbage collection precedes each block, so no system pays for another's
    garbage.  A system that fails stops there; the others go on.

    Parameters
    ----------
    entries : list of Timed
    block : int
    kind : {"new", "again", "b2b"}, optional
        The pass (:data:`PASSES`): the timed batches first seen, the same
        batches again, or the fresh batches back to back.
    """
    source, run = PASSES[kind]
    longest = max((len(getattr(e, source)) for e in entries), default=0)
    order = list(benchlib.interleaved(entries, math.ceil(longest / block)))
    for r, entry in tqdm(order, desc="rounds (%s)" % kind, leave=False, unit="block",
                         disable=None):
        batches = getattr(entry, source)[r * block:(r + 1) * block]
        if entry.failure is not None or not batches:
            continue
        gc.collect()
        try:
            run(entry, batches)
        except Exception as err:  # pylint: disable=broad-except
            entry.failure = _failed(entry.system, err)


def time_all_passes(entries, args):
    """The timed pass, then the second and back-to-back ones, each interleaved."""
    time_interleaved(entries, args.round_batches, "new")
    if not args.no_second_pass:
        caching = [e for e in entries if e.system.kind in CACHING_KINDS]
        time_interleaved(caching, args.round_batches, "again")
    if not args.no_back_to_back:
        time_interleaved(entries, args.round_batches, "b2b")


def finish_system(entry):
    """The summary row of one timed system, and its per-batch records."""
    system = entry.system
    if entry.failure is not None:
        return unavailable_row(system, entry.failure), []
    b2b = None
    if entry.b2b:
        b2b = sum(ms for ms, _ in entry.b2b) / sum(n for _, n in entry.b2b)
    row = summarize(system, entry.records, entry.again or None, b2b)
    LOG.info("%-24s %7.1f ms/batch %7.1f trees/s%s", system.name,
             row["total_ms"], row["trees_per_s"],
             "" if not entry.again else ", again %.1f trees/s"
             % row["trees_per_s_again"])
    return row, {"new": entry.records, "again": entry.again or None}


def add_ratios(rows):
    """Add speed ratios to eager and to hand-batched (speed / reference),
    per step (``vs_*``) and back to back (``vs_*_b2b``).

    ``vs_eager`` compares a row with the eager row of its own model;
    ``vs_hand`` with the one hand-batched row, whatever the model (all
    compute the same function).
    """
    for rate, suffix in (("trees_per_s", ""), ("trees_per_s_b2b", "_b2b")):
        eager, hand = {}, None
        for r in rows:
            if r["available"] and r.get(rate):
                if r["kind"] == "eager":
                    eager[r.get("model", "cell")] = r[rate]
                elif r["kind"] == "handbatched":
                    hand = r[rate]
        for row in rows:
            ok = row["available"] and row.get(rate)
            ref = eager.get(row.get("model", "cell")) if ok else None
            row["vs_eager" + suffix] = row[rate] / ref if ref else None
            row["vs_hand" + suffix] = row[rate] / hand if ok and hand else None
    return rows


# --------------------------------------------------------------------------
# Epoch check
# --------------------------------------------------------------------------

def epoch_row(system, records):
    """The epoch check's row of one system from its per-batch records.

    The row holds the cache hit rate over the batches after the first
    ``EPOCH_SKIP`` and the share of analysis+compile (and of garbage
    collection) in the total time.
    """
    later = records[EPOCH_SKIP:]
    hits = sum(r["cache_hits"] for r in later)
    misses = sum(r["cache_misses"] for r in later)
    total = sum(r["total_ms"] for r in records)
    overhead = sum(r["plan_ms"] + r["compile_ms"] for r in records)
    return {
        "system": system.name, "model": system.model, "kind": system.kind,
        "strategy": system.strategy, "budget": system.budget, "batches": len(records),
        "trees_per_s": 1000.0 * sum(r["trees"] for r in records) / total,
        "total_s": total / 1000.0,
        "hits_after_skip": hits, "misses_after_skip": misses,
        "hit_rate_after_skip": hits / (hits + misses) if hits + misses else None,
        "batches_with_miss_after_skip": sum(1 for r in later
                                            if r["cache_misses"]),
        "analysis_ms": sum(r["plan_ms"] for r in records),
        "compile_ms": sum(r["compile_ms"] for r in records),
        "analysis_compile_share": overhead / total,
        "gc_share": sum(r["gc_ms"] for r in records) / total,
        "evictions": sum(r["evictions"] for r in records),
        "planners": _planners(records),
    }


def epoch_systems(bench, selected):
    """The systems of the epoch check: the compiled default config, compiled
    per step, (with the budget sweep) ``analysis_budget="auto"``, per model
    of ``selected``, and hand-batched when selected."""
    systems = []
    if bench.features["compiled"]:
        systems.append(System("compiled (default)", "compiled", None, None))
        systems.append(System("step-compiled depth", "step", "depth", None))
        if any(s.budget is not None for s in selected):
            systems.append(System("compiled budget=auto", "compiled", None, "auto"))
    else:
        LOG.warning("epoch check of compiled execution skipped: unavailable")
    models = [m for m in ("cell", "opbyop")
              if any(s.model == m for s in selected)] or ["cell"]
    systems = for_models(systems, models)
    if any(s.kind == "handbatched" for s in selected):
        systems.append(System("handbatched", "handbatched", None, None))
    return systems


def run_epoch_checks(bench, selected, batches, block):
    """Train the epoch's ``batches`` with every epoch-check system, interleaved.

    Each system starts with empty caches; the systems take turns in rotating
    rounds of ``block`` batches (:func:`time_interleaved`).

    Returns
    -------
    rows : list of dict
    raw : dict
        System name -> per-batch records.
    """
    clear_engine_caches()
    gc.collect()
    entries = [Timed(system, Runner(bench, system), batches)
               for system in epoch_systems(bench, selected)]
    time_interleaved(entries, block, "new")
    rows, raw = [], {}
    for entry in entries:
        if entry.failure is not None:
            continue
        row = epoch_row(entry.system, entry.records)
        raw[entry.system.name] = entry.records
        rows.append(row)
        LOG.info("epoch %-20s %6.1f trees/s, hit rate after %d batches %s, "
                 "analysis+compile %.1f%%, gc %.1f%%", row["system"],
                 row["trees_per_s"], EPOCH_SKIP,
                 _fmt_rate(row["hit_rate_after_skip"]),
                 100.0 * row["analysis_compile_share"],
                 100.0 * row["gc_share"])
    return rows, raw


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

TABLE_COLUMNS = (
    ("system", "system", "%s"),
    ("model", "model", "%s"),
    ("trees_per_s", "trees/s", "%.1f"),
    ("total_ms", "ms/batch", "%.1f"),
    ("mean_total_ms", "mean ms", "%.1f"),
    ("vs_eager", "x eager", "%.1f"),
    ("vs_hand", "x hand", "%.2f"),
    ("record_ms", "record", "%.1f"),
    ("plan_ms", "plan", "%.1f"),
    ("compile_ms", "compile", "%.1f"),
    ("launch_ms", "launch", "%.1f"),
    ("gc_ms", "gc", "%.1f"),
    ("other_ms", "other", "%.1f"),
    ("steps_per_batch", "steps", "%.1f"),
    ("mean_batch_size", "mean batch", "%.1f"),
    ("hit_rate", "hits", "%s"),
    ("planners", "planner", "%s"),
    ("trees_per_s_again", "trees/s again", "%.1f"),
    ("trees_per_s_b2b", "trees/s b2b", "%.1f"),
    ("vs_eager_b2b", "x eager b2b", "%.1f"),
    ("vs_hand_b2b", "x hand b2b", "%.2f"),
)


def _fmt_rate(rate):
    return "-" if rate is None else "%.0f%%" % (100.0 * rate)


def _cell(row, key, fmt):
    """Format one table cell; '-' for missing values."""
    if not row.get("available", True) and key not in ("system", "model"):
        return "-"
    value = row.get(key)
    if key == "hit_rate":
        looked_up = row.get("cache_hits", 0) + row.get("cache_misses", 0)
        return "%s (%d/%d)" % (_fmt_rate(value), row.get("cache_hits", 0),
                               looked_up) if looked_up else "-"
    return "-" if value is None else fmt % value


def table_lines(rows):
    """The results table as aligned plain-text lines."""
    cells = [[title for _, title, _ in TABLE_COLUMNS]]
    cells += [[_cell(r, k, f) for k, _, f in TABLE_COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(line, widths)))
             for line in cells]
    lines.insert(1, "-" * len(lines[0]))
    notes = ["%s: %s" % (r["system"], r["note"]) for r in rows if r["note"]]
    return lines + notes


def write_csv(path, rows):
    """Write dict rows as CSV with the union of their keys as columns."""
    columns = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def write_markdown(path, context, rows, epoch_rows, plot_name):
    """Write the report: set-up, results table, epoch check, notes."""
    lines = ["# Tree-LSTM training-step benchmark", "",
             "SICK train, Child-Sum Tree-LSTM D=%d H=%d, %d pairs (%d trees) "
             "per batch, forward + backward + AdaGrad step. %s."
             % (INPUT_SIZE, HIDDEN_SIZE, PAIRS_PER_BATCH, 2 * PAIRS_PER_BATCH,
                context["setup"]), ""]
    header = [t for _, t, _ in TABLE_COLUMNS]
    body = [[_cell(r, k, f) for k, _, f in TABLE_COLUMNS] for r in rows]
    lines += benchlib.markdown_table(header, body) + [""]
    lines += [
        "`trees/s` and `ms/batch`: median over the timed batches, each seen "
        "for the first time by that system; `mean ms` is the mean, which "
        "keeps the rare long pauses (garbage collection) that the median "
        "hides. `model`: `cell` is the encoder whose node update is one "
        "cell-block call, `opbyop` the same function written operator by "
        "operator (Dense children, `F.split`, a Python loop over the "
        "children); it starts from the cell model's weights and trains its "
        "own copy. `x eager` and `x hand` are throughput ratios (above 1 = "
        "faster than the reference): `x eager` against the eager run of the "
        "same model, timed on the same batches, `x hand` against the one "
        "hand-batched row. `steps` (per batch) and `mean batch` (operator "
        "nodes per step) come from `scope.stats`. The time split is in mean ms per batch "
        "(means, so that it adds up to `mean ms`): `record`, `plan` "
        "(analysis), `compile` and `launch` (execute less compile: launching "
        "MXNet work) come from `scope.stats`; for hand-batched they are index "
        "building (`plan`), building and first call of a new CachedOp "
        "(`compile`) and the call of a cached one (`launch`). `gc` is time in "
        "Python's cyclic garbage collector during the step (`gc.callbacks`). "
        "`other` is the rest of the step: the engine finishing the forward, "
        "the head and loss, backward and `Trainer.step`. `hits`: plan-cache "
        "hit rate over the timed batches. `trees/s again`: the same batches "
        "timed a second time (batches seen before, their plans cached, as in "
        "later epochs). `b2b` (back to back): the batches that follow the "
        "timed ones, new to the system, run as a training loop runs them, "
        "without waiting for each step to finish (one `waitall` per round), "
        "so that MXNet computes a step's backward and update while Python "
        "prepares the next; its ratios compare every system run that way.",
        ""]
    lines += _epoch_markdown(epoch_rows)
    if plot_name:
        lines += ["## Analysis budget trade-off", "",
                  "![budget trade-off](%s)" % plot_name, ""]
    notes = context["notes"] + ["%s: %s" % (r["system"], r["note"])
                                for r in rows if r["note"]]
    if notes:
        lines += ["## Notes", ""] + ["- " + n for n in notes] + [""]
    Path(path).write_text("\n".join(lines), encoding="utf-8")


def _epoch_markdown(epoch_rows):
    """Markdown section of the epoch check (empty when it did not run)."""
    if not epoch_rows:
        return []
    header = ["system", "batches", "trees/s", "hit rate after %d" % EPOCH_SKIP,
              "batches with a miss after %d" % EPOCH_SKIP,
              "analysis+compile share", "gc share", "evictions"]
    body = [[r["system"], str(r["batches"]), "%.1f" % r["trees_per_s"],
             _fmt_rate(r["hit_rate_after_skip"]),
             str(r["batches_with_miss_after_skip"]),
             "%.1f%%" % (100.0 * r["analysis_compile_share"]),
             "%.1f%%" % (100.0 * r["gc_share"]),
             str(r["evictions"])] for r in epoch_rows]
    return (["## One epoch of SICK train", ""] + benchlib.markdown_table(header, body)
            + [""])


def _sweeps(rows):
    """Budget-sweep rows per model: {model: [row, ...]} with two rows or more."""
    found = {}
    for row in rows:
        if row["available"] and row["budget"] is not None:
            found.setdefault(row.get("model", "cell"), []).append(row)
    return {model: sweep for model, sweep in found.items() if len(sweep) >= 2}


def _plot_sweep(ax, model, sweep):
    """One model's panel: ms per batch by phase, and steps on a second axis."""
    xs = range(len(sweep))
    series = {
        "total": [r["mean_total_ms"] for r in sweep],
        "execution (launch + rest of the step)": [
            r["launch_ms"] + r["other_ms"] for r in sweep],
        "recording": [r["record_ms"] for r in sweep],
        "compile": [r["compile_ms"] for r in sweep],
        "analysis (plan)": [r["plan_ms"] for r in sweep],
    }
    for name, values in series.items():
        ax.plot(xs, values, marker="o", label=name)
    steps = ax.twinx()
    steps.plot(xs, [r["steps_per_batch"] for r in sweep], "k--", marker="s",
               label="steps per batch (right)")
    steps.set_ylim(bottom=0)
    steps.set_ylabel("steps per batch")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([str(r["budget"]) for r in sweep])
    ax.set_xlabel("analysis_budget (s)")
    ax.set_ylabel("ms per batch (mean)")
    ax.set_ylim(bottom=0)
    ax.set_title("%s model" % model)
    ax.grid(alpha=0.3)
    return steps


def plot_budget(path, rows):
    """Plot, per model, time per batch by phase and steps against the budget.

    Returns
    -------
    bool
        False when no model's sweep has two budgets or more.
    """
    sweeps = _sweeps(rows)
    if not sweeps:
        return False
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps) + 2.6, 4.2),
                             squeeze=False)
    for ax, (model, sweep) in zip(axes[0], sorted(sweeps.items())):
        steps = _plot_sweep(ax, model, sweep)
    handles = ax.get_legend_handles_labels()
    more = steps.get_legend_handles_labels()
    fig.legend(handles[0] + more[0], handles[1] + more[1], loc="center right",
               fontsize="small")
    fig.suptitle("gluon_dynbatch, compiled=True: SICK training step against the analysis budget")
    fig.tight_layout(rect=(0, 0, 1.0 - 2.6 / (5.2 * len(sweeps) + 2.6), 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(out_dir, context, rows, epoch_rows, raw):
    """Write CSV, Markdown, JSON and the plot into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "benchmark.csv", rows)
    if epoch_rows:
        write_csv(out_dir / "epoch_check.csv", epoch_rows)
    plot_name = "budget_tradeoff.png"
    if not plot_budget(out_dir / plot_name, rows):
        plot_name = None
    write_markdown(out_dir / "benchmark.md", context, rows, epoch_rows,
                   plot_name)
    with open(out_dir / "benchmark.json", "w", encoding="utf-8") as handle:
        json.dump({"context": context, "systems": rows, "epoch": epoch_rows,
                   "per_batch": raw}, handle, indent=1)
    LOG.info("wrote %s", ", ".join(sorted(p.name for p in out_dir.iterdir())))


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def seed_everything(seed):
    """Seed Python's, numpy's and MXNet's generators."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


def describe_setup(args, features):
    """Context of the run for the report."""
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    setup = ("models: %s; %s batches timed per system (eager %d) after the "
             "same %d warm-up batches for every system, each new to the system, "
             "the systems taking turns in rounds of %d batches; "
             "OMP_NUM_THREADS=%s, %d CPUs, mxnet %s, "
             "Python %s" % (args.model, args.batches, args.eager_batches,
                            args.warmup, args.round_batches, threads,
                            os.cpu_count(), mx.__version__,
                            platform.python_version()))
    return {"setup": setup, "notes": list(features["notes"]),
            "args": vars(args), "features": {k: v for k, v in features.items()
                                             if k != "notes"},
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def check_args(args, num_batches):
    """Exit with a message when the batch counts do not fit SICK train."""
    if args.eager_batches is None:
        args.eager_batches = args.batches
    for name in ("batches", "warmup", "eager_batches"):
        if getattr(args, name) < 0:
            sys.exit("--%s must be >= 0" % name.replace("_", "-"))
    if args.batches < 1 or args.eager_batches < 1 or args.round_batches < 1:
        sys.exit("--batches, --eager-batches and --round-batches must be at least 1")
    passes = 1 if args.no_back_to_back else 2
    if args.warmup + passes * max(args.batches, args.eager_batches) > num_batches:
        sys.exit("--warmup + --batches (twice with the back-to-back pass) exceed "
                 "the %d batches of SICK train" % num_batches)


def run_all(args, selected, batches, bench):
    """Run the selected systems and the epoch check.

    Returns
    -------
    rows : list of dict
        One summary row per system, with ratios.
    epoch_rows : list of dict
    raw : dict
        Per-batch records by system name (and ``"epoch"``).
    """
    prepared = [prepare_system(bench, system, args, batches) for system in selected]
    time_all_passes([p for p in prepared if isinstance(p, Timed)], args)
    rows, raw = [], {}
    for system, entry in zip(selected, prepared):
        if isinstance(entry, Timed):
            row, raw[system.name] = finish_system(entry)
        else:
            row, raw[system.name] = entry, []
        rows.append(row)
    add_ratios(rows)
    epoch_rows = []
    if args.epoch_check:
        epoch_rows, raw["epoch"] = run_epoch_checks(
            bench, selected, batches[:args.epoch_batches], args.round_batches)
    return rows, epoch_rows, raw


def parse_args(argv):
    """Parse the command line and apply ``--quick``."""
    args = build_parser().parse_args(argv)
    args.quick_settings = benchlib.apply_quick(args, QUICK)
    return args


def settings_of(args, features):
    """The run's settings, for the record."""
    keep = ("systems", "model", "batches", "eager_batches", "warmup", "round_batches",
            "budgets", "no_back_to_back", "no_second_pass", "epoch_check",
            "epoch_batches", "seed", "threads", "engine_threads")
    settings = {key: getattr(args, key) for key in keep}
    settings["quick"] = args.quick_settings
    settings.update(pairs_per_batch=PAIRS_PER_BATCH, input_size=INPUT_SIZE,
                    hidden_size=HIDDEN_SIZE, features={
                        k: v for k, v in features.items() if k != "notes"})
    return settings


def main(argv=None):
    """Run the benchmark; return the summary rows."""
    argv = benchlib.script_argv(argv)
    args = parse_args(argv)
    setup_logging(args.verbose)
    set_threads(args.threads, args.engine_threads)
    import_runtime()
    budgets = [parse_budget(b) for b in args.budgets.split(",") if b.strip()]
    selected = select_systems(args.systems, budgets, args.model)
    batches, vocab_size = load_batches(resolve_data_dir(args.data_dir),
                                       args.seed)
    check_args(args, len(batches))
    features = detect_features()
    for note in features["notes"]:
        LOG.warning(note)
    seed_everything(args.seed)
    record = benchlib.start_record("sick_training", SCRIPT, argv, {})
    GC_TIMER.install()
    try:
        models = sorted({s.model for s in selected})
        rows, epoch_rows, raw = run_all(args, selected, batches,
                                        Bench(vocab_size, features, models))
    finally:
        GC_TIMER.uninstall()
    context = describe_setup(args, features)
    print("\n".join(table_lines(rows)))
    write_outputs(Path(args.out_dir), context, rows, epoch_rows, raw)
    record["settings"] = settings_of(args, features)
    benchlib.save_if_asked(args, "sick_training", SCRIPT, argv, record["settings"],
                           {"systems": rows, "epoch": epoch_rows},
                           notes=context["notes"], record=record)
    return rows


if __name__ == "__main__":
    main()
