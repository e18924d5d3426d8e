"""What the DyNet race's driver and its workers share (no mxnet, no dynet).

``scripts/bench_dynet.py`` (the driver), ``scripts/bench_dynet_worker.py``
(a worker process) and ``scripts/bench_dynet_report.py`` (the report) import
their common constants and helpers from here, so that none of them imports
another.
"""
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

MODES = ("train", "infer")
_COMPILED = {"imperative": False, "step": "step", "compiled": True}
SWEEP_DIMS = (128, 128)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "MXNET_CPU_WORKER_NTHREADS")
STAT_MS = ("record_ms", "plan_ms", "execute_ms", "compile_ms")
STAT_COUNTS = ("nodes", "steps", "planned_nodes", "cache_hits",
               "cache_misses")
DYNET_MISSING = 3
"""Exit status of a DyNet worker that cannot import dynet."""
DYNET_SKIP = "skipped: dynet38 not installed (pip install dynet38)"


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

    Every system calls this with the same seed and so sees the same batches
    in the same order.

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


def run_block(step, batches, sync, each, value=float, count=len):
    """Run ``step`` on every batch of ``batches``; time them.

    Parameters
    ----------
    step : callable
        ``step(batch) -> (loss, stats)``; ``stats`` a dict or None.
    batches : list
        Drawn before the clock starts.
    sync : callable
        Waits for all pending computation (``mx.nd.waitall``).
    each : bool
        Wait after every batch and time each alone (``batch_ms``); otherwise
        the batches run back to back and only the block is timed.
    value : callable, optional
        Loss object -> float, called after the block's final wait.
    count : callable, optional
        Sentences in a batch.

    Returns
    -------
    dict
        ``block_ms``, ``batch_ms`` (empty unless ``each``), ``sentences``,
        ``losses`` and ``stats`` (per batch).
    """
    losses, stats, batch_ms = [], [], []
    sync()
    start = time.perf_counter()
    for batch in batches:
        began = time.perf_counter()
        loss, figures = step(batch)
        if each:
            sync()
            batch_ms.append(1000.0 * (time.perf_counter() - began))
        losses.append(loss)
        if figures is not None:
            stats.append(figures)
    sync()
    block_ms = 1000.0 * (time.perf_counter() - start)
    return {"block_ms": block_ms, "batch_ms": batch_ms,
            "sentences": [count(b) for b in batches],
            "losses": [value(loss) for loss in losses], "stats": stats}


def summarize_stats(stats):
    """Medians (ms) and sums (counts) of per-batch ``scope.stats`` dicts."""
    out = {name: statistics.median(s[name] for s in stats) for name in STAT_MS}
    for name in STAT_COUNTS:
        out[name] = sum(s[name] for s in stats)
    out["mean_batch_size"] = (out["planned_nodes"] / out["steps"]
                              if out["steps"] else 0.0)
    return out
