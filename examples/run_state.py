"""A training run's directory: its settings, progress and checkpoints.

A run directory (``--save-dir``, default ``runs/sick``) holds

* ``run.json``: the run's settings, written once; ``vocab.json`` and
  ``embeddings.params``: its vocabulary and initial word vectors, so that a
  resumed or evaluated run needs neither GloVe nor a rebuilt vocabulary;
* ``checkpoint.json`` and the ``ckpt-<n>.params`` / ``ckpt-<n>.states``
  files it names: parameters, optimiser state and :class:`Progress` (epoch,
  batches done in it, the random generators' states, best dev score, the
  curves so far), written as :mod:`gluon_dynbatch.distributed.checkpoint`
  does, so that a crash leaves the previous checkpoint whole;
* ``best.params``, ``summary.json`` and ``curves.png``, each written
  atomically.

An ensemble keeps one checkpoint per member, in ``member<k>/``.
"""
import dataclasses
import logging
import random
from pathlib import Path

import mxnet as mx
import numpy as np

from gluon_dynbatch.distributed import checkpoint, server_state

LOG = logging.getLogger(__name__)

RUN_FILE = "run.json"
VOCAB_FILE = "vocab.json"
EMBEDDINGS_FILE = "embeddings.params"
BEST_FILE = "best.params"
SUMMARY_FILE = "summary.json"
CURVES_FILE = "curves.png"
#: Files of an earlier run that a new run in the same directory removes.
RUN_OUTPUTS = (SUMMARY_FILE, CURVES_FILE, BEST_FILE)


@dataclasses.dataclass
class Progress:
    """Where a run stands; everything a resumed run needs besides arrays.

    Attributes
    ----------
    epoch : int
        The epoch in progress, from 1; past ``--epochs`` when done.
    batch : int
        Batches of ``epoch`` done.
    step : int
        Batches done in the whole run.
    seq : int
        Checkpoints written.
    order_state : list or None
        The batch-order generator's state at the start of ``epoch``.
    best : dict
        Epoch and dev metrics of the best epoch so far (``epoch`` None
        before the first).
    train_loss : list of float
        Mean loss per pair of every batch, in order (this process's pairs).
    dev : list of dict
        Dev metrics after each epoch.
    epoch_loss, epoch_pairs : float, int
        Summed loss and pairs of ``epoch``'s batches so far.
    train_seconds : float
        Training time, evaluation and saving excluded.
    train_pairs : int
        Pairs trained, by every worker.
    mxnet_seed : int or None
        The seed MXNet's generator was set to at the last checkpoint.
    """

    epoch: int = 1
    batch: int = 0
    step: int = 0
    seq: int = 0
    order_state: list = None
    best: dict = dataclasses.field(
        default_factory=lambda: {"epoch": None, "pearson": None})
    train_loss: list = dataclasses.field(default_factory=list)
    dev: list = dataclasses.field(default_factory=list)
    epoch_loss: float = 0.0
    epoch_pairs: int = 0
    train_seconds: float = 0.0
    train_pairs: int = 0
    mxnet_seed: int = None

    def improves(self, pearson):
        """True when dev Pearson ``pearson`` beats the best so far."""
        return self.best["pearson"] is None or pearson > self.best["pearson"]

    def to_json(self):
        """A JSON-serialisable dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data):
        """The inverse of :meth:`to_json`; unknown keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def random_state_to_json(state):
    """A numpy ``RandomState.get_state()`` tuple as JSON-friendly lists."""
    name, keys, pos, has_gauss, gauss = state
    return [name, [int(k) for k in keys], int(pos), int(has_gauss),
            float(gauss)]


def random_state_from_json(data):
    """The inverse of :func:`random_state_to_json`."""
    name, keys, pos, has_gauss, gauss = data
    return (name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss)


def global_rng_states():
    """States of Python's and numpy's global generators, as JSON."""
    version, internal, gauss = random.getstate()
    return {"python": [version, list(internal), gauss],
            "numpy": random_state_to_json(np.random.get_state())}


def set_global_rng_states(states):
    """Restore :func:`global_rng_states`."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(random_state_from_json(states["numpy"]))


def reseed_mxnet(seed, step):
    """Seed MXNet's generator from the run's seed and step; return it.

    MXNet cannot report its generator's state, so at every checkpoint the
    run sets it to a seed it can record: a resumed run sets the same one
    at the same point and draws the same numbers from then on.
    """
    value = (int(seed) * 1_000_003 + int(step)) % (2 ** 31 - 1)
    mx.random.seed(value)
    return value


def save(directory, model, trainer, progress, workers):
    """Write a checkpoint of ``model``, ``trainer`` and ``progress``.

    Parameters
    ----------
    directory : pathlib.Path
    model : mxnet.gluon.Block
    trainer : mxnet.gluon.Trainer
    progress : Progress
        Its ``seq`` is advanced.
    workers : examples.data_parallel.Workers
        One process saves the trainer's state; in a ``dist_sync`` job the
        servers write theirs; with ``dist_async`` it is not saved.

    Returns
    -------
    pathlib.Path
        The manifest.
    """
    progress.seq += 1
    stem = f"ckpt-{progress.seq:06d}"
    files = {"params": (f"{stem}.params", model.save_parameters)}
    if not workers.distributed:
        files["states"] = (f"{stem}.states", trainer.save_states)
    elif workers.sync:
        written = server_state.save(workers, Path(directory) / stem)
        files.update({f"server_states{k}": (Path(path).name, None)
                      for k, path in enumerate(written)})
    state = {"epoch": progress.epoch, "batch": progress.batch,
             "step": progress.step, "rng": global_rng_states(),
             "progress": progress.to_json()}
    return checkpoint.commit(directory, files, state)


def server_state_files(files):
    """The servers' optimiser-state files among a checkpoint's ``files``."""
    return [path for key, path in sorted(files.items())
            if key.startswith("server_states")]


def load(directory):
    """The last complete checkpoint of ``directory``, or None.

    Returns
    -------
    tuple of (Progress, dict, dict) or None
        The progress, the checkpoint's files (``params``, and ``states``
        when saved) and the global generators' states, for
        :func:`restore_generators`.
    """
    manifest = checkpoint.latest(directory)
    if manifest is None:
        return None
    LOG.info("resuming %s from its %s", directory,
             checkpoint.describe(manifest))
    return (Progress.from_json(manifest["progress"]), manifest["files"],
            manifest["rng"])


def restore_generators(progress, states):
    """Set Python's, numpy's and MXNet's generators as checkpointed."""
    set_global_rng_states(states)
    if progress.mxnet_seed is not None:
        mx.random.seed(progress.mxnet_seed)


def clear(directory):
    """Remove an earlier run's checkpoint and outputs from ``directory``."""
    directory = Path(directory)
    try:
        manifest = checkpoint.read_manifest(directory)
    except checkpoint.CheckpointError:
        manifest = None
    names = list((manifest or {}).get("files", {}).values())
    names += [checkpoint.MANIFEST, *RUN_OUTPUTS]
    removed = [n for n in names if (directory / n).is_file()]
    for name in removed:
        (directory / name).unlink()
    if removed:
        LOG.warning("%s held an earlier run; starting a new one there "
                    "(--resume %s continues a run instead)", directory,
                    directory)
