"""A sample's own (m, n) matrix of pairs, recorded as a column of its entries.

Self-attention over a sentence, ``F.dot(Q, K, transpose_b=True)`` of a
sample's (m, H) queries and (n, H) keys, is an (m, n) matrix as tall and as
wide as the sample is long.  Recorded as written, every call on it (the
product, a scaling, the softmax, ``F.dot(weights, V)``) batches only with
samples of the same lengths.  In pair form its ``m * n`` entries are the rows
of an (m n, 1) column, row by row (entry (j, k) at row ``j * n + k``); the
matrix is that column reshaped (its base, ``reshapes.py``):

* the scores are one call giving the column (``matrix_ops.PairOp``);
* an elementwise call on the matrix (a scaling, a mask, ``F.tanh``), or of
  two matrices of one shape, is the call on the column;
* a softmax, sum, mean or max along the matrix's last axis is that operator
  over each group of ``n`` consecutive rows (``matrix_ops.GroupOp``); along axis 0,
  over each group of rows ``k, n + k, ...`` (a column of the matrix);
* ``F.dot(W, V)`` of such a matrix and an (n, C) value of the sample's, and
  ``F.dot(W, V, transpose_a=True)`` of it and an (m, C) one, are products
  that read the column (``matrix_ops.PairOp``).

Every call is then one of rows of a trailing shape that does not depend on
the sample's length, so samples of every length batch together.  Each form
adds the same products, so values and gradients agree with the calls as
written to float32 rounding; the reference executor records them as written.
"""
import numpy as np
from mxnet.ndarray import NDArray

from . import matrix_ops as groups
from ..record import weights as weight_calls
from ..record.lazy import LazyArray
from ..ir.known import taken_rows
from ..record.literals import is_known, known_values
from ..ir.ops import opdef
from ..record.bases import base_of, note

_TAKE, _RESHAPE = opdef("take"), opdef("reshape")
# Larger matrices are recorded as written: a batch pads each matrix to the
# tallest and widest of its step.
MAX_ENTRIES = 4096


def _own(rec, x):
    """Whether ``x`` is a pending 2-d value of the sample's own (no weight)."""
    return type(x) is LazyArray and x._node is not None and len(x.shape) == 2 \
        and not weight_calls.is_weight(rec, x)


def scores(rec, queries, keys):
    """``F.dot(queries, keys, transpose_b=True)`` of (m, H) and (n, H) values of a
    sample's own, m and n at least 2, in pair form; or None."""
    (m, width), (n, other) = queries.shape, keys.shape
    if m < 2 or n < 2 or width != other or m * n > MAX_ENTRIES \
            or not (_own(rec, queries) and _own(rec, keys)):
        return None
    return _shaped(rec, groups.record_product(rec, "scores", queries, keys, n), (m, n))


def _shaped(rec, column, shape):
    """``column`` reshaped to the matrix ``shape``, its base (``reshapes.note``)."""
    return note(rec, rec.call_op(_RESHAPE, (column,), {"shape": shape}), column)


def column_of(x):
    """The (m n, 1) column whose reshape ``x`` (m, n), m at least 2, is; or None."""
    base = base_of(x)
    if base is None or len(x.shape) != 2 or x.shape[0] < 2:
        return None
    return base if base.shape == (x.shape[0] * x.shape[1], 1) else None


def _axis_of(kwargs, default):
    axis = kwargs.get("axis", default)
    if isinstance(axis, (tuple, list)) and len(axis) == 1:
        axis = axis[0]
    return axis if type(axis) is int and -2 <= axis < 2 else None


def rewrite(rec, op, args, kwargs, elementwise):
    """``op(*args, **kwargs)`` on the column of ``args[0]``, a matrix in pair
    form, where it applies (see the module docstring); else None.

    ``elementwise`` are the names of elementwise operators (``columns.py``'s).
    """
    x = args[0]
    column = column_of(x)
    if column is None:
        return None
    ns, name = rec.F, op.name
    if name in elementwise or name == "LeakyReLU" and kwargs.get("act_type", "leaky") in (
            "leaky", "elu", "selu", "gelu"):
        if any(not isinstance(a, (int, float)) for a in args[1:]) \
                or any(not isinstance(v, (int, float, str, bool)) for v in kwargs.values()):
            return None
        return _shaped(rec, rec.call_op(op, (column,) + tuple(args[1:]), kwargs), x.shape)
    if name == "pick" and len(args) == 2 and set(kwargs) <= {"axis", "keepdims", "mode"}:
        return _pick(ns, rec, column, x.shape, args[1], kwargs)
    if name in ("softmax", "log_softmax") and len(args) == 1 and set(kwargs) <= {"axis"}:
        return _softmax(rec, name, column, x.shape, _axis_of(kwargs, -1))
    if name in ("sum", "mean", "max") and len(args) == 1 \
            and set(kwargs) <= {"axis", "keepdims"}:
        return _reduce(ns, rec, name, column, x.shape, kwargs)
    if name == "dot" and len(args) == 2 and set(kwargs) <= {"transpose_a", "transpose_b"} \
            and not kwargs.get("transpose_b"):
        return weighted_sum(rec, column, x.shape, args[1], bool(kwargs.get("transpose_a")))
    return None


def binary(rec, op, a, b):
    """``op(a, b)`` (an elementwise operator of two arrays) in pair form where
    either is a matrix in pair form and the other one of the same shape, in
    pair form or known (``literals.known_values``); or where one is an (m, 1)
    value of the sample's own and the other a (1, n) row of a column
    (``F.transpose`` of an (n, 1) value): their outer sum, product, ...; else None."""
    ns = rec.F
    if not (isinstance(a, NDArray) and isinstance(b, NDArray)) or a.shape != b.shape:
        found = _line(ns, rec, op, a, b)
        return found if found is not None else _outer(ns, rec, op, a, b)
    first, second = column_of(a), column_of(b)
    if first is None and second is None:
        return None
    if first is not None and second is not None:
        return _shaped(rec, rec.call_op(op, (first, second), {}), a.shape)
    if not op.name.startswith("broadcast_") or not is_known(rec, b if first is not None else a):
        return None
    if first is not None:
        out = groups.record_pairwise(rec, "known", op.name, first, b, a.shape[1])
    else:
        out = groups.record_pairwise(rec, "known_r", op.name, a, second, a.shape[1])
    return _shaped(rec, out, a.shape)


def _line(ns, rec, op, a, b):
    """A matrix in pair form and a (1, n) row or (m, 1) column of the sample's own
    broadcast over it (either first), as a :class:`matrix_ops.PairwiseOp`; else None."""
    if not op.name.startswith("broadcast_") \
            or not (isinstance(a, NDArray) and isinstance(b, NDArray)):
        return None
    matrix, vector = (a, b) if column_of(a) is not None else (b, a)
    column = column_of(matrix)
    if column is None or len(vector.shape) != 2 or column_of(vector) is not None:
        return None
    m, n = matrix.shape
    if vector.shape == (1, n):
        kind, length = "row", n
        base = base_of(vector)          # the row of an (n, 1) or (n,) value (column form)
        if base is not None and base.shape in ((n, 1), (n,)):
            vector = base
        elif not _own(rec, vector):
            return None
        vector = ns.reshape(vector, shape=(n, 1))
    elif vector.shape == (m, 1) and _own(rec, vector):
        kind, length = "col", m
    else:
        return None
    if length < 2:
        return None
    first, second = (column, vector) if matrix is a else (vector, column)
    kind += "" if matrix is a else "_r"
    return _shaped(rec, groups.record_pairwise(rec, kind, op.name, first, second, n), (m, n))


def _outer(ns, rec, op, a, b):
    if not op.name.startswith("broadcast_") \
            or not (isinstance(a, NDArray) and isinstance(b, NDArray)) \
            or len(a.shape) != 2 or len(b.shape) != 2:
        return None
    if a.shape[1] == 1 and b.shape[0] == 1:
        (m, _), (_, n), tall, wide = a.shape, b.shape, a, b
    elif a.shape[0] == 1 and b.shape[1] == 1:
        (_, n), (m, _), tall, wide = a.shape, b.shape, b, a
    else:
        return None
    row = base_of(wide)                 # a (1, n) row of an (n, 1) or (n,) value
    if m < 2 or n < 2 or m * n > MAX_ENTRIES or row is None \
            or row.shape not in ((n, 1), (n,)) or not _own(rec, tall):
        return None
    if len(row.shape) == 1:
        row = ns.reshape(row, shape=(n, 1))
    if tall is a:
        out = groups.record_pairwise(rec, "outer", op.name, tall, row, n)
    else:
        out = groups.record_pairwise(rec, "outer_r", op.name, row, tall, n)
    return _shaped(rec, out, (m, n))


def _pick(ns, rec, column, shape, index, kwargs):
    """``F.pick`` of the matrix along an axis by a known index: rows of the column."""
    axis = _axis_of(kwargs, -1)
    mode = kwargs.get("mode", "clip")
    if axis is None or mode not in ("clip", "wrap") or not isinstance(index, NDArray) \
            or index.shape != (shape[1 - axis % 2],):
        return None
    values = known_values(rec, index)
    if values is None:
        return None
    m, n = shape
    if axis % 2:
        rows = np.arange(m) * n + taken_rows(values, n, mode)
    else:
        rows = taken_rows(values, m, mode) * n + np.arange(n)
    # A take by a literal: one take for every sample (layer_rules.KnownTakeRule).
    out = rec.call_op(_TAKE, (column, ns.array(rows.astype(np.float32))), {})
    if kwargs.get("keepdims"):
        return out if axis % 2 else ns.reshape(out, shape=(1, n))
    return ns.reshape(out, shape=(len(rows),))


def _softmax(rec, name, column, shape, axis):
    if axis is None:
        return None
    return _shaped(rec, groups.record(rec, name, column, shape[1], axis % 2), shape)


def _reduce(ns, rec, name, column, shape, kwargs):
    keepdims = bool(kwargs.get("keepdims"))
    found = kwargs.get("axis")
    if found in (None, ()) or isinstance(found, (tuple, list)) and len(found) == 2 \
            and all(type(a) is int and -2 <= a < 2 for a in found) \
            and found[0] % 2 != found[1] % 2:
        out = groups.record(rec, name, column, shape[0] * shape[1])     # every entry
        return out if keepdims else ns.reshape(out, shape=(1,))
    axis = _axis_of(kwargs, None)
    if axis is None:
        return None
    out = groups.record(rec, name, column, shape[1], axis % 2)   # (rows kept, 1)
    if keepdims:
        return out if axis % 2 == 1 else ns.reshape(out, shape=(1, shape[1]))
    return ns.reshape(out, shape=(out.shape[0],))


def weighted_sum(rec, column, shape, values, transpose):
    """``F.dot(W, values, transpose_a=transpose)`` of the (m, n) matrix ``W`` of
    ``column`` and a value of the sample's own, in pair form; or None."""
    m, n = shape
    rows = m if transpose else n
    if not _own(rec, values) or values.shape[0] != rows:
        return None
    return groups.record_product(rec, "weighted_t" if transpose else "weighted", column,
                                 values, n)
