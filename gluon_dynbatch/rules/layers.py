"""Rules of layers whose calls do not batch along axis 0 as they are.

* ``PaddedRNNRule``: a fused RNN (``F.RNN``: Gluon's ``rnn.LSTM``, ``GRU`` and
  ``RNN`` layers) over one sample laid out ``(T, 1, C)``, without state
  outputs (a layer called without states): samples of every length run as
  one call, each padded after its end, the batch on axis 1;
* ``RNNRule``: the same with state outputs: samples of one length run as
  one call; the rows go back in sample order;
* ``SequenceRule``: ``SequenceMask``, ``SequenceLast`` and ``SequenceReverse``
  over one sample laid out ``(T, 1, ...)`` (time first, as Gluon's ``TNC``
  layers take it), with the sample's length if given: samples of one
  length run as one call, batched along axis 1 (laid out ``(1, T, ...)``
  with ``axis=1``, samples of one length batch as rows); likewise
  self-attention's ``interleaved_matmul_selfatt_qk`` and ``_valatt``
  (gluonnlp's BERT and Transformer encoders) over one sentence;
* ``RoiRule``: ``ROIPooling`` and ``ROIAlign``, each box's image index
  moved to where its sample's images start in the batch;
* ``OrderKeepingRule``: a transpose or ``swapaxes`` that only moves axes of
  size 1 (batch-first RNN layers turn ``(1, T, C)`` into ``(T, 1, C)``)
  keeps the data in order, so it batches as a reshape; ``EachTransposeRule``
  batches one that moves the rows (``F.transpose`` of a (T, C) value) over
  values of one shape stacked on a new axis.

Their batched calls are their own, not the operator on stacked rows
(``batching`` ``"calls"`` or ``"segment"``), so templates never stack two of
their calls into one and programs do not hold them, but for
``EachTransposeRule``, whose batched call is as right on one call as on many.
"""
import numpy as np

from .rows import ReshapeRule, RowFallback, RowRule
from .segments import _padding, _with_zero_row
from ..ir.calls import uses_length
from ..ir.rules import ROW, SHARED, Rule, Signature, _in_dtype, _in_shape, call_as_recorded, \
    register_rule


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


class _OneLengthRule(RowRule):
    """Calls over one sample's steps laid out (T, 1, ...): those of one length T
    batch, as one call of their own (not held by programs)."""

    batching = "calls"
    program_form = None

    def signature(self, node):
        sig = super().signature(node)
        if sig is None:
            return None
        return Signature(sig.key + (("steps", _in_shape(node, 0)[0]),), self, sig.roles)

    def step_key(self, node):
        return (_in_shape(node, 0)[0],)


class RNNRule(_OneLengthRule):
    """``RNN`` (Gluon's fused ``rnn.LSTM``, ``GRU`` and ``RNN`` layers) over one
    sample each: samples of one length run as one call, batched along axis 1.

    Inputs arrive as the samples' rows concatenated ((k T, 1, C) and (k L, 1, H));
    they are laid out (T, k, C) and (L, k, H) for the call, and its outputs
    back as each sample's rows in order.
    """

    def __init__(self):
        super().__init__(_rnn_roles)

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
    program_form = None

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


def _one_sample_sequence(node, axis):
    """Roles of a ``Sequence*`` call along ``axis`` of one sample's steps (the
    other of axes 0 and 1 of size 1), with a (1,) length when it uses one."""
    data = _in_shape(node, 0)
    if node.kwargs.get("axis", 0) != axis or len(data) < 2 or data[1 - axis] != 1:
        return None
    uses_length = node.kwargs.get("use_sequence_length", False)
    if len(node.inputs) == 1:
        return None if uses_length else (ROW,)
    if len(node.inputs) == 2 and uses_length and tuple(_in_shape(node, 1)) == (1,):
        return (ROW, ROW)
    return None


def _sequence_roles(node):
    """Along axis 0 of (T, 1, ...) steps: time first."""
    return _one_sample_sequence(node, 0)


def _batch_major_sequence_roles(node):
    """Along axis 1 of (1, T, ...) steps (batch first): the operator itself
    batches such samples stacked on axis 0."""
    return _one_sample_sequence(node, 1)


def _self_attention_roles(node):
    """``interleaved_matmul_selfatt_qk`` (projections) and ``_valatt``
    (projections, attention) of one sentence laid out (T, 1, 3 heads D)."""
    qkv = _in_shape(node, 0)
    if len(qkv) != 3 or qkv[1] != 1:
        return None
    return (ROW,) * len(node.inputs)


# Operators whose batched output holds a block of rows per sample already:
# ``SequenceLast``'s (k, ...), the attention scores' (k heads, T, T).
_ROWS_OUT = frozenset(["SequenceLast", "interleaved_matmul_selfatt_qk"])
# The least valid length of each sequence operator (``SequenceLast`` reads step
# ``length - 1``); the most is the number of steps.
_LENGTH_BOUNDS = {"SequenceMask": 0, "SequenceReverse": 0, "SequenceLast": 1}


class SequenceRule(_OneLengthRule):
    """``SequenceMask``, ``SequenceLast`` and ``SequenceReverse`` over one sample
    each, laid out (T, 1, ...): samples of one length T run as one call on
    their steps laid out (T, k, ...) and their lengths (k,); the outputs go
    back as each sample's rows in order.  Self-attention's interleaved
    products (``roles`` ``_self_attention_roles``) batch the same way: the
    projections on axis 1, the attention scores as rows."""

    def __init__(self, roles=_sequence_roles):
        super().__init__(roles)

    def batched_call(self, F, node, inputs):
        shape = _in_shape(node, 0)
        laid = [_batch_on_axis1(F, inputs[0], shape)] + list(inputs[1:])
        if node.op.name in _LENGTH_BOUNDS and len(laid) > 1 \
                and uses_length(node, "use_sequence_length"):
            # MXNet's kernels read and write past a sample's steps for a length
            # outside them: other samples' steps, when batched.  Valid lengths
            # are left as they are.
            laid[1] = F.clip(laid[1], _LENGTH_BOUNDS[node.op.name], shape[0])
        out = call_as_recorded(F, node, laid)[0]
        if node.op.name in _ROWS_OUT:
            return [out]
        return [F.reshape(F.swapaxes(out, dim1=0, dim2=1),
                          shape=(-1,) + tuple(node.out_shapes[0][1:]))]


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
    program_form = "own"

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


def transpose_roles(node):
    axes = node.kwargs.get("axes")
    if not axes or axes[0] != 0:
        return None
    return (ROW,)


def swapaxes_roles(node):
    """Rows batch unless the swap moves axis 0 (counted from the end too: ``-2``
    of a (T, H) value)."""
    ndim = len(_in_shape(node, 0))
    dims = [int(node.kwargs.get(name, 0)) for name in ("dim1", "dim2")]
    return None if not ndim or 0 in [d % ndim for d in dims] else (ROW,)


class RoiRule(Rule):
    """``ROIPooling`` or ``ROIAlign`` of a sample's images (N, C, H, W) and its
    boxes (R, 5), each box led by the index of its image: the batch's images
    and boxes concatenated, each box's index moved to where its sample's images
    start (offsets and image counts made when the batch is planned)."""

    batching = "segment"

    def signature(self, node):
        if len(node.inputs) != 2:
            return None
        data, rois = _in_shape(node, 0), _in_shape(node, 1)
        if len(data) != 4 or len(rois) != 2 or rois[1] != 5:
            return None
        return Signature((("roi", data[1:], _in_dtype(node, 0)),
                          ("roi", rois[1:], _in_dtype(node, 1))), self, (ROW, ROW))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """(boxes, 2): each box's sample's first image and its number of images."""
        images = np.array([_in_shape(node, 0)[0] for node in nodes])
        boxes = np.array([_in_shape(node, 1)[0] for node in nodes])
        where = np.zeros((int(boxes.sum()), 2), dtype=_in_dtype(nodes[0], 1))
        where[:, 0] = np.repeat(np.cumsum(images) - images, boxes)
        where[:, 1] = np.repeat(images, boxes)
        return [where]

    def batched_call(self, F, node, inputs):
        # MXNet reads a box's index as an integer (toward zero) and pools
        # nothing for one outside the images: such a box gets index -1 in the
        # batch, not another sample's image.
        rois, where = inputs[1], inputs[-1]
        index = F.fix(F.slice_axis(rois, axis=1, begin=0, end=1))
        first = F.slice_axis(where, axis=1, begin=0, end=1)
        count = F.slice_axis(where, axis=1, begin=1, end=2)
        inside = (index >= 0) * (index < count)
        moved = F.where(inside, index + first, F.zeros_like(index) - 1)
        boxes = F.concat(moved, F.slice_axis(rois, axis=1, begin=1, end=5), dim=1)
        return call_as_recorded(F, node, [inputs[0], boxes])


register_rule(["ROIPooling", "ROIAlign"], RoiRule())
register_rule("RNN", RowFallback(PaddedRNNRule(), RNNRule()))
register_rule("SequenceReverse", SequenceRule())
register_rule(["interleaved_matmul_selfatt_qk", "interleaved_matmul_selfatt_valatt"],
              SequenceRule(_self_attention_roles))
register_rule(["SequenceMask", "SequenceLast"],
              RowFallback(RowRule(_batch_major_sequence_roles), SequenceRule()))
for _names, _roles in ((["transpose"], transpose_roles),
                       (["SwapAxis", "swapaxes"], swapaxes_roles)):
    register_rule(_names, RowFallback(OrderKeepingRule(), RowFallback(RowRule(_roles),
                                                                      EachTransposeRule())))
