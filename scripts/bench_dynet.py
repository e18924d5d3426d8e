#!/usr/bin/env python
"""gluon_dynbatch against eager Gluon and DyNet, in one run on one machine.

Workloads, each with a gluon_dynbatch model written one sample at a time:

``treelstm``
    DyNet's Tree-LSTM benchmark: the binary Tree-LSTM of
    ``examples/sst_model.py`` on SST train trees, 50 trees per batch, a loss
    on every node, Adam; one run per ``--dims`` pair (default 128/128 and
    256/256). DyNet side: ``scripts/dynet_treelstm.py``'s model.
``tagger``
    A BiLSTM tagger (``examples/bilstm_tagger.py``) over SST sentences, a
    tag per token (the sentiment label of its pre-terminal), 64 sentences per
    batch, E/H 128/128, Adam. DyNet side: ``VanillaLSTMBuilder`` x 2.
``sick``
    The SICK Child-Sum Tree-LSTM (``examples/sick_model.py``, D=300, H=150,
    25 pairs = 50 trees per batch, similarity head, KL loss, AdaGrad); Gluon
    only.
``batchsize``
    Throughput of the ``treelstm`` workload at 128/128 against the number of
    trees per batch (``--sizes``), gluon_dynbatch against DyNet autobatching.

Systems: eager Gluon (one sample, one operator at a time; few batches);
gluon_dynbatch with default settings (strategy "depth", imperative) and with
every ``--configs`` setting, the best of which is reported; DyNet without and
with autobatching. Training is forward, backward and the optimiser update;
inference is the forward pass computing the same summed loss. Every system
starts from the same weights and sees the same batches in the same order, so
losses must agree across systems (checked and reported).

Each measurement runs in its own subprocess: the Gluon side with the thread
settings of ``--threads`` set before mxnet is imported, and one process per
DyNet setting (``dynet_config`` must come before ``import dynet``). Numbers
are medians over batches of sentences per second, every timer stopped after
``mx.nd.waitall()``. Results go to ``--out-dir`` as CSV, Markdown, JSON and a
PNG plot of the batch-size sweep.

Run from the repository root::

    .venv/bin/python scripts/bench_dynet.py                  # everything
    .venv/bin/python scripts/bench_dynet.py --threads 1
    .venv/bin/python scripts/bench_dynet.py --quick --profile
"""
import argparse
import csv
import importlib.util
import json
import logging
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from examples.progress_logging import setup_logging  # noqa: E402

LOG = logging.getLogger("bench_dynet")

WORKLOADS = ("treelstm", "tagger", "sick", "batchsize")
MODES = ("train", "infer")
DEFAULT_CONFIG = "depth:imperative"
#: Pseudo-setting of the hand-batched MXNet Tree-LSTM (``handbatched_sst.py``).
HAND_CONFIG = "hand"
"""gluon_dynbatch's defaults: ``gdb.batching()`` with nothing changed."""
ALL_CONFIGS = ("depth:imperative", "agenda:imperative", "depth:step",
               "agenda:step", "depth:compiled", "agenda:compiled")
_COMPILED = {"imperative": False, "step": "step", "compiled": True}
TREE_BATCH = 50
TAGGER_BATCH = 64
TAGGER_DIMS = (128, 128)
SICK_PAIRS = 25
SICK_INPUT, SICK_HIDDEN = 300, 150
SICK_LR, SICK_WD = 0.05, 1e-4
SWEEP_DIMS = (128, 128)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "MXNET_CPU_WORKER_NTHREADS")
STAT_MS = ("record_ms", "plan_ms", "execute_ms", "compile_ms")
STAT_COUNTS = ("nodes", "steps", "planned_nodes", "cache_hits",
               "cache_misses")
DYNET_MISSING = 3
"""Exit status of a DyNet worker that cannot import dynet."""
DYNET_SKIP = "skipped: dynet38 not installed (pip install dynet38)"


# --------------------------------------------------------------------------
# Helpers shared by every process (no mxnet, no dynet)
# --------------------------------------------------------------------------

def parse_config(text):
    """Turn ``"strategy:mode"`` into arguments of ``gdb.batching``.

    Parameters
    ----------
    text : str
        ``depth`` or ``agenda``, a colon, then ``imperative``, ``step`` or
        ``compiled``.

    Returns
    -------
    dict
        ``strategy`` and ``compiled``.

    Raises
    ------
    ValueError
        On an unknown strategy or mode.
    """
    strategy, _, mode = text.strip().partition(":")
    mode = mode or "imperative"
    if strategy not in ("depth", "agenda") or mode not in _COMPILED:
        raise ValueError("bad gluon_dynbatch setting %r: expected "
                         "depth|agenda:imperative|step|compiled" % text)
    return {"strategy": strategy, "compiled": _COMPILED[mode]}


def load_sst_trees(data_dir, max_trees=None):
    """SST train trees with word ids, and the vocabulary built from them.

    Parameters
    ----------
    data_dir : str
        Folder with ``train.txt``.
    max_trees : int, optional
        Read only the first ``max_trees`` trees (quick runs).

    Returns
    -------
    trees : list of SSTTree
    vocab : dict
    """
    from examples.sst_data import (  # pylint: disable=import-outside-toplevel
        assign_ids, build_vocab, load_sst, parse_sst_line)
    if max_trees is None:
        trees = load_sst(data_dir, "train")
    else:
        path = os.path.join(data_dir, "train.txt")
        trees = []
        with open(path, encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, start=1):
                if len(trees) >= max_trees:
                    break
                if line.strip():
                    trees.append(parse_sst_line(line, "%s:%d"
                                                % (path, lineno)))
    vocab = build_vocab(trees)
    return assign_ids(trees, vocab), vocab


def tagged_sentences(trees):
    """Sentences for the tagger: word ids and a tag per token.

    Parameters
    ----------
    trees : list of SSTTree
        Trees with word ids.

    Returns
    -------
    list of tuple
        Per tree ``(word_ids, tags)``, two tuples of ints, left to right;
        a token's tag is the sentiment label of its pre-terminal.
    """
    out = []
    for tree in trees:
        leaves = [n for n in tree.postorder() if n.is_preterminal]
        out.append((tuple(n.word_id for n in leaves),
                    tuple(n.label for n in leaves)))
    return out


def batch_stream(items, size, seed):
    """Endless stream of batches of ``items``, reshuffled on every pass.

    Both sides of a comparison call this with the same seed and so see the
    same batches in the same order.

    Parameters
    ----------
    items : list
    size : int
        Items per batch; a pass drops its incomplete tail (unless there are
        fewer than ``size`` items, then each batch is all of them).
    seed : int

    Yields
    ------
    list
    """
    if not items:
        raise ValueError("nothing to batch")
    rng = random.Random(seed)
    order = list(range(len(items)))
    while True:
        rng.shuffle(order)
        if len(order) < size:
            yield [items[i] for i in order]
            continue
        for start in range(0, len(order) - size + 1, size):
            yield [items[i] for i in order[start:start + size]]


def apply_threads(threads):
    """Pin this process to ``threads`` cores and set the thread variables.

    Must run before mxnet (or dynet) is imported. ``None`` leaves the
    machine defaults alone.

    Returns
    -------
    list of int
        The cores the process may run on.
    """
    if threads:
        for var in THREAD_VARS:
            os.environ[var] = str(threads)
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return []


def os_threads():
    """Number of OS threads of this process (Linux), else None."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def sweep_batches(batches, size, quick):
    """Timed batches at batch size ``size`` in the batch-size sweep.

    About as many sentences as ``batches`` batches of 50, at least 3 batches
    (2 when ``quick``) and at most ``4 * batches``.
    """
    low = 2 if quick else 3
    want = math.ceil(batches * TREE_BATCH / size)
    return max(low, min(want, 4 * max(batches, 1)))


def time_loop(step, stream, warmup, batches, sync, timeout, desc):
    """Run ``warmup`` untimed then ``batches`` timed steps.

    Parameters
    ----------
    step : callable
        ``step(batch) -> (loss, stats)``: one training or inference step;
        ``stats`` is a dict of gluon_dynbatch figures or None.
    stream : iterator of list
        Batches.
    warmup, batches : int
    sync : callable
        Waits for all pending computation (``mx.nd.waitall``).
    timeout : float
        Stop timing after this many seconds (at least one timed batch runs);
        the result is then flagged ``cut``.
    desc : str
        Progress-bar label.

    Returns
    -------
    dict
        ``batch_ms`` and ``sentences`` of the timed batches, ``losses`` of
        every batch (warm-up first), per-batch ``stats``, ``cut``.
    """
    out = {"batch_ms": [], "sentences": [], "losses": [], "stats": [],
           "cut": False}
    began = time.perf_counter()
    total = warmup + batches
    for k in tqdm(range(total), desc=desc, leave=False, unit="batch",
                  disable=None):
        batch = next(stream)
        sync()
        start = time.perf_counter()
        loss, stats = step(batch)
        sync()
        elapsed = time.perf_counter() - start
        out["losses"].append(loss)
        if k >= warmup:
            out["batch_ms"].append(1000.0 * elapsed)
            out["sentences"].append(len(batch))
            if stats is not None:
                out["stats"].append(stats)
            if time.perf_counter() - began > timeout and k + 1 < total:
                out["cut"] = True
                LOG.warning("%s: stopped after %d of %d timed batches "
                            "(--system-timeout %.0f s)", desc, k + 1 - warmup,
                            batches, timeout)
                break
    return out


def summarize(loop):
    """Medians of a :func:`time_loop` result.

    Returns
    -------
    dict
        ``sentences_per_s`` (median over batches of sentences/s),
        ``median_ms``, ``mean_sentences_per_s`` (all sentences over all
        time), ``batches``, ``cut``, ``losses`` and medians (ms) or sums
        (counts) of the gluon_dynbatch figures.
    """
    rates = [1000.0 * n / ms for n, ms in zip(loop["sentences"],
                                              loop["batch_ms"])]
    res = {"sentences_per_s": statistics.median(rates),
           "median_ms": statistics.median(loop["batch_ms"]),
           "mean_sentences_per_s": 1000.0 * sum(loop["sentences"])
           / sum(loop["batch_ms"]),
           "batches": len(rates), "cut": loop["cut"],
           "losses": loop["losses"]}
    if loop["stats"]:
        stats = {}
        for name in STAT_MS:
            stats[name] = statistics.median(s[name] for s in loop["stats"])
        for name in STAT_COUNTS:
            stats[name] = sum(s[name] for s in loop["stats"])
        stats["mean_batch_size"] = (stats["planned_nodes"] / stats["steps"]
                                    if stats["steps"] else 0.0)
        res["stats"] = stats
    return res


# --------------------------------------------------------------------------
# The Gluon worker
# --------------------------------------------------------------------------

def _gluon_imports():
    """Import mxnet, gluon_dynbatch and the example models (after threads)."""
    # pylint: disable=import-outside-toplevel
    import mxnet as mx
    import gluon_dynbatch as gdb
    from examples import bilstm_tagger, sick_data, sick_model, sst_model
    return mx, gdb, sst_model, bilstm_tagger, sick_data, sick_model


class GluonTask:
    """One workload on the Gluon side: data, model, trainer, steps.

    Subclasses set ``self.params`` (a ParameterDict of everything trained),
    ``self.items`` (what batches are drawn from), ``self.batch_size`` and
    implement :meth:`make_trainer`, :meth:`block_for` and :meth:`loss`.

    Parameters
    ----------
    mods : tuple
        From :func:`_gluon_imports`.
    job : dict
        The job description.
    """

    def __init__(self, mods, job):
        self.mx, self.gdb = mods[0], mods[1]
        self.mods = mods
        self.job = job
        self.seed = job["seed"]
        self.params = None
        self.initial = None
        self.trainer = None

    def remember_weights(self):
        """Keep the initial weights, restored by :meth:`reset`."""
        self.initial = {name: p.data().copy()
                        for name, p in self.params.items()}

    def reset(self):
        """Initial weights, zero gradients, a fresh optimiser, empty caches."""
        for name, param in self.params.items():
            param.set_data(self.initial[name])
        self.params.zero_grad()
        self.trainer = self.make_trainer()
        cache = getattr(getattr(self.gdb, "scope", None), "DEFAULT_CACHE",
                        None)
        if cache is not None and callable(getattr(cache, "clear", None)):
            cache.clear()

    def stream(self, size=None):
        """A fresh batch stream (the same one on every call)."""
        return batch_stream(self.items, size or self.batch_size, self.seed)

    def make_trainer(self):
        """A new gluon.Trainer over ``self.params``."""
        raise NotImplementedError

    def block_for(self, config):
        """The DynBatchBlock to call: the model's own for eager, a fresh one
        sharing the Parameters for a gluon_dynbatch setting (empty caches)."""
        raise NotImplementedError

    def loss(self, block, batch, config):
        """Forward: ``(loss NDArray, stats dict or None)``."""
        raise NotImplementedError

    def count(self, batch):
        """Sentences in ``batch``."""
        return len(batch)

    def scale(self, batch):
        """Argument of ``trainer.step``."""
        return 1

    def _scoped(self, block, args_list, config, extra):
        """Call ``block`` on every argument tuple, batched unless eager."""
        if config is None:
            return [block(*args, *extra) for args in args_list], None
        with self.gdb.batching(**parse_config(config)) as scope:
            outs = [block(*args, *extra) for args in args_list]
        return outs, scope.stats.as_dict()

    def stepper(self, config, train, block=None):
        """``step(batch) -> (loss float, stats)`` for :func:`time_loop`.

        ``block`` defaults to ``self.block_for(config)``.
        """
        mx = self.mx
        if block is None:
            block = self.block_for(config)

        def train_step(batch):
            with mx.autograd.record():
                loss, stats = self.loss(block, batch, config)
            loss.backward()
            self.trainer.step(self.scale(batch))
            return float(loss.sum().asscalar()), stats

        def infer_step(batch):
            loss, stats = self.loss(block, batch, config)
            return float(loss.sum().asscalar()), stats

        return train_step if train else infer_step


class TreeTask(GluonTask):
    """Workload 1: binary Tree-LSTM on SST (``examples/sst_model.py``)."""

    def __init__(self, mods, job):
        super().__init__(mods, job)
        self.sst = mods[2]
        trees, vocab = load_sst_trees(job["data_dir"], job.get("max_trees"))
        self.items, self.vocab = trees, vocab
        self.batch_size = job["batch_size"]
        self.model = self.sst.make_model(len(vocab), job["embed"],
                                         job["hidden"], seed=self.seed)
        self.params = self.model.collect_params()
        self.remember_weights()
        if job.get("weights_out"):
            self.sst.save_weights(self.model, job["weights_out"], vocab)

    def make_trainer(self):
        return self.mx.gluon.Trainer(self.params, "adam")

    def block_for(self, config):
        base = self.model.tree_lstm
        if config is None:
            return base
        block = self.sst.BinaryTreeLSTM(
            self.job["embed"], self.job["hidden"], prefix=base.prefix,
            params=base.collect_params())
        if block.out_weight is not base.out_weight:
            raise RuntimeError("fresh Tree-LSTM block does not share weights")
        return block

    def loss(self, block, batch, config):
        emb = self.model.embedding.data()
        if config == HAND_CONFIG:
            return block(batch, emb), None
        outs, stats = self._scoped(block, [(t,) for t in batch], config,
                                   (emb,))
        return self.sst.sst_loss(outs, batch), stats

    def hand_block(self):
        """The hand-batched model on this task's Parameters (MXNet's limit)."""
        import handbatched_sst  # pylint: disable=import-outside-toplevel
        return handbatched_sst.HandBatchedSST(
            self.model.tree_lstm, self.job["hidden"], 5, self.mx.cpu())


class TaggerTask(GluonTask):
    """Workload 2: BiLSTM tagger (``examples/bilstm_tagger.py``)."""

    def __init__(self, mods, job):
        super().__init__(mods, job)
        self.tag = mods[3]
        trees, vocab = load_sst_trees(job["data_dir"], job.get("max_trees"))
        self.items = tagged_sentences(trees)
        self.batch_size = job["batch_size"]
        self.model = self.tag.make_model(len(vocab), job["embed"],
                                         job["hidden"], seed=self.seed)
        self.params = self.model.collect_params()
        self.remember_weights()
        if job.get("weights_out"):
            weights = self.tag.dynet_weights(self.tag.get_weights(self.model))
            import numpy as np  # pylint: disable=import-outside-toplevel
            np.savez(job["weights_out"], **weights)

    def make_trainer(self):
        return self.mx.gluon.Trainer(self.params, "adam")

    def block_for(self, config):
        base = self.model.tagger
        if config is None:
            return base
        block = self.tag.BiLSTMTagger(self.job["embed"], self.job["hidden"],
                                      prefix=base.prefix,
                                      params=base.collect_params())
        if block.forward_cell.h_weight is not base.forward_cell.h_weight:
            raise RuntimeError("fresh tagger block does not share weights")
        return block

    def loss(self, block, batch, config):
        emb = self.model.embedding.data()
        outs, stats = self._scoped(block, [(ids,) for ids, _ in batch],
                                   config, (emb,))
        return self.tag.tagger_loss(outs, [tags for _, tags in batch]), stats


class SickTask(GluonTask):
    """Workload 3: SICK Child-Sum Tree-LSTM (``examples/sick_model.py``)."""

    def __init__(self, mods, job):
        super().__init__(mods, job)
        mx = self.mx
        self.data, self.model_mod = mods[4], mods[5]
        data_dir = job.get("data_dir") or self.data.default_data_dir()
        pairs = self.data.load_split(data_dir, "train")
        if job.get("max_trees"):
            pairs = pairs[:max(1, job["max_trees"] // 2)]
        vocab = {}
        for pair in pairs:
            for tokens, tree in ((pair.a_tokens, pair.a_tree),
                                 (pair.b_tokens, pair.b_tree)):
                ids = [vocab.setdefault(t.lower(), len(vocab))
                       for t in tokens]
                self.data.attach_words(tree, ids)
        self.items = pairs
        self.batch_size = job["batch_size"]
        mx.random.seed(self.seed)
        self.encoder = self.model_mod.ChildSumTreeLSTM(job["hidden"],
                                                       job["embed"])
        self.head = self.model_mod.SimilarityHead(job["hidden"])
        self.encoder.initialize(mx.init.Xavier())
        self.head.initialize(mx.init.Xavier())
        self.embeddings = mx.nd.random.uniform(
            -0.05, 0.05, shape=(len(vocab), job["embed"]))
        self.loss_fn = self.model_mod.make_loss()
        self.params = self.encoder.collect_params()
        self.params.update(self.head.collect_params())
        self.remember_weights()

    def make_trainer(self):
        return self.mx.gluon.Trainer(self.params, "adagrad", {
            "learning_rate": SICK_LR, "wd": SICK_WD})

    def block_for(self, config):
        if config is None:
            return self.encoder
        block = self.model_mod.ChildSumTreeLSTM(
            self.job["hidden"], self.job["embed"], prefix=self.encoder.prefix,
            params=self.encoder.collect_params())
        if block.cell.x_weight is not self.encoder.cell.x_weight:
            raise RuntimeError("fresh encoder does not share weights")
        return block

    def count(self, batch):
        return 2 * len(batch)

    def scale(self, batch):
        return len(batch)

    def loss(self, block, batch, config):
        nd = self.mx.nd
        trees = [p.a_tree for p in batch] + [p.b_tree for p in batch]
        outs, stats = self._scoped(block, [(t,) for t in trees], config,
                                   (self.embeddings,))
        roots = nd.concat(*[h for h, _ in outs], dim=0)
        n = len(batch)
        log_probs = self.head(nd.slice_axis(roots, axis=0, begin=0, end=n),
                              nd.slice_axis(roots, axis=0, begin=n,
                                            end=2 * n))
        targets = self.model_mod.batch_targets(batch)
        return self.loss_fn(log_probs, targets), stats


class _Counted:
    """Wraps a batch so that ``len()`` counts sentences, not pairs."""

    def __init__(self, task, batch):
        self.batch = batch
        self.n = task.count(batch)

    def __len__(self):
        return self.n


def _counted_stream(task, stream):
    """Batches wrapped in :class:`_Counted` (for SICK: 2 trees a pair)."""
    for batch in stream:
        yield _Counted(task, batch)


def run_system(task, config, job, mode, label, eager=False):
    """Time one system in one mode; return its summary.

    Parameters
    ----------
    task : GluonTask
    config : str or None
        gluon_dynbatch setting, None for eager.
    job : dict
    mode : {"train", "infer"}
    label : str
        Progress label.
    eager : bool
        Use the (smaller) eager batch counts.

    Returns
    -------
    dict
    """
    mx = task.mx
    task.reset()
    block = task.hand_block() if config == HAND_CONFIG else None
    step = task.stepper(config, mode == "train", block)
    warmup = job["eager_warmup"] if eager else job["warmup"]
    batches = job["eager_batches"] if eager else job["batches"]
    stream = _counted_stream(task, task.stream(job.get("size")))
    loop = time_loop(lambda b: step(b.batch), stream, warmup, batches,
                     mx.nd.waitall, job["system_timeout"], label)
    res = summarize(loop)
    res.update({"system": "eager" if config is None else
                "hand" if config == HAND_CONFIG else "gdb",
                "config": config or "", "mode": mode})
    LOG.info("%s %s: %.1f sentences/s (median %.1f ms per batch)", label,
             mode, res["sentences_per_s"], res["median_ms"])
    return res


def gluon_env(mx):
    """Thread settings and versions of this Gluon process."""
    env = {var: os.environ.get(var) for var in THREAD_VARS}
    env.update({"mxnet": mx.__version__, "cores": apply_threads(None),
                "os_threads": os_threads(), "cpu_count": os.cpu_count()})
    return env


def make_task(mods, job):
    """The :class:`GluonTask` of ``job["workload"]``."""
    kind = {"treelstm": TreeTask, "tagger": TaggerTask, "sick": SickTask,
            "batchsize": TreeTask, "profile": TreeTask}[job["workload"]]
    return kind(mods, job)


def gluon_systems(task, job):
    """Eager plus every gluon_dynbatch setting, both modes."""
    results = []
    name = job["name"]
    for mode in job["modes"]:
        if job["eager_batches"] > 0:
            results.append(run_system(task, None, job, mode,
                                      "%s eager" % name, eager=True))
        for config in job["configs"]:
            results.append(run_system(task, config, job, mode,
                                      "%s gdb %s" % (name, config)))
        if job.get("hand") and hasattr(task, "hand_block"):
            results.append(run_system(task, HAND_CONFIG, job, mode,
                                      "%s hand-batched" % name))
    return results


def gluon_sweep(task, job):
    """The batch-size sweep: every setting at every size, both modes."""
    results = []
    for size in job["sizes"]:
        sized = dict(job, size=size,
                     batches=sweep_batches(job["batches"], size,
                                           job.get("quick")))
        for mode in job["modes"]:
            for config in job["configs"]:
                res = run_system(task, config, sized, mode,
                                 "size %d gdb %s" % (size, config))
                res["size"] = size
                results.append(res)
    return results


def _profiler_rows(text, domain, top):
    """Rows of one domain of ``mx.profiler.dumps(format='json')``.

    Parameters
    ----------
    text : str
        The JSON dump of aggregate statistics.
    domain : str
        ``"operator"`` (operators as the engine ran them, backward ones
        included) or ``"MXNET_C_API"`` (calls from Python, waiting included).
    top : int
        How many rows, largest total time first.

    Returns
    -------
    list of dict
        ``op``, ``total_ms``, ``count``.
    """
    entries = json.loads(text).get("Time", {}).get(domain, {})
    rows = sorted(((stat.get("Total", 0.0), stat.get("Count", 0), name)
                   for name, stat in entries.items()), reverse=True)
    return [{"op": name, "total_ms": total, "count": count}
            for total, count, name in rows[:top]]


def profile_batch(task, config, job):
    """Where one training batch of gluon_dynbatch spends its time.

    Runs three warm-up batches, then one batch split by synchronisation
    points, one under ``mx.profiler`` (top operators) and one under cProfile
    (top Python functions).

    Returns
    -------
    dict
    """
    import cProfile  # pylint: disable=import-outside-toplevel
    import pstats  # pylint: disable=import-outside-toplevel
    import io  # pylint: disable=import-outside-toplevel
    mx = task.mx
    nd = mx.nd
    task.reset()
    block = task.block_for(config)
    stream = task.stream()
    step = task.stepper(config, True, block)
    for _ in range(3):
        step(next(stream))
    batch = next(stream)
    nd.waitall()
    marks = [("start", time.perf_counter())]
    with mx.autograd.record():
        emb = task.model.embedding.data()
        with task.gdb.batching(**parse_config(config)) as scope:
            outs = [block(t, emb) for t in batch]
        marks.append(("scope (record + plan + launch)", time.perf_counter()))
        loss = task.sst.sst_loss(outs, batch)
        marks.append(("loss graph", time.perf_counter()))
    nd.waitall()
    marks.append(("forward compute still queued at scope exit",
                  time.perf_counter()))
    loss.backward()
    nd.waitall()
    marks.append(("backward", time.perf_counter()))
    task.trainer.step(1)
    nd.waitall()
    marks.append(("trainer.step (Adam, dense embedding)",
                  time.perf_counter()))
    phases = [(name, 1000.0 * (t - marks[k][1]))
              for k, (name, t) in enumerate(marks[1:])]
    stats = scope.stats.as_dict()
    scope_ms = phases[0][1]
    inner = [("  record (forward code, recording)", stats["record_ms"]),
             ("  plan", stats["plan_ms"]),
             ("  execute (launch batched ops; incl. compile %.1f ms)"
              % stats["compile_ms"], stats["execute_ms"])]
    inner.append(("  rest of scope exit (liveness, pruning, release)",
                  scope_ms - sum(ms for _, ms in inner)))
    phases[1:1] = inner

    profile_file = os.path.join(tempfile.mkdtemp(prefix="gdb_prof_"),
                                "profile.json")
    mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                           filename=profile_file)
    operators, api = [], []
    for _ in range(3):      # the aggregate table now and then comes back empty
        mx.profiler.set_state("run")
        step(next(stream))
        nd.waitall()
        mx.profiler.set_state("stop")
        dump = mx.profiler.dumps(reset=True, format="json")
        operators = _profiler_rows(dump, "operator", job.get("top", 15))
        api = _profiler_rows(dump, "MXNET_C_API", 6)
        if operators:
            break
        LOG.debug("mx.profiler aggregate without operators: %s", dump[:300])

    profiler = cProfile.Profile()
    profiler.enable()
    step(next(stream))
    nd.waitall()
    profiler.disable()
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(
        job.get("top", 15))
    return {"config": config, "trees": len(batch),
            "tree_nodes": sum(len(t.postorder()) for t in batch),
            "phases": phases,
            "stats": stats, "operators": operators, "api": api,
            "python": "\n".join(_trim_pstats(buf.getvalue()))}


def _trim_pstats(text):
    """The table lines of a pstats report, paths shortened."""
    lines = text.strip().splitlines()
    for k, line in enumerate(lines):
        if line.strip().startswith("ncalls"):
            lines = lines[k:]
            break
    root = str(ROOT) + os.sep
    return [re.sub(r"\S*site-packages/", "", line.replace(root, ""))
            for line in lines]


def gluon_worker(job):
    """Run a Gluon job (in its own process); return the result dict."""
    if job.get("threads") and "mxnet" in sys.modules:
        LOG.warning("mxnet was imported before the thread settings")
    cores = apply_threads(job.get("threads"))
    mods = _gluon_imports()
    mx = mods[0]
    task = make_task(mods, job)
    result = {"job": job["name"], "side": "gluon"}
    if job["workload"] == "batchsize":
        result["systems"] = gluon_sweep(task, job)
    elif job["workload"] == "profile":
        result["profiles"] = [profile_batch(task, config, job)
                              for config in job["configs"]]
    else:
        result["systems"] = gluon_systems(task, job)
    result["env"] = gluon_env(mx)
    result["env"]["cores"] = cores
    return result


# --------------------------------------------------------------------------
# The DyNet worker
# --------------------------------------------------------------------------

class DyNetTagger:
    """The tagger of ``examples/bilstm_tagger.py`` in DyNet.

    Two ``VanillaLSTMBuilder`` s (gate order i, f, o, g; DyNet adds 1 to the
    forget gate, which ``bilstm_tagger.dynet_weights`` compensates), then an
    affine layer on the concatenated states of each token.

    Parameters
    ----------
    dy : module
        The imported ``dynet``.
    vocab_size, embed, hidden : int
    weights : dict, optional
        From ``bilstm_tagger.dynet_weights``.
    num_tags : int, optional
    """

    def __init__(self, dy, vocab_size, embed, hidden, weights=None,
                 num_tags=5):
        self.dy = dy
        self.pc = dy.ParameterCollection()
        self.embedding = self.pc.add_lookup_parameters((vocab_size, embed))
        self.fwd = dy.VanillaLSTMBuilder(1, embed, hidden, self.pc)
        self.bwd = dy.VanillaLSTMBuilder(1, embed, hidden, self.pc)
        self.out_weight = self.pc.add_parameters((num_tags, 2 * hidden))
        self.out_bias = self.pc.add_parameters(
            (num_tags,), init=dy.ConstInitializer(0.0))
        if weights is not None:
            self.set_weights(weights)

    def set_weights(self, weights):
        """Copy numpy weights in (shapes checked by DyNet)."""
        self.embedding.init_from_array(weights["embedding"])
        for short, builder in (("fwd", self.fwd), ("bwd", self.bwd)):
            x_weight, h_weight, bias = builder.get_parameters()[0]
            x_weight.set_value(weights[short + "_x_weight"])
            h_weight.set_value(weights[short + "_h_weight"])
            bias.set_value(weights[short + "_bias"])
        self.out_weight.set_value(weights["out_weight"])
        self.out_bias.set_value(weights["out_bias"])

    def batch_loss(self, batch):
        """New graph holding the summed token loss of ``batch``.

        Parameters
        ----------
        batch : list of (word_ids, tags)

        Returns
        -------
        dynet.Expression
        """
        dy = self.dy
        dy.renew_cg()
        losses = []
        for ids, tags in batch:
            xs = [dy.lookup(self.embedding, w) for w in ids]
            forward = self.fwd.initial_state().transduce(xs)
            backward = self.bwd.initial_state().transduce(xs[::-1])[::-1]
            for f, b, tag in zip(forward, backward, tags):
                logits = dy.affine_transform([self.out_bias, self.out_weight,
                                              dy.concatenate([f, b])])
                losses.append(dy.pickneglogsoftmax(logits, tag))
        return dy.esum(losses)


def dynet_worker(job):
    """Run a DyNet job (one autobatch setting per process)."""
    cores = apply_threads(job.get("threads"))
    try:
        import dynet_config  # pylint: disable=import-outside-toplevel
    except ImportError:
        print(DYNET_SKIP, file=sys.stderr)
        sys.exit(DYNET_MISSING)
    dynet_config.set(mem=job.get("mem", "1024"), random_seed=job["seed"],
                     autobatch=job["autobatch"])
    try:
        import dynet as dy  # pylint: disable=import-outside-toplevel
    except ImportError:
        print(DYNET_SKIP, file=sys.stderr)
        sys.exit(DYNET_MISSING)
    import numpy as np  # pylint: disable=import-outside-toplevel
    trees, vocab = load_sst_trees(job["data_dir"], job.get("max_trees"))
    with np.load(job["weights"]) as data:
        weights = {name: data[name].astype(np.float32) for name in data.files
                   if name != "vocab"}
        if "vocab" in data.files and list(data["vocab"]) != sorted(
                vocab, key=vocab.get):
            raise ValueError("the weights' vocabulary differs from the "
                             "trees' vocabulary")
    if job["workload"] == "tagger":
        items = tagged_sentences(trees)
        model = DyNetTagger(dy, len(vocab), job["embed"], job["hidden"],
                            weights)
    else:
        import dynet_treelstm  # pylint: disable=import-outside-toplevel
        items = trees
        model = dynet_treelstm.DyNetTreeLSTM(dy, len(vocab), job["embed"],
                                             job["hidden"], weights)

    def fresh_params():
        if job["workload"] == "tagger":
            model.set_weights(weights)
        else:
            model.set_weights(weights, dynet_treelstm.expected_shapes(
                len(vocab), job["embed"], job["hidden"]))

    results = []
    sizes = job.get("sizes") or [job["batch_size"]]
    label = "%s dynet ab=%d" % (job["name"], job["autobatch"])
    for size in sizes:
        batches = job["batches"]
        if job["workload"] == "batchsize":
            batches = sweep_batches(batches, size, job.get("quick"))
        for mode in job["modes"]:
            fresh_params()
            trainer = None
            if mode == "train":
                trainer = dy.AdamTrainer(model.pc)
                trainer.set_clip_threshold(0.0)

            def step(batch, trainer=trainer):
                loss = model.batch_loss(batch)
                value = loss.value()
                if trainer is not None:
                    loss.backward()
                    trainer.update()
                return value, None

            loop = time_loop(step, batch_stream(items, size, job["seed"]),
                             job["warmup"], batches, lambda: None,
                             job["system_timeout"],
                             "%s size %d" % (label, size))
            res = summarize(loop)
            res.update({"system": "dynet-ab%d" % job["autobatch"],
                        "config": "autobatch=%d" % job["autobatch"],
                        "mode": mode, "size": size})
            LOG.info("%s size %d %s: %.1f sentences/s", label, size, mode,
                     res["sentences_per_s"])
            results.append(res)
    env = {var: os.environ.get(var) for var in THREAD_VARS}
    env.update({"cores": cores, "os_threads": os_threads()})
    return {"job": job["name"], "side": "dynet", "systems": results,
            "env": env}


# --------------------------------------------------------------------------
# The orchestrator
# --------------------------------------------------------------------------

def parse_args(argv=None):
    """Parse the command line (see ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Training and inference throughput (sentences/s) of "
                    "gluon_dynbatch against eager Gluon and DyNet with and "
                    "without autobatching, on the same machine in one run.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--workloads", default=",".join(WORKLOADS),
        help="comma list of %s" % ", ".join(WORKLOADS))
    add("--dims", default="128/128,256/256",
        help="embedding/hidden sizes of the treelstm workload, comma list")
    add("--sizes", default="1,4,16,64,256",
        help="trees per batch of the batch-size sweep (treelstm at 128/128)")
    add("--batches", type=int, default=10,
        help="timed batches per system (the sweep scales this by size)")
    add("--warmup", type=int, default=2,
        help="untimed batches before the timed ones")
    add("--eager-batches", type=int, default=3,
        help="timed batches of eager Gluon (0: skip eager)")
    add("--eager-warmup", type=int, default=1,
        help="untimed batches of eager Gluon")
    add("--configs", default=",".join(ALL_CONFIGS),
        help="gluon_dynbatch settings to try, strategy:mode with mode "
             "imperative|step|compiled; the default %s is always run"
             % DEFAULT_CONFIG)
    add("--threads", type=int, default=None,
        help="threads (and cores, by affinity) of every process; default: "
             "the machine's defaults (DyNet computes on one thread anyway)")
    add("--quick", action="store_true",
        help="smoke run: 2 timed batches, 1 warm-up, 1 eager batch, "
             "first 1000 trees, sizes 1,4,16")
    add("--skip-dynet", action="store_true", help="do not run DyNet")
    add("--no-hand", action="store_true",
        help="do not run the hand-batched MXNet Tree-LSTM "
             "(scripts/handbatched_sst.py) on the treelstm workload")
    add("--profile", action="store_true",
        help="also print where gluon_dynbatch's time goes for one treelstm "
             "batch (first --dims pair): phases, scope.stats, top "
             "operators (mx.profiler) and top Python functions (cProfile)")
    add("--tree-batch", type=int, default=TREE_BATCH,
        help="trees per batch of treelstm and sick (sick: half as pairs)")
    add("--tagger-batch", type=int, default=TAGGER_BATCH,
        help="sentences per batch of the tagger")
    add("--tagger-dims", default="%d/%d" % TAGGER_DIMS,
        help="embedding/hidden sizes of the tagger")
    add("--max-trees", type=int, default=None,
        help="use only the first N SST train trees (N/2 SICK pairs)")
    add("--system-timeout", type=float, default=300.0,
        help="seconds after which a system stops timing more batches")
    add("--data-dir", default=None,
        help="SST folder (default: ../shared/data/sst from the repo root)")
    add("--sick-dir", default=None,
        help="SICK folder (default: ../shared/data/sick)")
    add("--seed", type=int, default=1, help="weights and batch order")
    add("--out-dir", default="results/dynet",
        help="where CSV, Markdown, JSON and PNG go")
    add("--verbose", action="store_true", help="debug logging")
    add("--worker", choices=("gluon", "dynet"), help=argparse.SUPPRESS)
    add("--job", help=argparse.SUPPRESS)
    add("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    if args.quick:
        args.batches = min(args.batches, 2)
        args.warmup = min(args.warmup, 1)
        args.eager_batches = min(args.eager_batches, 1)
        args.eager_warmup = 0
        if args.max_trees is None:
            args.max_trees = 1000
        if args.sizes == parser.get_default("sizes"):
            args.sizes = "1,4,16"
    try:
        args.workloads = _names(args.workloads, WORKLOADS)
        args.dims = [_dims(d) for d in args.dims.split(",") if d.strip()]
        args.tagger_dims = _dims(args.tagger_dims)
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        configs = [c.strip() for c in args.configs.split(",") if c.strip()]
        for config in configs:
            parse_config(config)
    except ValueError as err:
        parser.error(str(err))
    args.configs = [DEFAULT_CONFIG] + [c for c in configs
                                       if c != DEFAULT_CONFIG]
    if not args.dims and ("treelstm" in args.workloads or args.profile):
        parser.error("--dims is empty")
    if min(args.sizes or [1]) < 1 or args.batches < 1 or args.warmup < 0:
        parser.error("--sizes and --batches must be positive, --warmup >= 0")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be positive")
    return args


def _names(text, known):
    """Comma list of names, each one of ``known``."""
    names = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in names if w not in known]
    if bad:
        raise ValueError("unknown workload(s) %s; choose from %s"
                         % (", ".join(bad), ", ".join(known)))
    return names


def _dims(text):
    """``"128/128"`` -> (128, 128)."""
    try:
        embed, hidden = (int(x) for x in text.strip().split("/"))
    except ValueError:
        raise ValueError("bad sizes %r: expected E/H such as 128/128"
                         % text) from None
    if embed < 1 or hidden < 1:
        raise ValueError("sizes must be positive: %r" % text)
    return embed, hidden


def run_worker(side, job, args, work_dir):
    """Run one job in a subprocess; return its result (or an error dict).

    Parameters
    ----------
    side : {"gluon", "dynet"}
    job : dict
    args : argparse.Namespace
    work_dir : str
        Where the job and result files go.

    Returns
    -------
    dict
        The worker's result, or ``{"error": ..., "skipped": bool}``.
    """
    stem = os.path.join(work_dir, "%s_%s" % (side, job["name"].replace(
        " ", "_").replace("/", "x")))
    job_file, result_file = stem + ".job.json", stem + ".result.json"
    with open(job_file, "w") as handle:
        json.dump(job, handle)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", side,
           "--job", job_file, "--result", result_file]
    if args.verbose:
        cmd.append("--verbose")
    LOG.info("running %s job %s (load average %s)", side, job["name"],
             _load())
    LOADS.append(_load())
    done = subprocess.run(cmd, cwd=str(ROOT), stdout=subprocess.PIPE,
                          stderr=None, text=True)
    if done.returncode == DYNET_MISSING and side == "dynet":
        return {"error": DYNET_SKIP, "skipped": True}
    if done.returncode != 0 or not os.path.isfile(result_file):
        message = "%s worker for %s failed with status %d" % (
            side, job["name"], done.returncode)
        LOG.error(message)
        return {"error": message, "skipped": False}
    with open(result_file) as handle:
        return json.load(handle)


LOADS = []
"""1-minute load averages seen at the start of each job of this run."""


def base_job(args, name, workload):
    """Fields every job has."""
    return {"name": name, "workload": workload, "seed": args.seed,
            "threads": args.threads, "warmup": args.warmup,
            "batches": args.batches, "eager_batches": args.eager_batches,
            "eager_warmup": args.eager_warmup, "modes": list(MODES),
            "system_timeout": args.system_timeout,
            "max_trees": args.max_trees, "quick": args.quick,
            "data_dir": args.data_dir, "hand": not args.no_hand}


def dynet_available():
    """True when ``dynet_config`` and ``dynet`` can be found."""
    return all(importlib.util.find_spec(m) is not None
               for m in ("dynet_config", "dynet"))


def best_of(systems, mode):
    """The fastest gluon_dynbatch result in ``mode`` (None if none)."""
    rows = [s for s in systems if s["system"] == "gdb" and s["mode"] == mode]
    return max(rows, key=lambda s: s["sentences_per_s"]) if rows else None


def loss_gap(result, reference):
    """Relative differences of the losses both runs computed.

    Returns
    -------
    tuple of float or None
        ``(first, largest)``: the gap on the first batch (same weights, a
        pure forward comparison) and the largest over the common batches
        (training lets float rounding drift through the updates).
    """
    gaps = [abs(a - b) / max(abs(b), 1e-12)
            for a, b in zip(result["losses"], reference["losses"])]
    return (gaps[0], max(gaps)) if gaps else (None, None)


def workload_rows(label, gluon, dynet_results, notes):
    """Summary rows of one workload.

    Parameters
    ----------
    label : str
        Workload label, e.g. ``"treelstm 128/128"``.
    gluon : dict
        Result of the Gluon worker.
    dynet_results : dict
        autobatch (0/1) -> result of a DyNet worker (or error dict).
    notes : list of str
        Receives remarks.

    Returns
    -------
    list of dict
        One row per system with train/infer sentences/s, settings and
        ratios to eager and to DyNet autobatching.
    """
    systems = gluon.get("systems", [])
    by = {}
    for res in systems:
        by.setdefault((res["system"], res["config"]), {})[res["mode"]] = res
    rows = []

    def add(name, picks):
        row = {"workload": label, "system": name}
        for mode in MODES:
            res = picks.get(mode)
            row[mode + "_config"] = res["config"] if res else ""
            row[mode] = res["sentences_per_s"] if res else None
            row[mode + "_ms"] = res["median_ms"] if res else None
            row[mode + "_batches"] = res["batches"] if res else 0
            row[mode + "_cut"] = bool(res and res["cut"])
            row[mode + "_result"] = res
        rows.append(row)

    add("eager Gluon", by.get(("eager", ""), {}))
    add("gluon_dynbatch default", by.get(("gdb", DEFAULT_CONFIG), {}))
    add("gluon_dynbatch best", {m: best_of(systems, m) for m in MODES})
    if ("hand", HAND_CONFIG) in by:
        add("hand-batched MXNet (no per-node Python)", by[("hand", HAND_CONFIG)])
    for autobatch in (0, 1):
        res = dynet_results.get(autobatch)
        name = "DyNet autobatch=%d" % autobatch
        if res is None:
            continue
        if "error" in res:
            notes.append("%s, %s: %s" % (label, name, res["error"]))
            continue
        add(name, {s["mode"]: s for s in res["systems"]})
    eager = rows[0]
    dynet_ab = next((r for r in rows if r["system"] == "DyNet autobatch=1"),
                    None)
    for row in rows:
        for mode in MODES:
            for ref, key in ((eager, "x_eager"), (dynet_ab, "x_dynet")):
                value = None
                if ref is not None and ref[mode] and row[mode]:
                    value = row[mode] / ref[mode]
                row["%s_%s" % (mode, key)] = value
            res, ref = row[mode + "_result"], eager[mode + "_result"]
            first, largest = (loss_gap(res, ref)
                              if res and ref and res is not ref
                              else (None, None))
            row[mode + "_loss_gap_first"] = first
            row[mode + "_loss_gap"] = largest
    return rows


def sweep_rows(gluon, dynet_result, notes):
    """Rows of the batch-size table: size x system, train and infer."""
    table = {}
    for res in gluon.get("systems", []):
        key = (res["size"], "gluon_dynbatch " + res["config"])
        table.setdefault(key, {})[res["mode"]] = res
    if dynet_result is not None:
        if "error" in dynet_result:
            notes.append("batch-size sweep, DyNet: %s"
                         % dynet_result["error"])
        else:
            for res in dynet_result["systems"]:
                key = (res["size"], "DyNet autobatch=1")
                table.setdefault(key, {})[res["mode"]] = res
    rows = []
    for (size, system), modes in sorted(table.items()):
        row = {"size": size, "system": system}
        for mode in MODES:
            res = modes.get(mode)
            row[mode] = res["sentences_per_s"] if res else None
            row[mode + "_batches"] = res["batches"] if res else 0
        rows.append(row)
    for row in rows:
        ref = next((r for r in rows if r["size"] == row["size"]
                    and r["system"].startswith("DyNet")), None)
        for mode in MODES:
            row[mode + "_x_dynet"] = (row[mode] / ref[mode]
                                      if ref and ref[mode] and row[mode]
                                      else None)
    return rows


def _fmt(value, digits=1):
    """Number for a table; '-' for None."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "%.*f" % (digits, value)
    return str(value)


def _gaps(row):
    """'first / max' relative loss gaps of a summary row over both modes."""
    firsts = [row[m + "_loss_gap_first"] for m in MODES
              if row[m + "_loss_gap_first"] is not None]
    largest = [row[m + "_loss_gap"] for m in MODES
               if row[m + "_loss_gap"] is not None]
    if not firsts:
        return "-"
    return "%.1e / %.1e" % (max(firsts), max(largest))


def _ratio(value):
    """Ratio for a table, e.g. '1.23x'."""
    return "-" if value is None else "%.2fx" % value


def markdown_tables(report):
    """The Markdown report (also printed)."""
    lines = ["# gluon_dynbatch vs eager Gluon vs DyNet", ""]
    env = report["env"]
    lines.append("Machine: %s, %s CPUs, Python %s, mxnet %s; threads: %s; "
                 "1-minute load average %s at the start, %s at the end, "
                 "%s over the jobs (other jobs share the machine). "
                 "Medians over batches of sentences/s "
                 "(training = forward, backward, update; inference = "
                 "forward, same loss)."
                 % (platform.machine(), env["cpu_count"],
                    platform.python_version(), env.get("mxnet", "?"),
                    env["threads"], env["load_start"], env["load_end"],
                    _load_range(env.get("job_loads"))))
    lines.append("")
    header = ("| system | setting (train / infer) | train sent/s | "
              "infer sent/s | train vs eager | train vs DyNet-ab | "
              "infer vs eager | infer vs DyNet-ab | loss gap vs eager, "
              "1st batch / max |")
    for label, rows in report["workloads"].items():
        lines += ["## %s" % label, "", header,
                  "|" + " --- |" * 9]
        for row in rows:
            settings = row["train_config"]
            if row["infer_config"] != row["train_config"]:
                settings += " / " + row["infer_config"]
            gap = _gaps(row)
            cut = " (cut)" if row["train_cut"] or row["infer_cut"] else ""
            lines.append("| %s%s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                row["system"], cut, settings or "-", _fmt(row["train"]),
                _fmt(row["infer"]), _ratio(row["train_x_eager"]),
                _ratio(row["train_x_dynet"]), _ratio(row["infer_x_eager"]),
                _ratio(row["infer_x_dynet"]),
                gap))
        lines.append("")
    if report["configs"]:
        lines += ["## Every gluon_dynbatch setting (sentences/s)", "",
                  "| workload | setting | train | infer | record ms | "
                  "plan ms | execute ms | compile ms | mean batch |",
                  "|" + " --- |" * 9]
        for row in report["configs"]:
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                row["workload"], row["config"], _fmt(row["train"]),
                _fmt(row["infer"]), _fmt(row["record_ms"]),
                _fmt(row["plan_ms"]), _fmt(row["execute_ms"]),
                _fmt(row["compile_ms"]), _fmt(row["mean_batch_size"])))
        lines.append("")
    if report["sweep"]:
        lines += ["## Batch size (treelstm %d/%d)" % SWEEP_DIMS, "",
                  "| trees per batch | system | train sent/s | infer sent/s "
                  "| train vs DyNet-ab | infer vs DyNet-ab |",
                  "|" + " --- |" * 6]
        for row in report["sweep"]:
            lines.append("| %d | %s | %s | %s | %s | %s |" % (
                row["size"], row["system"], _fmt(row["train"]),
                _fmt(row["infer"]), _ratio(row["train_x_dynet"]),
                _ratio(row["infer_x_dynet"])))
        lines.append("")
    if report["notes"]:
        lines += ["## Notes", ""] + ["- " + n for n in report["notes"]] + [""]
    if report.get("profile"):
        lines += ["## Profile of one treelstm training batch", "", "```",
                  report["profile"], "```", ""]
    return "\n".join(lines)


def config_rows(label, gluon):
    """Per-setting rows (train/infer sentences/s and medians of stats)."""
    table = {}
    for res in gluon.get("systems", []):
        if res["system"] == "gdb":
            table.setdefault(res["config"], {})[res["mode"]] = res
    rows = []
    for config, modes in table.items():
        row = {"workload": label, "config": config}
        for mode in MODES:
            res = modes.get(mode)
            row[mode] = res["sentences_per_s"] if res else None
        stats = (modes.get("train") or {}).get("stats", {})
        for name in STAT_MS + ("mean_batch_size",):
            row[name] = stats.get(name)
        rows.append(row)
    return rows


def profile_text(profiles):
    """Readable text of :func:`profile_batch` results."""
    out = []
    for prof in profiles:
        stats = prof["stats"]
        total = sum(ms for name, ms in prof["phases"]
                    if not name.startswith(" "))
        out.append("gluon_dynbatch %s, %d trees (%d tree nodes), one "
                   "training batch: %.1f ms"
                   % (prof["config"], prof["trees"], prof["tree_nodes"],
                      total))
        for name, ms in prof["phases"]:
            out.append("  %-56s %8.1f ms  %5.1f%%"
                       % (name, ms, 100.0 * ms / total if total else 0.0))
        out.append("  scope.stats: record %.1f ms, plan %.1f ms, execute "
                   "%.1f ms (compile %.1f ms); %d nodes recorded (%.2f us "
                   "each), %d steps, mean batch %.1f, cache %d hit / %d miss"
                   % (stats["record_ms"], stats["plan_ms"],
                      stats["execute_ms"], stats["compile_ms"],
                      stats["nodes"], stats["us_per_node"], stats["steps"],
                      stats["mean_batch_size"], stats["cache_hits"],
                      stats["cache_misses"]))
        for key, title in (("operators", "top operators"),
                           ("api", "top MXNet C API calls")):
            out.append("  %s (mx.profiler, one more batch):" % title)
            if not prof[key]:
                out.append("    (mx.profiler returned no rows)")
            for op in prof[key]:
                out.append("    %-40s %8.2f ms  %6d calls"
                           % (op["op"][:40], op["total_ms"], op["count"]))
        out.append("  top Python functions by own time (cProfile, one more "
                   "batch):")
        out += ["    " + line for line in prof["python"].splitlines()]
        out.append("")
    return "\n".join(out)


CSV_FIELDS = ("table", "workload", "system", "size", "train_config",
              "infer_config", "train", "infer", "train_ms", "infer_ms",
              "train_batches", "infer_batches", "train_x_eager",
              "train_x_dynet", "infer_x_eager", "infer_x_dynet",
              "train_loss_gap_first", "train_loss_gap",
              "infer_loss_gap_first", "infer_loss_gap", "record_ms", "plan_ms",
              "execute_ms", "compile_ms", "mean_batch_size")


def write_csv(path, report):
    """One CSV with the summary, settings and batch-size rows."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS,
                                extrasaction="ignore")
        writer.writeheader()
        for rows in report["workloads"].values():
            for row in rows:
                writer.writerow(dict(row, table="summary"))
        for row in report["configs"]:
            writer.writerow(dict(row, table="settings",
                                 system="gluon_dynbatch",
                                 train_config=row["config"],
                                 infer_config=row["config"]))
        for row in report["sweep"]:
            writer.writerow(dict(row, table="batch_size",
                                 workload="treelstm %d/%d" % SWEEP_DIMS))


def plot_sweep(path, rows):
    """Sentences/s against batch size, one panel per mode (PNG)."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    systems = sorted({r["system"] for r in rows})
    for ax, mode in zip(axes, MODES):
        for system in systems:
            pts = [(r["size"], r[mode]) for r in rows
                   if r["system"] == system and r[mode]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        label=system)
        ax.set_xscale("log", base=2)
        sizes = sorted({r["size"] for r in rows})
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(n) for n in sizes])
        ax.set_yscale("log")
        ax.set_xlabel("trees per batch")
        ax.set_ylabel("sentences/s")
        ax.set_title("%s, Tree-LSTM %d/%d on SST" % ((mode,) + SWEEP_DIMS))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def strip_results(rows):
    """Rows without the bulky per-result dicts (for JSON/CSV)."""
    return [{k: v for k, v in row.items() if not k.endswith("_result")}
            for row in rows]


def _load_range(loads):
    """'min-max' of load-average strings ('?' when none are known)."""
    values = [float(x) for x in loads or [] if x != "?"]
    if not values:
        return "?"
    return "%.1f-%.1f" % (min(values), max(values))


def _load():
    """The 1-minute load average as text ('?' where unknown)."""
    try:
        return "%.1f" % os.getloadavg()[0]
    except (AttributeError, OSError):
        return "?"


def orchestrate(args):
    """Run every job, write the outputs, return the report dict."""
    from examples.sst_data import default_sst_dir  # noqa  pylint: disable=import-outside-toplevel
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="bench_dynet_")
    load_start = _load()
    args.data_dir = args.data_dir or default_sst_dir()
    notes, workloads, configs = [], {}, []
    have_dynet = not args.skip_dynet and dynet_available()
    if args.skip_dynet:
        notes.append("DyNet: skipped (--skip-dynet)")
    elif not have_dynet:
        notes.append("DyNet: " + DYNET_SKIP)
        LOG.warning("DyNet: %s", DYNET_SKIP)
    needs_sst = {"treelstm", "tagger", "batchsize"} & set(args.workloads)
    if (needs_sst or args.profile) and args.data_dir is None:
        message = ("SST not found (expected ../shared/data/sst or "
                   "--data-dir): skipped %s" % ", ".join(sorted(needs_sst)))
        LOG.warning(message)
        notes.append(message)
    envs = {}
    best_tree_config = None

    def run_pair(name, workload, dims, batch_size, data_dir, dynet):
        job = dict(base_job(args, name, workload), embed=dims[0],
                   hidden=dims[1], batch_size=batch_size, data_dir=data_dir,
                   configs=args.configs,
                   weights_out=os.path.join(work_dir, name.replace(
                       " ", "_").replace("/", "x") + ".npz"))
        gluon = run_worker("gluon", job, args, work_dir)
        if "error" in gluon:
            notes.append("%s: %s" % (name, gluon["error"]))
            return gluon, {}
        envs.setdefault("gluon", gluon["env"])
        results = {}
        if dynet and have_dynet:
            for autobatch in (0, 1):
                djob = dict(job, autobatch=autobatch, weights=job[
                    "weights_out"], name="%s ab%d" % (name, autobatch))
                results[autobatch] = run_worker("dynet", djob, args, work_dir)
                if "env" in results[autobatch]:
                    envs.setdefault("dynet", results[autobatch]["env"])
        elif dynet and not args.skip_dynet:
            results = {0: {"error": DYNET_SKIP}, 1: {"error": DYNET_SKIP}}
        return gluon, results

    plan = []
    if args.data_dir is not None:
        if "treelstm" in args.workloads:
            plan += [("treelstm %d/%d" % d, "treelstm", d, args.tree_batch,
                      args.data_dir, True) for d in args.dims]
        if "tagger" in args.workloads:
            plan.append(("tagger %d/%d" % args.tagger_dims, "tagger",
                         args.tagger_dims, args.tagger_batch, args.data_dir,
                         True))
    if "sick" in args.workloads:
        sick_dir = args.sick_dir
        if sick_dir is None:
            from examples.sick_data import default_data_dir  # noqa  pylint: disable=import-outside-toplevel
            sick_dir = default_data_dir()
        if sick_dir is None or not (Path(sick_dir) / "train").is_dir():
            notes.append("sick: SICK train not found (expected "
                         "../shared/data/sick or --sick-dir): skipped")
        else:
            plan.append(("sick %d/%d" % (SICK_INPUT, SICK_HIDDEN), "sick",
                         (SICK_INPUT, SICK_HIDDEN), args.tree_batch // 2,
                         str(sick_dir), False))
            notes.append("sick: no DyNet version (eager Gluon vs "
                         "gluon_dynbatch only); sentences = trees, 2 a pair")
    for name, workload, dims, batch_size, data_dir, with_dynet in plan:
        gluon, dynet = run_pair(name, workload, dims, batch_size, data_dir,
                                with_dynet)
        if "error" in gluon:
            continue
        workloads[name] = workload_rows(name, gluon, dynet, notes)
        configs += config_rows(name, gluon)
        if workload == "treelstm" and tuple(dims) == SWEEP_DIMS:
            best = best_of(gluon["systems"], "train")
            best_tree_config = best["config"] if best else None

    sweep = []
    if "batchsize" in args.workloads and args.data_dir is not None:
        sweep_configs = [DEFAULT_CONFIG]
        if best_tree_config and best_tree_config != DEFAULT_CONFIG:
            sweep_configs.append(best_tree_config)
        job = dict(base_job(args, "batchsize", "batchsize"),
                   embed=SWEEP_DIMS[0], hidden=SWEEP_DIMS[1],
                   batch_size=args.tree_batch, sizes=args.sizes,
                   configs=sweep_configs,
                   weights_out=os.path.join(work_dir, "sweep.npz"))
        gluon = run_worker("gluon", job, args, work_dir)
        dynet = None
        if "error" in gluon:
            notes.append("batch-size sweep: %s" % gluon["error"])
        else:
            envs.setdefault("gluon", gluon["env"])
            if have_dynet:
                dynet = run_worker("dynet", dict(
                    job, autobatch=1, weights=job["weights_out"],
                    name="batchsize ab1"), args, work_dir)
            elif not args.skip_dynet:
                dynet = {"error": DYNET_SKIP}
            sweep = sweep_rows(gluon, dynet, notes)

    profile = None
    if args.profile and args.data_dir is not None:
        configs_p = [DEFAULT_CONFIG]
        if best_tree_config and best_tree_config != DEFAULT_CONFIG:
            configs_p.append(best_tree_config)
        embed, hidden = args.dims[0]
        job = dict(base_job(args, "profile", "profile"), embed=embed,
                   hidden=hidden, batch_size=args.tree_batch,
                   configs=configs_p, weights_out=None)
        res = run_worker("gluon", job, args, work_dir)
        if "error" in res:
            notes.append("profile: %s" % res["error"])
        else:
            envs.setdefault("gluon", res["env"])
            profile = ("treelstm %d/%d\n" % (embed, hidden)
                       + profile_text(res["profiles"]))

    gluon_env_ = envs.get("gluon", {})
    threads = ("--threads %d for every process" % args.threads
               if args.threads else
               "machine defaults for Gluon (OMP_NUM_THREADS=%s, %s cores), "
               "DyNet computes on one thread"
               % (gluon_env_.get("OMP_NUM_THREADS") or "unset",
                  len(gluon_env_.get("cores") or []) or "?"))
    report = {"env": {"cpu_count": os.cpu_count(), "threads": threads,
                      "load_start": load_start, "load_end": _load(),
                      "job_loads": list(LOADS),
                      "mxnet": gluon_env_.get("mxnet"), "processes": envs,
                      "argv": sys.argv[1:]},
              "workloads": workloads, "configs": configs, "sweep": sweep,
              "notes": notes, "profile": profile}
    text = markdown_tables(report)
    (out_dir / "bench_dynet.md").write_text(text + "\n")
    write_csv(out_dir / "bench_dynet.csv", report)
    if sweep:
        plot_sweep(out_dir / "batch_size.png", sweep)
    saved = dict(report, workloads={k: strip_results(v)
                                    for k, v in workloads.items()})
    with open(out_dir / "bench_dynet.json", "w") as handle:
        json.dump(saved, handle, indent=1, default=str)
    print(text)
    LOG.info("wrote %s", ", ".join(str(out_dir / n) for n in (
        "bench_dynet.md", "bench_dynet.csv", "bench_dynet.json")
        + (("batch_size.png",) if sweep else ())))
    return report


def worker_main(args):
    """Entry point of a worker process."""
    with open(args.job) as handle:
        job = json.load(handle)
    setup_logging(args.verbose, "%(asctime)s [" + args.worker + "] %(message)s")
    if args.worker == "gluon":
        result = gluon_worker(job)
    else:
        result = dynet_worker(job)
    with open(args.result, "w") as handle:
        json.dump(result, handle, default=str)


def main(argv=None):
    """Run the benchmark (or, with the hidden ``--worker``, one job)."""
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
        return None
    setup_logging(args.verbose)
    started = time.perf_counter()
    report = orchestrate(args)
    LOG.info("done in %.0f s", time.perf_counter() - started)
    return report


if __name__ == "__main__":
    main()
