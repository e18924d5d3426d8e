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

from examples import data_parallel, data_sources, sick_data  # noqa: E402
from examples.data_sources import DataUnavailable  # noqa: E402
from examples.progress_logging import setup_logging  # noqa: E402
from examples.sick_data import SickDataError  # noqa: E402
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
    add("--memory", type=int, default=150,
        help="Tree-LSTM memory size (default: %(default)s)")
    add("--hidden", type=int, default=50,
        help="hidden units of the similarity layer (default: %(default)s)")
    add("--max-pairs", type=int, default=None,
        help="use at most this many training pairs, for quick runs; the "
             "vocabulary still covers all training tokens, and the dev and "
             "test words that have a GloVe vector (default: all)")
    add("--max-eval-pairs", type=int, default=None,
        help="use at most this many dev and test pairs (default: all)")
    add("--seed", type=int, default=42,
        help="seed for random, numpy and mxnet (default: %(default)s)")
    add("--strategy", default=None,
        help="gluon_dynbatch batching strategy (default: the library's)")
    add("--no-dynbatch", action="store_true",
        help="run the same model eagerly, one sample at a time")
    add("--compare", type=int, default=0, metavar="N",
        help="time N training batches with and without dynbatch, print "
             "the speedup and exit")
    add("--resume", default=None, metavar="FILE",
        help="load parameters (and FILE.states, the optimiser state, if "
             "present) before training; with --epochs 0 only evaluates")
    add("--save-dir", default="runs/sick",
        help="where best.params, last.params and summary.json go "
             "(default: %(default)s)")
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
    """This process's batches of one epoch and the pairs all workers train.

    One process: every pair, shuffled.  A distributed job: this worker's
    slice of every complete global batch (:func:`data_parallel.shard_batches`).

    Returns
    -------
    tuple of (iterator of list of SickPair, int)
    """
    if not workers.distributed:
        return iter_batches(pairs, batch_size, rng), len(pairs)
    steps = data_parallel.global_steps(len(pairs), batch_size, workers)
    return (data_parallel.shard_batches(pairs, batch_size, rng, workers),
            steps * batch_size * workers.count)


def train_epoch(model, trainer, loss_fn, pairs, embeddings, args, epoch,
                rng, workers=None):
    """Train one epoch with a progress bar (rank 0's only).

    Parameters
    ----------
    workers : data_parallel.Workers, optional
        This process's place in a data-parallel job (default: one
        process).

    Returns
    -------
    tuple of (float, float, int)
        Mean loss per pair of this process's batches, training seconds and
        the pairs trained by all workers.
    """
    workers = workers or data_parallel.Workers()
    batches, global_pairs = epoch_batches(pairs, args.batch_size, rng,
                                          workers)
    total = mx.nd.zeros((1,))
    window, window_pairs, local_pairs = mx.nd.zeros((1,)), 0, 0
    start = time.perf_counter()
    bar = tqdm(total=global_pairs, unit="pair", desc=f"epoch {epoch}",
               leave=False, dynamic_ncols=True, disable=not workers.chief)
    for step, batch in enumerate(batches, start=1):
        loss = train_step(model, trainer, loss_fn, batch, embeddings,
                          args.l2, workers.step_size(len(batch)))
        total += loss
        window += loss
        window_pairs += len(batch)
        local_pairs += len(batch)
        bar.update(len(batch) * workers.count)
        if args.log_interval and step % args.log_interval == 0:
            mean = window.asscalar() / window_pairs
            bar.set_postfix(loss=f"{mean:.4f}")
            LOG.info("epoch %d batch %d: loss %.4f", epoch, step, mean)
            window, window_pairs = mx.nd.zeros((1,)), 0
    mean_loss = total.asscalar() / max(local_pairs, 1)
    mx.nd.waitall()
    seconds = time.perf_counter() - start
    bar.close()
    return mean_loss, seconds, global_pairs


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


def build_model(args, embeddings, ctx, workers=None):
    """Create and initialise the model and its AdaGrad trainer.

    Parameters
    ----------
    args : argparse.Namespace
    embeddings : NDArray
        The (V, D) word vectors; with ``--tune-embeddings`` they initialise
        the model's own table, with learning rate ``--embed-lr``.
    ctx : mxnet.Context
    workers : data_parallel.Workers, optional
        In a distributed job the trainer updates the parameters on the
        servers; their optimiser state stays there (``--resume`` then
        loads the parameters only).

    Returns
    -------
    tuple of (SimilarityModel, mxnet.gluon.Trainer)
    """
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
    if args.resume:
        if not Path(args.resume).is_file():
            raise FileNotFoundError(f"--resume file not found: {args.resume}")
        model.load_parameters(args.resume, ctx=ctx)
        LOG.info("resumed parameters from %s", args.resume)
    workers = workers or data_parallel.Workers()
    kvstore = {"kvstore": workers.kvstore} if workers.distributed else {}
    trainer = gluon.Trainer(model.collect_params(), "adagrad",
                            {"learning_rate": args.lr, "wd": args.wd},
                            **kvstore)
    if workers.distributed:
        data_parallel.keep_multipliers_on_servers(trainer,
                                                  model.collect_params())
    states = Path(str(args.resume) + ".states") if args.resume else None
    if states is not None and states.is_file():
        if workers.distributed:
            LOG.warning("optimiser state %s not loaded: on a distributed "
                        "kvstore it lives on the servers", states)
        else:
            trainer.load_states(str(states))
            LOG.info("resumed optimiser state from %s", states)
    return model, trainer


def fit(model, trainer, data, embeddings, args, save_dir, seed=None,
        workers=None):
    """Train for ``args.epochs``, keeping the best-dev parameters.

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
        Where best.params and last.params go.
    seed : int, optional
        Seed of the batch order (default: ``args.seed``).
    workers : data_parallel.Workers, optional
        In a distributed job only rank 0 evaluates and saves.

    Returns
    -------
    dict
        Training statistics (best epoch, best dev metrics, pairs/s).
    """
    workers = workers or data_parallel.Workers()
    loss_fn = make_loss()
    rng = np.random.RandomState(args.seed if seed is None else seed)
    best = {"epoch": None, "pearson": -np.inf}
    train_seconds, train_pairs = 0.0, 0
    for epoch in range(1, args.epochs + 1):
        loss, seconds, pairs = train_epoch(model, trainer, loss_fn,
                                           data["train"], embeddings, args,
                                           epoch, rng, workers)
        train_seconds += seconds
        train_pairs += pairs
        LOG.info("epoch %d: train loss %.4f, %.1f s, %.1f pairs/s", epoch,
                 loss, seconds, pairs / seconds)
        if workers.chief:
            best = checkpoint(model, trainer, data["dev"], embeddings,
                              save_dir, epoch, best, workers)
    if best["epoch"] is not None and not workers.distributed:
        model.load_parameters(str(save_dir / "best.params"))
        LOG.info("reloaded best parameters (epoch %d)", best["epoch"])
    pairs_per_s = train_pairs / train_seconds if train_seconds else None
    return {"best_dev": best, "train_pairs_per_s": pairs_per_s,
            "train_seconds": train_seconds, "train_pairs": train_pairs,
            "seed": args.seed if seed is None else seed}


def checkpoint(model, trainer, dev_pairs, embeddings, save_dir, epoch, best,
               workers):
    """Evaluate on dev after ``epoch`` and save; return the best so far.

    Saves ``last.params`` (with ``last.params.states`` in one process; a
    distributed kvstore keeps the optimiser state on the servers) and, when
    dev Pearson improves on ``best``, ``best.params``.
    """
    dev = evaluate(model, dev_pairs, embeddings)
    log_metrics(f"epoch {epoch} dev", dev)
    model.save_parameters(str(save_dir / "last.params"))
    if not workers.distributed:
        trainer.save_states(str(save_dir / "last.params.states"))
    if dev["pearson"] > best["pearson"]:
        best = {"epoch": epoch, "pearson": dev["pearson"],
                "spearman": dev["spearman"], "mse": dev["mse"]}
        best_file = save_dir / "best.params"
        model.save_parameters(str(best_file))
        LOG.info("new best dev pearson; saved %s", best_file)
    return best


def write_summary(save_dir, summary):
    """Print the summary and write it to ``save_dir/summary.json``."""
    path = save_dir / "summary.json"
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2, default=str)
    test = summary["test"]
    print(f"test ({summary['data']}): pearson {test['pearson']:.4f}  "
          f"spearman {test['spearman']:.4f}  mse {test['mse']:.4f}  "
          f"| wall {summary['wall_time_s']:.1f} s  "
          f"train {summary['train_pairs_per_s'] or 0:.1f} pairs/s  "
          f"| summary: {path}")
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


def run(args):
    """Train and evaluate as configured by ``args``; return the summary.

    On a worker of rank above 0 of a distributed job, returns
    ``{"rank": rank}`` after training.
    """
    wall_start = time.perf_counter()
    workers = join_job(args)
    seed_everything(args.seed)
    data = load_data(args)
    glove = resolve_glove(args)
    vectors = load_glove(glove, data["train_all"] + data["dev"]
                         + data["test"])
    vocab = build_vocab(data["train_all"], pretrained_eval_tokens(
        data["dev"] + data["test"], vectors))
    unknown = {}
    for name in ("train", "dev", "test"):
        unknown[name] = attach_vocab(data[name], vocab)
    LOG.info("vocabulary %d words; tokens mapped to <unk>: %s", len(vocab),
             ", ".join(f"{k} {v}" for k, v in unknown.items()))
    embeddings = build_embeddings(vocab, vectors,
                                  np.random.RandomState(args.seed))
    ctx = mx.cpu()
    if args.tune_embeddings:
        feed = None  # every model trains its own copy of the table
    else:
        feed = embeddings
    if args.compare:
        model, trainer = build_model(args, embeddings, ctx)
        return {"compare": compare_speed(model, trainer, make_loss(),
                                         data["train"], feed, args)}
    save_dir = Path(args.save_dir)
    models, member_stats = train_members(args, data, embeddings, feed, ctx,
                                         save_dir, workers)
    if not workers.chief:
        return {"rank": workers.rank}
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
        "kvstore": args.kvstore, "workers": workers.count,
        "test": {k: test[k] for k in ("pearson", "spearman", "mse")},
        "wall_time_s": time.perf_counter() - wall_start,
        "train_pairs_per_s": (train_pairs / train_seconds if train_seconds
                              else None),
        "train_seconds": train_seconds,
        "vocab_size": len(vocab), "unknown_tokens": unknown,
        "glove": glove, "data_dir": data["data_dir"],
        "args": vars(args)})
    if data["source"] == "synthetic":
        loud("These scores come from a GENERATED corpus and MEAN NOTHING.")
    write_summary(save_dir, summary)
    return summary


def train_members(args, data, embeddings, feed, ctx, save_dir,
                  workers=None):
    """Train the ``args.ensemble`` models, each selected on dev.

    Member ``k`` (from 0) uses seed ``args.seed + k`` and saves to
    ``save_dir/member{k + 1}``; a single model saves to ``save_dir``.  The
    first member is exactly the model a run without ``--ensemble`` trains.
    In a distributed job (``workers``; one member) only rank 0 saves.

    Returns
    -------
    tuple of (list of SimilarityModel, list of dict)
        The models, at their best dev epoch, and their :func:`fit`
        statistics.
    """
    models, member_stats = [], []
    for k in range(args.ensemble):
        member_dir = save_dir
        if args.ensemble > 1:
            member_dir = save_dir / f"member{k + 1}"
            LOG.info("ensemble member %d of %d: seed %d", k + 1,
                     args.ensemble, args.seed + k)
        if k:
            seed_everything(args.seed + k)
        if workers is None or workers.chief:
            member_dir.mkdir(parents=True, exist_ok=True)
        model, trainer = build_model(args, embeddings, ctx, workers)
        member_stats.append(fit(model, trainer, data, feed, args,
                                member_dir, args.seed + k, workers))
        del trainer  # leave_job needs the distributed trainer unreachable
        if workers is not None and workers.distributed:
            leave_job(model, member_dir, member_stats[-1], workers)
        models.append(model)
    return models, member_stats


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

    ``gluon_dynbatch.distributed.launch`` starts a scheduler, ``--servers``
    servers and ``--workers`` workers on 127.0.0.1, each running this script
    with the same arguments (``--kvstore dist_sync`` added unless a
    ``dist_*`` one is given; inside the job ``--workers`` starts nothing).
    Their logs go to ``SAVE_DIR/logs``; the workers' output is shown here.

    Returns
    -------
    int
        The launcher's exit code: 0, or non-zero when a process failed or
        the deadline passed.
    """
    from gluon_dynbatch.distributed import launch
    child_argv = list(sys.argv[1:] if argv is None else argv)
    if args.kvstore == "local":
        child_argv += ["--kvstore", "dist_sync"]
    command = [sys.executable, str(Path(__file__).resolve()), *child_argv]
    cluster = launch.Cluster.local(args.workers, args.servers)
    return launch.run_job(command, cluster, args.workers, args.servers,
                          deadline=args.deadline,
                          log_dir=Path(args.save_dir) / "logs")


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


def main(argv=None):
    """Command-line entry point.

    Returns
    -------
    int
        0 on success, 2 on bad data, a missing file or bad arguments; with
        ``--workers``, the launcher's exit code.
    """
    args = parse_args(argv)
    setup_logging(args.verbose, "%(asctime)s %(levelname)s %(message)s")
    for name in ("epochs", "batch_size", "compare", "log_interval",
                 "ensemble"):
        if getattr(args, name) < (1 if name in ("batch_size", "ensemble")
                                  else 0):
            print(f"error: --{name.replace('_', '-')} out of range",
                  file=sys.stderr)
            return 2
    for name in ("l2", "embed_lr"):
        if getattr(args, name) < 0:
            print(f"error: --{name.replace('_', '-')} must not be negative",
                  file=sys.stderr)
            return 2
    if args.tune_embeddings and args.lr <= 0:
        print("error: --tune-embeddings needs --lr > 0", file=sys.stderr)
        return 2
    if args.ensemble > 1 and args.resume:
        print("error: --resume loads one model; it does not combine with "
              "--ensemble", file=sys.stderr)
        return 2
    error = distributed_error(args)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.workers and "DMLC_ROLE" not in os.environ:
        try:  # fetch once, here, rather than in every worker
            load_data(args)
            resolve_glove(args)
        except (DataUnavailable, FileNotFoundError, SickDataError) as err:
            print(data_error_text(err) if isinstance(err, DataUnavailable)
                  else f"error: {err}", file=sys.stderr)
            return 2
        return launch_workers(args, argv)
    if args.kvstore != "local":
        return run_worker(args)
    try:
        run(args)
    except SickDataError as err:
        print(f"error: malformed SICK data: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except DataUnavailable as err:
        print(data_error_text(err), file=sys.stderr)
        return 2
    return 0


def data_error_text(err):
    """The message of a :class:`DataUnavailable`, with the instructions."""
    return (f"error: the data cannot be had: {err}\n\n"
            f"{data_sources.manual_instructions()}")


if __name__ == "__main__":
    sys.exit(main())
