"""The optimiser state of parameter servers, written to files and read back.

With Gluon's defaults on a ``dist_*`` kvstore the servers run the optimiser
and hold its state (AdaGrad's history, Adam's moments); a worker cannot
read it (``Trainer.save_states`` refuses).  A job restarted from a
checkpoint needs it, or its updates differ from those of a job never
interrupted.

The servers run whatever optimizer object a worker sends them (MXNet
pickles it into a command).  So rank 0 sends a small command object whose
unpickling, on each server, runs ``on_server`` of ``_server_side.py``:

* ``track``: take the trainer's optimizer, with the state of earlier files
  when restarting, and keep every state it creates in this process's
  registry;
* ``save``: write the registry to ``<prefix>.server<k>.states`` (one file
  per server, ``k`` the smallest key it holds), atomically.

Both return the tracked optimizer, which the server installs again, so the
updates go on with the same state objects.  A worker script calls
:func:`track` once after building its trainer (every worker) and
:func:`save` at each checkpoint (rank 0), after waiting for its own updates.

States are matched by key and shape; each key must live on one server, so
the job runs with ``MXNET_KVSTORE_BIGARRAY_BOUND`` above the largest
parameter (:data:`NO_SPLIT`), which the SICK example's launcher sets.
"""
import glob
import operator
import pickle
import runpy
from pathlib import Path

#: ``MXNET_KVSTORE_BIGARRAY_BOUND`` that keeps every array on one server.
NO_SPLIT = str(2 ** 31 - 1)
#: MXNet's server command that installs an optimizer (``kController``).
_CONTROLLER = 0
#: The file a server runs; it imports nothing of this package.
_SERVER_SIDE = str(Path(__file__).with_name("_server_side.py"))


class _ServerFunction:
    """Pickles as ``runpy.run_path(_server_side.py)["on_server"]``: the
    server loads that file by path, as this package cannot be imported
    while the server's MXNet is still being imported."""

    def __call__(self, *args):  # pickle wants a callable; never called here
        raise RuntimeError("runs on a parameter server only")

    def __reduce__(self):
        return (operator.getitem, (_RunPath(), "on_server"))


class _RunPath:
    """Pickles as ``runpy.run_path(_server_side.py)``."""

    def __reduce__(self):
        return (runpy.run_path, (_SERVER_SIDE,))


class _Command:
    """Pickles as a call of the server's ``on_server`` with ``args``."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return (_ServerFunction(), self.args)


def _send(kvstore, *args):
    """Send a command to every server; returns when all have run it."""
    body = pickle.dumps(_Command(*args), 0).decode("utf-8")
    kvstore._send_command_to_servers(_CONTROLLER, body)  # noqa: SLF001


def track(trainer, workers, batch_size, restore=()):
    """Make the servers keep the optimizer state where it can be saved.

    Every worker calls this after building ``trainer`` (with
    ``update_on_kvstore``) and before its first step.

    Parameters
    ----------
    trainer : mxnet.gluon.Trainer
    workers : examples.data_parallel.Workers or similar
        ``chief`` and ``kvstore`` are used.
    batch_size : int
        What every ``trainer.step`` will be given: the optimizer goes to
        the servers now, with its gradient scale, which Gluon then refuses
        to change.
    restore : sequence of str, optional
        Files written by :func:`save` to start the state from.
    """
    scale = getattr(trainer, "_scale", 1.0)
    trainer.optimizer.rescale_grad = scale / batch_size
    trainer._init_kvstore()  # noqa: SLF001 - sends the optimizer now
    kvstore = workers.kvstore
    kvstore._barrier()  # noqa: SLF001 - every plain optimizer has arrived
    if workers.chief:
        _send(kvstore, "track", trainer.optimizer, [str(f) for f in restore])
    kvstore._barrier()  # noqa: SLF001 - no push before it is in place


def save(workers, prefix):
    """Ask every server to write its optimizer state; rank 0 calls this.

    Parameters
    ----------
    workers : examples.data_parallel.Workers or similar
    prefix : str or os.PathLike
        Each server writes ``<prefix>.server<k>.states``.

    Returns
    -------
    list of str
        The files written.
    """
    _send(workers.kvstore, "save", str(prefix))
    return sorted(glob.glob(f"{glob.escape(str(prefix))}.server*.states"))
