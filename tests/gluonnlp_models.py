"""Models built from gluonnlp 0.10's own blocks, written for one sample.

Each is a :class:`gluon_dynbatch.DynBatchBlock` whose ``hybrid_forward`` calls
gluonnlp blocks the way their documentation shows, on one sample laid out
batch-major with a batch of one: an LSTMP language model, encoder-decoders
with gluonnlp's MLP and dot-product attention cells, a character CNN with a
highway layer, a Transformer encoder layer, a small BERT classifier, a
Transformer translation model decoding step by step, and beam search.  ``user_models.CASES`` holds their
cases.
"""
import numpy as np
from mxnet import autograd
from mxnet.gluon import nn, rnn

import gluon_dynbatch as gdb


def _nlp():
    import gluonnlp        # imported when a model is built: the tests need it, the package not
    return gluonnlp


class LSTMPLanguageModel(gdb.DynBatchBlock):
    """gluonnlp's LSTMP cell (a projected LSTM, clipped) predicting each next word."""

    def __init__(self, hidden, vocab, dim, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(vocab, dim)
            self.cell = _nlp().model.LSTMPCellWithClip(hidden, hidden // 2, input_size=dim,
                                                       cell_clip=3.0, projection_clip=3.0)
            self.out = nn.Dense(vocab, in_units=hidden // 2)

    def hybrid_forward(self, F, words):
        state = self.cell.begin_state(batch_size=1)
        losses = []
        for word, following in zip(words, words[1:]):
            h, state = self.cell(self.embed(F.array([word])), state)
            scores = F.log_softmax(self.out(h))
            losses.append(-F.pick(scores, F.array([following]), axis=1))
        return F.concat(*losses, dim=0)


class AttentionSeq2Seq(gdb.DynBatchBlock):
    """A GRU encoder; a GRU decoder whose query (1, 1, H) attends over the encoder
    states (1, S, H) with gluonnlp's ``MLPAttentionCell`` or ``DotProductAttentionCell``;
    a loss per target word."""

    def __init__(self, hidden, vocab, dim, kind="mlp", **kwargs):
        super().__init__(**kwargs)
        attention = _nlp().model.attention_cell
        with self.name_scope():
            self.embed = nn.Embedding(vocab, dim)
            self.encoder = rnn.GRUCell(hidden, input_size=dim)
            self.decoder = rnn.GRUCell(hidden, input_size=dim)
            self.attention = attention.MLPAttentionCell(units=hidden) if kind == "mlp" \
                else attention.DotProductAttentionCell(scaled=True)
            self.out = nn.Dense(vocab, in_units=2 * hidden)

    def hybrid_forward(self, F, pair):
        source, target = pair
        state = self.encoder.begin_state(batch_size=1)
        keys = []
        for word in source:
            h, state = self.encoder(self.embed(F.array([word])), state)
            keys.append(h)
        memory = F.stack(*keys, axis=1)                             # (1, S, H)
        losses, previous = [], 0
        for word in target:
            h, state = self.decoder(self.embed(F.array([previous])), state)
            context, _ = self.attention(F.expand_dims(h, axis=1), memory)
            scores = F.log_softmax(self.out(F.concat(h, F.reshape(context, (1, -1)), dim=1)))
            losses.append(-F.pick(scores, F.array([word]), axis=1))
            previous = word
        return F.concat(*losses, dim=0)


class CharHighwayTagger(gdb.DynBatchBlock):
    """Each word's characters through gluonnlp's ``ConvolutionalEncoder`` (character
    n-gram convolutions), a gluonnlp ``Highway`` layer, a tag's scores per word."""

    def __init__(self, hidden, classes, chars, **kwargs):
        super().__init__(**kwargs)
        model = _nlp().model
        with self.name_scope():
            self.embed = nn.Embedding(chars, 8)
            self.chars = model.ConvolutionalEncoder(
                embed_size=8, num_filters=(8, 8), ngram_filter_sizes=(1, 2),
                conv_layer_activation="tanh", num_highway=None, output_size=hidden)
            self.highway = model.Highway(hidden, num_layers=1)
            self.out = nn.Dense(classes, in_units=hidden)

    def hybrid_forward(self, F, words):
        vectors = []
        for chars in words:
            x = self.embed(F.array([chars]))                        # (1, C, 8)
            vectors.append(self.chars(F.transpose(x, axes=(1, 0, 2))))
        return F.log_softmax(self.out(self.highway(F.concat(*vectors, dim=0))))


class TransformerLayerClassifier(gdb.DynBatchBlock):
    """gluonnlp's ``TransformerEncoderCell`` (self-attention, position-wise FFN,
    layer norms) over a sentence (1, T, U), its states averaged and classified."""

    def __init__(self, units, classes, vocab, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(vocab, units)
            self.layer = _nlp().model.TransformerEncoderCell(units=units, hidden_size=2 * units,
                                                             num_heads=2)
            self.out = nn.Dense(classes, in_units=units)

    def hybrid_forward(self, F, words):
        x = self.embed(F.array([words]))                            # (1, T, U)
        states, _ = self.layer(x)
        return F.log_softmax(self.out(F.mean(states, axis=1)))


class BERTClassifier(gdb.DynBatchBlock):
    """gluonnlp's ``BERTModel`` (a two-layer ``BERTEncoder``, its pooler) over one
    sentence (1, T) with its token types and valid length, classified."""

    def __init__(self, units, classes, vocab, **kwargs):
        super().__init__(**kwargs)
        bert = _nlp().model.bert
        with self.name_scope():
            encoder = bert.BERTEncoder(num_layers=2, units=units, hidden_size=2 * units,
                                       max_length=64, num_heads=2, dropout=0.0)
            self.bert = bert.BERTModel(encoder, vocab_size=vocab, token_type_vocab_size=2,
                                       units=units, embed_size=units, use_pooler=True,
                                       use_decoder=False, use_classifier=False)
            self.out = nn.Dense(classes, in_units=units)

    def hybrid_forward(self, F, words):
        half = len(words) // 2
        types = F.array([[0] * half + [1] * (len(words) - half)])
        _, pooled = self.bert(F.array([words]), types, F.array([len(words)]))
        return F.log_softmax(self.out(pooled))


def units(hidden):
    """A Transformer's width for ``hidden``: even, for two heads."""
    return max(4, hidden - hidden % 2)


class TransformerTranslation(gdb.DynBatchBlock):
    """A Transformer translation model decoding one target word at a time: the
    source encoded by gluonnlp's ``TransformerEncoderCell``; step t runs
    gluonnlp's ``TransformerDecoderCell`` on the words before t (its
    self-attention) and the source's states (its memory attention), and its
    last position predicts word t."""

    def __init__(self, units, vocab, **kwargs):
        super().__init__(**kwargs)
        transformer = _nlp().model.transformer
        with self.name_scope():
            self.embed = nn.Embedding(vocab, units)
            self.encoder = transformer.TransformerEncoderCell(units=units, hidden_size=2 * units,
                                                              num_heads=2)
            self.decoder = transformer.TransformerDecoderCell(units=units, hidden_size=2 * units,
                                                              num_heads=2)
            self.out = nn.Dense(vocab, flatten=False, in_units=units)

    def hybrid_forward(self, F, pair):
        source, target = pair
        memory, _ = self.encoder(self.embed(F.array([source])))     # (1, S, U)
        prefix = [0] + list(target[:-1])
        losses = []
        for t, word in enumerate(target):
            states, _ = self.decoder(self.embed(F.array([prefix[:t + 1]])), memory)
            last = F.slice_axis(states, axis=1, begin=t, end=t + 1)
            scores = F.log_softmax(F.reshape(self.out(last), (1, -1)))
            losses.append(-F.pick(scores, F.array([word]), axis=1))
        return F.concat(*losses, dim=0)


class BeamSearchDecoder(gdb.DynBatchBlock):
    """A GRU encoder-decoder; gluonnlp's ``BeamSearchSampler`` finds each source's
    best translations (its decoder a step of the GRU, outside autograd as the
    search assigns in place), and the model's score of the best one,
    teacher-forced, is the output: the search reads values (the words it
    picks), the score takes gradients."""

    def __init__(self, hidden, vocab, dim, beam=2, max_length=4, **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.beam, self.max_length = vocab, beam, max_length
        with self.name_scope():
            self.embed = nn.Embedding(vocab, dim)
            self.encoder = rnn.GRUCell(hidden, input_size=dim)
            self.decoder = rnn.GRUCell(hidden, input_size=dim)
            self.out = nn.Dense(vocab, in_units=hidden)

    def _step(self, F, words, state):
        """One decoder step of every hypothesis: log-probabilities, the new state."""
        h, [state] = self.decoder(self.embed(words), [state])
        return F.log_softmax(self.out(h)), state

    def hybrid_forward(self, F, source):
        state = self.encoder.begin_state(batch_size=1)
        for word in source:
            _, state = self.encoder(self.embed(F.array([word])), state)
        sampler = _nlp().model.BeamSearchSampler(
            beam_size=self.beam, decoder=lambda words, s: self._step(F, words, s),
            eos_id=1, max_length=self.max_length)
        with autograd.pause():          # the search assigns in place: outside autograd
            samples, _, lengths = sampler(F.array([0]), state[0])
        best = [int(w) for w in samples[0, 0, 1:int(lengths[0, 0].asscalar())].asnumpy()]
        hidden, previous, total = state[0], 0, 0
        for word in best:
            scores, hidden = self._step(F, F.array([previous]), hidden)
            total = total + F.pick(scores, F.array([word]), axis=1)
            previous = word
        return total if best else F.zeros((1,))


def translations(seed, count, vocab, max_len=5):
    """``count`` (source, target) pairs of word ids >= 2 (0 starts, 1 ends)."""
    rng = np.random.RandomState(seed)
    return [([int(w) for w in rng.randint(2, vocab, rng.randint(1, max_len + 1))],
             [int(w) for w in rng.randint(2, vocab, rng.randint(1, max_len + 1))])
            for _ in range(count)]


def spelled(seed, count, chars, max_words=4):
    """``count`` sentences of words of 2-5 characters each."""
    rng = np.random.RandomState(seed)
    return [[[int(c) for c in rng.randint(0, chars, rng.randint(2, 6))]
             for _ in range(rng.randint(1, max_words + 1))] for _ in range(count)]


def sentences(seed, count, vocab, min_len=1, max_len=7):
    """``count`` sentences of word ids of ``min_len``-``max_len`` words."""
    rng = np.random.RandomState(seed)
    return [[int(w) for w in rng.randint(0, vocab, rng.randint(min_len, max_len + 1))]
            for _ in range(count)]

