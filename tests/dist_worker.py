"""A node of the parameter-server jobs of ``tests/test_distributed.py``.

``gluon_dynbatch.distributed.launch`` runs this file as every node of a job::

    python tests/dist_worker.py OUT_DIR EPOCHS

In a server or the scheduler, ``import mxnet`` runs the node and exits.  A
worker joins the ``dist_sync`` job and trains the SICK example's model with
the example's ``train_epoch`` (its slice of every global batch) on a small
generated corpus for EPOCHS epochs (0: until killed), then saves its
parameters to ``OUT_DIR/rank<r>.params``.  After its first epoch it writes
its pid to ``OUT_DIR/rank<r>.pid``.

The test module imports it too, to train the same model in one process.
"""
import mxnet as mx  # first: a server or the scheduler runs here and exits

import itertools  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from mxnet import gluon  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples import data_parallel  # noqa: E402
from examples import run_state  # noqa: E402
from examples import tree_lstm_sick as script  # noqa: E402
from examples.sick_data import attach_words, random_corpus  # noqa: E402
from examples.sick_model import SimilarityModel, make_loss  # noqa: E402

SEED = 7
NUM_PAIRS = 20
VOCAB = 40
#: Pairs per worker and step: 2 workers make global batches of 6, so an
#: epoch is 3 steps and drops 2 pairs.
BATCH = 3
EMBED_DIM, MEMORY, HIDDEN = 12, 10, 6
#: SGD, unlike AdaGrad, changes its steps with the gradient's scale, so a
#: wrong ``trainer.step`` batch size shows in the parameters.
OPTIMIZER = ("sgd", {"learning_rate": 1.0, "wd": 1e-3})
EMBED_LR_MULT = 2.0
L2 = 1e-3


def corpus():
    """The generated pairs (word ids attached) and the initial word table."""
    pairs = random_corpus(NUM_PAIRS, seed=SEED, vocab_size=VOCAB)
    for pair in pairs:
        attach_words(pair.a_tree, [int(t[1:]) for t in pair.a_tokens])
        attach_words(pair.b_tree, [int(t[1:]) for t in pair.b_tokens])
    rng = np.random.RandomState(SEED)
    return pairs, mx.nd.array(rng.uniform(-0.5, 0.5, (VOCAB, EMBED_DIM)))


def training_args(batch_size=BATCH):
    """The example's flags for these runs (``--l2``, no logging)."""
    return script.parse_args(["--batch-size", str(batch_size), "--l2",
                              str(L2), "--log-interval", "0", "--seed",
                              str(SEED)])


def build(table, workers):
    """The example's model, tuned word vectors included, and its trainer.

    The word table trains at ``EMBED_LR_MULT`` times the learning rate and
    without weight decay: on a distributed kvstore that takes
    ``data_parallel.keep_multipliers_on_servers``.
    """
    script.seed_everything(SEED)
    model = SimilarityModel(EMBED_DIM, MEMORY, HIDDEN, num_words=VOCAB)
    model.initialize()
    model.embedding.set_data(table)
    model.embedding.lr_mult = EMBED_LR_MULT
    kvstore = {"kvstore": workers.kvstore} if workers.distributed else {}
    trainer = gluon.Trainer(model.collect_params(), *OPTIMIZER, **kvstore)
    if workers.distributed:
        data_parallel.keep_multipliers_on_servers(trainer,
                                                  model.collect_params())
    return model, trainer


def main(out_dir, epochs):
    """Train as a worker of the job; save parameters and pid as above."""
    out_dir = Path(out_dir)
    workers = data_parallel.join("dist_sync")
    pairs, table = corpus()
    model, trainer = build(table, workers)
    args = training_args()
    rng = np.random.RandomState(SEED)
    rounds = range(1, epochs + 1) if epochs else itertools.count(1)
    for epoch in rounds:
        script.train_epoch(model, trainer, make_loss(), pairs, None, args,
                           run_state.Progress(epoch=epoch), rng, workers)
        if epoch == 1:
            part = out_dir / f"rank{workers.rank}.pid.part"
            part.write_text(str(os.getpid()))
            os.replace(part, out_dir / f"rank{workers.rank}.pid")
    model.save_parameters(str(out_dir / f"rank{workers.rank}.params"))
    del trainer
    if not workers.leave(model.collect_params()):
        print("the kvstore is still referenced", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
