"""Operators on a sample's own matrices held as columns (``pairs.py``).

``rewrite.pairs`` holds a sample's (m, n) matrix as the (m n, 1) column of its
entries, row by row.  The calls it records on such columns are operators of
their own, defined here; ``rules.groups`` batches calls of every size of each
as one step:

* :class:`GroupOp`: a softmax, log-softmax, sum, mean or max over each group
  of a column's rows: ``n`` consecutive rows (along the matrix's last axis),
  or rows ``k, n + k, ...`` (along axis 0);
* :class:`PairOp`: the products that make a matrix's column
  (``dot(Q, K, transpose_b=True)``) or read it (``dot(W, V)``,
  ``dot(W, V, transpose_a=True)``);
* :class:`PairwiseOp`: an elementwise operator making a column from an outer
  sum (``a1(h) + a2(h).T``) or from a column and a known matrix (a mask).

As recorded (the reference executor, a step of one call) each runs the
operator as written on the matrix, between reshapes; their constant
``group=`` names the matrix's width, so calls of different shapes are
different calls.
"""
import math
import threading

import mxnet as mx
import numpy as np

from ..ir.shapes import broadcast_shape

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
        # What tells this operator from others of its name in the keys of
        # compiled steps and plans (``run``): the arguments it was made with
        # but the group's size (plans serve matrices of every size).
        self.step_name = (type(self).__name__, kind, axis)
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

    def out_shape(self, in_shapes):
        """The output shape of a call on inputs of ``in_shapes`` (as ``compute``
        gives it; ``ir.shapes``), or None where MXNet's inference should say."""
        if len(in_shapes) != 1:
            return None
        x, group = in_shapes[0], self.group
        size = math.prod(x)
        if size % group:
            return None
        if self.axis == 0:
            return (size, 1) if self.kind in _NORMALISING else (group, 1)
        if self.kind in _NORMALISING:
            return (size, 1)
        if x[0] % group:
            return None
        return (x[0] // group,) + tuple(x[1:])

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
        self.step_name = (type(self).__name__, kind)
        self.nd_fn = lambda a, b, **_constants: self.compute(mx.nd, a, b)
        self.sym_fn = lambda a, b, **_constants: self.compute(mx.sym, a, b)

    def compute(self, F, a, b):  # pylint: disable=arguments-differ
        if self.kind == "scores":
            return F.reshape(F.dot(a, b, transpose_b=True), shape=(-1, 1))
        matrix = F.reshape(a, shape=(-1, self.group))
        return F.dot(matrix, b, transpose_a=self.kind == "weighted_t")

    def run(self, F, inputs, _info):
        return [self.compute(F, inputs[0], inputs[1])]

    def out_shape(self, in_shapes):
        if len(in_shapes) != 2 or len(in_shapes[0]) != 2 or len(in_shapes[1]) != 2:
            return None
        a, b = in_shapes
        if self.kind == "scores":
            return (a[0] * b[0], 1) if a[1] == b[1] else None
        size = math.prod(a)
        if size % self.group:
            return None
        rows, cols = size // self.group, self.group
        if self.kind == "weighted_t":
            rows, cols = cols, rows
        return (rows, b[1]) if b[0] == cols else None


def record_product(rec, kind, a, b, group):
    """Record the :class:`PairOp` ``kind`` of pending ``a`` and ``b``."""
    return rec.call_op(_interned(PairOp, (kind, group)), (a, b), {"group": group})


# -- elementwise calls making or reading a matrix ------------------------------------

class PairwiseOp(GroupOp):
    """An elementwise ``operator`` (``broadcast_add``, ...) giving an (m, n)
    matrix as its (m n, 1) column (``group`` = n), its inputs in the user's order:

    * ``outer``: of an (m, 1) value and the (1, n) row of an (n, 1) column,
      passed as that column (``outer_r``: the row first);
    * ``known``: of a matrix's column and a known (m, n) matrix (``known_r``:
      the known one first), read when the batch is planned;
    * ``row``: of a matrix's column and a (1, n) row broadcast down its rows,
      passed as an (n, 1) column (a biaffine scorer's bias per head);
      ``col``: and an (m, 1) column broadcast along them (``_r``: the vector first).
    """

    arrays = 2

    def __init__(self, kind, operator, group):
        super().__init__(kind, group, 1)
        self.operator = operator
        self.name = "_pair_" + kind.split("_")[0]
        self.step_name = (type(self).__name__, kind, operator)
        self.reversed = kind.endswith("_r")
        self.nd_fn = lambda a, b, **_constants: self.compute(mx.nd, a, b)
        self.sym_fn = lambda a, b, **_constants: self.compute(mx.sym, a, b)

    def compute(self, F, a, b):  # pylint: disable=arguments-differ
        if self.name in LINES:
            return self._line(F, a, b)
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

    def _line(self, F, a, b):
        """The matrix (its column) with a vector (a column) broadcast over it."""
        matrix, vector = (b, a) if self.reversed else (a, b)
        matrix = F.reshape(matrix, shape=(-1, self.group))
        if self.name == "_pair_row":
            vector = F.reshape(vector, shape=(1, -1))
        fn = getattr(F, self.operator)
        out = fn(vector, matrix) if self.reversed else fn(matrix, vector)
        return F.reshape(out, shape=(-1, 1))

    def run(self, F, inputs, _info):
        return [self.compute(F, inputs[0], inputs[1])]

    def out_shape(self, in_shapes):
        if len(in_shapes) != 2 or not self.operator.startswith("broadcast_"):
            return None
        a, b = in_shapes
        if self.name in LINES:
            matrix, vector = (b, a) if self.reversed else (a, b)
            if len(matrix) != 2 or matrix[1] != 1 or len(vector) != 2 or vector[1] != 1:
                return None
            length = self.group if self.name == "_pair_row" else matrix[0] // self.group
            ok = matrix[0] % self.group == 0 and vector[0] == length
            return matrix if ok else None
        if self.name == "_pair_outer":
            if len(a) != 2 or len(b) != 2:
                return None
            a, b = ((a[1], a[0]), b) if self.reversed else (a, (b[1], b[0]))
        elif self.reversed:
            a = (math.prod(a), 1)
        else:
            b = (math.prod(b), 1)
        out = broadcast_shape(a, b)
        return None if out is None else (math.prod(out), 1)


#: The kinds of :class:`PairwiseOp` broadcasting a vector over a matrix.
LINES = ("_pair_row", "_pair_col")


def record_pairwise(rec, kind, operator, a, b, group):
    """Record the :class:`PairwiseOp` ``kind`` of ``operator`` on ``a`` and ``b``."""
    op = _interned(PairwiseOp, (kind, operator, group))
    return rec.call_op(op, (a, b), {"group": group})
