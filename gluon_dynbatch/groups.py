"""Operators on a sample's own matrices held as columns, and their batching rules.

``pairs.py`` holds a sample's (m, n) matrix as the (m n, 1) column of its
entries, row by row.  The calls on such columns are operators of their own,
each with a rule that batches calls of every size as one step:

* :class:`GroupOp`: a softmax, log-softmax, sum, mean or max over each group
  of a column's rows: ``n`` consecutive rows (along the matrix's last axis),
  or rows ``k, n + k, ...`` (along axis 0).  :class:`GroupRule` gathers every
  group of a step's calls into one padded (groups, longest) array, as
  ``rules.SegmentRule`` pads a node's rows.
* :class:`PairOp`: the products that make a matrix's column
  (``dot(Q, K, transpose_b=True)``) or read it (``dot(W, V)``,
  ``dot(W, V, transpose_a=True)``).  :class:`PairProductRule` pads every
  operand to the largest with zeros and runs one ``batch_dot``.
* :class:`PairwiseOp`: an elementwise operator making a column from an outer
  sum (``a1(h) + a2(h).T``) or from a column and a known matrix (a mask).
  :class:`PairwiseRule` runs it once on rows taken as the entries need them.

As recorded (the reference executor, a step of one call) each runs the
operator as written on the matrix, between reshapes; their constant
``group=`` names the matrix's width, so calls of different shapes are
different calls.
"""
import threading
from collections import namedtuple

import mxnet as mx
import numpy as np

from .layer_rules import _SEGMENTS, _padding, _with_zero_row
from .literals import known_node, values_of
from .rules import KNOWN, ROW, Rule, Signature, _in_dtype, _in_shape, register_rule

KINDS = ("softmax", "log_softmax", "sum", "mean", "max")
_NORMALISING = ("softmax", "log_softmax")


class GroupOp:
    """``kind`` along each group of rows of one input.

    With ``axis`` 1, the groups are ``group`` consecutive rows each: the
    (G * g, ...) input viewed (G, g, ...), ``kind`` along axis 1.  With
    ``axis`` 0, the (m n, 1) input is an (m, n) matrix (n = ``group``) and
    the groups are its columns: rows k, n + k, 2 n + k, ...  Interned per
    kind, group size and axis (:func:`record`); a call passes the size as
    ``group=`` too, so that it is one of the call's constants.
    """

    path = None          # rules.call_as_recorded runs it through ``run``
    arrays, params = 1, ()

    def __init__(self, kind, group, axis=1):
        self.kind, self.group, self.axis = kind, group, axis
        self.name = "_group_" + kind
        self.nd_fn = lambda x, **_constants: self.compute(mx.nd, x)
        self.sym_fn = lambda x, **_constants: self.compute(mx.sym, x)

    def compute(self, F, x):
        """The call on ``x`` through ``F`` (``mx.nd`` or ``mx.sym``)."""
        if self.axis == 0:
            out = getattr(F, self.kind)(F.reshape(x, shape=(-1, self.group)), axis=0)
            return F.reshape(out, shape=(-1, 1))
        if self.kind in _NORMALISING:
            # Along the last axis of (G, g), as a softmax of the (m, n) matrix
            # along its rows runs (MXNet's kernel for the last axis).
            grouped = F.reshape(x, shape=(-1, self.group))
            return F.reshape(getattr(F, self.kind)(grouped, axis=-1), shape=(-1, 1))
        grouped = F.reshape(x, shape=(-4, -1, self.group, -2))   # (G, g, ...)
        return getattr(F, self.kind)(grouped, axis=1)

    def run(self, F, inputs, _info):
        return [self.compute(F, inputs[0])]

    def groups(self, rows):
        """The row positions of each group of an input of ``rows`` rows, (G, g)."""
        if self.axis == 0:
            return np.arange(rows).reshape(-1, self.group).T
        return np.arange(rows).reshape(-1, self.group)

    def __repr__(self):
        return "GroupOp(%s, %d, axis=%d)" % (self.kind, self.group, self.axis)


_OPS = {}
_OPS_LOCK = threading.Lock()


def _interned(cls, key):
    found = _OPS.get((cls, key))
    if found is None:
        with _OPS_LOCK:
            found = _OPS.setdefault((cls, key), cls(*key))
    return found


def record(rec, kind, x, group, axis=1):
    """Record ``kind`` over each group of ``group`` rows of pending ``x`` (see
    :class:`GroupOp` for ``axis``)."""
    return rec.call_op(_interned(GroupOp, (kind, group, axis)), (x,),
                       {"group": group, "axis": axis})


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


# -- products of a sample's own matrices ----------------------------------------------

PRODUCTS = ("scores", "weighted", "weighted_t")


class PairOp(GroupOp):
    """A product of a sample's own values giving or reading an (m, n) matrix
    as the (m n, 1) column of its entries (``pairs.py``), ``group`` = n:

    * ``scores(Q, K)``: ``dot(Q, K, transpose_b=True)`` of (m, H) and (n, H);
    * ``weighted(W, V)``: ``dot(W, V)`` of the matrix and an (n, C) value;
    * ``weighted_t(W, V)``: ``dot(W, V, transpose_a=True)`` of the matrix and
      an (m, C) value.
    """

    arrays = 2

    def __init__(self, kind, group):
        super().__init__(kind, group, 1)
        self.name = "_pair_" + kind
        self.nd_fn = lambda a, b, **_constants: self.compute(mx.nd, a, b)
        self.sym_fn = lambda a, b, **_constants: self.compute(mx.sym, a, b)

    def compute(self, F, a, b):  # pylint: disable=arguments-differ
        if self.kind == "scores":
            return F.reshape(F.dot(a, b, transpose_b=True), shape=(-1, 1))
        matrix = F.reshape(a, shape=(-1, self.group))
        return F.dot(matrix, b, transpose_a=self.kind == "weighted_t")

    def run(self, F, inputs, _info):
        return [self.compute(F, inputs[0], inputs[1])]


def record_product(rec, kind, a, b, group):
    """Record the :class:`PairOp` ``kind`` of pending ``a`` and ``b``."""
    return rec.call_op(_interned(PairOp, (kind, group)), (a, b), {"group": group})


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


# -- elementwise calls making or reading a matrix ------------------------------------

class PairwiseOp(GroupOp):
    """An elementwise ``operator`` (``broadcast_add``, ...) giving an (m, n)
    matrix as its (m n, 1) column (``group`` = n), its inputs in the user's order:

    * ``outer``: of an (m, 1) value and the (1, n) row of an (n, 1) column,
      passed as that column (``outer_r``: the row first);
    * ``known``: of a matrix's column and a known (m, n) matrix (``known_r``:
      the known one first), read when the batch is planned.
    """

    arrays = 2

    def __init__(self, kind, operator, group):
        super().__init__(kind, group, 1)
        self.operator = operator
        self.name = "_pair_" + kind.split("_")[0]
        self.reversed = kind.endswith("_r")
        self.nd_fn = lambda a, b, **_constants: self.compute(mx.nd, a, b)
        self.sym_fn = lambda a, b, **_constants: self.compute(mx.sym, a, b)

    def compute(self, F, a, b):  # pylint: disable=arguments-differ
        if self.name == "_pair_outer":
            if self.reversed:
                a = F.transpose(a)
            else:
                b = F.transpose(b)
        elif self.reversed:
            a = F.reshape(a, shape=(-1, 1))
        else:
            b = F.reshape(b, shape=(-1, 1))
        return F.reshape(getattr(F, self.operator)(a, b), shape=(-1, 1))

    def run(self, F, inputs, _info):
        return [self.compute(F, inputs[0], inputs[1])]


def record_pairwise(rec, kind, operator, a, b, group):
    """Record the :class:`PairwiseOp` ``kind`` of ``operator`` on ``a`` and ``b``."""
    op = _interned(PairwiseOp, (kind, operator, group))
    return rec.call_op(op, (a, b), {"group": group})


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
        if op.name == "_pair_outer":
            return Signature((key,), self, (ROW, ROW))
        place = 0 if op.reversed else 1
        if not known_node(node.inputs[place][0]):
            return None
        return Signature((key,), self, (KNOWN, ROW) if op.reversed else (ROW, KNOWN))

    @staticmethod
    def segment_arrays(nodes, dtype):
        op = nodes[0].op
        if op.name == "_pair_outer":
            # Entry (j, k) of node i reads row j of its tall input, row k of its wide one.
            m = np.array([_in_shape(node, 1 if op.reversed else 0)[0] for node in nodes])
            n = np.array([node.op.group for node in nodes])
            owner = np.repeat(np.arange(len(nodes)), m * n)
            entry = np.arange(owner.size) - np.repeat(np.cumsum(m * n) - m * n, m * n)
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
        if op.name == "_pair_outer":
            a, b, first, second = inputs
            return [fn(F.take(a, first, axis=0), F.take(b, second, axis=0))]
        rows, values = inputs
        return [fn(values, rows) if op.reversed else fn(rows, values)]


register_rule(["_pair_outer", "_pair_known"], PairwiseRule())
