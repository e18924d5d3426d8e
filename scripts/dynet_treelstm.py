#!/usr/bin/env python
"""Binary Tree-LSTM sentiment model on SST trees in DyNet, for throughput
comparisons with gluon_dynbatch.

The model is the one of ``examples/sst_model.py`` (same math, same weight
layout; ``--weights`` loads the weights exported there by ``save_weights``).
One process runs one autobatching setting, because ``dynet_config.set`` must
come before ``import dynet``::

    python scripts/dynet_treelstm.py --autobatch 1 --embed 128 --hidden 128 \\
        --batch-size 50 --train-batches 20 --warmup 2 --mode train

It prints (and with ``--json-out`` writes) a JSON object with sentences/s for
training (forward, backward, Adam update) and/or inference (forward only, the
same summed loss), and the loss of the first batch before any update.
"""
import argparse
import json
import logging
import os
import platform
import random
import sys
import time

# numpy is only used for I/O here: keep its BLAS from starting a thread pool.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from examples.sst_data import (  # noqa: E402  (path set up above)
    NUM_CLASSES, UNK, assign_ids, build_vocab, default_sst_dir, load_sst,
    load_sst_file)

logger = logging.getLogger("dynet_treelstm")

WEIGHT_NAMES = ("embedding", "leaf_iou_weight", "leaf_iou_bias", "iou_weight",
                "iou_bias", "forget_left_weight", "forget_right_weight",
                "forget_bias", "out_weight")
"""Same names as ``examples.sst_model.WEIGHT_NAMES`` (kept here so that this
process never imports mxnet)."""

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def parse_args(argv=None):
    """Parse the command line.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns
    -------
    argparse.Namespace
    """
    parser = argparse.ArgumentParser(
        description="DyNet binary Tree-LSTM on SST trees: training and "
                    "inference throughput (sentences/s) with or without "
                    "DyNet's autobatching.")
    parser.add_argument("--autobatch", type=int, choices=(0, 1), default=1,
                        help="DyNet autobatching off (0) or on (1)")
    parser.add_argument("--embed", type=int, default=128,
                        help="embedding size E")
    parser.add_argument("--hidden", type=int, default=128,
                        help="hidden size H")
    parser.add_argument("--batch-size", type=int, default=50,
                        help="trees per computation graph")
    parser.add_argument("--train-batches", type=int, default=20,
                        help="timed batches per mode")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed batches before the timed ones")
    parser.add_argument("--mode", choices=("train", "infer", "both"),
                        default="both", help="what to time")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU cores the process may use (affinity); "
                             "DyNet's CPU build computes on one thread")
    parser.add_argument("--data-dir", default=None,
                        help="folder with train.txt/dev.txt/test.txt "
                             "(default: ../shared/data/sst from the repo)")
    parser.add_argument("--split", choices=("train", "dev", "test"),
                        default="train", help="trees to run on")
    parser.add_argument("--trees", default=None, metavar="FILE",
                        help="read trees from FILE instead of "
                             "--data-dir/--split")
    parser.add_argument("--weights", default=None, metavar="FILE.npz",
                        help="initial weights (and vocabulary) exported by "
                             "examples/sst_model.py save_weights")
    parser.add_argument("--no-shuffle", action="store_true",
                        help="keep the trees in file order")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed for DyNet's initialisation and shuffling")
    parser.add_argument("--clip", type=float, default=0.0,
                        help="gradient clipping threshold; 0 disables it "
                             "(DyNet's default is 5, Gluon's Adam has none)")
    parser.add_argument("--mem", default="512",
                        help="DyNet memory pool in MB")
    parser.add_argument("--json-out", default=None, metavar="FILE",
                        help="also write the JSON result to FILE")
    parser.add_argument("--verbose", action="store_true",
                        help="log progress")
    args = parser.parse_args(argv)
    for name in ("embed", "hidden", "batch_size", "threads"):
        if getattr(args, name) < 1:
            parser.error("--%s must be positive" % name.replace("_", "-"))
    if args.train_batches < 1 or args.warmup < 0:
        parser.error("--train-batches must be >= 1 and --warmup >= 0")
    return args


def limit_threads(threads):
    """Restrict the process to ``threads`` cores before DyNet is imported.

    Parameters
    ----------
    threads : int
        Number of CPU cores (affinity) and of OpenMP/BLAS threads.

    Returns
    -------
    list of int
        The cores the process may run on.
    """
    for var in _THREAD_VARS:
        os.environ[var] = str(threads)
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))[:threads]
        os.sched_setaffinity(0, cores)
        return cores
    return []


def import_dynet(autobatch, seed, mem):
    """Configure and import DyNet (only once per process).

    Parameters
    ----------
    autobatch : int
        0 or 1.
    seed : int
        DyNet's random seed (0 would mean "random").
    mem : str
        Memory pool size in MB.

    Returns
    -------
    module
        The ``dynet`` module.
    """
    if "dynet" in sys.modules:
        raise RuntimeError("dynet was imported before its configuration")
    import dynet_config
    dynet_config.set(mem=mem, random_seed=seed, autobatch=autobatch)
    import dynet
    return dynet


def load_weights(path):
    """Read a weights file written by ``sst_model.save_weights``.

    Parameters
    ----------
    path : str

    Returns
    -------
    weights : dict
        :data:`WEIGHT_NAMES` -> float32 array.
    vocab : dict or None
        word -> id when the file holds a vocabulary.
    """
    with np.load(path) as data:
        missing = [name for name in WEIGHT_NAMES if name not in data.files]
        if missing:
            raise KeyError("%s lacks weights %s" % (path, missing))
        weights = {name: data[name].astype(np.float32)
                   for name in WEIGHT_NAMES}
        vocab = None
        if "vocab" in data.files:
            vocab = {str(word): i for i, word in enumerate(data["vocab"])}
    return weights, vocab


def expected_shapes(vocab_size, embed, hidden):
    """Shapes of the weights, in the layout of :data:`WEIGHT_NAMES`.

    Returns
    -------
    dict
        name -> shape tuple.
    """
    return {"embedding": (vocab_size, embed),
            "leaf_iou_weight": (3 * hidden, embed),
            "leaf_iou_bias": (3 * hidden,),
            "iou_weight": (3 * hidden, 2 * hidden),
            "iou_bias": (3 * hidden,),
            "forget_left_weight": (hidden, hidden),
            "forget_right_weight": (hidden, hidden),
            "forget_bias": (hidden,),
            "out_weight": (NUM_CLASSES, hidden)}


class DyNetTreeLSTM:
    """The binary Tree-LSTM of ``examples/sst_model.py`` in DyNet.

    Parameters
    ----------
    dy : module
        The imported ``dynet`` module.
    vocab_size, embed, hidden : int
        Sizes V, E, H.
    weights : dict, optional
        Initial weights by :data:`WEIGHT_NAMES`; DyNet's default
        initialisation otherwise (zeros for biases).
    """

    def __init__(self, dy, vocab_size, embed, hidden, weights=None):
        self.dy = dy
        self.hidden = hidden
        self.vocab_size = vocab_size
        self.pc = dy.ParameterCollection()
        shapes = expected_shapes(vocab_size, embed, hidden)
        self.embedding = self.pc.add_lookup_parameters(shapes["embedding"])
        self.params = {}
        for name in WEIGHT_NAMES[1:]:
            init = dy.ConstInitializer(0.0) if name.endswith("bias") else None
            self.params[name] = self.pc.add_parameters(shapes[name], init=init)
        if weights is not None:
            self.set_weights(weights, shapes)

    def set_weights(self, weights, shapes):
        """Copy numpy weights into the DyNet parameters (shape-checked)."""
        for name, shape in shapes.items():
            if weights[name].shape != shape:
                raise ValueError("weight %s has shape %s, expected %s"
                                 % (name, weights[name].shape, shape))
        self.embedding.init_from_array(weights["embedding"])
        for name, param in self.params.items():
            param.set_value(weights[name])

    def _gates(self, z):
        """Split (3H,) pre-activations into sigmoid i, sigmoid o, tanh u."""
        dy, hid = self.dy, self.hidden
        return (dy.logistic(dy.pick_range(z, 0, hid)),
                dy.logistic(dy.pick_range(z, hid, 2 * hid)),
                dy.tanh(dy.pick_range(z, 2 * hid, 3 * hid)))

    def _leaf(self, word_id):
        """State (h, c) of a pre-terminal."""
        dy, p = self.dy, self.params
        z = dy.affine_transform([p["leaf_iou_bias"], p["leaf_iou_weight"],
                                 dy.lookup(self.embedding, word_id)])
        i, o, u = self._gates(z)
        c = dy.cmult(i, u)
        return dy.cmult(o, dy.tanh(c)), c

    def _internal(self, left, right):
        """State (h, c) of an internal node from its children's states."""
        dy, p = self.dy, self.params
        (h1, c1), (h2, c2) = left, right
        z = dy.affine_transform([p["iou_bias"], p["iou_weight"],
                                 dy.concatenate([h1, h2])])
        i, o, u = self._gates(z)
        f1 = dy.logistic(dy.affine_transform(
            [p["forget_bias"], p["forget_left_weight"], h1]))
        f2 = dy.logistic(dy.affine_transform(
            [p["forget_bias"], p["forget_right_weight"], h2]))
        c = dy.cmult(i, u) + dy.cmult(f1, c1) + dy.cmult(f2, c2)
        return dy.cmult(o, dy.tanh(c)), c

    def node_losses(self, tree, losses):
        """Build the graph of ``tree``, appending one loss per node.

        Parameters
        ----------
        tree : SSTTree
            Binary tree with word ids.
        losses : list
            Receives the per-node loss expressions.

        Returns
        -------
        tuple of dynet.Expression
            (h, c) of the root.
        """
        if tree.is_preterminal:
            state = self._leaf(tree.word_id)
        else:
            left, right = tree.children
            state = self._internal(self.node_losses(left, losses),
                                   self.node_losses(right, losses))
        logits = self.params["out_weight"] * state[0]
        losses.append(self.dy.pickneglogsoftmax(logits, tree.label))
        return state

    def batch_loss(self, trees):
        """New graph holding the summed loss of ``trees``.

        Returns
        -------
        dynet.Expression
        """
        self.dy.renew_cg()
        losses = []
        for tree in trees:
            self.node_losses(tree, losses)
        return self.dy.esum(losses)


def load_trees(args, vocab):
    """Trees to run on, with word ids from ``vocab`` (built when None).

    Returns
    -------
    trees : list of SSTTree
    vocab : dict
    """
    if args.trees:
        trees = load_sst_file(args.trees)
        vocab_source = trees
    else:
        data_dir = args.data_dir or default_sst_dir()
        if data_dir is None:
            raise FileNotFoundError("SST data not found: pass --data-dir "
                                    "(the folder with train.txt) or "
                                    "--trees FILE")
        trees = load_sst(data_dir, args.split)
        vocab_source = trees if args.split == "train" else None
        if vocab is None and vocab_source is None:
            vocab_source = load_sst(data_dir, "train")
    if vocab is None:
        vocab = build_vocab(vocab_source)
    if UNK not in vocab:
        raise ValueError("vocabulary lacks the UNK token %r" % UNK)
    bad = [t.to_string()[:60] for t in trees if not t.is_binary()]
    if bad:
        raise ValueError("non-binary trees, e.g. %s" % bad[0])
    return assign_ids(trees, vocab), vocab


def iter_batches(trees, batch_size, shuffle, rng):
    """Endless stream of batches; reshuffles after each pass when asked.

    Yields
    ------
    list of SSTTree
    """
    if not trees:
        raise ValueError("no trees to batch")
    order = list(range(len(trees)))
    while True:
        if shuffle:
            rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield [trees[i] for i in order[start:start + batch_size]]
        if len(order) < batch_size:
            yield [trees[i] for i in order]


def build(dy, args):
    """Load weights and trees and build the model.

    Returns
    -------
    model : DyNetTreeLSTM
    trees : list of SSTTree
    """
    weights, vocab = None, None
    if args.weights:
        weights, vocab = load_weights(args.weights)
    trees, vocab = load_trees(args, vocab)
    model = DyNetTreeLSTM(dy, len(vocab), args.embed, args.hidden, weights)
    return model, trees


def run_mode(model, trainer, batches, args):
    """Run warm-up plus timed batches of one mode.

    Parameters
    ----------
    model : DyNetTreeLSTM
    trainer : dynet.Trainer or None
        None for inference (forward only).
    batches : iterator of list of SSTTree
    args : argparse.Namespace

    Returns
    -------
    dict
        ``sentences_per_s``, ``seconds``, ``sentences``, ``batches`` and
        the ``losses`` of every batch (warm-up included), in order.
    """
    losses, sentences, start = [], 0, None
    for step in range(args.warmup + args.train_batches):
        if step == args.warmup:
            start, sentences = time.perf_counter(), 0
        batch = next(batches)
        loss = model.batch_loss(batch)
        losses.append(loss.value())
        if trainer is not None:
            loss.backward()
            trainer.update()
        sentences += len(batch)
        if args.verbose:
            logger.info("batch %d loss %.4f", step, losses[-1])
    seconds = time.perf_counter() - start
    return {"sentences_per_s": sentences / seconds, "seconds": seconds,
            "sentences": sentences, "batches": args.train_batches,
            "losses": losses}


def os_threads():
    """Number of OS threads of this process (Linux), else None."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def main(argv=None):
    """Run the benchmark and print the JSON result.

    Parameters
    ----------
    argv : list of str, optional

    Returns
    -------
    dict
        The result that was printed.
    """
    args = parse_args(argv)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(name)s: %(message)s")
    cores = limit_threads(args.threads)
    dy = import_dynet(args.autobatch, args.seed, args.mem)
    try:
        model, trees = build(dy, args)
    except (OSError, KeyError, ValueError) as err:
        raise SystemExit("dynet_treelstm: error: %s" % err) from None
    rng = random.Random(args.seed)
    batches = iter_batches(trees, args.batch_size, not args.no_shuffle, rng)
    result = {"framework": "dynet", "autobatch": args.autobatch,
              "embed": args.embed, "hidden": args.hidden,
              "batch_size": args.batch_size, "vocab_size": model.vocab_size,
              "trees": len(trees), "warmup": args.warmup, "cores": cores,
              "clip": args.clip, "python": platform.python_version()}
    if args.mode in ("train", "both"):
        trainer = dy.AdamTrainer(model.pc)
        trainer.set_clip_threshold(args.clip)
        result["train"] = run_mode(model, trainer, batches, args)
    if args.mode in ("infer", "both"):
        result["infer"] = run_mode(model, None, batches, args)
    first = result.get("train", result.get("infer"))
    result["first_batch_loss"] = first["losses"][0]
    result["os_threads"] = os_threads()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as handle:
            handle.write(text + "\n")
    return result


if __name__ == "__main__":
    main()
