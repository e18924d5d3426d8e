"""Batching rules of the operators on a sample's own matrices held as columns.

``rewrite.matrix_ops`` defines the operators ``rewrite.pairs`` records on a
matrix's (m n, 1) column of entries; each rule here batches calls of every
size as one step:

* :class:`GroupRule`: a group operator of every call gathered into one padded
  (groups, longest) array, as ``SegmentRule`` pads a node's rows;
* :class:`PairProductRule`: every operand of a product padded to the largest
  with zeros, one ``batch_dot``;
* :class:`PairwiseRule`: an elementwise operator once on rows taken as the
  entries need them, a known matrix's entries fed as data.
"""
from collections import namedtuple

import numpy as np

from .segments import _SEGMENTS, _padding, _with_zero_row
from ..ir.known import values_known, values_of
from ..ir.rules import KNOWN, ROW, Rule, Signature, _in_dtype, _in_shape, register_rule
from ..rewrite.matrix_ops import _NORMALISING, KINDS, LINES, PRODUCTS

_Named = namedtuple("_Named", ["op", "out_shapes", "out_dtypes"])
_Kind = namedtuple("_Kind", ["name"])


class GroupRule(Rule):
    """Calls of a :class:`GroupOp` kind, of any group sizes, axes and row
    counts, as one segment reduction or softmax over all their groups."""

    batching = "segment"
    keyed_attrs = False      # group sizes are in the index arrays, not the key

    def signature(self, node):
        if len(node.inputs) != 1 or np.dtype(_in_dtype(node, 0)) not in (np.float32,
                                                                         np.float64):
            return None
        shape = _in_shape(node, 0)
        if len(shape) < 2 or node.op.kind in _NORMALISING and shape[1:] != (1,):
            return None
        return Signature((("group", shape[1:], _in_dtype(node, 0)),), self, (ROW,))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """The padded index of every node's groups: (groups, longest) rows of the
        nodes' inputs concatenated, padding pointing one past the last; then for a
        softmax each row's place in the padded (groups * longest), for a mean the
        group sizes."""
        rows = np.array([_in_shape(node, 0)[0] for node in nodes])
        width = np.array([node.op.group for node in nodes])
        across = np.array([node.op.axis == 0 for node in nodes])
        starts = np.cumsum(rows) - rows
        # Per node: how many groups, each of how many rows, the first row of
        # group q at start + q * first and its rows ``step`` apart.
        count = np.where(across, width, rows // width)
        size = np.where(across, rows // width, width)
        first, step = np.where(across, 1, width), np.where(across, width, 1)
        owner = np.repeat(np.arange(len(nodes)), count)
        within = np.arange(owner.size) - np.repeat(np.cumsum(count) - count, count)
        base = starts[owner] + within * first[owner]
        total = int(rows.sum())
        cols = np.arange(int(size.max()))
        index = np.where(cols[None, :] < size[owner][:, None],
                         base[:, None] + cols[None, :] * step[owner][:, None], total)
        index = index.astype(np.int32)
        kind = nodes[0].op.kind
        if kind in _NORMALISING:
            valid = index.ravel() < total
            places = np.empty(total, dtype=np.int32)
            places[index.ravel()[valid]] = np.flatnonzero(valid)
            return [index, places]
        if kind == "mean":
            tail = len(_in_shape(nodes[0], 0)) - 1
            return [index, size[owner].astype(dtype).reshape((owner.size,) + (1,) * tail)]
        return [index]

    def batched_call(self, F, node, inputs):
        kind = node.op.kind
        if kind in _NORMALISING:
            # Every group a row of (groups, longest), padded with -inf (weight 0).
            data, index, places = inputs
            pad = F.BlockGrad(F.log(F.zeros_like(F.slice_axis(data, axis=0, begin=0, end=1))))
            rows = F.reshape(F.take(F.concat(data, pad, dim=0), index, axis=0), shape=(0, -1))
            out = F.reshape(getattr(F, kind)(rows, axis=-1), shape=(-1, 1))
            return [F.take(out, places, axis=0)]
        named = _Named(_Kind(kind), node.out_shapes, node.out_dtypes)
        return _SEGMENTS.batched_call(F, named, inputs)


register_rule(["_group_" + kind for kind in KINDS], GroupRule())


def _sizes(node):
    """(m, n) of the matrix of a :class:`PairOp` call."""
    rows_a, rows_b = _in_shape(node, 0)[0], _in_shape(node, 1)[0]
    kind = node.op.kind
    if kind == "scores":
        return rows_a, rows_b
    if kind == "weighted":
        return rows_a // rows_b, rows_b
    return rows_b, rows_a // rows_b


def _matrix_places(sizes, tall, wide, fill):
    """Per node and (j, k) of a (tall, wide) padded matrix: the row of entry (j, k)
    in the nodes' columns concatenated, or ``fill`` outside the node's (m, n)."""
    m, n = sizes[:, 0:1, None], sizes[:, 1:2, None]
    starts = np.cumsum(m * n) - (m * n).ravel()
    rows, cols = np.arange(tall)[None, :, None], np.arange(wide)[None, None, :]
    places = starts.reshape(-1, 1, 1) + rows * n + cols
    return np.where((rows < m) & (cols < n), places, fill)


class PairProductRule(Rule):
    """:class:`PairOp` calls of every size as one padded ``batch_dot``: each
    operand gathered into (nodes, longest, ...) with zeros after its own rows
    (or entries), so padding adds nothing; each node's part kept."""

    batching = "segment"
    keyed_attrs = False

    def signature(self, node):
        if len(node.inputs) != 2 or _in_dtype(node, 0) != _in_dtype(node, 1) \
                or np.dtype(_in_dtype(node, 0)) not in (np.float32, np.float64):
            return None
        shapes = tuple(_in_shape(node, k)[1:] for k in range(2))
        return Signature((("pair", shapes, _in_dtype(node, 0)),), self, (ROW, ROW))

    @staticmethod
    def segment_arrays(nodes, dtype):
        sizes = np.array([_sizes(node) for node in nodes], dtype=np.int64)
        kind = nodes[0].op.kind
        tall, wide = int(sizes[:, 0].max()), int(sizes[:, 1].max())
        if kind == "scores":
            entries = np.flatnonzero(_matrix_places(sizes, tall, wide, -1).ravel() >= 0)
            return [_padding(sizes[:, 0])[0], _padding(sizes[:, 1])[0],
                    entries.astype(np.int32)]
        total = int((sizes[:, 0] * sizes[:, 1]).sum())
        places = _matrix_places(sizes, tall, wide, total).astype(np.int32)
        read, kept = (1, 0) if kind == "weighted" else (0, 1)
        return [places, _padding(sizes[:, read])[0], _padding(sizes[:, kept])[1]]

    def batched_call(self, F, node, inputs):
        a, b, first, second, kept = inputs
        if node.op.kind == "scores":
            out = F.batch_dot(_with_zero(F, a, first), _with_zero(F, b, second),
                              transpose_b=True)
            return [F.take(F.reshape(out, shape=(-1, 1)), kept)]
        matrix = F.reshape(_with_zero(F, a, first), shape=(0, 0, -1))   # (nodes, m', n')
        out = F.batch_dot(matrix, _with_zero(F, b, second),
                          transpose_a=node.op.kind == "weighted_t")
        return [F.take(F.reshape(out, shape=(-3, -2)), kept)]


def _with_zero(F, rows, index):
    """``rows`` with one zero row after them, taken by ``index``."""
    return F.take(_with_zero_row(F, rows), index, axis=0)


register_rule(["_pair_" + kind for kind in PRODUCTS], PairProductRule())


class PairwiseRule(Rule):
    """:class:`PairwiseOp` calls of every size as one elementwise call: an outer
    one on the rows of its inputs taken as the entries need them, a known
    matrix's entries fed as data."""

    batching = "segment"
    keyed_attrs = False
    source_dependent = True     # whether an input is known is asked per call

    def signature(self, node):
        op = node.op
        dtypes = tuple(np.dtype(_in_dtype(node, k)) for k in range(len(node.inputs)))
        if len(node.inputs) != 2 or dtypes[0] != dtypes[1] \
                or dtypes[0] not in (np.float32, np.float64):
            return None
        key = (op.name, op.operator, op.reversed, dtypes[0].name)
        if op.name == "_pair_outer" or op.name in LINES:
            return Signature((key,), self, (ROW, ROW))
        place = 0 if op.reversed else 1
        if not values_known(node.inputs[place][0]):
            return None
        return Signature((key,), self, (KNOWN, ROW) if op.reversed else (ROW, KNOWN))

    def step_key(self, node):
        # Every outer (or known) op has one name whatever its operator: a
        # compiled step of ``broadcast_add`` is not one of ``broadcast_mul``.
        return (node.op.operator, node.op.reversed)

    @staticmethod
    def segment_arrays(nodes, dtype):
        op = nodes[0].op
        if op.name in LINES:
            return [_line_rows(nodes, op)]
        if op.name == "_pair_outer":
            # Entry (j, k) of node i reads row j of its tall input, row k of its wide one.
            m = np.array([_in_shape(node, 1 if op.reversed else 0)[0] for node in nodes])
            n = np.array([node.op.group for node in nodes])
            owner, entry = _entries(m * n)
            width = n[owner]
            tall = (np.cumsum(m) - m)[owner] + entry // width
            wide = (np.cumsum(n) - n)[owner] + entry % width
            found = [tall.astype(np.int32), wide.astype(np.int32)]
            return found[::-1] if op.reversed else found
        place = 0 if op.reversed else 1
        values = [values_of(node.inputs[place][0]).reshape(-1, 1) for node in nodes]
        return [np.concatenate(values).astype(dtype)]

    def batched_call(self, F, node, inputs):
        op = node.op
        fn = getattr(F, op.operator)
        if op.name in LINES:
            a, b, rows = inputs
            if op.reversed:
                return [fn(F.take(a, rows, axis=0), b)]
            return [fn(a, F.take(b, rows, axis=0))]
        if op.name == "_pair_outer":
            a, b, first, second = inputs
            return [fn(F.take(a, first, axis=0), F.take(b, second, axis=0))]
        rows, values = inputs
        return [fn(values, rows) if op.reversed else fn(rows, values)]


def _entries(sizes):
    """For every entry of matrices of ``sizes`` entries, in order: the matrix it
    belongs to, and its place in that matrix (row by row)."""
    owner = np.repeat(np.arange(len(sizes)), sizes)
    return owner, np.arange(owner.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)


def _line_rows(nodes, op):
    """For every entry of the nodes' matrices, in order, the row of the vectors
    (their columns, in order) it reads: entry (j, k) of a matrix reads row k of
    its node's vector (``_pair_row``), or row j (``_pair_col``)."""
    matrix, vector = (1, 0) if op.reversed else (0, 1)
    lengths = np.array([_in_shape(node, vector)[0] for node in nodes])
    width = np.array([node.op.group for node in nodes])
    owner, entry = _entries(np.array([_in_shape(node, matrix)[0] for node in nodes]))
    at = entry % width[owner] if op.name == "_pair_row" else entry // width[owner]
    return ((np.cumsum(lengths) - lengths)[owner] + at).astype(np.int32)


register_rule(["_pair_outer", "_pair_known"] + list(LINES), PairwiseRule())
