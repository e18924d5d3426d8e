#!/usr/bin/env python
"""A worker process of ``scripts/bench_dynet.py``: runs systems on request.

Started by the driver as::

    python scripts/bench_dynet_worker.py gluon|dynet [--threads N]
        [--autobatch 0|1] [--seed S]

Before anything else the worker moves its stdout to stderr (keeping a
private copy of the pipe for its answers), applies ``--threads`` (thread
variables and CPU affinity) and imports mxnet, or configures and imports
dynet. Then it reads requests from stdin, one JSON object per line
(``{"cmd": ..., "args": {...}}``), and answers each with one line
(``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``):

``setup(job, specs)``
    Load the data and build one model per system of ``specs`` (a Gluon
    worker may host several); a spec with ``weights_out`` writes the initial
    weights there (a DyNet worker loads them from ``job["weights"]``).
``prepare(key, mode, size, warmup)``
    Initial weights, a fresh optimiser and block, a batch stream of ``size``
    from its start, ``warmup`` untimed batches.
``run(key, count, each)``
    The next ``count`` batches, timed (see ``bench_dynet_common.run_block``).
``profile(key)``, ``env()``, ``quit()``.

A DyNet worker that cannot import dynet exits with status
``bench_dynet_common.DYNET_MISSING``.
"""
import argparse
import gc
import io
import json
import logging
import os
import re
import resource
import sys
import tempfile
import time
import traceback
import types

from bench_dynet_common import (DYNET_MISSING, DYNET_SKIP, ROOT, THREAD_VARS,  # noqa: E402
                         apply_threads, batch_stream, load_sst_trees, os_threads,
                         parse_config, run_block, summarize_stats, tagged_sentences)
import benchlib  # noqa: E402
from examples.progress_logging import setup_logging  # noqa: E402

LOG = logging.getLogger("bench_dynet_worker")
SICK_LR, SICK_WD = 0.05, 1e-4
_TREES = {}


def cached_trees(data_dir, max_trees):
    """:func:`bench_dynet_common.load_sst_trees`, loaded once per process."""
    key = (data_dir, max_trees)
    if key not in _TREES:
        _TREES[key] = load_sst_trees(data_dir, max_trees)
    return _TREES[key]


# --------------------------------------------------------------------------
# Gluon tasks: data, model, optimiser and loss of a workload
# --------------------------------------------------------------------------

def gluon_modules():
    """mxnet, gluon_dynbatch and the models (after the thread settings)."""
    # pylint: disable=import-outside-toplevel
    import mxnet as mx
    import gluon_dynbatch as gdb
    import handbatched_sst
    from examples import bilstm_tagger, sick_data, sick_model, sst_model
    return types.SimpleNamespace(mx=mx, gdb=gdb, sst=sst_model,
                                 tagger=bilstm_tagger, sick_data=sick_data,
                                 sick_model=sick_model, hand=handbatched_sst)


class GluonTask:
    """One system's model of a workload: data, Parameters, trainer, loss.

    Subclasses set ``self.params`` (a ParameterDict of everything trained),
    ``self.items`` (what batches are drawn from), and implement
    :meth:`block_for` and :meth:`loss`.

    Parameters
    ----------
    mods : types.SimpleNamespace
        From :func:`gluon_modules`.
    job : dict
        The workload (``bench_dynet.base_job``).
    spec : dict
        The system (``bench_dynet.system_spec``).
    """

    def __init__(self, mods, job, spec):
        self.mods, self.mx, self.gdb = mods, mods.mx, mods.gdb
        self.job, self.spec = job, spec
        self.seed = job["seed"]
        self.params = None
        self.initial = None
        self.trainer = None
        self.items = None

    def remember_weights(self):
        """Keep the initial weights, restored by :meth:`reset`."""
        self.initial = {name: p.data().copy()
                        for name, p in self.params.items()}

    def reset(self):
        """Initial weights, zero gradients, a fresh optimiser."""
        for name, param in self.params.items():
            param.set_data(self.initial[name])
        self.params.zero_grad()
        self.trainer = self.make_trainer()

    def make_trainer(self):
        """A new gluon.Trainer over ``self.params`` (Adam)."""
        return self.mx.gluon.Trainer(self.params, "adam")

    def export_weights(self, path):
        """Write the initial weights for the DyNet side."""
        raise NotImplementedError("%s has no DyNet side" % type(self).__name__)

    def block_for(self):
        """What :meth:`loss` calls: the model's block for eager, else a fresh
        block (empty caches) on the same Parameters."""
        raise NotImplementedError

    def loss(self, block, batch):
        """Forward: ``(loss NDArray, stats dict or None)``."""
        raise NotImplementedError

    def count(self, batch):
        """Sentences in ``batch``."""
        return len(batch)

    def scale(self, batch):
        """Argument of ``trainer.step``."""
        return 1

    def _scoped(self, block, args_list, extra):
        """Call ``block`` on every argument tuple, batched unless eager."""
        config = self.spec.get("config")
        if config is None:
            return [block(*args, *extra) for args in args_list], None
        with self.gdb.batching(**parse_config(config)) as scope:
            outs = [block(*args, *extra) for args in args_list]
        return outs, scope.stats.as_dict()

    def stepper(self, train, block):
        """``step(batch) -> (loss NDArray, stats)``, training or inference.

        Neither step waits for MXNet: the caller decides where to wait.
        """
        mx = self.mx

        def train_step(batch):
            with mx.autograd.record():
                loss, stats = self.loss(block, batch)
            loss.backward()
            self.trainer.step(self.scale(batch))
            return loss, stats

        def infer_step(batch):
            return self.loss(block, batch)

        return train_step if train else infer_step


class TreeTask(GluonTask):
    """Binary Tree-LSTM on SST (``examples/sst_model.py``) and its hand-batched
    forms (``scripts/handbatched_sst.py``)."""

    def __init__(self, mods, job, spec):
        super().__init__(mods, job, spec)
        self.sst = mods.sst
        self.items, self.vocab = cached_trees(job["data_dir"], job.get("max_trees"))
        self.model = self.sst.make_model(len(self.vocab), job["embed"],
                                         job["hidden"], seed=self.seed)
        self.table = None
        self.params = self.model.collect_params()
        if spec["kind"] == "hand-sparse":
            self.table = mods.hand.sparse_embedding(self.model.embedding.data())
            self.params = self.model.tree_lstm.collect_params()
            self.params.update(self.table.collect_params())
        self.remember_weights()

    def export_weights(self, path):
        self.sst.save_weights(self.model, path, self.vocab)

    def make_trainer(self):
        if self.table is not None:      # DyNet's rule: only the rows used move
            return self.mx.gluon.Trainer(self.params, "adam", {"lazy_update": True})
        return super().make_trainer()

    def block_for(self):
        kind, base = self.spec["kind"], self.model.tree_lstm
        if kind == "eager":
            return base
        if kind in ("hand", "hand-sparse"):
            return self.mods.hand.HandBatchedSST(base, self.job["hidden"], 5,
                                                 self.mx.cpu(), embedding=self.table)
        cls = self.sst.ENCODERS[self.spec["encoder"]]
        block = cls(self.job["embed"], self.job["hidden"], prefix=base.prefix,
                    params=base.collect_params())
        if block.out_weight is not base.out_weight:
            raise RuntimeError("fresh Tree-LSTM block does not share weights")
        return block

    def loss(self, block, batch):
        kind = self.spec["kind"]
        if kind == "hand-sparse":
            return block(batch), None
        emb = self.model.embedding.data()
        if kind == "hand":
            return block(batch, emb), None
        outs, stats = self._scoped(block, [(t,) for t in batch], (emb,))
        return self.sst.sst_loss(outs, batch), stats


class TaggerTask(GluonTask):
    """BiLSTM tagger (``examples/bilstm_tagger.py``)."""

    def __init__(self, mods, job, spec):
        super().__init__(mods, job, spec)
        self.tag = mods.tagger
        trees, vocab = cached_trees(job["data_dir"], job.get("max_trees"))
        self.items = tagged_sentences(trees)
        self.model = self.tag.make_model(len(vocab), job["embed"],
                                         job["hidden"], seed=self.seed)
        self.params = self.model.collect_params()
        self.remember_weights()

    def export_weights(self, path):
        import numpy as np  # pylint: disable=import-outside-toplevel
        np.savez(path, **self.tag.dynet_weights(self.tag.get_weights(self.model)))

    def block_for(self):
        base = self.model.tagger
        if self.spec["kind"] == "eager":
            return base
        block = self.tag.BiLSTMTagger(self.job["embed"], self.job["hidden"],
                                      prefix=base.prefix,
                                      params=base.collect_params())
        if block.forward_cell.h_weight is not base.forward_cell.h_weight:
            raise RuntimeError("fresh tagger block does not share weights")
        return block

    def loss(self, block, batch):
        emb = self.model.embedding.data()
        outs, stats = self._scoped(block, [(ids,) for ids, _ in batch], (emb,))
        return self.tag.tagger_loss(outs, [tags for _, tags in batch]), stats


class SickTask(GluonTask):
    """SICK Child-Sum Tree-LSTM (``examples/sick_model.py``); 2 trees a pair."""

    def __init__(self, mods, job, spec):
        super().__init__(mods, job, spec)
        mx = self.mx
        self.data, self.model_mod = mods.sick_data, mods.sick_model
        pairs = self.data.load_split(job["data_dir"], "train")
        if job.get("max_trees"):
            pairs = pairs[:max(1, job["max_trees"] // 2)]
        vocab_size = benchlib.number_sick_words(pairs)
        self.items = pairs
        mx.random.seed(self.seed)
        self.encoder = self.model_mod.ChildSumTreeLSTM(job["hidden"], job["embed"])
        self.head = self.model_mod.SimilarityHead(job["hidden"])
        self.encoder.initialize(mx.init.Xavier())
        self.head.initialize(mx.init.Xavier())
        self.embeddings = mx.nd.random.uniform(-0.05, 0.05,
                                               shape=(vocab_size, job["embed"]))
        self.loss_fn = self.model_mod.make_loss()
        self.params = self.encoder.collect_params()
        self.params.update(self.head.collect_params())
        self.remember_weights()

    def make_trainer(self):
        return self.mx.gluon.Trainer(self.params, "adagrad", {
            "learning_rate": SICK_LR, "wd": SICK_WD})

    def block_for(self):
        if self.spec["kind"] == "eager":
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

    def loss(self, block, batch):
        nd = self.mx.nd
        trees = [p.a_tree for p in batch] + [p.b_tree for p in batch]
        outs, stats = self._scoped(block, [(t,) for t in trees], (self.embeddings,))
        roots = nd.concat(*[h for h, _ in outs], dim=0)
        n = len(batch)
        log_probs = self.head(nd.slice_axis(roots, axis=0, begin=0, end=n),
                              nd.slice_axis(roots, axis=0, begin=n, end=2 * n))
        return self.loss_fn(log_probs, self.model_mod.batch_targets(batch)), stats


TASKS = {"treelstm": TreeTask, "batchsize": TreeTask, "tagger": TaggerTask,
         "sick": SickTask}


# --------------------------------------------------------------------------
# Runners: one system inside a worker
# --------------------------------------------------------------------------

class Runner:
    """Prepares a mode of one system and runs its timed blocks.

    Subclasses implement :meth:`start` and set ``sync`` and ``value``.
    """

    sync = staticmethod(lambda: None)
    value = staticmethod(float)

    def __init__(self, spec, seed):
        self.spec, self.seed = spec, seed
        self.step = self.stream = None
        self.count = len

    def start(self, train, size):
        """Fresh state for a mode; return ``(step, stream)``."""
        raise NotImplementedError

    def prepare(self, mode, size, warmup):
        """Start ``mode`` at batch size ``size`` and run ``warmup`` batches."""
        self.step, self.stream = self.start(mode == "train", size)
        began = time.perf_counter()
        out = run_block(self.step, [next(self.stream) for _ in range(warmup)],
                        self.sync, True, self.value, self.count)
        return {"losses": out["losses"], "seconds": time.perf_counter() - began}

    def run(self, count, each):
        """The next ``count`` batches of the stream, timed."""
        batches = [next(self.stream) for _ in range(count)]
        gc.collect()        # no system pays for garbage left before its turn
        return run_block(self.step, batches, self.sync, each, self.value,
                         self.count)


class GluonRunner(Runner):
    """A Gluon system: eager, gluon_dynbatch or hand-batched."""

    def __init__(self, mods, job, spec):
        super().__init__(spec, job["seed"])
        self.task = TASKS[job["workload"]](mods, job, spec)
        self.sync = mods.mx.nd.waitall
        self.value = lambda loss: float(loss.asnumpy().sum())
        self.count = self.task.count
        self.block = None

    def start(self, train, size):
        self.task.reset()
        self.block = self.task.block_for()
        return (self.task.stepper(train, self.block),
                batch_stream(self.task.items, size, self.seed))


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

    def __init__(self, dy, vocab_size, embed, hidden, weights=None, num_tags=5):
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


class DyNetRunner(Runner):
    """A DyNet system: the Tree-LSTM or the tagger, one autobatch setting."""

    def __init__(self, dy, job, spec):
        super().__init__(spec, job["seed"])
        import numpy as np  # pylint: disable=import-outside-toplevel
        self.dy = dy
        trees, vocab = cached_trees(job["data_dir"], job.get("max_trees"))
        with np.load(job["weights"]) as data:
            self.weights = {name: data[name].astype(np.float32)
                            for name in data.files if name != "vocab"}
            if "vocab" in data.files and list(data["vocab"]) != sorted(vocab, key=vocab.get):
                raise ValueError("the weights' vocabulary differs from the "
                                 "trees' vocabulary")
        if job["workload"] == "tagger":
            self.items = tagged_sentences(trees)
            self.model = DyNetTagger(dy, len(vocab), job["embed"], job["hidden"],
                                     self.weights)
            self.fresh = lambda: self.model.set_weights(self.weights)
        else:
            import dynet_treelstm  # pylint: disable=import-outside-toplevel
            self.items = trees
            self.model = dynet_treelstm.DyNetTreeLSTM(dy, len(vocab), job["embed"],
                                                      job["hidden"], self.weights)
            shapes = dynet_treelstm.expected_shapes(len(vocab), job["embed"],
                                                    job["hidden"])
            self.fresh = lambda: self.model.set_weights(self.weights, shapes)

    def start(self, train, size):
        self.fresh()
        trainer = None
        if train:
            trainer = self.dy.AdamTrainer(self.model.pc)
            trainer.set_clip_threshold(0.0)

        def step(batch):
            loss = self.model.batch_loss(batch)
            value = loss.value()
            if trainer is not None:
                loss.backward()
                trainer.update()
            return value, None

        return step, batch_stream(self.items, size, self.seed)


# --------------------------------------------------------------------------
# Profile of one gluon_dynbatch training batch
# --------------------------------------------------------------------------

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


def _timed_phases(runner, batch):
    """One training batch split at synchronisation points: (phases, stats)."""
    task, block = runner.task, runner.block
    mx, nd = task.mx, task.mx.nd
    nd.waitall()
    marks = [("start", time.perf_counter())]
    with mx.autograd.record():
        emb = task.model.embedding.data()
        with task.gdb.batching(**parse_config(runner.spec["config"])) as scope:
            outs = [block(t, emb) for t in batch]
        marks.append(("scope (record + plan + launch)", time.perf_counter()))
        loss = task.sst.sst_loss(outs, batch)
        marks.append(("loss graph", time.perf_counter()))
    nd.waitall()
    marks.append(("forward compute still queued at scope exit", time.perf_counter()))
    loss.backward()
    nd.waitall()
    marks.append(("backward", time.perf_counter()))
    task.trainer.step(1)
    nd.waitall()
    marks.append(("trainer.step (Adam, dense embedding)", time.perf_counter()))
    phases = [(name, 1000.0 * (t - marks[k][1]))
              for k, (name, t) in enumerate(marks[1:])]
    stats = scope.stats.as_dict()
    inner = [("  record (forward code, recording)", stats["record_ms"]),
             ("  plan", stats["plan_ms"]),
             ("  execute (launch batched ops; incl. compile %.1f ms)"
              % stats["compile_ms"], stats["execute_ms"])]
    inner.append(("  rest of scope exit (liveness, pruning, release)",
                  phases[0][1] - sum(ms for _, ms in inner)))
    phases[1:1] = inner
    return phases, stats


def _mx_profile(runner, batch, top):
    """Top operators and C API calls of one training batch (mx.profiler)."""
    mx = runner.task.mx
    path = os.path.join(tempfile.mkdtemp(prefix="gdb_prof_"), "profile.json")
    mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=path)
    operators, api = [], []
    for _ in range(3):      # the aggregate table now and then comes back empty
        mx.profiler.set_state("run")
        runner.step(batch)
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        dump = mx.profiler.dumps(reset=True, format="json")
        operators = _profiler_rows(dump, "operator", top)
        api = _profiler_rows(dump, "MXNET_C_API", 6)
        if operators:
            break
        LOG.debug("mx.profiler aggregate without operators: %s", dump[:300])
    return operators, api


def _python_profile(runner, batch, top):
    """Top Python functions by own time of one training batch (cProfile)."""
    import cProfile  # pylint: disable=import-outside-toplevel
    import pstats  # pylint: disable=import-outside-toplevel
    profiler = cProfile.Profile()
    profiler.enable()
    runner.step(batch)
    runner.task.mx.nd.waitall()
    profiler.disable()
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(top)
    lines = buf.getvalue().strip().splitlines()
    for k, line in enumerate(lines):
        if line.strip().startswith("ncalls"):
            lines = lines[k:]
            break
    root = str(ROOT) + os.sep
    return "\n".join(re.sub(r"\S*site-packages/", "", line.replace(root, ""))
                     for line in lines)


def profile_batch(runner, top=15):
    """Where one gluon_dynbatch training batch of ``runner`` spends its time.

    Runs three warm-up batches, then one batch split by synchronisation
    points, one under ``mx.profiler`` (top operators) and one under cProfile
    (top Python functions).

    Returns
    -------
    dict
    """
    runner.prepare("train", runner.task.job["batch_size"], 3)
    batch = next(runner.stream)
    phases, stats = _timed_phases(runner, batch)
    operators, api = _mx_profile(runner, next(runner.stream), top)
    python = _python_profile(runner, next(runner.stream), top)
    stats["mean_batch_size"] = summarize_stats([stats])["mean_batch_size"]
    return {"label": runner.spec["label"], "trees": len(batch),
            "tree_nodes": sum(len(t.postorder()) for t in batch),
            "phases": phases, "stats": stats, "operators": operators,
            "api": api, "python": python}


# --------------------------------------------------------------------------
# The request loop
# --------------------------------------------------------------------------

class Worker:
    """Answers the driver's requests for the systems this process hosts.

    Parameters
    ----------
    side : {"gluon", "dynet"}
    framework : module or types.SimpleNamespace
        The imported ``dynet``, or :func:`gluon_modules`.
    cores : list of int
        The cores this process may run on.
    """

    def __init__(self, side, framework, cores):
        self.side, self.framework, self.cores = side, framework, cores
        self.runners = {}

    def setup(self, job, specs):
        """Build one runner per spec (see the module docstring)."""
        for spec in specs:
            if self.side == "gluon":
                runner = GluonRunner(self.framework, job, spec)
                if spec.get("weights_out"):
                    runner.task.export_weights(spec["weights_out"])
            else:
                runner = DyNetRunner(self.framework, job, spec)
            self.runners[spec["key"]] = runner
        return {"pid": os.getpid()}

    def prepare(self, key, mode, size, warmup):
        """See :meth:`Runner.prepare`."""
        return self.runners[key].prepare(mode, size, warmup)

    def run(self, key, count, each):
        """See :meth:`Runner.run`."""
        return self.runners[key].run(count, each)

    def profile(self, key):
        """See :func:`profile_batch`."""
        return profile_batch(self.runners[key])

    def env(self):
        """Thread settings, cores and versions of this process."""
        env = {var: os.environ.get(var) for var in THREAD_VARS}
        env.update(side=self.side, cores=self.cores, os_threads=os_threads(),
                   cpu_count=os.cpu_count(),
                   max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
        if self.side == "gluon":
            env["mxnet"] = self.framework.mx.__version__
        return env


def serve(worker, requests, answers):
    """Answer each request line of ``requests`` on ``answers`` until ``quit``."""
    for line in requests:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            answers.write(json.dumps({"ok": True, "result": None}) + "\n")
            answers.flush()
            return
        try:
            result = getattr(worker, msg["cmd"])(**msg.get("args", {}))
            reply = {"ok": True, "result": result}
        except Exception as err:  # pylint: disable=broad-except
            LOG.error("%s failed:\n%s", msg["cmd"], traceback.format_exc())
            reply = {"ok": False, "error": "%s: %s" % (type(err).__name__, err)}
        answers.write(json.dumps(reply, default=str) + "\n")
        answers.flush()


def import_dynet(autobatch, seed, mem="1024"):
    """Configure dynet, then import it; exit with DYNET_MISSING if absent."""
    try:
        import dynet_config  # pylint: disable=import-outside-toplevel
        dynet_config.set(mem=mem, random_seed=seed, autobatch=autobatch)
        import dynet  # pylint: disable=import-outside-toplevel
    except ImportError:
        print(DYNET_SKIP, file=sys.stderr)
        sys.exit(DYNET_MISSING)
    return dynet


def parse_args(argv=None):
    """Parse the worker's command line."""
    parser = argparse.ArgumentParser(description="A bench_dynet.py worker "
                                     "(started by the driver; speaks JSON lines)")
    parser.add_argument("side", choices=("gluon", "dynet"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--autobatch", type=int, choices=(0, 1), default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv=None):
    """Set threads, import the framework, then serve requests."""
    args = parse_args(argv)
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)           # whatever else is printed goes to stderr
    setup_logging(args.verbose, "%(asctime)s [" + args.side + " worker "
                  + str(os.getpid()) + "] %(message)s")
    cores = apply_threads(args.threads)
    if args.side == "gluon":
        framework = gluon_modules()
    else:
        framework = import_dynet(args.autobatch, args.seed)
    serve(Worker(args.side, framework, cores), sys.stdin, answers)


if __name__ == "__main__":
    main()
