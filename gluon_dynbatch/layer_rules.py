"""Batching rules for layers whose calls do not batch along axis 0 as they are.

* ``PaddedRNNRule``: a fused RNN (``F.RNN``: Gluon's ``rnn.LSTM``, ``GRU`` and
  ``RNN`` layers) over one sample laid out ``(T, 1, C)``, without state
  outputs (a layer called without states): samples of every length run as
  one call, each padded after its end, the batch on axis 1.
* ``RNNRule``: the same with state outputs: samples of one length run as
  one call; the rows go back in sample order.
* ``OrderKeepingRule``: a transpose or ``swapaxes`` that only moves axes of
  size 1 (batch-first RNN layers turn ``(1, T, C)`` into ``(T, 1, C)``)
  keeps the data in order, so it batches as a reshape; ``EachTransposeRule``
  batches one that moves the rows (``F.transpose`` of a (T, C) value) over
  values of one shape stacked on a new axis.
* ``EachDotRule``: ``F.dot(a, b)`` where ``b`` is a value of each sample's
  own (attention: ``F.dot(q, keys, transpose_b=True)``, then ``F.dot(weights,
  keys)``): calls of the same shapes run as one ``batch_dot``.
* ``KnownMatrixDotRule``: ``F.dot(A, H)`` of a known ``A`` (``F.array`` of a
  numpy matrix, a graph's normalised adjacency, or such an array given to the
  model: ``literals.known_node``) and a value of each sample: one
  ``batch_dot`` for matrices of every size, padded with zeros.
* ``KnownTakeRule``: ``F.take(x, F.array(idx))`` of a value of each sample by
  a known index vector: one take over the batch's rows.
* ``OneRowReduceRule``: a reduction over every axis (``F.sum(h * h)``,
  ``F.norm(h)``, ``loss.mean()``) of a one-row value, the usual per-sample
  shape, is a reduction of that row: batched over every axis but the rows.

* ``VectorProductRule``: a matrix-vector product of a 1-d vector and a
  weight (DyNet's ``W * x``: ``F.dot(W, x)``, recorded as
  ``FullyConnected(x, W, flatten=False)``, or ``F.dot(x, M)``): the vectors of
  a batch are the rows of one matrix, so the batch is one product.
* ``RowCrossEntropyRule``: ``F.softmax_cross_entropy`` of one row of scores
  and its label (a sum over the rows, so over one row that row's loss): the
  batch computes every row's loss at once, ``-log(pick(softmax(x), label))``.

Their batched calls are their own, not the operator on stacked rows, so
they say ``batching = "calls"`` (or ``"segment"``, reading index arrays
computed when the batch is planned): templates never stack two of their
calls into one (``vectorize.py`` groups "rows" calls only) and programs do
not hold them (but for ``VectorProductRule``, whose batched call is as
right on one call as on many: ``in_programs``).  Importing the package
registers them (see ``rules.register_rule``).
"""
import numpy as np

from .graph import LEAF
from .literals import known_node, taken_rows, values_of
from .rules import (KNOWN, ROW, SHARED, ReshapeRule, Rule, RowFallback, RowRule, SegmentRule,
                    Signature, _in_dtype, _in_shape, _shared_key, call_as_recorded,
                    elementwise_roles, intern, plain_layout, register_rule, rule_for,
                    swapaxes_roles, transpose_roles)
from .weight_calls import weight_node


def _rnn_roles(node):
    """A fused RNN over one sample laid out (T, 1, C) with (L, 1, H) states, no
    dropout (a random draw per call) and no sequence lengths."""
    kwargs = node.kwargs
    if kwargs.get("p", 0) or kwargs.get("use_sequence_length", False) \
            or len(node.inputs) not in (3, 4):
        return None
    data, states = _in_shape(node, 0), [_in_shape(node, k) for k in range(2, len(node.inputs))]
    if len(data) != 3 or data[1] != 1 or any(len(s) != 3 or s[1] != 1 for s in states):
        return None
    return (ROW, SHARED) + (ROW,) * len(states)


class RNNRule(RowRule):
    """``RNN`` (Gluon's fused ``rnn.LSTM``, ``GRU`` and ``RNN`` layers) over one
    sample each: samples of one length run as one call, batched along axis 1.

    Inputs arrive as the samples' rows concatenated ((k T, 1, C) and (k L, 1, H));
    they are laid out (T, k, C) and (L, k, H) for the call, and its outputs
    back as each sample's rows in order.
    """

    batching = "calls"

    def __init__(self):
        super().__init__(_rnn_roles)

    def signature(self, node):
        sig = super().signature(node)
        if sig is None:
            return None
        return Signature(sig.key + (("steps", _in_shape(node, 0)[0]),), self, sig.roles)

    def step_key(self, node):
        return (_in_shape(node, 0)[0],)

    def batched_call(self, F, node, inputs):
        laid = [_batch_on_axis1(F, x, _in_shape(node, k)) if k != 1 else x
                for k, x in enumerate(inputs)]
        outs = call_as_recorded(F, node, laid)
        return [F.reshape(F.swapaxes(out, dim1=0, dim2=1), shape=(-1, 1) + shape[2:])
                for out, shape in zip(outs, node.out_shapes)]


class PaddedRNNRule(RowRule):
    """An ``RNN`` without state outputs (a Gluon layer called without states,
    see ``block._OutputsOnly``) over samples of any lengths: each sample padded
    with zero steps after its last to the longest, one call.  An RNN runs
    forward, so steps after a sample's end change none of its outputs; the
    outputs of the padding are dropped, and no gradient reaches them.  The
    padding is a gather (``segment_arrays``).  Both directions run layer by
    layer, each direction a call of its own: the backward one on each
    sample's steps reversed within its length (``F.SequenceReverse``), so it
    too starts at the sample's last step."""

    batching = "segment"

    def __init__(self):
        super().__init__(_rnn_roles)

    def signature(self, node):
        kwargs = node.kwargs
        if kwargs.get("state_outputs", False) or kwargs.get("projection_size") is not None \
                or len(node.out_shapes) != 1 \
                or kwargs.get("bidirectional", False) and kwargs.get("mode") not in _GATES:
            return None
        sig = super().signature(node)
        return None if sig is None else Signature(sig.key + ("padded",), self, sig.roles)

    @staticmethod
    def segment_arrays(nodes, dtype):
        """(each sample's steps padded to the longest, as rows of the inputs
        followed by one zero row; where each output row sits in the padded output)."""
        counts = np.array([_in_shape(n, 0)[0] for n in nodes], dtype=np.int64)
        return list(_padding(counts)) + [counts.astype(np.float32)]

    def batched_call(self, F, node, inputs):
        data, params, states = inputs[0], inputs[1], inputs[2:-3]
        pad, unpad, lengths = inputs[-3:]
        width, out_width = _in_shape(node, 0)[2], node.out_shapes[0][2]
        rows = _with_zero_row(F, F.reshape(data, shape=(-1, width)))
        padded = F.swapaxes(F.take(rows, pad), dim1=0, dim2=1)         # (longest, k, C)
        laid = [_batch_on_axis1(F, x, _in_shape(node, k + 2)) for k, x in enumerate(states)]
        if node.kwargs.get("bidirectional", False):
            out = _both_directions(F, node, padded, params, laid, lengths, width)
        else:
            out = call_as_recorded(F, node, [padded, params] + laid)[0]     # (longest, k, H)
        out = F.reshape(F.swapaxes(out, dim1=0, dim2=1), shape=(-1, out_width))
        return [F.reshape(F.take(out, unpad), shape=(-1, 1, out_width))]


def _padding(counts):
    """For blocks of ``counts`` rows laid end to end: where each block's rows sit
    when each is padded to the longest, (blocks, longest), the padding pointing
    at the row after them all (``_with_zero_row``); and where each real row
    sits in the padded blocks flattened."""
    longest, total = int(counts.max()), int(counts.sum())
    steps = np.arange(longest)
    real = steps[None, :] < counts[:, None]
    pad = np.where(real, (np.cumsum(counts) - counts)[:, None] + steps[None, :], total)
    return pad.astype(np.int32), np.nonzero(real.reshape(-1))[0].astype(np.int32)


def _with_zero_row(F, rows):
    """``rows`` followed by one row of zeros (what padding gathers)."""
    return F.concat(rows, F.zeros_like(F.slice_axis(rows, axis=0, begin=0, end=1)), dim=0)


_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _both_directions(F, node, x, params, states, lengths, width):
    """A bidirectional RNN over padded steps ``x``, layer by layer: per layer,
    a forward call and a backward call on the steps reversed within each
    sample's length, each with its slice of the packed parameters (all
    weights, layer by layer and direction by direction, then all biases)."""
    kwargs = dict(node.kwargs, num_layers=1, bidirectional=False)
    hidden, layers = kwargs["state_size"], node.kwargs.get("num_layers", 1)
    gates = _GATES[kwargs["mode"]] * hidden
    sizes = [gates * ((width if layer == 0 else 2 * hidden) + hidden)
             for layer in range(layers) for _ in range(2)]
    weight_at = np.cumsum([0] + sizes)
    bias_at = weight_at[-1] + 2 * gates * np.arange(2 * layers + 1)
    for layer in range(layers):
        outs = []
        for direction in range(2):
            k = 2 * layer + direction
            own = F.concat(_part(F, params, weight_at, k), _part(F, params, bias_at, k), dim=0)
            begin = [F.slice_axis(s, axis=0, begin=k, end=k + 1) for s in states]
            steps = x if not direction else _reverse(F, x, lengths)
            out = F.RNN(steps, own, *begin, **kwargs)
            outs.append(out if not direction else _reverse(F, out, lengths))
        x = F.concat(*outs, dim=2)
    return x


def _part(F, params, starts, k):
    return F.slice_axis(params, axis=0, begin=int(starts[k]), end=int(starts[k + 1]))


def _reverse(F, x, lengths):
    return F.SequenceReverse(x, lengths, use_sequence_length=True)


def _batch_on_axis1(F, rows, shape):
    """(k n, 1, C) rows of k samples of ``shape`` (n, 1, C) as (n, k, C)."""
    return F.swapaxes(F.reshape(rows, shape=(-1, shape[0]) + tuple(shape[2:])), dim1=0, dim2=1)


def _permutation(node):
    """Output axis i = input axis perm[i] of a ``transpose`` or ``swapaxes`` node."""
    ndim = len(node.out_shapes[0])
    if node.op.name == "transpose":
        axes = node.kwargs.get("axes") or tuple(reversed(range(ndim)))
        return [a % ndim for a in axes]
    perm = list(range(ndim))
    d1, d2 = (node.kwargs.get(k, 0) % ndim for k in ("dim1", "dim2"))
    perm[d1], perm[d2] = perm[d2], perm[d1]
    return perm


class OrderKeepingRule(ReshapeRule):
    """A transpose that only moves axes of size 1 (``(1, T, C)`` to ``(T, 1, C)``,
    as Gluon's batch-first RNN layers do) keeps the data in order: a reshape."""

    def signature(self, node):
        shape = _in_shape(node, 0)
        if not shape:
            return None
        moved = [a for a in _permutation(node) if shape[a] != 1]
        if moved != sorted(moved):
            return None
        return super().signature(node)


class EachTransposeRule(Rule):
    """A transpose that moves the rows (``F.transpose(x)`` of a (T, C) value):
    nodes of one input shape run as one transpose of their values stacked on a
    new leading axis.  That is as right for one call as for many, so programs
    (of calls of that shape) hold it."""

    batching = "calls"
    in_programs = True

    def signature(self, node):
        shape = _in_shape(node, 0)
        if not shape or len(node.inputs) != 1:
            return None
        key = ("transpose_each", shape, tuple(_permutation(node)), _in_dtype(node, 0))
        return Signature((key,), self, (ROW,))

    def step_key(self, node):
        return (_in_shape(node, 0),)

    def batched_call(self, F, node, inputs):
        # The input's shape from the output's: a program's entry has no inputs.
        perm, out_shape = _permutation(node), node.out_shapes[0]
        shape = [0] * len(perm)
        for axis, size in zip(perm, out_shape):
            shape[axis] = size
        axes = (0,) + tuple(a + 1 for a in perm)
        out = F.transpose(F.reshape(inputs[0], shape=(-1,) + tuple(shape)), axes=axes)
        return [F.reshape(out, shape=(-1,) + tuple(out_shape[1:]))]


def _one_row_total(node):
    """A reduction over every axis of a one-row input of at most 3 axes."""
    kwargs = node.kwargs
    shape = _in_shape(node, 0)
    if kwargs.get("axis") is not None or kwargs.get("exclude", False) \
            or not shape or shape[0] != 1 or len(shape) > 3 or len(node.inputs) != 1:
        return None
    if node.op.name == "norm" and kwargs.get("ord", 2) not in (1, 2):
        return None
    return (ROW,)


class TotalRule(Rule):
    """``sum``/``mean``/``max``/``min`` over every axis of a value of several rows
    (a sentence's (T,) token losses, ``F.sum(F.square(h))`` of a (T, H) matrix):
    each node's values, flattened, are one segment of ``SegmentRule``'s batch.

    One-row values take ``OneRowReduceRule`` first (no index arrays).  Programs
    do not hold these calls: a segment's count is its values, not its rows.
    """

    batching = "segment"

    def signature(self, node):
        kwargs = node.kwargs
        shape, dtype = _in_shape(node, 0), _in_dtype(node, 0)
        if len(node.inputs) != 1 or kwargs.get("exclude", False) or not shape \
                or not _all_axes(kwargs.get("axis"), len(shape)) or node.args[1:] \
                or set(kwargs) - {"axis", "keepdims"}:
            return None
        if node.op.name in ("max", "min") and np.dtype(dtype) not in (np.float32, np.float64):
            return None         # padded with infinities
        key = ("total", shape[1:], dtype, bool(kwargs.get("keepdims", False)))
        return Signature((key,), self, (ROW,))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """The padded index (and counts) of each node's values as one segment."""
        counts = [int(np.prod(_in_shape(node, 0))) for node in nodes]
        return SegmentRule.arrays_for_counts(counts, nodes[0].op.name, 1, dtype)

    def batched_call(self, F, node, inputs):
        flat = F.reshape(inputs[0], shape=(-1, 1))
        return _SEGMENTS.batched_call(F, node, [flat] + list(inputs[1:]))


def _all_axes(axis, ndim):
    """Whether a reduction's ``axis`` argument names every axis of ``ndim``."""
    if axis is None:
        return True
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return all(type(a) is int for a in axes) \
        and sorted(a % ndim for a in axes if -ndim <= a < ndim) == list(range(ndim))


_SEGMENTS = SegmentRule()


class OneRowReduceRule(RowRule):
    """A reduction over every axis of a one-row value: over all axes but the rows."""

    batching = "calls"

    def __init__(self):
        super().__init__(_one_row_total)

    def batched_call(self, F, node, inputs):
        ndim = len(_in_shape(node, 0))
        if ndim == 1:                   # (1,) values: each is its own total
            return [F.abs(inputs[0]) if node.op.name == "norm" else F.identity(inputs[0])]
        axis = 1 if ndim == 2 else (1, 2)
        return call_as_recorded(F, node, inputs, extra_kwargs={"axis": axis})


def _computed_per_sample(src):
    """Whether a source is a value computed in a sample's call: not a leaf (a
    parameter, a constant, an input) and not a value made from weights alone."""
    return src.kind != LEAF and not weight_node(src)


class EachDotRule(Rule):
    """``dot(a, b)`` of 2-d values with ``b`` computed per sample: nodes of the same
    shapes run as one ``batch_dot``, each node's ``a`` against its own ``b``."""

    batching = "calls"

    def signature(self, node):
        if len(node.inputs) != 2 or node.kwargs.get("transpose_a", False):
            return None
        a, b = _in_shape(node, 0), _in_shape(node, 1)
        if len(a) != 2 or len(b) != 2 or not _computed_per_sample(node.inputs[1][0]):
            return None
        key = ("dot_each", a, b, bool(node.kwargs.get("transpose_b", False)), _in_dtype(node, 0),
               _in_dtype(node, 1))
        return Signature((key,), self, (ROW, ROW))

    def step_key(self, node):
        return (_in_shape(node, 0), _in_shape(node, 1))     # the batched call reshapes to them

    def batched_call(self, F, node, inputs):
        a, b = _in_shape(node, 0), _in_shape(node, 1)
        out = F.batch_dot(F.reshape(inputs[0], shape=(-1,) + a),
                          F.reshape(inputs[1], shape=(-1,) + b),
                          transpose_b=bool(node.kwargs.get("transpose_b", False)))
        return [F.reshape(out, shape=(-1, node.out_shapes[0][1]))]


class VectorProductRule(Rule):
    """``FullyConnected(x, W, flatten=False)`` or ``dot(x, M)`` of a 1-d vector
    ``x`` and weights that every call shares: the batch's vectors, laid end to
    end, are the rows of one (N, D) matrix; one product, and its rows laid end
    to end again.  An instance per width D (``for_width``), which the batched
    call reshapes to."""

    batching = "calls"
    in_programs = True      # its batched call is right on one call's rows too
    _BY_WIDTH = {}

    def __init__(self, width=None):
        self.width = width

    @classmethod
    def for_width(cls, width):
        found = cls._BY_WIDTH.get(width)
        if found is None:
            found = cls._BY_WIDTH.setdefault(width, cls(width))
        return found

    def signature(self, node):
        kwargs = node.kwargs
        if node.op.name == "FullyConnected" and kwargs.get("flatten", True) \
                or node.op.name == "dot" and kwargs.get("transpose_a", False):
            return None
        x = _in_shape(node, 0)
        if len(x) != 1 or len(node.inputs) < 2 or len(_in_shape(node, 1)) != 2 \
                or any(_computed_per_sample(src) for src, _ in node.inputs[1:]):
            return None
        key = (("vector_product", x, _in_dtype(node, 0)),) \
            + tuple(_shared_key(node, k) for k in range(1, len(node.inputs)))
        return Signature(key, self.for_width(x[0]), (ROW,) + (SHARED,) * (len(key) - 1))

    def batched_call(self, F, node, inputs):
        rows = F.reshape(inputs[0], shape=(-1, self.width))
        out = call_as_recorded(F, node, [rows] + list(inputs[1:]))[0]
        return [F.reshape(out, shape=(-1,))]


class KnownMatrixDotRule(Rule):
    """``dot(A, H)`` of an (n, m) known ``A`` and an (m, C) value ``H`` (or of
    ``A.T``, ``transpose_a=True``): the batch pads every ``A`` (as multiplied) to
    (N, n', m') with zeros, gathers each ``H`` into (N, m', C) (zero rows after
    its own), runs one ``batch_dot`` and keeps each call's n rows.  ``A`` is
    read when the batch is planned, not passed: a known value takes no gradient."""

    batching = "segment"

    def signature(self, node):
        if len(node.inputs) != 2 or node.kwargs.get("transpose_b", False):
            return None
        a, h = _in_shape(node, 0), _in_shape(node, 1)
        if len(a) != 2 or len(h) != 2 or not known_node(node.inputs[0][0]) \
                or a[0 if node.kwargs.get("transpose_a", False) else 1] != h[0]:
            return None
        key = ("known_dot", h[1], _in_dtype(node, 0), _in_dtype(node, 1))
        return Signature((key,), self, (KNOWN, ROW))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """(the matrices padded, (N, n', m'); where each H's rows sit in its
        padded (m', C) block, the zero row after the batch's rows standing for
        padding; where each output row sits in the padded output)."""
        flip = bool(nodes[0].kwargs.get("transpose_a", False))
        shapes = np.array([_in_shape(n, 0)[::-1] if flip else _in_shape(n, 0) for n in nodes],
                          dtype=np.int64)
        rows, cols = int(shapes[:, 0].max()), int(shapes[:, 1].max())
        matrices = np.zeros((len(nodes), rows, cols), dtype=dtype)
        for k, node in enumerate(nodes):
            n, m = shapes[k]
            values = values_of(node.inputs[0][0])
            matrices[k, :n, :m] = values.T if flip else values
        return [matrices, _padding(shapes[:, 1])[0], _padding(shapes[:, 0])[1]]

    def batched_call(self, F, node, inputs):
        rows, matrices, gather, kept = inputs
        width = node.out_shapes[0][1]
        out = F.batch_dot(matrices, F.take(_with_zero_row(F, rows), gather))    # (N, n', C)
        return [F.take(F.reshape(out, shape=(-1, width)), kept)]


class KnownTakeRule(Rule):
    """``take(x, idx)`` along axis 0 of a value of each sample by a known index
    vector (``F.array`` of a graph's edge ends): one take of the batch's rows
    concatenated, each literal's indices (read when the batch is planned, as
    MXNet reads them) moved to where its own rows start."""

    batching = "segment"

    def signature(self, node):
        kwargs = node.kwargs
        if len(node.inputs) != 2 or kwargs.get("axis", 0) != 0 \
                or kwargs.get("mode", "clip") not in ("clip", "wrap") \
                or not known_node(node.inputs[1][0]) or len(_in_shape(node, 1)) != 1 \
                or not _in_shape(node, 0) or not _computed_per_sample(node.inputs[0][0]):
            return None
        key = ("known_take", _in_shape(node, 0)[1:], _in_dtype(node, 0),
               kwargs.get("mode", "clip"))
        return Signature((key,), self, (ROW, KNOWN))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """(where each node's indices point in the batch's rows,)"""
        mode = nodes[0].kwargs.get("mode", "clip")
        rows, start = [], 0
        for node in nodes:
            size = _in_shape(node, 0)[0]
            rows.append(taken_rows(values_of(node.inputs[1][0]), size, mode) + start)
            start += size
        return [np.concatenate(rows).astype(np.int32)]

    def batched_call(self, F, node, inputs):
        return [F.take(inputs[0], inputs[1], axis=0)]


class RowCrossEntropyRule(Rule):
    """``softmax_cross_entropy(x, label)`` of a (1, C) row and a (1,) label: per
    row, ``-log(softmax(x)[label])``; equal to MXNet's to float32 rounding."""

    batching = "calls"

    def signature(self, node):
        data, label = _in_shape(node, 0), _in_shape(node, 1)
        if len(node.inputs) != 2 or len(data) != 2 or data[0] != 1 or label != (1,):
            return None
        key = ("row_cross_entropy", data[1], _in_dtype(node, 0), _in_dtype(node, 1))
        return Signature((key,), self, (ROW, ROW))

    def batched_call(self, F, node, inputs):
        # log of the picked softmax, as MXNet's kernel computes it (a log_softmax
        # would round its gradient differently).
        scores = plain_layout(F, inputs[0], 2)
        return [-F.log(F.pick(F.softmax(scores, axis=-1), inputs[1], axis=-1))]


_REDUCTIONS = ("sum", "mean", "max", "min", "prod", "nansum", "nanprod", "norm")
for _name in _REDUCTIONS:
    _found = rule_for(_name)
    if _name in ("sum", "mean", "max", "min"):     # after the ragged reduction over axis 0
        _found = RowFallback(_found.first, RowFallback(TotalRule(), _found.second))
    register_rule(_name, RowFallback(OneRowReduceRule(), _found))


LOW = "low"     # role: a lower-rank input computed per sample (``LowRankRule``)


class LowRankRule(RowRule):
    """A broadcast of one-row values and lower-rank values computed per sample.

    ``x + F.sum(h, axis=0)`` adds a (1, H) row and an (H,) vector; the vector
    broadcasts as the row (1, H).  Its role is ``LOW``: every node's vector is
    gathered and viewed as that node's row before the batched call.  Nodes get
    this rule from :func:`per_sample_low_rank` when they are recorded (a
    parameter or constant of lower rank stays ``SHARED``).
    """

    def __init__(self):
        super().__init__(elementwise_roles)

    def step_key(self, node):
        return tuple(_in_shape(node, k) for k, role in enumerate(node.meta) if role == LOW)

    def batched_call(self, F, node, inputs):
        ndim = len(node.out_shapes[0])
        viewed = list(inputs)
        for k, role in enumerate(node.meta):
            if role == LOW:
                shape = _in_shape(node, k)
                viewed[k] = F.reshape(inputs[k], shape=(-1,) + (1,) * (ndim - 1 - len(shape))
                                      + shape)
        return call_as_recorded(F, node, viewed)


LOW_RANK = LowRankRule()


def per_sample_low_rank(node, info):
    """Give ``node`` (a call of ``info``, whose ``info.low`` is not empty) the
    ``LowRankRule`` when it computed a lower-rank input per sample; whether it did."""
    graph = node.graph
    low = [k for k in info.low if node.inputs[k][0].kind != LEAF
           and node.inputs[k][0].id not in graph.weight_nodes]
    if not low or node.out_shapes[0][0] != 1:
        return False
    node.rule = LOW_RANK
    node.meta = tuple(LOW if k in low else role for k, role in enumerate(info.meta))
    shared = tuple((node.inputs[k][0].id, node.inputs[k][1])
                   for k in info.shared_pos if k not in low)
    node.sig = (intern((LOW, info.sig, tuple(_in_shape(node, k) for k in low))), shared)
    return True


def _gemm2_roles(node):
    """``F.linalg.gemm2(a, B)`` of matrices (``alpha * a . B``, B transposed or
    not): the rows of ``a`` are independent, as for ``F.dot``."""
    if node.kwargs.get("transpose_a", False) or node.kwargs.get("axis", -2) not in (-2, 0) \
            or len(_in_shape(node, 0)) != 2 or len(_in_shape(node, 1)) != 2:
        return None
    return (ROW, SHARED)


register_rule("gemm2", RowRule(_gemm2_roles))
register_rule("RNN", RowFallback(PaddedRNNRule(), RNNRule()))
register_rule("softmax_cross_entropy", RowCrossEntropyRule())
_TAKE = RowFallback(KnownTakeRule(), rule_for("take"))
_TAKE.source_dependent = True       # a literal's indices, or a shared table's rows
register_rule("take", _TAKE)
register_rule("FullyConnected", RowFallback(rule_for("FullyConnected"), VectorProductRule()))
_DOT = RowFallback(VectorProductRule(), RowFallback(
    KnownMatrixDotRule(), RowFallback(EachDotRule(), rule_for("dot"))))
_DOT.source_dependent = True        # whether b is computed per sample (see calls.remember)
register_rule("dot", _DOT)
for _names, _roles in ((["transpose"], transpose_roles),
                       (["SwapAxis", "swapaxes"], swapaxes_roles)):
    register_rule(_names, RowFallback(OrderKeepingRule(), RowFallback(RowRule(_roles),
                                                                      EachTransposeRule())))
