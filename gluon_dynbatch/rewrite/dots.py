"""``F.dot`` and ``F.pick`` of 1-d vectors (code ported from DyNet), and
``F.dot`` of attention scores.

A vector's rows are its elements, so ``F.dot(W, x)`` of a matrix and a 1-d
vector ``x`` does not batch along axis 0 as it is.  Of a weight ``W`` (a
parameter or a value of weights alone), ``dot(W, x)`` is recorded as
``FullyConnected(x, W, flatten=False)`` and ``dot(x, W)`` as it is; a batch of
either is one product of the vectors as rows
(``rules.products.VectorProductRule``).  Of another matrix it is recorded as
the same product of the vector as one row, between two reshapes:
``dot(x, M)`` as ``dot(x.reshape((1, -1)), M)``, ``dot(M, x)`` as
``dot(x.reshape((1, -1)), M, transpose_b=True)``.

Attention scores of a query row against a sample's own rows are recorded in
column form (``columns.scores``), and products of two values of the
sample's own in pair form (``pairs.scores``).
"""
from mxnet.ndarray import NDArray

from . import columns
from ..record import passes
from ..record import weights
from ..record.frames import one_call
from ..record.lazy import LazyArray


def vector_dot(rec, op, args, kwargs):
    """``F.dot`` of a matrix and a pending 1-d vector, as a product of one row."""
    if len(args) != 2 or not set(kwargs) <= {"transpose_a", "transpose_b"}:
        return None
    a, b = args
    ta, tb = bool(kwargs.get("transpose_a")), bool(kwargs.get("transpose_b"))
    if _vector(a) and _matrix(b) and not ta:
        return one_call(rec, _as_row_product, rec, op, a, b, tb)
    if _vector(b) and _matrix(a) and not tb:
        return one_call(rec, _as_row_product, rec, op, b, a, not ta)
    return None


def attention_dot(rec, op, args, kwargs):
    """``F.dot(a, b, transpose_b=...)`` of a sample's own values: attention scores
    in column form (``columns.scores``), or in pair form; ``F.dot(w, V,
    transpose_a=True)`` of a column of weights, a weighted sum of rows
    (``columns.column_weighted_sum``)."""
    if len(args) != 2 or not set(kwargs) <= {"transpose_a", "transpose_b"}:
        return None
    if kwargs.get("transpose_a"):
        if kwargs.get("transpose_b"):
            return None
        return one_call(rec, columns.column_weighted_sum, rec.F, rec, args[0], args[1])
    return one_call(rec, columns.scores, rec.F, rec, args[0], args[1],
                    bool(kwargs.get("transpose_b")))


def _vector(x):
    return type(x) is LazyArray and len(x.shape) == 1


def _matrix(x):
    return isinstance(x, NDArray) and len(x.shape) == 2


def _as_row_product(rec, op, vector, matrix, transpose):
    ns = rec.F
    if weights.is_weight(rec, matrix):
        # One call on the vector: a batch of them is one product of the
        # vectors as rows (``rules.products.VectorProductRule``).
        if transpose:
            return ns.FullyConnected(vector, matrix, no_bias=True, num_hidden=matrix.shape[0],
                                     flatten=False)
        return rec.record_plain(op, (vector, matrix), {})
    row = ns.reshape(vector, shape=(1, -1))
    out = rec.record_plain(op, (row, matrix), {"transpose_b": transpose})
    return ns.reshape(out, shape=(-1,))


def vector_pick(rec, op, args, kwargs):
    """``F.pick(v, i, axis=0)`` of a pending 1-d vector and one index (DyNet's
    ``pickneglogsoftmax``), as the pick of one row: ``F.pick(v.reshape((1, -1)),
    i.reshape((1,)), axis=1)``, the same (1,) value and gradients.  A vector's
    rows are its elements: the call as written runs alone."""
    if len(args) != 2 or not set(kwargs) <= {"axis", "keepdims", "mode"} \
            or not _vector(args[0]) or not isinstance(args[1], NDArray) \
            or args[1].size != 1 or kwargs.get("axis", -1) not in (0, -1):
        return None
    return one_call(rec, _row_pick, rec.F, args[0], args[1], kwargs.get("mode", "clip"))


def _row_pick(ns, vector, index, mode):
    return ns.pick(ns.reshape(vector, shape=(1, -1)), ns.reshape(index, shape=(1,)),
                   axis=1, mode=mode)


passes.register("dot", vector_dot)
passes.register("dot", attention_dot)
passes.register("pick", vector_pick)
