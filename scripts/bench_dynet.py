#!/usr/bin/env python
"""gluon_dynbatch against eager Gluon, hand-batched MXNet and DyNet, in one run.

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
    The ``treelstm`` workload at 128/128 against the number of trees per
    batch (``--sizes``).

Systems, each a row of the report:

``eager``
    Eager Gluon: the model's own block outside any batching scope, one
    sample and one operator at a time (on ``treelstm`` the cell-written
    encoder; the op-by-op one runs the same operators).
``gdb``
    gluon_dynbatch, one row per ``--configs`` setting (strategy:mode). On
    ``treelstm`` and ``batchsize`` once per encoder of ``--encoders``:
    ``cell`` (``BinaryTreeLSTM``: a node's math in child blocks, recorded as
    one call each) and ``op`` (``OpByOpBinaryTreeLSTM``: the same function
    with its ``F`` operators called one by one, as DyNet's benchmark writes
    it). The sweep runs the default setting only.
``hand`` and ``hand-sparse``
    ``treelstm`` and ``batchsize``: ``scripts/handbatched_sst.py``, the same
    model batched by hand, one CachedOp per batch and nothing per tree node
    in Python. ``hand`` gathers the embedding rows inside the CachedOp (a
    dense table gradient, dense Adam, like the gluon_dynbatch rows);
    ``hand-sparse`` looks them up outside with ``nn.Embedding(...,
    sparse_grad=True)`` and trains with ``Trainer(..., "adam",
    {"lazy_update": True})``, updating only the rows a batch used as DyNet
    does: the like-for-like MXNet limit.
``dynet``
    DyNet with autobatching off (0) and on (1).

Every system starts from the same weights (the seeded model; DyNet loads the
weights the first Gluon system exports) and sees the same batches in the same
order; each system's losses are compared with eager Gluon's (first batch:
the same weights, a pure forward comparison).

Processes. Each system runs in a long-lived worker process of its own
(``scripts/bench_dynet_worker.py``); with ``--gluon-processes shared`` the
Gluon systems of a workload share one worker (less memory; each still has its
own model, optimiser and caches). A worker applies ``--threads`` (thread
variables and CPU affinity) before it imports mxnet or dynet, and a DyNet
worker configures dynet (autobatch, seed, memory) before importing it, so
every DyNet setting needs a process of its own. This driver never imports
mxnet or dynet. It speaks to each worker over the worker's stdin and stdout,
one JSON object per line and one answer per request (``setup``,
``prepare``, ``run``, ``profile``, ``env``, ``quit``); the worker moves its
own stdout to stderr before importing anything, so that what a library
prints cannot break the protocol. Only one worker computes at any time: the
others wait on their pipes.

Rounds. Each system first warms up (``prepare``: initial weights, a fresh
optimiser and block, ``--warmup`` untimed batches), one system after
another. Then the timed batches run in rounds: round ``r`` runs batches
``r * R`` to ``(r + 1) * R - 1`` (``R = --round-batches``) of every system,
one system after another, the order rotating by one system from round to
round, as in ``scripts/benchmark.py``. A drift of the machine's speed during
the run so reaches every system alike, while each system still runs ``R``
batches in a row. Training is timed first, then inference (each mode from
the initial weights, with a new warm-up).

Timing. Every system, eager included, is timed on the same ``--batches``
batches (those after the ``--warmup`` ones). Training (forward, backward,
optimiser update) is timed batch by batch, waiting for MXNet
(``mx.nd.waitall``) before and after each; its figure is the median over
batches of sentences/s (``--train-back-to-back`` times training like
inference). Inference (forward, the same summed loss) runs a round's ``R``
batches back to back with one wait at the end, so that MXNet may compute
batch k while Python records batch k + 1; its figure is the median over
rounds of the block's sentences/s. Losses are read after the wait. DyNet
computes when ``loss.value()`` is called, so its timings need no wait.
Results go to ``--out-dir`` as CSV, Markdown, JSON and a PNG plot of the
batch-size sweep (``scripts/bench_dynet_report.py``); the report says, per
system, which process ran it, its cores and threads, its warm-up, timed
batches and rounds. ``docs/bench_dynet.md`` describes all of this for users.

Run from the repository root::

    .venv/bin/python scripts/bench_dynet.py                  # everything
    .venv/bin/python scripts/bench_dynet.py --threads 1
    .venv/bin/python scripts/bench_dynet.py --quick --profile
"""
import argparse
import importlib.util
import json
import logging
import math
import os
import select
import shutil
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

import benchlib  # noqa: E402
import bench_dynet_report as report_mod  # noqa: E402
from bench_dynet_common import (  # noqa: E402
    DYNET_MISSING, DYNET_SKIP, MODES, SWEEP_DIMS, parse_config, summarize_stats)
from examples.progress_logging import setup_logging  # noqa: E402

LOG = logging.getLogger("bench_dynet")

WORKER = Path(__file__).resolve().parent / "bench_dynet_worker.py"
SCRIPT = "scripts/bench_dynet.py"
WORKLOADS = ("treelstm", "tagger", "sick", "batchsize")
DEFAULT_CONFIG = "depth:imperative"
"""gluon_dynbatch's defaults: ``gdb.batching()`` with nothing changed."""
ALL_CONFIGS = ("depth:imperative", "agenda:imperative", "depth:step",
               "agenda:step", "depth:compiled", "agenda:compiled")
ENCODERS = ("cell", "op")
ENCODER_NAMES = {"cell": "cell-written", "op": "op-by-op"}
TREE_BATCH = 50
TAGGER_BATCH = 64
TAGGER_DIMS = (128, 128)
SICK_INPUT, SICK_HIDDEN = 300, 150
SETUP_TIMEOUT = 900.0
"""Seconds a worker may take to start, load its data and build its models."""


# --------------------------------------------------------------------------
# Batch counts
# --------------------------------------------------------------------------

def sweep_batches(batches, size, quick):
    """Timed batches at batch size ``size`` in the batch-size sweep.

    About as many sentences as ``batches`` batches of 50, at least 3 batches
    (2 when ``quick``) and at most ``4 * batches``.
    """
    low = 2 if quick else 3
    want = math.ceil(batches * TREE_BATCH / size)
    return max(low, min(want, 4 * max(batches, 1)))


# --------------------------------------------------------------------------
# Systems and rounds
# --------------------------------------------------------------------------

def system_spec(kind, label, side="gluon", **extra):
    """One system of a workload (a JSON-able dict; ``key`` names it)."""
    parts = [str(extra[k]) for k in ("encoder", "config", "autobatch")
             if extra.get(k) is not None]
    key = "-".join([kind] + parts)
    return dict(extra, key=key, kind=kind, label=label, side=side)


def gdb_label(config, encoder=None):
    """Row label of a gluon_dynbatch system."""
    what = "gluon_dynbatch"
    if encoder is not None:
        what += " " + ENCODER_NAMES[encoder]
    default = " (default)" if config == DEFAULT_CONFIG else ""
    return "%s %s%s" % (what, config, default)


def workload_systems(workload, args):
    """The systems of one workload, in report order.

    Parameters
    ----------
    workload : str
        One of :data:`WORKLOADS`.
    args : argparse.Namespace

    Returns
    -------
    list of dict
        :func:`system_spec` dicts.
    """
    trees = workload in ("treelstm", "batchsize")
    specs = []
    if workload != "batchsize" and not args.no_eager:
        specs.append(system_spec("eager", "eager Gluon (one sample at a time)"))
    configs = [DEFAULT_CONFIG] if workload == "batchsize" else args.configs
    for encoder in (args.encoders if trees else [None]):
        for config in configs:
            specs.append(system_spec("gdb", gdb_label(config, encoder),
                                     config=config, encoder=encoder))
    if trees and not args.no_hand:
        if workload == "treelstm":
            specs.append(system_spec(
                "hand", "hand-batched MXNet, dense embedding gradient"))
        specs.append(system_spec(
            "hand-sparse", "hand-batched MXNet, sparse embedding gradient, "
            "lazy Adam (like-for-like limit)"))
    if workload != "sick" and not args.skip_dynet:
        for autobatch in ((1,) if workload == "batchsize" else (0, 1)):
            specs.append(system_spec("dynet", "DyNet autobatch=%d" % autobatch,
                                     side="dynet", autobatch=autobatch))
    return specs


class Entry:
    """One system's state in the driver during a workload.

    Parameters
    ----------
    spec : dict
        From :func:`system_spec`.
    worker : WorkerProcess or None
        The process that runs it.
    """

    def __init__(self, spec, worker=None):
        self.spec = spec
        self.key = spec["key"]
        self.worker = worker
        self.failure = None       # why it failed (setup, warm-up or a round)
        self.skipped = False      # failure is "not installed", not an error
        self.reset()

    def reset(self):
        """Forget the timed blocks (a new mode or batch size)."""
        self.warmup = None
        self.blocks = []
        self.seconds = 0.0
        self.cut = False

    @property
    def alive(self):
        """Still to be timed."""
        return self.failure is None


def time_in_rounds(entries, total, block, run, timeout=None, progress=None):
    """Time ``total`` batches of every entry in rounds of ``block`` batches.

    Round ``r`` runs batches ``r * block`` to ``(r + 1) * block - 1`` of
    every entry, one entry after another in the order of
    ``benchlib.rotation(entries, r)``.  An entry whose ``run`` raises drops out there
    (``failure``), the others go on; an entry that has spent more than
    ``timeout`` seconds in timed blocks gets no more rounds (``cut``), after
    at least one block.

    Parameters
    ----------
    entries : list of Entry
    total : int
        Timed batches per entry.
    block : int
        Batches per entry and round.
    run : callable
        ``run(entry, first, count) -> dict`` with at least ``block_ms``;
        appended to ``entry.blocks``.
    timeout : float, optional
    progress : tqdm, optional
        Advanced by one per block.
    """
    starts = list(range(0, total, block))
    for r, entry in benchlib.interleaved(entries, len(starts)):
        first = starts[r]
        if progress is not None:
            progress.update(1)
        if not entry.alive or entry.cut:
            continue
        if timeout is not None and entry.blocks and entry.seconds > timeout:
            entry.cut = True
            LOG.warning("%s: no more rounds after %d timed batches "
                        "(--system-timeout %.0f s)", entry.spec["label"],
                        first, timeout)
            continue
        try:
            result = run(entry, first, min(block, total - first))
        except Exception as err:  # pylint: disable=broad-except
            entry.failure = "failed in round %d: %s" % (r + 1, err)
            LOG.error("%s %s", entry.spec["label"], entry.failure)
            continue
        entry.blocks.append(result)
        entry.seconds += result["block_ms"] / 1000.0


def summarize(entry, each):
    """A mode's figures of one entry (its warm-up and timed blocks).

    Parameters
    ----------
    entry : Entry
    each : bool
        Whether batches were timed one by one (else per block).

    Returns
    -------
    dict
        ``sentences_per_s`` (median over batches, or over blocks, of
        sentences/s), ``median_ms`` (per batch), ``mean_sentences_per_s``
        (all sentences over all timed time), ``batches``, ``rounds``,
        ``timing`` ("batch" or "block"), ``cut``, ``losses`` (warm-up first)
        and medians (ms) or sums (counts) of the gluon_dynbatch figures.
    """
    blocks = entry.blocks
    sentences = [n for b in blocks for n in b["sentences"]]
    if each:
        times = [ms for b in blocks for ms in b["batch_ms"]]
        rates = [1000.0 * n / ms for n, ms in zip(sentences, times)]
        per_batch = times
    else:
        times = [b["block_ms"] for b in blocks]
        rates = [1000.0 * sum(b["sentences"]) / b["block_ms"] for b in blocks]
        per_batch = [b["block_ms"] / len(b["sentences"]) for b in blocks]
    losses = list((entry.warmup or {}).get("losses", []))
    losses += [x for b in blocks for x in b["losses"]]
    res = {"sentences_per_s": statistics.median(rates),
           "median_ms": statistics.median(per_batch),
           "mean_sentences_per_s": 1000.0 * sum(sentences) / sum(times),
           "batches": len(sentences), "rounds": len(blocks),
           "timing": "batch" if each else "block", "cut": entry.cut,
           "warmup_batches": len((entry.warmup or {}).get("losses", [])),
           "losses": losses}
    stats = [s for b in blocks for s in b["stats"]]
    if stats:
        res["stats"] = summarize_stats(stats)
    return res


# --------------------------------------------------------------------------
# Worker processes (driver side)
# --------------------------------------------------------------------------

class WorkerError(RuntimeError):
    """A worker failed a request, exited or did not answer.

    ``skipped`` is True when the worker's framework is not installed.
    """

    def __init__(self, message, skipped=False):
        super().__init__(message)
        self.skipped = skipped


class WorkerProcess:
    """A worker process and the pipe to it, seen from the driver.

    Parameters
    ----------
    side : {"gluon", "dynet"}
    name : str
        For messages.
    threads : int or None
        ``--threads`` of the run.
    seed : int
    autobatch : int, optional
        DyNet's setting (set before dynet is imported).
    verbose : bool, optional
    """

    def __init__(self, side, name, threads, seed, autobatch=None,
                 verbose=False):
        self.side, self.name = side, name
        cmd = [sys.executable, str(WORKER), side, "--seed", str(seed)]
        if threads:
            cmd += ["--threads", str(threads)]
        if autobatch is not None:
            cmd += ["--autobatch", str(autobatch)]
        if verbose:
            cmd.append("--verbose")
        self.proc = subprocess.Popen(cmd, cwd=str(ROOT), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     bufsize=1)
        self.pid = self.proc.pid
        self.hosted = 0           # systems it runs

    def send(self, cmd, **kwargs):
        """Send one request (answer with :meth:`receive`)."""
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, "args": kwargs})
                                  + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._exited() from None

    def receive(self, timeout=None):
        """The answer to the last request; :class:`WorkerError` on failure."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise WorkerError("%s: no answer within %.0f s"
                              % (self.name, timeout))
        line = self.proc.stdout.readline()
        if not line:
            raise self._exited()
        reply = json.loads(line)
        if not reply.get("ok"):
            raise WorkerError("%s: %s" % (self.name, reply.get("error")))
        return reply.get("result")

    def call(self, cmd, timeout=None, **kwargs):
        """Send a request and wait for its answer."""
        self.send(cmd, **kwargs)
        return self.receive(timeout)

    def _exited(self):
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            return WorkerError("%s: pipe closed" % self.name)
        if code == DYNET_MISSING and self.side == "dynet":
            return WorkerError(DYNET_SKIP, skipped=True)
        return WorkerError("%s: worker exited with status %d"
                           % (self.name, code))

    def close(self):
        """Ask the worker to quit; kill it if it does not."""
        if self.proc.poll() is None:
            try:
                self.call("quit", timeout=30)
            except (WorkerError, OSError, ValueError):
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for handle in (self.proc.stdin, self.proc.stdout):
            try:
                handle.close()
            except OSError:
                pass


GLUON_WORKER_GB, DYNET_WORKER_GB = 0.55, 1.2
"""Peak resident memory of a worker at treelstm 256/256 (measured; rough)."""


def available_gb():
    """MemAvailable of /proc/meminfo in GB, None where unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024.0 ** 2
    except OSError:
        pass
    return None


def warn_about_memory(specs, args):
    """Warn when the workers of ``specs`` may not fit in memory."""
    gluon = sum(s["side"] == "gluon" for s in specs)
    dynet = len(specs) - gluon
    if args.gluon_processes == "shared":     # one process, a model per system
        gluon = min(gluon, 1) + 0.1 * gluon
    need = gluon * GLUON_WORKER_GB + dynet * DYNET_WORKER_GB
    have = available_gb()
    if have is not None and need > 0.8 * have:
        LOG.warning("%d workers may need about %.1f GB, %.1f GB available: "
                    "consider --gluon-processes shared or fewer --configs",
                    len(specs), need, have)


def start_workers(specs, args):
    """Start the worker processes of ``specs``; one :class:`Entry` each.

    A Gluon system gets a process of its own, or, with ``--gluon-processes
    shared``, the one Gluon process of the workload; a DyNet setting always
    gets its own.
    """
    warn_about_memory(specs, args)
    entries, shared = [], None
    for spec in specs:
        if spec["side"] == "dynet":
            worker = WorkerProcess("dynet", spec["label"], args.threads,
                                   args.seed, spec["autobatch"], args.verbose)
        elif args.gluon_processes == "shared":
            if shared is None:
                shared = WorkerProcess("gluon", "Gluon worker", args.threads,
                                       args.seed, verbose=args.verbose)
            worker = shared
        else:
            worker = WorkerProcess("gluon", spec["label"], args.threads,
                                   args.seed, verbose=args.verbose)
        worker.hosted += 1
        entries.append(Entry(spec, worker))
    return entries


def _fail(entries, err):
    """Mark ``entries`` as failed (or skipped) by ``err``."""
    for entry in entries:
        entry.failure = str(err)
        entry.skipped = getattr(err, "skipped", False)
        if not entry.skipped:
            LOG.error("%s: %s", entry.spec["label"], err)


def _by_worker(entries):
    """``{worker: [entries]}`` of the living entries, in order."""
    groups = {}
    for entry in entries:
        if entry.alive:
            groups.setdefault(entry.worker, []).append(entry)
    return groups


def setup_workers(entries, job):
    """Send ``setup`` to every worker: Gluon ones first, then DyNet ones.

    When the workload has DyNet systems, the first Gluon system exports the
    initial weights to ``job["weights"]`` for them. Workers of one side set
    up in parallel.
    """
    weights = None
    if any(e.spec["side"] == "dynet" for e in entries):
        weights = job["weights"]
    for side in ("gluon", "dynet"):
        groups = {w: es for w, es in _by_worker(entries).items()
                  if w.side == side}
        if side == "dynet" and groups and not os.path.isfile(job["weights"]):
            _fail([e for es in groups.values() for e in es],
                  WorkerError("no initial weights (the Gluon side failed)"))
            continue
        sent = []
        for worker, group in groups.items():
            specs = [e.spec for e in group]
            if side == "gluon" and not sent and weights:
                specs[0] = dict(specs[0], weights_out=weights)
            try:
                worker.send("setup", job=job, specs=specs)
                sent.append((worker, group))
            except WorkerError as err:
                _fail(group, err)
        for worker, group in sent:
            try:
                worker.receive(SETUP_TIMEOUT)
            except WorkerError as err:
                _fail(group, err)


def run_phase(entries, mode, size, batches, args, progress_label):
    """Warm up then time every living entry in rounds; their summaries.

    Returns
    -------
    dict
        key -> :func:`summarize` result (systems that failed are absent).
    """
    each = mode == "train" and not args.train_back_to_back
    timeout = args.worker_timeout
    for entry in entries:
        entry.reset()
        if not entry.alive:
            continue
        try:
            entry.warmup = entry.worker.call(
                "prepare", timeout, key=entry.key, mode=mode, size=size,
                warmup=args.warmup)
        except WorkerError as err:
            _fail([entry], "warm-up failed: %s" % err)

    def run(entry, _first, count):
        return entry.worker.call("run", timeout, key=entry.key, count=count,
                                 each=each)

    living = [e for e in entries if e.alive]
    rounds = math.ceil(batches / args.round_batches)
    with tqdm(total=rounds * len(living), desc=progress_label, leave=False,
              unit="block", disable=None) as bar:
        time_in_rounds(living, batches, args.round_batches, run,
                       args.system_timeout, bar)
    out = {}
    for entry in living:
        if entry.alive and entry.blocks:
            res = summarize(entry, each)
            res.update(key=entry.key, mode=mode, size=size)
            out[entry.key] = res
            LOG.info("%s, %s: %.1f sentences/s (%s)", entry.spec["label"],
                     mode, res["sentences_per_s"], progress_label)
    return out


def worker_envs(entries):
    """``env`` of every worker still running: key -> dict."""
    envs, seen = {}, {}
    for entry in entries:
        worker = entry.worker
        if worker not in seen:
            try:
                seen[worker] = worker.call("env", timeout=60) \
                    if worker.proc.poll() is None else None
            except WorkerError:
                seen[worker] = None
        if seen[worker] is not None:
            envs[entry.key] = dict(seen[worker], pid=worker.pid,
                                   hosted=worker.hosted)
    return envs


def run_workload(name, workload, job, sizes, args, work_dir):
    """Every system of one workload, both modes, every batch size.

    Parameters
    ----------
    name : str
        Label, e.g. ``"treelstm 128/128"``.
    workload : str
    job : dict
        Data, sizes and seed (see :func:`base_job`).
    sizes : list of tuple
        ``(trees per batch, timed batches)`` pairs.
    args : argparse.Namespace
    work_dir : str

    Returns
    -------
    dict
        ``specs``, ``results`` (key -> mode -> size -> summary), ``failures``
        (key -> text), ``skipped`` (keys), ``envs`` (key -> process facts).
    """
    specs = workload_systems(workload, args)
    job = dict(job, weights=os.path.join(
        work_dir, name.replace(" ", "_").replace("/", "x") + ".npz"))
    LOG.info("%s: starting %d systems (load average %s)", name, len(specs),
             load_average())
    LOADS.append(load_average())
    entries = start_workers(specs, args)
    results = {}
    try:
        setup_workers(entries, job)
        for mode in MODES:
            for size, batches in sizes:
                label = "%s %s%s" % (name, mode, "" if len(sizes) == 1
                                     else " size %d" % size)
                for key, res in run_phase(entries, mode, size, batches, args,
                                          label).items():
                    results.setdefault(key, {}).setdefault(mode, {})[size] = res
        envs = worker_envs(entries)
        profiles = []
        if workload == "treelstm" and args.profile and job.get("profile"):
            profiles = profile_systems(entries, args)
    finally:
        for worker in {e.worker for e in entries}:
            worker.close()
    return {"specs": specs, "results": results, "envs": envs,
            "profiles": profiles,
            "failures": {e.key: e.failure for e in entries
                         if e.failure and not e.skipped},
            "skipped": [e.key for e in entries if e.skipped]}


def profile_systems(entries, args):
    """``profile`` of each encoder's default gluon_dynbatch system."""
    out = []
    for entry in entries:
        spec = entry.spec
        if spec["kind"] != "gdb" or spec["config"] != DEFAULT_CONFIG \
                or not entry.alive:
            continue
        try:
            out.append(entry.worker.call("profile", args.worker_timeout,
                                         key=entry.key))
        except WorkerError as err:
            LOG.error("profile of %s failed: %s", spec["label"], err)
    return out


# --------------------------------------------------------------------------
# The command line and the run
# --------------------------------------------------------------------------

def parse_args(argv=None):
    """Parse the command line (see ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Training and inference throughput (sentences/s) of "
                    "gluon_dynbatch against eager Gluon, hand-batched MXNet "
                    "and DyNet with and without autobatching, every system "
                    "in its own process, timed in interleaved rounds.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--workloads", default=",".join(WORKLOADS),
        help="comma list of %s" % ", ".join(WORKLOADS))
    add("--dims", default="128/128,256/256",
        help="embedding/hidden sizes of the treelstm workload, comma list")
    add("--sizes", default="1,4,16,64,256",
        help="trees per batch of the batch-size sweep (treelstm at 128/128)")
    add("--batches", type=int, default=10,
        help="timed batches per system and mode, eager included (the sweep "
             "scales this by size)")
    add("--warmup", type=int, default=2,
        help="untimed batches per system before the timed ones")
    add("--round-batches", type=int, default=5,
        help="timed batches of one system in a row; the systems take turns "
             "in rounds of this many batches")
    add("--configs", default=",".join(ALL_CONFIGS),
        help="gluon_dynbatch settings, strategy:mode with mode "
             "imperative|step|compiled; the default %s is always run"
             % DEFAULT_CONFIG)
    add("--encoders", default=",".join(ENCODERS),
        help="SST encoders run by gluon_dynbatch: cell (BinaryTreeLSTM, "
             "child-block cells), op (OpByOpBinaryTreeLSTM, operators one "
             "by one)")
    add("--threads", type=int, default=None,
        help="threads (and cores, by affinity) of every worker; default: "
             "the machine's defaults")
    add("--gluon-processes", choices=("system", "shared"), default="system",
        help="a worker process per Gluon system, or one shared by the "
             "Gluon systems of a workload (less memory)")
    add("--train-back-to-back", action="store_true",
        help="time training like inference: a round's batches back to back, "
             "one wait at the end (default: wait and time every batch)")
    add("--quick", action="store_true",
        help="smoke run: 2 timed batches in rounds of 1, 1 warm-up, first "
             "1000 trees, sizes 1,4,16")
    add("--skip-dynet", action="store_true", help="do not run DyNet")
    add("--no-hand", action="store_true",
        help="do not run the hand-batched MXNet Tree-LSTMs "
             "(scripts/handbatched_sst.py)")
    add("--no-eager", action="store_true", help="do not run eager Gluon")
    add("--profile", action="store_true",
        help="also print where gluon_dynbatch's time goes for one treelstm "
             "batch (first --dims pair, default setting, each encoder): "
             "phases, scope.stats, top operators (mx.profiler) and top "
             "Python functions (cProfile)")
    add("--tree-batch", type=int, default=TREE_BATCH,
        help="trees per batch of treelstm and sick (sick: half as pairs)")
    add("--tagger-batch", type=int, default=TAGGER_BATCH,
        help="sentences per batch of the tagger")
    add("--tagger-dims", default="%d/%d" % TAGGER_DIMS,
        help="embedding/hidden sizes of the tagger")
    add("--max-trees", type=int, default=None,
        help="use only the first N SST train trees (N/2 SICK pairs)")
    add("--system-timeout", type=float, default=300.0,
        help="seconds of timed batches after which a system gets no more "
             "rounds in a mode")
    add("--worker-timeout", type=float, default=1800.0,
        help="seconds a worker may take to answer one request")
    add("--data-dir", default=None,
        help="SST folder (default: ../shared/data/sst from the repo root)")
    add("--sick-dir", default=None,
        help="SICK folder (default: ../shared/data/sick)")
    add("--seed", type=int, default=1, help="weights and batch order")
    add("--out-dir", default="results/dynet",
        help="where CSV, Markdown, JSON and PNG go")
    add("--verbose", action="store_true", help="debug logging")
    benchlib.add_record_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.quick_settings = quick_settings(args, parser) if args.quick else {}
    benchlib.apply_quick(args, args.quick_settings)
    try:
        args.workloads = _names(args.workloads, WORKLOADS)
        args.encoders = _names(args.encoders, ENCODERS)
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
    if min(args.sizes or [1]) < 1 or args.batches < 1 or args.warmup < 0 \
            or args.round_batches < 1:
        parser.error("--sizes, --batches and --round-batches must be "
                     "positive, --warmup >= 0")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be positive")
    return args


def quick_settings(args, parser):
    """What ``--quick`` changes: 2 timed batches in rounds of 1, 1 warm-up, the
    first 1000 trees, sizes 1,4,16 (each unless the command line asks for less)."""
    out = {"batches": min(args.batches, 2), "warmup": min(args.warmup, 1),
           "round_batches": 1}
    if args.max_trees is None:
        out["max_trees"] = 1000
    if args.sizes == parser.get_default("sizes"):
        out["sizes"] = "1,4,16"
    return out


def _names(text, known):
    """Comma list of names, each one of ``known``."""
    names = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in names if w not in known]
    if bad or not names:
        raise ValueError("unknown or no name(s) %s; choose from %s"
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


LOADS = []
"""1-minute load averages seen at the start of each workload of this run."""


def load_average():
    """The 1-minute load average as text ('?' where unknown)."""
    loads = benchlib.load_average()
    return "?" if loads is None else "%.1f" % loads[0]


def base_job(args, workload, dims, batch_size, data_dir):
    """What every worker of a workload needs to build its systems."""
    return {"workload": workload, "seed": args.seed, "embed": dims[0],
            "hidden": dims[1], "batch_size": batch_size,
            "data_dir": str(data_dir), "max_trees": args.max_trees}


def dynet_available():
    """True when ``dynet_config`` and ``dynet`` can be found."""
    return all(importlib.util.find_spec(m) is not None
               for m in ("dynet_config", "dynet"))


def plan_workloads(args, notes):
    """``(name, workload, job, sizes)`` of every workload to run."""
    plan = []
    if args.data_dir is not None:
        for dims in (args.dims if "treelstm" in args.workloads else []):
            job = base_job(args, "treelstm", dims, args.tree_batch,
                           args.data_dir)
            job["profile"] = dims == args.dims[0]
            plan.append(("treelstm %d/%d" % dims, "treelstm", job,
                         [(args.tree_batch, args.batches)]))
        if "tagger" in args.workloads:
            job = base_job(args, "tagger", args.tagger_dims, args.tagger_batch,
                           args.data_dir)
            plan.append(("tagger %d/%d" % args.tagger_dims, "tagger", job,
                         [(args.tagger_batch, args.batches)]))
    if "sick" in args.workloads:
        sick_dir = args.sick_dir
        if sick_dir is None:
            from examples.sick_data import default_data_dir  # noqa  pylint: disable=import-outside-toplevel
            sick_dir = default_data_dir()
        if sick_dir is None or not (Path(sick_dir) / "train").is_dir():
            notes.append("sick: SICK train not found (expected "
                         "../shared/data/sick or --sick-dir): skipped")
        else:
            job = base_job(args, "sick", (SICK_INPUT, SICK_HIDDEN),
                           args.tree_batch // 2, sick_dir)
            plan.append(("sick %d/%d" % (SICK_INPUT, SICK_HIDDEN), "sick", job,
                         [(args.tree_batch // 2, args.batches)]))
            notes.append("sick: no DyNet version (eager Gluon vs "
                         "gluon_dynbatch only); sentences = trees, 2 a pair")
    if "batchsize" in args.workloads and args.data_dir is not None:
        job = base_job(args, "batchsize", SWEEP_DIMS, args.tree_batch,
                       args.data_dir)
        sizes = [(s, sweep_batches(args.batches, s, args.quick))
                 for s in args.sizes]
        plan.append(("batchsize", "batchsize", job, sizes))
    return plan


def settings_of(args):
    """The run's settings, for the record."""
    keep = ("workloads", "dims", "sizes", "batches", "warmup", "round_batches", "configs",
            "encoders", "threads", "gluon_processes", "train_back_to_back", "tree_batch",
            "tagger_batch", "tagger_dims", "max_trees", "seed", "skip_dynet",
            "no_hand", "no_eager")
    return dict({key: getattr(args, key) for key in keep}, quick=args.quick_settings)


def orchestrate(args):
    """Run every workload, write the outputs and the record; return the report dict."""
    from examples.sst_data import default_sst_dir  # noqa  pylint: disable=import-outside-toplevel
    record = benchlib.start_record("dynet_race", SCRIPT, args.argv, settings_of(args))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="bench_dynet_")
    load_start = load_average()
    args.data_dir = args.data_dir or default_sst_dir()
    notes = []
    if args.skip_dynet:
        notes.append("DyNet: skipped (--skip-dynet)")
    elif not dynet_available():
        notes.append("DyNet: " + DYNET_SKIP)
        LOG.warning("DyNet: %s", DYNET_SKIP)
    needs_sst = {"treelstm", "tagger", "batchsize"} & set(args.workloads)
    if needs_sst and args.data_dir is None:
        message = ("SST not found (expected ../shared/data/sst or "
                   "--data-dir): skipped %s" % ", ".join(sorted(needs_sst)))
        LOG.warning(message)
        notes.append(message)
    runs = {}
    try:
        for name, workload, job, sizes in plan_workloads(args, notes):
            runs[name] = run_workload(name, workload, job, sizes, args, work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)     # the exported weights
    report = report_mod.build_report(runs, args, notes, {
        "load_start": load_start, "load_end": load_average(),
        "workload_loads": list(LOADS)})
    report_mod.write_outputs(out_dir, report)
    print(report_mod.markdown(report))
    benchlib.save_if_asked(args, "dynet_race", SCRIPT, args.argv, settings_of(args),
                           report_mod.record_tables(report), notes=report["notes"],
                           record=record)
    return report


def main(argv=None):
    """Run the benchmark; return the report dict."""
    args = parse_args(argv)
    setup_logging(args.verbose)
    started = time.perf_counter()
    report = orchestrate(args)
    LOG.info("done in %.0f s", time.perf_counter() - started)
    return report


if __name__ == "__main__":
    main()
