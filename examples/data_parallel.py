"""Data-parallel training on MXNet's parameter server (ps-lite kvstore).

Every worker runs the same training script.  It joins the job with
:func:`join`, which creates the ``dist_sync`` or ``dist_async`` kvstore from
the ``DMLC_*`` environment that :mod:`gluon_dynbatch.distributed.launch` sets,
and hands the kvstore to ``gluon.Trainer``.  The parameters then live on the
servers: each ``trainer.step`` pushes this worker's gradients and pulls the
updated weights.  With ``dist_sync`` the servers sum the gradients of all
workers before one update, so a worker divides by the global batch size
(:meth:`Workers.step_size`); with ``dist_async`` every push is an update of
its own.

Each worker reads its own slice of every global batch
(:func:`shard_batches`), all workers drawing the same shuffled order from the
same seed.  ``import mxnet`` in a server or scheduler process runs that node
and exits, so a script's imports up to mxnet are all they execute.
"""
import gc
import os
import weakref

import mxnet as mx
from mxnet import gluon

#: Values of the examples' ``--kvstore`` flag.
KVSTORES = ("local", "dist_sync", "dist_async")


class LaunchError(RuntimeError):
    """A ``dist_*`` kvstore was asked for outside a launched job."""


class Workers:
    """Where this process stands in a data-parallel job.

    Parameters
    ----------
    kvstore : str or mxnet.kvstore.KVStore, optional
        ``"local"`` for one process (the default), else the distributed
        kvstore this worker joined.
    rank : int, optional
        This worker's rank, from 0; assigned by the scheduler.
    count : int, optional
        Number of workers in the job.

    Attributes
    ----------
    kvstore : str, mxnet.kvstore.KVStore or None
        What ``gluon.Trainer`` gets; None after :meth:`leave`.
    kind : str
        ``"local"``, ``"dist_sync"`` or ``"dist_async"``.
    """

    def __init__(self, kvstore="local", rank=0, count=1):
        self.kvstore = kvstore
        self.kind = kvstore if isinstance(kvstore, str) else kvstore.type
        self.rank = rank
        self.count = count

    def __repr__(self):
        return (f"Workers({self.kind!r}, rank={self.rank}, "
                f"count={self.count})")

    @property
    def distributed(self):
        """True when the parameters live on parameter servers."""
        return self.kind != "local"

    @property
    def sync(self):
        """True unless ``dist_async`` (one update per worker's push)."""
        return self.kind != "dist_async"

    @property
    def chief(self):
        """True on rank 0, which evaluates, saves and reports."""
        return self.rank == 0

    def step_size(self, local_batch):
        """The batch size to give ``trainer.step`` for ``local_batch`` pairs.

        With ``dist_sync`` the servers sum the gradients of every worker,
        so the step divides by the global batch, ``local_batch * count``.
        """
        return local_batch * self.count if self.sync else local_batch

    def leave(self, params):
        """Leave the job now: free the kvstore while MXNet still runs.

        A distributed kvstore says goodbye to the job (a barrier of every
        worker, then ps-lite's shutdown) when it is freed.  Freed only
        while the interpreter exits, after MXNet has shut down, it aborts
        or hangs the process.  The trainer holding it lives as long as any
        of its Parameters, and gluon_dynbatch's replay templates keep the
        Parameters of the blocks they traced; so ``params`` are handed to a
        trainer without a kvstore (a Parameter refers to the last trainer
        built on it), and the old trainer and kvstore are collected here.
        The caller must hold no reference to the old trainer.

        Parameters
        ----------
        params : ParameterDict
            Every parameter given to the distributed trainer.

        Returns
        -------
        bool
            True when the kvstore was freed (or there was none).
        """
        if not self.distributed or self.kvstore is None:
            return True
        gluon.Trainer(params, "sgd", kvstore=None)
        freed = weakref.ref(self.kvstore)
        self.kvstore = None
        gc.collect()
        return freed() is None


def join(kvstore="local"):
    """Join the job as a worker; returns this process's :class:`Workers`.

    Parameters
    ----------
    kvstore : str, optional
        One of :data:`KVSTORES`.  A ``dist_*`` kvstore blocks until every
        node of the job has connected to the scheduler.

    Raises
    ------
    LaunchError
        A ``dist_*`` kvstore outside a job (no ``DMLC_ROLE`` set).
    ValueError
        An unknown kvstore.
    """
    if kvstore not in KVSTORES:
        raise ValueError(f"kvstore must be one of {KVSTORES}, not "
                         f"{kvstore!r}")
    if kvstore == "local":
        return Workers()
    if os.environ.get("DMLC_ROLE") != "worker":
        raise LaunchError(
            f"--kvstore {kvstore} runs inside a parameter-server job: start "
            "it with `python -m gluon_dynbatch.distributed.launch --workers "
            "N -- COMMAND` (or give the example --workers N)")
    store = mx.kv.create(kvstore)
    return Workers(store, store.rank, store.num_workers)


def shard_batches(items, batch_size, rng, workers):
    """Yield this worker's ``batch_size`` items of every global batch.

    The global batches cut one permutation of ``items`` (one draw from
    ``rng``, identical on every worker) into runs of
    ``batch_size * workers.count``; worker ``r`` takes the ``r``-th slice of
    each.  An incomplete last global batch is dropped, so that every worker
    makes the same number of steps of the same size (``dist_sync`` waits for
    every worker at every step, and Gluon's trainer cannot change the batch
    size on a distributed kvstore).

    Parameters
    ----------
    items : sequence
    batch_size : int
        Items per worker and step.
    rng : numpy.random.RandomState
    workers : Workers

    Yields
    ------
    list
    """
    order = rng.permutation(len(items))
    size = batch_size * workers.count
    first = workers.rank * batch_size
    for start in range(0, len(order) - size + 1, size):
        part = order[start + first:start + first + batch_size]
        yield [items[i] for i in part]


def global_steps(num_items, batch_size, workers):
    """Steps per epoch of :func:`shard_batches`."""
    return num_items // (batch_size * workers.count)


def keep_multipliers_on_servers(trainer, params):
    """Make the servers' optimizer apply the parameters' lr_mult and wd_mult.

    Gluon sends the optimizer to the servers pickled, and an optimizer
    pickles without its ``param_dict``, where a ``Parameter``'s own
    ``lr_mult`` and ``wd_mult`` are found; the servers would apply 1 to all.
    Set the multipliers by index, which the optimizer consults next and
    which do travel.  The index is the trainer's: the position in ``params``
    given as a list, in the sorted names given as a dict.  Call before the
    first ``trainer.step``.

    Parameters
    ----------
    trainer : mxnet.gluon.Trainer
    params : ParameterDict or list of Parameter
        As given to the trainer.
    """
    if hasattr(params, "keys"):
        params = [params[name] for name in sorted(params.keys())]
    optimizer = trainer.optimizer
    optimizer.set_lr_mult({i: p.lr_mult for i, p in enumerate(params)})
    optimizer.set_wd_mult({i: p.wd_mult for i, p in enumerate(params)})
