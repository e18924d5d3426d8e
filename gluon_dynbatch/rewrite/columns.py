"""Attention over a sample's own rows, recorded in column form.

``F.dot(q, K, transpose_b=True)`` of a query row ``q`` (1, H) and a sample's
own keys ``K`` (T, H) is a (1, T) row of scores as wide as the sample is
long; so are the softmax over it and the weights in ``F.dot(weights, V)``.
Recorded as written, each of those calls batches only with samples of the
same length.  Recorded in column form, each one's rows are the sample's
``T`` rows, and samples of every length batch together:

* the scores are ``sum(K * q, axis=1, keepdims=True)``, a (T, 1) column,
  reshaped to (1, T); the column is the row's base (``reshapes.py``);
* a softmax (or log-softmax) along a row whose base is a column is the
  softmax of the column over axis 0 (a segment softmax), reshaped;
* ``F.dot(w, V)`` of such a row ``w`` and a (T, C) value ``V`` is
  ``sum(column * V, axis=0, keepdims=True)``, a segment sum; so is
  ``F.dot(c, V, transpose_a=True)`` of a (T, 1) column ``c``;
* of a learned query (a (1, H) weight), the column is
  ``FullyConnected(K, q, num_hidden=1)``, a layer's product of the keys;
* an elementwise call on such a row (``scores / sqrt(H)``, ``F.tanh``, a mask)
  is the call on the column, reshaped.

The same holds for a value that is its base behind unit axes: outputs
stacked along axis 1 into (1, T, H), scores ``F.batch_dot(M, q.expand_dims(2))``
as (1, T, 1), a softmax, a sum, mean or max along axis 1, elementwise calls.

A (1, T) row made by concatenating (1, 1) scores along axis 1, or by
transposing or reshaping a (T, 1) column, has the column as its base too
(``reshapes.concat``, ``F.transpose``).  Each form is the same sum of the
same products, so values and gradients agree with ``F.dot`` to float32
rounding.  The reference executor records the calls as written (no pass runs).
"""
from math import prod

import numpy as np

from mxnet.ndarray import NDArray

from . import pairs
from ..record import passes
from ..record import weights as weight_calls
from ..record.lazy import LazyArray
from ..record.bases import base_of

# Operators applied element by element to one array (and numbers): they
# commute with a reshape.
ELEMENTWISE = frozenset("""
_plus_scalar _minus_scalar _rminus_scalar _mul_scalar _div_scalar _rdiv_scalar
_power_scalar _rpower_scalar _maximum_scalar _minimum_scalar
tanh sigmoid relu exp log log1p expm1 sqrt rsqrt square abs negative reciprocal
sin cos softsign erf Activation clip sign floor ceil round
""".split())


def _pending(x):
    """Whether ``x`` is a value of the scope: pending, or computed by an earlier
    flush (a sample that read a value goes on with its own computed values)."""
    return type(x) is LazyArray and (x._node is not None or x._h is not None
                                      or x._rows is not None)


def _column_of(x):
    """The (T, 1) column, or (T,) vector, that a pending row ``x`` of shape
    (1, ..., 1, T) reshapes; or None."""
    base = base_of(x)
    return base if base is not None and _is_row_of(x.shape, base.shape) else None


def _is_row_of(shape, column):
    """Whether ``shape`` (1, ..., 1, T) is a row of the (T, 1) or (T,) ``column``."""
    return len(shape) >= 2 and all(size == 1 for size in shape[:-1]) \
        and column in ((shape[-1], 1), (shape[-1],))


def _as_column(ns, base):
    """A ``_column_of`` result as a (T, 1) column."""
    return base if len(base.shape) == 2 else ns.reshape(base, shape=(base.shape[0], 1))


def scores(ns, rec, a, b, transpose_b):
    """``F.dot(a, b, transpose_b=transpose_b)`` of a sample's (T, H) keys and a
    (1, H) query row in column form, or None: ``dot(q, K, transpose_b=True)``
    is the (1, T) row of a (T, 1) column; ``dot(K, q, transpose_b=True)`` and
    ``dot(K, r)`` of an (H, 1) reshape ``r`` of q (``q.T``) are that column;
    ``dot(w, V)`` of a (1, 1) weight and a one-row value is a weighted sum as
    ``weighted_sum`` makes it for longer ones."""
    if not (_pending(a) and _pending(b)):
        return None
    sa, sb = a.shape, b.shape
    if len(sa) != 2 or len(sb) != 2:
        return None
    if not transpose_b and sa == (1, 1) and sb[0] == 1:
        # One weight (a softmax over one score): the weighted sum of the others.
        if weight_calls.is_weight(rec, a) or weight_calls.is_weight(rec, b):
            return None
        return ns.sum(ns.broadcast_mul(a, b), axis=0, keepdims=True)
    if not transpose_b:
        query = base_of(b)
        if query is None or sb[1] != 1 or query.shape != (1, sb[0]) or sa[1] != sb[0]:
            return None
        return _column(ns, rec, a, query)
    if sa[0] == 1 and sa[1] == sb[1]:
        if weight_calls.is_weight(rec, a) and not weight_calls.is_weight(rec, b):
            # A learned query (attention pooling): the column is a layer's
            # product of the keys, one row each.
            column = ns.FullyConnected(b, a, no_bias=True, num_hidden=1)
            return _as_row(ns, column, (1, sb[0]))
        return _as_row(ns, _column(ns, rec, b, a), (1, sb[0]))
    if sb[0] == 1 and sa[1] == sb[1]:
        return _column(ns, rec, a, b)
    return pairs.scores(rec, a, b)          # (m, n): see pairs.py


def _column(ns, rec, keys, query):
    """``sum(keys * query, axis=1, keepdims=True)`` of a sample's (T, H) keys and
    a (1, H) query, neither a weight (a layer's product batches as it is), or None."""
    if weight_calls.is_weight(rec, keys) or weight_calls.is_weight(rec, query):
        return None
    return ns.sum(ns.broadcast_mul(keys, query), axis=1, keepdims=True)


def weighted_sum(ns, rec, weights, values):
    """``F.dot(weights, values)`` of a (1, T) row with a column base and a
    (T, C) value, in column form, or None."""
    column = _column_of(weights)
    if column is None or not _pending(values) or len(values.shape) != 2 \
            or values.shape[0] != column.shape[0] or weight_calls.is_weight(rec, values):
        return None
    return ns.sum(ns.broadcast_mul(_as_column(ns, column), values), axis=0, keepdims=True)


def column_weighted_sum(ns, rec, weights, values):
    """``F.dot(weights, values, transpose_a=True)`` of a sample's (T, 1) column
    of weights and its (T, C) values as the segment sum
    ``sum(weights * values, axis=0, keepdims=True)``; or None."""
    sw, sv = weights.shape, values.shape
    if not (_pending(weights) and _pending(values)) or len(sw) != 2 or len(sv) != 2 \
            or sw[1] != 1 or sw[0] != sv[0] \
            or weight_calls.is_weight(rec, weights) or weight_calls.is_weight(rec, values):
        return None
    return ns.sum(ns.broadcast_mul(weights, values), axis=0, keepdims=True)


def batch_weighted_sum(ns, rec, weights, values):
    """``F.batch_dot(weights, values)`` of a (1, 1, T) row with a column base and
    a (1, T, C) reshape of a (T, C) value, in column form, or None."""
    base = base_of(values)
    if base is None or len(values.shape) != 3 or values.shape[0] != 1 \
            or base.shape != values.shape[1:]:
        return None
    out = weighted_sum(ns, rec, weights, base)
    return None if out is None else ns.reshape(out, shape=(1,) + out.shape)


def batch_scores(ns, rec, query, keys):
    """``F.batch_dot(q.expand_dims(0), K.expand_dims(0), transpose_b=True)`` of
    a (1, H) query and a sample's (T, H) keys, in column form, or None."""
    q, k = base_of(query), base_of(keys)
    if q is None or k is None or len(query.shape) != 3 or query.shape[:2] != (1, 1) \
            or len(keys.shape) != 3 or keys.shape[0] != 1 or q.shape != query.shape[1:] \
            or k.shape != keys.shape[1:] or q.shape[1] != k.shape[1]:
        return None
    column = _column(ns, rec, k, q)
    return None if column is None else ns.reshape(column, shape=(1, 1, k.shape[0]))


# Scalar comparisons: elementwise too (a mask of the scores).
COMPARISONS = frozenset("""
_equal_scalar _not_equal_scalar _greater_scalar _greater_equal_scalar _lesser_scalar
_lesser_equal_scalar
""".split())
_ELEMENTWISE = ELEMENTWISE | COMPARISONS
# Elementwise operators of two arrays: on two rows of one shape, on their columns.
BINARY = frozenset("""
broadcast_add broadcast_sub broadcast_mul broadcast_div broadcast_maximum broadcast_minimum
elemwise_add elemwise_sub elemwise_mul elemwise_div _plus _minus _mul _div
""".split())


def _rows_of(x):
    """(base, axis, kind) for a pending value ``x`` whose axis ``axis`` runs along
    the rows of its base: ``"lead"`` where ``x`` is its base behind unit axes
    ((1, T, H) of (T, H)), ``"column"`` where it is a (1, ..., 1, T) row of a
    (T, 1) column; or None."""
    base = base_of(x)
    if base is None:
        return None
    shape, rows = x.shape, base.shape
    if _is_row_of(shape, rows):                 # first: (1, 1) is both
        return base, len(shape) - 1, "column"
    lead = len(shape) - len(rows)
    if lead >= 1 and shape[lead:] == rows and all(size == 1 for size in shape[:lead]):
        return base, lead, "lead"
    # (1, T, 2H) of an RNN's (T, 1, 2H): the rows of the base laid out otherwise.
    lead = next((a for a, size in enumerate(shape) if size != 1), None)
    if lead and shape[lead] == rows[0] and prod(shape[lead + 1:]) == prod(rows[1:]):
        return base, lead, "lead"
    return None


def _aligned(ns, found, x):
    """The base of a ``"lead"`` ``found`` laid out as ``x`` behind its unit axes."""
    base, axis, kind = found
    if kind != "lead" or base.shape == x.shape[axis:]:
        return base
    return ns.reshape(base, shape=x.shape[axis:])


def _row_axis(kwargs, x, axis):
    """Whether the "axis" of ``kwargs`` is ``x``'s axis ``axis`` (along its base's rows).

    Only that axis: with one row, another axis of size 1 would do as well, but
    samples of one row would then record other calls than the rest.
    """
    found = kwargs.get("axis", -1)
    if isinstance(found, (tuple, list)) and len(found) == 1:
        found = found[0]
    ndim = len(x.shape)
    return type(found) is int and -ndim <= found < ndim and found % ndim == axis


def rewrite(rec, op, args, kwargs):
    """``op(*args, **kwargs)`` on the base of ``args[0]`` when its axis along the
    base's rows is what the call works along or keeps (see ``_rows_of``): an
    elementwise call, a softmax or a reduction along that axis, ``F.dot`` or
    ``F.batch_dot`` of attention weights; else None.  Callers check
    ``args[0]._base`` first: most calls have none."""
    name = op.name
    if name == "batch_dot" and len(args) == 2 and not kwargs.get("transpose_a"):
        if kwargs.get("transpose_b"):
            return batch_scores(rec.F, rec, args[0], args[1])
        found = batch_keys_scores(rec.F, rec, args[0], args[1])
        if found is not None:
            return found
    binary = name in BINARY and len(args) == 2 and not kwargs
    if pairs.column_of(args[0]) is not None:            # a matrix in pair form
        if binary:
            return pairs.binary(rec, op, args[0], args[1])
        return pairs.rewrite(rec, op, args, kwargs, _ELEMENTWISE)
    if binary:
        found = pairs.binary(rec, op, args[0], args[1])     # an outer sum, (1, n) first
        if found is not None:
            return found
    found = _rows_of(args[0])
    if found is None:
        return None
    base, axis, kind = found
    ns, x = rec.F, args[0]
    if name in ELEMENTWISE or name in COMPARISONS:
        if any(isinstance(a, NDArray) for a in args[1:]) \
                or any(isinstance(v, NDArray) for v in kwargs.values()):
            return None
        out = rec.call_op(op, (_aligned(ns, found, x),) + tuple(args[1:]), kwargs)
    elif name in BINARY:
        # Both operands along the same rows of their bases; they may broadcast
        # along their other axes ((1, T, H) * (1, T, 1)), and the result has the
        # shape of the call as written ((1, 1, 1, H) + (1, 1, T, H) is (1, 1, T, H)).
        y = args[1] if len(args) == 2 and not kwargs else None
        other = _rows_of(y) if y is not None else None
        if other is None or other[1:] != (axis, kind) or len(y.shape) != len(x.shape) \
                or y.shape[axis] != x.shape[axis] \
                or kind == "column" and (y.shape != x.shape or other[0].shape != base.shape):
            return None
        try:
            shape = np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            return None             # MXNet's own error, from the call as written
        out = rec.call_op(op, (_aligned(ns, found, x), _aligned(ns, other, y)), {})
        return _as_row(ns, out, shape)
    elif name in ("softmax", "log_softmax"):
        if len(args) != 1 or not set(kwargs) <= {"axis"} \
                or not _row_axis(kwargs, x, axis):
            return None
        out = rec.call_op(op, (_aligned(ns, found, x),), {"axis": 0})
    elif name in ("sum", "mean", "max", "min"):
        if len(args) != 1 or not set(kwargs) <= {"axis", "keepdims"} \
                or "axis" not in kwargs or not _row_axis(kwargs, x, axis):
            return None
        out = rec.call_op(op, (_aligned(ns, found, x),), {"axis": 0, "keepdims": True})
        named = kwargs["axis"]
        named = (named[0] if isinstance(named, (tuple, list)) else named) % len(x.shape)
        shape = list(x.shape)
        shape[named] = 1
        if not kwargs.get("keepdims"):
            del shape[named]
        return _as_row(ns, out, tuple(shape) or (1,))
    elif name in ("dot", "batch_dot") and len(args) == 2 and not any(kwargs.values()):
        if kind != "column":
            return None
        if name == "dot":
            return weighted_sum(ns, rec, x, args[1])
        return batch_weighted_sum(ns, rec, x, args[1])
    else:
        return None
    return _as_row(ns, out, x.shape)


def batch_keys_scores(ns, rec, keys, query):
    """``F.batch_dot(M, q.expand_dims(2))`` of a (1, T, H) reshape ``M`` of a
    sample's keys and an (1, H, 1) reshape of a (1, H) query: the (T, 1) column
    of scores as (1, T, 1), or None."""
    found = _rows_of(keys)
    if found is None or found[1:] != (1, "lead") or len(keys.shape) != 3:
        return None
    q = base_of(query)
    if q is None or query.shape != (1, keys.shape[2], 1) or q.shape != (1, keys.shape[2]):
        return None
    column = _column(ns, rec, found[0], q)
    return None if column is None else ns.reshape(column, shape=(1, keys.shape[1], 1))


def _as_row(ns, column, shape):
    """``column`` as a row of ``shape`` (itself for a single number)."""
    if column is None or column.shape == shape:
        return column
    return ns.reshape(column, shape=shape)


def on_bases(rec, op, args, kwargs):
    """The pass over calls reading a reshaped value: in column form where
    ``rewrite`` applies, or in pair form (``pairs.py``)."""
    if args and type(args[0]) is LazyArray and args[0]._base is not None:
        return rewrite(rec, op, args, kwargs)
    if len(args) == 2 and type(args[1]) is LazyArray and args[1]._base is not None \
            and op.name in BINARY and not kwargs:
        return pairs.binary(rec, op, args[0], args[1])
    return None


passes.register_on_bases(on_bases)
