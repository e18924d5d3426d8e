"""Greedy decoding, batched: a sequence-to-sequence model whose samples read values.

The task is made by the script: reverse a string of digits (``--task copy``
copies it), 3 to 12 digits long.  An LSTM encoder and an LSTM decoder that
attends over the encoder's states (dot-product attention) are written one
sentence at a time.  Training uses teacher forcing inside ``gdb.batching()``.
Decoding is greedy: each step reads the argmax of the scores
(``int(F.argmax(...).asscalar())``) and a sentence stops at its
end-of-sentence token, so every sentence takes its own number of steps.

Inside one scope, ``gdb.map(model, sources)`` runs each sentence as a task:
a sentence that reads a pending value waits while the others record, and
each round of reads runs once, batched over every sentence still decoding.

At the end the script decodes ``--samples`` test sentences eagerly, one
after another, and batched, in ``--rounds`` interleaved rounds on sentences
neither has seen; it checks that both give the same tokens and the same
scores and reports the speed-up.

Run from the repository root::

    python examples/greedy_decoder.py --epochs 6 --samples 64
"""
import argparse
import logging
import random
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon, nd  # noqa: E402
from mxnet.gluon import nn, rnn  # noqa: E402
from tqdm import tqdm  # noqa: E402

import gluon_dynbatch as gdb  # noqa: E402
from examples.arguments import count  # noqa: E402
from examples.progress_logging import setup_logging  # noqa: E402

LOG = logging.getLogger("greedy_decoder")

BOS, EOS = 10, 11
"""Token ids after the ten digits: start and end of a sentence."""
VOCAB = 12
TASKS = {"reverse": lambda digits: digits[::-1], "copy": list}


class Seq2Seq(gdb.DynBatchBlock):
    """An LSTM encoder and an attending LSTM decoder, one sentence per call.

    ``model(source, target)`` is the teacher-forced loss of ``target`` (a
    (1,) array, summed over its words and end-of-sentence);
    ``model(source)`` decodes greedily and returns ``(tokens, score)``: the
    token ids before end-of-sentence and the sum of their log-probabilities;
    ``model(source, None, random.Random(seed))`` samples them instead.

    Parameters
    ----------
    hidden : int
        Size of the LSTM states.
    embed : int
        Size of the token embeddings.
    max_len : int
        Most tokens a greedy decode emits (end-of-sentence included).
    """

    def __init__(self, hidden=64, embed=32, max_len=16, **kwargs):
        super().__init__(**kwargs)
        self.max_len = max_len
        with self.name_scope():
            self.embed = nn.Embedding(VOCAB, embed)
            self.encoder = rnn.LSTMCell(hidden)
            self.decoder = rnn.LSTMCell(hidden)
            self.combine = nn.Dense(hidden, activation="tanh")
            self.out = nn.Dense(VOCAB)

    def hybrid_forward(self, F, source, target=None, rng=None):
        keys, state = self.encode(F, source)
        if target is not None:
            return self.teacher_forced(F, keys, state, target)
        if rng is not None:
            return self.sample(F, keys, state, rng)
        return self.greedy(F, keys, state)

    def encode(self, F, source):
        """The encoder's states, one row per source token, and its last state."""
        words = self.embed(F.array(source))
        state = self.encoder.begin_state(batch_size=1)
        keys = []
        for t in range(len(source)):
            h, state = self.encoder(words[t:t + 1], state)
            keys.append(h)
        return F.concat(*keys, dim=0), state

    def step(self, F, token, state, keys):
        """One decoder step from ``token``: the scores of the next token and the state."""
        h, state = self.decoder(self.embed(F.array([token])), state)
        weights = F.softmax(F.dot(h, keys, transpose_b=True), axis=1)
        context = F.dot(weights, keys)
        return self.out(self.combine(F.concat(h, context, dim=1))), state

    def teacher_forced(self, F, keys, state, target):
        """The loss of ``target`` followed by end-of-sentence, fed the true previous token."""
        total, previous = 0, BOS
        for word in list(target) + [EOS]:
            logits, state = self.step(F, previous, state, keys)
            total = total - F.pick(F.log_softmax(logits, axis=1), F.array([word]), axis=1)
            previous = word
        return total

    def greedy(self, F, keys, state):
        """Tokens chosen by the argmax of each step's scores, until end-of-sentence."""
        token, tokens, score = BOS, [], 0
        for _ in range(self.max_len):
            logits, state = self.step(F, token, state, keys)
            token = int(F.argmax(logits, axis=1).asscalar())        # a read: the sample waits
            score = score + F.pick(F.log_softmax(logits, axis=1), F.array([token]), axis=1)
            if token == EOS:
                break
            tokens.append(token)
        return tokens, score


    def sample(self, F, keys, state, rng):
        """Tokens drawn from each step's distribution with ``rng`` (``random.Random``),
        until end-of-sentence: the probabilities are read (``asnumpy``)."""
        token, tokens, score = BOS, [], 0
        for _ in range(self.max_len):
            logits, state = self.step(F, token, state, keys)
            probs = F.softmax(logits, axis=1)
            cumulative = np.cumsum(probs.asnumpy()[0])             # a read: the sample waits
            token = min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1])),
                        VOCAB - 1)
            score = score + F.pick(F.log(probs), F.array([token]), axis=1)
            if token == EOS:
                break
            tokens.append(token)
        return tokens, score


def make_pairs(count, rng, task="reverse", lengths=(3, 12)):
    """``count`` (source, target) pairs of digit lists for ``task``.

    Parameters
    ----------
    count : int
    rng : random.Random
    task : str
        A key of :data:`TASKS`.
    lengths : tuple of int
        Shortest and longest source, inclusive.

    Returns
    -------
    list of tuple
    """
    pairs = []
    for _ in range(count):
        source = [rng.randrange(10) for _ in range(rng.randint(*lengths))]
        pairs.append((source, TASKS[task](source)))
    return pairs


def train(model, pairs, epochs, batch_size, lr, seed, progress=True):
    """Teacher-forced training, each batch's sentences recorded in one scope.

    Returns
    -------
    list of float
        The mean loss per sentence of every batch.
    """
    trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": lr})
    order, losses = list(range(len(pairs))), []
    shuffle = random.Random(seed)
    for epoch in range(epochs):
        shuffle.shuffle(order)
        starts = range(0, len(order), batch_size)
        for start in tqdm(starts, desc="epoch %d" % (epoch + 1), disable=not progress):
            batch = [pairs[i] for i in order[start:start + batch_size]]
            with autograd.record():
                with gdb.batching():
                    sentence_losses = [model(source, target) for source, target in batch]
                loss = nd.add_n(*sentence_losses) / len(batch)
            loss.backward()
            trainer.step(1)
            losses.append(float(loss.asscalar()))
        LOG.info("epoch %d: mean loss %.4f", epoch + 1,
                 statistics.mean(losses[-len(starts):]))
    return losses


def decode(model, sources, batched):
    """Greedy decodes of ``sources``: eagerly one by one, or as tasks of one scope.

    Returns
    -------
    list of tuple
        ``(tokens, score)`` per source; ``score`` a (1,) NDArray.
    """
    if batched:
        return gdb.map(model, sources)
    return [model(source) for source in sources]


def accuracy(decoded, pairs):
    """Fraction of sentences decoded exactly (every token, and the stop)."""
    return statistics.mean(tokens == target for (tokens, _), (_, target) in zip(decoded, pairs))


def same_decodes(first, second, rtol=1e-4, atol=1e-5):
    """Whether two lists of decodes have the same tokens and scores equal to rounding."""
    return all(a_tokens == b_tokens and np.allclose(a_score.asnumpy(), b_score.asnumpy(),
                                                    rtol=rtol, atol=atol)
               for (a_tokens, a_score), (b_tokens, b_score) in zip(first, second))


def time_decoding(model, source_sets):
    """Decode each set eagerly and batched, in alternating order; compare and time.

    Returns
    -------
    list of dict
        Per set: ``eager_ms``, ``batched_ms``, ``x_eager``, ``same``, ``flushes``,
        ``longest`` (most tokens of a sentence) and ``reads``.
    """
    rows = []
    for index, sources in enumerate(source_sets):
        times, results, stats = {}, {}, None
        for batched in ((False, True) if index % 2 == 0 else (True, False)):
            mx.nd.waitall()
            begin = time.perf_counter()
            if batched:
                with gdb.batching() as scope:
                    results[batched] = gdb.map(model, sources)
                stats = scope.stats
            else:
                results[batched] = decode(model, sources, batched=False)
            mx.nd.waitall()
            times[batched] = 1000 * (time.perf_counter() - begin)
        rows.append({"eager_ms": times[False], "batched_ms": times[True],
                     "x_eager": times[False] / times[True],
                     "same": same_decodes(results[False], results[True]),
                     "flushes": stats.flushes, "reads": stats.reads,
                     "longest": 1 + max(len(tokens) for tokens, _ in results[False])})
    return rows


def build_parser():
    """The command-line parser."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--task", choices=sorted(TASKS), default="reverse")
    add("--train-pairs", type=count(1), default=3000)
    add("--test-pairs", type=count(1), default=200)
    add("--epochs", type=count(0), default=6)
    add("--batch-size", type=count(1), default=32)
    add("--lr", type=float, default=0.005)
    add("--hidden", type=count(1), default=64)
    add("--samples", type=count(1), default=64, help="sentences decoded per timed round")
    add("--rounds", type=count(1), default=3, help="timed rounds of eager against batched")
    add("--seed", type=int, default=7)
    add("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv=None):
    """Train, decode the test sentences batched, then time eager against batched."""
    args = build_parser().parse_args(argv)
    setup_logging(verbose=False)
    mx.random.seed(args.seed)
    rng = random.Random(args.seed)
    train_pairs = make_pairs(args.train_pairs, rng, args.task)
    test_pairs = make_pairs(args.test_pairs, rng, args.task)
    model = Seq2Seq(hidden=args.hidden)
    model.initialize(mx.init.Xavier())
    train(model, train_pairs, args.epochs, args.batch_size, args.lr, args.seed,
          progress=not args.no_progress)
    decoded = decode(model, [source for source, _ in test_pairs], batched=True)
    LOG.info("test: %d sentences, %.1f%% decoded exactly", len(test_pairs),
             100 * accuracy(decoded, test_pairs))
    source_sets = [[source for source, _ in make_pairs(args.samples, rng, args.task)]
                   for _ in range(args.rounds + 1)]
    rows = time_decoding(model, source_sets)[1:]        # the first round warms both up
    for row in rows:
        LOG.info("greedy decoding of %d sentences (longest %d tokens): eager %.0f ms, "
                 "batched %.0f ms (%d flushes), %.1fx eager, same tokens and scores: %s",
                 args.samples, row["longest"], row["eager_ms"], row["batched_ms"],
                 row["flushes"], row["x_eager"], row["same"])
    if not all(row["same"] for row in rows):
        LOG.error("batched decoding differs from eager decoding")
        return 1
    LOG.info("median %.1fx eager", statistics.median(row["x_eager"] for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
