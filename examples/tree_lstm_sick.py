"""Train a Dependency Tree-LSTM on SICK semantic relatedness.

Reproduces the setting of Tai, Socher & Manning (2015), "Improved Semantic
Representations From Tree-Structured Long Short-Term Memory Networks": a
Child-Sum Tree-LSTM (memory 150) over dependency trees, fixed GloVe vectors,
a sigmoid layer of 50 units on ``[h_a * h_b; |h_a - h_b|]``, KL divergence to
a sparse target distribution, AdaGrad (lr 0.05, weight decay 1e-4), 25 pairs
per batch.  The model is written one sentence at a time; gluon_dynbatch
batches all trees of a minibatch (``--no-dynbatch`` runs them one by one).

Run from the repository root::

    python examples/tree_lstm_sick.py --max-pairs 200 --epochs 1

``--workers N`` trains data-parallel on MXNet's parameter server: N worker
processes and one server on this machine, started by
:mod:`gluon_dynbatch.distributed.launch` (``--kvstore dist_sync``); see
``docs/distributed.md``.
"""
import argparse
import itertools
import json
import logging
import os
import random
import sys
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from scipy import stats  # noqa: E402
from tqdm import tqdm  # noqa: E402

from examples import curves, data_parallel, data_sources  # noqa: E402
from examples import run_state, sick_data  # noqa: E402
from examples.arguments import count  # noqa: E402
from examples.data_sources import DataUnavailable  # noqa: E402
from examples.progress_logging import setup_logging  # noqa: E402
from examples.sick_data import SickDataError  # noqa: E402
import gluon_dynbatch as gdb  # noqa: E402
from gluon_dynbatch.distributed import (checkpoint, launch,  # noqa: E402
                                        server_state)
from examples.sick_model import (SimilarityModel, batch_targets,  # noqa: E402
                                 make_loss)

LOG = logging.getLogger("tree_lstm_sick")

RANDOM_EMBED_DIM = 50
EVAL_BATCH_SIZE = 100
BANNER = "!" * 78
#: ``--glove`` value for random word vectors.
RANDOM_GLOVE = "random"

#: Settings of ``--full``, the best full run (selected on dev Pearson).
FULL_PRESET = {"epochs": 8, "tune_embeddings": True, "embed_lr": 0.01,
               "ensemble": 2}


def build_parser():
    """Return the command-line parser.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(
        description="Dependency Tree-LSTM on SICK relatedness "
                    "(Tai et al. 2015) with gluon_dynbatch.")
    add = parser.add_argument
    add("--data-dir", default=None,
        help="SICK directory with train/ dev/ test/ (default: "
             "../shared/data/sick if present, else "
             "$MXNET_HOME/datasets/sick, fetched when missing)")
    add("--glove", default=None, metavar="NAME|FILE|random",
        help="word vectors, held fixed unless --tune-embeddings: one of "
             "gluonnlp's GloVe names (glove.6B.50d ... glove.840B.300d, "
             "fetched into $MXNET_HOME/embedding/glove), a GloVe file "
             "(text or gluonnlp .npz) or 'random' (default: "
             "../shared/data/glove/" + data_sources.LOCAL_GLOVE_NAME
             + " if present, else glove.6B.50d)")
    add("--offline", action="store_true",
        help="never download: data missing locally is an error")
    add("--synthetic", action="store_true",
        help="a smoke run on a generated corpus with random vectors; its "
             "scores mean nothing")
    add("--epochs", type=int, default=2,
        help="training epochs (default: %(default)s, a run of a few "
             "minutes; Tai et al.'s code trains 10, with 300-d GloVe 840B)")
    add("--batch-size", type=int, default=25,
        help="pairs per batch (default: %(default)s)")
    add("--lr", type=float, default=0.05,
        help="AdaGrad learning rate (default: %(default)s)")
    add("--wd", type=float, default=1e-4,
        help="MXNet AdaGrad weight decay, applied outside the adaptive "
             "step (w -= lr * wd * w), to every weight and bias but not to "
             "tuned embeddings (default: %(default)s)")
    add("--l2", type=float, default=0.0,
        help="L2 penalty as in Tai et al.'s code: reg * w added to the "
             "gradient before AdaGrad, their loss being KL / K per pair; "
             "weights and biases, not embeddings; their value is 1e-4, "
             "use it with --wd 0 (default: %(default)s)")
    add("--tune-embeddings", action="store_true",
        help="train the word vectors too, with AdaGrad at --embed-lr and "
             "no weight decay (Tai et al. held them fixed)")
    add("--embed-lr", type=float, default=0.01,
        help="AdaGrad learning rate of the word vectors with "
             "--tune-embeddings (default: %(default)s)")
    add("--no-output-gate", action="store_true",
        help="h = tanh(c), without the output gate, as in Tai et al.'s "
             "code for SICK (gate_output = false)")
    add("--encoder", choices=("cell", "opbyop"), default="cell",
        help="tree encoder: 'cell', the node update in one Child-Sum cell "
             "block, or 'opbyop', the same function written operator by "
             "operator in the encoder (default: %(default)s)")
    add("--memory", type=count(1), default=150,
        help="Tree-LSTM memory size (default: %(default)s)")
    add("--hidden", type=count(1), default=50,
        help="hidden units of the similarity layer (default: %(default)s)")
    add("--max-pairs", type=count(1), default=None,
        help="use at most this many training pairs, for quick runs; the "
             "vocabulary still covers all training tokens, and the dev and "
             "test words that have a GloVe vector (default: all)")
    add("--max-eval-pairs", type=count(1), default=None,
        help="use at most this many dev and test pairs (default: all)")
    add("--seed", type=int, default=42,
        help="seed for random, numpy and mxnet (default: %(default)s)")
    add("--strategy", default=None, choices=gdb.STRATEGIES,
        help="gluon_dynbatch batching strategy (default: the library's)")
    add("--no-dynbatch", action="store_true",
        help="run the same model eagerly, one sample at a time")
    add("--compare", type=int, default=0, metavar="N",
        help="time N training batches with and without dynbatch, print "
             "the speedup and exit")
    add("--resume", default=None, metavar="DIR",
        help="continue the run in DIR (an earlier --save-dir) from its "
             "last checkpoint, with its own settings; --epochs may extend "
             "it")
    add("--evaluate", default=None, metavar="CHECKPOINT",
        help="score dev and test with CHECKPOINT (a run directory's "
             "best.params, or a .params file) without training, and write "
             "the predictions beside it")
    add("--save-dir", default="runs/sick",
        help="the run directory: checkpoints, best.params, summary.json, "
             "curves.png (default: %(default)s)")
    add("--checkpoint-every", type=int, default=50, metavar="N",
        help="checkpoint every N batches as well as after every epoch; "
             "0 = after epochs only (default: %(default)s)")
    add("--log-interval", type=int, default=20,
        help="log the training loss every this many batches, 0 = never "
             "(default: %(default)s)")
    add("--ensemble", type=int, default=1, metavar="N",
        help="train N models (seeds SEED, SEED+1, ...), each stopped at its "
             "best dev epoch, and average their predicted distributions "
             "(default: %(default)s)")
    add("--full", action="store_true",
        help="the best full-run settings found: " + _preset_text()
             + "; flags given explicitly still win")
    add("--verbose", action="store_true", help="debug logging")
    _add_distributed_flags(parser)
    return parser


def _add_distributed_flags(parser):
    """Flags of data-parallel training on MXNet's parameter server."""
    group = parser.add_argument_group(
        "data-parallel training (MXNet parameter server, docs/distributed.md)")
    add = group.add_argument
    add("--kvstore", default="local", choices=data_parallel.KVSTORES,
        help="local: one process (default); dist_sync / dist_async: this "
             "process is a worker of a job started by "
             "gluon_dynbatch.distributed.launch; "
             "each worker trains on its slice of every global batch of "
             "--batch-size pairs per worker, rank 0 evaluates, saves and "
             "reports")
    add("--workers", type=int, default=0, metavar="N",
        help="start N workers and --servers servers on this machine "
             "(127.0.0.1) through gluon_dynbatch.distributed.launch and "
             "train with "
             "--kvstore dist_sync (unless dist_async is given); logs go to "
             "SAVE_DIR/logs (default: 0, one process)")
    add("--servers", type=int, default=1, metavar="N",
        help="with --workers: parameter servers (default: %(default)s)")
    add("--deadline", type=float, default=3600.0, metavar="SECONDS",
        help="with --workers: stop every process and fail after this long "
             "(default: %(default)g)")
    add("--max-restarts", type=int, default=0, metavar="N",
        help="with --workers: when a process dies, stop the job and start "
             "it again from the last checkpoint, up to N times (default: "
             "%(default)s)")


def _preset_text():
    """Describe FULL_PRESET as command-line flags."""
    words = []
    for key, value in FULL_PRESET.items():
        flag = "--" + key.replace("_", "-")
        words.append(flag if value is True else f"{flag} {value}")
    return " ".join(words)


def parse_args(argv=None):
    """Parse the command line, applying ``--full`` under explicit flags.

    Parameters
    ----------
    argv : list of str, optional
        Arguments; None reads ``sys.argv``.

    Returns
    -------
    argparse.Namespace
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.full:
        parser.set_defaults(**FULL_PRESET)
        args = parser.parse_args(argv)
    return args


def seed_everything(seed):
    """Seed Python's, numpy's and MXNet's random generators."""
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


def loud(message):
    """Log a warning framed so that it cannot be missed."""
    LOG.warning("\n%s\n%s\n%s", BANNER, message, BANNER)


def load_data(args):
    """Load SICK (fetched if need be), or the generated corpus.

    Returns
    -------
    dict
        ``train``, ``dev``, ``test`` lists of pairs (capped by
        ``--max-pairs`` / ``--max-eval-pairs``), ``train_all`` (the uncapped
        training pairs, for the vocabulary), ``source`` (``"sick"`` or
        ``"synthetic"``) and ``data_dir``.

    Raises
    ------
    DataUnavailable
        SICK is absent and cannot be fetched.
    """
    if args.synthetic:
        loud("--synthetic: training on a GENERATED corpus.\n"
             "Scores, correlations and errors below MEAN NOTHING.")
        splits = {"train": sick_data.random_corpus(2000, args.seed),
                  "dev": sick_data.random_corpus(300, args.seed + 1),
                  "test": sick_data.random_corpus(300, args.seed + 2),
                  "source": "synthetic", "data_dir": None}
    else:
        data_dir = find_sick(args)
        splits = {name: sick_data.load_split(data_dir, name)
                  for name in ("train", "dev", "test")}
        splits.update(source="sick", data_dir=str(data_dir))
        LOG.info("SICK from %s: %s", data_dir, ", ".join(
            f"{k} {len(splits[k])}" for k in ("train", "dev", "test")))
    splits["train_all"] = splits["train"]
    if args.max_pairs is not None:
        splits["train"] = splits["train"][:args.max_pairs]
    if args.max_eval_pairs is not None:
        for name in ("dev", "test"):
            splits[name] = splits[name][:args.max_eval_pairs]
    return splits


def find_sick(args):
    """The SICK directory: ``--data-dir``, the local copy or the cache.

    Raises
    ------
    DataUnavailable
    """
    if args.data_dir is not None:
        if not Path(args.data_dir).is_dir():
            raise DataUnavailable(
                f"--data-dir {args.data_dir} is not a directory")
        return Path(args.data_dir)
    local = data_sources.local_sick_dir()
    if local is not None:
        return local
    return data_sources.ensure_sick(args.offline)


def _tokens(pairs):
    """Yield the lower-cased tokens of both sentences of every pair."""
    for pair in pairs:
        for token in pair.a_tokens + pair.b_tokens:
            yield token.lower()


def build_vocab(pairs, extra_tokens=()):
    """Build a lower-cased gluonnlp Vocab over the tokens of ``pairs``.

    Parameters
    ----------
    pairs : list of SickPair
        Training pairs; all their tokens enter the vocabulary.
    extra_tokens : iterable of str, optional
        Further (lower-case) tokens to add, e.g. words of the dev and test
        sentences that have a pretrained vector.

    Returns
    -------
    gluonnlp.Vocab
        With ``<unk>`` for every other token.
    """
    import gluonnlp as nlp
    counter = nlp.data.count_tokens(list(_tokens(pairs)))
    counter.update(tok for tok in extra_tokens if tok not in counter)
    return nlp.Vocab(counter, unknown_token="<unk>", padding_token=None,
                     bos_token=None, eos_token=None)


def pretrained_eval_tokens(pairs, glove):
    """Tokens of ``pairs`` (dev, test) that have a pretrained vector.

    Tai et al. (2015) built the vocabulary over all splits, so that every
    word with a GloVe vector gets it, also when it never occurs in training.
    Only the sentences are read, never the scores.

    Parameters
    ----------
    pairs : list of SickPair
    glove : gluonnlp.embedding.TokenEmbedding or None

    Returns
    -------
    set of str
    """
    if glove is None:
        return set()
    return {tok for tok in _tokens(pairs) if tok in glove}


def attach_vocab(pairs, vocab):
    """Set the word ids of every tree node from the lower-cased tokens.

    Returns
    -------
    int
        Number of tokens that mapped to the unknown word.
    """
    unk = vocab[vocab.unknown_token]
    n_unknown = 0
    for pair in pairs:
        for tree, tokens in ((pair.a_tree, pair.a_tokens),
                             (pair.b_tree, pair.b_tokens)):
            ids = vocab[[t.lower() for t in tokens]]
            n_unknown += sum(1 for i in ids if i == unk)
            sick_data.attach_words(tree, ids)
    return n_unknown


def resolve_glove(args):
    """The GloVe file of ``--glove``, fetched if need be; None for random.

    Raises
    ------
    FileNotFoundError
        ``--glove`` names neither a file nor one of gluonnlp's GloVe names.
    DataUnavailable
        The vectors are absent and cannot be fetched.
    """
    choice = args.glove
    if choice == RANDOM_GLOVE or (choice is None and args.synthetic):
        return None
    if choice is None:
        local = data_sources.local_glove_file()
        if local is not None:
            return local
        choice = data_sources.DEFAULT_GLOVE
    if choice in data_sources.glove_sources():
        return data_sources.ensure_glove(choice, args.offline)
    if not Path(choice).is_file():
        names = ", ".join(sorted(data_sources.glove_sources()))
        raise FileNotFoundError(
            f"--glove {choice}: no such file, nor one of gluonnlp's GloVe "
            f"names ({names}) or '{RANDOM_GLOVE}'")
    return Path(choice)


def load_glove(glove_path, pairs):
    """The vectors of the tokens of ``pairs``, or None without a file.

    Parameters
    ----------
    glove_path : pathlib.Path or None
    pairs : list of SickPair
        Every pair whose words may need a vector (all splits).

    Returns
    -------
    data_sources.PretrainedVectors or None
    """
    if glove_path is None:
        return None
    return data_sources.load_vectors(glove_path, _tokens(pairs))


def build_embeddings(vocab, glove, rng):
    """Return the (V, D) embedding table for ``vocab``.

    Words missing from GloVe (and all words when ``glove`` is None) get
    vectors drawn uniformly from [-0.05, 0.05], as in Tai et al.'s code;
    with GloVe, the unknown word's vector is zero (as gluonnlp's
    ``TokenEmbedding`` gives it).

    Parameters
    ----------
    vocab : gluonnlp.Vocab
    glove : data_sources.PretrainedVectors or None
        Pretrained vectors, e.g. from :func:`load_glove`.
    rng : numpy.random.RandomState

    Returns
    -------
    mxnet.nd.NDArray
    """
    if glove is None:
        LOG.info("word vectors: random, %d-d", RANDOM_EMBED_DIM)
        table = rng.uniform(-0.05, 0.05, (len(vocab), RANDOM_EMBED_DIM))
        return mx.nd.array(table)
    table = rng.uniform(-0.05, 0.05, (len(vocab), glove.dim))
    found = [i for i, tok in enumerate(vocab.idx_to_token) if tok in glove]
    if found:
        table[found] = np.stack([glove[vocab.idx_to_token[i]]
                                 for i in found])
    table[vocab[vocab.unknown_token]] = 0.0
    LOG.info("GloVe %s: %d-d, %d of %d vocabulary words found",
             glove.path, glove.dim, len(found), len(vocab))
    return mx.nd.array(table)


def predict_probs(model, pairs, embeddings, batch_size=EVAL_BATCH_SIZE):
    """Class distributions of ``model`` for ``pairs``.

    Returns
    -------
    numpy.ndarray
        Shape (len(pairs), K), rows sum to 1.
    """
    probs = [np.exp(model(pairs[start:start + batch_size],
                          embeddings).asnumpy())
             for start in range(0, len(pairs), batch_size)]
    return np.concatenate(probs)


def score_metrics(probs, pairs):
    """Compare the expected scores ``r^T p`` with the gold scores.

    Parameters
    ----------
    probs : numpy.ndarray
        Class distributions, shape (len(pairs), K).
    pairs : list of SickPair

    Returns
    -------
    dict
        ``pearson``, ``spearman``, ``mse`` and ``predictions``.
    """
    pred = sick_data.expected_score(probs)
    gold = np.array([p.score for p in pairs])
    return {"pearson": float(stats.pearsonr(pred, gold)[0]),
            "spearman": float(stats.spearmanr(pred, gold)[0]),
            "mse": float(np.mean((pred - gold) ** 2)),
            "predictions": pred}


def evaluate(models, pairs, embeddings, batch_size=EVAL_BATCH_SIZE):
    """Predict scores for ``pairs`` and compare with the gold scores.

    Parameters
    ----------
    models : SimilarityModel or list of SimilarityModel
        With several models, their class distributions are averaged (an
        ensemble) before the expected score is taken.
    pairs : list of SickPair
    embeddings : NDArray or None
        Fixed table, or None for the models' own tables.
    batch_size : int, optional

    Returns
    -------
    dict
        ``pearson``, ``spearman``, ``mse`` and ``predictions``.
    """
    if not isinstance(models, (list, tuple)):
        models = [models]
    probs = [predict_probs(m, pairs, embeddings, batch_size)
             for m in models]
    return score_metrics(np.mean(probs, axis=0), pairs)


def add_l2(model, strength, batch_size):
    """Add the gradient of Tai et al.'s L2 penalty to the model's gradients.

    Tai et al.'s code minimises ``mean_batch(KL / K) + reg / 2 * |w|^2``
    over the Tree-LSTM and similarity weights and biases (not the word
    vectors), the penalty going through AdaGrad with the loss.  Here the
    gradients hold the batch sum of the per-pair KL divergence and
    ``trainer.step(batch_size)`` divides by ``batch_size``, so
    ``K * batch_size * reg * w`` is added: the step then sees ``K`` times
    Tai's gradient, and AdaGrad's steps do not depend on that scale.

    Parameters
    ----------
    model : SimilarityModel
    strength : float
        ``reg``; 0 adds nothing.
    batch_size : int
        Pairs in the batch.
    """
    if not strength:
        return
    scale = strength * model.num_classes * batch_size
    for param in model.collect_params().values():
        if param.grad_req == "null" or param is model.embedding:
            continue
        grad = param.grad()
        grad += scale * param.data()


def train_step(model, trainer, loss_fn, batch, embeddings, l2=0.0,
               step_size=None):
    """Run forward, backward and an optimiser step on one batch.

    Parameters
    ----------
    model : SimilarityModel
    trainer : mxnet.gluon.Trainer
    loss_fn : callable
        Per-pair loss, e.g. from :func:`make_loss`.
    batch : list of SickPair
    embeddings : NDArray or None
        Fixed embedding table, or None for the model's own table.
    l2 : float, optional
        L2 penalty of :func:`add_l2`.
    step_size : int, optional
        Batch size given to ``trainer.step`` (default ``len(batch)``); with
        ``dist_sync``, the global batch of all workers.

    Returns
    -------
    NDArray
        Summed loss of the batch (not synchronised), without the penalty.
    """
    targets = batch_targets(batch, model.num_classes)
    with autograd.record():
        loss = loss_fn(model(batch, embeddings), targets)
    loss.backward()
    add_l2(model, l2, len(batch))
    trainer.step(len(batch) if step_size is None else step_size)
    return loss.sum()


def iter_batches(pairs, batch_size, rng):
    """Yield shuffled batches of ``pairs``."""
    order = rng.permutation(len(pairs))
    for start in range(0, len(pairs), batch_size):
        yield [pairs[i] for i in order[start:start + batch_size]]


def epoch_batches(pairs, batch_size, rng, workers):
    """This process's batches of one epoch, their number and the pairs all
    workers train.

    One process: every pair, shuffled.  A distributed job: this worker's
    slice of every complete global batch (:func:`data_parallel.shard_batches`).

    Returns
    -------
    tuple of (iterator of list of SickPair, int, int)
    """
    if not workers.distributed:
        steps = -(-len(pairs) // batch_size)
        return iter_batches(pairs, batch_size, rng), steps, len(pairs)
    steps = data_parallel.global_steps(len(pairs), batch_size, workers)
    return (data_parallel.shard_batches(pairs, batch_size, rng, workers),
            steps, steps * batch_size * workers.count)


class LossLog:
    """The training loss of every batch, read without stalling MXNet.

    Batch losses stay NDArrays until :meth:`flush` (at a log line, a
    checkpoint, an epoch's end), which records them in ``progress``.
    """

    def __init__(self, progress, interval, bar):
        self.progress, self.interval, self.bar = progress, interval, bar
        self.pending, self.window = [], [0.0, 0]

    def add(self, loss, pairs):
        """Record the summed loss of a batch of ``pairs`` pairs."""
        self.pending.append((loss, pairs))
        if self.interval and self.progress.batch % self.interval == 0:
            self.flush()
            mean = self.window[0] / max(self.window[1], 1)
            self.bar.set_postfix(loss=f"{mean:.4f}")
            LOG.info("epoch %d batch %d: loss %.4f", self.progress.epoch,
                     self.progress.batch, mean)
            self.window = [0.0, 0]

    def flush(self):
        """Move the pending losses into ``progress``."""
        for loss, pairs in self.pending:
            value = float(loss.asscalar())
            self.progress.train_loss.append(value / pairs)
            self.progress.epoch_loss += value
            self.progress.epoch_pairs += pairs
            self.window[0] += value
            self.window[1] += pairs
        self.pending = []


def train_epoch(model, trainer, loss_fn, pairs, embeddings, args, progress,
                rng, workers=None, on_checkpoint=None):
    """Train the rest of epoch ``progress.epoch``, with a progress bar.

    The epoch's order is drawn from ``rng``; the ``progress.batch`` batches
    already done are skipped.  Every ``--checkpoint-every`` steps (not at
    the epoch's last batch) ``on_checkpoint()`` is called.  Only rank 0
    shows a bar.

    Parameters
    ----------
    progress : run_state.Progress
        Advanced batch by batch.
    workers : data_parallel.Workers, optional
        This process's place in a data-parallel job (default: one
        process).
    on_checkpoint : callable, optional

    Returns
    -------
    float
        Mean loss per pair of this process's batches of the epoch.
    """
    workers = workers or data_parallel.Workers()
    batches, steps, global_pairs = epoch_batches(pairs, args.batch_size,
                                                 rng, workers)
    done = progress.batch * args.batch_size * workers.count
    bar = tqdm(total=global_pairs, initial=min(done, global_pairs),
               unit="pair", desc=f"epoch {progress.epoch}", leave=False,
               dynamic_ncols=True, disable=not workers.chief)
    losses = LossLog(progress, args.log_interval, bar)
    clock = time.perf_counter()
    for batch in itertools.islice(batches, progress.batch, None):
        loss = train_step(model, trainer, loss_fn, batch, embeddings,
                          args.l2, workers.step_size(len(batch)))
        progress.batch += 1
        progress.step += 1
        progress.train_pairs += len(batch) * workers.count
        bar.update(len(batch) * workers.count)
        losses.add(loss, len(batch))
        if (on_checkpoint is not None and args.checkpoint_every
                and progress.step % args.checkpoint_every == 0
                and progress.batch < steps):
            clock = _pause_clock(losses, progress, clock)
            on_checkpoint()
            clock = time.perf_counter()
    _pause_clock(losses, progress, clock)
    bar.close()
    return progress.epoch_loss / max(progress.epoch_pairs, 1)


def _pause_clock(losses, progress, clock):
    """Flush the losses, wait for MXNet and count the time since ``clock``."""
    losses.flush()
    mx.nd.waitall()
    now = time.perf_counter()
    progress.train_seconds += now - clock
    return now


def log_metrics(name, metrics):
    """Log Pearson, Spearman and MSE."""
    LOG.info("%s: pearson %.4f  spearman %.4f  mse %.4f", name,
             metrics["pearson"], metrics["spearman"], metrics["mse"])


def _timed_step(model, trainer, loss_fn, batch, embeddings, dynbatch,
                l2=0.0):
    """Run one synchronised training step in the given mode; return seconds."""
    model.dynbatch = dynbatch
    mx.nd.waitall()
    start = time.perf_counter()
    train_step(model, trainer, loss_fn, batch, embeddings, l2)
    mx.nd.waitall()
    return time.perf_counter() - start


def compare_speed(model, trainer, loss_fn, pairs, embeddings, args):
    """Time ``args.compare`` batches with and without dynbatch.

    The two modes alternate batch by batch, so that load from other work on
    the machine affects both alike.  Each timed step is synchronised.

    Returns
    -------
    dict
        Seconds per batch for both modes and the speedup.
    """
    rng = np.random.RandomState(args.seed)
    batches = list(iter_batches(pairs, args.batch_size, rng))
    batches = batches * (args.compare // max(len(batches), 1) + 2)
    dynbatch = model.dynbatch
    for mode in (True, False):  # warm-up, not timed
        _timed_step(model, trainer, loss_fn, batches[0], embeddings, mode,
                    args.l2)
    totals = {True: 0.0, False: 0.0}
    for batch in batches[1:args.compare + 1]:
        for mode in (True, False):
            totals[mode] += _timed_step(model, trainer, loss_fn, batch,
                                        embeddings, mode, args.l2)
    model.dynbatch = dynbatch
    result = {"dynbatch": totals[True] / args.compare,
              "eager": totals[False] / args.compare}
    result["speedup"] = result["eager"] / result["dynbatch"]
    print(f"compare over {args.compare} batches of {args.batch_size}: "
          f"dynbatch {result['dynbatch'] * 1e3:.1f} ms/batch, "
          f"eager {result['eager'] * 1e3:.1f} ms/batch, "
          f"speedup x{result['speedup']:.2f}")
    return result


def make_model(args, embeddings, ctx):
    """The initialised model of ``args``, its word table from
    ``embeddings`` when it trains one."""
    num_words, input_size = embeddings.shape
    model = SimilarityModel(input_size, memory_size=args.memory,
                            hidden_size=args.hidden,
                            dynbatch=not args.no_dynbatch,
                            strategy=args.strategy,
                            num_words=(num_words if args.tune_embeddings
                                       else None),
                            output_gate=not args.no_output_gate,
                            encoder=args.encoder)
    model.initialize(ctx=ctx)
    if model.embedding is not None:
        model.embedding.set_data(embeddings)
        model.embedding.lr_mult = args.embed_lr / args.lr
    return model


def build_model(args, embeddings, ctx, workers=None, resume_files=None):
    """Create and initialise the model and its AdaGrad trainer.

    Parameters
    ----------
    args : argparse.Namespace
    embeddings : NDArray
        The (V, D) word vectors; with ``--tune-embeddings`` they initialise
        the model's own table, with learning rate ``--embed-lr``.
    ctx : mxnet.Context
    workers : data_parallel.Workers, optional
        The servers update the parameters and keep the optimiser state;
        with ``dist_sync`` they write it at each checkpoint
        (:mod:`gluon_dynbatch.distributed.server_state`).
    resume_files : dict, optional
        A checkpoint's ``params`` and ``states`` files to start from.

    Returns
    -------
    tuple of (SimilarityModel, mxnet.gluon.Trainer)
    """
    model = make_model(args, embeddings, ctx)
    if resume_files:
        model.load_parameters(str(resume_files["params"]), ctx=ctx)
    workers = workers or data_parallel.Workers()
    kvstore = {"kvstore": workers.kvstore} if workers.distributed else {}
    trainer = gluon.Trainer(model.collect_params(), "adagrad",
                            {"learning_rate": args.lr, "wd": args.wd},
                            **kvstore)
    resume_files = resume_files or {}
    if workers.distributed:
        data_parallel.keep_multipliers_on_servers(trainer,
                                                  model.collect_params())
    if workers.distributed and workers.sync:
        server_state.track(trainer, workers,
                           workers.step_size(args.batch_size),
                           run_state.server_state_files(resume_files))
    elif "states" in resume_files:
        trainer.load_states(str(resume_files["states"]))
    elif resume_files:
        LOG.warning("the checkpoint has no optimiser state (dist_async "
                    "keeps it on the servers): AdaGrad starts afresh")
    return model, trainer


def fit(model, trainer, data, embeddings, args, save_dir, seed=None,
        workers=None, progress=None):
    """Train until ``args.epochs``, checkpointing, keeping the best dev epoch.

    Parameters
    ----------
    model : SimilarityModel
    trainer : mxnet.gluon.Trainer
    data : dict
        From :func:`load_data`, with word ids attached.
    embeddings : NDArray or None
        Fixed table, or None for the model's own table.
    args : argparse.Namespace
    save_dir : pathlib.Path
        Where the checkpoints and best.params go.
    seed : int, optional
        Seed of the batch order (default: ``args.seed``).
    workers : data_parallel.Workers, optional
        In a distributed job only rank 0 evaluates and saves.
    progress : run_state.Progress, optional
        Where a resumed run stands (default: at the start).

    Returns
    -------
    dict
        Training statistics (best epoch, best dev metrics, pairs/s) and the
        ``curves`` (loss of every batch, dev metrics of every epoch).
    """
    workers = workers or data_parallel.Workers()
    seed = args.seed if seed is None else seed
    progress = progress or run_state.Progress()
    rng = np.random.RandomState(seed)
    if progress.order_state is not None:
        rng.set_state(run_state.random_state_from_json(progress.order_state))
    loss_fn = make_loss()

    def on_checkpoint():
        save_checkpoint(model, trainer, progress, seed, save_dir, workers)

    while progress.epoch <= args.epochs:
        if progress.batch == 0:
            progress.order_state = run_state.random_state_to_json(
                rng.get_state())
        seconds, pairs = progress.train_seconds, progress.train_pairs
        loss = train_epoch(model, trainer, loss_fn, data["train"],
                           embeddings, args, progress, rng, workers,
                           on_checkpoint)
        seconds = progress.train_seconds - seconds
        LOG.info("epoch %d: train loss %.4f, %.1f s, %.1f pairs/s",
                 progress.epoch, loss, seconds,
                 (progress.train_pairs - pairs) / max(seconds, 1e-9))
        end_epoch(model, data["dev"], embeddings, progress, rng, workers,
                  save_dir)
        on_checkpoint()
    if progress.best["epoch"] is not None and not workers.distributed:
        model.load_parameters(str(save_dir / run_state.BEST_FILE))
        LOG.info("reloaded best parameters (epoch %d)",
                 progress.best["epoch"])
    return fit_stats(progress, seed)


def fit_stats(progress, seed):
    """What :func:`fit` returns, from a run's ``progress``."""
    seconds = progress.train_seconds
    return {"best_dev": progress.best, "seed": seed,
            "train_pairs_per_s": (progress.train_pairs / seconds
                                  if seconds else None),
            "train_seconds": seconds, "train_pairs": progress.train_pairs,
            "curves": {"train_loss": progress.train_loss,
                       "dev": progress.dev}}


def end_epoch(model, dev_pairs, embeddings, progress, rng, workers,
              save_dir):
    """Close epoch ``progress.epoch``: rank 0 scores dev and keeps the best.

    When dev Pearson improves, ``best.params`` is written (atomically).
    ``progress`` then points at the next epoch's start.
    """
    if workers.chief:
        dev = evaluate(model, dev_pairs, embeddings)
        log_metrics(f"epoch {progress.epoch} dev", dev)
        metrics = {k: dev[k] for k in ("pearson", "spearman", "mse")}
        progress.dev.append({"epoch": progress.epoch, **metrics})
        if progress.improves(dev["pearson"]):
            progress.best = {"epoch": progress.epoch, **metrics}
            best_file = save_dir / run_state.BEST_FILE
            checkpoint.atomic_write(best_file, model.save_parameters)
            LOG.info("new best dev pearson; saved %s", best_file)
    progress.epoch += 1
    progress.batch = 0
    progress.epoch_loss, progress.epoch_pairs = 0.0, 0
    progress.order_state = run_state.random_state_to_json(rng.get_state())


def save_checkpoint(model, trainer, progress, seed, save_dir, workers):
    """Reseed MXNet as a resumed run will, and (rank 0) write a checkpoint.

    In a ``dist_sync`` job the servers write the optimiser state; with
    ``dist_async`` it is not saved.
    """
    progress.mxnet_seed = run_state.reseed_mxnet(seed, progress.step)
    if workers.chief:
        run_state.save(save_dir, model, trainer, progress, workers)


def write_summary(save_dir, summary):
    """Print the summary; write ``summary.json`` and ``curves.png``."""
    path = checkpoint.write_json(save_dir / run_state.SUMMARY_FILE, summary)
    figure = curves.write(save_dir / run_state.CURVES_FILE,
                          summary["curves"])
    test = summary["test"]
    print(f"test ({summary['data']}): pearson {test['pearson']:.4f}  "
          f"spearman {test['spearman']:.4f}  mse {test['mse']:.4f}  "
          f"| wall {summary['wall_time_s']:.1f} s  "
          f"train {summary['train_pairs_per_s'] or 0:.1f} pairs/s  "
          f"| summary: {path}" + (f", curves: {figure}" if figure else ""))
    return path


def join_job(args):
    """Join the job of ``args.kvstore``; ranks above 0 log warnings only.

    Returns
    -------
    data_parallel.Workers
    """
    workers = data_parallel.join(args.kvstore)
    if workers.distributed:
        if not workers.chief:
            logging.getLogger().setLevel(logging.WARNING)
        LOG.info("%s: rank %d of %d workers; rank 0 evaluates, saves and "
                 "reports", args.kvstore, workers.rank, workers.count)
    return workers


def prepare_inputs(args, data):
    """Build the vocabulary and the word vectors of a new run.

    Returns
    -------
    tuple of (gluonnlp.Vocab, NDArray, pathlib.Path or None)
        The vocabulary, the (V, D) table and the GloVe file used.
    """
    glove = resolve_glove(args)
    vectors = load_glove(glove, data["train_all"] + data["dev"]
                         + data["test"])
    vocab = build_vocab(data["train_all"], pretrained_eval_tokens(
        data["dev"] + data["test"], vectors))
    embeddings = build_embeddings(vocab, vectors,
                                  np.random.RandomState(args.seed))
    return vocab, embeddings, glove


def save_inputs(save_dir, args, vocab, embeddings, glove):
    """Write a new run's settings, vocabulary and word vectors."""
    save_dir.mkdir(parents=True, exist_ok=True)
    checkpoint.write_json(save_dir / run_state.RUN_FILE,
                          {"args": vars(args), "glove": glove})
    checkpoint.atomic_write(save_dir / run_state.VOCAB_FILE,
                            lambda path: Path(path).write_text(
                                vocab.to_json(), encoding="utf-8"))
    checkpoint.atomic_write(save_dir / run_state.EMBEDDINGS_FILE,
                            lambda path: mx.nd.save(
                                path, {"embeddings": embeddings}))


def load_inputs(run_dir):
    """The vocabulary, word vectors and GloVe file of the run in
    ``run_dir`` (see :func:`save_inputs`)."""
    import gluonnlp as nlp
    run_dir = Path(run_dir)
    vocab = nlp.Vocab.from_json(
        (run_dir / run_state.VOCAB_FILE).read_text(encoding="utf-8"))
    table = mx.nd.load(str(run_dir / run_state.EMBEDDINGS_FILE))
    settings = json.loads((run_dir / run_state.RUN_FILE).read_text())
    return vocab, table["embeddings"], settings.get("glove")


def attach_all(data, vocab):
    """Attach word ids to every split; log and return the unknown counts."""
    unknown = {name: attach_vocab(data[name], vocab)
               for name in ("train", "dev", "test")}
    LOG.info("vocabulary %d words; tokens mapped to <unk>: %s", len(vocab),
             ", ".join(f"{k} {v}" for k, v in unknown.items()))
    return unknown


def run(args):
    """Train and evaluate as configured by ``args``; return the summary.

    A new run writes its inputs and checkpoints to ``--save-dir``; with
    ``--resume`` it continues from the checkpoints there.  On a worker of
    rank above 0 of a distributed job, returns ``{"rank": rank}`` after
    training.
    """
    wall_start = time.perf_counter()
    workers = join_job(args)
    seed_everything(args.seed)
    data = load_data(args)
    save_dir = Path(args.save_dir)
    if args.resume:
        vocab, embeddings, glove = load_inputs(save_dir)
    else:
        vocab, embeddings, glove = prepare_inputs(args, data)
    unknown = attach_all(data, vocab)
    ctx = mx.cpu()
    feed = None if args.tune_embeddings else embeddings
    if args.compare:
        model, trainer = build_model(args, embeddings, ctx)
        return {"compare": compare_speed(model, trainer, make_loss(),
                                         data["train"], feed, args)}
    if workers.chief and not args.resume:
        run_state.clear(save_dir)
        save_inputs(save_dir, args, vocab, embeddings, glove)
    models, member_stats = train_members(args, data, embeddings, feed, ctx,
                                         save_dir, workers)
    if not workers.chief:
        return {"rank": workers.rank}
    summary = summarize(args, data, models, member_stats, feed)
    summary.update({
        "workers": workers.count, "vocab_size": len(vocab),
        "unknown_tokens": unknown, "glove": glove,
        "wall_time_s": time.perf_counter() - wall_start})
    if data["source"] == "synthetic":
        loud("These scores come from a GENERATED corpus and MEAN NOTHING.")
    write_summary(save_dir, summary)
    return summary


def summarize(args, data, models, member_stats, feed):
    """Test metrics and training statistics of the trained ``models``."""
    summary = {"data": data["source"]}
    if len(models) == 1:
        test = evaluate(models[0], data["test"], feed)
        summary["best_dev"] = member_stats[0]["best_dev"]
    else:
        summary.update(evaluate_ensemble(models, member_stats, data, feed))
        test = summary.pop("ensemble_test")
    log_metrics("test", test)
    train_seconds = sum(m["train_seconds"] for m in member_stats)
    train_pairs = sum(m["train_pairs"] for m in member_stats)
    summary.update({
        "kvstore": args.kvstore,
        "test": {k: test[k] for k in ("pearson", "spearman", "mse")},
        "train_pairs_per_s": (train_pairs / train_seconds if train_seconds
                              else None),
        "train_seconds": train_seconds,
        "curves": [dict(m["curves"], seed=m["seed"]) for m in member_stats],
        "data_dir": data["data_dir"], "args": vars(args)})
    return summary


def train_members(args, data, embeddings, feed, ctx, save_dir,
                  workers=None):
    """Train the ``args.ensemble`` models, each selected on dev.

    Member ``k`` (from 0) uses seed ``args.seed + k`` and saves to
    ``save_dir/member{k + 1}``; a single model saves to ``save_dir``.  The
    first member is exactly the model a run without ``--ensemble`` trains.
    With ``--resume`` each member continues from its own last checkpoint
    (a member without one starts afresh).  In a distributed job
    (``workers``; one member) only rank 0 saves.

    Returns
    -------
    tuple of (list of SimilarityModel, list of dict)
        The models, at their best dev epoch, and their :func:`fit`
        statistics.
    """
    workers = workers or data_parallel.Workers()
    models, member_stats = [], []
    for k in range(args.ensemble):
        member_dir = save_dir
        if args.ensemble > 1:
            member_dir = save_dir / f"member{k + 1}"
            LOG.info("ensemble member %d of %d: seed %d", k + 1,
                     args.ensemble, args.seed + k)
        if k:
            seed_everything(args.seed + k)
        if workers.chief:
            member_dir.mkdir(parents=True, exist_ok=True)
        model, stats_ = train_member(args, data, embeddings, feed, ctx,
                                     member_dir, args.seed + k, workers)
        member_stats.append(stats_)
        models.append(model)
    return models, member_stats


def train_member(args, data, embeddings, feed, ctx, member_dir, seed,
                 workers):
    """Train (or go on training) one model in ``member_dir``.

    Returns
    -------
    tuple of (SimilarityModel, dict)
    """
    resumed = run_state.load(member_dir) if args.resume else None
    if resumed is None and workers.chief and member_dir != Path(
            args.save_dir):
        run_state.clear(member_dir)
    files = resumed[1] if resumed else None
    model, trainer = build_model(args, embeddings, ctx, workers, files)
    progress = None
    if resumed:
        progress = resumed[0]
        run_state.restore_generators(progress, resumed[2])
    stats_ = fit(model, trainer, data, feed, args, member_dir, seed,
                 workers, progress)
    del trainer  # leave_job needs the distributed trainer unreachable
    if workers.distributed:
        leave_job(model, member_dir, stats_, workers)
    return model, stats_


def leave_job(model, save_dir, stats, workers):
    """Leave the distributed job after training; rank 0 reloads its best.

    The kvstore is freed here (:meth:`data_parallel.Workers.leave`); only
    then can the model's parameters be loaded again, as the distributed
    trainer cannot take new values.
    """
    if not workers.leave(model.collect_params()):
        LOG.warning("the kvstore is still referenced: this worker may "
                    "not exit cleanly")
    if workers.chief and stats["best_dev"]["epoch"] is not None:
        model.load_parameters(str(save_dir / "best.params"))
        LOG.info("reloaded best parameters (epoch %d)",
                 stats["best_dev"]["epoch"])


def evaluate_ensemble(models, member_stats, data, feed):
    """Evaluate each member and the ensemble on dev and test.

    The ensemble averages the members' class distributions.  Nothing is
    selected here: each member's epoch was chosen on dev alone.

    Returns
    -------
    dict
        ``best_dev`` (the ensemble on dev, with the members' ``epochs``),
        ``members`` (seed, best dev epoch and metrics, test metrics of
        each member) and ``ensemble_test`` (metrics with predictions).
    """
    keys = ("pearson", "spearman", "mse")
    probs = {name: [predict_probs(m, data[name], feed) for m in models]
             for name in ("dev", "test")}
    members = []
    for k, (stats_, test_probs) in enumerate(zip(member_stats,
                                                 probs["test"])):
        test = score_metrics(test_probs, data["test"])
        log_metrics(f"member {k + 1} test", test)
        members.append({"seed": stats_["seed"],
                        "best_dev": stats_["best_dev"],
                        "test": {key: test[key] for key in keys}})
    dev = score_metrics(np.mean(probs["dev"], axis=0), data["dev"])
    log_metrics(f"ensemble of {len(models)} dev", dev)
    best_dev = {"epochs": [m["best_dev"]["epoch"] for m in members]}
    best_dev.update({key: dev[key] for key in keys})
    return {"best_dev": best_dev, "members": members,
            "ensemble_test": score_metrics(np.mean(probs["test"], axis=0),
                                           data["test"])}


def distributed_error(args):
    """What is wrong with the data-parallel flags of ``args``, or None."""
    if args.workers < 0 or args.servers < 1 or args.deadline <= 0:
        return "--workers, --servers or --deadline out of range"
    if not args.workers and args.kvstore == "local":
        return None
    if args.compare:
        return "--compare times one process; drop --workers and --kvstore"
    if args.ensemble > 1:
        return ("--ensemble trains its members one after the other in one "
                "process; use --ensemble 1 with --workers or --kvstore")
    return None


def launch_workers(args, argv):
    """Run this script as every process of a one-machine job.

    The data is fetched here first, once.  Then
    ``gluon_dynbatch.distributed.launch`` starts a scheduler, ``--servers``
    servers and ``--workers`` workers on 127.0.0.1, each running this script
    with the same arguments (``--kvstore dist_sync`` added unless a
    ``dist_*`` one is given; inside the job ``--workers`` starts nothing).
    Their logs go to ``SAVE_DIR/logs``; the workers' output is shown here.
    With ``--max-restarts N`` a job that loses a process is started again
    from the last checkpoint in ``SAVE_DIR``, up to N times.

    Returns
    -------
    int
        The launcher's exit code: 0, or non-zero when a process failed or
        the deadline passed.
    """
    load_data(args)
    if not args.resume:
        resolve_glove(args)
    child_argv = list(argv)
    if args.kvstore == "local":
        child_argv += ["--kvstore", "dist_sync"]
    command = [sys.executable, str(Path(__file__).resolve()), *child_argv]
    # each parameter on one server, as server_state's files need
    os.environ.setdefault("MXNET_KVSTORE_BIGARRAY_BOUND",
                          server_state.NO_SPLIT)
    cluster = launch.Cluster.local(args.workers, args.servers)
    return launch.run_job(command, cluster, args.workers, args.servers,
                          deadline=args.deadline,
                          log_dir=Path(args.save_dir) / "logs",
                          max_restarts=args.max_restarts,
                          checkpoint_dir=Path(args.save_dir))


def run_worker(args):
    """Run one worker of a distributed job; returns 0 or 2.

    A worker that fails cannot leave its job: ps-lite would block the other
    processes, and this one in Python's exit.  So on an error it prints it
    and ends the process at once (exit code 2 for bad data or a missing
    file, 1 otherwise), and the launcher ends the job.
    """
    try:
        run(args)
    except data_parallel.LaunchError as err:  # raised before joining
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (SickDataError, FileNotFoundError) as err:
        _exit_now(f"error: {err}", 2)
    except DataUnavailable as err:
        _exit_now(data_error_text(err), 2)
    except BaseException:  # noqa: B036 - any failure ends the worker
        _exit_now(traceback.format_exc(), 1)
    return 0


def _exit_now(message, code):
    """Print ``message`` to stderr and end the process without clean-up."""
    print(message, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


#: Flags ``--evaluate`` takes from the command line; the rest come from the
#: checkpoint's run directory when it has one.
EVALUATE_FLAGS = frozenset({"data_dir", "offline", "max_eval_pairs",
                            "verbose", "evaluate", "strategy",
                            "no_dynbatch"})


def checkpoint_files(target):
    """The parameter files and run directory of ``--evaluate TARGET``.

    A run directory gives its ``best.params`` (an ensemble's, every
    member's); a file gives itself, its run directory being the folder (or
    the folder above, for a member's file) that holds ``run.json``.

    Returns
    -------
    tuple of (list of pathlib.Path, pathlib.Path or None, pathlib.Path)
        The parameter files, the run directory and the stem of the files
        written (``<stem>.dev.predictions.txt`` ...).
    """
    target = Path(target)
    if target.is_dir():
        best = target / run_state.BEST_FILE
        members = sorted(target.glob(f"member*/{run_state.BEST_FILE}"))
        files = [best] if best.is_file() else members
        if not files:
            raise FileNotFoundError(f"--evaluate {target}: no "
                                    f"{run_state.BEST_FILE} in it")
        stem = target / ("best" if best.is_file() else "ensemble")
        return files, target, stem
    if not target.is_file():
        raise FileNotFoundError(f"--evaluate {target}: no such file")
    run_dir = next((d for d in (target.parent, target.parent.parent)
                    if (d / run_state.RUN_FILE).is_file()), None)
    return [target], run_dir, target.with_suffix("")


def evaluate_main(args, argv):
    """Score dev and test with ``--evaluate``'s checkpoint; write the
    predictions (one score a line, in the pairs' order) and metrics.

    Returns
    -------
    dict
        ``dev`` and ``test`` metrics and the files written.
    """
    files, run_dir, stem = checkpoint_files(args.evaluate)
    if run_dir is not None:
        saved = json.loads((run_dir / run_state.RUN_FILE).read_text())
        given = explicit_flags(argv) & EVALUATE_FLAGS
        args = argparse.Namespace(**{**vars(args), **saved["args"], **{
            k: getattr(args, k) for k in given}})
        args.max_pairs = None  # the vocabulary comes from the run
    data = load_data(args)
    if run_dir is not None:
        vocab, embeddings, _ = load_inputs(run_dir)
    else:
        vocab, embeddings, _ = prepare_inputs(args, data)
    attach_all(data, vocab)
    models = [load_model(args, embeddings, path) for path in files]
    feed = None if args.tune_embeddings else embeddings
    result = {"checkpoint": [str(f) for f in files]}
    for split in ("dev", "test"):
        metrics = evaluate(models, data[split], feed)
        log_metrics(split, metrics)
        out = Path(f"{stem}.{split}.predictions.txt")
        checkpoint.atomic_write(out, lambda path, m=metrics: np.savetxt(
            path, m["predictions"], fmt="%.17g"))
        result[split] = {k: metrics[k] for k in ("pearson", "spearman",
                                                 "mse")}
        result[f"{split}_predictions"] = str(out)
        print(f"{split}: pearson {metrics['pearson']:.4f}  spearman "
              f"{metrics['spearman']:.4f}  mse {metrics['mse']:.4f}  "
              f"| predictions: {out}")
    checkpoint.write_json(Path(f"{stem}.evaluation.json"), result)
    return result


def load_model(args, embeddings, path):
    """The model of ``args`` with the parameters of ``path``.

    Raises
    ------
    UsageError
        The parameters do not fit the model these settings describe.
    """
    model = make_model(args, embeddings, mx.cpu())
    try:
        model.load_parameters(str(path), ctx=mx.cpu())
    except (AssertionError, ValueError, mx.base.MXNetError) as err:
        first = str(err).strip().splitlines()[0] if str(err) else ""
        raise UsageError(f"{path} does not fit the model of these "
                         f"settings (--memory, --hidden, --encoder, "
                         f"--tune-embeddings, the vocabulary): {first}") \
            from None
    return model


#: Flags a resumed run may change; every other one is the run's own.
RESUME_MAY_CHANGE = frozenset({
    "epochs", "log_interval", "verbose", "resume", "save_dir", "data_dir",
    "glove", "offline", "deadline", "max_restarts", "servers"})


class UsageError(ValueError):
    """Flags that do not go together, or a path that is not what it
    should be."""


def explicit_flags(argv):
    """The destinations of the flags given in ``argv`` (not defaults)."""
    parser = build_parser()
    for action in parser._actions:  # noqa: SLF001 - argparse has no API
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def resume_args(args, argv, run_dir):
    """The settings of the run in ``run_dir``, with the flags a resumed run
    may change taken from ``args``.

    Raises
    ------
    UsageError
        ``run_dir`` holds no run, or ``argv`` changes one of its settings.
    """
    run_dir = Path(run_dir)
    settings = run_dir / run_state.RUN_FILE
    if not settings.is_file():
        raise UsageError(f"--resume {run_dir}: not a run directory (no "
                         f"{run_state.RUN_FILE}); --evaluate scores a "
                         ".params file")
    saved = json.loads(settings.read_text(encoding="utf-8"))["args"]
    given = explicit_flags(argv)
    clashes = [f"--{k.replace('_', '-')} {getattr(args, k)} (the run's: "
               f"{saved[k]})" for k in sorted(given - RESUME_MAY_CHANGE)
               if k in saved and getattr(args, k) != saved[k]]
    if clashes:
        raise UsageError("--resume continues a run with its own settings; "
                         "these differ: " + ", ".join(clashes))
    if "save_dir" in given and Path(args.save_dir).resolve() != \
            run_dir.resolve():
        raise UsageError("--resume writes into the run directory; drop "
                         "--save-dir")
    merged = {**vars(args), **saved}
    merged.update({k: getattr(args, k) for k in given})
    merged.update(resume=str(run_dir), save_dir=str(run_dir))
    return argparse.Namespace(**merged)


def check_args(args):
    """What is wrong with the flags of ``args``, or None."""
    for name in ("epochs", "batch_size", "compare", "log_interval",
                 "ensemble", "checkpoint_every", "max_restarts"):
        if getattr(args, name) < (1 if name in ("batch_size", "ensemble")
                                  else 0):
            return f"--{name.replace('_', '-')} out of range"
    for name in ("l2", "embed_lr"):
        if getattr(args, name) < 0:
            return f"--{name.replace('_', '-')} must not be negative"
    if args.tune_embeddings and args.lr <= 0:
        return "--tune-embeddings needs --lr > 0"
    if args.evaluate and (args.resume or args.workers or args.compare):
        return "--evaluate does not train: drop --resume, --workers, " \
               "--compare"
    return distributed_error(args)


def main(argv=None):
    """Command-line entry point.

    Returns
    -------
    int
        0 on success, 2 on bad data, a missing file or bad arguments; with
        ``--workers``, the launcher's exit code.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    setup_logging(args.verbose, "%(asctime)s %(levelname)s %(message)s")
    error = check_args(args)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.evaluate:
        return guarded(evaluate_main, args, argv)
    resume = args.resume or os.environ.get(launch.RESUME_ENV)
    if resume:
        try:
            args = resume_args(args, argv, resume)
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.workers and "DMLC_ROLE" not in os.environ:
        return guarded(launch_workers, args, argv)
    if args.kvstore != "local":
        return run_worker(args)
    return guarded(run, args)


def guarded(function, *call_args):
    """Call ``function``; an expected failure becomes a message and 2.

    Returns
    -------
    int
        2 after bad data, missing data or a bad path; else what
        ``function`` returned when it is an int, else 0.
    """
    try:
        result = function(*call_args)
    except SickDataError as err:
        print(f"error: malformed SICK data: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, UsageError,
            checkpoint.CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except DataUnavailable as err:
        print(data_error_text(err), file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


def data_error_text(err):
    """The message of a :class:`DataUnavailable`, with the instructions."""
    return (f"error: the data cannot be had: {err}\n\n"
            f"{data_sources.manual_instructions()}")


if __name__ == "__main__":
    sys.exit(main())
