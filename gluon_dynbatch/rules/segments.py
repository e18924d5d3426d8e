"""Rules of ragged reductions and softmaxes over each node's rows.

* ``SegmentRule``: ``sum``/``mean``/``max``/``min`` over axis 0 of each node's
  rows (a node's children, a sentence's tokens), by padding every node's
  rows to the longest and reducing the padded axis;
* ``SegmentSoftmaxRule``: a softmax or log-softmax over axis 0 of each node's
  rows (attention weights), padded with -inf;
* ``SegmentOrderRule``: the values of ``topk`` and ``sort`` over axis 0 of
  each node's rows, padded with values that order last.

The padding is a gather computed when the batch is planned (``_padding``),
reading one zero row after the batch's rows (``_with_zero_row``).
"""
import numpy as np

from .rows import RowFallback, RowRule, SoftmaxRowRule, _axis, _true, axis_roles
from ..ir.rules import ROW, Rule, Signature, _in_dtype, _in_shape, _trail, register_rule


class SegmentRule(Rule):
    """``sum``/``mean``/``max``/``min`` over axis 0 of each node's (ragged) rows."""

    batching = "segment"
    program_form = "segment"
    passes_single = True    # over one row per node, the result is that row

    @staticmethod
    def extra_count(op_name):
        """Index arrays a batch reads besides its rows (see ``arrays_for_counts``)."""
        return 2 if op_name == "mean" else 1

    kind = "segment"

    def signature(self, node):
        axis = node.kwargs.get("axis")
        if isinstance(axis, (tuple, list)):
            axis = axis[0] if len(axis) == 1 else None
        if axis != 0 or node.kwargs.get("exclude", False) or len(node.inputs) != 1:
            return None
        if node.op.name in _PADDED_BY_INFINITY + ("mean",) \
                and np.dtype(_in_dtype(node, 0)) not in (np.float32, np.float64):
            # Padded with infinities; an integer mean's gradient is MXNet's
            # integer division, which a sum and a division do not repeat.
            return None
        shape = _in_shape(node, 0)
        return Signature(((self.kind, _trail(shape), _in_dtype(node, 0),
                           bool(node.kwargs.get("keepdims", False))),), self, (ROW,))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """Extra inputs of a batch of ``nodes`` (see ``arrays_for_counts``)."""
        counts = [n.inputs[0][0].out_shapes[n.inputs[0][1]][0] for n in nodes]
        tail = len(nodes[0].inputs[0][0].out_shapes[nodes[0].inputs[0][1]]) - 1
        return nodes[0].rule.arrays_for_counts(counts, nodes[0].op.name, tail, dtype)

    @staticmethod
    def arrays_for_counts(counts, op_name, tail, dtype):
        """A padded index and, for ``mean``, the counts of ragged segments.

        The index is (segments, longest) into the segments' rows followed by
        one zero row, which the padding points at.  Padding by gathering
        zeros (rather than multiplying by a 0/1 matrix) keeps a NaN or inf of
        one sample out of the others (0 * nan is nan) and works for every
        dtype.
        """
        counts = np.asarray(counts, dtype=np.int64)
        total = int(counts.sum())
        starts = np.cumsum(counts) - counts
        cols = np.arange(max(int(counts.max()), 1))
        index = np.where(cols[None, :] < counts[:, None],
                         starts[:, None] + cols[None, :], total).astype(np.int32)
        out = [index]
        if op_name == "mean":
            out.append(counts.astype(dtype).reshape((len(counts),) + (1,) * tail))
        return out

    def batched_call(self, F, node, inputs):
        """``inputs`` = (rows of every node, padded index[, counts]).

        Floats are summed over the padded axis by a ``batch_dot`` with ones,
        7x faster than MXNet's ``sum`` over a middle axis on this machine
        (forward and backward); other dtypes (no ``batch_dot`` on CPU) by ``sum``.
        """
        data, index = inputs[0], inputs[1]
        name = node.op.name
        # Padding that never wins: -inf for max, +inf for min (the padding comes
        # after a node's rows: an index among them is one among its rows).
        fill = (1 if name in ("min", "argmin") else -1) if name in _PADDED_BY_INFINITY else 0
        rows = _padded_rows(F, data, index, fill)
        if name in _PADDED_BY_INFINITY:
            out = getattr(F, name)(rows, axis=1)
            return [F.reshape(out, shape=(-1,) + tuple(node.out_shapes[0][1:]))]
        mean = name == "mean"
        dtype = np.dtype(node.out_dtypes[0])
        if dtype in (np.float32, np.float64):
            ones = F.Cast(F.ones_like(F.expand_dims(index, axis=1)), dtype=dtype.name)
            out = F.batch_dot(ones, F.reshape(rows, shape=(0, 0, -1)))   # (nodes, 1, -1)
            if mean:
                out = F.broadcast_div(out, F.reshape(inputs[2], shape=(-1, 1, 1)))
        else:
            out = F.sum(rows, axis=1)
            if mean:
                out = F.broadcast_div(out, inputs[2])
        return [F.reshape(out, shape=(-1,) + tuple(node.out_shapes[0][1:]))]


_PADDED_BY_INFINITY = ("max", "min", "argmax", "argmin")


class SegmentIndexRule(SegmentRule):
    """``argmax``/``argmin`` over axis 0 of each node's (ragged) rows (a Viterbi
    step's backpointers, ``F.argmax(paths, axis=0)``): the index of the row
    among the node's own."""

    kind = "segment-index"
    passes_single = False   # over one row per node, the result is 0, not that row


class SegmentSoftmaxRule(SegmentRule):
    """``softmax``/``log_softmax`` over axis 0 of each node's (ragged) rows.

    Attention weights over a sentence's tokens or a node's children: the
    rows are padded to the longest with -inf (weight zero), normalised along
    the padded axis, and the padding dropped.
    """

    passes_single = False

    @staticmethod
    def extra_count(op_name):
        return 2

    def signature(self, node):
        if len(node.inputs) != 1 or set(node.kwargs) - {"axis"} or node.args[1:]:
            return None
        shape, dtype = _in_shape(node, 0), _in_dtype(node, 0)
        if not shape or _axis(node, "axis", -1) != 0 \
                or np.dtype(dtype) not in (np.float32, np.float64):
            return None
        return Signature((("segment-softmax", _trail(shape), dtype),), self, (ROW,))

    @staticmethod
    def arrays_for_counts(counts, op_name, tail, dtype):
        """The padded index of ``SegmentRule`` and, per row, its place among the padded rows."""
        counts = np.asarray(counts, dtype=np.int64)
        index = SegmentRule.arrays_for_counts(counts, "sum", tail, dtype)[0]
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        places = np.repeat(np.arange(len(counts)) * index.shape[1], counts) + within
        return [index, places.astype(np.int32)]

    def batched_call(self, F, node, inputs):
        data, index, places = inputs[:3]
        out = getattr(F, node.op.name)(_padded_rows(F, data, index, -1), axis=1)
        return [F.take(F.reshape(out, shape=(-3, -2)), places, axis=0)]


class SegmentOrderRule(SegmentSoftmaxRule):
    """The values of ``topk`` and ``sort`` over axis 0 of each node's (ragged)
    rows (k-max pooling over a sentence's tokens).

    The rows are padded to the longest with values that order last (-inf
    descending, +inf ascending), ordered along the padded axis; a top k
    (``k`` at most the node's rows, as MXNet requires) holds the node's own
    values, and a sort's first rows of each node are its own.  MXNet's order
    of equal values is not stable: a node's own infinity may trade places
    with the padding, which leaves the values the same but not the indices,
    so indices (``argsort``, ``topk``'s default) stay one call per node.
    """

    kind = "segment-order"

    def signature(self, node):
        shape, dtype = _in_shape(node, 0), _in_dtype(node, 0)
        if len(node.inputs) != 1 or node.args[1:] or not shape or _axis(node, "axis", -1) != 0 \
                or np.dtype(dtype) not in (np.float32, np.float64):
            return None
        if node.op.name == "topk":
            k = node.kwargs.get("k", 1)
            if str(node.kwargs.get("ret_typ", "indices")) != "value" \
                    or type(k) is not int or not 1 <= k <= shape[0]:
                return None
        attrs = tuple(sorted((name, str(value)) for name, value in node.kwargs.items()))
        return Signature(((self.kind, node.op.name, attrs, _trail(shape), dtype),), self,
                         (ROW,))

    def batched_call(self, F, node, inputs):
        data, index, places = inputs[:3]
        ascending = _true(node.kwargs.get("is_ascend", node.op.name != "topk"))
        rows = _padded_rows(F, data, index, 1 if ascending else -1)
        out = getattr(F, node.op.name)(rows, **dict(node.kwargs, axis=1))
        out = F.reshape(out, shape=(-3, -2))
        if node.op.name == "topk":                  # k rows a node
            return [out]
        return [F.take(out, places, axis=0)]


def _padded_rows(F, data, index, fill):
    """(nodes, longest, ...): ``data``'s rows gathered by a padded ``index`` whose
    padding reads one row after them, of zeros (``fill`` 0), or of -inf or
    +inf (``fill`` -1 or 1: values that never win an ordering, no gradient)."""
    pad = F.zeros_like(F.slice_axis(data, axis=0, begin=0, end=1))
    if fill:
        pad = F.BlockGrad(F.log(pad))
        if fill > 0:
            pad = F.negative(pad)
    return F.take(F.concat(data, pad, dim=0), index, axis=0)


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


_SEGMENTS = SegmentRule()
register_rule(["argmax", "argmin"],
              RowFallback(SegmentIndexRule(), RowRule(axis_roles("axis", None))))
register_rule(["topk", "sort"], RowFallback(SegmentOrderRule(), RowRule(axis_roles("axis", -1))))
register_rule(["softmax", "log_softmax"],
              RowFallback(SegmentSoftmaxRule(), SoftmaxRowRule(axis_roles("axis", -1))))
